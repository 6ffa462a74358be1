"""Functional ops: the pure tensor and index math behind each callback, usable without Lightning."""

from lightning_speedups.functional.mixing import (
    as_probabilities,
    box_lambda,
    cut_and_paste,
    cutmix_batch,
    cutmix_box,
    mix,
    mixup_batch,
    sample_lambda,
    sample_permutation,
    smooth_labels,
)
from lightning_speedups.functional.warmup import (
    batch_scale,
    global_batch_size,
    steps_per_epoch,
    warmup_factor,
    warmup_length,
)

__all__ = [
    "as_probabilities",
    "batch_scale",
    "box_lambda",
    "cut_and_paste",
    "cutmix_batch",
    "cutmix_box",
    "global_batch_size",
    "mix",
    "mixup_batch",
    "sample_lambda",
    "sample_permutation",
    "smooth_labels",
    "steps_per_epoch",
    "warmup_factor",
    "warmup_length",
]
