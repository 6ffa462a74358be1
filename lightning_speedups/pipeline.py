"""Progressive resizing inside the data pipeline: the size of each batch reaches the dataset's transforms.

Resizing on the device (after the loader) saves model compute but leaves decoding and augmentation at full
size on the CPU, which can become the bottleneck. Here the reduced size reaches the dataset's own transforms,
inside DataLoader worker processes, so that they work on fewer pixels.

How, and why this way:

* The size of a batch is decided **in the main process, per batch**, by :class:`ResolutionSampler`: it wraps
  the training sampler and yields ``PlannedIndex(index, plan)`` pairs, every index of one batch carrying the
  same :class:`~lightning_speedups.functional.resizing.ResizePlan`. The plan travels with the indices
  through the DataLoader's index queue, so it reaches worker processes with fork or spawn, persistent or not,
  with no shared state to go stale.
* The plan is a function of the batch's position (epoch, batch number in the epoch), which tells the
  optimizer step that batch will be trained at. Prefetching workers therefore build each batch at the size of
  the step that consumes it: **no lag**, and a batch is always uniform, so ``default_collate`` works.
* :class:`ResolutionDataset` wraps the dataset: for a ``PlannedIndex`` it makes the plan current (a context
  variable, local to the worker process) while the wrapped dataset loads the sample, and the user's
  :class:`ScheduledResize` transform (or any transform calling :func:`current_resize_plan`) reads it. Plain
  integer indices (validation, the user's own indexing) see no plan: full size.

``ProgressiveResizing(mode="pipeline")`` installs both wrappers through ``SpeedupDataModule``; users only put
``ScheduledResize`` in their training transforms.
"""

from __future__ import annotations

import contextvars
import itertools
import math
import sys
import warnings
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

from torch.utils.data import Dataset, DistributedSampler, Sampler

from lightning_speedups._checks import flag
from lightning_speedups.functional.resizing import INTERPOLATIONS, ResizePlan, Size

#: ``plan_for_batch(epoch, batch_in_epoch) -> ResizePlan``, evaluated in the main process.
PlanForBatch = Callable[[int, int], ResizePlan]

# (plan, [read?]) of the sample being loaded in this process and thread; None outside ResolutionDataset.
_CURRENT: contextvars.ContextVar[tuple[ResizePlan, list[bool]] | None] = contextvars.ContextVar(
    "lightning_speedups_resize_plan", default=None
)


def current_resize_plan() -> ResizePlan | None:
    """The plan of the training sample being loaded right now, or ``None`` (full size) outside one.

    Call it from a custom transform to follow the schedule yourself, e.g.
    ``size = plan.size_for(full) if plan else full``.
    """
    entry = _CURRENT.get()
    if entry is None:
        return None
    entry[1][0] = True
    return entry[0]


class PlannedIndex(NamedTuple):
    """A sample index together with the plan of the batch it belongs to."""

    index: int
    plan: ResizePlan


class ResolutionDataset(Dataset):
    """Wraps a map-style dataset so that ``dataset[PlannedIndex(i, plan)]`` loads sample ``i`` under ``plan``.

    Any other key is passed through unchanged. Attributes not found here are read from the wrapped dataset, and
    attributes set here are set on it (``trainer.train_dataloader.dataset.transform = ...`` reaches the dataset
    the workers load from, as it would unwrapped).
    The first planned sample loaded in each process checks that the transforms did read the plan, and raises
    a clear error if not (the transform is missing from the pipeline).
    """

    def __init__(self, dataset: Dataset) -> None:
        self.dataset = dataset
        self._verified = False

    def __len__(self) -> int:
        return len(self.dataset)  # type: ignore[arg-type]

    def __getitem__(self, key: Any) -> Any:
        if not isinstance(key, PlannedIndex):
            return self.dataset[key]
        read = [False]
        token = _CURRENT.set((key.plan, read))
        try:
            sample = self.dataset[key.index]
        finally:
            _CURRENT.reset(token)
        if not self._verified:
            if not read[0]:
                raise RuntimeError(
                    "ProgressiveResizing(mode='pipeline'): the training dataset's transforms never asked for "
                    "the current size, so every batch would stay at full size. Put "
                    "`lightning_speedups.ScheduledResize(...)` in the training dataset's transform (or call "
                    "`lightning_speedups.pipeline.current_resize_plan()` in your own), or use mode='resize'."
                )
            self._verified = True
        return sample

    def __getitems__(self, keys: list[Any]) -> list[Any]:
        # The DataLoader fetches a batch through `__getitems__` when the dataset has one; every key goes through
        # `__getitem__` so that each planned index loads under its plan (a wrapped `Subset`'s own batch fetch
        # would receive the `PlannedIndex` pairs and fail).
        return [self[key] for key in keys]

    def __getattr__(self, name: str) -> Any:
        # `dataset` is not set yet while unpickling: avoid recursing. Special names are never forwarded: they
        # belong to this wrapper's protocol, not the wrapped dataset's.
        if name == "dataset" or (name.startswith("__") and name.endswith("__")):
            raise AttributeError(name)
        return getattr(self.dataset, name)

    def __setattr__(self, name: str, value: Any) -> None:
        if name in _OWN_ATTRIBUTES:
            object.__setattr__(self, name, value)
        else:
            setattr(self.dataset, name, value)

    def __delattr__(self, name: str) -> None:
        if name in _OWN_ATTRIBUTES:
            object.__delattr__(self, name)
        else:
            delattr(self.dataset, name)


_OWN_ATTRIBUTES = frozenset({"dataset", "_verified"})


class ResolutionSampler(DistributedSampler):
    """Wraps a training sampler; yields ``PlannedIndex(index, plan)`` with one plan per batch.

    Length and ``skip_next`` (mid-epoch resume) are those of the wrapped sampler; ``set_epoch`` is passed on to
    it. The epoch that numbers the plans is the wrapped sampler's ``epoch`` where it has one, else this
    sampler's own (from ``epoch`` and ``set_epoch``): a sampler may follow ``set_epoch`` without exposing
    it, and the sizes must still follow the epochs. It is a ``DistributedSampler`` so that Lightning neither
    wraps nor replaces it under DDP; the wrapped sampler must shard over ranks itself (``SpeedupDataModule``'s
    samplers do).

    Args:
        sampler: the sampler of sample indices.
        batch_size: samples per batch, as the DataLoader groups them.
        plan_for_batch: ``plan_for_batch(epoch, batch_in_epoch) -> ResizePlan``.
        epoch: the epoch of the first pass, until ``set_epoch`` (what the wrapped sampler was built for).
    """

    def __init__(self, sampler: Sampler, batch_size: int, plan_for_batch: PlanForBatch, epoch: int = 0) -> None:
        # DistributedSampler.__init__ is not called on purpose: every attribute is the wrapped sampler's.
        self.sampler = sampler
        self.batch_size = int(batch_size)
        self.plan_for_batch = plan_for_batch
        self._epoch = int(epoch)
        self._skip = 0

    @property
    def epoch(self) -> int:  # type: ignore[override]
        inner = getattr(self.sampler, "epoch", None)
        return self._epoch if inner is None else int(inner)

    def set_epoch(self, epoch: int) -> None:
        self._epoch = int(epoch)
        if hasattr(self.sampler, "set_epoch"):
            self.sampler.set_epoch(epoch)

    def skip_next(self, n: int) -> None:
        """Skip the first ``n`` indices of the next pass (``n`` a multiple of the batch size)."""
        # the plans are numbered from the batch the loop resumes at, whether or not the data can skip there
        self._skip = max(0, int(n))
        skip = getattr(self.sampler, "skip_next", None)
        if skip is None:
            from lightning.pytorch.utilities import rank_zero_warn

            rank_zero_warn(
                f"The training sampler {type(self.sampler).__name__} has no `skip_next`: a run resumed "
                "mid-epoch restarts the epoch's data from its first batch (at the sizes of the batches it resumes at)."
            )
            return
        skip(n)

    def __len__(self) -> int:
        return len(self.sampler)  # type: ignore[arg-type]

    def num_batches(self, drop_last: bool) -> int:
        """Batches per pass, as a DataLoader with this batch size groups them."""
        n = len(self)
        return n // self.batch_size if drop_last else math.ceil(n / self.batch_size)

    def __iter__(self) -> Iterator[PlannedIndex]:  # type: ignore[override]
        # Read epoch and skip now, not when the first index is requested.
        epoch, skip, self._skip = self.epoch, self._skip, 0
        return self._planned(iter(self.sampler), epoch, skip // self.batch_size)

    def _planned(self, indices: Iterator[int], epoch: int, first_batch: int) -> Iterator[PlannedIndex]:
        for batch, chunk in enumerate(_chunks(indices, self.batch_size), start=first_batch):
            plan = self.plan_for_batch(epoch, batch)
            for index in chunk:
                yield PlannedIndex(index, plan)

    def __getattr__(self, name: str) -> Any:
        if name == "sampler":
            raise AttributeError(name)
        return getattr(self.sampler, name)


def _chunks(indices: Iterator[int], size: int) -> Iterator[list[int]]:
    while chunk := list(itertools.islice(indices, size)):
        yield chunk


class ScheduledResize:
    """A transform that brings each training sample to the size the schedule decided for its batch.

    Put it in the *training* dataset's transform and use ``ProgressiveResizing(mode="pipeline")`` with a
    ``SpeedupDataModule``. Outside training batches (validation, your own indexing) it produces the full size,
    but otherwise transforms as it does in training: with a random ``factory`` (e.g. ``RandomResizedCrop``),
    give the validation dataset its own deterministic transform (e.g. ``Resize`` and ``CenterCrop``).
    Works on PIL images and on ``(..., H, W)`` tensors, alone or with their masks and boxes (``transform(image,
    mask)``, as torchvision's v2 transforms are called for segmentation and detection; there, and through a
    ``factory``, tensors as torchvision's transforms take them: ``(..., C, H, W)``).

    Args:
        size: the full size ``(H, W)`` (an int for a square), i.e. what the pipeline produces without
            progressive resizing. ``None``: the size of the incoming image is the full size.
        factory: builds the transform that produces a given size, called as ``factory((h, w))`` and cached per
            size, e.g. ``torchvision.transforms.RandomResizedCrop``: the crop then goes straight to the
            reduced size, and later steps work on fewer pixels. Use a class or ``functools.partial`` (not a
            lambda) if workers are spawned. ``None``: resize the incoming image.
        interpolation: ``"nearest"``, ``"bilinear"`` or ``"bicubic"``, when ``factory`` is ``None``.
        antialias: antialiased downsizing of tensors (PIL images always are), when ``factory`` is ``None``.

    Example::

        import lightning.pytorch as pl
        import torch
        import torchvision.transforms.v2 as T
        from torchvision.datasets import FakeData
        from lightning_speedups import ProgressiveResizing, ScheduledResize, SpeedupDataModule
        from lightning_speedups.demo import ImageClassifier

        class Images(SpeedupDataModule):
            def setup(self, stage):
                # RandomResizedCrop straight to this batch's size, then the rest on fewer pixels
                crop = ScheduledResize(64, factory=T.RandomResizedCrop)
                steps = T.Compose([crop, T.ToImage(), T.ToDtype(torch.float32, scale=True)])
                self.train_dataset = FakeData(256, image_size=(3, 96, 96), num_classes=10, transform=steps)

        trainer = pl.Trainer(max_epochs=2, callbacks=[ProgressiveResizing(mode="pipeline")], logger=False)
        trainer.fit(ImageClassifier(in_channels=3, widths=(8, 16)), datamodule=Images(batch_size=32, num_workers=2))
    """

    def __init__(
        self,
        size: int | Size | None = None,
        factory: Callable[[Size], Callable[[Any], Any]] | None = None,
        interpolation: str = "bilinear",
        antialias: bool = True,
    ) -> None:
        if isinstance(size, int) and not isinstance(size, bool):
            size = (size, size)
        if size is not None and not (
            isinstance(size, tuple | list) and len(size) == 2 and all(isinstance(s, int) and s > 0 for s in size)
        ):
            raise ValueError(f"`size` must be None, a positive int or a pair of them (H, W); got {size!r}.")
        if factory is not None and size is None:
            raise ValueError("`factory` builds a transform for a size: give the full `size` with it.")
        if factory is not None and not callable(factory):
            raise TypeError(
                f"`factory` must be callable, e.g. torchvision.transforms.RandomResizedCrop; got {factory!r}."
            )
        if interpolation not in INTERPOLATIONS:
            raise ValueError(f"`interpolation` must be one of {INTERPOLATIONS}, got {interpolation!r}.")
        self.size: Size | None = (int(size[0]), int(size[1])) if size is not None else None
        self.factory = factory
        self.interpolation = interpolation
        self.antialias = flag("antialias", antialias)
        self._built: dict[Size, Callable[[Any], Any]] = {}
        self._warned_upsampling = False  # per process: each worker has its own copy
        self._warned_joint = False

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(size={self.size}, factory={self.factory!r}, interpolation={self.interpolation!r})"
        )

    def __getstate__(self) -> dict[str, Any]:
        # workers rebuild what they need; a worker started by spawn learns its process's rank here (a forked one
        # keeps Lightning's record of it)
        return {**self.__dict__, "_built": {}, "_rank": _lightning_rank()}

    def target_size(self, image: Any) -> Size:
        """The size this transform gives ``image`` now."""
        plan = current_resize_plan()
        full = self.size if self.size is not None else _image_size(image)
        if plan is None:
            return full
        if plan.resolution is not None and plan.resolution > min(full) and not self._warned_upsampling:
            # the device-side modes say so at the first batch; here only the transform sees the full size
            self._warned_upsampling = True
            _warn_on_rank_zero(
                self.__dict__.get("_rank"),
                f"ProgressiveResizing's epoch ramp asks for a resolution of {plan.resolution}, above the images' "
                f"shorter side ({min(full)} of {full[0]}x{full[1]}): ScheduledResize upsamples them. Lower `max_res` "
                "to at most the image size.",
                stacklevel=3,
            )
        return plan.size_for(full)

    def __call__(self, *inputs: Any, image: Any = None) -> Any:
        """Transform a sample: one image, or (as torchvision's v2 transforms take them) several inputs or a
        structure of them, e.g. ``(image, mask)`` or a dict; the size is the image's, and v2 resizes masks
        (``tv_tensors.Mask``) and boxes to match, masks with nearest."""
        if image is not None:  # `transform(image=x)`, as the single-image signature allowed
            inputs = (image, *inputs)
        if not inputs:
            raise TypeError("ScheduledResize needs the sample to transform: call it with an image (or several inputs).")
        joint = len(inputs) > 1 or not _is_image(inputs[0])
        size = self.target_size(self._joint_image(inputs) if joint else inputs[0])
        if self.factory is None and not joint:
            image = inputs[0]
            if _image_size(image) == size:
                return image
            import torch
            import torchvision.transforms.v2.functional as TF
            from torchvision.transforms import InterpolationMode

            mode = InterpolationMode(self.interpolation)
            # a plain (H, W) tensor (no channel): torchvision resizes (..., C, H, W); a tv_tensor (a 2-D Mask) it
            # resizes itself, by its kind (masks with nearest)
            flat = type(image) is torch.Tensor and image.ndim == 2
            out = TF.resize(image[None] if flat else image, list(size), interpolation=mode, antialias=self.antialias)
            return out[0] if flat else out
        transform = self._built.get(size)
        if transform is None:
            transform = self._built[size] = self.factory(size) if self.factory is not None else self._resize(size)
        return transform(*inputs)

    def _joint_image(self, inputs: tuple[Any, ...]) -> Any:
        """The image of a joint sample; a warning, once, where a mask is not marked as one."""
        image, suspect = _find_image(inputs)
        if suspect and not self.__dict__.get("_warned_joint"):
            self._warned_joint = True
            _warn_on_rank_zero(
                self.__dict__.get("_rank"),
                "ScheduledResize got a sample whose image comes with a plain tensor or a one-channel PIL image, not "
                "a `tv_tensors.Mask`: torchvision resizes every PIL image bilinearly (a mask's labels blended) and "
                "only the first plain tensor, leaving the others at full size. Wrap masks in "
                "`torchvision.tv_tensors.Mask` (resized with nearest) and images in `tv_tensors.Image`.",
                stacklevel=4,
            )
        return image

    def _resize(self, size: Size) -> Callable[..., Any]:
        import torchvision.transforms.v2 as T
        from torchvision.transforms import InterpolationMode

        return T.Resize(list(size), interpolation=InterpolationMode(self.interpolation), antialias=self.antialias)


def _is_image(x: Any) -> bool:
    """A PIL image or an ``(..., H, W)`` tensor: what the sizes are read from."""
    import torch

    if isinstance(x, torch.Tensor):
        return x.ndim >= 2
    try:
        from PIL import Image
    except ImportError:  # pragma: no cover - torchvision depends on Pillow
        return False
    return isinstance(x, Image.Image)


#: PIL modes of masks and label maps: one channel of integers (or bits), or a palette
_LABEL_MODES = frozenset({"1", "L", "P", "I", "I;16", "I;16B", "I;16L", "F"})


def _find_image(inputs: tuple[Any, ...]) -> tuple[Any, bool]:
    """The image among a joint sample's inputs, as torchvision's v2 transforms pick it: a ``tv_tensors.Image`` or
    a PIL image first, else the first plain tensor (masks, boxes and labels are not where the size is read); and
    whether an input beside it may be a mask that torchvision will not resize as one."""
    from torch.utils._pytree import tree_flatten
    from torchvision import tv_tensors

    leaves = [x for x in tree_flatten(inputs)[0] if _is_image(x)]
    images = [x for x in leaves if isinstance(x, tv_tensors.Image | tv_tensors.Video) or not hasattr(x, "ndim")]
    plain = [x for x in leaves if not isinstance(x, tv_tensors.TVTensor) and hasattr(x, "ndim")]
    found = images or plain
    # several unmarked inputs, one of which may be a mask: a plain tensor, or a PIL image in a label map's mode
    # (two RGB views of one sample are images, rightly resized as such)
    pil = [x for x in leaves if not hasattr(x, "ndim")]
    suspect = len(plain) + len(images) > 1 and (plain or any(getattr(x, "mode", None) in _LABEL_MODES for x in pil))
    if not found:
        raise TypeError(
            "ScheduledResize found no image in its inputs (a PIL image or an (..., H, W) tensor); got "
            f"{', '.join(type(x).__name__ for x in tree_flatten(inputs)[0])}."
        )
    return found[0], bool(suspect)


def _image_size(image: Any) -> Size:
    import torchvision.transforms.v2.functional as TF

    h, w = TF.get_size(image)
    return int(h), int(w)


def _lightning_rank() -> int:
    """This process's rank as Lightning records it (0 where Lightning is not loaded)."""
    names = ("lightning.fabric.utilities.rank_zero", "lightning_fabric.utilities.rank_zero")
    ranks = [getattr(getattr(sys.modules.get(m), "rank_zero_only", None), "rank", 0) for m in names]
    return max((int(r) for r in ranks if r is not None), default=0)


def _warn_on_rank_zero(rank: int | None, message: str, *, stacklevel: int) -> None:
    """A SpeedupWarning from a transform, which runs in each rank's DataLoader workers: said by rank zero's only.
    ``rank``: the rank of the process that pickled the transform for its workers, if it was; else Lightning's
    record in this process (which a forked worker keeps)."""
    from lightning_speedups.base import SpeedupWarning  # here: workers import this module without Lightning

    if (rank if rank is not None else _lightning_rank()) != 0:
        return
    warnings.warn(message, SpeedupWarning, stacklevel=stacklevel)
