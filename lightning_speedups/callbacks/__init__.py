"""The lightning-speedups callbacks, one module each."""

from lightning_speedups.callbacks.curriculum import CurriculumOrdering, LossScore
from lightning_speedups.callbacks.cutmix import CutMix
from lightning_speedups.callbacks.label_smoothing import LabelSmoothing
from lightning_speedups.callbacks.mixup import MixUp
from lightning_speedups.callbacks.repeat_factor_sampling import RepeatFactorSampling

__all__ = [
    "CurriculumOrdering",
    "CutMix",
    "LabelSmoothing",
    "LossScore",
    "MixUp",
    "RepeatFactorSampling",
]
