"""Mid-run validation under progressive resizing, on digits (CPU; not a test).

Trains the demo ResNet on scikit-learn's digits (upscaled to 32 x 32) with Composer's schedule as the issue
measured it (initial_scale 0.5, delay 0.4, finetune 0.2), validating every half epoch, once per ``validation``
setting. For each validation it prints the scale, the accuracy the callback logged, and two references computed
independently on the whole validation set: the model at its current training size and at full size, as trained.

Usage::

    PYTHONPATH=. python benchmarks/resizing_validation.py [--epochs 6] [--settings full recalibrate train_size]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback

from lightning_speedups import ProgressiveResizing
from lightning_speedups.demo import DigitsDataModule, ImageClassifier
from lightning_speedups.functional import resize_images


class Reference(Callback):
    def __init__(self, callback: ProgressiveResizing) -> None:
        self.callback, self.rows = callback, []

    def on_validation_start(self, trainer, pl_module):
        if trainer.sanity_checking:
            return
        x, y = trainer.datamodule.val_dataset.tensors
        plan = self.callback._plan
        with torch.no_grad():
            small = (pl_module(resize_images(x, plan.size_for(tuple(x.shape[-2:])))).argmax(1) == y).float().mean()
            full = (pl_module(x).argmax(1) == y).float().mean()
        self.rows.append([trainer.global_step, plan.scale, small.item(), full.item()])

    def on_validation_end(self, trainer, pl_module):
        if not trainer.sanity_checking:
            self.rows[-1].append(trainer.callback_metrics["val_acc"].item())


def run(validation: str, epochs: int) -> list[list[float]]:
    pl.seed_everything(0)
    callback = ProgressiveResizing(0.5, 0.4, 0.2, validation=validation)
    reference = Reference(callback)
    trainer = pl.Trainer(
        accelerator="cpu",
        max_epochs=epochs,
        callbacks=[reference, callback],
        val_check_interval=0.5,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
    )
    trainer.fit(ImageClassifier(), DigitsDataModule(size=32))
    return reference.rows


def table(results: dict[str, list[list[float]]]) -> str:
    steps = [row[:4] for row in next(iter(results.values()))]
    lines = ["| step | scale | model at training size | model at full size | " + " | ".join(results) + " |"]
    lines.append("|---" * (4 + len(results)) + "|")
    for i, (step, scale, small, full) in enumerate(steps):
        logged = " | ".join(f"{results[v][i][4]:.1%}" for v in results)
        lines.append(f"| {step} | {scale:.2f} | {small:.1%} | {full:.1%} | {logged} |")
    return "\n".join(lines)


def summary(results: dict[str, list[list[float]]]) -> str:
    """What the table shows, worked out from it (rows trained below full size only)."""
    rows = [i for i, row in enumerate(results["full"]) if row[1] < 1.0]
    ref = results["full"]
    below = sum(ref[i][3] < ref[i][2] - 0.05 for i in rows)
    text = [
        f"While the scale is below 1 ({len(rows)} validations), plain full-size validation (`full`) reads more than "
        f"5 points below the model's accuracy at its training size in {below}."
    ]
    if "train_size" in results:
        same = sum(abs(results["train_size"][i][4] - results["train_size"][i][2]) < 1e-6 for i in rows)
        text.append(
            f"`train_size` (the default in resize and pipeline modes) reads the accuracy at the training size "
            f"{'exactly' if same == len(rows) else f'exactly in {same} of {len(rows)}'}."
        )
    if "recalibrate" in results:
        rec = results["recalibrate"]
        above_full = sum(rec[i][4] > ref[i][3] for i in rows)
        above_small = sum(rec[i][4] > ref[i][2] for i in rows)
        text.append(
            f"BatchNorm recalibration at full size (the default in crop mode) reads above plain full-size validation "
            f"in {above_full} of them and above the model at its training size in {above_small}: it measures the "
            "full-size model with full-size statistics, which can read above the small-image model."
        )
        after = [i for i, row in enumerate(ref) if row[1] >= 1.0 and abs(rec[i][4] - ref[i][3]) > 1e-6]
        if after:
            where = ", ".join(
                f"{rec[i][4]:.1%} at step {ref[i][0]:.0f} (running statistics: {ref[i][3]:.1%})" for i in after
            )
            text.append(
                "At full size it goes on until the running statistics have forgotten the smaller sizes (29 full-size "
                f"batches at momentum 0.1): {where}."
            )
    text.append("See the [ProgressiveResizing card](methods/progressive_resizing.md#validation-that-stays-meaningful).")
    return " ".join(text)


def section(quick: bool, out_dir: Path) -> str:
    """Markdown for docs/benchmarks.md: the logged validation accuracy per setting, beside the references."""
    import time

    from benchmarks import common

    epochs = 2 if quick else 6
    settings = ["full", "recalibrate", "train_size"]
    info = common.machine()
    start = time.perf_counter()
    results = {v: run(v, epochs) for v in settings}
    elapsed = time.perf_counter() - start
    return "\n".join(
        [
            "## Mid-run validation under progressive resizing (digits)",
            "",
            common.command_block(f"PYTHONPATH=. python benchmarks/resizing_validation.py --epochs {epochs}"),
            "",
            common.machine_line(info),
            f"- {epochs} epochs of the demo ResNet on digits (32 x 32), Composer's schedule shape with the settings "
            "that showed the problem (initial scale 0.5, delay 0.4, finetune 0.2; Composer's default delay is 0.5), "
            f"validation every half epoch, once per `validation` setting. Ran in {elapsed:.0f} s.",
            "- *Model at training size* and *at full size* are computed independently on the whole validation "
            "set; the last columns are what the callback logged as `val_acc` with each setting.",
            "",
            table(results),
            "",
            summary(results),
        ]
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--settings", nargs="*", default=["full", "recalibrate", "train_size"])
    args = parser.parse_args()
    results = {v: run(v, args.epochs) for v in args.settings}
    print()
    print(table(results))


if __name__ == "__main__":
    main()
