"""Label smoothing: train towards ``(1 - eps) * onehot + eps / C`` (Szegedy et al., 2016)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from torch import Tensor, nn

from lightning_speedups import _checks
from lightning_speedups.functional.mixing import smooth_labels
from lightning_speedups.targets import (
    TargetTransformCallback,
    check_soft_target_losses,
    cross_entropy_modules,
)

if TYPE_CHECKING:
    import lightning.pytorch as pl

_METHODS = ("target", "loss")


class LabelSmoothing(TargetTransformCallback):
    """Smooth the training targets, either in the batch or through the loss module.

    * ``method="target"`` (default) replaces the batch's targets by smoothed probabilities, which works with
      ``F.cross_entropy`` and ``nn.CrossEntropyLoss`` alike. Combined with :class:`MixUp` or :class:`CutMix`,
      in any order, the result is the smoothed mixed target, smoothed once (smoothing is linear).
    * ``method="loss"`` keeps integer labels and sets ``label_smoothing`` on the LightningModule's
      ``nn.CrossEntropyLoss`` (or ``smoothing``/``confidence`` on a timm-style loss) for each training step,
      restoring the original value after it, so validation losses stay unsmoothed. Use it when labels must
      stay integers (``ignore_index``, metrics on hard labels). The loss must be a submodule (built in
      ``__init__`` or ``configure_model``): a ``training_step`` that calls ``F.cross_entropy`` instead gets a
      warning at the first smoothed step. Every such loss of the module is smoothed during training steps (a
      validation-only one too, harmlessly), and one that already smooths is refused at fit start.

    When it helps: classification with many classes and long schedules; improves calibration (Müller et
    al., 2019); standard in fast recipes (FFCV and Composer at 0.1, airbench at 0.2). When it hurts: a
    teacher for knowledge distillation (its logits carry less information), and tasks needing calibrated
    probabilities near 0/1.

    Args:
        smoothing: the mass ``eps`` spread uniformly over the classes, in [0, 1).
        method: ``"target"`` or ``"loss"``, see above.
        **kwargs: ``p``, ``start``, ``end``, ``num_classes``, ``input_key``, ``target_key``,
            ``batch_getter``/``batch_setter``, ``hard_target_key``, ``check_loss``, ``seed``, ``log_knobs``:
            see :class:`~lightning_speedups.targets.TargetTransformCallback`.

    Example::

        import lightning.pytorch as pl
        from lightning_speedups import LabelSmoothing, MixUp

        trainer = pl.Trainer(max_epochs=10, callbacks=[MixUp(alpha=0.2), LabelSmoothing(0.1)])
    """

    log_name = "label_smoothing"
    mixes_inputs = False
    smooths_targets = True  # one smoothing callback per part of training (checked at setup, with users' own)

    def __init__(self, smoothing: float = 0.1, method: str = "target", **kwargs: Any) -> None:
        _checks.no_unknown_arguments(LabelSmoothing, kwargs)  # what reaches this __init__, closest names
        super().__init__(**kwargs)
        self.smoothing = _checks.in_range(
            "smoothing", smoothing, 0.0, 1.0, high_open=True, hint="0.1 is the usual value."
        )
        if method not in _METHODS:
            raise ValueError(f"`method` must be one of {_METHODS}, got {method!r}.")
        if method == "loss" and self.hard_target_key is not None:
            raise ValueError(
                f"LabelSmoothing(method='loss') leaves the batch's integer labels as they are (the loss smooths), "
                f"so `hard_target_key={self.hard_target_key!r}` would never be filled. Remove `hard_target_key` and "
                "read the labels from the target, or use method='target'."
            )
        self.method = method
        self._losses: list[nn.Module] = []
        self._saved: list[tuple[nn.Module, dict[str, float]]] = []
        self._current = 0.0
        self._loss_calls: list[Any] | None = None  # hooks that watch the first smoothed step's loss calls
        self._loss_seen = False

    # ------------------------------------------------------------------ method="target"
    @property
    def transforms_batches(self) -> bool:
        return self.method == "target"  # method="loss" leaves batches alone: no seam needed

    def apply(self, x: Tensor, target: Tensor, num_classes: int, trainer: pl.Trainer) -> tuple[Tensor, Tensor]:
        self._current = self.smoothing
        return x, smooth_labels(target, self.smoothing, num_classes)

    # ------------------------------------------------------------------ checks
    @property
    def may_act(self) -> bool:
        return self.p > 0.0 and self.smoothing > 0.0  # read at every batch: no super() call

    def check_module(self, pl_module: pl.LightningModule) -> None:
        if self.method == "target":
            check_soft_target_losses(pl_module, "LabelSmoothing(method='target')", smoothing_in_targets=True)

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        super().on_fit_start(trainer, pl_module)
        if self.method != "loss":
            return
        if not self.may_act:  # turned off (p=0, smoothing=0): no loss to smooth, none to look for
            self._losses, self._loss_calls = [], None
            return
        # Here rather than in setup: losses built in the module's `configure_model` exist by now.
        self._losses = cross_entropy_modules(pl_module)
        if not self._losses:
            raise ValueError(
                "LabelSmoothing(method='loss') found no `nn.CrossEntropyLoss` on the LightningModule. Store "
                "the loss as a submodule (self.criterion = nn.CrossEntropyLoss(), in `__init__` or "
                "`configure_model`), or use method='target', which works with F.cross_entropy."
            )
        names = {id(module): name for name, module in pl_module.named_modules()}
        for loss in self._losses:
            attribute = "label_smoothing" if hasattr(loss, "label_smoothing") else "smoothing"
            already = getattr(loss, attribute, 0.0) or 0.0
            if already > 0:
                raise ValueError(
                    f"LabelSmoothing(method='loss'): the loss `{names.get(id(loss), '?')}` "
                    f"({type(loss).__name__}) already has `{attribute}={already}`; remove the callback or the "
                    "loss's own smoothing, not both."
                )
        self._loss_calls = None  # until the first smoothed step has shown whether training calls a loss
        self._scanned_epoch: int | None = None  # losses are looked for again at each epoch's first batch
        self._found = list(self._losses)  # what the latest look found (held: ids of freed modules are reused)

    def _rescan_losses(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Find the losses again: a module or callback may build a new one at an epoch's start (class weights
        estimated again), which the list found at fit start would miss, leaving training unsmoothed."""
        found = cross_entropy_modules(pl_module)
        if len(found) == len(self._found) and all(a is b for a, b in zip(found, self._found, strict=True)):
            return
        self._found = found
        names = {id(module): name for name, module in pl_module.named_modules()}
        kept = []
        for loss in found:
            attribute = "label_smoothing" if hasattr(loss, "label_smoothing") else "smoothing"
            already = _own_value(loss, attribute, trainer) or 0.0
            if already > 0 and all(loss is not old for old in self._losses):
                self.warn(
                    f"method='loss': the loss `{names.get(id(loss), '?')}` ({type(loss).__name__}), new since the "
                    f"last epoch, has `{attribute}={already}` of its own: it is left as it is, not smoothed again."
                )
                continue
            kept.append(loss)
        if not found:
            self.warn(
                "method='loss': the module has no `nn.CrossEntropyLoss` to smooth any more (it had one at fit "
                "start): training goes on unsmoothed. Keep the loss a submodule, or use method='target'."
            )
        self._unwatch()
        self._losses = kept
        self._loss_calls = None  # watch the next smoothed step again: is one of these losses called?

    # ------------------------------------------------------------------ method="loss"
    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        if self.method != "loss":
            return
        # Lightning skips on_train_batch_end when the module's on_train_batch_start returns -1: undo here too
        self._restore()
        if self.__dict__.get("_scanned_epoch", trainer.current_epoch) != trainer.current_epoch:
            self._scanned_epoch = trainer.current_epoch
            self._rescan_losses(trainer, pl_module)
        self._current = self.smoothing if self.draw_active(trainer) else 0.0
        self._applied = float(self._current > 0)
        if self._applied and self._loss_calls is None:
            # The first smoothed step: watch whether training_step calls any of the losses it smooths (one
            # computed with F.cross_entropy instead would leave the run unsmoothed without a word).
            self._loss_seen = False
            self._loss_calls = [loss.register_forward_pre_hook(self._loss_called) for loss in self._losses]
        if not self._applied:
            # leave the losses as they are: a second LabelSmoothing, active in another window, may have set them
            return
        for loss in self._losses:
            if isinstance(loss, nn.CrossEntropyLoss):
                self._saved.append((loss, {"label_smoothing": loss.label_smoothing}))
                loss.label_smoothing = self._current
            else:  # timm LabelSmoothingCrossEntropy keeps both
                self._saved.append((loss, {"smoothing": loss.smoothing, "confidence": loss.confidence}))
                loss.smoothing, loss.confidence = self._current, 1.0 - self._current

    def _restore(self) -> None:
        for loss, attrs in self._saved:
            for name, value in attrs.items():
                setattr(loss, name, value)
        self._saved = []

    def _loss_called(self, module: nn.Module, args: Any) -> None:
        self._loss_seen = True

    def _unwatch(self) -> bool:
        """Remove the hooks of the first smoothed step; True if there were any."""
        if not self._loss_calls:
            return False
        for handle in self._loss_calls:
            handle.remove()
        self._loss_calls = []  # checked (or the fit ended): never again this fit
        return True

    def _check_loss_called(self) -> None:
        if self._unwatch() and not self._loss_seen:
            names = ", ".join(type(loss).__name__ for loss in self._losses)
            self.warn(
                f"method='loss' set `label_smoothing` on the module's {names}, but the first smoothed training "
                "step called none of them, so training is not smoothed (a loss computed with "
                "`F.cross_entropy` in `training_step`?). Call the loss module in `training_step`, or use "
                "method='target', which works with F.cross_entropy."
            )

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if self.method == "loss":
            # a `training_step` that returned None skipped its batch (Lightning hands on an empty dict)
            skipped = not outputs and pl_module.automatic_optimization
            if not (skipped and self._loss_calls and not self._loss_seen):  # tells nothing: watch the next step
                self._check_loss_called()
            self._restore()
        super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._restore()
        super().on_train_epoch_end(trainer, pl_module)

    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._restore()  # validation mid-epoch (val_check_interval) after a batch whose end hook was skipped
        super().on_validation_start(trainer, pl_module)

    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException) -> None:
        self._unwatch()
        self._restore()
        super().on_exception(trainer, pl_module, exception)

    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self._unwatch()
        self._restore()
        self.__dict__.pop("_scanned_epoch", None)  # this fit's; the next sets its own at fit start
        super().teardown(trainer, pl_module, stage)

    def knobs(self) -> dict[str, float]:
        return {"smoothing": self._current if self._applied else 0.0}


def _own_value(loss: nn.Module, attribute: str, trainer: pl.Trainer) -> Any:
    """The loss's own smoothing: where a `LabelSmoothing` earlier in the callbacks set it for this step, the value
    that one saved (the first to set it saved the loss's own), not the value it set."""
    for callback in trainer.callbacks:
        if isinstance(callback, LabelSmoothing):
            for saved_loss, attrs in callback.__dict__.get("_saved", ()):
                if saved_loss is loss:
                    return attrs.get(attribute)
    return getattr(loss, attribute, 0.0)
