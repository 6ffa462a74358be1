"""Repeat-factor sampling on a long-tailed digits training set: the rare classes are seen more often.

    python examples/long_tail_digits.py                # with RepeatFactorSampling
    python examples/long_tail_digits.py --no-rfs       # the plain shuffle, to compare

The training split of scikit-learn's bundled digits is cut to a long tail: class 0 keeps all its samples, each
next class fewer, class 9 about ``1 / imbalance`` of them. Validation stays balanced, so the mean per-class
accuracy (balanced accuracy) shows what the rare classes get. ``RepeatFactorSampling`` reads the labels from the
datamodule's ``train_labels`` and repeats a sample of class ``c`` about ``sqrt(threshold / f(c))`` times per
epoch when its class is rarer than ``threshold``. Nothing is downloaded.
"""

from __future__ import annotations

import argparse

import lightning.pytorch as pl
import numpy as np
import torch
from torch.utils.data import TensorDataset

from lightning_speedups import RepeatFactorSampling
from lightning_speedups.demo import DigitsDataModule, ImageClassifier


class LongTailDigits(DigitsDataModule):
    """Digits whose training classes shrink geometrically, from all of class 0 to ``1 / imbalance`` of class 9."""

    def __init__(self, imbalance: float = 30.0, **kwargs: object) -> None:
        super().__init__(**kwargs)
        self.imbalance = imbalance

    def setup(self, stage: str) -> None:
        fresh = self.train_dataset is None
        super().setup(stage)
        if not fresh:
            return
        x, y = self.train_dataset.tensors
        keep = []
        for c in range(self.num_classes):
            members = torch.nonzero(y == c).flatten()
            share = self.imbalance ** (-c / (self.num_classes - 1))
            keep.append(members[: max(2, round(share * len(members)))])
        index = torch.cat(keep)
        self.train_dataset = TensorDataset(x[index], y[index])
        self.train_labels = y[index].numpy()
        self.train_difficulty = self.train_difficulty[index.numpy()]


def per_class_accuracy(model: pl.LightningModule, dataset: TensorDataset, num_classes: int) -> np.ndarray:
    """Validation accuracy of each class."""
    x, y = dataset.tensors
    model.eval()
    with torch.no_grad():
        predicted = model(x).argmax(1)
    return np.array([float((predicted[y == c] == c).float().mean()) for c in range(num_classes)])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-epochs", type=int, default=15)
    parser.add_argument("--size", type=int, default=16, help="image side after upscaling the 8x8 digits")
    parser.add_argument("--imbalance", type=float, default=30.0, help="class 0's count over class 9's")
    parser.add_argument("--threshold", type=float, default=0.1, help="RepeatFactorSampling's threshold t")
    parser.add_argument("--no-rfs", action="store_true", help="train on the plain shuffle")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    pl.seed_everything(args.seed, verbose=False)
    datamodule = LongTailDigits(imbalance=args.imbalance, size=args.size, batch_size=64)
    datamodule.setup("fit")
    counts = np.bincount(datamodule.train_labels, minlength=10)
    print(f"training samples per class: {counts.tolist()}")
    callbacks = [] if args.no_rfs else [RepeatFactorSampling(threshold=args.threshold)]
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
    trainer.fit(model, datamodule=datamodule)
    if callbacks:
        rfs = callbacks[0]
        factors = ", ".join(f"{c}: {r:.2f}" for c, r in sorted(rfs.largest_class_factors(10).items()))
        print(f"repeat factors per class: {factors}; epoch of {rfs.epoch_length} samples")
    accuracy = per_class_accuracy(model, datamodule.val_dataset, 10)
    label = "plain shuffle" if args.no_rfs else f"RepeatFactorSampling(threshold={args.threshold:g})"
    print(f"per-class validation accuracy: {np.round(accuracy * 100, 1).tolist()}")
    print(
        f"{label}: balanced accuracy {accuracy.mean():.2%}, the 3 rarest classes {accuracy[-3:].mean():.2%} "
        f"({trainer.global_step} steps{'' if args.no_rfs else ': repeats make epochs longer than the plain shuffle'})"
    )


if __name__ == "__main__":
    main()
