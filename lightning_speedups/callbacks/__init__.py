"""The lightning-speedups callbacks, one module each."""

from lightning_speedups.callbacks.cutmix import CutMix
from lightning_speedups.callbacks.label_smoothing import LabelSmoothing
from lightning_speedups.callbacks.mixup import MixUp
from lightning_speedups.callbacks.warmup import LinearScalingWarmup

__all__ = ["CutMix", "LabelSmoothing", "LinearScalingWarmup", "MixUp"]
