"""Progressive resizing: train on smaller images early and on full-size images late (fast.ai, Composer, FFCV)."""

from __future__ import annotations

import functools
import math
import re
from collections import deque
from collections.abc import Callable
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

import torch
from lightning.pytorch.callbacks import EarlyStopping, ModelCheckpoint, WeightAveraging
from lightning.pytorch.utilities import rank_zero_info
from lightning.pytorch.utilities.model_helpers import is_overridden
from torch import Tensor, nn
from torch.utils.data import Dataset, DistributedSampler, Sampler

from lightning_speedups import _checks
from lightning_speedups._rng import global_rng_kept
from lightning_speedups.base import (
    SpeedupCallback,
    accumulation,
    cap_by_max_steps,
    continued_from,
    epoch_steps,
    run_length,
    training_epochs,
)
from lightning_speedups.batch import BatchFields, BatchGetter, BatchSetter, Key
from lightning_speedups.data import ResumableDataLoader
from lightning_speedups.functional.batchnorm import (
    batchnorm_layers,
    pool_batchnorm_statistics,
    recalibrate_batchnorm,
    snapshot_batchnorm,
    train_modes_kept,
)
from lightning_speedups.functional.resizing import (
    INTERPOLATIONS,
    ResizePlan,
    check_image_batch,
    crop_at,
    progressive_scale,
    ramp_resolution,
    resize_batch,
    resize_images,
    resize_masks,
)
from lightning_speedups.pipeline import ResolutionDataset, ResolutionSampler

if TYPE_CHECKING:
    import lightning.pytorch as pl

    from lightning_speedups.data import SpeedupDataModule

_MODES = ("resize", "crop", "pipeline")
_VALIDATION = ("auto", "train_size", "recalibrate", "full")
_DEFAULT_SCHEDULE = {"initial_scale": 0.5, "delay_fraction": 0.5, "finetune_fraction": 0.2}
#: the validation size when batches came at several sizes (loaders of other image sizes)
_SEVERAL = (-1, -1)


class _TrainingStatistics:
    """State-dict hook: the BatchNorm statistics ``snapshot`` saved (the training ones) in place of the model's.

    A copy of the model (``copy.deepcopy``, a pickle) made meanwhile gets a hook that does nothing: the callback
    removes only the original's hook, and the copy's would report that validation's statistics for good.
    """

    def __init__(self, snapshot: Any) -> None:
        self.snapshot = snapshot

    def __call__(self, module: nn.Module, state: dict[str, Any], prefix: str, metadata: Any) -> None:
        if self.snapshot is not None:
            entries = self.snapshot.state_dict_entries(module).items()
            state.update((prefix + k, v) for k, v in entries if prefix + k in state)

    def __reduce__(self) -> tuple[Any, ...]:
        return (_TrainingStatistics, (None,))


def _integer(name: str, value: Any, minimum: int) -> int:
    if value is None or not _checks.is_integral(value):  # `optional_int`'s message would offer None
        raise TypeError(f"`{name}` must be an int >= {minimum}, got {value!r}.")
    checked = _checks.optional_int(name, value, minimum=minimum)
    assert checked is not None
    return checked


#: torch's messages for inputs of a size a layer cannot take (a flatten before a Linear, a fixed embedding)
_SHAPE_ERROR = re.compile(r"shape|size mismatch|must match the size|mat1 and mat2|Expected .*size|input size", re.I)


def _validates(trainer: pl.Trainer) -> bool:
    """Whether this fit can validate: batches allowed, a ``validation_step``, and a validation loader defined."""
    if trainer.limit_val_batches == 0 or not is_overridden("validation_step", trainer.lightning_module):
        return False
    source = getattr(getattr(trainer.fit_loop.epoch_loop, "val_loop", None), "_data_source", None)
    return source is None or not hasattr(source, "is_defined") or bool(source.is_defined())


class ProgressiveResizing(SpeedupCallback):
    """Train on reduced image sizes early, growing to full size; validate meaningfully throughout.

    **Schedule.** By default Composer's: the scale is ``initial_scale`` until ``delay_fraction`` of training,
    grows linearly to 1 by ``1 - finetune_fraction``, and the rest of training is at full size. Sizes are
    rounded to a multiple of ``size_increment``. Alternatively FFCV's epoch ramp: give ``min_res``,
    ``max_res``, ``start_ramp`` and ``end_ramp`` and the shorter image side is ``min_res`` up to epoch
    ``start_ramp``, ``max_res`` from epoch ``end_ramp``, linear (rounded to ``res_increment``) in between.

    **Where the size is reduced** (``mode``):

    * ``"resize"``: training batches are interpolated on the device (``interpolation``, ``antialias``);
    * ``"crop"``: a random crop per sample, on the device (objects keep their pixel size);
    * ``"pipeline"``: with a :class:`~lightning_speedups.SpeedupDataModule`, the size of each batch reaches
      the dataset's transforms inside the DataLoader workers, where a
      :class:`~lightning_speedups.ScheduledResize` produces it, so decoding and augmentation also run on
      fewer pixels. Exact per batch, no lag behind the schedule (see :mod:`lightning_speedups.pipeline`).

    **Validation** (``validation``). A network trained at a reduced size judges full-size images badly (its
    filters and its BatchNorm statistics were learned at the reduced size): without a remedy, validation
    accuracy sits far below what the model reaches at its training size, and early stopping, checkpoint
    selection and time-to-target are blind until the last part of training. Remedies, used while the
    schedule is below full size (``"recalibrate"`` also for the first full-size batches after it, until
    BatchNorm's running statistics have forgotten the smaller sizes: 29 at momentum 0.1), during ``fit`` only:

    * ``"train_size"``: validation batches are brought to the current training scale on the device (resized
      like the training batches; centre crop in crop mode) and the model is evaluated exactly as trained, so
      the metrics follow the model as it is being trained, measured as a run without this callback measures
      its own. They describe the model *at that scale*: ``val_height``/``val_width`` are logged with them.
    * ``"recalibrate"``: validation stays at full size, and the BatchNorm running statistics are first
      re-estimated at full size on ``calibration_batches`` recent training batches (eval-mode dropout,
      momentum-free average, pooled over DDP ranks); the training statistics are put back after validation,
      so training, checkpoints and resumed runs are unchanged. Enough when objects keep their pixel size
      (crop mode); after resize, the filters themselves are scale-specific and full-size accuracy stays low
      until the ramp (on digits, at step 57: 68.5% against 99.7% at the training size).
    * ``"auto"`` (default): ``"recalibrate"`` in crop mode, ``"train_size"`` in resize and pipeline modes; with
      the epoch ramp ``"full"``, as FFCV does (its ramp ends below the evaluation size on purpose).
    * ``"full"``: no remedy, plain full-size validation.

    When it helps: convolutional networks, whose cost grows with the pixel count (0.5 scale: about a quarter
    of the FLOPs); ImageNet recipes (fast.ai, FFCV, Composer's "mild" ResNet-50). When it hurts: a short run
    can lose a little accuracy for the same number of steps; when data loading is the bottleneck on-device
    modes save nothing (use ``mode="pipeline"``); models with a fixed input size (ViT patch grids without
    position-embedding interpolation, fully connected heads over the feature map).

    Args:
        initial_scale: scale at the start, in (0, 1].
        delay_fraction: fraction of training at ``initial_scale``.
        finetune_fraction: fraction of training at full size, at the end; the two fractions sum to <= 1.
        size_increment: each side is rounded to a multiple of this (>= 1).
        mode: ``"resize"``, ``"crop"`` or ``"pipeline"``.
        interpolation: ``"nearest"`` (Composer's choice), ``"bilinear"`` or ``"bicubic"``, for on-device resizing.
        antialias: antialiased bilinear/bicubic downsizing.
        resize_targets: also resize dense targets (masks ``(N, H, W)`` or ``(N, C, H, W)``), by nearest
            sampling (crop mode: the same crop). With ``mode="pipeline"``, where your transforms size the training
            masks, it resizes those of validation batches brought to the training size (``"train_size"``).
        min_res: FFCV ramp: shorter side (pixels) until ``start_ramp``.
        max_res: FFCV ramp: shorter side from ``end_ramp`` on.
        start_ramp: FFCV ramp: epoch where the ramp starts.
        end_ramp: FFCV ramp: epoch where it ends.
        res_increment: FFCV ramp: resolutions on the ramp are rounded to a multiple of this (FFCV: 32).
        validation: ``"auto"``, ``"train_size"``, ``"recalibrate"`` or ``"full"``, see above.
        calibration_batches: with ``"recalibrate"``, training batches used to re-estimate the BatchNorm
            statistics at full size. On-device modes keep references to the last ones seen (device memory:
            this many full-size input batches); pipeline mode loads them at full size in the main process.
        calibration_forward: ``forward(pl_module, images)`` for recalibration; defaults to ``pl_module(images)``.
        input_key: where the batch keeps its images (see :class:`~lightning_speedups.BatchFields`).
        target_key: where the batch keeps its dense targets (with ``resize_targets``).
        batch_getter: ``getter(batch) -> (input, target)`` for custom batches, with ``batch_setter``.
        batch_setter: ``setter(batch, input, target) -> new batch``.
        seed: seed of the random crops and calibration draws (see :class:`~lightning_speedups.SpeedupCallback`).
        log_knobs: log ``scale`` (or ``resolution``), ``height`` and ``width``.

    Example::

        import lightning.pytorch as pl
        from lightning_speedups import ProgressiveResizing
        from lightning_speedups.demo import DigitsDataModule, ImageClassifier

        # 16 x 16 digits: 8 x 8 for the first half, growing to 16 x 16 by 80%; validation follows the size
        resizing = ProgressiveResizing(initial_scale=0.5, delay_fraction=0.5, finetune_fraction=0.2)
        trainer = pl.Trainer(max_epochs=4, callbacks=[resizing], logger=False)
        trainer.fit(ImageClassifier(widths=(8, 16, 32)), datamodule=DigitsDataModule(size=16))
    """

    log_name = "progressive_resizing"

    def __init__(
        self,
        initial_scale: float = 0.5,
        delay_fraction: float = 0.5,
        finetune_fraction: float = 0.2,
        size_increment: int = 4,
        mode: str = "resize",
        *,
        interpolation: str = "bilinear",
        antialias: bool = True,
        resize_targets: bool = False,
        min_res: int | None = None,
        max_res: int | None = None,
        start_ramp: float | None = None,
        end_ramp: float | None = None,
        res_increment: int = 32,
        validation: str = "auto",
        calibration_batches: int = 4,
        calibration_forward: Callable[[Any, Tensor], Any] | None = None,
        input_key: Key | None = None,
        target_key: Key | None = None,
        batch_getter: BatchGetter | None = None,
        batch_setter: BatchSetter | None = None,
        seed: int | None = None,
        log_knobs: bool = True,
    ) -> None:
        super().__init__(seed=seed, log_knobs=log_knobs)
        self.initial_scale = _checks.in_range(
            "initial_scale", initial_scale, 0.0, 1.0, low_open=True, hint="It is the first fraction of the full size."
        )
        self.delay_fraction = _checks.in_range("delay_fraction", delay_fraction, 0.0, 1.0)
        self.finetune_fraction = _checks.in_range("finetune_fraction", finetune_fraction, 0.0, 1.0)
        if self.delay_fraction + self.finetune_fraction > 1.0 + 1e-12:
            raise ValueError(
                f"`delay_fraction + finetune_fraction` must be <= 1 (they are the parts of training before and "
                f"after the ramp), got {delay_fraction!r} + {finetune_fraction!r}. Lower one of them."
            )
        self.size_increment = _integer("size_increment", size_increment, 1)
        if mode not in _MODES:
            raise ValueError(f"`mode` must be one of {_MODES}, got {mode!r}.")
        self.mode = mode
        if interpolation not in INTERPOLATIONS:
            raise ValueError(f"`interpolation` must be one of {INTERPOLATIONS}, got {interpolation!r}.")
        self.interpolation = interpolation
        self.antialias = _checks.flag("antialias", antialias)
        self.resize_targets = _checks.flag("resize_targets", resize_targets)
        self.ramp = self._check_ramp(min_res, max_res, start_ramp, end_ramp, res_increment)
        if self.ramp is not None:
            given = {"initial_scale": initial_scale, "delay_fraction": delay_fraction}
            given["finetune_fraction"] = finetune_fraction
            changed = [k for k, v in given.items() if v != _DEFAULT_SCHEDULE[k]]
            if changed:
                raise ValueError(
                    f"Pass either the fraction schedule ({', '.join(changed)}) or the epoch ramp (min_res, "
                    "max_res, start_ramp, end_ramp), not both."
                )
        if validation not in _VALIDATION:
            raise ValueError(f"`validation` must be one of {_VALIDATION}, got {validation!r}.")
        self.validation = validation
        #: the remedy in use: ``validation`` with ``"auto"`` resolved.
        self.val_remedy = validation if validation != "auto" else self._auto_remedy()
        self.calibration_batches = _integer("calibration_batches", calibration_batches, 1)
        if calibration_forward is not None and not callable(calibration_forward):
            raise TypeError(f"`calibration_forward` must be callable(pl_module, images), got {calibration_forward!r}.")
        self.calibration_forward = calibration_forward
        self.fields = BatchFields(input_key, target_key, batch_getter, batch_setter)

        self._plan: ResizePlan | None = None  # of the last training batch
        self._size: tuple[int, int] | None = None  # of the last training batch, after resizing
        self._reduced_step_done = False  # a training step at a reduced size has gone through
        # of the last training batch, before resizing; in pipeline mode, the dataset's full size once learned
        self._full: tuple[int, int] | None = None
        self._run: float = math.inf  # pipeline mode: training batches at `_size` in a row (this whole fit: inf)
        self._val_size: tuple[int, int] | None = None
        self._val_resized = False  # this validation brought some batch below full size (its size is logged)
        self._warned_several_val_sizes = False
        self._cache: deque[Tensor] = deque(maxlen=self.calibration_batches)
        self._epoch_counts: dict[tuple[Any, ...], tuple[int, float]] = {}  # pipeline: (steps before, total)
        self._snapshot: Any = None
        # this fit re-estimates BatchNorm statistics before validation: the remedy, BatchNorm layers, a validation
        # to correct, and the model's own statistics in it (worked out at `on_train_start`)
        self._recalibrates = False
        self._trained_bn: list[nn.Module] = []  # the BatchNorm layers in training mode while training
        self._bn_modes_stale = True
        self._warned_unreached = False
        self._checked = False
        self._settled = False  # the fraction schedule reached full size for the rest of this fit
        self._full_batches: float = math.inf  # see `setup`
        self._wrapped_loader = False
        self._warned_no_calibration = False
        self.recalibrations = 0

    def _auto_remedy(self) -> str:
        if self.ramp is not None:
            return "full"  # FFCV's practice: the ramp ends below the evaluation size on purpose (FixRes)
        return "recalibrate" if self.mode == "crop" else "train_size"

    @staticmethod
    def _check_ramp(
        min_res: Any, max_res: Any, start_ramp: Any, end_ramp: Any, res_increment: Any
    ) -> dict[str, Any] | None:
        values = {"min_res": min_res, "max_res": max_res, "start_ramp": start_ramp, "end_ramp": end_ramp}
        if all(v is None for v in values.values()):
            return None
        missing = [k for k, v in values.items() if v is None]
        if missing:
            raise ValueError(f"The epoch ramp needs min_res, max_res, start_ramp and end_ramp; missing {missing}.")
        lo, hi = _integer("min_res", min_res, 1), _integer("max_res", max_res, 1)
        if hi < lo:
            raise ValueError(f"`max_res` ({max_res!r}) must be >= `min_res` ({min_res!r}).")
        start = _checks.in_range("start_ramp", start_ramp, 0.0, math.inf, hint="It is an epoch number.")
        end = _checks.in_range("end_ramp", end_ramp, 0.0, math.inf, hint="It is an epoch number.")
        if end < start:
            raise ValueError(f"`end_ramp` ({end_ramp!r}) must be >= `start_ramp` ({start_ramp!r}).")
        increment = _integer("res_increment", res_increment, 1)
        return {"min_res": lo, "max_res": hi, "start_ramp": start, "end_ramp": end, "round_to": increment}

    def _repr_values(self) -> dict[str, Any]:
        ramp = dict(self.ramp or {})  # the epoch ramp's arguments, kept together
        if ramp:
            ramp["res_increment"] = ramp.pop("round_to")
        return {**super()._repr_values(), **ramp}

    # ------------------------------------------------------------------ the schedule
    def plan_at(self, progress: float, epoch: int) -> ResizePlan:
        """The plan at a training ``progress`` (fraction schedule) or ``epoch`` (epoch ramp)."""
        if self.ramp is not None:
            return ResizePlan(resolution=ramp_resolution(epoch, **self.ramp), size_increment=self.size_increment)
        scale = progressive_scale(progress, self.initial_scale, self.delay_fraction, self.finetune_fraction)
        return ResizePlan(scale=scale, size_increment=self.size_increment)

    def current_plan(self, trainer: pl.Trainer) -> ResizePlan:
        """The plan of the training batch about to run."""
        return self.plan_at(self._progress(trainer), trainer.current_epoch)

    def _progress(self, trainer: pl.Trainer) -> float:
        """Training progress for the fraction schedule; the epoch ramp needs none (nor a run of known length)."""
        return 0.0 if self.ramp is not None else self.progress(trainer)

    # ------------------------------------------------------------------ on the device
    @property
    def observe_training_batch(self) -> Callable[[pl.Trainer, pl.LightningModule, Any], None] | None:
        """The seam's hook that hands over each training batch as validation would see it (not mixed by a MixUp
        before this one, normalised by a callback that normalises validation too), when recalibration needs one."""
        wanted = self.mode != "pipeline" and self._recalibrates
        return self._keep_for_calibration if wanted else None

    def _keep_for_calibration(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any) -> None:
        """The images recalibration re-estimates the BatchNorm statistics from."""
        if not self._settled or self._full_batches < self._horizon():
            self._cache.append(self.fields.get_input(batch))  # a reference: the seam never mutates batches

    def transform_batch(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any) -> Any:
        if self._bn_modes_stale and self._recalibrates:
            # once per epoch (at full size too: a layer frozen then must keep its statistics): frozen (eval-mode)
            # BatchNorm layers keep their statistics at validation (lazy layers included: the module object
            # stays, and has its statistics once a batch went through)
            self._trained_bn = [bn for bn in batchnorm_layers(pl_module, lazy=True) if bn.training]
            self._bn_modes_stale = False
        if self._settled:  # full size until the end of this fit: nothing to work out per batch
            self._full_batches += 1
            return batch
        x = self.fields.get_input(batch)
        target = self.fields.get_target(batch) if self.resize_targets else None
        first = not self._checked
        if first:
            self._check_batch(x, target)
            if self._recalibrates:
                self._check_calibration_forward(trainer, pl_module, x)
            self._checked = True
        progress = self._progress(trainer)
        plan = self.plan_at(progress, trainer.current_epoch)
        self._plan = plan
        # Progress only grows within a fit, and the fraction schedule stays at full size once it gets there.
        self._settled = (
            self.ramp is None
            and plan.is_full
            and (self.initial_scale >= 1.0 or progress >= 1.0 - self.finetune_fraction)
        )
        masks_left = self.mode == "pipeline" and self.val_remedy == "train_size" and not self.resize_targets
        if first and masks_left and not self._settled and _validates(trainer):  # validation may yet be shrunk
            self._warn_unresized_validation_masks(batch, x)
        full = (int(x.shape[-2]), int(x.shape[-1]))
        if self.mode == "pipeline":
            # the pipeline already made its size; full-size batches are loaded when needed
            self._run = self._run + 1 if self._size in (None, full) else 1  # None: this fit's first batch
            self._size = full
            # an epoch ramp's plan names a resolution, which is full size only if the dataset's is that: known from
            # the first validation on (`_learn_full_size`), which counts the full-size batches before it
            at_full = plan.is_full or (self._full is not None and full == self._full)
            self._full_batches = self._full_batches + 1 if at_full else 0  # see `_horizon`
            return batch
        size = plan.size_for(full)
        self._full, self._size = full, size
        self._full_batches = self._full_batches + 1 if size == full else 0
        if size == full:
            return batch
        generator = self.torch_generator(trainer) if self.mode == "crop" else None
        new_x, new_target = resize_batch(x, size, self.mode, self.interpolation, self.antialias, target, generator)
        return self.fields.replace(batch, input=new_x, target=new_target if self.resize_targets else None)

    def _check_batch(self, x: Any, target: Any) -> None:
        who = "ProgressiveResizing"
        check_image_batch(x, who)
        if self.ramp is not None and self.mode != "pipeline":
            short = min(int(x.shape[-2]), int(x.shape[-1]))
            if self.ramp["max_res"] > short and self.mode == "crop":
                raise ValueError(
                    f"{who}: the epoch ramp reaches max_res={self.ramp['max_res']}, but the images are "
                    f"{tuple(x.shape[-2:])}: a crop cannot be larger than the image. Lower `max_res` or use "
                    "mode='resize'."
                )
            if self.ramp["max_res"] > short:
                self.warn(
                    f"the epoch ramp reaches max_res={self.ramp['max_res']} but the images' shorter side is "
                    f"{short}: batches will be upsampled.",
                    every_rank=True,  # this rank's images
                )
        if self.mode == "resize" and self.interpolation != "nearest" and not x.is_floating_point():
            raise TypeError(
                f"{who}: {self.interpolation} interpolation needs floating-point images, got dtype {x.dtype}. "
                "Convert them to float, or use interpolation='nearest' or mode='crop'."
            )
        if self.resize_targets:
            if not isinstance(target, Tensor) or target.ndim not in (3, 4):
                shape = tuple(target.shape) if isinstance(target, Tensor) else type(target).__name__
                raise ValueError(
                    f"{who}(resize_targets=True) needs dense targets (N, H, W) or (N, C, H, W), got {shape}. "
                    "Fix `target_key`, or set resize_targets=False for class labels."
                )
            if tuple(target.shape[-2:]) != tuple(x.shape[-2:]) or target.shape[0] != x.shape[0]:
                raise ValueError(
                    f"{who}: dense targets {tuple(target.shape)} must match the images {tuple(x.shape)} in batch "
                    "size, height and width."
                )

    def _warn_unresized_validation_masks(self, batch: Any, x: Tensor) -> None:
        """Pipeline mode: training masks come sized by the workers, but validation brings only the images to the
        training size unless ``resize_targets``: a model that does not size its output to the mask's would fail
        there (or, for boxes, score against full-size coordinates), an epoch into training."""
        try:
            target = self.fields.get_target(batch)
        except Exception:  # no target where `target_key` looks: nothing dense to say about
            return
        dense = isinstance(target, Tensor) and target.ndim in (3, 4) and target.shape[0] == x.shape[0]
        if dense and tuple(target.shape[-2:]) == tuple(x.shape[-2:]):
            self.warn(
                f"the training targets {tuple(target.shape)} look like masks of the images' size, made by your "
                "pipeline; validation='train_size' brings validation images to the training size but leaves their "
                "targets at full size. Pass `resize_targets=True` to resize them with the images (nearest), or "
                "validation='full' (with boxes, use 'full': their coordinates are not rescaled)."
            )

    def transform_validation_batch(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any) -> Any:
        """With the ``"train_size"`` remedy: bring validation batches of ``fit`` to the current training scale."""
        if self.val_remedy != "train_size" or self._plan is None or self._plan.is_full:
            return batch
        x = self.fields.get_input(batch)
        check_image_batch(x, "ProgressiveResizing(validation='train_size')")
        full = (int(x.shape[-2]), int(x.shape[-1]))
        size = self._plan.size_for(full)
        if self._val_size is None:
            self._val_size = size
        elif self._val_size != size:  # validation loaders of other image sizes: no single size to log
            self._val_size = _SEVERAL
        if size == full:
            return batch
        self._val_resized = True  # the sizes are logged only for a validation that ran below full size
        target = self.fields.get_target(batch) if self.resize_targets else None
        if self.mode == "crop" and size[0] <= full[0] and size[1] <= full[1]:
            tops = torch.full((x.shape[0],), (full[0] - size[0]) // 2)
            lefts = torch.full((x.shape[0],), (full[1] - size[1]) // 2)
            new_x = crop_at(x, size, tops, lefts)
            new_target = crop_at(target, size, tops, lefts) if target is not None else None
        elif self.interpolation != "nearest" and not x.is_floating_point() and x.dtype != torch.bool:
            # integer images (the pipeline mode resizes uint8 in its workers, as torchvision does): interpolated in
            # float, then rounded back to their own dtype
            info = torch.iinfo(x.dtype)
            resized = resize_images(x.float(), size, self.interpolation, self.antialias)
            new_x = resized.round_().clamp_(info.min, info.max).to(x.dtype)
            new_target = resize_masks(target, size, self.interpolation) if target is not None else None
        else:
            new_x = resize_images(x, size, self.interpolation, self.antialias)
            new_target = resize_masks(target, size, self.interpolation) if target is not None else None
        return self.fields.replace(batch, input=new_x, target=new_target)

    # ------------------------------------------------------------------ in the data pipeline
    def wrap_train_data(
        self, datamodule: SpeedupDataModule, dataset: Dataset, sampler: Sampler
    ) -> tuple[Dataset, Sampler]:
        """``SpeedupDataModule`` hook: in pipeline mode, attach each batch's plan to its sample indices."""
        if self.mode != "pipeline":
            return dataset, sampler
        trainer = datamodule.trainer
        if trainer is not None and trainer.world_size > 1 and not isinstance(sampler, DistributedSampler):
            raise TypeError(
                f"ProgressiveResizing(mode='pipeline') under DDP needs a DistributedSampler to wrap, got "
                f"{type(sampler).__name__}: SpeedupDataModule's samplers are; custom ones must subclass it."
            )
        if datamodule.batch_size is None:
            raise ValueError("ProgressiveResizing(mode='pipeline') needs the SpeedupDataModule's `batch_size`.")
        size, batch_size = len(sampler), datamodule.batch_size  # type: ignore[arg-type]
        loader_batches = size // batch_size if datamodule.drop_last else math.ceil(size / batch_size)
        plan_for_batch = functools.partial(self._plan_for_batch, trainer, loader_batches)
        # the epoch the sampler was built for: it may follow set_epoch without exposing `epoch`
        epoch = datamodule._sampler_context()["epoch"]
        wrapped = ResolutionSampler(sampler, batch_size, plan_for_batch, epoch=epoch)
        self._wrapped_loader = True
        return ResolutionDataset(dataset), wrapped

    def _steps(self, trainer: pl.Trainer, loader_batches: int, start: tuple[int, int] = (0, 0)) -> tuple[int, float]:
        """(training batches per epoch, total steps), as the on-device schedule counts them (the total with each
        epoch's own accumulation, as :func:`~lightning_speedups.base.run_length`; from ``start``, ``(epoch, steps
        taken)``, where the fit goes on from steps taken).

        Needed before Lightning knows them: with workers, the first batches are requested while the training
        loader is being set up. ``on_train_start`` checks the result against the trainer's own numbers.
        """
        limit = trainer.limit_train_batches
        batches = min(loader_batches, int(limit)) if isinstance(limit, int) else int(loader_batches * limit)
        max_epochs = training_epochs(trainer)
        max_epochs = max_epochs if max_epochs is not None else -1
        first, taken = start
        total: float = (
            math.inf
            if max_epochs == -1
            else float(taken + epoch_steps(trainer, batches, range(first, max(max_epochs, 1))))
        )
        return batches, cap_by_max_steps(trainer, total)

    def _plan_for_batch(self, trainer: pl.Trainer, loader_batches: int, epoch: int, batch: int) -> ResizePlan:
        if not any(cb is self for cb in trainer.callbacks):
            # a BatchSizeFinder or LR-finder trial (Lightning swaps the callbacks out for it): full size, as the
            # seam leaves the trial's batches on the device
            return ResizePlan(scale=1.0, size_increment=self.size_increment)
        if self.ramp is not None:
            return self.plan_at(0.0, epoch)
        # per batch, so the epoch counts are worked out once per loader length and epoch, and per run length: a
        # tuner trial with a loader built before it (`estimated_stepping_batches` in `configure_optimizers`) runs
        # with its own max_steps and limits, which must not stay cached for the real run.
        # A fit that goes on from steps taken (a later `fit`, a resume at an epoch's end) counts, as the on-device
        # schedule, those steps, then this loader's length (earlier epochs may have run fewer batches, or had
        # another length): read at the fit's first plan, its first epoch's start (later plans are drawn while
        # training runs), with the epoch that plan is for (Lightning's current epoch may be one cut by max_steps)
        if "_fit_start" not in self.__dict__:
            start = continued_from(trainer)
            self._fit_start = None if start is None else (epoch, start[1])
        start = self._fit_start if self._fit_start is not None and self._fit_start[0] <= epoch else (0, 0)
        key = (loader_batches, epoch, trainer.max_steps, trainer.max_epochs, trainer.limit_train_batches, start)
        counts = self._epoch_counts.get(key)
        if counts is None:
            batches, total = self._steps(trainer, loader_batches, start)
            before = start[1] + epoch_steps(trainer, batches, range(start[0], epoch))
            counts = self._epoch_counts[key] = (before, total, batches)
        before, total, batches = counts
        state = self.__dict__  # the callback's schedule, unless a reload run's workers draw before the hooks set it
        if trainer.reload_dataloaders_every_n_epochs:
            state = self._schedule_at(trainer, epoch, batches) or state
        anchored, (step0, p0), since = state["_total_steps"], state["_anchor"], state.get("_anchor_epoch")
        if (step0, p0) != (0, 0.0) and since is not None and epoch >= since and anchored is not None:
            # a loader reloaded with another length (set at this epoch's start, before its sampler runs): as the
            # on-device schedule, the progress reached stands and the steps left spread the rest
            step = step0 + epoch_steps(trainer, batches, range(since, epoch)) + batch // accumulation(trainer, epoch)
            return self.plan_at(min(1.0, max(p0, self._anchored_progress(step, anchored, (step0, p0)))), epoch)
        step = before + batch // accumulation(trainer, epoch)
        progress = 1.0 if total <= 0 else min(1.0, step / total)
        return self.plan_at(progress, epoch)

    # ------------------------------------------------------------------ Lightning hooks
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        super().setup(trainer, pl_module, stage)
        if stage != "fit":
            return
        self._cache.clear()
        self._epoch_counts.clear()
        self.__dict__.pop("_fit_start", None)  # where this fit goes on from: read at its first plan
        self._checked = False
        self._trained_bn, self._bn_modes_stale, self._warned_unreached = [], True, False
        self._settled = False
        # training batches at full size since the last smaller one; none smaller yet: "forever" (nothing to forget)
        self._full_batches = math.inf
        # a resumed fit gets its own back (`load_state_dict`); the next fit's data may have another full size
        self._run, self._size, self._full = math.inf, None, None
        self._wrapped_loader = False
        if self.mode == "crop":
            self._check_order(trainer)
        if self.val_remedy == "train_size":
            rank_zero_info(
                "ProgressiveResizing: validation during fit runs at the current training scale (logged as "
                "progressive_resizing/val_height and val_width) until the schedule reaches full size."
            )

    def _check_order(self, trainer: pl.Trainer) -> None:
        # Batch transforms run in callback order. A CutMix before a random crop weights its targets by the pasted
        # area at full size, and the crop then cuts part of the box away: the targets no longer match the pixels.
        # (MixUp commutes with resizing and cropping; a crop before CutMix is exact.)
        from lightning_speedups.callbacks.cutmix import CutMix

        for cb in trainer.callbacks:
            if cb is self:
                return
            if isinstance(cb, CutMix):
                raise ValueError(
                    "ProgressiveResizing(mode='crop') runs after CutMix here, so the crop would cut part of CutMix's "
                    "pasted box away and its targets (weighted by the box's area at full size) would not match the "
                    "pixels. Put ProgressiveResizing before CutMix in `callbacks`, or use mode='resize'."
                )

    def _check_monitors(self, trainer: pl.Trainer) -> None:
        """Checkpoint selection, early stopping or a plateau scheduler on metrics that the ramp's validation
        measures otherwise than the saved model would score at full size: say so, with the setting that fits."""
        if self.val_remedy == "full" or (self.ramp is None and self.initial_scale >= 1.0):
            return
        if self.val_remedy == "recalibrate" and not self._recalibrates:
            return  # full size with the model's own statistics (no BatchNorm, or a WeightAveraging's): as saved
        if not _validates(trainer):
            return  # no validation: nothing it measures is monitored

        def validation_metric(key: Any) -> bool:  # a training metric ("train_loss") is measured as trained
            return isinstance(key, str) and "train" not in key.lower()

        monitors = [
            f"{type(cb).__name__}(monitor={cb.monitor!r})"
            for cb in trainer.callbacks
            if isinstance(cb, ModelCheckpoint | EarlyStopping) and validation_metric(getattr(cb, "monitor", None))
        ]
        monitors += [
            f"a scheduler (monitor={c.monitor!r})" for c in trainer.lr_scheduler_configs if validation_metric(c.monitor)
        ]
        if not monitors:
            return
        how = (
            "at the training size"
            if self.val_remedy == "train_size"
            else "with BatchNorm statistics re-estimated at full size (a checkpoint keeps the training ones)"
        )
        self.warn(
            f"until the schedule reaches full size, validation runs {how}, and {', '.join(monitors)} compares those "
            "metrics across the ramp: an early checkpoint can score best yet be poor at full size, or training can "
            "stop early. For checkpoint selection and early stopping, validation='full' gives the metrics of the "
            "model as it is saved (in a preset: `presets.get(name, ProgressiveResizing={'validation': 'full'})`)."
        )

    def _recalibration_wanted(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> bool:
        if self.val_remedy != "recalibrate" or not batchnorm_layers(pl_module, lazy=True):  # after `configure_model`
            return False
        if not _validates(trainer):
            return False  # nothing to correct: no calibration forward to check, no batches to keep
        averaging = [cb for cb in trainer.callbacks if isinstance(cb, WeightAveraging)]
        if averaging:
            # it swaps its averaged parameters *and buffers* in for validation: the statistics recalibrated here
            # would sit unused in the model it swapped out
            self.warn(
                f"{type(averaging[0]).__name__} validates its averaged weights with their own BatchNorm statistics, "
                "which validation='recalibrate' does not reach: validation runs on statistics of the training size. "
                "Pass validation='train_size' (validate at the training size) or 'full'."
            )
            return False
        return True

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        super().on_train_start(trainer, pl_module)
        self._reduced_step_done = False
        self._recalibrates = self._recalibration_wanted(trainer, pl_module)
        if self.mode == "pipeline":  # the size reaches one SpeedupDataModule loader's workers, whatever the getter
            self.check_single_loader(trainer, "the training loader of a SpeedupDataModule", getter_helps=False)
        elif self.fields.getter is None:
            self.check_single_loader(trainer, "training batches with one image input")
        self._check_monitors(trainer)
        if self.mode != "pipeline":
            return
        loader = trainer.train_dataloader
        sampler = getattr(loader, "sampler", None)
        if not self._wrapped_loader or not isinstance(sampler, ResolutionSampler):
            if self._wrapped_loader and trainer.overfit_batches > 0:
                cause = (
                    f"Lightning replaced its sampler with a {type(sampler).__name__} under "
                    f"`Trainer(overfit_batches={trainer.overfit_batches})`. Drop `overfit_batches`, or use "
                    "mode='resize' for overfitting runs."
                )
            elif isinstance(loader, ResumableDataLoader) and _built_without_trainer(loader, trainer):
                cause = (
                    "this loader was built by `SpeedupDataModule.train_dataloader()` while the datamodule was not this "
                    "trainer's (called by hand and passed as `train_dataloaders=`?), so the callback could not attach "
                    "the sizes. Pass the datamodule instead: `trainer.fit(model, datamodule=dm)`; or use "
                    "mode='resize'."
                )
            else:
                cause = (
                    f"this loader (sampler {type(sampler).__name__}) was not built by "
                    "`SpeedupDataModule.train_dataloader()`: a plain DataLoader, or a `train_dataloader` override "
                    "that builds its own. Use a SpeedupDataModule and keep its `train_dataloader` (an override "
                    "should return `super().train_dataloader()`), or use mode='resize'."
                )
            raise RuntimeError(
                "ProgressiveResizing(mode='pipeline') needs the training loader of a "
                "`lightning_speedups.SpeedupDataModule`, as its `train_dataloader` builds it (that lets the "
                f"callback attach the size of each batch), with its sampler in place; {cause}"
            )
        if self.ramp is None:
            batches, total = self._steps(trainer, sampler.num_batches(bool(loader.drop_last)))
            # what the on-device progress spreads the run over: batches against max_steps / optimizers under
            # manual optimization with several optimizers (Lightning counts each one's steps), else run_length
            expected = (
                trainer.num_training_batches,
                cap_by_max_steps(trainer, run_length(trainer, with_max_steps=False)),
            )
            if (batches, total) != expected:
                raise RuntimeError(
                    f"ProgressiveResizing(mode='pipeline') predicted {batches} batches per epoch and {total:g} steps, "
                    f"but the trainer counts {expected[0]} and {expected[1]:g} (e.g. under `overfit_batches`). Use "
                    "mode='resize' for this run."
                )

    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        super().on_train_epoch_start(trainer, pl_module)
        self._bn_modes_stale = True  # a finetuning schedule may have frozen or unfrozen layers

    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._val_size, self._val_resized = None, False
        if not self._recalibrates:
            return
        if trainer.sanity_checking or trainer.state.fn != "fit" or self._plan is None:
            return
        if not self._trained_bn:
            return  # every BatchNorm layer is frozen: their statistics do not depend on the training size
        preloaded = None
        if self.mode == "pipeline" and self._full is None and self._plan.resolution is not None:
            preloaded = self._calibration_inputs(trainer, pl_module)  # full size: what `_full_batches` needs
            self._learn_full_size(preloaded)
        several = trainer.world_size > 1
        # Every rank must take the same decisions: recalibrating pools statistics over the ranks (a collective).
        # This rank's last batches may have trained at full size while another's did not (images of several
        # sizes). Not once the running statistics have forgotten the smaller sizes: after `_horizon` full-size
        # batches (the statistics right after the ramp are still mostly of the smaller ones).
        wanted = self._full_batches < self._horizon()
        if several:
            wanted = trainer.strategy.reduce_boolean_decision(wanted, all=False)
        if not wanted:
            return
        inputs = preloaded if preloaded is not None else self._calibration_inputs(trainer, pl_module)
        have = bool(inputs)
        if several:
            have = trainer.strategy.reduce_boolean_decision(have, all=True)
        if not have:
            if not self._warned_no_calibration:
                self._warned_no_calibration = True
                self.warn("no training batch to recalibrate BatchNorm with yet; this validation is uncorrected.")
            return
        self._snapshot = snapshot_batchnorm(pl_module)
        # While validation runs on the recalibrated statistics, the model's state dict (a checkpoint, weights-only
        # ones included, or an export) still holds the training statistics: they are the model's own.
        # (A module-level class: a model pickled meanwhile pickles its hooks too.)
        self._state_hook = pl_module.register_state_dict_post_hook(_TrainingStatistics(self._snapshot))
        forward = self._forward
        unreached: list[nn.Module] = []
        try:
            # a forward that draws random numbers must not move the run's generators: training stays as without us
            with trainer.precision_plugin.forward_context(), global_rng_kept():
                recalibrate_batchnorm(pl_module, inputs, forward, layers=self._trained_bn, unreached=unreached)
        except Exception as err:
            self._restore()
            raise RuntimeError(
                f"ProgressiveResizing could not run the model on full-size images to recalibrate BatchNorm "
                f"({type(err).__name__}: {err}). It calls `pl_module(images)`: pass "
                "`calibration_forward=lambda module, images: ...`, or validation='train_size' or 'full'."
            ) from err
        missed = {id(bn) for bn in unreached}
        if several:
            # every trained layer, on every rank, so each rank makes the same collectives: a layer this rank's
            # forward missed keeps its training statistics, which DDP keeps equal on all ranks (a no-op mean)
            mean = lambda t: trainer.strategy.reduce(t, reduce_op="mean")  # noqa: E731
            pool_batchnorm_statistics(pl_module, mean, self._trained_bn)
        if missed and not self._warned_unreached:
            self._warned_unreached = True
            names = [name for name, m in pl_module.named_modules() if id(m) in missed]
            self.warn(
                f"`pl_module(images)` never runs the BatchNorm layers {names}, so they are validated with their "
                "training-size statistics. Pass `calibration_forward=lambda module, images: ...` that runs them "
                "(e.g. the head applied in `training_step`).",
                every_rank=True,  # what this rank's forward reached
            )
        self.recalibrations += 1

    def _horizon(self) -> float:
        """Full-size training batches after which BatchNorm's running statistics keep under 5% of what the
        smaller sizes put in them (the least ``n`` with ``(1 - momentum) ** n < 0.05``: 29 at PyTorch's 0.1),
        for the slowest trained layer; never, for a cumulative average (``momentum=None``)."""
        momenta = [bn.momentum for bn in self._trained_bn]
        if not momenta:
            return 0.0
        if any(m is None or m <= 0 for m in momenta):
            return math.inf
        slowest = min(momenta)
        return 0.0 if slowest >= 1 else math.ceil(math.log(0.05) / math.log(1.0 - slowest))

    def _check_calibration_forward(self, trainer: pl.Trainer, pl_module: pl.LightningModule, x: Tensor) -> None:
        """Before the first step, run the calibration forward once on two images (eval mode, no gradient), so
        that a model it cannot call fails now, not at the first validation after an epoch of training. In the
        precision plugin's context, as the recalibration itself runs (``64-true`` sets the default dtype there)."""
        try:
            with train_modes_kept(pl_module), torch.no_grad(), global_rng_kept():  # frozen submodules stay frozen
                pl_module.eval()  # BatchNorm statistics untouched
                with trainer.precision_plugin.forward_context():
                    self._forward(pl_module, x[:2])
        except Exception as err:
            raise RuntimeError(
                f"ProgressiveResizing(validation='recalibrate') re-estimates BatchNorm before each validation by "
                f"calling `pl_module(images)`, which fails on this model ({type(err).__name__}: {err}). Pass "
                "`calibration_forward=lambda module, images: ...`, or validation='train_size' or 'full'."
            ) from err

    def _forward(self, module: Any, images: Tensor) -> Any:
        if self.calibration_forward is not None:
            return self.calibration_forward(module, images)
        return module(images)

    def _learn_full_size(self, full_batches: list[Tensor]) -> None:
        """Pipeline mode with an epoch ramp: the size of the batches the pipeline makes without a resolution, so
        that batches the ramp brought to that size count as full size. Not if those batches differ in size
        (a collate that pads to the batch's largest image): every validation recalibrates then, as on the device."""
        sizes = {(int(x.shape[-2]), int(x.shape[-1])) for x in full_batches}
        if len(sizes) != 1:
            return
        (self._full,) = sizes
        if self._size == self._full:
            self._full_batches = self._run  # the batches in a row at this size, up to this validation

    def _calibration_inputs(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> list[Tensor]:
        if self.mode != "pipeline":
            return list(self._cache)
        loader = trainer.train_dataloader
        dataset = loader.dataset
        base = dataset.dataset if isinstance(dataset, ResolutionDataset) else dataset
        n = len(base)
        rng = self.rng(trainer)
        inputs = []
        # The dataset's random augmentations draw from the main process's global generators here; leave them
        # as they were, so that recalibrating does not change the rest of the run's randomness.
        with global_rng_kept():
            for _ in range(self.calibration_batches):
                indices = rng.choice(n, size=min(n, loader.batch_size or 1), replace=False)
                batch = loader.collate_fn([base[int(i)] for i in indices])  # plain indices: full size
                batch = trainer.precision_plugin.convert_input(batch)
                batch = pl_module._on_before_batch_transfer(batch, dataloader_idx=0)
                batch = trainer.strategy.batch_to_device(batch, dataloader_idx=0)
                inputs.append(self.fields.get_input(batch))
        return inputs

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._restore()
        if self._val_size == _SEVERAL:
            if not self._warned_several_val_sizes and not trainer.sanity_checking:
                self._warned_several_val_sizes = True
                self.warn(
                    "validation batches came at several image sizes (validation loaders of other sizes), each "
                    "brought to the training scale: val_height and val_width, which would name one size, are not "
                    "logged."
                )
        elif (
            self._val_size is not None
            and self._val_resized
            and self.log_knobs
            and trainer.loggers
            and not trainer.sanity_checking
        ):
            # with the metrics just logged, which were taken at this size; not with the training knobs, where it
            # would be the last validation's size at every step until the next
            height, width = self._val_size
            self.log_now(trainer, {"val_height": float(height), "val_width": float(width)})
        self._val_size, self._val_resized = None, False

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if not self._reduced_step_done and self._resized():
            self._reduced_step_done = True
        super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)

    def _resized(self) -> bool:
        """Whether the last training batch was at a reduced size (in pipeline mode: planned so by the schedule)."""
        if self.mode == "pipeline":
            planned = self._plan is not None and not self._plan.is_full
            return self._size is not None and planned and self._size != self._full
        return self._size is not None and self._full is not None and self._size != self._full

    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException) -> None:
        self._release()  # a validation that raised must not leave the full-size statistics in the model
        if (
            isinstance(exception, RuntimeError)
            and self._resized()
            and not self._reduced_step_done
            and trainer.training
            and _SHAPE_ERROR.search(str(exception))
        ):
            # the model's own error (a shape mismatch in its forward) says nothing of the resizing behind it
            height, width = self._size  # type: ignore[misc]
            if self._full is not None and self.mode != "pipeline":
                made = f"had resized this step's images to {height}x{width} (from {self._full[0]}x{self._full[1]})"
            else:  # the data pipeline made them: the full size never reached the device
                made = f"had its data pipeline make this step's images {height}x{width} (a reduced size)"
            note = (
                f"ProgressiveResizing {made}, and no step at a reduced size had gone through. If the model has a "
                "fixed input size (a flatten before a Linear layer, position embeddings without interpolation), it "
                "cannot train on them: make it size-agnostic (global average pooling), or leave "
                "ProgressiveResizing out."
            )
            if hasattr(exception, "add_note"):  # Python 3.11+
                exception.add_note(note)
        super().on_exception(trainer, pl_module, exception)

    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self._release()
        super().teardown(trainer, pl_module, stage)

    def _release(self) -> None:
        """The training statistics back in the model, and no batch references kept."""
        self._restore()
        self._cache.clear()

    def _restore(self) -> None:
        hook = self.__dict__.get("_state_hook")
        if hook is not None:
            hook.remove()
            self._state_hook = None
        if self._snapshot is not None:
            self._snapshot.restore()
            self._snapshot = None

    # ------------------------------------------------------------------ knobs and state
    def knobs(self) -> dict[str, float]:
        if self._plan is None:
            return {}
        knobs: dict[str, float] = {}
        if self.ramp is not None:
            knobs["resolution"] = float(self._plan.resolution or 0)
        else:
            knobs["scale"] = self._plan.scale
        if self._size is not None:
            knobs["height"], knobs["width"] = float(self._size[0]), float(self._size[1])
        return knobs

    def state_dict(self) -> dict[str, Any]:
        return {
            **super().state_dict(),
            "plan": asdict(self._plan) if self._plan is not None else None,
            "size": list(self._size) if self._size is not None else None,
            "full": list(self._full) if self._full is not None else None,
            # a resumed run recalibrates after the ramp where the uninterrupted one would
            "full_batches": self._full_batches,
            "run": self._run,
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        super().load_state_dict(state_dict)
        plan = state_dict.get("plan")
        self._plan = ResizePlan(**plan) if plan is not None else None
        self._size = tuple(state_dict["size"]) if state_dict.get("size") else None  # type: ignore[assignment]
        self._full = tuple(state_dict["full"]) if state_dict.get("full") else None  # type: ignore[assignment]
        self._full_batches = state_dict.get("full_batches", math.inf)
        # a checkpoint from before `run` was saved: count from the resume (at worst a recalibration too many)
        self._run = state_dict.get("run", 0 if self._size is not None else math.inf)


def _built_without_trainer(loader: ResumableDataLoader, trainer: pl.Trainer) -> bool:
    """A loader of a datamodule that is not this trainer's (none, or an earlier fit's): ``dm.train_dataloader()``
    called by hand and passed as ``train_dataloaders=``."""
    datamodule = getattr(loader, "speedups_datamodule", None)
    return datamodule is not None and getattr(datamodule, "trainer", None) is not trainer
