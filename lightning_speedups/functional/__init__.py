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

__all__ = [
    "as_probabilities",
    "box_lambda",
    "cut_and_paste",
    "cutmix_batch",
    "cutmix_box",
    "mix",
    "mixup_batch",
    "sample_lambda",
    "sample_permutation",
    "smooth_labels",
]
