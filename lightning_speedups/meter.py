"""`TrainingMeter`: what a run cost and what it reached, recorded at every validation.

Used by ``lightning-speedups compare`` and the benchmarks. FLOPs are *counted*, not estimated: the first two
training steps of each distinct batch shape and kind of step run under ``torch.utils.flop_counter.FlopCounterMode``
(forward and backward), and every later such step adds the same count; if those two differ (a model that trims its
padded input to the batch's longest sequence: :attr:`TrainingMeter.varying`), every 8th step of that shape is
counted and the steps between add the latest count, an estimate.
Modules with trainable parameters whose forward it counts nothing for (``nn.LSTM`` on CPU) are named in
:attr:`TrainingMeter.uncounted`: the total leaves them out. A technique that changes the input size
(progressive resizing) therefore gets its FLOPs right at every size it trains at; a step's kind is whether it runs
a backward pass (not in ``StochasticWeightAveraging``'s BatchNorm epoch) and which parameters train (a backbone
frozen, then unfrozen, by ``BackboneFinetuning``), read once per epoch, at its first batch (freezing mid-epoch is
not seen until the next epoch). ``BatchSizeFinder``'s trial
steps, which Lightning runs without callbacks, are in the wall and CPU time but not in the FLOPs.

CPU time is this process's (all its threads) plus its DataLoader workers' (live workers read from ``/proc``,
finished ones from ``RUSAGE_CHILDREN``; on systems without ``/proc``, this process's only), so that moving work
into the workers (pipeline-mode resizing) is not counted as a saving. Workers started by a fork server (the
``forkserver`` start method, Python 3.14's default on Linux) are the server's children, not ours, so the kernel
never adds them to ``RUSAGE_CHILDREN``: a finished one counts with its last reading (taken whenever the time
was read while it was alive, at least at each validation), which may miss its last moments.
"""

from __future__ import annotations

import multiprocessing
import os
import time
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.trainer.states import TrainerFn
from torch.utils._pytree import tree_leaves
from torch.utils.flop_counter import FlopCounterMode

from lightning_speedups.base import restores_state_outside_fit
from lightning_speedups.seam import updating_batchnorm_only

if TYPE_CHECKING:
    import lightning.pytorch as pl


class MissingMetricError(LookupError):
    """The monitored validation metric was not logged."""


@dataclass(frozen=True)
class Checkpoint:
    """The state of a run at the end of one validation."""

    step: int
    epoch: int
    wall: float  # seconds since fit start, validation included
    cpu: float  # CPU seconds since fit start: this process (all threads) and its DataLoader workers
    flops: float  # training FLOPs so far, all ranks
    metric: float  # the monitored validation metric


def cpu_seconds() -> float:
    """CPU seconds used so far by this process and its child processes (DataLoader workers), live or finished."""
    total = time.process_time()
    # First the live children (this also reaps finished ones, moving their time into RUSAGE_CHILDREN), then the
    # finished ones: a worker that exits in between is counted twice by a sliver, never dropped.
    children = multiprocessing.active_children()
    try:
        import resource

        finished = resource.getrusage(resource.RUSAGE_CHILDREN)  # children already waited for
        total += finished.ru_utime + finished.ru_stime
    except (ImportError, OSError):  # pragma: no cover - not POSIX
        return total
    try:
        tick = os.sysconf("SC_CLK_TCK")
    except (ValueError, OSError, AttributeError):  # pragma: no cover
        return total
    me, alive = os.getpid(), set()
    for child in children:
        try:
            with open(f"/proc/{child.pid}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
            seconds = (int(fields[11]) + int(fields[12])) / tick  # utime, stime
        except (OSError, IndexError, ValueError):  # no /proc, or the worker just exited
            continue
        total += seconds
        if int(fields[1]) != me:  # not our child (a fork server's): RUSAGE_CHILDREN will never have it
            _not_ours_last[child.pid] = seconds
            alive.add(child.pid)
    global _not_ours_finished
    for pid in [p for p in _not_ours_last if p not in alive]:
        _not_ours_finished += _not_ours_last.pop(pid)
    return total + _not_ours_finished


#: last CPU-seconds reading of each live worker that is not this process's child (a fork server's), by pid
_not_ours_last: dict[int, float] = {}
#: the last readings of such workers that have finished since
_not_ours_finished = 0.0


def _shape_key(batch: Any) -> tuple:
    """The shapes and dtypes of a batch's tensors, through containers and plain objects: a few levels deep (an
    object's attribute dict is one level with it) and a bounded number of items, so that a batch object holding
    its dataset is not walked whole at each step."""
    budget = [_SHAPE_KEY_ITEMS]

    def walk(obj: Any, depth: int, path: frozenset[int]) -> tuple:
        budget[0] -= 1
        if isinstance(obj, torch.Tensor):
            return (tuple(obj.shape), str(obj.dtype))
        if depth >= 8 or budget[0] <= 0 or id(obj) in path:  # too deep or too big, or refers back to itself
            return (type(obj).__name__,)
        inner = path | {id(obj)}
        if isinstance(obj, dict | list | tuple):
            items = obj.items() if isinstance(obj, dict) else enumerate(obj)
            out = []
            for k, v in items:
                if budget[0] <= 0:  # the rest unread: only how many there are
                    return (type(obj).__name__, len(obj), *out)
                out.append((k, walk(v, depth + 1, inner)) if isinstance(obj, dict) else walk(v, depth + 1, inner))
            return tuple(out)
        if hasattr(obj, "__dict__"):
            return walk(vars(obj), depth, inner)
        return (type(obj).__name__,)

    return walk(batch, 0, frozenset())


#: how many items (tensors, containers, objects) of a batch its shape key reads at most
_SHAPE_KEY_ITEMS = 2048


#: Modules with parameters that count no FLOPs by design: lookups, normalisation (its gains may have 2 dimensions,
#: `nn.LayerNorm([C, H])`), and script modules (which take no hooks).
_NO_MATMUL = (
    torch.jit.ScriptModule,
    torch.nn.Embedding,
    torch.nn.EmbeddingBag,
    torch.nn.modules.batchnorm._NormBase,
    torch.nn.LayerNorm,
    torch.nn.GroupNorm,
    torch.nn.LocalResponseNorm,
    *((torch.nn.RMSNorm,) if hasattr(torch.nn, "RMSNorm") else ()),
)


def _matmul_weight(leaf: torch.nn.Module) -> bool:
    """Whether a leaf module's forward should count FLOPs: an RNN (``nn.LSTM``'s fused op on CPU counts nothing),
    or a trainable ``weight`` of 2 dims or more, the convention of matrix products and convolutions. Not the
    elementwise parameters the counter skips by design (norm and LayerScale gains, positional embeddings), nor
    lookups (``nn.Embedding``), nor script modules (which take no hooks)."""
    if isinstance(leaf, _NO_MATMUL):
        return False
    if isinstance(leaf, torch.nn.RNNBase):
        return True
    weight = leaf._parameters.get("weight")
    return weight is not None and weight.requires_grad and weight.dim() >= 2


class _ForwardFlops:
    """During one counted step: the FLOPs counted inside the forward of each leaf module that should count some
    (:func:`_matmul_weight`), called on a non-empty input (an expert of a mixture given no tokens counts none)."""

    def __init__(self, module: torch.nn.Module, mode: FlopCounterMode) -> None:
        self.mode, self.counted, self.handles = mode, {}, []
        try:
            for name, leaf in module.named_modules():
                if next(leaf.children(), None) is None and _matmul_weight(leaf):
                    self.handles.append(leaf.register_forward_pre_hook(self._before(name, leaf), with_kwargs=True))
                    self.handles.append(leaf.register_forward_hook(self._after(name)))
        except Exception:  # a module that refuses hooks: name nothing rather than stop the run
            self.close()
            self.handles = []

    def _before(self, name: str, leaf: torch.nn.Module) -> Any:
        def hook(_: Any, args: Any, kwargs: Any) -> None:
            if any(isinstance(a, torch.Tensor) and a.numel() == 0 for a in tree_leaves((args, kwargs))):
                return
            entry = self.counted.setdefault(name, [type(leaf).__name__, 0.0, 0])
            entry[1] -= self.mode.get_total_flops()
            entry[2] += 1  # calls open

        return hook

    def _after(self, name: str) -> Any:
        def hook(*_: Any) -> None:
            entry = self.counted.get(name)
            if entry is not None and entry[2] > 0:
                entry[1] += self.mode.get_total_flops()
                entry[2] -= 1

        return hook

    def close(self) -> dict[str, str]:
        """Remove the hooks; the modules that ran with nothing counted, by name, with their type."""
        for handle in self.handles:
            handle.remove()
        return {name: kind for name, (kind, flops, _) in self.counted.items() if flops <= 0}


def _step_kind(trainer: pl.Trainer, pl_module: pl.LightningModule) -> tuple[bool, int]:
    """What, beside the batch's shape, sets a training step's FLOPs: whether it runs a backward pass, and which
    parameters it trains (a hash of their ``requires_grad`` flags)."""
    return updating_batchnorm_only(trainer), hash(tuple(p.requires_grad for p in pl_module.parameters()))


class TrainingMeter(Callback):
    """Record wall time, CPU time, counted training FLOPs, steps and a validation metric at each validation.

    Args:
        metric: the validation metric to record (a key of ``trainer.callback_metrics``).
        require_metric: raise :class:`MissingMetricError` at the end of training if validations ran but none
            logged the metric. A validation that does not log it (a model that logs it every other epoch) adds no
            point either way.

    After ``fit``, :attr:`history` holds one :class:`Checkpoint` per validation that logged the metric (sanity
    checks excluded), :attr:`validations` counts every validation, and :attr:`flops` the training FLOPs of the
    whole run.
    """

    #: a batch shape whose FLOPs vary with the data is counted at every this many steps
    VARYING_EVERY = 8

    def __init__(self, metric: str = "val_acc", *, require_metric: bool = True) -> None:
        self.metric = metric
        self.require_metric = require_metric
        self.validations = 0
        self._missing: str | None = None
        self.history: list[Checkpoint] = []
        self.flops = 0.0
        self.flops_per_shape: dict[tuple, float] = {}
        #: batch shapes (and kinds of step) whose FLOPs differed between their first two steps: counted at each step
        self.varying: set[tuple] = set()
        #: parameter-holding modules (name: type) that ran in a counted step with no FLOPs counted (``nn.LSTM``)
        self.uncounted: dict[str, str] = {}
        self._checked: set[tuple] = set()  # keys whose second step was counted too
        self._since: dict[tuple, int] = {}  # varying keys: steps since the last counted one
        self._t0 = 0.0
        self._c0 = 0.0
        self._counting: tuple[tuple, FlopCounterMode, _ForwardFlops] | None = None
        self._kind: tuple[bool, int] | None = None  # this epoch's kind of step (`_step_kind`)

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self.__dict__.pop("_state_not_for_fit", None)  # set by this stage's restore, if any (after setup)
        if stage == "fit":  # before a checkpoint's state is restored
            self.history, self.flops, self.flops_per_shape = [], 0.0, {}
            self.varying, self.uncounted, self._checked, self._since = set(), {}, set(), {}
            self.validations, self._missing, self._kind = 0, None, None
            # The clocks start here, not at `on_fit_start`: Lightning runs `BatchSizeFinder` (moved to the front of
            # the callbacks) in its `on_fit_start`, and its trial steps are part of the recipe's cost.
            self._t0, self._c0 = time.perf_counter(), cpu_seconds()

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # A resumed run continues the clocks of the checkpoint it restored.
        last = self.history[-1] if self.history else None
        if last is not None:
            self._t0 -= last.wall
            self._c0 -= last.cpu

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, idx: int) -> None:
        self._stop_counting()  # a batch whose end hook never ran (the module's `on_train_batch_start` returned -1)
        if self._kind is None:  # read at an epoch's first batch, after every callback's epoch-start hook
            self._kind = _step_kind(trainer, pl_module)
        key = (_shape_key(batch), *self._kind)
        if key in self._checked:
            if key not in self.varying:
                self.flops += self.flops_per_shape[key] * trainer.world_size
                return
            # FLOPs that vary with the data: every `VARYING_EVERY`-th step is counted, the steps between add the
            # latest count (counting slows a step by a third or more: every step would weigh on the times)
            self._since[key] += 1
            if self._since[key] < self.VARYING_EVERY:
                self.flops += self.flops_per_shape[key] * trainer.world_size
                return
            self._since[key] = 0
        mode = FlopCounterMode(display=False)
        forward_flops = _ForwardFlops(pl_module, mode)  # hooks first: nothing to undo if they fail
        mode.__enter__()
        self._counting = (key, mode, forward_flops)

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, idx: int
    ) -> None:
        if self._counting is None:
            return
        key, mode, _ = self._counting
        self.uncounted.update(self._stop_counting())
        flops = float(mode.get_total_flops())
        if key in self.flops_per_shape and key not in self._checked:  # its second step
            self._checked.add(key)
            if flops != self.flops_per_shape[key]:
                self.varying.add(key)
                self._since[key] = 0
        if key not in self._checked or key in self.varying:  # a varying key: its latest count
            self.flops_per_shape[key] = flops
        self.flops += flops * trainer.world_size

    def _stop_counting(self) -> dict[str, str]:
        if self._counting is None:
            return {}
        _, mode, forward_flops = self._counting
        self._counting = None
        mode.__exit__(None, None, None)
        return forward_flops.close()

    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException) -> None:
        self._stop_counting()

    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._kind = None

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._stop_counting()  # never leave the counter on past a skipped batch: it would slow everything after

    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._stop_counting()
        # Lightning keeps the last logged value of every metric: the same object at the end of this validation
        # means this one did not log it (a model that logs it every other epoch), and measured nothing new
        self._before = trainer.callback_metrics.get(self.metric)

    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self._stop_counting()

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.sanity_checking or trainer.state.fn != TrainerFn.FITTING:
            return  # `trainer.validate` after the fit is no point of the run's
        self.validations += 1
        value = trainer.callback_metrics.get(self.metric)
        if value is None:  # not yet: a model may log it only in some epochs; `on_train_end` judges the whole run
            known = ", ".join(sorted(trainer.callback_metrics)) or "none"
            self._missing = (
                f"The validation metric {self.metric!r} was not logged (logged: {known}). Log it with "
                f"`self.log({self.metric!r}, ...)` in `validation_step`, or choose another metric."
            )
            return
        if value is self.__dict__.get("_before"):
            return
        self.history.append(
            Checkpoint(
                step=trainer.global_step,
                epoch=trainer.current_epoch,
                wall=time.perf_counter() - self._t0,
                cpu=cpu_seconds() - self._c0,
                flops=self.flops,
                metric=float(value),
            )
        )

    @property
    def missing(self) -> str | None:
        """The message about the latest validation that did not log the metric (with what it logged); ``None``
        if every validation so far logged it."""
        return self._missing

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.require_metric and not self.history and self._missing is not None:
            raise MissingMetricError(self._missing)

    def state_dict(self) -> dict[str, Any]:
        return {"history": [asdict(c) for c in self.history], "flops": self.flops}

    def on_load_checkpoint(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        # `trainer.validate/test(ckpt_path=...)` restores callback state too: the fit's record stays as it ended
        self._state_not_for_fit = restores_state_outside_fit(self, trainer, checkpoint)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if self.__dict__.pop("_state_not_for_fit", False):
            return
        self.history = [Checkpoint(**c) for c in state_dict.get("history", [])]
        self.flops = state_dict.get("flops", 0.0)
