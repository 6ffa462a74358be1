"""The lightning-speedups callbacks, one module each."""

from lightning_speedups.callbacks.cutmix import CutMix
from lightning_speedups.callbacks.label_smoothing import LabelSmoothing
from lightning_speedups.callbacks.mixup import MixUp

__all__ = ["CutMix", "LabelSmoothing", "MixUp"]
