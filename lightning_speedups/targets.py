"""Targets: checks that soft targets will work, class-count inference, and the base of target transforms.

MixUp, CutMix and LabelSmoothing turn class indices into class probabilities ``(N, C)``. Torch's cross entropy
(``nn.CrossEntropyLoss`` and ``F.cross_entropy``) takes those unchanged, so a user's ``training_step`` keeps
working. Some set-ups cannot take them, and we say so at fit start rather than crash mid-run:

* a torch loss that takes class indices only, held as a module attribute (a submodule of the LightningModule,
  subclasses included): ``nn.NLLLoss``, ``nn.MultiMarginLoss``, ``nn.MultiLabelMarginLoss``, ``nn.CTCLoss``,
  ``nn.AdaptiveLogSoftmaxWithLoss``, and timm's ``LabelSmoothingCrossEntropy``. A loss called as a function
  inside ``training_step`` (``F.nll_loss(logits, y)``) cannot be seen from outside, and torch rejects the float
  targets at the first training step with its own message;
* ``nn.CrossEntropyLoss(ignore_index=k)`` with ``k >= 0``: torch refuses ``ignore_index`` with soft targets;
* ``nn.CrossEntropyLoss(weight=w)`` with ``reduction="mean"``: torch divides by the batch size for probability
  targets but by the sum of the targets' class weights for indices, so the loss would silently change;
* several training dataloaders (a list, a dict or a ``CombinedLoader`` of them), whose batches nest one batch
  per loader, unless ``batch_getter``/``batch_setter`` read them;
* training metrics that need hard labels: use :func:`hard_labels` on the target, or keep the original
  labels with ``hard_target_key=`` on a dict batch. A ``torchmetrics`` metric of the module called on the soft
  targets during training (``self.train_acc(logits, y)``) gets a warning at its first such call; one fed through
  ``update`` directly cannot be seen.
"""

from __future__ import annotations

import numbers
import re
import weakref
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from lightning.pytorch import LightningModule
from torch import Tensor, nn

from lightning_speedups import _checks
from lightning_speedups._rng import BatchRandom
from lightning_speedups.base import SpeedupCallback
from lightning_speedups.batch import BatchFieldError, BatchFields, BatchGetter, BatchSetter, Key, _write
from lightning_speedups.functional.mixing import index_range

if TYPE_CHECKING:
    import lightning.pytorch as pl


def hard_labels(target: Tensor) -> Tensor:
    """Class indices of a target: returned as is if already indices, else the most probable class.

    Use it for training metrics when a callback turned the labels into probabilities::

        self.train_acc(logits, hard_labels(y))
    """
    # (N,) float class indices are indices too: an argmax over them would make one number of the batch
    return target.argmax(dim=-1) if target.is_floating_point() and target.ndim >= 2 else target


def infer_num_classes(trainer: pl.Trainer, pl_module: pl.LightningModule) -> int | None:
    """``num_classes`` from the DataModule, the LightningModule or its ``hparams``; ``None`` if none says.

    The module's own attribute, where it has one, is the module's count: its hparams are read only without it (they
    may keep a signature default that ``setup`` replaced). Raises ``ValueError`` when the DataModule and the module
    say different numbers: which one the data has cannot be guessed.
    """
    found: dict[str, int] = {}
    datamodule = getattr(trainer, "datamodule", None)
    count = _class_count(getattr(datamodule, "num_classes", None)) if datamodule is not None else None
    if count is not None:
        found["the DataModule"] = count
    # the module's own attribute (set in its `setup`, say) over its hparams (which may keep a signature default)
    count = _class_count(getattr(pl_module, "num_classes", None))
    where = "the LightningModule"
    if count is None:
        hparams = getattr(pl_module, "hparams", None)
        count = _class_count(hparams.get("num_classes")) if isinstance(hparams, Mapping) else None
        where = "the LightningModule's hparams"
    if count is not None:
        found[where] = count
    if len(set(found.values())) > 1:
        said = ", ".join(f"{where} {count}" for where, count in found.items())
        raise ValueError(
            f"The number of classes differs between its sources ({said}): make them agree, or pass "
            "`num_classes=` to the callback."
        )
    return next(iter(found.values()), None)


def _given_num_classes(trainer: pl.Trainer) -> int | None:
    """The ``num_classes`` given to the trainer's target-transforming callbacks; ``ValueError`` if they differ."""
    given = {
        f"{type(cb).__name__}(num_classes={cb.num_classes})": cb.num_classes
        for cb in trainer.callbacks
        if isinstance(cb, TargetTransformCallback) and cb.transforms_batches and cb.num_classes is not None
    }
    if len(set(given.values())) > 1:
        raise ValueError(
            f"The callbacks were given different numbers of classes ({', '.join(given)}): give them all the same."
        )
    return next(iter(given.values()), None)


def _class_count(value: Any) -> int | None:
    """``value`` as a number of classes (> 1): an int, or a whole float (``4.0`` from a YAML config)."""
    if isinstance(value, bool | np.bool_) or not isinstance(value, numbers.Real):
        return None
    if float(value).is_integer() and value > 1:
        return int(value)
    return None


def _is_timm_smoothing_loss(m: nn.Module) -> bool:
    # timm's LabelSmoothingCrossEntropy: integer targets only, smoothing in `smoothing` and `confidence`, which sum
    # to 1 (a LightningModule or a layer with attributes of those names is not one)
    if isinstance(m, nn.CrossEntropyLoss | LightningModule):
        return False
    values = (getattr(m, "smoothing", None), getattr(m, "confidence", None))
    if not all(_checks.is_real(v) for v in values):
        return False
    return abs(float(values[0]) + float(values[1]) - 1.0) < 1e-6


def cross_entropy_modules(pl_module: nn.Module) -> list[nn.Module]:
    """``nn.CrossEntropyLoss`` submodules, and timm-style ones (``smoothing`` + ``confidence`` attributes)."""
    return [m for m in pl_module.modules() if isinstance(m, nn.CrossEntropyLoss) or _is_timm_smoothing_loss(m)]


#: torch losses whose targets can only be class indices (``nn.CrossEntropyLoss`` also takes probabilities).
INDEX_ONLY_LOSSES: tuple[type[nn.Module], ...] = (
    nn.NLLLoss,
    nn.MultiMarginLoss,
    nn.MultiLabelMarginLoss,
    nn.CTCLoss,
    nn.AdaptiveLogSoftmaxWithLoss,
)


def check_double_smoothing(pl_module: nn.Module, who: str, *, warn: Callable[[str], None] | None = None) -> None:
    """Raise (or ``warn``) if a cross entropy of ``pl_module`` smooths too: with ``who`` putting label smoothing
    in the targets, they would be smoothed twice."""
    for name, m in pl_module.named_modules():
        if not (isinstance(m, nn.CrossEntropyLoss) and m.label_smoothing > 0):
            continue
        where = f"`{name}`" if name else "the LightningModule"
        # the built-in presets' smoother; a user's own is taken out of a preset as the preset allows
        preset_hint = (
            " (from a preset: `presets.get(name, LabelSmoothing=None)`)"
            if who.partition("(")[0] == "LabelSmoothing"
            else ""
        )
        message = (
            f"puts label smoothing in the targets, but {where} already has `label_smoothing="
            f"{m.label_smoothing}`: targets would be smoothed twice. Set one of them only: remove the callback "
            f"and let the loss smooth{preset_hint}, or set the loss's `label_smoothing=0` (with "
            "`LabelSmoothing(method='loss')`, the callback then sets it for training steps only)."
        )
        if warn is None:
            raise ValueError(f"{who} {message}")
        warn(
            f"it {message} (Not refused: `check_loss=False`; ignore this if that loss is not used in `training_step`.)"
        )


def check_soft_target_losses(pl_module: nn.Module, who: str, *, smoothing_in_targets: bool) -> None:
    """Raise if a loss module of ``pl_module`` cannot take probability targets, would weight them differently
    than class indices, or would smooth them twice; ``smoothing_in_targets`` is True for label smoothing."""
    if smoothing_in_targets:  # first: `check_loss=False`, the fix of the errors below, does not waive it
        check_double_smoothing(pl_module, who)
    for name, m in pl_module.named_modules():
        where = f"`{name}`" if name else "the LightningModule"
        if isinstance(m, INDEX_ONLY_LOSSES):
            raise ValueError(
                f"{who} gives class probabilities as targets, but {where} is a `{type(m).__name__}`, which needs "
                "class indices. Use `nn.CrossEntropyLoss` on logits (it takes probabilities), or pass "
                "`check_loss=False` if this loss is not used in `training_step`."
            )
        if _is_timm_smoothing_loss(m):
            raise ValueError(
                f"{who} gives class probabilities as targets, but {where} is a `{type(m).__name__}`, which needs "
                "class indices. Use `nn.CrossEntropyLoss` (it takes probabilities; timm's `SoftTargetCrossEntropy` "
                "does too), or pass `check_loss=False` if this loss is not used in `training_step`."
            )
        if isinstance(m, nn.CrossEntropyLoss) and m.ignore_index >= 0:
            smoothing_route = "or use `LabelSmoothing(method='loss')`, " if smoothing_in_targets else ""
            raise ValueError(
                f"{who} gives class probabilities as targets, but {where} has `ignore_index="
                f"{m.ignore_index}`, which torch does not support with probability targets. Remove "
                f"`ignore_index`, {smoothing_route}"
                "or pass `check_loss=False` if this loss is not used in `training_step`."
            )
        if isinstance(m, nn.CrossEntropyLoss) and m.weight is not None and m.reduction == "mean":
            fix = (
                "For label smoothing alone use `LabelSmoothing(method='loss')`, which keeps the labels and equals "
                "torch's `label_smoothing` with class weights; otherwise"
                if smoothing_in_targets
                else "Instead,"
            )
            raise ValueError(
                f"{who} gives class probabilities as targets, but {where} has class weights (`weight=`) and "
                "`reduction='mean'`: torch divides the weighted loss by the batch size for probability targets but "
                "by the sum of the targets' class weights for class indices, so the loss and its scale would "
                f"silently change. {fix} drop `weight` and weight the per-sample losses yourself "
                "(`reduction='none'`), or pass `check_loss=False` to accept torch's weighting of probability "
                "targets (divided by the batch size)."
            )


#: torch's messages about tensors whose sizes differ (a broadcast, an elementwise comparison, a loss's shapes)
_SIZES_DIFFER = re.compile(r"must match the size|shape|size mismatch|same size|sizes? of tensors?", re.I)


def _out_of_range(who: str, num_classes: int, low: int, high: int) -> ValueError:
    hint = ""
    if low < 0:
        hint = " (negative labels usually mean `ignore_index`, which soft targets cannot keep"
        if who == "LabelSmoothing":
            hint += ": LabelSmoothing(method='loss') smooths through your `nn.CrossEntropyLoss(ignore_index=...)`"
        hint += ")"
    return ValueError(
        f"{who}: class indices must lie in [0, {num_classes}), found values in [{low}, {high}]{hint}. Fix "
        "`num_classes` or the labels."
    )


class TargetTransformCallback(SpeedupCallback):
    """Base of callbacks that change a classification batch's targets (and maybe its inputs).

    It holds what MixUp, CutMix and LabelSmoothing share: a probability ``p`` of acting on a batch, a
    ``[start, end)`` window in training progress, the number of classes (given or inferred), where the
    batch keeps its input and target, and the fit-start and first-batch checks.

    Args:
        p: chance of acting on each training batch, in [0, 1].
        start: training progress (0 = first step, 1 = end) from which it acts.
        end: training progress from which it stops acting.
        num_classes: number of classes. ``None`` infers it from ``num_classes`` on the DataModule or the
            LightningModule (or its ``hparams``), which must agree, else from the width of probability targets.
        input_key: where the batch keeps its input (see :class:`~lightning_speedups.BatchFields`).
        target_key: where the batch keeps its target.
        batch_getter: ``getter(batch) -> (input, target)`` for custom batches, with ``batch_setter``.
        batch_setter: ``setter(batch, input, target) -> new batch``.
        hard_target_key: for dict batches, also store the original targets under this key (for metrics).
        check_loss: at fit start, refuse loss modules that cannot take probability targets.
        seed: seed of the random draws (see :class:`~lightning_speedups.SpeedupCallback`).
        log_knobs: log the callback's knobs through the trainer's loggers.
    """

    #: whether this callback's transform needs the inputs (MixUp, CutMix) or only the targets; a target-only
    #: technique sets it to False: its input is then not read, nor checked to be floating point.
    mixes_inputs: bool = True
    #: whether it smooths the targets (LabelSmoothing): a loss module with ``label_smoothing`` is then refused
    #: at fit start, since the targets would be smoothed twice.
    smooths_targets: bool = False

    def __init__(
        self,
        *,
        p: float = 1.0,
        start: float = 0.0,
        end: float = 1.0,
        num_classes: int | None = None,
        input_key: Key | None = None,
        target_key: Key | None = None,
        batch_getter: BatchGetter | None = None,
        batch_setter: BatchSetter | None = None,
        hard_target_key: str | None = None,
        check_loss: bool = True,
        seed: int | None = None,
        log_knobs: bool = True,
    ) -> None:
        super().__init__(seed=seed, log_knobs=log_knobs)
        self.p = _checks.probability("p", p)
        self.start, self.end = _checks.window(start, end)
        self.num_classes = _checks.optional_int("num_classes", num_classes, minimum=2)
        self._classes: int | None = self.num_classes  # the number in use: given, or inferred at each fit
        self.fields = BatchFields(input_key, target_key, batch_getter, batch_setter)
        if hard_target_key is not None and not isinstance(hard_target_key, str):
            raise TypeError(f"`hard_target_key` must be a str key of a dict batch, got {hard_target_key!r}.")
        if hard_target_key is not None and hard_target_key in (input_key, target_key):
            which = "target_key" if hard_target_key == target_key else "input_key"
            raise ValueError(
                f"`hard_target_key` and `{which}` are both {hard_target_key!r}: the kept labels would be overwritten "
                f"by the new targets (or inputs). Give `hard_target_key` a key of its own, e.g. "
                f"{hard_target_key + '_hard'!r}."
            )
        self.hard_target_key = hard_target_key
        self.check_loss = _checks.flag("check_loss", check_loss)
        self._checked_first_batch = False
        self._target_kinds: set[tuple[Any, ...]] = set()  # kinds of targets checked in full this fit
        self._applied = 0.0

    # ------------------------------------------------------------------ to implement
    def apply(self, x: Tensor, target: Tensor, num_classes: int, trainer: pl.Trainer) -> tuple[Tensor, Tensor]:
        """Return the new ``(input, target)`` for a batch this callback acts on."""
        raise NotImplementedError

    # ------------------------------------------------------------------ scheduling
    def in_window(self, trainer: pl.Trainer) -> bool:
        """Whether training progress lies in ``[start, end)``, where this callback acts."""
        if self.start == 0.0 and self.end == 1.0:
            return True
        return self.start <= self.progress(trainer) < self.end

    def draw_active(self, trainer: pl.Trainer) -> bool:
        """In the window, and the per-batch coin with probability ``p`` came up."""
        if not self.may_act or not self.in_window(trainer):
            return False
        return self.p == 1.0 or self.batch_random(trainer).random() < self.p

    def technique_random(self, trainer: pl.Trainer) -> BatchRandom:
        """This batch's draws for :meth:`apply`, past the coin that decided ``p``.

        :meth:`batch_random` restarts the batch's stream, whose first draw is that coin (always below ``p``
        when ``apply`` runs): draws taken from it directly would be biased. This skips the coin, whether or not
        ``p < 1`` drew it, so the technique's draws are the same for every ``p``.
        """
        rng = self.batch_random(trainer)
        rng.random()
        return rng

    # ------------------------------------------------------------------ Lightning hooks
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        super().setup(trainer, pl_module, stage)
        if stage != "fit":
            return
        if self.hard_target_key is not None and self.transforms_batches:
            self._check_hard_target_order(trainer)
        if self.smooths_targets:
            self._check_single_smoother(trainer)
        self._checked_first_batch = False
        self._fit_started = False

    @property
    def may_act(self) -> bool:
        """Whether this callback can change any batch; ``p=0`` (a config or sweep turning it off) cannot."""
        return self.p > 0.0

    def _check_single_smoother(self, trainer: pl.Trainer) -> None:
        """Two callbacks that smooth the targets in the same part of training would smooth them twice."""
        if not self.may_act:
            return
        for other in trainer.callbacks:
            if other is self or not getattr(other, "smooths_targets", False) or not getattr(other, "may_act", True):
                continue
            if max(self.start, other.start) < min(self.end, other.end):  # both may act on the same step
                pair = (
                    f"Two {type(self).__name__} callbacks"
                    if type(other) is type(self)
                    else f"{type(self).__name__} and {type(other).__name__}, which both smooth the targets,"
                )
                raise ValueError(
                    f"{pair} act in the same part of training ({self.start:g}-{self.end:g} and "
                    f"{other.start:g}-{other.end:g}): the targets would be smoothed twice. Keep one, or give them "
                    "windows that do not overlap (`start`/`end`)."
                )

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        super().on_fit_start(trainer, pl_module)
        self._fit_started = True
        # Here rather than in setup: the module's own `setup` and `configure_model` (which run after the callbacks'
        # `setup`) may be where its `num_classes` and its loss come from.
        # the counts given to our callbacks that change the targets (this one's included), which must agree
        given = _given_num_classes(trainer) if self.transforms_batches else None
        if self.num_classes is not None or not self.transforms_batches:
            self._classes = self.num_classes  # a technique that leaves the targets alone needs no class count
            if self.transforms_batches and self.may_act:
                self._check_given_against_sources(trainer, pl_module)
        else:
            # the model's and the data's count, else one given to a sibling (MixUp(num_classes=10) before a
            # LabelSmoothing): not the width of the first probabilities, which a MixUp with p < 1 may not give
            self._classes = infer_num_classes(trainer, pl_module) or given
        # counts that differ fail here, not at the first batch a sibling mixes (with p < 1, a step the seed picks);
        # one given to this callback is among `given`, so a count that differs is one read from the model
        if given is not None and self._classes is not None and given != self._classes:
            raise ValueError(
                f"{type(self).__name__} counts {self._classes} classes (from the model or DataModule), another "
                f"callback was given num_classes={given}: give them all the number of classes the model's logits "
                "have."
            )
        if self.check_loss and self.may_act:  # p=0 turns the callback off: nothing it would change to check
            self.check_module(pl_module)
        elif self.may_act and self.smooths_targets and self.transforms_batches:
            # `check_loss=False` is for losses not used in training: one that smooths may be, so say so
            check_double_smoothing(pl_module, type(self).__name__, warn=self.warn)

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        super().on_train_start(trainer, pl_module)
        if self.__dict__.get("_fit_started") is False:
            raise RuntimeError(
                f"{type(self).__name__} overrides `on_fit_start` without calling "
                "`super().on_fit_start(trainer, pl_module)`, where the number of classes is inferred and the loss "
                "is checked: call it in the override."
            )
        if self.transforms_batches and self.fields.getter is None:
            self.check_single_loader(trainer, "training batches with one input and one target")
        if self.may_act and (self.start, self.end) != (0.0, 1.0):
            self.progress(trainer)  # a window needs a finite run length: refused here, not at the first batch
        self._watch_metrics(trainer, pl_module)

    def _watch_metrics(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Watch the module's torchmetrics metrics for the soft targets: an accuracy fed them reads 0, silently."""
        self._unwatch_metrics()
        # one watch per module: with MixUp and LabelSmoothing, one metric call warned twice
        sources = [
            cb
            for cb in trainer.callbacks
            if isinstance(cb, TargetTransformCallback) and cb.transforms_batches and cb.may_act
        ]
        if not sources or sources[0] is not self:
            return
        self._metric_sources = ", ".join(dict.fromkeys(type(cb).__name__ for cb in sources))
        from torchmetrics import Metric

        self._metric_trainer, self._metric_warned = trainer, False
        watch = _MetricTargetWatch(self)
        self._metric_hooks = [
            m.register_forward_pre_hook(watch, with_kwargs=True)
            for m in pl_module.modules()
            if isinstance(m, Metric) and _takes_labels(m)
        ]

    def _check_metric_target(self, metric: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        trainer = self.__dict__.get("_metric_trainer")
        if self._metric_warned or trainer is None or not trainer.training or self._classes is None:
            return
        target = args[1] if len(args) > 1 else kwargs.get("target")
        soft = isinstance(target, Tensor) and target.is_floating_point() and target.ndim == 2
        if soft and target.shape[-1] == self._classes:
            self._metric_warned = True
            self.warn(
                f"the module's {type(metric).__name__} got class probabilities (N, {self._classes}) as its target "
                f"during training (made by {self._metric_sources}); a metric such as accuracy needs the labels "
                "(on soft targets it reads 0): pass `lightning_speedups.hard_labels(y)`, or keep the labels with "
                "`hard_target_key=` on a dict batch."
            )

    def _unwatch_metrics(self) -> None:
        for handle in self.__dict__.get("_metric_hooks", []):
            handle.remove()
        self._metric_hooks, self._metric_trainer = [], None

    def _leave_fit(self, trainer: pl.Trainer) -> None:
        self._unwatch_metrics()
        super()._leave_fit(trainer)

    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException) -> None:
        super().on_exception(trainer, pl_module, exception)
        # The step that raised got our (N, C) probabilities: a loss whose logits have another width than C, or a
        # training accuracy `logits.argmax(1) == y`, fails in torch with a message about a shape that does not say
        # where the (N, C) targets came from.
        if not (
            self._applied
            and trainer.training  # a training step's error, not validation's after a mixed batch
            and self.transforms_batches  # not LabelSmoothing(method="loss"), which leaves the targets alone
            and self._classes is not None
            and isinstance(exception, (RuntimeError, ValueError))
            and hasattr(exception, "add_note")  # Python 3.11+
        ):
            return
        text, c = str(exception), self._classes
        if "target" in text or (_SIZES_DIFFER.search(text) and re.search(rf"\b{c}\b", text)):
            exception.add_note(
                f"{type(self).__name__} gave this training step class probabilities of shape (N, {c}) as targets "
                f"(num_classes={c}): if the logits have another number of classes, set `num_classes` to theirs; a "
                "loss that takes class indices only (`F.nll_loss`) cannot take them: `F.cross_entropy` on the logits "
                "can; a training metric that compares predictions with `y` needs the labels back: "
                "`lightning_speedups.hard_labels(y)`, or `hard_target_key=` on a dict batch."
            )

    def check_module(self, pl_module: pl.LightningModule) -> None:
        """Fit-start check of the module's losses; override to add technique-specific ones."""
        check_soft_target_losses(pl_module, type(self).__name__, smoothing_in_targets=self.smooths_targets)

    def _check_hard_target_order(self, trainer: pl.Trainer) -> None:
        # Batch transforms run in callback order: an earlier one that changes the targets without keeping them
        # would leave this callback only its (soft) output to keep under `hard_target_key`.
        for cb in trainer.callbacks:
            if cb is self:
                return
            if (
                isinstance(cb, TargetTransformCallback)
                and cb.transforms_batches
                and (cb.hard_target_key != self.hard_target_key)
            ):
                raise ValueError(
                    f"{type(self).__name__}(hard_target_key={self.hard_target_key!r}) runs after "
                    f"{type(cb).__name__}, which changes the targets first, so the kept targets would not be the "
                    f"original ones. Pass `hard_target_key={self.hard_target_key!r}` to {type(cb).__name__} (the "
                    "first of them) instead."
                )

    def transform_batch(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any) -> Any:
        original = batch
        # in full, values too: one device sync; not for a callback that never acts (p=0 turns it off in a config)
        if not self._checked_first_batch and self.may_act:
            self._check_batch(batch)
            self._checked_first_batch, self._target_kinds = True, {_kind(self._read(batch)[1])}
        if self.hard_target_key is not None:
            batch = self._keep_hard_target(batch)
        if not self.draw_active(trainer):
            self._applied = 0.0
            return batch  # passed through as it came: nothing to check
        x, target = self._read(batch)
        # Every batch the technique changes is checked cheaply (no sync): one whose targets are of another kind
        # (logits, another shape) or whose input and target sizes differ gets the first batch's checks and
        # messages, not a torch error deep inside the technique.
        # Kinds already checked pass (a MixUp before this callback alternates integer labels and probabilities).
        kind = _kind(target)
        if kind not in self._target_kinds or (self.mixes_inputs and _batch_size(x) != _batch_size(target)):
            self._check_batch(original)
            self._target_kinds.add(kind)
        num_classes = self._classes or target.shape[1]
        try:
            new_x, new_target = self.apply(x, target, num_classes, trainer)
        except (IndexError, RuntimeError) as err:  # a later batch with a label out of range (CPU; CUDA asserts)
            if target.is_floating_point() or not target.numel():
                raise
            low, high = index_range(target)
            if low >= 0 and high < num_classes:
                raise
            raise _out_of_range(type(self).__name__, num_classes, low, high) from err
        self._applied = 1.0
        return self.fields.replace(batch, input=new_x if self.mixes_inputs else None, target=new_target)

    def passthrough_batch(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any) -> Any:
        """A training batch that reaches ``training_step`` as it came (StochasticWeightAveraging's BatchNorm epoch,
        a batch size or learning-rate finder's trial): the labels are kept under ``hard_target_key`` all the same,
        since ``training_step`` reads them there."""
        self._applied = 0.0
        return batch if self.hard_target_key is None else self._keep_hard_target(batch)

    def _read(self, batch: Any) -> tuple[Any, Any]:
        """``(input, target)``; a technique that leaves the input alone reads only the target, so a batch whose
        input is not where `input_key` looks (or has several inputs) still works."""
        if self.mixes_inputs:
            return self.fields.get(batch)
        return None, self.fields.get_target(batch)

    def _keep_hard_target(self, batch: Any) -> Any:
        if not isinstance(batch, Mapping):
            raise TypeError(
                f"`hard_target_key` needs a dict batch, got {type(batch).__name__}. Use "
                "`lightning_speedups.hard_labels(y)` in `training_step` instead."
            )
        if self.hard_target_key in batch:
            return batch
        return _write(batch, {self.hard_target_key: self.fields.get_target(batch)})  # keeps the mapping's type

    # ------------------------------------------------------------------ first-batch checks
    def _check_batch(self, batch: Any) -> None:
        """Check the first training batch (values included, which costs one device sync, once)."""
        who = type(self).__name__
        x, target = self._read(batch)
        if self.fields.getter is not None:
            fix_target = fix_input = fix_keys = "`batch_getter`"
        else:
            fix_target, fix_input, fix_keys = "`target_key=`", "`input_key=`", "`input_key` and `target_key`"
        if target is None:
            raise ValueError(
                f"{who} found no target in the training batch ({type(batch).__name__}). Check {fix_target}."
            )
        if not isinstance(target, Tensor):
            raise TypeError(
                f"{who} needs a tensor target, got {type(target).__name__}. Check {fix_target}"
                + _nested_hint(target, fix_target)
            )
        if target.ndim == 0:
            raise ValueError(
                f"{who} needs a batch of targets, got a 0-d tensor (one label). Check {fix_target}, and that the "
                "DataLoader batches its samples (`batch_size` is not None)."
            )
        if self.mixes_inputs:
            if not isinstance(x, Tensor):
                raise TypeError(
                    f"{who} needs a tensor input, got {type(x).__name__}. Check {fix_input}"
                    + _nested_hint(x, fix_input)
                )
            if not x.is_floating_point():
                own = (  # only for an `apply` of the user's own: a subclass of MixUp or CutMix does mix inputs
                    ""
                    if type(self).apply.__module__.startswith("lightning_speedups.")
                    else (
                        f" If {type(self).__name__} changes only the targets, set its class attribute "
                        "`mixes_inputs = False`."
                    )
                )
                raise TypeError(
                    f"{who} mixes inputs, which must be floating point; got dtype {x.dtype}. Convert them to "
                    f"float in the dataset's transform or in `on_after_batch_transfer`.{own}"
                )
            if x.ndim == 0 or x.shape[0] != target.shape[0]:
                raise ValueError(
                    f"{who}: input of shape {tuple(x.shape)} and target of shape {tuple(target.shape)} do not "
                    f"share a batch dimension; check {fix_keys}."
                )
        self._check_hard_target_key(batch, who)
        if target.is_floating_point():
            self._check_probabilities(target, who)
        elif target.dtype in (torch.bool,) or target.is_complex() or target.ndim != 1:
            hint = "Dense or multi-label integer targets are not supported."
            if target.ndim == 2 and target.shape[1] == 1 and not target.is_complex():
                hint = "A column of labels (N, 1)? Give (N,) class indices: `y.squeeze(1)` in the dataset or collate."
            elif target.ndim == 2 and not target.is_complex():
                hint = (
                    "One-hot rows (`F.one_hot`) must be floating point to count as class probabilities: `y.float()`; "
                    "multi-label integer targets are not supported."
                )
            raise ValueError(
                f"{who} needs class indices (N,) of an integer dtype or class probabilities (N, C); got dtype "
                f"{target.dtype}, shape {tuple(target.shape)}. {hint}"
            )
        else:
            self._check_indices(target, who)

    def _check_hard_target_key(self, batch: Any, who: str) -> None:
        # With default keys the target (or input) is found by name: `hard_target_key` must not be, or be taken for,
        # that name once the kept labels are in the batch (e.g. "y", or "target" in a batch keyed "y").
        if self.hard_target_key is None or self.fields.getter is not None or not isinstance(batch, Mapping):
            return
        kept = {**batch, self.hard_target_key: None}
        for which in ("input", "target") if self.mixes_inputs else ("target",):
            read = self.fields.key_of(batch, which)
            fix = (
                f"Give `hard_target_key` a key of its own (e.g. {self.hard_target_key + '_hard'!r}), or name the "
                f"{which} with `{which}_key=`."
            )
            try:
                later = self.fields.key_of(kept, which)
            except BatchFieldError:  # another conventional name of the field: the batch would have two
                raise ValueError(
                    f"{who}(hard_target_key={self.hard_target_key!r}): {self.hard_target_key!r} is one of the names "
                    f"{'an' if which == 'input' else 'a'} {which} is found by, so the batch would have two "
                    f"{which}s ({read!r} and {self.hard_target_key!r}) once it holds the kept labels. {fix}"
                ) from None
            if self.hard_target_key in (read, later):
                raise ValueError(
                    f"{who}(hard_target_key={self.hard_target_key!r}): the batch's {which} is read from that key, "
                    f"so the kept labels and the new {which}s would share it. {fix}"
                )

    def _check_given_against_sources(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Warn at fit start where a ``num_classes=`` differs from the count the model and DataModule agree on: a
        wrong one would fail only at the first step (torch's "multi-target not supported"). Not an error: the
        count given is the user's word over an attribute that may count something else (background, a
        signature default the model's `setup` replaced)."""
        try:
            said = infer_num_classes(trainer, pl_module)
        except Exception:  # sources that disagree (the count given chooses between them), or a property that fails
            return
        if said is not None and said != self.num_classes:
            self.warn(
                f"num_classes={self.num_classes} was given, but the model or DataModule says {said} classes: the "
                f"targets get {self.num_classes} columns, which the loss refuses unless the logits have as many. "
                "Keep it if the model's count is not its logits' width; otherwise give the logits' width."
            )

    def _check_indices(self, target: Tensor, who: str) -> None:
        if self._classes is None:
            raise ValueError(
                f"{who} could not infer the number of classes: pass `num_classes=`, or set `num_classes` on "
                "the LightningModule (or its hparams) or the DataModule."
            )
        if target.numel():
            low, high = index_range(target)
            if low < 0 or high >= self._classes:
                raise _out_of_range(who, self._classes, low, high)
        passes_through = self.p < 1.0 or self.start > 0.0 or self.end < 1.0
        if target.dtype not in (torch.int64, torch.uint8) and passes_through:
            # the batches this callback changes train (float probabilities); the first one it leaves alone would
            # crash in the loss, however late in training that comes
            self.warn(
                f"class indices of dtype {target.dtype}: the batches it changes get float class probabilities, but "
                f"those it leaves as they are (p < 1, or outside start/end) go on as {target.dtype}, which torch's "
                "cross entropy refuses (it takes int64 class indices), unless a callback after it turns every batch "
                "into probabilities (a LabelSmoothing with p=1). Convert the labels with `y.long()` in the dataset "
                "or collate.",
                every_rank=True,
            )

    def _check_probabilities(self, target: Tensor, who: str) -> None:
        if target.ndim != 2:
            hint = " Class indices stored as floats? Make them integers: `y.long()`." if target.ndim == 1 else ""
            raise ValueError(
                f"{who}: floating-point targets must be class probabilities of shape (N, C), got shape "
                f"{tuple(target.shape)}. Regression or dense targets cannot be mixed or smoothed.{hint}"
            )
        if target.shape[1] < 2:
            raise ValueError(
                f"{who}: floating-point targets of shape {tuple(target.shape)} hold one column (a binary label for "
                "BCE?), not class probabilities over 2 or more classes. Give class indices (N,) with "
                "`num_classes=2`, or two-column probabilities (N, 2), and a cross entropy over classes."
            )
        if self._classes is not None and target.shape[1] != self._classes:
            raise ValueError(f"{who}: targets have {target.shape[1]} classes but `num_classes` is {self._classes}.")
        t = target.detach().float()
        if t.numel() and (bool((t < 0).any()) or bool((t > 1).any())):
            raise ValueError(f"{who}: probability targets must lie in [0, 1]; these do not (logits?).")
        sums = t.sum(1)
        # rows stored in a low precision (bf16 under `bf16-true`) round off by up to about one unit of it
        tolerance = max(1e-3, torch.finfo(target.dtype).eps)
        if sums.numel() and not torch.allclose(sums, torch.ones_like(sums), atol=tolerance):
            self.warn(
                f"the float targets' rows sum to {float(sums.min()):.4g}..{float(sums.max()):.4g}, not 1: they are "
                "mixed (and smoothed) as given, per class, which suits multi-label targets with a "
                "binary cross entropy; cross entropy over classes expects rows that sum to 1.",
                every_rank=True,  # this rank's first batch: another rank's may be fine
            )
        if self._classes is None:
            self._classes = int(target.shape[1])

    # ------------------------------------------------------------------ knobs and state
    def state_key_fields(self) -> dict[str, Any]:
        return {"p": self.p, "start": self.start, "end": self.end}

    def knobs(self) -> dict[str, float]:
        return {"applied": self._applied}


def _takes_labels(metric: nn.Module) -> bool:
    """A torchmetrics classification metric (accuracy, F1, a confusion matrix, ...), whose target is labels; not a
    divergence or a regression metric, which may take probabilities on purpose."""
    return any(cls.__module__.startswith("torchmetrics.classification") for cls in type(metric).__mro__)


class _MetricTargetWatch:
    """The forward pre-hook on a metric: calls its callback's check, held weakly. A copy of the module taken
    meanwhile (an EMA or teacher copy, ``torch.save(model)``) gets an inert hook: neither the callback nor the
    trainer travels with it."""

    def __init__(self, callback: TargetTransformCallback) -> None:
        self._callback = weakref.ref(callback)

    def __call__(self, metric: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        callback = self._callback()
        if callback is not None:
            callback._check_metric_target(metric, args, kwargs)

    def __reduce__(self) -> tuple[Any, ...]:
        return (_InertWatch, ())

    def __deepcopy__(self, memo: dict[int, Any]) -> _InertWatch:
        return _InertWatch()


class _InertWatch:
    """What a copied or unpickled module's metric keeps of the watch: nothing to do."""

    def __call__(self, *args: Any) -> None:
        return None


def _kind(target: Any) -> tuple[Any, ...]:
    """What kind of targets a batch holds, without reading their values: a change needs the first-batch checks."""
    if not isinstance(target, Tensor):
        return (type(target),)
    return (target.dtype, target.ndim, target.shape[-1] if target.ndim == 2 else None)


def _batch_size(value: Any) -> int | None:
    return value.shape[0] if isinstance(value, Tensor) and value.ndim > 0 else None


def _nested_hint(value: Any, fix: str) -> str:
    """The end of a message about a field that is not a tensor: a key cannot reach into a nested container, and a
    list of numbers wants a tensor."""
    if fix == "`batch_getter`" or not isinstance(value, Mapping | list | tuple):
        return "."
    if not isinstance(value, Mapping) and all(isinstance(v, numbers.Number) for v in value):
        return "; make it a tensor where the batch is built (`torch.as_tensor(...)` in the `collate_fn`)."
    return (
        f"; a key cannot reach into a nested {type(value).__name__}: pass `batch_getter`/`batch_setter` "
        "that read and rebuild it."
    )
