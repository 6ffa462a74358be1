"""Train a small ResNet on scikit-learn's bundled digits with MixUp, CutMix and label smoothing.

    python examples/digits_mixup.py --max-epochs 15

Nothing is downloaded. The model's ``training_step`` is plain ``F.cross_entropy(logits, y)``: the callbacks
turn the labels into (mixed, smoothed) class probabilities, which cross entropy takes as they are.
"""

from __future__ import annotations

import argparse

import lightning.pytorch as pl

from lightning_speedups import CutMix, LabelSmoothing, MixUp
from lightning_speedups.demo import DigitsDataModule, ImageClassifier


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-epochs", type=int, default=15)
    parser.add_argument("--size", type=int, default=16, help="image side after upscaling the 8x8 digits")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    pl.seed_everything(args.seed, verbose=False)
    callbacks = [
        MixUp(alpha=0.2, p=0.5),
        CutMix(alpha=1.0, p=0.5),
        LabelSmoothing(smoothing=0.1),
    ]
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
    datamodule = DigitsDataModule(size=args.size, batch_size=64)
    trainer.fit(model, datamodule=datamodule)
    acc = float(trainer.callback_metrics["val_acc"])
    print(f"validation accuracy after {args.max_epochs} epochs: {acc:.2%}")


if __name__ == "__main__":
    main()
