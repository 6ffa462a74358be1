"""Pure tensor ops behind MixUp, CutMix and label smoothing.

Conventions, shared by every function here:

* ``x`` is a floating-point batch ``(N, ...)``; CutMix needs ``(N, C, *spatial)`` with one or more spatial
  dims (a sequence, an image, a volume).
* targets are class indices ``(N,)`` (any integer dtype) or class probabilities ``(N, C)``; the ops return
  probabilities, which ``torch.nn.functional.cross_entropy`` accepts as targets.
* the partner of sample ``i`` is ``x[perm[i]]``; ``lam`` is the weight of the sample itself:
  ``mixed = lam * x + (1 - lam) * x[perm]``.
* nothing is modified in place: a batch may alias a dataset's storage.
* randomness comes from an explicit ``numpy.random.Generator``, a ``torch.Generator`` (which seeds one), a
  :class:`BatchRandom` (the callbacks' cheap per-batch draws) or an int seed, never from global state.
"""

from __future__ import annotations

import functools
import math
import numbers
import operator
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor

from lightning_speedups._rng import BatchRandom

RandomState = np.random.Generator | BatchRandom | torch.Generator | int | None


_INDEX_DTYPES = (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8)


def _rng(generator: RandomState) -> np.random.Generator | BatchRandom:
    if isinstance(generator, np.random.Generator | BatchRandom):
        return generator
    if isinstance(generator, torch.Generator):  # a torch training loop's generator: seeds a NumPy one from it
        return np.random.default_rng(int(torch.randint(2**62, (1,), generator=generator)))
    if isinstance(generator, bool) or not isinstance(generator, int | np.integer | None):
        raise TypeError(
            f"`generator` must be a NumPy Generator, a torch.Generator, a BatchRandom, an int seed or None; got "
            f"{type(generator).__name__}."
        )
    return np.random.default_rng(generator)


#: up to this many classes, one-hot rows are gathered from a cached (C, C) table (4 MiB of float32 at 1024)
_TABLE_MAX_CLASSES = 1024


@functools.lru_cache(maxsize=16)
def _class_table(num_classes: int, on: float, off: float, dtype: torch.dtype, device: torch.device) -> Tensor:
    with torch.no_grad():
        return torch.full((num_classes, num_classes), off, dtype=dtype, device=device).fill_diagonal_(on)


def _class_rows(index: Tensor, num_classes: int, on: float, off: float, dtype: torch.dtype) -> Tensor:
    """``(N, C)`` rows equal to ``off`` except ``on`` at each sample's class: a one-hot, smoothed or not.

    One gather from a cached table (never returned itself: the gather is a new tensor) instead of a fill and a
    scatter: a third of the time on a small CPU batch, and one kernel instead of two on a GPU.
    """
    try:
        if num_classes <= _TABLE_MAX_CLASSES:
            table = _class_table(num_classes, float(on), float(off), dtype, index.device)
            return table.index_select(0, index if index.dtype in (torch.int64, torch.int32) else index.long())
        out = torch.full((index.shape[0], num_classes), off, dtype=dtype, device=index.device)
        return out.scatter_(1, index.long().unsqueeze(1), on)
    except (IndexError, RuntimeError) as err:  # checked only on failure: a range check would sync a GPU each call
        if not index.numel():
            raise
        low, high = index_range(index)
        if low >= 0 and high < num_classes:
            raise
        raise ClassIndexError(
            f"Class indices must lie in [0, {num_classes}), got {low}..{high}. An `ignore_index` (such as -100) "
            "has no class probabilities to mix or smooth; check `num_classes` otherwise."
        ) from err


def index_range(index: Tensor) -> tuple[int, int]:
    """The smallest and largest of non-empty integer labels (torch has no min/max for uint16/32/64: read as int64)."""
    values = index if index.dtype in _INDEX_DTYPES else index.long()
    return int(values.min()), int(values.max())


class ClassIndexError(ValueError, IndexError):
    """A class index outside ``[0, num_classes)``: a ``ValueError`` (bad input), and an ``IndexError`` as torch
    raises for it."""


def as_probabilities(target: Tensor, num_classes: int | None = None, dtype: torch.dtype | None = None) -> Tensor:
    """Class indices ``(N,)`` to one-hot ``(N, C)``; probabilities ``(N, C)`` pass through (cast to ``dtype``).

    Raises ``ValueError`` for anything else (regression targets, masks, multi-dim labels).
    """
    num_classes = _check_num_classes(num_classes)
    float_dtype = dtype or (target.dtype if target.is_floating_point() else torch.float32)
    if not target.is_floating_point() and not target.is_complex() and target.dtype != torch.bool:
        if target.ndim != 1:
            raise ValueError(f"Integer targets must be class indices of shape (N,), got shape {tuple(target.shape)}.")
        if num_classes is None:
            raise ValueError("Converting class indices to probabilities needs `num_classes`.")
        return _class_rows(target, num_classes, 1.0, 0.0, float_dtype)
    if target.is_floating_point() and target.ndim == 2:
        if num_classes is not None and target.shape[1] != num_classes:
            raise ValueError(f"Probability targets have {target.shape[1]} classes, expected {num_classes}.")
        return target.to(float_dtype)
    raise ValueError(
        f"Targets must be class indices (N,) of an integer dtype or class probabilities (N, C) of a float "
        f"dtype; got dtype {target.dtype} and shape {tuple(target.shape)}."
    )


def smooth_labels(target: Tensor, smoothing: float, num_classes: int | None = None) -> Tensor:
    """``(1 - smoothing) * p + smoothing / C``: the targets that ``cross_entropy(label_smoothing=...)`` uses.

    Linear in ``p``, so smoothing mixed targets equals mixing smoothed ones: apply it once, anywhere.
    """
    if not 0.0 <= smoothing < 1.0:
        raise ValueError(f"`smoothing` must be in [0, 1), got {smoothing!r}.")
    num_classes = _check_num_classes(num_classes)
    if target.ndim == 1 and num_classes is not None and target.dtype in _INDEX_DTYPES:
        # class indices: the smoothed one-hot rows, gathered at once
        off = smoothing / num_classes
        return _class_rows(target, num_classes, 1.0 - smoothing + off, off, torch.float32)
    probs = as_probabilities(target, num_classes)
    return probs.mul(1.0 - smoothing).add_(smoothing / probs.shape[1])


def sample_lambda(alpha: float, generator: RandomState = None) -> float:
    """Draw ``lam ~ Beta(alpha, alpha)``, the mixing weight of Zhang et al. (2018)."""
    if not (math.isfinite(alpha) and alpha > 0):  # NaN and inf would draw NaN weights
        raise ValueError(f"`alpha` must be a finite number > 0, got {alpha!r}.")
    return float(_rng(generator).beta(alpha, alpha))


def sample_permutation(n: int, device: torch.device | str = "cpu", generator: RandomState = None) -> Tensor:
    """A random partner for each of ``n`` samples, as an index tensor on ``device``."""
    perm = _rng(generator).permutation(n)
    perm = perm if isinstance(perm, Tensor) else torch.from_numpy(perm)
    return perm.to(device, non_blocking=True)


def mix(x: Tensor, target: Tensor, lam: float, perm: Tensor, num_classes: int | None = None) -> tuple[Tensor, Tensor]:
    """MixUp with a given weight and partner: ``lam * a + (1 - lam) * a[perm]`` for inputs and targets."""
    _check_float_input(x, "mix")
    _check_batch(x, target)
    _check_lambda(lam)
    _check_perm(perm, x)
    probs = as_probabilities(target, num_classes)
    # In place on the fresh partner copy (never on `x`): one new buffer instead of two, the same values as
    # `torch.lerp(x[perm], x, lam)`; on CPU a large new buffer costs page faults, not only memory traffic.
    # A channels_last (or other non-default) layout is kept: `empty_like` copies it, and lerp stays fast.
    if x.is_contiguous():
        partner = x.index_select(0, perm)
    elif x.requires_grad:  # out= takes no part in autograd; `x * lam` keeps x's layout, the sum is written into it
        return x.mul(lam).add_(x.index_select(0, perm), alpha=1.0 - lam), probs.index_select(0, perm).lerp_(probs, lam)
    else:
        partner = torch.index_select(x, 0, perm, out=torch.empty_like(x))
    return partner.lerp_(x, lam), probs.index_select(0, perm).lerp_(probs, lam)


def mixup_batch(
    x: Tensor,
    target: Tensor,
    alpha: float = 0.2,
    num_classes: int | None = None,
    generator: RandomState = None,
) -> tuple[Tensor, Tensor, float, Tensor]:
    """MixUp a batch: returns ``(mixed_x, mixed_target, lam, perm)``.

    Example::

        >>> x, y = torch.rand(4, 3, 8, 8), torch.tensor([0, 1, 2, 3])
        >>> mx, my, lam, perm = mixup_batch(x, y, alpha=0.2, num_classes=4, generator=0)
        >>> torch.allclose(mx, lam * x + (1 - lam) * x[perm])
        True
    """
    _check_batch(x, target)
    rng = _rng(generator)
    lam = sample_lambda(alpha, rng)
    perm = sample_permutation(x.shape[0], x.device, rng)
    mixed_x, mixed_y = mix(x, target, lam, perm, num_classes)
    return mixed_x, mixed_y, lam, perm


def cutmix_box(spatial_shape: Sequence[int], lam: float, generator: RandomState = None) -> tuple[slice, ...]:
    """A random region covering about ``1 - lam`` of ``spatial_shape``, clipped at the borders.

    In ``k`` spatial dims each side is cut to ``(1 - lam) ** (1 / k)`` of its length around a uniformly drawn
    centre (the box of Yun et al., 2019, for ``k = 2``). Clipping can make the region smaller, so the
    weight actually used must be recomputed with :func:`box_lambda`.
    """
    _check_lambda(lam)
    _check_region(spatial_shape)
    rng = _rng(generator)
    ratio = (1.0 - lam) ** (1.0 / len(spatial_shape))
    slices = []
    for size in spatial_shape:
        cut = round(size * ratio)
        centre = int(rng.integers(size))
        lo = min(max(centre - cut // 2, 0), size)
        hi = min(max(centre - cut // 2 + cut, 0), size)
        slices.append(slice(lo, hi))
    return tuple(slices)


def _normalize_box(spatial_shape: Sequence[int], box: Sequence[slice]) -> tuple[slice, ...]:
    """``box`` with each slice resolved against its side (None and negative bounds, clipping), step 1."""
    if len(box) != len(spatial_shape):
        raise ValueError(f"`box` has {len(box)} dims but the input has {len(spatial_shape)} spatial dims.")
    out = []
    for s, size in zip(box, spatial_shape, strict=True):
        if not isinstance(s, slice):
            raise TypeError(f"`box` must be a sequence of slices, got {s!r}.")
        start, stop, step = s.indices(int(size))
        if step != 1:
            raise ValueError(f"`box` slices must have step 1 (a contiguous region), got {s!r}.")
        out.append(slice(start, max(start, stop)))
    return tuple(out)


def box_lambda(spatial_shape: Sequence[int], box: Sequence[slice]) -> float:
    """The share of the sample that stays its own after pasting ``box``: ``1 - box area / total area``.

    The slices are taken as indexing takes them: None and negative bounds are allowed, and the box is clipped
    to ``spatial_shape``.
    """
    _check_region(spatial_shape)
    area = math.prod(s.stop - s.start for s in _normalize_box(spatial_shape, box))
    return 1.0 - area / math.prod(spatial_shape)


def cut_and_paste(
    x: Tensor, target: Tensor, box: Sequence[slice], perm: Tensor, num_classes: int | None = None
) -> tuple[Tensor, Tensor, float]:
    """Paste ``box`` of each partner ``x[perm]`` into ``x``; targets weighted by the pasted area's share.

    Returns ``(cut_x, mixed_target, lam)`` with ``lam = 1 - box area / sample area``; ``box`` is clipped to the
    sample's shape (see :func:`box_lambda`).
    """
    _check_float_input(x, "cutmix")
    _check_spatial_input(x)
    _check_batch(x, target)
    _check_perm(perm, x)
    spatial = tuple(x.shape[2:])
    box = _normalize_box(spatial, box)
    lam = box_lambda(spatial, box)
    region = (slice(None), slice(None), *box)
    out = x.clone()
    if type(x) is Tensor and not x.requires_grad:
        # gathered straight into the box of the copy: no box-sized temporary (out= takes no part in autograd,
        # and tensor subclasses may not handle it, hence the plain path for those)
        torch.index_select(x[region], 0, perm, out=out[region])
    else:
        out[region] = x[region].index_select(0, perm)
    probs = as_probabilities(target, num_classes)
    return out, probs.index_select(0, perm).lerp_(probs, lam), lam


def cutmix_batch(
    x: Tensor,
    target: Tensor,
    alpha: float = 1.0,
    num_classes: int | None = None,
    generator: RandomState = None,
) -> tuple[Tensor, Tensor, float, Tensor]:
    """CutMix a batch: returns ``(cut_x, mixed_target, lam, perm)``, ``lam`` being the kept area's share.

    Example::

        >>> x, y = torch.rand(4, 3, 16, 16), torch.tensor([0, 1, 2, 3])
        >>> cx, cy, lam, perm = cutmix_batch(x, y, num_classes=4, generator=0)
        >>> onehot = torch.eye(4)[y]
        >>> torch.allclose(cy, lam * onehot + (1 - lam) * onehot[perm])
        True
    """
    _check_spatial_input(x)
    _check_batch(x, target)
    rng = _rng(generator)
    box = cutmix_box(tuple(x.shape[2:]), sample_lambda(alpha, rng), rng)
    perm = sample_permutation(x.shape[0], x.device, rng)
    out, probs, lam = cut_and_paste(x, target, box, perm, num_classes)
    return out, probs, lam, perm


def _check_lambda(lam: float) -> None:
    if not 0.0 <= lam <= 1.0:  # NaN fails this too
        raise ValueError(f"`lam` must be a weight in [0, 1], got {lam!r}.")


def _check_float_input(x: Tensor, op: str) -> None:
    if not x.is_floating_point():
        raise TypeError(
            f"{op} needs floating-point inputs to mix, got dtype {x.dtype}. Convert the inputs to float "
            "(in the dataset's transform or in `on_after_batch_transfer`) before this callback runs."
        )


def _check_region(spatial_shape: Sequence[int]) -> None:
    if not len(spatial_shape) or 0 in spatial_shape:
        raise ValueError(f"CutMix needs a non-empty region to paste; got spatial shape {tuple(spatial_shape)}.")


def _check_perm(perm: Tensor, x: Tensor) -> None:
    """The partner of each sample: a cheap check (no device sync) that would otherwise fail deep in torch."""
    if not isinstance(perm, Tensor) or perm.shape != (x.shape[0],) or perm.dtype not in _INDEX_DTYPES[:2]:
        what = f"shape {tuple(perm.shape)}, {perm.dtype}" if isinstance(perm, Tensor) else type(perm).__name__
        raise ValueError(
            f"`perm` must be an int64 or int32 tensor of shape ({x.shape[0]},), one partner per sample; got {what}."
        )
    if perm.device != x.device:
        raise ValueError(f"`perm` is on {perm.device}, the inputs on {x.device}: put it on the inputs' device.")


def _check_spatial_input(x: Tensor) -> None:
    if x.ndim < 3:
        raise ValueError(
            f"CutMix pastes a region of (N, C, *spatial) inputs; got shape {tuple(x.shape)}. Use MixUp for "
            "flat features."
        )
    if 0 in x.shape[2:]:
        raise ValueError(f"CutMix needs inputs with a non-empty region to paste; got shape {tuple(x.shape)}.")


def _check_batch(x: Tensor, target: Tensor) -> None:
    """Inputs and targets of one batch: as many of each (a mismatch would fail deep inside torch, or pair
    samples with the wrong targets)."""
    if x.ndim == 0 or target.ndim == 0 or x.shape[0] != target.shape[0]:
        raise ValueError(
            f"Inputs and targets must have the batch size as their first dim, the same for both; got inputs "
            f"{tuple(x.shape)} and targets {tuple(target.shape)}."
        )
    if target.device != x.device:  # torch's own error would come from deep inside the mix
        raise ValueError(
            f"Inputs are on {x.device}, targets on {target.device}: put the whole batch on one device (a custom "
            "`transfer_batch_to_device` that leaves the targets behind?)."
        )


def _check_num_classes(num_classes: Any) -> int | None:
    """``num_classes`` as an int >= 1 (a whole float from a config, a NumPy or 0-d tensor integer), or None."""
    if num_classes is None:
        return None
    try:
        value = operator.index(num_classes)  # ints, NumPy integers, 0-d integer tensors
    except TypeError:
        whole = isinstance(num_classes, numbers.Real) and float(num_classes).is_integer()
        value = int(num_classes) if whole else None
    if isinstance(num_classes, bool) or value is None or value < 1:
        raise ValueError(f"`num_classes` must be an int >= 1, got {num_classes!r}.")
    return value
