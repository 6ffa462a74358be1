"""`SpeedupCallback`: the base class every lightning-speedups callback builds on.

It gives a technique four things it should not reimplement:

* **progress**: the fraction of training done, in [0, 1], from the trainer's own counters, so schedules
  work for ``max_epochs`` and ``max_steps`` runs alike and pick up where they were after a resume;
* **batches**: reading and replacing the input and target of any batch container (:class:`BatchFields`),
  and, by overriding :meth:`SpeedupCallback.transform_batch`, a place in the one batch-transform seam
  (:mod:`lightning_speedups.seam`) that replaces *training* batches on the device;
* **randomness** that is reproducible: draws come from ``(seed, rank, batch index)``, so a resumed run
  draws what the uninterrupted run would have, and DDP ranks draw independently;
* **state and logging**: ``state_dict``/``load_state_dict``, knob values logged through the trainer's
  loggers at ``log_every_n_steps``, and warnings that rank zero alone prints.
"""

from __future__ import annotations

import functools
import inspect
import math
import re
import reprlib
import types
import warnings
import zlib
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from lightning.pytorch.callbacks import Callback, GradientAccumulationScheduler, StochasticWeightAveraging
from lightning.pytorch.trainer.states import RunningStage, TrainerFn
from lightning.pytorch.utilities import rank_zero_warn
from lightning.pytorch.utilities.signature_utils import is_param_in_hook_signature

from lightning_speedups import seam
from lightning_speedups._checks import flag, optional_int
from lightning_speedups._rng import BatchRandom, batch_key

if TYPE_CHECKING:
    import lightning.pytorch as pl


class SpeedupWarning(UserWarning):
    """A lightning-speedups callback found something worth a look, but training can go on."""


def restores_state_outside_fit(callback: Callback, trainer: pl.Trainer, checkpoint: Mapping[str, Any]) -> bool:
    """Whether Lightning is about to hand ``callback`` the state ``checkpoint`` holds for it in a validate, test or
    predict run (it restores callback state in every stage): for a callback whose state belongs to a fit, and that
    a later fit on the same trainer continues from, state to leave alone. Call it from ``on_load_checkpoint``."""
    if trainer.state.fn == TrainerFn.FITTING:
        return False
    states = checkpoint.get("callbacks") or {}
    return bool(states.get(callback.state_key, states.get(callback._legacy_state_key)))  # as Lightning reads it


def _snake(name: str) -> str:
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])", "_", name).lower()


def accumulation(trainer: pl.Trainer, epoch: int | None = None) -> int:
    """Batches per optimizer step in ``epoch`` (default: the current one).

    A ``GradientAccumulationScheduler`` sets the trainer's value only at each epoch start, after ``setup`` and
    ``on_train_start`` have read it, so its schedule is asked directly.
    """
    for cb in trainer.callbacks:
        if isinstance(cb, GradientAccumulationScheduler):
            return max(1, int(cb.get_accumulate_grad_batches(trainer.current_epoch if epoch is None else epoch)))
    return max(1, int(trainer.accumulate_grad_batches))


def accumulation_schedule(trainer: pl.Trainer) -> tuple[tuple[int, int], ...]:
    """A ``GradientAccumulationScheduler``'s schedule as sorted ``(first epoch, accumulate)`` pairs; ``()``
    without one."""
    for cb in trainer.callbacks:
        if isinstance(cb, GradientAccumulationScheduler):
            firsts = sorted({0, *(int(e) for e in cb.scheduling)})
            return tuple((e, max(1, int(cb.get_accumulate_grad_batches(e)))) for e in firsts)
    return ()


def training_epochs(trainer: pl.Trainer) -> int | None:
    """``max_epochs`` less the epoch that ``StochasticWeightAveraging`` adds to a model with BatchNorm layers.

    SWA raises the fit loop's ``max_epochs`` by one at fit start and spends that epoch re-estimating the
    BatchNorm statistics of the averaged weights (forward passes, no backward, no update): not training, so
    schedules end with the epoch before it.
    """
    max_epochs = trainer.max_epochs
    if max_epochs is None or max_epochs < 0:
        return max_epochs
    for cb in trainer.callbacks:
        if isinstance(cb, StochasticWeightAveraging) and cb._model_contains_batch_norm:
            user_epochs = getattr(cb, "_max_epochs", -1)  # set at SWA's fit start, with the extra epoch
            if user_epochs != -1:
                return min(max_epochs, int(user_epochs))
    return max_epochs


def run_length(
    trainer: pl.Trainer,
    *,
    from_epoch: int = 0,
    steps_before: int = 0,
    with_max_steps: bool = True,
    batches: int | None = None,
) -> float:
    """Optimizer steps of the whole run: ``inf`` when it has no bound (``max_time`` only, or an iterable
    dataset without ``max_steps``).

    Lightning's ``estimated_stepping_batches``, with each epoch's accumulation under a
    ``GradientAccumulationScheduler`` (Lightning uses the current epoch's for every epoch) and ``inf``, not -1,
    for an iterable dataset without ``max_steps``. ``steps_before`` steps taken before ``from_epoch``, then the
    current loader's length for the rest: what a loader reloaded with another length at that epoch gives.
    ``with_max_steps=False``: the ``max_epochs`` bound alone. ``batches``: the training batches per epoch, where
    the trainer does not know them yet (a loader drawing while Lightning sets it up).
    """
    max_steps = trainer.max_steps if trainer.max_steps is not None and trainer.max_steps >= 0 else None
    bounded = math.inf if max_steps is None or not with_max_steps else float(max_steps)
    max_epochs = training_epochs(trainer)
    if max_epochs is None or max_epochs < 0:
        return bounded
    if batches is None:
        if trainer.train_dataloader is None:
            trainer.fit_loop.setup_data()
        if not math.isfinite(trainer.num_training_batches):
            return bounded
        batches = int(trainer.num_training_batches)
    total = steps_before + epoch_steps(trainer, batches, range(from_epoch, max(max_epochs, 1)))
    return float(min(total, bounded))


def _ran_out(trainer: pl.Trainer) -> bool:
    """Whether the fit has reached its ``max_epochs`` or ``max_steps`` (what Lightning's ``fit_loop.done`` says
    of them, without its side effects: that logs "`Trainer.fit` stopped" at each call)."""
    loop = trainer.fit_loop
    epochs = loop.max_epochs
    if epochs is not None and 0 <= epochs <= loop.epoch_progress.current.processed:
        return True
    return trainer.max_steps is not None and 0 <= trainer.max_steps <= trainer.global_step


#: the attributes of a callback's schedule that `_schedule_at` works out for an epoch its hooks have not reached
_SCHEDULE = (
    "_total_steps",
    "_anchor",
    "_anchor_epoch",
    "_epochs_bound",
    "_length_key",
    "_length_batches",
    "_length_args",
)


def _latest(*epochs: int | None) -> int | None:
    """The latest of the epochs given, ``None`` among them ignored (``None`` if all are)."""
    known = [e for e in epochs if e is not None]
    return max(known) if known else None


def _loader_key(trainer: pl.Trainer, epoch: int | None = None) -> tuple[int, Any]:
    """(the epoch, the epoch Lightning last built the training loader at): what a run's length, worked out with
    that loader's length for that epoch, holds for (``reload_dataloaders_every_n_epochs`` builds others)."""
    epoch = trainer.current_epoch if epoch is None else epoch
    return epoch, getattr(trainer.fit_loop, "_last_train_dl_reload_epoch", None)


def epoch_steps(trainer: pl.Trainer, batches: int, epochs: range) -> int:
    """Optimizer steps of ``epochs`` with ``batches`` training batches each, at each epoch's own accumulation (an
    epoch ends with a step, Lightning's rule)."""
    return sum(-(-batches // accumulation(trainer, e)) for e in epochs)


def training_progress(
    trainer: pl.Trainer, total_steps: float | None = None, *, epochs_bound: float | None = None
) -> float:
    """Fraction of the run's optimizer steps already taken, clipped to [0, 1].

    ``total_steps`` defaults to :func:`run_length` (``max_epochs``, ``max_steps``, ``limit_train_batches``,
    gradient accumulation, scheduled accumulation); pass a cached value in hot paths. Under manual optimization,
    whose global step counts whatever steps the module takes (several optimizers per batch, or one step every
    few batches), batches measure the ``max_epochs`` bound (``epochs_bound``: its batches, cached by the caller).

    Stateless: it reads the current loader's length as every epoch's, so with loaders that reload at another
    length it can step back, and end short of 1. ``SpeedupCallback.progress`` keeps the point reached at each
    reload and is monotone: use it in a callback.
    """
    total = run_length(trainer) if total_steps is None else total_steps
    if not math.isfinite(total):
        raise RuntimeError(
            "Training progress needs a finite run length: set `max_steps` or `max_epochs` on the Trainer "
            "(this run has neither, or an iterable dataset with no `max_steps`)."
        )
    if total <= 0:
        return 1.0
    if _counts_batches(trainer):
        return _manual_progress(trainer, epochs_bound)
    return min(1.0, max(0.0, trainer.global_step / total))


def steps_per_batch(trainer: pl.Trainer) -> int:
    """How many of Lightning's global steps a batch takes at most: the number of optimizers under manual
    optimization (Lightning counts each optimizer's step), else 1."""
    module = getattr(getattr(trainer, "strategy", None), "_lightning_module", None)
    if module is None or module.automatic_optimization:
        return 1
    return max(1, len(trainer.optimizers))


def _counts_batches(trainer: pl.Trainer) -> bool:
    """Whether progress counts batches, not global steps: under manual optimization, where a batch may step
    several optimizers (Lightning counts each) or none (a step every few batches)."""
    module = getattr(getattr(trainer, "strategy", None), "_lightning_module", None)
    return module is not None and not module.automatic_optimization


def _clock(trainer: pl.Trainer) -> int:
    """What progress counts: optimizer steps, or batches under manual optimization."""
    if _counts_batches(trainer):
        return int(trainer.fit_loop.epoch_loop.batch_progress.total.processed)
    return int(trainer.global_step)


def continued_from(trainer: pl.Trainer) -> tuple[int, int] | None:
    """``(epoch, steps taken)`` where a fit goes on from steps already taken at an epoch's start (a later ``fit``
    on the same trainer, a resume from an epoch-end checkpoint): the run's length is those steps, then the current
    loader's for the epochs left. ``None`` for a fit from the start, or while a mid-epoch resume restarts."""
    loop, clock = trainer.fit_loop, _clock(trainer)
    if clock > 0 and not (loop.restarting or loop.epoch_loop.restarting):
        return int(trainer.current_epoch), clock
    return None


def _manual_progress(trainer: pl.Trainer, epochs_bound: float | None = None) -> float:
    """Progress under manual optimization, where Lightning's global step counts the optimizer steps the module
    takes (every optimizer's, however many per batch): batches against the ``max_epochs`` bound, global steps
    against ``max_steps``."""
    if epochs_bound is None:
        epochs_bound = run_length(trainer, with_max_steps=False)  # a loop over the epochs: cache it in hot paths
    done = _clock(trainer) / epochs_bound if math.isfinite(epochs_bound) and epochs_bound > 0 else 0.0
    return min(1.0, max(0.0, done, _max_steps_share(trainer)))


def _max_steps_share(trainer: pl.Trainer) -> float:
    """The share of ``max_steps`` taken (0 without it): in Lightning's global steps, every optimizer's."""
    if trainer.max_steps is None or trainer.max_steps <= 0:
        return 0.0
    return trainer.global_step / trainer.max_steps


def cap_by_max_steps(trainer: pl.Trainer, total: float) -> float:
    """``total`` (steps of the ``max_epochs`` bound) capped by ``max_steps`` in the same unit: under manual
    optimization batches, ``max_steps`` read as one global step per optimizer per batch (right when every
    optimizer steps at every batch; a module that steps less often reaches ``max_steps`` later than this
    assumes), else optimizer steps."""
    if trainer.max_steps is None or trainer.max_steps < 0:
        return total
    return min(total, trainer.max_steps / steps_per_batch(trainer))


#: mixed into a callback's salt for the draws of validation batches, so that they never repeat training ones
_VALIDATION_SALT = 0x5A17_DA7E


class SpeedupCallback(Callback):
    """Base class for lightning-speedups callbacks; subclass it to write your own.

    Subclasses override what they need:

    * :meth:`transform_batch` to replace training batches on the device (the seam is installed for them);
    * :meth:`knobs` to report their current settings, which are logged as ``<log_name>/<knob>``;
    * ``state_dict``/``load_state_dict`` (call ``super()``) for state that must survive a resume, and
      :meth:`state_key_fields` when several instances of one class may share a trainer;
    * the usual Lightning hooks, calling ``super()`` for ``setup``, ``teardown``, ``on_exception``,
      ``on_train_start``, ``on_train_epoch_start`` and ``on_train_batch_end``.

    Args:
        seed: seed of the callback's random draws. ``None`` takes the process seed at fit start
            (``torch.initial_seed()``, which ``lightning.seed_everything`` sets) and stores it in checkpoints.
        log_knobs: log :meth:`knobs` through the trainer's loggers.

    Example:
        A callback that scales the inputs during the first half of training (docs/extending.md has more)::

            from lightning_speedups import BatchFields, SpeedupCallback

            class EarlyScale(SpeedupCallback):
                def __init__(self, factor: float = 0.5):
                    super().__init__()
                    self.factor, self.fields = factor, BatchFields()

                def transform_batch(self, trainer, pl_module, batch):
                    if self.progress(trainer) >= 0.5:
                        return batch
                    return self.fields.replace(batch, input=self.fields.get_input(batch) * self.factor)
    """

    #: prefix of logged knobs; defaults to the class name in snake case (``InputNoise`` -> ``input_noise``).
    log_name: str | None = None

    def __init__(self, *, seed: int | None = None, log_knobs: bool = True) -> None:
        super().__init__()
        self.seed = optional_int("seed", seed, minimum=0)
        self._given_seed = self.seed  # the user's choice; `seed` itself is filled in at each fit
        self.log_knobs = flag("log_knobs", log_knobs)
        self._total_steps: float | None = None
        # (step, progress) from which the rest of the run is spread over the steps left: (0, 0) unless a loader
        # reloaded with another length, when the progress reached so far is kept (it never goes back)
        self._anchor: tuple[int, float] = (0, 0.0)
        self._loaded_progress: tuple[float, tuple[int, float]] | None = None
        self._unsized_bound: int | None = None  # max_epochs of an unsized loader run bounded by max_steps too

    # ------------------------------------------------------------------ progress
    def progress(self, trainer: pl.Trainer) -> float:
        """Fraction of training done, in [0, 1]; 0 before training starts."""
        if self._total_steps is None:
            if trainer.state.stage is not RunningStage.TRAINING or trainer.train_dataloader is None:
                return 0.0
            # training, but `on_train_start` did not run ours (a subclass's override without `super()`): work
            # the run's length out now rather than report no progress for the whole run
            self._refresh_total_steps(trainer)
            assert self._total_steps is not None
        elif (
            trainer.reload_dataloaders_every_n_epochs
            and trainer.state.fn == TrainerFn.FITTING  # `validate` by another trainer builds no training loader
            and self.__dict__.get("_length_key") != _loader_key(trainer)
            and not _ran_out(trainer)  # read after the last epoch: nothing left to spread
            and not self.__dict__.get("_refreshing")
        ):
            # an epoch Lightning started without `on_train_epoch_start` (a run resumed at an epoch's last batch), or
            # a loader it reloaded since: what that hook would have done
            self._refresh_total_steps(trainer, reloaded=True)
        if not math.isfinite(self._total_steps):
            raise RuntimeError(
                f"{type(self).__name__} follows training progress, which needs a finite run length: set `max_steps` "
                "or `max_epochs` on the Trainer (a run bounded by `max_time` alone, or an iterable dataset without "
                "`max_steps`, has none)."
            )
        if self.__dict__.get("_unsized_bound") is not None:
            self.warn(
                f"the training loader has no length, so progress counts against max_steps={trainer.max_steps}; if "
                f"its stream runs out before that, max_epochs={self._unsized_bound} ends the run first and schedules "
                "and windows stop short of their end. Set max_steps to the run's real length, or leave max_epochs "
                "unset."
            )
            self._unsized_bound = None
        step0, p0 = self._anchor
        bound = self.__dict__.get("_epochs_bound")
        if step0 == 0 and p0 == 0.0:
            return training_progress(trainer, self._total_steps, epochs_bound=bound)
        training_progress(trainer, self._total_steps, epochs_bound=bound)  # the error for an unbounded run
        done = self._anchored_progress(_clock(trainer))
        if _counts_batches(trainer):
            done = max(done, _max_steps_share(trainer))  # the run may end at max_steps first
        return min(1.0, max(p0, done))

    def _anchored_progress(
        self, step: float, total: float | None = None, anchor: tuple[int, float] | None = None
    ) -> float:
        """Progress at ``step`` once a reload anchored it (not clipped): the progress reached at the anchor stands,
        and the steps left to the run's end spread the rest. ``total`` and ``anchor`` default to the run's."""
        step0, p0 = self._anchor if anchor is None else anchor
        total = self._total_steps if total is None else total
        assert total is not None
        return 1.0 if total <= step0 else p0 + (1.0 - p0) * (step - step0) / (total - step0)

    def _schedule_at(self, trainer: pl.Trainer, epoch: int, batches: int | None = None) -> dict[str, Any] | None:
        """The schedule (its :data:`_SCHEDULE` attributes) at ``epoch`` of a run whose loader reloads, for a loader
        that draws before the hooks that set it ran (``None`` if nothing is set yet): a resumed run's from its
        checkpoint, before ``on_train_start`` restores it (workers prefetch while Lightning sets the loader up);
        and at an epoch Lightning starts without ``on_train_epoch_start`` (after a restart at an epoch's end or last
        batch), re-anchored at its start, as that hook would. ``batches``: the loader's batches per epoch, which the
        trainer may not know yet. The callback's own schedule is left as it is."""
        reload = trainer.reload_dataloaders_every_n_epochs
        loaded = self.__dict__.get("_loaded_progress") if reload else None
        live = {name: self.__dict__.get(name) for name in _SCHEDULE}
        key = live["_length_key"]
        live_for = _latest(key[0] if key is not None else None, live["_anchor_epoch"])
        # a loader of another length than the live schedule's (Lightning reloads before it records the reload)
        resized = batches is not None and live["_length_batches"] is not None and batches != live["_length_batches"]
        if loaded is None and (
            live["_total_steps"] is None or not reload or live_for is None or (epoch <= live_for and not resized)
        ):
            return None if live["_total_steps"] is None else live
        try:
            was_for = live_for
            if loaded is not None:
                (self._total_steps, self._anchor), epoch0 = loaded, self.__dict__.get("_loaded_anchor_epoch")
                length = self.__dict__.get("_loaded_length")
                if length is not None:  # under this trainer's bounds, which a resumed run may have changed
                    self._total_steps = run_length(trainer, **length)
                    if _counts_batches(trainer):  # the bound the progress reached at a reload is read under
                        bound_args = {k: v for k, v in length.items() if k != "with_max_steps"}
                        self._epochs_bound = run_length(trainer, with_max_steps=False, **bound_args)
                self._length_batches = (length or {}).get("batches")  # the checkpoint's loader's, not this one's
                self._length_args = dict(length) if length is not None else None
                # the last epoch the saved schedule held for: its anchor's, or a later one of the same length
                was_for = _latest(self.__dict__.get("_loaded_length_epoch"), epoch0)
                self._anchor_epoch, self._length_key = epoch0, None
            if was_for is not None and (epoch > was_for or (loaded is None and resized)):
                self._refresh_total_steps(trainer, reloaded=True, batches=batches, epoch=epoch)
            assert self._total_steps is not None
            return {name: self.__dict__.get(name) for name in _SCHEDULE}
        finally:
            self.__dict__.update(live)

    def _refresh_total_steps(
        self, trainer: pl.Trainer, *, reloaded: bool = False, batches: int | None = None, epoch: int | None = None
    ) -> None:
        """Work the run's length out (with the current loader's length, or ``batches``) at ``epoch`` (default: the
        current one); ``reloaded``: at that epoch's start, after a reload, keeping the progress reached."""
        epoch = trainer.current_epoch if epoch is None else epoch
        # under manual optimization progress also reads the max_epochs bound in batches: worked out here, once
        bound = run_length(trainer, with_max_steps=False, batches=batches) if _counts_batches(trainer) else None
        previous_bound, self._epochs_bound = self.__dict__.get("_epochs_bound"), bound
        self._length_key = _loader_key(trainer, epoch)  # what the length holds for
        if reloaded and self._total_steps is not None:
            used = batches if batches is not None else trainer.num_training_batches
            if used == self.__dict__.get("_length_batches"):
                # a loader of the same length: the schedule stands (re-anchoring would change nothing but what a
                # resumed run with another `max_epochs` works its length out from)
                return
        if not reloaded:
            self._anchor = (0, 0.0)
            # a later `fit` on this trainer (`max_epochs` raised), or a resume at an epoch's end: the steps taken,
            # then this loader's length for the epochs left (the earlier epochs' may have had another)
            first, taken = continued_from(trainer) or (0, 0)
            if bound is not None and taken:
                self._epochs_bound = run_length(
                    trainer, with_max_steps=False, batches=batches, from_epoch=first, steps_before=taken
                )
            self._set_length(trainer, batches, from_epoch=first, steps_before=taken, with_max_steps=True)
            return
        # A loader reloaded at this epoch's start, maybe with another length: the progress reached stands, and
        # the rest of the run (the steps taken so far, then the new length) spreads the remainder
        self._refreshing = True  # `progress` reads the progress reached, and starts no other refresh
        self._epochs_bound = previous_bound  # reached under the old loader's bound (manual optimization)
        try:
            # an unbounded run (`max_time` only, a stream without `max_steps`) has no progress to keep: its
            # callbacks that follow progress say so when they read it, the others must not fail here
            known = self._total_steps is not None and math.isfinite(self._total_steps)
            reached = self.progress(trainer) if known else 0.0
        finally:
            self._refreshing = False
            self._epochs_bound = bound
        clock = _clock(trainer)
        self._anchor = (clock, reached) if reached > 0.0 else (0, 0.0)
        self._anchor_epoch = epoch  # the epoch that starts at the anchor's step
        in_steps = not _counts_batches(trainer)  # in batches (manual optimization), max_steps counts other units
        self._set_length(trainer, batches, from_epoch=epoch, steps_before=clock, with_max_steps=in_steps)
        if not math.isfinite(self._total_steps) and not in_steps:
            # no `max_epochs` bound (or a loader with no length): `max_steps` alone bounds the run, and progress is
            # its share (global steps; the anchor counts batches, which may take more or fewer steps each)
            self._anchor = (0, 0.0)
            self._set_length(trainer, batches, from_epoch=epoch, steps_before=clock, with_max_steps=True)

    def _set_length(self, trainer: pl.Trainer, batches: int | None, **length: Any) -> None:
        """The run's length, ``run_length(trainer, batches=batches, **length)``, and how it was worked out (with how
        many batches per epoch): a resumed run works it out again under its own trainer's bounds (``max_epochs``
        raised, say)."""
        self._total_steps = run_length(trainer, batches=batches, **length)
        used = batches if batches is not None else trainer.num_training_batches
        self._length_batches = used
        self._length_args = {**length, "batches": int(used) if math.isfinite(used) else None}

    # ------------------------------------------------------------------ batches
    def transform_batch(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any) -> Any:
        """Return the training batch to use instead of ``batch`` (already on the device).

        Runs after the user's ``transfer_batch_to_device``/``on_after_batch_transfer``, for training
        batches only, in ``trainer.callbacks`` order. Never mutate ``batch`` or its tensors in place.
        """
        return batch

    @property
    def transforms_batches(self) -> bool:
        """Whether this callback overrides :meth:`transform_batch` (or defines ``transform_validation_batch``) and
        so uses the seam."""
        cls = type(self)
        return cls.transform_batch is not SpeedupCallback.transform_batch or callable(
            getattr(cls, "transform_validation_batch", None)
        )

    # ------------------------------------------------------------------ randomness
    def _batch_index(self, trainer: pl.Trainer) -> int:
        # `completed` counts the batches done: from the batch transform to `on_train_batch_end` it is the 0-based
        # index of the current batch (`started` is too, until `on_train_batch_start`, then one ahead: a draw in
        # a later hook would be the next batch's); resume restores it.
        return int(trainer.fit_loop.epoch_loop.batch_progress.total.completed)

    def _stream(self, trainer: pl.Trainer) -> tuple[int, int]:
        """``(batch, salt)`` keying this batch's draws: the training batch's index and this callback's salt; in a
        validation batch (``transform_validation_batch``), that batch's own index within the fit's validation
        batches, after the training batches so far, under another salt: each validation batch draws its own."""
        index = self._batch_index(trainer)
        state = trainer.state
        if state.stage is not RunningStage.VALIDATING:
            return index, self._salt()
        loop = trainer.fit_loop.epoch_loop.val_loop if state.fn is TrainerFn.FITTING else trainer.validate_loop
        # eval loops count a batch as started after moving it to the device: inside the seam, this batch's index
        return (index << 32) | int(loop.batch_progress.total.started), self._salt() ^ _VALIDATION_SALT

    def _seed_or_process_seed(self) -> int:
        """``seed``, or before ``setup`` fixes it, the process seed (what ``seed_everything`` set)."""
        return self.seed if self.seed is not None else _process_seed()

    def _salt(self) -> int:
        salt = self.__dict__.get("_salt_cache")
        if salt is None:
            # An instance draws from its class's stream; a second instance of the class in the same trainer from
            # its state key's (set in `setup`), so the two draw independently.
            salt = self._salt_cache = zlib.crc32(self._class_id().encode())
        return salt

    def _class_id(self) -> str:
        """The class's name in the salt: the shipped callbacks' bare names (their streams stay as they are), the
        module too for any other class, so a user's ``MixUp`` or two packages' ``Noise`` draw independently (in
        one Trainer only with differing ``state_key_fields``: the state key is the bare class name, so that a
        checkpoint of a script's class restores into the same class imported elsewhere). A class of the launching
        script is ``__main__``'s, also in ``ddp_spawn``'s processes (where Python names that module
        ``__mp_main__``)."""
        cls = type(self)
        if cls.__module__.startswith("lightning_speedups."):
            return cls.__qualname__
        module = "__main__" if cls.__module__ == "__mp_main__" else cls.__module__
        return f"{module}.{cls.__qualname__}"

    def __getstate__(self) -> dict[str, Any]:
        # picklable by `ddp_spawn` after an earlier fit drew from it: the reused random object holds a
        # torch.Generator, which spawned processes cannot receive; it is a cache, rebuilt at the next draw
        state = dict(self.__dict__)
        state.pop("_batch_random", None)
        return state

    def batch_random(self, trainer: pl.Trainer) -> BatchRandom:
        """This batch's draws, seeded by (seed, rank, batch index, callback class): what the built-in callbacks
        use, as it costs a few µs per batch.

        Each call restarts the same stream (and re-seeds the one object it returns), so a draw that must not
        depend on an earlier one in the same batch can be made after a fresh call. Validation batches (in
        ``transform_validation_batch``) get draws of their own, one stream per batch.
        """
        random = self.__dict__.get("_batch_random")
        if random is None:
            random = self._batch_random = BatchRandom()
        batch, salt = self._stream(trainer)
        return random.reseed(batch_key(self._seed_or_process_seed(), trainer.global_rank, batch, salt))

    def rng(self, trainer: pl.Trainer) -> np.random.Generator:
        """A NumPy generator for the current batch, seeded by (seed, rank, batch index, callback class).

        For distributions that :meth:`batch_random` lacks; building it costs tens of µs per call.
        """
        batch, salt = self._stream(trainer)
        return np.random.default_rng([self._seed_or_process_seed(), trainer.global_rank, batch, salt])

    def torch_generator(self, trainer: pl.Trainer) -> torch.Generator:
        """A CPU ``torch.Generator`` for this batch's tensor draws (that of :meth:`batch_random`)."""
        return self.batch_random(trainer).torch

    def check_single_loader(self, trainer: pl.Trainer, acts_on: str, *, getter_helps: bool = True) -> None:
        """Refuse several training dataloaders (call it at ``on_train_start``, when the fit loop has them).

        Their batches nest one batch per loader (``[batch_a, batch_b]`` or ``{"a": batch_a, ...}``), which no
        ``input_key``/``target_key`` describes: without this check a callback would transform the first loader's
        batch alone, or fail at the first step with advice about keys. ``acts_on`` says what it needs;
        ``getter_helps=False`` where a getter and setter would not make the callback work either.
        """
        loaders = trainer.train_dataloader
        if isinstance(loaders, Mapping | list | tuple):
            who = type(self).__name__
            fix = (
                ", or pass `batch_getter`/`batch_setter` that read and replace the input and target inside the "
                "combined batch."
                if getter_helps
                else "."
            )
            raise ValueError(
                f"{who} acts on {acts_on}, but training uses {len(loaders)} dataloader(s) given as a "
                f"{type(loaders).__name__} (or a CombinedLoader of them), so each batch holds one batch per loader. "
                f"{who} does not support this: train on one dataloader (e.g. concatenate the datasets){fix}"
            )

    # ------------------------------------------------------------------ logging and warnings
    def knobs(self) -> dict[str, float]:
        """Current values of this callback's settings, for the loggers."""
        return {}

    def _base_log_name(self) -> str:
        return self.log_name or _snake(type(self).__name__)

    @property
    def _log_prefix(self) -> str:
        prefix = self._base_log_name()
        sibling = self.__dict__.get("_log_index", 0)
        return f"{prefix}_{sibling + 1}" if sibling else prefix

    def log_now(self, trainer: pl.Trainer, knobs: Mapping[str, float] | None = None) -> None:
        """Send :meth:`knobs` (or the ``knobs`` given) to every logger of ``trainer`` (rank zero only, as loggers
        are), under ``<log_name>/``."""
        knobs = self.knobs() if knobs is None else knobs
        if not knobs or not trainer.loggers:
            return
        metrics = self._as_metrics(knobs)
        self._knobs_logged = True
        step = getattr(trainer.fit_loop.epoch_loop, "_batches_that_stepped", trainer.global_step)
        for logger in trainer.loggers:
            logger.log_metrics(metrics, step=step)

    def _as_metrics(self, knobs: Mapping[str, Any]) -> dict[str, float]:
        """``knobs`` as the floats loggers take, under ``<log_name>/``; a value that is no number is an error."""
        try:
            return {f"{self._log_prefix}/{k}": float(v) for k, v in knobs.items()}
        except (TypeError, ValueError, RuntimeError) as err:  # a str, None, a tensor of several elements
            bad = next(k for k, v in knobs.items() if not _is_number(v))
            raise TypeError(
                f"{type(self).__name__}.knobs() gave {bad!r} = {knobs[bad]!r}, which loggers cannot take: knobs must "
                "be numbers (a bool, an int, a float, a 0-d tensor). Log other values yourself, or leave them out."
            ) from err

    def warn(self, message: str, *, every_rank: bool = False) -> None:
        """Warn once per process group: on rank zero only.

        ``every_rank=True`` for a finding about this rank's own data (its first batch, its images), which
        another rank may not share: then any rank that finds it warns, naming itself when there are several.
        """
        text = f"{type(self).__name__}: {message}"
        if not every_rank:
            rank_zero_warn(text, category=SpeedupWarning, stacklevel=5)  # the caller of `warn`, as below
            return
        several = torch.distributed.is_available() and torch.distributed.is_initialized()
        if several and torch.distributed.get_world_size() > 1:
            text = f"{text} (rank {torch.distributed.get_rank()})"
        warnings.warn(text, SpeedupWarning, stacklevel=2)

    # ------------------------------------------------------------------ state
    def state_key_fields(self) -> dict[str, Any]:
        """Settings that tell two instances of this class apart in a checkpoint (e.g. two windows)."""
        return {}

    @reprlib.recursive_repr()
    def __repr__(self) -> str:
        """``MixUp(alpha=0.4, p=0.5)``: the class and the ``__init__`` arguments (those a subclass passes on through
        ``**kwargs`` included) that differ from their defaults, read from the attributes of the same names;
        arguments kept under another name are left out, long values (arrays, label lists) shown by their type."""
        parameters = self._init_parameters()
        values = self._repr_values()
        parts = []
        for name, param in parameters.items():
            value = values.get(name, _MISSING)
            if value is _MISSING or _is_default(value, param.default):
                continue
            parts.append(f"{name}={_short_repr(value)}")
        return f"{type(self).__name__}({', '.join(parts)})"

    def _differing_settings(self, other: SpeedupCallback) -> dict[str, tuple[Any, Any]]:
        """``{argument: (this one's value, other's)}`` for this callback's ``__init__`` arguments (as ``repr``
        reads them) in which ``other``, of this class or a subclass, differs (see ``_same_setting``: objects that
        compare by identity only, a scorer instance, compare by their reprs, which may not show every setting)."""
        mine, theirs = self._repr_values(), other._repr_values()
        return {
            name: (mine[name], theirs[name])
            for name in self._init_parameters()
            if name in mine and name in theirs and not _same_setting(mine[name], theirs[name])
        }

    def _init_parameters(self) -> dict[str, inspect.Parameter]:
        """The callback's ``__init__`` arguments by name, those a subclass passes on through ``**kwargs`` included."""
        parameters: dict[str, inspect.Parameter] = {}
        for cls in type(self).__mro__:
            init = cls.__dict__.get("__init__")
            if init is None:
                continue
            try:
                signature = list(inspect.signature(init).parameters.values())[1:]
            except (TypeError, ValueError):
                break
            for param in signature:
                if param.kind not in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
                    parameters.setdefault(param.name, param)
            if cls is SpeedupCallback or not any(p.kind is p.VAR_KEYWORD for p in signature):
                break  # the rest of the arguments are not this callback's
        return parameters

    def _repr_values(self) -> dict[str, Any]:
        """The values ``__repr__`` shows for the ``__init__`` arguments of the same names; override where a
        setting is kept in another form (a subclass keeps its arguments under their names by default)."""
        values = {**self.__dict__, "seed": self.__dict__.get("_given_seed")}
        fields = self.__dict__.get("fields")
        if fields is not None and hasattr(fields, "getter"):  # the batch's places, kept in one `BatchFields`
            values.update(input_key=fields.input_key, target_key=fields.target_key)
            values.update(batch_getter=fields.getter, batch_setter=fields.setter)
        return values

    @property
    def state_key(self) -> str:
        # Lightning reads `state_key` on every hook call it dispatches (for its profiler); within a fit the
        # settings are fixed, so the key is worked out once at setup and reused until teardown.
        cached = self.__dict__.get("_state_key_cache")
        if cached is not None:
            return cached
        # By the class's name, not its module (which only the random streams take): a checkpoint saved by a class
        # of the training script (`__main__`) restores into the same class imported by another script.
        fields = self.state_key_fields()
        return self._generate_state_key(**fields) if fields else type(self).__qualname__

    def state_dict(self) -> dict[str, Any]:
        state: dict[str, Any] = {"seed": self.seed}
        # after a reload moved the anchor; in any run that reloads, once worked out: a resumed run's first loader
        # may already be the next epoch's, of another length, so the run's length is the checkpoint's to give
        if (
            self._total_steps is not None
            and math.isfinite(self._total_steps)
            and (self._anchor != (0, 0.0) or self.__dict__.get("_reloading"))
        ):
            state["progress"] = {"total_steps": self._total_steps, "anchor": list(self._anchor)}
            if self.__dict__.get("_anchor_epoch") is not None:
                state["progress"]["anchor_epoch"] = self._anchor_epoch
            if self.__dict__.get("_length_args") is not None:
                state["progress"]["length"] = dict(self._length_args)
            if self.__dict__.get("_length_key") is not None:
                state["progress"]["length_epoch"] = self._length_key[0]
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.seed = state_dict.get("seed", self.seed)
        saved = state_dict.get("progress")
        if saved is not None:
            step0, p0 = saved["anchor"]
            self._loaded_progress = (float(saved["total_steps"]), (int(step0), float(p0)))
            epoch = saved.get("anchor_epoch")
            self._loaded_anchor_epoch = int(epoch) if epoch is not None else None
            self._loaded_length = saved.get("length")  # absent from older checkpoints: their total stands
            self._loaded_length_epoch = saved.get("length_epoch")

    # ------------------------------------------------------------------ Lightning hooks
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if "_given_seed" not in self.__dict__:
            raise RuntimeError(
                f"{type(self).__name__}.__init__ did not call `super().__init__()`, which sets up what "
                "SpeedupCallback needs (its seed, knob logging): call `super().__init__(seed=..., log_knobs=...)` "
                "(or `super().__init__()`) in the override."
            )
        if stage != "fit":
            return
        self._state_key_cache = None
        self._state_key_cache = self.state_key
        self._tell_siblings_apart(trainer)
        # set by this class's `on_train_batch_end` and `log_now`: `on_train_end` tells whether either ran
        self.__dict__.pop("_knobs_checked", None)
        self._knobs_logged, self._first_step = False, 0
        self._loaded_progress = self._loaded_length = self._loaded_length_epoch = None  # a checkpoint's, loaded later
        # a new fit works its run length out again (an override of `on_train_start` without `super()` included):
        # nothing is kept from an earlier fit of this instance
        self._total_steps, self._epochs_bound, self._anchor = None, None, (0, 0.0)
        self._anchor_epoch: int | None = None
        self._length_key: tuple[int, Any] | None = None  # what the run's length was worked out for (`_loader_key`)
        self._reloading = bool(trainer.reload_dataloaders_every_n_epochs)
        # each fit takes the process seed anew (unless one was given); a resume then restores the saved one
        if self._given_seed is not None:
            self.seed = self._given_seed
        elif trainer.world_size > 1:
            # rank zero's process seed on every rank (their draws differ by rank): the seed a checkpoint keeps,
            # saved by rank zero, is then every rank's, and a resumed rank draws what it would have
            self.seed = int(trainer.strategy.broadcast(_process_seed(), src=0))
        else:
            self.seed = _process_seed()
        if self.transforms_batches:
            if is_param_in_hook_signature(pl_module.training_step, "dataloader_iter", explicit=True):
                raise RuntimeError(
                    f"{type(self).__name__} replaces training batches, but `training_step` takes "
                    "`dataloader_iter` and so never receives a batch from Lightning. Take `batch` in "
                    "`training_step`, or remove this callback."
                )
            seam.install(trainer, self)

    def _tell_siblings_apart(self, trainer: pl.Trainer) -> None:
        """Two instances of one class in a trainer: their own random streams, and their own names in the logs
        (``mixup``, ``mixup_2``, in callback order)."""
        siblings = [cb for cb in trainer.callbacks if type(cb) is type(self)]
        index = next((i for i, cb in enumerate(siblings) if cb is self), 0)
        if index > 0:  # the first draws what it would alone; each later one from its settings' own stream
            # (two instances with the same state key never get here: Lightning refuses them in `Trainer(...)`)
            self._salt_cache = zlib.crc32(f"{self._class_id()}#{self.state_key}".encode())
        else:
            self.__dict__.pop("_salt_cache", None)
        # in the logs, any callbacks that would log under one name (a subclass keeps its parent's `log_name`)
        name = self._base_log_name()
        namesakes = [cb for cb in trainer.callbacks if isinstance(cb, SpeedupCallback) and cb._base_log_name() == name]
        self._log_index = next((i for i, cb in enumerate(namesakes) if cb is self), 0)

    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self._leave_fit(trainer)

    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException) -> None:
        # Lightning skips `teardown` when fit raises: take the seam out here, or the strategy keeps our wrapper
        self._leave_fit(trainer)

    def _leave_fit(self, trainer: pl.Trainer) -> None:
        self._state_key_cache = None
        if self.transforms_batches:
            seam.uninstall(trainer, self)

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.transforms_batches and not any(cb is self for cb in seam.active_transforms(trainer)):
            raise RuntimeError(
                f"{type(self).__name__} overrides `transform_batch`, but its `setup` did not call "
                "`super().setup(trainer, pl_module, stage)`, which installs the seam that calls it: no batch would "
                "be transformed. Call `super().setup(...)` in the override."
            )
        self._refresh_total_steps(trainer)
        self._first_step = trainer.global_step  # a resumed run's (see `on_train_end`)
        epochs = training_epochs(trainer)
        # said at the first read of progress (a callback whose schedule never reads it has nothing to warn about)
        self._unsized_bound = (
            epochs
            if not math.isfinite(trainer.num_training_batches)
            and self._total_steps is not None
            and math.isfinite(self._total_steps)
            and epochs is not None
            and epochs >= 0
            else None
        )
        # resumed after a reload: the earlier epochs' lengths are gone, the checkpoint kept where they led
        if self._loaded_progress is not None and trainer.reload_dataloaders_every_n_epochs:
            resumed = self._schedule_at(trainer, trainer.current_epoch)
            assert resumed is not None
            # its length, anchor and how the length was worked out; the loader key and bound stay this loader's
            for name in ("_total_steps", "_anchor", "_anchor_epoch", "_length_args", "_length_batches"):
                setattr(self, name, resumed[name])
        self._loaded_progress = None

    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # The loader may have been reloaded (reload_dataloaders_every_n_epochs) with another length.
        if trainer.reload_dataloaders_every_n_epochs:
            self._refresh_total_steps(trainer, reloaded=True)

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # an override of `on_train_batch_end` that skips `super()` leaves the knobs unlogged, without a word
        if (
            self.log_knobs
            and trainer.loggers
            and trainer.log_every_n_steps
            and trainer.global_step > self.__dict__.get("_first_step", 0)  # a step in this fit (not a resumed end)
            and "_knobs_checked" not in self.__dict__
            and self.__dict__.get("_knobs_logged") is False
            and self.knobs()
        ):
            self.warn(
                f"logged none of its knobs ({', '.join(self.knobs())}) in this fit: does an override of "
                "`on_train_batch_end` skip `super().on_train_batch_end(...)`, which logs them?"
            )

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if self.log_knobs and trainer.loggers:
            if _should_log(trainer):
                self.log_now(trainer)
            elif "_knobs_checked" not in self.__dict__ and trainer.log_every_n_steps:
                # a knob loggers cannot take fails at the first step, not at the first logging step (step 50)
                self._as_metrics(self.knobs())
                self._knobs_checked = True


_MISSING = object()


def _is_default(value: Any, default: Any) -> bool:
    if value is default:
        return True
    empty = (list, tuple, set, frozenset, dict)
    if isinstance(value, empty) and isinstance(default, empty) and not value and not default:
        return True  # () kept as frozenset()
    if all(isinstance(v, int | float) and not isinstance(v, bool) for v in (value, default)):
        return bool(value == default)  # 5 kept as 5.0
    try:
        return type(value) is type(default) and bool(value == default)
    except Exception:  # arrays and tensors compare element-wise; an odd `__eq__` may raise anything
        return False


def _same_setting(a: Any, b: Any) -> bool:
    """Whether two values of a callback setting are the same, as far as can be told: arrays and tensors by value
    (NaN equal to NaN), lists, tuples, dicts and ``functools.partial`` item by item, functions and classes by
    identity, and two instances of a class that compares by identity only (two ``LossScore()``) by their reprs
    less their addresses."""
    try:
        return _same(a, b)
    except RecursionError:  # a list that holds itself
        return False


def _same(a: Any, b: Any) -> bool:
    if _is_default(a, b) or all(isinstance(v, float | np.floating) and math.isnan(v) for v in (a, b)):
        return True  # NaN settings (two NaN objects) are one setting, as NaN entries of arrays are
    if isinstance(a, np.ndarray | torch.Tensor) or isinstance(b, np.ndarray | torch.Tensor):
        return _same_array(a, b)
    if isinstance(a, list | tuple) and type(a) is type(b):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, functools.partial) and isinstance(b, functools.partial):
        return _same(a.func, b.func) and _same(a.args, b.args) and _same(a.keywords, b.keywords)
    if isinstance(a, type) or _is_function(a):
        return False  # functions, methods, builtins, numpy's functions, classes: `_is_default` compared identity
    if type(a) is type(b) and type(a).__eq__ is object.__eq__:
        try:
            ra, rb = repr(a), repr(b)
        except Exception:  # a repr that raises: nothing tells
            return False
        return _ADDRESS.sub("", ra) == _ADDRESS.sub("", rb)
    return False


def _is_function(value: Any) -> bool:
    return isinstance(value, types.FunctionType | types.MethodType | types.BuiltinFunctionType | np.ufunc) or (
        type(value).__name__ == "_ArrayFunctionDispatcher"  # numpy's functions (np.mean)
    )


def _same_array(a: Any, b: Any) -> bool:
    try:
        x, y = (torch.as_tensor(v).detach().cpu() for v in (a, b))
    except Exception:  # strings, objects, byte orders torch does not take: numpy's own comparison
        try:
            x_, y_ = np.asarray(a), np.asarray(b)
            if x_.dtype == object or y_.dtype == object:  # entries of any kind: each compared as a setting
                return x_.shape == y_.shape and _same(x_.tolist(), y_.tolist())
            return x_.shape == y_.shape and bool(np.array_equal(x_, y_))
        except Exception:
            return False
    try:
        if x.shape != y.shape:
            return False
        common = torch.promote_types(x.dtype, y.dtype)
        x, y = x.to(common), y.to(common)
        same = x == y
        if common.is_floating_point or common.is_complex:
            same |= x.isnan() & y.isnan()
        return bool(same.all())
    except Exception:  # sparse or meta tensors: not the same
        return False


_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")


def _short_repr(value: Any) -> str:
    """``repr(value)``, or ``<type>`` for a long one (an array, a label list) or one whose repr raises."""
    try:
        text = repr(value)
    except Exception:  # a repr must not raise, whatever a setting holds
        text = ""
    return text if 0 < len(text) <= 100 else f"<{type(value).__name__}>"


def _is_number(value: Any) -> bool:
    try:
        float(value)
    except (TypeError, ValueError, RuntimeError):
        return False
    return True


def _process_seed() -> int:
    """The process's torch seed (what ``seed_everything`` set), as a non-negative 63-bit int."""
    return torch.initial_seed() % 2**63


def _should_log(trainer: pl.Trainer) -> bool:
    """Lightning's ``should_update_logs`` at the end of a training batch, without its property chain.

    Every ``SpeedupCallback`` asks this at every step, so it is worth a few µs: inside ``on_train_batch_end`` the
    active loop is always the fit loop, which is the only case of Lightning's rule needed here.
    """
    every = trainer.log_every_n_steps
    if not every:
        return False
    epoch_loop = getattr(getattr(trainer, "fit_loop", None), "epoch_loop", None)
    stepped = getattr(epoch_loop, "_batches_that_stepped", None)
    if stepped is None:  # not a Lightning trainer as we know it: its own answer
        return bool(trainer._logger_connector.should_update_logs)
    if not ((stepped + 1) % every == 0 or trainer.should_stop):
        return False
    # Lightning logs a step's metrics once, on the batch that steps the optimizer, not on accumulating ones
    return not (epoch_loop._should_accumulate() and trainer.lightning_module.automatic_optimization)
