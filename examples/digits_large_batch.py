"""Train the digits ResNet with a large batch, its learning rate scaled to match (LinearScalingWarmup).

    python examples/digits_large_batch.py --batch-size 512            # lr x 8 (512 / 64), warmup 2 epochs
    python examples/digits_large_batch.py --batch-size 512 --no-scaling
    python examples/digits_large_batch.py --find-batch-size           # the largest batch that fits (GPU)

The demo model's learning rate (0.05, SGD with Nesterov momentum and a per-step cosine schedule) was chosen
for batch 64, so ``reference_batch_size=64``. ``--find-batch-size`` lets Lightning's ``BatchSizeFinder`` pick
the batch: on a GPU the largest that fits in memory; on a CPU nothing runs out of memory, so it stops after
``--max-trials`` trials (Lightning's ``max_trials``: 2 trials double 64 once, to 128). Nothing is downloaded.
"""

from __future__ import annotations

import argparse

import lightning.pytorch as pl
from lightning.pytorch.callbacks import BatchSizeFinder

from lightning_speedups import LinearScalingWarmup
from lightning_speedups.demo import DigitsDataModule, ImageClassifier

REFERENCE_BATCH_SIZE = 64


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch-size", type=int, default=512)
    parser.add_argument("--max-epochs", type=int, default=15)
    parser.add_argument("--warmup-epochs", type=float, default=2.0)
    parser.add_argument("--no-scaling", action="store_true", help="train the large batch with the unscaled lr")
    parser.add_argument("--find-batch-size", action="store_true", help="let BatchSizeFinder choose the batch")
    parser.add_argument("--max-trials", type=int, default=4, help="BatchSizeFinder max_trials from 64 (2: 128)")
    parser.add_argument("--size", type=int, default=16, help="image side after upscaling the 8x8 digits")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    pl.seed_everything(args.seed, verbose=False)
    callbacks: list[pl.Callback] = []
    if args.find_batch_size:  # before or after the warmup callback: either order works
        callbacks.append(BatchSizeFinder(mode="power", init_val=REFERENCE_BATCH_SIZE, max_trials=args.max_trials))
    if not args.no_scaling:
        callbacks.append(LinearScalingWarmup(REFERENCE_BATCH_SIZE, warmup=args.warmup_epochs, warmup_unit="epochs"))
    trainer = pl.Trainer(
        accelerator="auto",
        devices=1,
        max_epochs=args.max_epochs,
        callbacks=callbacks,
        logger=False,
        enable_checkpointing=False,
        enable_model_summary=False,
    )
    model = ImageClassifier(num_classes=10, lr=0.05)
    datamodule = DigitsDataModule(size=args.size, batch_size=args.batch_size)
    trainer.fit(model, datamodule=datamodule)
    acc = float(trainer.callback_metrics["val_acc"])
    print(
        f"batch {datamodule.batch_size}, {trainer.global_step} steps, "
        f"{'unscaled lr' if args.no_scaling else 'scaled lr'}: validation accuracy {acc:.2%}"
    )


if __name__ == "__main__":
    main()
