"""The lightning-speedups callbacks, one module each."""

from lightning_speedups.callbacks.curriculum import CurriculumOrdering, LossScore
from lightning_speedups.callbacks.cutmix import CutMix
from lightning_speedups.callbacks.dropout_removal import DropoutRemoval
from lightning_speedups.callbacks.label_smoothing import LabelSmoothing
from lightning_speedups.callbacks.mixup import MixUp
from lightning_speedups.callbacks.progressive_resizing import ProgressiveResizing
from lightning_speedups.callbacks.repeat_factor_sampling import RepeatFactorSampling
from lightning_speedups.callbacks.warmup import LinearScalingWarmup

__all__ = [
    "CurriculumOrdering",
    "CutMix",
    "DropoutRemoval",
    "LabelSmoothing",
    "LinearScalingWarmup",
    "LossScore",
    "MixUp",
    "ProgressiveResizing",
    "RepeatFactorSampling",
]
