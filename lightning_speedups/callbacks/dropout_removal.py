"""Dropout removal: from a point in training on, switch every dropout of the model off."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from lightning.pytorch.utilities import rank_zero_info

from lightning_speedups import _checks
from lightning_speedups.base import SpeedupCallback
from lightning_speedups.functional.dropout import (
    DropoutSite,
    disable_dropout,
    find_dropout,
    rates_set_back,
    restore_dropout,
    unhandled_dropout,
)
from lightning_speedups.seam import has_weight_averaging, updating_batchnorm_only

if TYPE_CHECKING:
    import lightning.pytorch as pl


class DropoutRemoval(SpeedupCallback):
    """Turn off every dropout of the model once training progress reaches ``start``.

    Switched off: ``nn.Dropout``, ``nn.Dropout1d/2d/3d``, ``nn.AlphaDropout``, ``nn.FeatureAlphaDropout``, the
    attention dropout of ``nn.MultiheadAttention`` (so all the dropouts of ``nn.Transformer*Layer``), the
    inter-layer dropout of ``nn.RNN/LSTM/GRU``, ``torchvision.ops`` ``StochasticDepth``, ``DropBlock2d`` and
    ``DropBlock3d``, timm-style ``DropPath`` and ``DropBlock2d`` (a float ``drop_prob``), timm models' head
    dropout (``drop_rate``), and float ``dropout``/``attention_dropout``/``dropout_p``/``activation_dropout``/
    ``hidden_dropout``/``layerdrop`` attributes (see :mod:`lightning_speedups.functional.dropout`). Each
    probability is set to 0 in place; the original values come back at the end of ``fit`` (``teardown``), so
    a later ``fit`` starts as the first did.

    Progress is the trainer's own (restored on resume), so a run resumed after ``start`` has dropout off from
    its first step, and one resumed before ``start`` keeps dropout until ``start``.

    When it helps: the dropout masks cost memory bandwidth, most in transformers and MLPs (a 2-layer transformer
    encoder on CPU: +30 to +75% step time with dropout 0.1); short runs and single-epoch pre-training, where
    there is no over-fitting for dropout to prevent (Cramming, Geiping & Goldstein 2022); ``start=0.8`` or so
    as a late "no regularisation" phase. When it hurts: small data sets and long schedules, where dropout is
    the regulariser that keeps validation accuracy up; convolutional networks gain little speed (they seldom
    use dropout).

    Args:
        start: training progress (0 = first step, 1 = end) from which dropout is off; 1 never removes it (the
            last step is at progress < 1), which turns the callback off.
        log_knobs: log ``removed`` (how many dropouts it switched off, 0 before ``start``).

    Example::

        import lightning.pytorch as pl
        from lightning_speedups import DropoutRemoval
        from lightning_speedups.demo import DigitsDataModule, ImageClassifier

        # the classifier's dropout (0.3) is on for the first half of training and off for the second
        trainer = pl.Trainer(max_epochs=2, callbacks=[DropoutRemoval(start=0.5)], logger=False)
        trainer.fit(ImageClassifier(dropout=0.3), datamodule=DigitsDataModule(size=8))
    """

    log_name = "dropout_removal"

    def __init__(self, start: float = 0.0, *, log_knobs: bool = True) -> None:
        super().__init__(log_knobs=log_knobs)
        self.start = _checks.in_range("start", start, 0.0, 1.0, hint="It is a fraction of training progress.")
        self._removed: list[DropoutSite] = []
        self._given_back = 0  # how many the last fit switched off, after it put them back
        self._done = False
        self._rescan = False  # a new epoch began after the removal: look for dropouts added since
        self._verify = self._warned_back = self._checked_epoch = False  # the checks for rates set back
        self._last_index, self._max_steps = math.inf, -1
        self._weight_averaging = False  # a StochasticWeightAveraging callback: its BatchNorm epoch is left alone

    @property
    def removed(self) -> int:
        """How many dropouts this callback switched off (0 before ``start``; after ``fit``, how many that fit
        switched off, on again now)."""
        return len(self._removed) or self._given_back

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        super().setup(trainer, pl_module, stage)
        if stage == "fit":
            self._removed, self._done, self._rescan, self._given_back = [], False, False, 0
            self._verify = self._warned_back = self._checked_epoch = False
            self._last_index, self._max_steps = math.inf, -1  # until the first epoch starts

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        super().on_train_start(trainer, pl_module)
        # a fit resumed mid-epoch gets no `on_train_epoch_start` for that epoch: its last step is known from here
        self._last_index, self._max_steps = trainer.num_training_batches - 1, trainer.max_steps
        self._weight_averaging = has_weight_averaging(trainer)
        # Here rather than in setup: modules built in `configure_model` exist by now.
        if self.start >= 1.0:  # progress stays below 1 through the last step: a setting that turns it off
            rank_zero_info("DropoutRemoval(start=1.0) never removes dropout: the last step is at progress < 1.")
            return
        sites = find_dropout(pl_module)
        unknown = unhandled_dropout(pl_module) + _hparam_rates(pl_module, {site.value for site in sites})
        listed = ", ".join(unknown[:5]) + (f" and {len(unknown) - 5} more" if len(unknown) > 5 else "")
        if not any(site.value > 0 for site in sites):
            self.warn(
                "the model has no dropout with a non-zero probability that this callback can switch off; there "
                "is nothing to remove."
                + (f" These attributes look like dropout rates it does not know: {listed}." if unknown else "")
            )
        elif unknown:
            self.warn(
                f"these attributes look like dropout rates but are not switched off: {listed}. If `forward` "
                "applies them (e.g. `F.dropout(x, self.<name>)`), that dropout stays on; hold it in an "
                "`nn.Dropout` module, or under one of `lightning_speedups.functional.dropout.FLOAT_ATTRIBUTES`."
            )

    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        if self._done:
            if self._rescan:
                self._rescan = False
                self._remove_added(pl_module)
            return
        if self.start >= 1.0 or (self._weight_averaging and updating_batchnorm_only(trainer)):
            return  # off; or SWA's extra BatchNorm epoch (progress 1), which keeps the dropout training ended with
        # start=0 needs no progress: it works on runs of unknown length (max_time, an iterable dataset) too
        if self.start > 0 and self.progress(trainer) < self.start:
            return
        self._removed, self._done, self._rescan = disable_dropout(pl_module), True, False
        self._verify = bool(self._removed)  # after this step's forward, which may set a rate back
        if self._removed:
            when = f" (progress {self.progress(trainer):.3f})" if self.start > 0 else ""
            rank_zero_info(
                f"DropoutRemoval: switched off {len(self._removed)} dropout(s) at step {trainer.global_step}{when}."
            )
            if self.log_knobs and trainer.loggers:
                self.log_now(trainer)

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if self._verify:
            self._verify = False
            # the epoch's last step too: the epoch-end fallback would come after its validation
            self._checked_epoch = self._last_step(trainer, batch_idx)
            self._check_set_back(
                pl_module, "during the step", "so that dropout is on again: does the model's `forward` set them?"
            )
        elif self._done and not self._warned_back and self._last_step(trainer, batch_idx):
            # after the epoch's last step, before its validation and the epoch-end hooks (where a per-epoch
            # schedule may set its rate for the next epoch, switched off again before that epoch's first step):
            # a rate found on here was set back by a step or a hook since the removal, and later steps trained
            # with it (the check after the first step after the removal catches only that step's)
            self._checked_epoch = True
            self._check_set_back(pl_module, "during this epoch", _LATER_STEPS)
        super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # an epoch whose last step was not known ahead (a loader of unknown length) or that stopped early
        # (`should_stop`, `max_time`): checked here, before the module's own `on_train_epoch_end`
        if self._done and not self._warned_back and not self._checked_epoch:
            self._check_set_back(pl_module, "during this epoch", _LATER_STEPS)
        super().on_train_epoch_end(trainer, pl_module)

    def _last_step(self, trainer: pl.Trainer, batch_idx: int) -> bool:
        """The epoch's last step: its loader ends, or ``max_steps`` stops the run (read at the epoch start)."""
        return batch_idx >= self._last_index or 0 <= self._max_steps <= trainer.global_step

    def _check_set_back(self, pl_module: pl.LightningModule, when: str, consequence: str) -> None:
        """Warn (once per fit) about the rates switched off that the model has set back."""
        back = rates_set_back(pl_module, self._removed)
        if back:
            self._warn_set_back(back, when, consequence)
            self._warned_back = True

    def _warn_set_back(self, back: list[DropoutSite], when: str, consequence: str) -> None:
        names = ", ".join(f"{site.name or '(model)'}.{site.attribute}" for site in back[:5])
        self.warn(
            f"{len(back)} dropout rate(s) switched off were set back by the model {when} ({names}"
            f"{' and more' if len(back) > 5 else ''}), {consequence} Set a rate once (in `__init__` or `setup`), not "
            "at every step or epoch."
        )

    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        super().on_train_epoch_start(trainer, pl_module)
        # A model that grows during training (a new head, a swapped block): its new dropouts go too, at the
        # epoch's first batch (after the module's own `on_train_epoch_start`, which may be where it grows). Once
        # per epoch, not per batch: a scan of every module costs more than a step of a small model.
        self._rescan = self._done
        self._checked_epoch = False
        # for the check after the epoch's last step: read once here, not at every step
        self._last_index, self._max_steps = trainer.num_training_batches - 1, trainer.max_steps

    def _remove_added(self, pl_module: pl.LightningModule) -> None:
        known = {(id(site.module), site.attribute) for site in self._removed}
        # rates set back since the epoch began (a per-epoch schedule in the module's `on_train_epoch_start`) are
        # switched off again before any step, and are not new: counted once, given back at their first value
        added = [site for site in disable_dropout(pl_module) if (id(site.module), site.attribute) not in known]
        if added:
            self._removed = [*self._removed, *added]
            rank_zero_info(f"DropoutRemoval: switched off {len(added)} dropout(s) added to the model since.")

    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self._give_back(pl_module)
        super().teardown(trainer, pl_module, stage)

    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException) -> None:
        self._give_back(pl_module)  # Lightning skips teardown when fit raises; the model still comes back whole
        super().on_exception(trainer, pl_module, exception)

    def _give_back(self, pl_module: pl.LightningModule) -> None:
        if self._removed:
            restore_dropout(pl_module, self._removed)
            self._given_back = len(self._removed)
        self._removed, self._done, self._rescan = [], False, False

    def knobs(self) -> dict[str, float]:
        return {"removed": float(self.removed)}

    def state_key_fields(self) -> dict[str, Any]:
        return {"start": self.start}

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "removed": self.removed}


#: what a rate set back during an epoch's steps means
_LATER_STEPS = (
    "so that its later steps may have trained with dropout (switched off again at the next epoch's first step, if "
    "any): does a step or hook set them?"
)


def _hparam_rates(pl_module: pl.LightningModule, handled: set[float]) -> list[str]:
    """``"hparams.<key>=<value>"`` for each saved hyperparameter named like a dropout rate (:data:`_RATE_NAME`)
    and that no dropout switched off here holds: the usual ``F.dropout(x, self.hparams.dropout)``. One
    equal to a handled rate is taken as what that module was built from (``nn.Dropout(self.hparams.dropout)``)."""
    hparams = getattr(pl_module, "hparams", None)
    if not isinstance(hparams, Mapping):
        return []
    return [
        f"hparams.{key}={value:g}"
        for key, value in hparams.items()
        if isinstance(key, str)
        and _RATE_NAME.search(key.lower())
        and isinstance(value, float)
        and 0.0 < value <= 1.0
        and not any(math.isclose(value, h, rel_tol=1e-6) for h in handled)  # float32 copies of the same rate
    ]


#: hyperparameter names of dropout rates (`dropout`, `attn_dropout`, `drop_rate`, `drop_prob`, `p_drop`), not of
#: other things that drop (`lr_drop_factor`)
_RATE_NAME = re.compile(r"dropout|drop_(rate|prob|p)$|^p_drop")
