"""lightning-speedups: PyTorch Lightning callbacks that make training faster without compromising results.

Add the callbacks to a ``lightning.pytorch.Trainer``; each is also importable from
``lightning_speedups.callbacks``, and the math behind each lives in ``lightning_speedups.functional``.
Importing this package makes the callbacks known to LightningCLI by their short names.
"""

from importlib.metadata import PackageNotFoundError, version

from lightning_speedups.base import SpeedupCallback, SpeedupWarning, training_progress
from lightning_speedups.batch import BatchFieldError, BatchFields
from lightning_speedups.callbacks import (
    CurriculumOrdering,
    CutMix,
    DropoutRemoval,
    LabelSmoothing,
    LinearScalingWarmup,
    LossScore,
    MixUp,
    ProgressiveResizing,
    RepeatFactorSampling,
)
from lightning_speedups.data import SamplerProvider, SpeedupDataModule
from lightning_speedups.pipeline import ScheduledResize
from lightning_speedups.targets import TargetTransformCallback, hard_labels

try:
    __version__ = version("lightning-speedups")
except PackageNotFoundError:  # pragma: no cover - running from a source tree without installing
    __version__ = "0.0.0+unknown"


def __getattr__(name: str) -> object:
    # `lightning_speedups.presets` without importing it first, as the docs' `from lightning_speedups import presets`
    if name == "presets":
        import importlib

        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "BatchFieldError",
    "BatchFields",
    "CurriculumOrdering",
    "CutMix",
    "DropoutRemoval",
    "LabelSmoothing",
    "LinearScalingWarmup",
    "LossScore",
    "MixUp",
    "ProgressiveResizing",
    "RepeatFactorSampling",
    "SamplerProvider",
    "ScheduledResize",
    "SpeedupCallback",
    "SpeedupDataModule",
    "SpeedupWarning",
    "TargetTransformCallback",
    "__version__",
    "hard_labels",
    "training_progress",
]
