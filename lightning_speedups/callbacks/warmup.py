"""LinearScalingWarmup: scale the learning rate with the global batch size, reached by a gradual warmup."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Literal, NamedTuple

import torch
from lightning.pytorch.callbacks import BatchSizeFinder, Callback, GradientAccumulationScheduler, LearningRateFinder
from lightning.pytorch.utilities import rank_zero_info
from lightning.pytorch.utilities.parsing import lightning_getattr, lightning_hasattr
from torch.optim import Optimizer
from torch.utils.data import DataLoader

from lightning_speedups import _checks
from lightning_speedups.base import (
    SpeedupCallback,
    accumulation,
    restores_state_outside_fit,
    run_length,
    steps_per_batch,
)
from lightning_speedups.functional.warmup import (
    SCALING_RULES,
    WARMUP_STARTS,
    WARMUP_UNITS,
    ScalingRule,
    WarmupStart,
    WarmupUnit,
    batch_scale,
    global_batch_size,
    steps_per_epoch,
    warmup_factor,
    warmup_length,
)
from lightning_speedups.seam import has_weight_averaging, updating_batchnorm_only

if TYPE_CHECKING:
    import lightning.pytorch as pl
    from torch.utils.hooks import RemovableHandle

GroupRef = int | tuple[int, int]


class _Plan(NamedTuple):
    key: tuple[Any, ...]
    global_batch: int
    scale: float
    warmup_steps: int


def _add_share(done: float, share: float) -> float:
    """``done + share``, capped at 1; within 1e-9 of 1 counts as 1 (float sums of 1/n land a hair below)."""
    done += share
    return 1.0 if done > 1.0 - 1e-9 else done


class LinearScalingWarmup(SpeedupCallback):
    """Multiply the learning rate by ``global batch / reference_batch_size``, reached by a linear warmup.

    The rule of Goyal et al. (2017): a learning rate tuned for ``reference_batch_size`` samples per update is
    multiplied by ``k = per-device batch x accumulate_grad_batches x world size / reference_batch_size``, and
    the first updates ramp linearly from the unscaled learning rate to ``k`` times it. The factor multiplies
    whatever your scheduler gives (cosine, OneCycle, step, plateau, ...), on every step.

    How: the factor is applied only *during* each real optimizer update, by torch step hooks, and the
    scheduler's value is put back right after. So the scheduler, its ``state_dict`` and the learning rate
    saved in checkpoints are exactly what they would be without this callback, chainable schedulers do not
    compound the factor, and an update that the fp16 grad scaler skips neither sees nor advances the warmup.
    The warmup counts each optimizer's real updates and stores the count in checkpoints. A warmup in epochs
    advances each update by that update's share of it, ``1 / (warmup x updates per epoch at the time)``, so it
    still ends after ``warmup`` epochs when the updates per epoch change mid-warmup (a
    ``GradientAccumulationScheduler``, a reloaded loader with another batch size).

    The per-device batch size is read from the training ``DataLoader`` at the first update of every epoch
    (where Lightning changes loaders and accumulation), so a batch size chosen by Lightning's
    ``BatchSizeFinder`` (in either callback order), a reloaded loader, a ``GradientAccumulationScheduler`` and
    the DDP world size are all followed.

    When it helps: training with a larger global batch than the recipe was tuned for (more devices, more
    accumulation, the largest batch that fits) without re-tuning the learning rate; the warmup prevents the
    early divergence that a large learning rate causes (ResNet-50 at batch 8k: 23.74% top-1 error with warmup,
    24.84% without, 23.60% at batch 256). When it hurts: far beyond the batch sizes where the rule holds (8k
    for ImageNet ResNet-50), and linear scaling of Adam-family optimizers, where ``rule="sqrt"`` is safer.

    Args:
        reference_batch_size: the global batch size your learning rate was tuned for (256 in the ImageNet
            recipes), a positive int; or ``"initial"``: the batch your script asks for on one device (the
            ``batch_size`` of the module or datamodule when ``fit`` sets up, else the first training loader's,
            times ``accumulate_grad_batches``), so the learning rate is scaled only when more devices or a
            ``BatchSizeFinder`` grow the global batch. The presets use ``"initial"``; it is kept in checkpoints.
        warmup: warmup length in ``warmup_unit``; 0 applies the full factor from the first update.
        warmup_unit: ``"epochs"`` (the paper: 5), ``"steps"`` (optimizer updates) or ``"fraction"`` of the
            run's optimizer updates (in [0, 1]).
        rule: ``"linear"`` (``k``, the paper's rule for SGD) or ``"sqrt"`` (``sqrt(k)``, for Adam-family
            optimizers).
        warmup_from: ``"unscaled"`` ramps from the scheduler's learning rate (the paper) to ``k`` times it;
            ``"zero"`` ramps from zero (its first update already takes a small step).
        batch_size: the per-device batch size; ``None`` reads it from the training ``DataLoader`` at the
            first update of every epoch (needed when the loader has no ``batch_size``, e.g. a custom batch
            sampler, or when there are several training loaders).
        exclude_groups: param groups that keep the scheduler's learning rate: ``j`` for group ``j`` of every
            optimizer, ``(i, j)`` for group ``j`` of optimizer ``i``. A param group can also opt out itself
            with ``"lr_scaling": False`` (see :attr:`group_key`).
        log_knobs: log the scale, the factor and each group's effective learning rate (see the method card
            for the names).

    Example::

        >>> import lightning.pytorch as pl
        >>> from lightning_speedups import LinearScalingWarmup
        >>> # the lr in configure_optimizers was tuned for batch 256; the loader gives 128 per device
        >>> warmup = LinearScalingWarmup(reference_batch_size=256, warmup=5, warmup_unit="epochs")
        >>> trainer = pl.Trainer(max_epochs=90, accumulate_grad_batches=2, callbacks=[warmup], logger=False)
        >>> # trainer.fit(model, datamodule): 128 x 2 x 1 device = 256 -> lr x 1; with devices=4 (DDP):
        >>> # 1024 -> lr ramps to x 4 over 5 epochs, times whatever the scheduler gives
    """

    log_name = "lr_warmup"
    #: param-group key: a group with ``{"lr_scaling": False}`` keeps its scheduled learning rate.
    group_key = "lr_scaling"

    def __init__(
        self,
        reference_batch_size: int | Literal["initial"] = 256,
        warmup: float = 5,
        warmup_unit: WarmupUnit = "epochs",
        *,
        rule: ScalingRule = "linear",
        warmup_from: WarmupStart = "unscaled",
        batch_size: int | None = None,
        exclude_groups: Sequence[GroupRef] = (),
        log_knobs: bool = True,
    ) -> None:
        super().__init__(log_knobs=log_knobs)
        self.reference_batch_size = _check_reference(reference_batch_size)
        self._initial_reference: int | None = None
        self.warmup_unit = _choice("warmup_unit", warmup_unit, WARMUP_UNITS)
        self.warmup = _check_warmup(warmup, self.warmup_unit)
        self.rule = _choice("rule", rule, SCALING_RULES, hint="Use 'sqrt' for Adam-family optimizers.")
        self.warmup_from = _choice("warmup_from", warmup_from, WARMUP_STARTS)
        self.batch_size = _checks.optional_int("batch_size", batch_size, minimum=1)
        self.exclude_groups = _parse_groups(exclude_groups)
        self._trainer: pl.Trainer | None = None
        self._handles: list[RemovableHandle] = []
        self._optimizers: list[Optimizer] = []
        self._names: list[str] = []
        self._updates: list[int] | None = None
        # share of the warmup done, per optimizer (floats: this runs at every step; see `_add_share`)
        self._done: list[float] | None = None
        self._pending: dict[int, list[Any] | None] = {}
        self._pending_share: dict[int, float] = {}
        #: optimizers whose update about to run is inside the warmup (where a skipped one must not be counted)
        self._warming: set[int] = set()
        # the scaled learning rates set and their values then, to tell if they were changed since (another object,
        # or a tensor lr filled in place)
        self._written: dict[int, tuple[list[Any], list[Any]]] = {}
        self._skipped: set[int] = set()  # optimizers whose closure returned None (a skipped `training_step`)
        self._automatic = True
        self._weight_averaging = False
        self._plan: _Plan | None = None
        # the plan's inputs (loader, accumulation) change only between epochs: re-read at an epoch's first update
        self._plan_stale = True
        self._last_factor: float | None = None
        self._last_factors: dict[int, float] = {}  # per optimizer: with several, each is at its own point
        self._last_lrs: dict[int, list[Any]] = {}
        self._keep_reference = False  # keep `_initial_reference` for the next fit (after a batch-size search)
        self._carried_reference = False  # this fit's reference was kept from a batch-size search's fit

    # ------------------------------------------------------------------ public read-outs
    @property
    def scale(self) -> float | None:
        """The full learning-rate multiplier for the current global batch (``None`` before training)."""
        return self._plan.scale if self._plan is not None else None

    @property
    def warmup_steps(self) -> int | None:
        """The warmup length in optimizer updates (``None`` before training)."""
        return self._plan.warmup_steps if self._plan is not None else None

    @property
    def updates(self) -> list[int]:
        """Real (not skipped) updates taken by each optimizer so far: the warmup's clock. (For a fused optimizer
        under a grad scaler, steps skipped after the warmup are counted: telling them apart needs a device sync,
        and the ramp no longer depends on the count.)"""
        return list(self._updates or [])

    @property
    def warmup_progress(self) -> list[float]:
        """Share of the warmup each optimizer has done, in [0, 1] (1: the full factor is applied)."""
        if self._updates is None or self._plan is None:
            return []
        return [float(self._share_done(i, self._plan)) for i in range(len(self._updates))]

    # ------------------------------------------------------------------ Lightning hooks
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        super().setup(trainer, pl_module, stage)
        self.__dict__.pop("_state_not_for_fit", None)  # set by this stage's restore, if any (after setup)
        # For load_state_dict, which Lightning calls without the trainer: whether a BatchSizeFinder will search, and
        # the strategy's optimizer list before its setup (the strategy sets a new one, so a restore that still sees
        # this list is the user's checkpoint, not a finder's trial restore). Dropped at fit start.
        searching = stage == "fit" and _searches_batch_size(trainer)
        self._resume_guard = (trainer.strategy, trainer.strategy.optimizers) if searching else None
        if stage == "fit":
            # A second fit on the same Trainer continues the warmup where the first left it (its updates and the
            # share of the warmup they did: recounting them at the current updates per epoch could jump ahead);
            # any other fit starts afresh. A checkpoint's count, if any, is loaded after this.
            continuing = self.__dict__.get("_ended_fit") == (id(trainer), trainer.global_step) and trainer.global_step
            if not continuing:
                self._updates = None
                self._done = None
            self._ended_fit = None
            self._plan = None
            self._restored_global_batch = self._restored_accumulate = None  # a checkpoint's, if any, comes later
            self._last_factor, self._last_lrs = None, {}  # an earlier fit's read-outs are not this one's
            self._last_factors = {}
            # a reference carried over a tuner's fit (below) is carried over an `lr_find` after it too
            self._carried_reference = self._keep_reference
            if self._keep_reference:  # the fit before only searched the batch size (Tuner.scale_batch_size)
                self._keep_reference = False
                return
            if continuing and self._initial_reference is not None:
                return  # the batch the first fit started from, not one a BatchSizeFinder set since
            self._initial_reference = None
            if self.reference_batch_size == "initial" and self.batch_size is not None:
                self._initial_reference = self.batch_size * accumulation(trainer)  # the per-device batch given
            elif self.reference_batch_size == "initial" and lightning_hasattr(pl_module, "batch_size"):
                # read before BatchSizeFinder (on_fit_start) changes it; a checkpoint's value wins later
                size = lightning_getattr(pl_module, "batch_size")
                if isinstance(size, int) and not isinstance(size, bool) and size > 0:
                    self._initial_reference = size * accumulation(trainer)

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._resume_guard = None  # restores from here on are the finder's own trials
        self._check_optimizers(trainer)

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        super().on_train_start(trainer, pl_module)
        self._trainer = trainer
        self._length_checked = False  # once per fit, when the plan first has a ramp (here, or when it changes)
        self._check_optimizers(trainer, warn_missing_groups=True)
        count = len(trainer.optimizers)
        if self._updates is not None and len(self._updates) != count:
            self.warn(
                f"the checkpoint counted updates for {len(self._updates)} optimizer(s), this run has {count}; "
                "the warmup continues from the global step instead."
            )
            self._updates = None
        if self._updates is None:
            # A fresh run (0), or a checkpoint saved without this callback: assume no update was skipped.
            self._updates = [_updates_so_far(trainer)] * count
            self._done = None
        plan = self._refresh_plan(trainer)
        if self._done is not None and len(self._done) != count:
            self._done = None
        if self._done is None:
            # A fresh run, or a checkpoint saved before the warmup's share was stored: the updates so far at
            # the current updates per epoch.
            self._done = [self._share_from_updates(u, plan) for u in self._updates]
        self._check_length(trainer, plan)
        self._check_resumed_batch(trainer, plan)
        self._check_rule(trainer, plan)
        self._register(trainer)

    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        # Another callback may have swapped the optimizers (the hooks live on the optimizer objects). Lists
        # compare their items by identity first, and optimizers have no `__eq__`: an identity check.
        if trainer.optimizers != self._optimizers:
            self._register(trainer)

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if self._pending:  # a step began and never ended: it raised, and the exception was caught
            self._end_interrupted_steps()
        super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)

    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        super().on_train_epoch_start(trainer, pl_module)
        self._plan_stale = True  # a reloaded loader, a GradientAccumulationScheduler: read at the first update

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._unregister()
        super().on_train_end(trainer, pl_module)

    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException) -> None:
        # Lightning skips `teardown` after an exception: take the step hooks off the optimizers here, or they
        # would keep scaling (and counting) the updates of whatever steps those optimizers next
        self._unregister()  # restores the learning rates first (e.g. for an on-exception checkpoint)
        self._trainer = self._resume_guard = None
        super().on_exception(trainer, pl_module, exception)

    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self._unregister()
        self._trainer = self._resume_guard = None
        if stage == "fit":
            self._ended_fit = (id(trainer), trainer.global_step)  # where a second fit on this trainer continues
        if stage == "fit" and _only_searched(trainer, BatchSizeFinder):
            # `Tuner.scale_batch_size` ran a fit that stops after the search; the next fit is the real one,
            # and the batch asked for is the one read before the search, not the one it found
            self._keep_reference = self._initial_reference is not None
        elif stage == "fit" and _only_searched(trainer, LearningRateFinder) and self._carried_reference:
            # `Tuner.lr_find` between that search and the real fit: the reference goes on to the real fit
            self._keep_reference = self._initial_reference is not None
        super().teardown(trainer, pl_module, stage)

    # ------------------------------------------------------------------ state and logging
    def state_dict(self) -> dict[str, Any]:
        return {
            **super().state_dict(),
            "updates": list(self._updates) if self._updates is not None else None,
            "warmup_done": list(self._done) if self._done is not None else None,
            "warmup_done_unit": self.warmup_unit,  # the unit whose shares `warmup_done` tracked
            "initial_reference": self._initial_reference,
            "global_batch": self._plan.global_batch if self._plan is not None else None,
            "accumulate": self._plan.key[1] if self._plan is not None else None,
        }

    def on_load_checkpoint(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        # `trainer.validate/test/predict(ckpt_path=...)` restores callback state too: not this callback's (it does
        # nothing there), or the next fit on this trainer would continue from that checkpoint's count, not its own
        self._state_not_for_fit = restores_state_outside_fit(self, trainer, checkpoint)
        # Here, not in load_state_dict: Lightning calls this for every checkpoint, one saved without this callback
        # (a baseline run's) too.
        guard = self.__dict__.get("_resume_guard")
        if guard is not None and guard[0].optimizers is guard[1]:
            # The user's checkpoint, restored before the strategy's setup (BatchSizeFinder's own trial restores come
            # after it). The finder searches at fit start and its trial restore then discards this checkpoint's
            # loops and optimizer state: the run would start over at step 0 with the warmup already done.
            raise ValueError(
                "LinearScalingWarmup: resuming from a checkpoint with Lightning's BatchSizeFinder in the callbacks "
                "would restart training from step 0 (the finder's trial restore discards the checkpoint's loops and "
                "optimizer state). Resume without BatchSizeFinder (from a preset: `BatchSizeFinder=None`), giving "
                "the batch size the first run found (it printed it) to your datamodule or module, and keep "
                "LinearScalingWarmup as it was: the checkpoint keeps the reference batch it used."
            )

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if self.__dict__.pop("_state_not_for_fit", False):
            return  # restored by a validate/test/predict run (see `on_load_checkpoint`)
        super().load_state_dict(state_dict)
        updates = state_dict.get("updates")
        self._updates = [int(u) for u in updates] if updates is not None else None
        done = state_dict.get("warmup_done")
        self._done = [float(d) for d in done] if done is not None else None
        if self._done is not None and (self._updates is None or len(self._done) != len(self._updates)):
            self._done = None
        # Checkpoints written before the fraction unit tracked its shares (no `warmup_done_unit`) kept 0 there,
        # and a run resumed with another unit has other shares: work them out from the updates instead.
        tracked = state_dict.get("warmup_done_unit", "epochs")
        if tracked != self.warmup_unit:
            self._done = None
        if state_dict.get("initial_reference") is not None:
            self._initial_reference = int(state_dict["initial_reference"])
        saved_batch, saved_accumulate = state_dict.get("global_batch"), state_dict.get("accumulate")
        self._restored_global_batch = int(saved_batch) if saved_batch is not None else None
        self._restored_accumulate = int(saved_accumulate) if saved_accumulate else None

    def knobs(self) -> dict[str, float]:
        if self._plan is None or self._last_factor is None:
            return {}
        out = {
            "scale": self._plan.scale,
            "factor": self._last_factor,
            "global_batch_size": float(self._plan.global_batch),
        }
        if len(self._last_factors) > 1:  # several optimizers: each one's factor, under its LR's name
            for i, factor in self._last_factors.items():
                if i < len(self._names):
                    out[f"factor-{self._names[i].removeprefix('lr-')}"] = factor
        for i, lrs in self._last_lrs.items():
            if i >= len(self._names):  # optimizers swapped for fewer
                continue
            groups = self._optimizers[i].param_groups if i < len(self._optimizers) else []
            for j, lr in enumerate(lrs):
                out[_group_name(self._names[i], groups, j)] = float(lr)
        return out

    # ------------------------------------------------------------------ the step hooks
    def _pre_step(self, optimizer: Optimizer, args: Any, kwargs: Any) -> tuple[Any, Any] | None:
        trainer = self._trainer
        # `in` compares by identity here (callbacks have no `__eq__`)
        if trainer is None or self not in trainer.callbacks:
            return None  # not our run: a BatchSizeFinder/LR-finder trial runs with other callbacks
        if self._weight_averaging and updating_batchnorm_only(trainer):
            return None  # SWA's BatchNorm epoch: no gradients, accumulation over the whole epoch; not counted
        i = self._index(optimizer)
        if i is None:
            return None
        plan = self._plan if self._plan is not None and not self._plan_stale else self._refresh_plan(trainer)
        factor, share = self._factor(i, plan)
        self._apply(i, factor)
        self._pending_share[i] = share
        if hasattr(optimizer, "found_inf"):  # a fused optimizer stepped by a grad scaler: see `_post_step`
            (self._warming.add if self._share_done(i, plan) < 1.0 else self._warming.discard)(i)
        self._last_factor = self._last_factors[i] = factor
        # while warming up, an update whose closure returns None (Lightning's skipped `training_step`) is no
        # update: in mixed precision Lightning skips the step; in 32-bit it steps with no gradients
        # (with accumulation, a skipped last batch still steps with the window's earlier gradients: an update)
        watch = self._automatic and plan.key[1] == 1 and self._updates[i] < plan.warmup_steps  # type: ignore[index]
        return self._wrap_closure(i, factor, args, kwargs, watch=watch)

    def _apply(self, i: int, factor: float) -> None:
        """Scale optimizer ``i``'s groups by ``factor``, keeping their values to put back after the update.

        Idempotent: an optimizer subclass whose ``step`` calls its parent's runs the step hooks twice."""
        self._restore(i)
        optimizer = self._optimizers[i]
        saved: list[Any] | None = None
        if factor != 1.0:  # a factor of 1 (no scaling, or the reference batch) leaves every group as it is
            saved = []
            for j, group in enumerate(optimizer.param_groups):
                lr = group["lr"]
                saved.append(lr)
                if self._scales(i, j, group):
                    group["lr"] = lr * factor  # a new object: a tensor lr is replaced, never changed in place
        self._pending[i] = saved  # None: nothing to restore, but `_post_step` still counts the update
        if saved is not None:
            lrs = [g["lr"] for g in optimizer.param_groups]
            self._written[i] = (lrs, [_snapshot(lr) for lr in lrs])  # a later write (a scheduler's) replaces them

    def _wrap_closure(
        self, i: int, factor: float, args: Any, kwargs: Any, *, watch: bool = False
    ) -> tuple[Any, Any] | None:
        """Run the step's closure (``training_step`` and backward, in automatic optimization) with the learning
        rates unscaled: what the user's code reads there is the scheduler's value, and what it writes there is
        kept and scaled for the update. ``watch``: note a closure that returns None (no update to count)."""
        if factor == 1.0 and not watch:
            return None
        positional = len(args) > 1
        closure = args[1] if positional else kwargs.get("closure")
        if closure is None:
            return None
        scaled = factor != 1.0

        def closure_at_the_scheduler_lr() -> Any:
            if scaled:
                self._before_closure(i)
            try:
                result = closure()
            finally:
                if scaled:
                    self._after_closure(i, factor)
            if watch and result is None:
                self._skipped.add(i)
            return result

        if positional:
            return (args[0], closure_at_the_scheduler_lr, *args[2:]), kwargs
        return args, {**kwargs, "closure": closure_at_the_scheduler_lr}

    def _before_closure(self, i: int) -> None:
        self._restore(i)

    def _after_closure(self, i: int, factor: float) -> None:
        self._apply(i, factor)  # re-read: a learning rate set inside the closure is scaled too

    def _post_step(self, optimizer: Optimizer, args: Any, kwargs: Any) -> None:
        i = self._index(optimizer)
        if i is None or i not in self._pending:
            return
        share = self._pending_share.pop(i, 0.0)
        # A fused optimizer under a grad scaler is stepped even when the scaler found inf gradients, and skips the
        # update inside its kernel (`found_inf`, set by the scaler for this step only): no update to count either.
        # Read during the warmup only: on a GPU it waits for the device, which the fused path otherwise avoids.
        found_inf = getattr(optimizer, "found_inf", None) if i in self._warming else None
        if isinstance(found_inf, torch.Tensor) and bool(found_inf):
            self._restore(i)
            self._skipped.discard(i)
            return
        # what this update used (set inside the closure, scaled or not): logged as the effective learning rates,
        # kept as they are (a tensor lr is read at logging time only: no device sync on every step)
        self._last_lrs[i] = [_snapshot(g["lr"]) for g in optimizer.param_groups]
        self._restore(i)
        if i in self._skipped:  # the closure returned None: no update, the warmup stays where it was
            self._skipped.discard(i)
            return
        assert self._updates is not None and self._done is not None
        self._updates[i] += 1
        self._done[i] = _add_share(self._done[i], share)

    def _restore(self, i: int) -> None:
        saved = self._pending.pop(i, None)
        self._written.pop(i, None)
        if saved is not None:
            for group, lr in zip(self._optimizers[i].param_groups, saved, strict=False):
                group["lr"] = lr

    def _restore_all(self) -> None:
        for i in list(self._pending):
            self._restore(i)
        self._pending_share.clear()
        self._skipped.clear()

    def _end_interrupted_steps(self) -> None:
        """Take the factor off after steps that raised (no post-hook ran): where the learning rates are still the
        scaled values set, exactly; where something changed them since (a scheduler stepped after the caught
        error), it cannot be told apart from the factor, so say so."""
        for i in list(self._pending):
            written, values = self._written.get(i, (None, []))
            saved = self._pending.get(i)
            groups = self._optimizers[i].param_groups if i < len(self._optimizers) else []
            if saved is None or written is None:
                self._restore(i)
                continue
            # another object, or the same tensor filled in place since (torch's schedulers `fill_` a tensor lr)
            changed = any(
                g["lr"] is not w or (isinstance(w, torch.Tensor) and j < len(values) and not torch.equal(w, values[j]))
                for j, (g, w) in enumerate(zip(groups, written, strict=False))
            )
            if changed:
                self._pending.pop(i, None)
                self._written.pop(i, None)
                self.warn(
                    f"optimizer {i}'s step raised and the error was caught, so the warmup factor could not be taken "
                    "off its learning rates; they were changed since (a scheduler step?), so that step started from "
                    "the scaled values. Step the scheduler only after a step that succeeded."
                )
            else:
                self._restore(i)
            self._pending_share.pop(i, None)
            self._skipped.discard(i)

    # ------------------------------------------------------------------ the warmup's clock
    def _factor(self, i: int, plan: _Plan) -> tuple[float, float]:
        """The factor of optimizer ``i``'s next update, and the share of the warmup that update does."""
        assert self._updates is not None
        if self.warmup_unit == "steps":  # a warmup length that cannot change: count updates
            return warmup_factor(self._updates[i], plan.warmup_steps, plan.scale, self.warmup_from), 0.0
        if plan.warmup_steps == 0:
            return plan.scale, 0.0
        # Updates per epoch (hence the length of a warmup in epochs or as a fraction of the run) may have changed
        # since the warmup began, so `updates / warmup_steps` would jump, backwards too:
        # the share done so far is the sum of each earlier update's share at its own updates per epoch.
        # `warmup_factor` at the fractional update `done x warmup_steps` of the current length gives the
        # same ramp as counting updates while the updates per epoch stay the same.
        done = self._share_done(i, plan)
        step = done * plan.warmup_steps
        nearest = round(step)
        if abs(step - nearest) < 1e-9:  # a whole update, up to float rounding: the same factor as counting
            step = nearest
        return warmup_factor(step, plan.warmup_steps, plan.scale, self.warmup_from), 1.0 / plan.warmup_steps

    def _share_done(self, i: int, plan: _Plan) -> float:
        assert self._updates is not None
        if self.warmup_unit != "steps" and self._done is not None and i < len(self._done):
            return self._done[i]
        return self._share_from_updates(self._updates[i], plan)

    @staticmethod
    def _share_from_updates(updates: int, plan: _Plan) -> float:
        if plan.warmup_steps == 0:
            return 1.0
        return min(1.0, updates / plan.warmup_steps)

    def _index(self, optimizer: Optimizer) -> int | None:
        for i, opt in enumerate(self._optimizers):
            if opt is optimizer:
                return i
        return None

    def _scales(self, i: int, j: int, group: dict[str, Any]) -> bool:
        if group.get(self.group_key, True) is False:
            return False
        return j not in self.exclude_groups and (i, j) not in self.exclude_groups

    def _register(self, trainer: pl.Trainer) -> None:
        self._unregister()
        self._optimizers = list(trainer.optimizers)
        module = trainer.lightning_module
        self._automatic = module is None or bool(module.automatic_optimization)
        self._weight_averaging = has_weight_averaging(trainer)
        self._names = _optimizer_names(self._optimizers, trainer.lr_scheduler_configs)
        self._last_lrs = {}
        assert self._updates is not None and self._done is not None and self._plan is not None
        count = len(self._optimizers)
        start = _updates_so_far(trainer)
        self._updates = (self._updates + [start] * count)[:count]
        self._done = (self._done + [self._share_from_updates(start, self._plan)] * count)[:count]
        for opt in self._optimizers:
            self._handles.append(opt.register_step_pre_hook(self._pre_step))
            self._handles.append(opt.register_step_post_hook(self._post_step))

    def _unregister(self) -> None:
        self._restore_all()
        for handle in self._handles:
            handle.remove()
        self._handles = []

    # ------------------------------------------------------------------ batch size and warmup length
    def _reference(self) -> int:
        if self.reference_batch_size != "initial":
            return int(self.reference_batch_size)
        assert self._initial_reference is not None
        return self._initial_reference

    def _refresh_plan(self, trainer: pl.Trainer) -> _Plan:
        batch_size = self.batch_size or _loader_batch_size(trainer.train_dataloader)
        accumulate = accumulation(trainer)
        world_size = int(trainer.world_size)
        num_batches = trainer.num_training_batches
        key = (batch_size, accumulate, world_size, num_batches)
        self._plan_stale = False
        if self._plan is not None and self._plan.key == key:
            return self._plan
        global_batch = global_batch_size(batch_size, accumulate, world_size)
        if self.reference_batch_size == "initial" and self._initial_reference is None:
            self._initial_reference = batch_size * accumulate
        reference = self._reference()
        samples = _epoch_samples(trainer.train_dataloader) if self.reference_batch_size == "initial" else None
        if samples is not None:
            # the batch the script asked for, beyond the whole epoch, is the epoch (as the per-device batch is):
            # on one device the scale stays 1
            reference = min(reference, samples * world_size * accumulate)
        scale = batch_scale(global_batch, reference, self.rule)
        per_epoch = total = None
        if self.warmup == 0:  # no ramp: its length needs neither a sized loader nor a bounded run
            pass
        elif self.warmup_unit == "epochs":
            if not math.isfinite(num_batches):
                raise ValueError(
                    f"{type(self).__name__}(warmup_unit='epochs') needs a training loader with a length, but this "
                    "one has none (an iterable dataset?). Give the warmup in steps: `warmup_unit='steps'`."
                )
            per_epoch = steps_per_epoch(int(num_batches), accumulate)
        elif self.warmup_unit == "fraction":
            # After a reload with another length: the updates taken so far, then the new length for the rest
            # (the share of the warmup done so far stands; see `_factor`)
            total = (
                _total_steps(trainer, from_epoch=trainer.current_epoch, steps_before=_updates_so_far(trainer))
                if self._plan is not None
                else _total_steps(trainer)
            )
            if total is None:
                if math.isfinite(num_batches):
                    bound = "`max_steps` or `max_epochs`"
                else:  # a loader with no length (an iterable dataset): epochs do not bound the run
                    bound = "`max_steps` (the training loader has no length, so `max_epochs` does not bound the run)"
                raise ValueError(
                    f"{type(self).__name__}(warmup_unit='fraction') needs a finite run: set {bound} on the Trainer, "
                    "or give the warmup in steps (`warmup_unit='steps'`)."
                )
        steps = (
            warmup_length(self.warmup, self.warmup_unit, steps_per_epoch=per_epoch, total_steps=total)
            if self.warmup
            else 0
        )
        changed = ""
        if self._plan is not None:
            inputs = ("batch size", "accumulation", "world size", "batches per epoch")
            names = [n for n, old, new in zip(inputs, self._plan.key, key, strict=True) if old != new]
            changed = f" ({', '.join(names)} changed)"
        self._plan = _Plan(key, global_batch, scale, steps)
        if self.__dict__.get("_length_checked") is False:  # mid-fit, a scale that now has a ramp (accumulation grew)
            self._check_length(trainer, self._plan)
        ramp = f"warmup {steps} update(s)" if self._ramps(scale) else "no warmup (nothing to ramp up to at x <= 1)"
        rank_zero_info(
            f"{type(self).__name__}: global batch {global_batch} = {batch_size} per device x {accumulate} "
            f"accumulated x {world_size} device(s); learning rate x {scale:.4g} ({self.rule} rule, reference "
            f"{reference}), {ramp}{changed}."
        )
        return self._plan

    def _check_rule(self, trainer: pl.Trainer, plan: _Plan) -> None:
        """The linear rule raising the learning rate of an Adam-family optimizer: say what is usual instead."""
        if self.rule != "linear" or plan.scale <= 1.0:
            return
        adaptive = sorted({type(o).__name__ for o in trainer.optimizers if _is_adaptive(o)})
        if adaptive:
            self.warn(
                f"the linear rule multiplies the learning rate of {', '.join(adaptive)} by {plan.scale:.4g}; it was "
                "found for SGD with momentum (Goyal et al.), and adaptive optimizers usually take the square-root "
                "rule: `LinearScalingWarmup(rule='sqrt')` (in a preset: `LinearScalingWarmup={'rule': 'sqrt'}`)."
            )

    def _check_resumed_batch(self, trainer: pl.Trainer, plan: _Plan) -> None:
        """Warn when a resumed run's global batch differs from the checkpoint's: the scale jumps at once."""
        before = self.__dict__.pop("_restored_global_batch", None)
        accumulate = self.__dict__.pop("_restored_accumulate", None)
        scheduled = any(isinstance(cb, GradientAccumulationScheduler) for cb in trainer.callbacks)
        if before is not None and accumulate and scheduled:
            # an accumulation schedule moves the global batch on its own: compare the checkpoint's batch per device
            # and devices, at this epoch's accumulation
            before = before // accumulate * plan.key[1]
        if before is None or before == plan.global_batch:
            return
        old_scale = batch_scale(before, self._reference(), self.rule)
        self.warn(
            f"the checkpoint's run had a global batch of {before}, this one has {plan.global_batch} (batch size, "
            f"accumulation or devices changed): the learning rate scale goes from x {old_scale:.4g} to "
            f"x {plan.scale:.4g} at once, with no ramp."
        )

    def _ramps(self, scale: float) -> bool:
        """Whether the factor ramps: from the unscaled learning rate, a scale of at most 1 holds from the start."""
        return self.warmup_from != "unscaled" or scale > 1.0

    def _check_length(self, trainer: pl.Trainer, plan: _Plan) -> None:
        if self.__dict__.get("_length_checked") or not self._ramps(plan.scale):
            return  # said already this fit, or no ramp to be too long
        self._length_checked = True
        total = _total_steps(trainer)
        if total is not None and plan.warmup_steps > total:
            self.warn(
                f"the warmup ({self.warmup:g} {self.warmup_unit} = {plan.warmup_steps} updates) is longer than "
                f"training ({int(total)} updates), so the scaled learning rate (x {plan.scale:.4g}) is never "
                "reached. "
                + (
                    "Shorten `warmup`."
                    if self.warmup_unit == "fraction"
                    else "Shorten `warmup`, or give it as a fraction of the run (`warmup_unit='fraction'`)."
                )
            )

    def _check_optimizers(self, trainer: pl.Trainer, *, warn_missing_groups: bool = False) -> None:
        optimizers = [o for o in trainer.optimizers if type(o).__name__ != "_MockOptimizer"]
        if not optimizers:
            raise RuntimeError(
                f"{type(self).__name__} scales the learning rate of your optimizers, but this trainer has none "
                "(`configure_optimizers` returned None or nothing). Return an optimizer from "
                "`configure_optimizers`, or remove this callback."
            )
        sizes = [len(o.param_groups) for o in optimizers]
        for ref in self.exclude_groups:
            i, j = ref if isinstance(ref, tuple) else (None, ref)
            if i is not None and i >= len(optimizers):
                raise ValueError(
                    f"`exclude_groups` names optimizer {i} in {ref!r}, but there are {len(optimizers)} optimizer(s) "
                    f"(indices 0..{len(optimizers) - 1})."
                )
            if not warn_missing_groups:
                continue
            if (i is not None and j >= sizes[i]) or (i is None and j >= max(sizes)):
                # not an error: a group may be added later (BackboneFinetuning adds the backbone's when it thaws)
                entry = f" (entry {ref!r})" if isinstance(ref, tuple) else ""
                self.warn(
                    f"`exclude_groups` names param group {j}{entry}, but the optimizers have {sizes} param "
                    "group(s) so far (0-based indices); it is kept unscaled if it is added later (as "
                    "BackboneFinetuning adds one), else check the index."
                )


# ---------------------------------------------------------------------- helpers
_REFERENCE_HINT = (
    "It is the global batch size your learning rate was tuned for (256 for the ImageNet recipes), or 'initial' "
    "for the batch your script asks for on one device."
)


def _check_reference(value: Any) -> int | str:
    if isinstance(value, str) and value == "initial":
        return "initial"
    if not _checks.is_integral(value):
        raise TypeError(f"`reference_batch_size` must be a positive int or 'initial', got {value!r}. {_REFERENCE_HINT}")
    return int(_checks.positive("reference_batch_size", value, hint=_REFERENCE_HINT))


def _choice(name: str, value: Any, choices: tuple[str, ...], hint: str = "") -> Any:
    if value not in choices:
        raise ValueError(f"`{name}` must be one of {choices}, got {value!r}.{' ' + hint if hint else ''}")
    return value


def _check_warmup(warmup: Any, unit: str) -> float:
    value = _checks.real("warmup", warmup)
    if value < 0:
        raise ValueError(
            f"`warmup` must be >= 0 (0 applies the scaled learning rate from the first step), got {warmup!r}."
        )
    if unit == "steps" and value != int(value):
        raise ValueError(f"`warmup` in steps must be a whole number of optimizer updates, got {warmup!r}.")
    if unit == "fraction":
        _checks.in_range(
            "warmup", value, 0.0, 1.0, hint="With warmup_unit='fraction' it is a share of the run's optimizer updates."
        )
    return value


def _parse_groups(groups: Any) -> frozenset[GroupRef]:
    if isinstance(groups, str | bytes) or not isinstance(groups, Sequence | set | frozenset):
        raise TypeError(
            f"`exclude_groups` must be a list of param-group indices `j` or `(optimizer, group)` pairs, got {groups!r}."
        )
    out: set[GroupRef] = set()
    for ref in groups:
        if _is_index(ref):
            out.add(int(ref))
        elif isinstance(ref, Sequence) and not isinstance(ref, str) and len(ref) == 2 and all(map(_is_index, ref)):
            out.add((int(ref[0]), int(ref[1])))
        else:
            raise ValueError(
                f"`exclude_groups` items must be a param-group index `j` (of every optimizer) or an "
                f"`(optimizer index, group index)` pair of ints >= 0, got {ref!r}."
            )
    return frozenset(out)


def _is_index(value: Any) -> bool:
    return _checks.is_integral(value) and value >= 0


def _is_adaptive(optimizer: Optimizer) -> bool:
    """An Adam-family (per-parameter adaptive) optimizer: Adam, AdamW, NAdam, RAdam, Adamax, Adagrad, RMSprop,
    and others named so (LAMB, Adafactor, ...)."""
    names = {c.__name__.lower() for c in type(optimizer).__mro__}
    known = {"adagrad", "adadelta", "rmsprop", "lamb", "fusedlamb", "adafactor", "lion", "sophia", "sophiag"}
    return any("adam" in name for name in names) or bool(names & known)


def _loader_batch_size(loader: Any) -> int:
    if isinstance(loader, DataLoader):
        if loader.batch_size is not None:
            return _at_most_an_epoch(loader, int(loader.batch_size))
        size = getattr(loader.batch_sampler, "batch_size", None)
        if isinstance(size, int) and size > 0:
            return _at_most_an_epoch(loader, size)
        what = "its batch sampler has no `batch_size`"
    elif loader is None:
        what = "there is no training loader"
    else:
        what = f"the training loaders are a {type(loader).__name__}, not one DataLoader"
    raise ValueError(
        f"LinearScalingWarmup cannot read the per-device batch size: {what}. Pass it: "
        "`LinearScalingWarmup(..., batch_size=<samples per device per step>)`."
    )


def _epoch_samples(loader: Any) -> int | None:
    """Samples of one epoch on this device (its sampler's length); ``None`` when the loader cannot tell, or drops
    its last short batch (then no batch is ever smaller than its batch size)."""
    if not isinstance(loader, DataLoader):
        return None
    if loader.batch_size is None and loader.batch_sampler is None:
        return None  # automatic batching off: the dataset yields whole batches, and its length counts them
    drop_last = loader.drop_last if loader.batch_size is not None else getattr(loader.batch_sampler, "drop_last", 0)
    if drop_last:
        return None
    sampler = getattr(loader.batch_sampler, "sampler", None) or loader.sampler
    try:
        samples = len(sampler)
    except TypeError:  # an iterable dataset: no epoch length
        return None
    return samples or None


def _at_most_an_epoch(loader: DataLoader, size: int) -> int:
    """``size``, or the samples of one epoch on this device when there are fewer: a batch as large as a small
    dataset or larger (``BatchSizeFinder`` stops at or beyond it) is that dataset."""
    samples = _epoch_samples(loader)
    return samples if samples is not None and samples < size else size


def _total_steps(trainer: pl.Trainer, *, from_epoch: int = 0, steps_before: int = 0) -> float | None:
    """Each optimizer's updates over the run. Under manual optimization with several optimizers Lightning's
    steps count all of them, so each optimizer is taken to step once per batch. ``from_epoch``/``steps_before``:
    as for :func:`run_length` (a loader reloaded with another length)."""
    optimizers = steps_per_batch(trainer)
    if optimizers == 1:
        total = run_length(trainer, from_epoch=from_epoch, steps_before=steps_before)
    else:
        total = run_length(trainer, from_epoch=from_epoch, steps_before=steps_before, with_max_steps=False)
        if trainer.max_steps is not None and trainer.max_steps >= 0:
            total = min(total, float(trainer.max_steps // optimizers))
    return total if math.isfinite(total) else None


def _updates_so_far(trainer: pl.Trainer) -> int:
    """Each optimizer's updates so far, from Lightning's global step (a checkpoint saved without this callback)."""
    return int(trainer.global_step) // steps_per_batch(trainer)


def _snapshot(lr: Any) -> Any:
    """The value of ``lr`` now: a tensor lr may be filled in place by the scheduler later."""
    return lr.detach().clone() if isinstance(lr, torch.Tensor) else lr


def _optimizer_names(optimizers: list[Optimizer], scheduler_configs: Sequence[Any] = ()) -> list[str]:
    """``LearningRateMonitor``'s name of each optimizer, so both plot under matching keys.

    Its rule: optimizers with a scheduler first, in scheduler order, named by the scheduler config's ``name`` if
    it has one, else ``lr-<Optimizer class>``; then the others; the n-th (n > 1) of a class so far gets
    ``-<n - 1>`` (configs with a ``name`` do not count, but do get the suffix).
    """
    seen: dict[int, str] = {}
    counts: dict[type, int] = {}

    def name_of(opt: Optimizer, given: str | None) -> str:
        cls = type(opt)
        if given is None:
            counts[cls] = counts.get(cls, 0) + 1
        name = given if given is not None else f"lr-{cls.__name__}"
        count = counts.get(cls, 0)
        return f"{name}-{count - 1}" if count > 1 else name

    for config in scheduler_configs:
        opt = getattr(config.scheduler, "optimizer", None)
        if opt is not None and id(opt) not in seen:
            seen[id(opt)] = name_of(opt, getattr(config, "name", None))
        elif opt is not None and getattr(config, "name", None) is None:
            counts[type(opt)] = counts.get(type(opt), 0) + 1  # a second scheduler of one optimizer counts too
    for opt in optimizers:
        if id(opt) not in seen:
            seen[id(opt)] = name_of(opt, None)
    return [seen[id(opt)] for opt in optimizers]


def _searches_batch_size(trainer: pl.Trainer) -> bool:
    """Whether a ``BatchSizeFinder`` will search at this fit's start and training go on after it (not the one
    ``Tuner.scale_batch_size`` adds, whose fit stops after the search)."""
    return any(isinstance(cb, BatchSizeFinder) and not getattr(cb, "_early_exit", False) for cb in trainer.callbacks)


def _only_searched(trainer: pl.Trainer, finder: type[Callback]) -> bool:
    """Whether this fit was ``Tuner.scale_batch_size``'s (``finder=BatchSizeFinder``) or ``Tuner.lr_find``'s
    (``LearningRateFinder``): the tuner's finder stops the fit after its search."""
    return any(isinstance(cb, finder) and getattr(cb, "_early_exit", False) for cb in trainer.callbacks)


def _group_name(name: str, groups: list[dict[str, Any]], j: int) -> str:
    """The group suffix LearningRateMonitor uses: the group's ``name``, else ``pg<j + 1>`` when there are several."""
    group_name = groups[j].get("name") if j < len(groups) else None
    if group_name:
        return f"{name}/{group_name}"
    return f"{name}/pg{j + 1}" if len(groups) > 1 else name
