"""The one place where our callbacks replace a training batch.

Lightning gives callbacks no hook that can *return* a new batch: ``on_train_batch_start`` discards return
values, and patching the model's ``on_after_batch_transfer`` is silently bypassed when a DataModule defines
that hook. Every loop, however, moves its batch through ``trainer.strategy.batch_to_device``, which runs the
user's ``transfer_batch_to_device`` and ``on_after_batch_transfer`` (from the model or the DataModule,
whichever Lightning selected). We wrap that method on the strategy *instance*: the wrapper calls the
original and then, for training batches only (not validation, test, predict or sanity-check ones), hands
the on-device batch to each registered callback in ``trainer.callbacks`` order. A registered callback that
also defines ``transform_validation_batch(trainer, pl_module, batch)`` is handed the validation batches of
``fit`` the same way (sanity-check batches excepted), e.g. ``ProgressiveResizing(validation="train_size")``.

Training batches that must reach ``training_step`` as they come (StochasticWeightAveraging's BatchNorm epoch,
the trial steps of Lightning's batch size and learning-rate finders) skip ``transform_batch``; a registered
callback that defines ``passthrough_batch(trainer, pl_module, batch)`` is handed them instead, to add what
``training_step`` reads beside the technique's output (the original labels under ``hard_target_key``). One that
defines ``observe_training_batch(trainer, pl_module, batch)`` sees each training batch as validation would see it:
before the training transforms, through the callbacks' ``transform_validation_batch`` (``ProgressiveResizing``
keeps its images to re-estimate BatchNorm statistics: data not mixed, normalised as validation's).

The wrapper is installed once per strategy however many callbacks use it, and removed when the last one
tears down, leaving the strategy exactly as it was.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
from lightning.pytorch.callbacks import StochasticWeightAveraging
from lightning.pytorch.trainer.states import RunningStage, TrainerFn

if TYPE_CHECKING:
    import lightning.pytorch as pl

_SEAM_ATTR = "_lightning_speedups_seam"


class BatchTransformSeam:
    """Dispatcher installed as ``strategy.batch_to_device``; see the module docstring."""

    def __init__(self, trainer: pl.Trainer) -> None:
        self.trainer = trainer
        self.strategy = trainer.strategy
        # An instance attribute set by someone else before us must come back at removal.
        self._previous_instance_attr = self.strategy.__dict__.get("batch_to_device")
        self._original: Callable[..., Any] = self.strategy.batch_to_device
        self.transforms: list[Any] = []
        # `transforms` less those not in `trainer.callbacks` right now: BatchSizeFinder and the LR finder run
        # their trial steps with the callbacks swapped out (a new list), and a trial must see the batches as
        # they come (a batch size found on resized images would not fit at full size). Worked out again
        # whenever `trainer.callbacks` is another list object: one identity check per batch.
        self._active: list[Any] = []
        self._active_for: Any = None
        # `passthrough_batch` of the callbacks left out of `trainer.callbacks` right now (a finder's trial)
        self._idle: list[Callable[..., Any]] = []
        # `observe_training_batch` of the active callbacks: handed each training batch before any transform
        self._observers: list[Callable[..., Any]] = []
        self._validation_hooks: list[Callable[..., Any]] = []
        self._transforms: list[Callable[..., Any]] = []  # `transform_batch` of `_active`
        self._passthrough: list[Callable[..., Any]] = []  # `passthrough_batch` of `_active`
        self._weight_averaging = False

    def __call__(self, batch: Any, device: torch.device | None = None, dataloader_idx: int = 0) -> Any:
        batch = self._original(batch, device, dataloader_idx)
        if batch is None:  # a batch the user's `on_after_batch_transfer` dropped: Lightning skips its step
            return batch
        trainer = self.trainer
        # One read of the stage rather than `trainer.training and not trainer.sanity_checking` (each a chain of
        # properties and a string-enum comparison, paid on every batch): sanity checking is a stage of its own.
        state = trainer.state
        stage = state.stage
        if stage is not RunningStage.TRAINING and stage is not RunningStage.VALIDATING:
            return batch
        if state.fn is not TrainerFn.FITTING:  # `trainer.validate()`, with a seam left by a teardown without super()
            return batch
        if trainer.callbacks is not self._active_for:
            self._refresh_active()
        pl_module = trainer.lightning_module
        if stage is not RunningStage.TRAINING:
            # Optional, for callbacks that change what validation during fit sees (e.g. its image size).
            return _chain(self._validation_hooks, trainer, pl_module, batch)
        if self._idle:  # before any transform: they keep what the batch holds as it came
            batch = _chain(self._idle, trainer, pl_module, batch)
        if self._weight_averaging and updating_batchnorm_only(trainer):
            # StochasticWeightAveraging's last epoch: forward passes that re-estimate the BatchNorm statistics
            # of the averaged weights, on the data as validation will see it (not mixed, not resized)
            return _chain(self._passthrough, trainer, pl_module, batch)
        if self._observers:  # the batch as validation would see it: through the validation transforms
            view = _chain(self._validation_hooks, trainer, pl_module, batch)
            for observe in self._observers:
                observe(trainer, pl_module, view)
        return _chain(self._transforms, trainer, pl_module, batch)

    def _order(self) -> None:
        position = {id(cb): i for i, cb in enumerate(self.trainer.callbacks)}
        self.transforms.sort(key=lambda cb: position.get(id(cb), len(position)))
        self._active_for = None  # worked out again at the next batch

    def _refresh_active(self) -> None:
        callbacks = self.trainer.callbacks
        present = {id(cb) for cb in callbacks}
        self._active = [cb for cb in self.transforms if id(cb) in present]
        absent = [cb for cb in self.transforms if id(cb) not in present]
        self._transforms = _hooks(self._active, "transform_batch")
        self._idle = _hooks(absent, "passthrough_batch")
        self._passthrough = _hooks(self._active, "passthrough_batch")
        self._observers = _hooks(self._active, "observe_training_batch")
        self._validation_hooks = _hooks(self._active, "transform_validation_batch")
        self._active_for = callbacks
        self._weight_averaging = has_weight_averaging(self.trainer)


def _hooks(callbacks: list[Any], name: str) -> list[Callable[..., Any]]:
    """The callbacks' hooks called ``name``, bound, in callback order (a callback without one, or with ``None``
    there, has none)."""
    hooks = (getattr(cb, name, None) for cb in callbacks)
    return [hook for hook in hooks if callable(hook)]


def _chain(hooks: list[Callable[..., Any]], trainer: Any, pl_module: Any, batch: Any) -> Any:
    """``batch`` through each hook in turn; a hook that returns None is an error that names it."""
    for hook in hooks:
        try:
            batch = hook(trainer, pl_module, batch)
        except Exception as err:
            # several callbacks transform each batch: say which one raised (a note keeps the error's type)
            owner = getattr(hook, "__self__", None)
            if owner is not None and hasattr(err, "add_note"):
                err.add_note(f"Raised in the callback {type(owner).__name__}.{getattr(hook, '__name__', 'hook')}.")
            raise
        if batch is None:
            # Lightning takes a None batch for one to skip: every step would be skipped without a word
            owner = getattr(hook, "__self__", hook)
            raise TypeError(
                f"{type(owner).__name__}.{getattr(hook, '__name__', 'hook')} returned None; it must return the batch "
                "to use (the new one, or the batch it was given, unchanged). A missing `return`?"
            )
    return batch


def updating_batchnorm_only(trainer: pl.Trainer) -> bool:
    """Whether the training loop skips the backward pass: ``StochasticWeightAveraging``'s last epoch, whose
    forward passes only re-estimate BatchNorm statistics. Its batches should be the data as they come, not
    mixed or resized."""
    return bool(getattr(trainer.fit_loop, "_skip_backward", False))


def has_weight_averaging(trainer: pl.Trainer) -> bool:
    """Whether a ``StochasticWeightAveraging`` callback is in the trainer: only then can a training epoch skip
    the backward pass (:func:`updating_batchnorm_only`, a chain of Lightning properties, not read otherwise)."""
    return any(isinstance(cb, StochasticWeightAveraging) for cb in trainer.callbacks)


def install(trainer: pl.Trainer, callback: Any) -> BatchTransformSeam:
    """Register ``callback.transform_batch`` for training batches of ``trainer``; idempotent."""
    strategy = trainer.strategy
    seam: BatchTransformSeam | None = getattr(strategy, _SEAM_ATTR, None)
    if seam is None or seam.trainer is not trainer:
        seam = BatchTransformSeam(trainer)
        setattr(strategy, _SEAM_ATTR, seam)
        strategy.batch_to_device = seam  # type: ignore[method-assign]
    if not any(cb is callback for cb in seam.transforms):
        seam.transforms.append(callback)
        seam._order()
    return seam


def uninstall(trainer: pl.Trainer, callback: Any) -> None:
    """Unregister ``callback``; the last one out restores the strategy's own ``batch_to_device``."""
    strategy = trainer.strategy
    seam: BatchTransformSeam | None = getattr(strategy, _SEAM_ATTR, None)
    if seam is None:
        return
    seam.transforms = [cb for cb in seam.transforms if cb is not callback]
    seam._active_for = None
    if seam.transforms:
        return
    if strategy.__dict__.get("batch_to_device") is seam:
        if seam._previous_instance_attr is None:
            del strategy.__dict__["batch_to_device"]
        else:
            strategy.batch_to_device = seam._previous_instance_attr  # type: ignore[method-assign]
    delattr(strategy, _SEAM_ATTR)


def active_transforms(trainer: pl.Trainer) -> list[Any]:
    """The callbacks whose ``transform_batch`` currently runs on this trainer's training batches."""
    seam = getattr(trainer.strategy, _SEAM_ATTR, None)
    return list(seam.transforms) if seam is not None else []
