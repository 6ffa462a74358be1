"""Pure ops behind progressive resizing: the schedules, the target sizes and the batch resize and crop.

Two schedules, as users of Composer and FFCV know them:

* :func:`progressive_scale` (Composer's shape): the scale is ``initial_scale`` until ``delay_fraction`` of
  training, rises linearly to 1 by ``1 - finetune_fraction``, and stays at 1 (full size) after that;
* :func:`ramp_resolution` (FFCV's shape): a resolution in pixels, ``min_res`` up to epoch ``start_ramp``,
  ``max_res`` from epoch ``end_ramp``, linear in between and rounded to a multiple of ``round_to`` (32).

A :class:`ResizePlan` holds what either schedule decided for one batch, and :meth:`ResizePlan.size_for`
turns it into the ``(height, width)`` of that batch, each side rounded to a multiple of ``size_increment``.
The same plan object is used on the device and inside DataLoader workers, so both give identical sizes.

Conventions: images are ``(N, C, H, W)`` tensors; dense targets (masks) are ``(N, H, W)`` or
``(N, C, H, W)`` with the images' ``H, W``; nothing is modified in place; randomness comes from an explicit
``torch.Generator``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

#: interpolation modes for images; masks always use a nearest mode (see :func:`resize_masks`).
INTERPOLATIONS = ("nearest", "bilinear", "bicubic")

Size = tuple[int, int]

#: ramps of :func:`progressive_scale` shorter than this (a fraction of training) are steps
_MIN_RAMP = 1e-12


# ---------------------------------------------------------------------------------------------- schedules
def progressive_scale(
    progress: float, initial_scale: float = 0.5, delay_fraction: float = 0.5, finetune_fraction: float = 0.2
) -> float:
    """The scale of the inputs at ``progress`` (fraction of training done, in [0, 1]); Composer's schedule.

    ``initial_scale`` while ``progress < delay_fraction``; then linear from ``initial_scale`` to 1 until
    ``1 - finetune_fraction``; 1 from there on. With ``delay_fraction + finetune_fraction == 1`` (to within
    1e-12) the ramp is a step at ``delay_fraction``: ``progress == delay_fraction`` already gives 1.

    Example::

        >>> [progressive_scale(p, 0.5, 0.5, 0.2) for p in (0.0, 0.5, 0.65, 0.8, 1.0)]
        [0.5, 0.5, 0.75, 1.0, 1.0]
    """
    _check_schedule(initial_scale, delay_fraction, finetune_fraction)
    if progress != progress:  # NaN compares false everywhere below and would read as full size
        raise ValueError("`progress` must be a number in [0, 1], got nan.")
    if progress < delay_fraction:
        return float(initial_scale)
    ramp = 1.0 - finetune_fraction - delay_fraction
    # a ramp within float rounding of zero is a step: full size from `delay_fraction` on, whatever the rounding
    done = 1.0 if ramp < _MIN_RAMP else min(1.0, (progress - delay_fraction) / ramp)
    if done > 1.0 - 1e-9:  # the ramp's end up to float rounding (a step count over a total lands an ulp short)
        return 1.0
    return float(initial_scale + (1.0 - initial_scale) * done)


def ramp_resolution(
    epoch: float, min_res: int, max_res: int, start_ramp: float, end_ramp: float, round_to: int = 32
) -> int:
    """The training resolution at ``epoch``; FFCV's schedule.

    ``min_res`` up to ``start_ramp``, ``max_res`` from ``end_ramp``, in between the linear interpolation
    rounded to the nearest multiple of ``round_to``, kept within ``[min_res, max_res]`` (FFCV's rounding alone
    can leave that range: 14 px rounds to 0 with ``round_to=32``).

    Example::

        >>> [ramp_resolution(e, 160, 192, start_ramp=10, end_ramp=13) for e in (0, 10, 11, 12, 13, 20)]
        [160, 160, 160, 192, 192, 192]
    """
    if min_res < 1 or min_res > max_res:
        raise ValueError(f"`min_res` ({min_res}) must be >= 1 and <= `max_res` ({max_res}).")
    if end_ramp < start_ramp:
        raise ValueError(f"`end_ramp` ({end_ramp}) must be >= `start_ramp` ({start_ramp}).")
    if round_to < 1:
        raise ValueError(f"`round_to` must be >= 1, got {round_to!r}.")
    if epoch != epoch:  # NaN
        raise ValueError("`epoch` must be a number, got NaN.")
    if epoch <= start_ramp:
        return int(min_res)
    if epoch >= end_ramp:
        return int(max_res)
    res = min_res + (max_res - min_res) * (epoch - start_ramp) / (end_ramp - start_ramp)
    return int(min(max_res, max(min_res, round(res / round_to) * round_to)))


def _check_schedule(initial_scale: float, delay_fraction: float, finetune_fraction: float) -> None:
    if not 0.0 < initial_scale <= 1.0:
        raise ValueError(f"`initial_scale` must be in (0, 1], got {initial_scale!r}.")
    if not (0.0 <= delay_fraction <= 1.0 and 0.0 <= finetune_fraction <= 1.0):
        raise ValueError(
            f"`delay_fraction` and `finetune_fraction` must be in [0, 1], got {delay_fraction!r} and "
            f"{finetune_fraction!r}."
        )
    if delay_fraction + finetune_fraction > 1.0 + 1e-12:
        raise ValueError(
            f"`delay_fraction + finetune_fraction` must be <= 1, got {delay_fraction!r} + {finetune_fraction!r}."
        )


# ---------------------------------------------------------------------------------------------- sizes
def round_side(full: int, scale: float, size_increment: int = 4) -> int:
    """``full * scale`` rounded to the nearest multiple of ``size_increment`` (halves up), within [increment, full].

    A scale of 1 or more gives ``full`` unchanged (even when ``full`` is not a multiple of the increment).
    """
    if size_increment < 1:
        raise ValueError(f"`size_increment` must be >= 1, got {size_increment!r}.")
    if scale >= 1.0:
        return int(full)
    side = _half_up(full * scale / size_increment) * size_increment
    return int(min(full, max(size_increment, side)))


def _half_up(x: float) -> int:
    """``x`` rounded to the nearest integer, halves up: Python's ``round`` sends halves to the even neighbour,
    so the two sides of an image could round in opposite directions (20 x 12 at scale 0.5 became 8 x 8)."""
    return math.floor(x + 0.5)


def scaled_size(size: Size, scale: float, size_increment: int = 4) -> Size:
    """``(H, W)`` scaled by ``scale``, each side rounded to a multiple of ``size_increment`` (full at scale 1).

    Example::

        >>> scaled_size((224, 224), 0.5), scaled_size((224, 160), 0.63, 8), scaled_size((30, 30), 1.0)
        ((112, 112), (144, 104), (30, 30))
    """
    if not scale > 0:  # NaN fails this too
        raise ValueError(f"`scale` must be > 0, got {scale!r}.")
    return round_side(size[0], scale, size_increment), round_side(size[1], scale, size_increment)


def resolution_size(size: Size, resolution: int, size_increment: int = 4) -> Size:
    """The size whose shorter side is ``resolution`` (the longer one scaled alike), as ``Resize(int)`` does.

    The longer side is rounded to a multiple of ``size_increment``, but never below ``resolution`` (which then
    wins over the increment); a square stays square, and ``resolution`` equal to the shorter side gives the
    image's own size (so a crop of that size always fits). ``resolution`` may exceed the shorter side (the
    images are then upsampled).

    Example::

        >>> resolution_size((256, 256), 160), resolution_size((240, 320), 160, 8), resolution_size((30, 30), 30)
        ((160, 160), (160, 216), (30, 30))
    """
    if resolution < 1:
        raise ValueError(f"`resolution` must be >= 1, got {resolution!r}.")
    if size_increment < 1:
        raise ValueError(f"`size_increment` must be >= 1, got {size_increment!r}.")
    h, w = int(size[0]), int(size[1])
    short, long = min(h, w), max(h, w)
    if h == w:
        return int(resolution), int(resolution)
    if resolution == short:
        return h, w
    long_side = max(size_increment, _half_up(long * resolution / short / size_increment) * size_increment)
    if resolution < short:
        long_side = min(long_side, long)  # rounding up must not make a downsized image wider than the original
    long_side = max(long_side, resolution)  # rounding down must not make the long side the shorter one
    return (int(resolution), int(long_side)) if h <= w else (int(long_side), int(resolution))


@dataclass(frozen=True)
class ResizePlan:
    """What a schedule decided for one batch: a ``scale`` of the full size, or an absolute ``resolution``.

    Small and picklable: in pipeline mode it travels with each sample index into DataLoader workers.

    Args:
        scale: fraction of the full size (1.0 = full size); used when ``resolution`` is ``None``.
        resolution: the shorter side in pixels (the FFCV-style ramp), or ``None``.
        size_increment: sides are rounded to a multiple of this.

    Example::

        >>> ResizePlan(scale=0.5).size_for((64, 48)), ResizePlan(resolution=32).size_for((64, 48))
        ((32, 24), (44, 32))
    """

    scale: float = 1.0
    resolution: int | None = None
    size_increment: int = 4

    def __post_init__(self) -> None:
        if not (0.0 < self.scale < math.inf) or (self.resolution is not None and self.resolution < 1):
            raise ValueError(
                f"ResizePlan needs a scale > 0 (finite) and a resolution >= 1 or None; got scale={self.scale!r}, "
                f"resolution={self.resolution!r}."
            )
        if self.size_increment < 1:
            raise ValueError(f"`size_increment` must be >= 1, got {self.size_increment!r}.")

    @property
    def is_full(self) -> bool:
        """Whether this plan leaves every input at its own size."""
        return self.resolution is None and self.scale >= 1.0

    def size_for(self, size: Size) -> Size:
        """The ``(height, width)`` an input of ``size`` gets under this plan."""
        size = (int(size[0]), int(size[1]))
        if self.resolution is not None:
            return resolution_size(size, self.resolution, self.size_increment)
        return scaled_size(size, self.scale, self.size_increment)


# ---------------------------------------------------------------------------------------------- batch ops
def check_image_batch(x: object, who: str = "resize") -> Tensor:
    """Return ``x`` if it is an ``(N, C, H, W)`` tensor, else raise an error naming what it got."""
    if not isinstance(x, Tensor):
        raise TypeError(f"{who} needs an image batch tensor (N, C, H, W), got {type(x).__name__}.")
    if x.ndim != 4:
        hint = (
            "Point `input_key` at the images, or leave this callback out for non-image inputs."
            if who.startswith("ProgressiveResizing")
            else "Pass the images (a single image needs a batch dim: `x.unsqueeze(0)`)."
        )
        raise ValueError(
            f"{who} works on image batches of shape (N, C, H, W), got a tensor of shape {tuple(x.shape)}. {hint}"
        )
    return x


def resize_images(x: Tensor, size: Size, interpolation: str = "bilinear", antialias: bool = True) -> Tensor:
    """Resize ``(N, C, H, W)`` images to ``size``; ``antialias`` applies to bilinear and bicubic.

    As in torch and torchvision, antialiasing filters a downsized side; on an upsized side it changes only
    bicubic's kernel (PIL's, ``a = -0.5``, instead of ``a = -0.75``).

    Returns ``x`` itself when it already has ``size``. ``"nearest"`` takes any dtype; bilinear and bicubic need
    floating-point images.
    """
    check_image_batch(x, "resize_images")
    if interpolation not in INTERPOLATIONS:
        raise ValueError(f"`interpolation` must be one of {INTERPOLATIONS}, got {interpolation!r}.")
    size = (int(size[0]), int(size[1]))
    if tuple(x.shape[-2:]) == size:
        return x
    if interpolation == "nearest":
        if not x.is_floating_point() and x.dtype != torch.uint8:
            # torch has no nearest kernel for int/bool images: gather the same samples as the masks get, in the
            # input's memory layout (the gather returns a contiguous tensor)
            out = resize_masks(x, size, "nearest")
            if not x.is_contiguous() and x.is_contiguous(memory_format=torch.channels_last):
                out = out.contiguous(memory_format=torch.channels_last)
            return out
        return F.interpolate(x, size=size, mode="nearest")
    if not x.is_floating_point():
        raise TypeError(
            f"{interpolation} interpolation needs floating-point images, got dtype {x.dtype}. Convert the "
            "images to float first, or use interpolation='nearest' or mode='crop'."
        )
    if x.device.type == "cpu" and x.dtype in (torch.bfloat16, torch.float16):
        # torch's CPU kernels for these modes lack half types: compute in float32, hand back the input's dtype
        out = F.interpolate(x.float(), size=size, mode=interpolation, align_corners=False, antialias=antialias)
        return out.to(x.dtype)
    return F.interpolate(x, size=size, mode=interpolation, align_corners=False, antialias=antialias)


def _nearest_index(in_len: int, out_len: int, mode: str, device: torch.device) -> Tensor:
    # The same kernel as for the images, on an index ramp: masks land exactly where the image pixels do.
    ramp = torch.arange(in_len, dtype=torch.float32, device=device).view(1, 1, in_len)
    return F.interpolate(ramp, size=out_len, mode=mode).view(out_len).long()


def resize_masks(mask: Tensor, size: Size, interpolation: str = "nearest") -> Tensor:
    """Resize dense targets ``(N, H, W)`` or ``(N, C, H, W)`` of any dtype to ``size``, by nearest sampling.

    Label values are never blended. With ``interpolation="nearest"`` the samples are exactly those the images
    get from ``resize_images(..., "nearest")``; for bilinear or bicubic images the pixel-centre-aligned
    ``nearest-exact`` sampling is used, which matches their geometry (``align_corners=False``).
    """
    if mask.ndim not in (3, 4):
        raise ValueError(f"Dense targets must be (N, H, W) or (N, C, H, W), got shape {tuple(mask.shape)}.")
    if interpolation not in INTERPOLATIONS:
        raise ValueError(f"`interpolation` must be one of {INTERPOLATIONS}, got {interpolation!r}.")
    size = (int(size[0]), int(size[1]))
    if tuple(mask.shape[-2:]) == size:
        return mask
    mode = "nearest" if interpolation == "nearest" else "nearest-exact"
    rows = _nearest_index(mask.shape[-2], size[0], mode, mask.device)
    cols = _nearest_index(mask.shape[-1], size[1], mode, mask.device)
    return mask.index_select(-2, rows).index_select(-1, cols)


def crop_offsets(
    n: int, in_size: Size, out_size: Size, generator: torch.Generator | None = None
) -> tuple[Tensor, Tensor]:
    """Uniform top-left corners ``(tops, lefts)`` of ``n`` crops of ``out_size`` inside ``in_size``."""
    if min(out_size) < 1:
        raise ValueError(f"`out_size` must be at least 1 x 1, got {tuple(out_size)}.")
    if out_size[0] > in_size[0] or out_size[1] > in_size[1]:
        raise ValueError(f"A crop of {tuple(out_size)} does not fit in images of {tuple(in_size)}.")
    tops = torch.randint(in_size[0] - out_size[0] + 1, (n,), generator=generator)
    lefts = torch.randint(in_size[1] - out_size[1] + 1, (n,), generator=generator)
    return tops, lefts


def crop_at(x: Tensor, size: Size, tops: Tensor, lefts: Tensor) -> Tensor:
    """Crop sample ``i`` of ``(N, ..., H, W)`` at ``(tops[i], lefts[i])`` to ``size``; any dtype.

    Any number of dims may sit between the batch and ``H, W`` (none for masks, ``C`` for images, ``C, D`` for
    volumes). A channels_last image batch stays channels_last. Each crop must lie inside the image (offsets
    ``>= 0``, as :func:`crop_offsets` draws them): not checked, which would wait for the device, and a negative
    offset counts from the far edge, as tensor indices do.
    """
    if x.ndim < 3:
        raise ValueError(f"`x` must be (N, ..., H, W) with at least 3 dims, got shape {tuple(x.shape)}.")
    n = x.shape[0]
    if tuple(tops.shape) != (n,) or tuple(lefts.shape) != (n,):  # one corner per sample, never broadcast
        raise ValueError(
            f"`tops` and `lefts` must hold one offset per sample, shape ({n},); got {tuple(tops.shape)} and "
            f"{tuple(lefts.shape)}."
        )
    tops, lefts = tops.to(x.device), lefts.to(x.device)
    rows = tops[:, None] + torch.arange(size[0], device=x.device)  # (N, h)
    cols = lefts[:, None] + torch.arange(size[1], device=x.device)  # (N, w)
    batch = torch.arange(n, device=x.device)
    # advanced indices around the middle dims put the indexed ones first: (N, h, w, ...) -> (N, ..., h, w)
    out = x[batch[:, None, None], ..., rows[:, :, None], cols[:, None, :]]
    if x.ndim == 3:
        return out
    out = out.permute(0, *range(3, x.ndim), 1, 2)
    # for images the permuted result is laid out channels_last already: keep that for channels_last inputs
    channels_last = x.ndim == 4 and not x.is_contiguous() and x.is_contiguous(memory_format=torch.channels_last)
    if channels_last:
        return out.contiguous(memory_format=torch.channels_last)
    out = out.contiguous()
    if out.stride() != _row_major_strides(out.shape):
        # one channel: the permuted crop counts as contiguous with channels_last strides, which a convolution
        # follows, giving its weight gradient a layout DDP's buckets do not expect (a copy at every step)
        out = out.flatten().view(out.shape)  # the data are in row-major order already: a view fixes the strides
    return out


def _row_major_strides(shape: torch.Size) -> tuple[int, ...]:
    strides, step = [], 1
    for dim in reversed(shape):
        strides.append(step)
        step *= dim
    return tuple(reversed(strides))


def resize_batch(
    x: Tensor,
    size: Size,
    mode: str = "resize",
    interpolation: str = "bilinear",
    antialias: bool = True,
    mask: Tensor | None = None,
    generator: torch.Generator | None = None,
) -> tuple[Tensor, Tensor | None]:
    """Bring a batch of images (and optionally their masks) to ``size``: ``(new_x, new_mask)``.

    ``mode="resize"`` interpolates the images (masks by nearest sampling); ``mode="crop"`` takes a random
    crop per sample, the same region from the images and the masks. The result has ``size`` exactly.

    Example::

        >>> x, m = torch.rand(2, 3, 32, 32), torch.randint(0, 5, (2, 32, 32))
        >>> nx, nm = resize_batch(x, (16, 16), mode="crop", mask=m, generator=torch.Generator().manual_seed(0))
        >>> tuple(nx.shape), tuple(nm.shape)
        ((2, 3, 16, 16), (2, 16, 16))
    """
    check_image_batch(x, "resize_batch")
    size = (int(size[0]), int(size[1]))
    if min(size) < 1:
        raise ValueError(f"`size` must be (height, width) of at least 1 pixel each, got {size}.")
    if mask is not None and (
        mask.ndim < 3 or mask.shape[0] != x.shape[0] or tuple(mask.shape[-2:]) != tuple(x.shape[-2:])
    ):
        raise ValueError(
            f"Dense targets must be (N, ..., H, W) with the images' batch size, height and width: images "
            f"{tuple(x.shape)}, targets {tuple(mask.shape)}."
        )
    if mode not in ("resize", "crop"):
        raise ValueError(f"`mode` must be 'resize' or 'crop', got {mode!r}.")
    if tuple(x.shape[-2:]) == size:
        return x, mask
    if mode == "resize":
        new_mask = resize_masks(mask, size, interpolation) if mask is not None else None
        return resize_images(x, size, interpolation, antialias), new_mask
    tops, lefts = crop_offsets(x.shape[0], (x.shape[-2], x.shape[-1]), size, generator)
    new_mask = crop_at(mask, size, tops, lefts) if mask is not None else None
    return crop_at(x, size, tops, lefts), new_mask
