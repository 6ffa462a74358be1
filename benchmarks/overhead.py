"""Per-step overhead of each callback, inactive and active, against a plain Trainer (CPU; not a test).

The model is small on purpose, so that any cost of ours shows: a one-convolution CNN on 3 x 16 x 16 inputs,
batch 64, 10 classes, SGD, ``F.cross_entropy`` and ``self.log("train_loss")`` in ``training_step``, with a
dropout of 0.1 before its classifier. The data is an in-memory ``TensorDataset`` of 1,600 samples (25
batches per epoch) served by a :class:`~lightning_speedups.SpeedupDataModule` for every variant, the plain
one included, so the samplers are compared with the default seeded shuffle. Every variant has the same
in-memory logger (``log_every_n_steps=50``), so the cost of logging the callbacks' knobs is counted.

How a callback's overhead is measured: each variant is one ``Trainer.fit`` per round, the variants taking
turns in a shuffled order each round. A callback's **overhead per step** is the sum of three parts, each
measured on its own (the median over rounds), not a difference of whole-step times:

* **ours per step**: the time inside the callback's per-step hooks, its ``transform_batch``, its optimizer step
  hooks and the seam's dispatch, measured by wrappers around each (:class:`HookClock`), the mean over the timed
  steps (the first ``warmup`` steps of each fit are dropped);
* **ours per epoch / batches per epoch**: its epoch hooks, plus the time the training sampler takes to produce
  an epoch's index list beyond the default shuffle's, shared over the epoch's batches;
* **Lightning's dispatch**: Lightning's own cost of calling the callback's hooks falls outside them, so the
  wrappers miss it; it is measured apart (:func:`measure_dispatch`). Lightning calls every callback hook on
  every callback in ``trainer.callbacks``, overridden or not (``getattr``, the callback's ``state_key``, the
  profiler's context manager, the call), so each callback pays it for every hook the loop calls. The hooks
  called per step are counted in this benchmark's own fit (:func:`hook_rates`); each is dispatched through
  Lightning's ``_call_callback_hooks`` to copies of the variant's callback (the bodies of the hooks it
  overrides replaced by no-ops: their time is already ours) and to no callback, interleaved.

The goals: an overhead of at most 1% of the plain step, and under 100 µs per step when inactive. The plain step
is the median, over rounds, of the step times of both plain arms (the plain Trainer and its identical A/A
copy); a verdict that would flip with either plain arm alone as the denominator is marked borderline.

The whole step is a cross-check only: a callback records ``time.perf_counter_ns()`` at every
``on_train_batch_end``; the interval between two of them is one whole loop iteration (fetching the batch,
moving it, the batch-transform seam, every hook, forward, backward, optimizer). The **step time** of a fit is
the median of those intervals within an epoch, and **Δ whole step** the median over rounds of (the variant's
step time - the plain Trainer's in the same round); the A/A row shows how large a difference is noise.

Beside the whole-loop figures, ``transform_batch`` (the seam path of MixUp, CutMix, LabelSmoothing,
ProgressiveResizing), MixUp's per-batch draws (``SpeedupCallback.batch_random``) and its mixing arithmetic (the
functional ``mix``) are timed on their own on the same batch, interleaved, many calls per sample.

Usage::

    PYTHONPATH=. python benchmarks/overhead.py            # 7 rounds of 400 steps
    PYTHONPATH=. python benchmarks/overhead.py --quick    # 3 rounds of 150 steps
"""

from __future__ import annotations

import argparse
import functools
import logging
import math
import statistics
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
import torch.nn.functional as F
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.loggers import Logger
from torch import nn
from torch.utils.data import TensorDataset

from benchmarks import common
from lightning_speedups import (
    CurriculumOrdering,
    CutMix,
    DropoutRemoval,
    LabelSmoothing,
    LinearScalingWarmup,
    MixUp,
    ProgressiveResizing,
    RepeatFactorSampling,
    SpeedupCallback,
    SpeedupDataModule,
)
from lightning_speedups.functional import mix

BATCH = 64
SAMPLES = 1600  # 25 batches per epoch
SHAPE = (3, 16, 16)
CLASSES = 10
GOAL_PCT = 0.01
GOAL_INACTIVE_S = 100e-6
#: torch threads: one, so that another process on the two shared cores cannot make OpenMP workers spin.
THREADS = 1
#: Lightning's dispatch is timed with this many copies of the callback in ``trainer.callbacks`` (Lightning loops
#: over the list), so that the cost per callback stands out from the cost per call (logging, the module's hook
#: name), which a Trainer pays with no callback at all.
DISPATCH_COPIES = 10
#: Samples of ``transform_batch`` alone and of Lightning's dispatch: the mean of this many calls each.
ALONE_CALLS = 200
DISPATCH_CALLS = 100
EMPTY = "empty Callback"
RNG, MIX = "SpeedupCallback.batch_random (MixUp)", "mix (functional, MixUp's arithmetic)"


# ---------------------------------------------------------------------------------------------- the task
class TinyCNN(pl.LightningModule):
    """One 3x3 convolution, pooling, dropout 0.1, a linear classifier: a step of about a millisecond."""

    num_classes = CLASSES

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Conv2d(SHAPE[0], 8, 3, padding=1),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d(4),
            nn.Flatten(),
            nn.Dropout(0.1),
            nn.Linear(8 * 16, CLASSES),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = F.cross_entropy(self(x), y)
        self.log("train_loss", loss)
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01, momentum=0.9)


class TinyData(SpeedupDataModule):
    """Random images with a long-tailed label distribution (so repeat-factor sampling has rare classes)."""

    num_classes = CLASSES

    def __init__(self, clock: HookClock | None = None) -> None:
        super().__init__(batch_size=BATCH, num_workers=0, seed=0)
        self.clock = clock
        g = torch.Generator().manual_seed(0)
        x = torch.randn(SAMPLES, *SHAPE, generator=g)
        weights = torch.tensor([0.5**k for k in range(CLASSES)])
        y = torch.multinomial(weights / weights.sum(), SAMPLES, replacement=True, generator=g)
        self.train_dataset = TensorDataset(x, y)
        self.train_labels = y.numpy()
        self.train_difficulty = torch.rand(SAMPLES, generator=g).numpy()

    def train_sampler(self, dataset: Any) -> Any:
        sampler = super().train_sampler(dataset)
        return self.clock.wrap_sampler(sampler) if self.clock is not None else sampler


class MemoryLogger(Logger):
    """A logger that counts what it is given: logging is paid for, nothing is written to disk."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    @property
    def name(self) -> str:
        return "memory"

    @property
    def version(self) -> int:
        return 0

    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        self.calls += 1

    def log_hyperparams(self, params: Any, *args: Any, **kwargs: Any) -> None:
        pass


class StepTimer(Callback):
    """``perf_counter_ns`` at each ``on_train_batch_end``, which batches opened an epoch, and our time in between.

    Put it last in ``callbacks``: its stamp then follows every other callback's ``on_train_batch_end``.
    """

    def __init__(self, clock: HookClock) -> None:
        self.clock = clock
        self.stamps: list[int] = []
        self.ours: list[int] = []  # cumulative ns inside our per-step code at each stamp
        self.parts: list[dict[str, int]] = []  # the clock's per-step parts at each stamp
        self.first_of_epoch: list[bool] = []

    def on_train_start(self, trainer, pl_module) -> None:
        seam = getattr(trainer.strategy, "_lightning_speedups_seam", None)
        if seam is not None:
            self.clock.wrap_seam(seam)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.stamps.append(time.perf_counter_ns())
        self.ours.append(self.clock.total("step"))
        self.parts.append(dict(self.clock.by_name))
        self.first_of_epoch.append(batch_idx == 0)

    def summary(self, warmup: int) -> dict[str, float]:
        """Step seconds (median within epochs), epoch-boundary extra seconds, our seconds per step (mean)."""
        steps, boundaries = [], []
        first = max(1, warmup)
        for i in range(first, len(self.stamps)):
            dt = (self.stamps[i] - self.stamps[i - 1]) * 1e-9
            (boundaries if self.first_of_epoch[i] else steps).append(dt)
        step = statistics.median(steps)
        extra = statistics.median([b - step for b in boundaries]) if boundaries else float("nan")
        n = len(self.stamps) - first
        ours = (self.ours[-1] - self.ours[first - 1]) * 1e-9 / n
        before, after = self.parts[first - 1], self.parts[-1]
        parts = {f"part:{k}": (v - before.get(k, 0)) * 1e-9 / n for k, v in after.items()}
        return {"step": step, "boundary": extra, "ours": ours, **parts}


#: Hooks that run once per training step (or per optimizer update), and once per epoch.
STEP_HOOKS = (
    "on_train_batch_start",
    "on_train_batch_end",
    "on_before_backward",
    "on_after_backward",
    "on_before_optimizer_step",
    "on_before_zero_grad",
    "transform_batch",
    "_pre_step",  # LinearScalingWarmup's optimizer step hooks, registered from these attributes
    "_post_step",
    "_before_closure",  # and around the step's closure (training_step and backward) it wraps
    "_after_closure",
)
EPOCH_HOOKS = ("on_train_epoch_start", "on_train_epoch_end")


class HookClock:
    """Nanoseconds spent inside our callbacks' hooks, the seam's dispatch and the training sampler's epoch list.

    Each hook a callback overrides is replaced, on the instance, by a wrapper that adds its duration to a
    bucket: ``step`` (per-step hooks, ``transform_batch``, optimizer step hooks, the seam's own dispatch),
    ``epoch`` (epoch hooks) or ``sampler`` (building one epoch's index list). The timing itself costs about
    0.2 µs per wrapped call, included.
    """

    def __init__(self) -> None:
        self.ns: dict[str, int] = {"step": 0, "epoch": 0, "sampler": 0}
        self.calls: dict[str, int] = {"step": 0, "epoch": 0, "sampler": 0}
        self.by_name: dict[str, int] = {}  # per-step parts: hook name (or "seam dispatch") -> ns
        self.epoch_lists: list[int] = []

    def total(self, bucket: str) -> int:
        return self.ns[bucket]

    def _timed(self, fn: Callable[..., Any], bucket: str) -> Callable[..., Any]:
        ns, calls, by_name, clock = self.ns, self.calls, self.by_name, time.perf_counter_ns
        name = fn.__name__.lstrip("_")

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            start = clock()
            try:
                return fn(*args, **kwargs)
            finally:
                elapsed = clock() - start
                ns[bucket] += elapsed
                calls[bucket] += 1
                if bucket == "step":
                    by_name[name] = by_name.get(name, 0) + elapsed

        return wrapper

    def instrument(self, callback: Callback) -> Callback:
        for name in STEP_HOOKS + EPOCH_HOOKS:
            fn = getattr(callback, name, None)
            if fn is None or getattr(type(callback), name, None) is getattr(Callback, name, None):
                continue
            setattr(callback, name, self._timed(fn, "epoch" if name in EPOCH_HOOKS else "step"))
        return callback

    def wrap_seam(self, seam: Any) -> None:
        """Count the seam's dispatch (its call minus the strategy's own ``batch_to_device``) as ours."""
        clock, ns, by_name = time.perf_counter_ns, self.ns, self.by_name
        original = seam._original
        inner = [0]

        def timed_original(*args: Any, **kwargs: Any) -> Any:
            start = clock()
            try:
                return original(*args, **kwargs)
            finally:
                inner[0] += clock() - start

        seam._original = timed_original
        call = type(seam).__call__

        class TimedSeam(type(seam)):  # type: ignore[misc]
            def __call__(self, *args: Any, **kwargs: Any) -> Any:
                before_step, before_inner, start = ns["step"], inner[0], clock()
                try:
                    return call(self, *args, **kwargs)
                finally:
                    total = clock() - start
                    # the dispatch: the whole call minus the original transfer and the (already counted) hooks
                    dispatch = max(0, total - (inner[0] - before_inner) - (ns["step"] - before_step))
                    ns["step"] += dispatch
                    by_name["seam dispatch"] = by_name.get("seam dispatch", 0) + dispatch

        seam.__class__ = TimedSeam

    def wrap_sampler(self, sampler: Any) -> Any:
        """Time how long the sampler takes to produce one epoch's whole index list."""
        cls, ns, lists, clock = type(sampler), self.ns, self.epoch_lists, time.perf_counter_ns

        def __iter__(self: Any) -> Any:
            start = clock()
            indices = list(cls.__iter__(self))
            elapsed = clock() - start
            ns["sampler"] += elapsed
            lists.append(elapsed)
            return iter(indices)

        sampler.__class__ = type(f"Timed{cls.__name__}", (cls,), {"__iter__": __iter__})
        return sampler


# ---------------------------------------------------------------------------------------------- variants
@dataclass(frozen=True)
class Variant:
    callback: str
    state: str  # "-", "inactive" or "active"
    setting: str
    make: Callable[[], list[Callback]]
    changes_work: bool = False  # the callback changes the model's own work (smaller images, no dropout)
    per_epoch: bool = False  # its cost is paid at epoch boundaries (samplers)

    @property
    def name(self) -> str:
        return f"{self.callback} ({self.state})" if self.state != "-" else self.callback


def variants() -> list[Variant]:
    cls = {"num_classes": CLASSES}
    return [
        Variant("plain Trainer", "-", "no callback", lambda: []),
        Variant("plain, A/A", "-", "a second identical plain Trainer", lambda: []),
        Variant("MixUp", "inactive", "p=0", lambda: [MixUp(0.2, p=0.0, **cls)]),
        Variant("MixUp", "active", "alpha=0.2, p=1", lambda: [MixUp(0.2, **cls)]),
        Variant("CutMix", "inactive", "p=0", lambda: [CutMix(1.0, p=0.0, **cls)]),
        Variant("CutMix", "active", "alpha=1, p=1", lambda: [CutMix(1.0, **cls)]),
        Variant("LabelSmoothing", "inactive", "p=0", lambda: [LabelSmoothing(0.1, p=0.0, **cls)]),
        Variant("LabelSmoothing", "active", "0.1, method='target'", lambda: [LabelSmoothing(0.1, **cls)]),
        Variant(
            "ProgressiveResizing",
            "inactive",
            "scale 1 throughout (initial_scale=1)",
            lambda: [ProgressiveResizing(1.0, 0.5, 0.2)],
        ),
        Variant(
            "ProgressiveResizing",
            "active",
            "scale 0.5 throughout (16 -> 8 px, bilinear)",
            lambda: [ProgressiveResizing(0.5, 1.0, 0.0)],
            changes_work=True,
        ),
        Variant("DropoutRemoval", "inactive", "start=1 (never reached)", lambda: [DropoutRemoval(1.0)]),
        Variant("DropoutRemoval", "active", "start=0 (dropout off from step 1)", lambda: [DropoutRemoval(0.0)], True),
        Variant(
            "LinearScalingWarmup",
            "inactive",
            "reference batch 64, no warmup (factor 1)",
            lambda: [LinearScalingWarmup(64, 0, "steps")],
        ),
        Variant(
            "LinearScalingWarmup",
            "active",
            "reference 32, warmup over the whole run",
            lambda: [LinearScalingWarmup(32, 1.0, "fraction")],
        ),
        Variant(
            "RepeatFactorSampling",
            "inactive",
            "threshold 1e-4 (every factor 1)",
            lambda: [RepeatFactorSampling(1e-4)],
            per_epoch=True,
        ),
        Variant(
            "RepeatFactorSampling",
            "active",
            "threshold 0.1 (rare classes repeated)",
            lambda: [RepeatFactorSampling(0.1)],
            per_epoch=True,
        ),
        Variant(
            "CurriculumOrdering",
            "inactive",
            "start_fraction=1 (all data from the start)",
            lambda: [CurriculumOrdering("linear", start_fraction=1.0)],
            per_epoch=True,
        ),
        Variant(
            "CurriculumOrdering",
            "active",
            "linear pace from 10%, all data at the end",
            lambda: [CurriculumOrdering("linear", start_fraction=0.1, full_at=1.0)],
            per_epoch=True,
        ),
    ]


def _trainer(callbacks: list[Callback], **kwargs: Any) -> pl.Trainer:
    """The Trainer of every fit here: CPU, the in-memory logger, no checkpoints, bars, summary or validation."""
    return pl.Trainer(
        accelerator="cpu",
        devices=1,
        callbacks=callbacks,
        logger=MemoryLogger(),
        log_every_n_steps=50,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        limit_val_batches=0,
        **kwargs,
    )


def fit_once(variant: Variant, steps: int, warmup: int) -> dict[str, float]:
    """One ``Trainer.fit`` of ``warmup + steps`` steps, timed as the module docstring says."""
    torch.manual_seed(0)
    clock = HookClock()
    timer = StepTimer(clock)
    trainer = _trainer([*(clock.instrument(cb) for cb in variant.make()), timer], max_steps=warmup + steps)
    trainer.fit(TinyCNN(), datamodule=TinyData(clock))
    out = timer.summary(warmup)
    epochs = max(1, int(trainer.fit_loop.epoch_progress.current.started))  # the epoch hooks ran once per epoch
    out["epoch_hooks"] = clock.ns["epoch"] * 1e-9 / epochs
    out["epoch_list"] = statistics.median(clock.epoch_lists) * 1e-9 if clock.epoch_lists else 0.0
    out["batches"] = float(trainer.num_training_batches)
    return out


def _quiet() -> None:
    warnings.filterwarnings("ignore")
    for name in ("lightning", "lightning.pytorch", "lightning.fabric", "lightning_speedups"):
        logging.getLogger(name).setLevel(logging.ERROR)


def measure_loop(rounds: int, steps: int, warmup: int) -> dict[str, dict[str, Any]]:
    """Per variant: medians over rounds of its figures and of its paired differences to the plain Trainer."""
    _quiet()
    vs = {v.name: v for v in variants()}
    for v in vs.values():  # one untimed fit each: imports, first allocations
        fit_once(v, 20, 5)
    per_round: dict[str, list[dict[str, float]]] = {n: [] for n in vs}
    for order in common.shuffled_rounds(list(vs), rounds, seed=1):
        for name in order:
            per_round[name].append(fit_once(vs[name], steps, warmup))
    plain = per_round["plain Trainer"]
    out: dict[str, dict[str, Any]] = {}
    for name, results in per_round.items():
        row: dict[str, Any] = {"variant": vs[name]}
        for key in results[0]:
            row[key] = statistics.median(r.get(key, 0.0) for r in results)
        row["steps"] = [r["step"] for r in results]  # per round, for the plain step of both plain arms
        deltas = [r["step"] - p["step"] for r, p in zip(results, plain, strict=True)]
        row["delta"], row["delta_range"] = statistics.median(deltas), (min(deltas), max(deltas))
        row["boundary_delta"] = statistics.median(
            r["boundary"] - p["boundary"] for r, p in zip(results, plain, strict=True)
        )
        # per-epoch work of ours: epoch hooks, plus, for a sampler, the epoch list beyond the plain shuffle's (for
        # the others, the same shuffle: a difference there is noise)
        extra_list = row["epoch_list"] - statistics.median(p["epoch_list"] for p in plain)
        row["epoch_ours"] = row["epoch_hooks"] + (max(0.0, extra_list) if vs[name].per_epoch else 0.0)
        row["own"] = row["ours"] + row["epoch_ours"] / row["batches"]  # inside our hooks, sampler, seam
        row["dispatch"] = 0.0  # Lightning's calls of our hooks: add_dispatch
        row["cost"] = row["own"]
        out[name] = row
    return out


# ---------------------------------------------------------------------------------------------- Lightning's dispatch
def callback_hooks() -> list[str]:
    """The hooks Lightning may dispatch to a callback (``Callback``'s ``on_*`` methods, ``setup``, ``teardown``)."""
    return [n for n, f in vars(Callback).items() if callable(f) and (n.startswith("on_") or n in ("setup", "teardown"))]


def hook_rates(epochs: tuple[int, int] = (2, 4)) -> dict[str, float]:
    """Calls per training step of each callback hook Lightning calls in this benchmark's fit.

    Counted by a callback that overrides every hook, as the difference in calls between two fits of
    ``epochs`` epochs over the difference in steps: one-off hooks (``setup``, ``on_fit_start``, ...) cancel,
    per-epoch hooks count one per epoch's batches.
    """
    _quiet()
    counted = []
    for n_epochs in epochs:
        counts: dict[str, int] = {}

        def hook(name: str, counts: dict[str, int] = counts) -> Callable[..., None]:
            def call(self: Any, *args: Any, **kwargs: Any) -> None:
                counts[name] = counts.get(name, 0) + 1

            return call

        counter = type("HookCounter", (Callback,), {name: hook(name) for name in callback_hooks()})()
        trainer = _trainer([counter], max_epochs=n_epochs)
        trainer.fit(TinyCNN(), datamodule=TinyData())
        counted.append((counts, trainer.global_step))
    (short, short_steps), (long, long_steps) = counted
    rates = {h: (long.get(h, 0) - short.get(h, 0)) / (long_steps - short_steps) for h in long}
    return {h: r for h, r in rates.items() if r > 0}


def _noop(*args: Any, **kwargs: Any) -> None:
    return None


def _without_bodies(callback: Callback, hooks: list[str]) -> Callback:
    """``callback`` with the hooks it overrides replaced by no-ops; the others stay ``Callback``'s own no-ops."""
    for name in hooks:
        if getattr(type(callback), name, None) is not getattr(Callback, name, None):
            setattr(callback, name, _noop)
    if isinstance(callback, SpeedupCallback):
        callback._state_key_cache = callback.state_key  # as `setup` leaves it for the fit (read at every dispatch)
    return callback


def measure_dispatch(rates: dict[str, float], rounds: int) -> dict[str, float]:
    """Per variant with a callback (and an empty ``Callback``): Lightning's dispatch seconds per training step.

    For each hook in ``rates``, ``lightning.pytorch.trainer.call._call_callback_hooks`` (what the loop calls)
    is timed with :data:`DISPATCH_COPIES` copies of the variant's callback in ``trainer.callbacks`` and with
    none, interleaved; per round, the difference over the copies, weighted by the hook's calls per step and
    summed over the hooks; the median over rounds. The hooks get ``None`` arguments: the no-op bodies ignore
    them.
    """
    import inspect

    from lightning.pytorch.trainer import call

    _quiet()
    trainer = _trainer([])
    trainer.strategy.connect(TinyCNN())  # as in a fit: the dispatch records the hook name on the module
    hooks = list(rates)
    nargs = {h: len(inspect.signature(getattr(Callback, h)).parameters) - 3 for h in hooks}  # self, trainer, module
    lists: dict[str, list[Callback]] = {"none": []}
    for v in variants():
        if v.state != "-":
            lists[v.name] = [_without_bodies(cb, hooks) for cb in v.make()] * DISPATCH_COPIES
    lists[EMPTY] = [Callback()] * DISPATCH_COPIES

    def dispatch(callbacks: list[Callback], hook: str) -> Callable[[], None]:
        args = (None,) * nargs[hook]

        def run() -> None:
            trainer.callbacks = callbacks
            call._call_callback_hooks(trainer, hook, *args)

        return run

    fns = {f"{name}|{h}": dispatch(cbs, h) for name, cbs in lists.items() for h in hooks}
    samples = common.interleaved_samples(fns, rounds, warmup=1, number=DISPATCH_CALLS, seed=4)
    out = {}
    for name in lists:
        if name == "none":
            continue
        per_round = [
            sum(rates[h] * (samples[f"{name}|{h}"][r] - samples[f"none|{h}"][r]) for h in hooks) / DISPATCH_COPIES
            for r in range(rounds)
        ]
        out[name] = statistics.median(per_round)
    return out


def add_dispatch(loop: dict[str, dict[str, Any]], dispatch: dict[str, float]) -> None:
    """Add Lightning's dispatch to each callback's overhead (the plain Trainers have no callback: none)."""
    for name, row in loop.items():
        row["dispatch"] = 0.0 if row["variant"].state == "-" else dispatch[name]
        row["cost"] = row["own"] + row["dispatch"]


# ---------------------------------------------------------------------------------------------- transform alone
def measure_transforms(rounds: int) -> dict[str, float]:
    """Seconds per ``transform_batch`` call of each seam callback on one batch, interleaved."""
    _quiet()
    trainer = pl.Trainer(accelerator="cpu", logger=False, enable_progress_bar=False, enable_model_summary=False)
    g = torch.Generator().manual_seed(0)
    batch = [torch.randn(BATCH, *SHAPE, generator=g), torch.randint(0, CLASSES, (BATCH,), generator=g)]
    callbacks = {
        "MixUp (inactive)": MixUp(0.2, p=0.0, num_classes=CLASSES),
        "MixUp (active)": MixUp(0.2, num_classes=CLASSES),
        "CutMix (inactive)": CutMix(1.0, p=0.0, num_classes=CLASSES),
        "CutMix (active)": CutMix(1.0, num_classes=CLASSES),
        "LabelSmoothing (inactive)": LabelSmoothing(0.1, p=0.0, num_classes=CLASSES),
        "LabelSmoothing (active)": LabelSmoothing(0.1, num_classes=CLASSES),
        "ProgressiveResizing (inactive)": ProgressiveResizing(1.0, 0.5, 0.2),
        "ProgressiveResizing (active)": ProgressiveResizing(0.5, 1.0, 0.0),
    }
    progress = trainer.fit_loop.epoch_loop.batch_progress.total

    def call(cb: Any) -> Any:
        progress.completed += 1  # the next batch: fresh draws (a CutMix box of another size), as in a fit
        return cb.transform_batch(trainer, None, batch)

    fns = {name: (lambda cb=cb: call(cb)) for name, cb in callbacks.items()}
    mixup = callbacks["MixUp (active)"]
    mixup.seed = 0
    perm = torch.randperm(BATCH, generator=g)
    fns[RNG] = lambda: mixup.batch_random(trainer)
    fns[MIX] = lambda: mix(batch[0], batch[1], 0.7, perm, CLASSES)
    return common.interleaved(fns, rounds, warmup=2, number=ALONE_CALLS, seed=2)


# ---------------------------------------------------------------------------------------------- report
PLAIN_ARMS = ("plain Trainer", "plain, A/A")


def plain_step(loop: dict[str, dict[str, Any]]) -> float:
    """The plain step, the goal's denominator: the median of both plain arms' per-round step times."""
    return statistics.median(t for name in PLAIN_ARMS for t in loop[name].get("steps", [loop[name]["step"]]))


def _verdict(row: dict[str, Any], plain_step: float) -> bool | None:
    v: Variant = row["variant"]
    if v.state == "-":
        return None
    cost = row["cost"]
    return cost <= GOAL_PCT * plain_step and (v.state != "inactive" or cost < GOAL_INACTIVE_S)


def borderline(row: dict[str, Any], loop: dict[str, dict[str, Any]]) -> bool:
    """Whether the verdict would differ with either plain arm alone (its median step) as the denominator."""
    verdicts = {_verdict(row, step) for step in (plain_step(loop), *(loop[name]["step"] for name in PLAIN_ARMS))}
    return len(verdicts) > 1


def parts(row: dict[str, Any]) -> dict[str, float]:
    """The per-step parts of a row (hook name -> seconds per step), largest first."""
    found = {k.split(":", 1)[1]: v for k, v in row.items() if k.startswith("part:")}
    return dict(sorted(found.items(), key=lambda kv: -kv[1]))


def parts_text(row: dict[str, Any]) -> str:
    return ", ".join(f"{k} {v * 1e6:.0f}" for k, v in parts(row).items() if v * 1e6 >= 0.5)


def report(loop: dict[str, dict[str, Any]], alone: dict[str, float]) -> str:
    plain = plain_step(loop)
    rows = []
    for name, r in loop.items():
        v: Variant = r["variant"]
        ok = _verdict(r, plain)
        baseline = v.state == "-"
        a = alone.get(name)
        rows.append(
            [
                v.callback,
                v.state,
                v.setting,
                "" if baseline else f"{r['ours'] * 1e6:,.1f}",
                "" if baseline else parts_text(r),
                "" if baseline or not r["epoch_ours"] else f"{r['epoch_ours'] * 1e6:,.0f} / {r['batches']:.0f}",
                "" if baseline else f"{r['dispatch'] * 1e6:,.1f}",
                "" if baseline else f"**{r['cost'] * 1e6:,.1f}**",
                "" if baseline else common.fmt_pct(r["cost"] / plain, 2),
                f"{a * 1e6:,.1f}" if a is not None else "",
                f"{r['step'] * 1e6:,.0f}",
                "-" if name == "plain Trainer" else f"{r['delta'] * 1e6:+,.0f}",
                "" if ok is None else common.met_label(ok) + (" (borderline)" if borderline(r, loop) else ""),
            ]
        )
    return common.markdown_table(
        [
            "callback",
            "state",
            "setting",
            "ours per step (µs)",
            "of which (µs per step)",
            "ours per epoch (µs) / batches",
            "Lightning dispatch (µs per step)",
            "overhead per step (µs)",
            "% of plain step",
            "transform_batch alone (µs)",
            "whole step (µs, median)",
            "Δ whole step (µs)",
            "goal",
        ],
        rows,
        align="lllrlrrrrrrrl",
    )


def plot(loop: dict[str, dict[str, Any]], path: Path) -> None:
    """Overhead per step of each variant against the 1% line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    plain = plain_step(loop)
    rows = [(name, r) for name, r in loop.items() if r["variant"].state != "-"]
    names = [name for name, _ in rows][::-1]
    costs = [r["cost"] * 1e6 for _, r in rows][::-1]
    own = [r["own"] * 1e6 for _, r in rows][::-1]
    colors = ["tab:green" if _verdict(r, plain) else "tab:red" for _, r in rows][::-1]
    fig, ax = plt.subplots(figsize=(8, 5))
    ax.barh(names, own, color=colors)
    ax.barh(
        names,
        [c - o for c, o in zip(costs, own, strict=True)],
        left=own,
        color=colors,
        alpha=0.45,
        hatch="//",
        label="Lightning's dispatch of our hooks",
    )
    ax.axvline(
        GOAL_PCT * plain * 1e6, color="black", linestyle="--", label=f"1% of the plain step ({plain * 1e3:.1f} ms)"
    )
    ax.axvline(GOAL_INACTIVE_S * 1e6, color="grey", linestyle=":", label="100 µs (inactive goal)")
    ax.set_xscale("log")
    ticks = [t for t in (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000) if min(own) / 2 <= t <= max(costs) * 2]
    ax.set_xticks(ticks, [str(t) for t in ticks])
    ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    ax.set_xlabel("overhead per training step (µs, log scale; hatched: Lightning's dispatch; green: goal met)")
    ax.set_title("Callback overhead on a tiny CNN (CPU, 1 thread)")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.13), ncol=2, fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)


def section(quick: bool, out_dir: Path) -> str:
    rounds, steps, warmup = (3, 150, 20) if quick else (7, 400, 30)
    with common.torch_threads(THREADS):
        info = common.machine()
        start = time.perf_counter()
        loop = measure_loop(rounds, steps, warmup)
        rates = hook_rates()
        dispatch = measure_dispatch(rates, rounds=5 if quick else 15)
        add_dispatch(loop, dispatch)
        alone = measure_transforms(rounds=5 if quick else 15)
        elapsed = time.perf_counter() - start
    plain = plain_step(loop)
    plain_alone = {name: loop[name]["step"] for name in PLAIN_ARMS}
    aa, (aa_lo, aa_hi) = loop["plain, A/A"]["delta"], loop["plain, A/A"]["delta_range"]
    plot(loop, out_dir / "overhead.png")
    per_step = ", ".join(f"`{h}` {r:g}" for h, r in rates.items())
    md = [
        "## Callback overhead per training step",
        "",
        common.command_block(f"PYTHONPATH=. python benchmarks/overhead.py{' --quick' if quick else ''}"),
        "",
        common.machine_line(info),
        f"- {rounds} rounds; each round is one `Trainer.fit` of {warmup} + {steps} steps per variant, the variants "
        f"taking turns in a shuffled order; {THREADS} torch thread (robust on a shared machine, where another "
        f"process's OpenMP threads compete with ours for the same cores). Ran in {elapsed:.0f} s.",
        f"- Model: one 3 x 3 convolution (8 channels), pooling, dropout 0.1 and a linear layer on "
        f"{' x '.join(map(str, SHAPE))} inputs, batch {BATCH}, SGD, `self.log` of the loss; in-memory data "
        f"({SAMPLES // BATCH} batches per epoch) through `SpeedupDataModule` for every variant; an in-memory logger "
        "(`log_every_n_steps=50`), so knob logging is paid for. Small on purpose: on a real model the same "
        "absolute cost is a far smaller share.",
        "- **Overhead per step** = *ours per step* + *ours per epoch* / batches per epoch + *Lightning dispatch*. "
        "*Ours per step*: the time measured inside the callback's per-step hooks, its `transform_batch`, its "
        "optimizer step hooks and the seam's dispatch, by wrappers around each (mean over the timed steps, so "
        "logging every 50 steps is spread; first-batch checks fall in the warm-up). *Ours per epoch*: epoch "
        "hooks, plus the time the training sampler takes to produce an epoch's index list beyond the default "
        "shuffle's. Median over rounds.",
        "- **Lightning dispatch**: what Lightning spends calling the callback's hooks, outside them (so the "
        "wrappers above miss it). Lightning calls every callback hook on every callback in `trainer.callbacks`, "
        "overridden or not: a `getattr`, the callback's `state_key` (a `SpeedupCallback` works it out once per "
        "fit), the profiler's context manager and the call. Measured apart: the "
        "hooks the loop calls per training step, counted in this benchmark's own fit (the difference between a "
        f"4-epoch and a 2-epoch fit: {per_step} calls per step), are each dispatched through Lightning's "
        f"`_call_callback_hooks` to {DISPATCH_COPIES} copies of the variant's callback, the bodies of the hooks "
        "it overrides replaced by no-ops (their time is *ours per step*), and to no callback; per callback, the "
        "difference over the copies weighted by calls per step, median of "
        f"{5 if quick else 15} interleaved rounds of {DISPATCH_CALLS} calls. Any callback pays it: an empty "
        f"Lightning `Callback` costs {dispatch[EMPTY] * 1e6:.1f} µs per step this way.",
        "- **Whole step**: median interval between two `on_train_batch_end` calls within an epoch (fetch, "
        "transfer, seam, hooks, forward, backward, optimizer); **Δ whole step**: median over rounds of (variant "
        "- plain Trainer in the same round). A cross-check only: a second plain Trainer (the A/A row) differs by "
        f"{aa * 1e6:+.0f} µs (from {aa_lo * 1e6:+.0f} to {aa_hi * 1e6:+.0f} µs over the rounds), so whole-loop "
        "differences of that size are noise on this machine. **transform_batch alone**: the seam call on one "
        f"batch outside the Trainer (median of interleaved samples of {ALONE_CALLS} calls).",
        f"- Goals: every callback at most 1% of a step ({GOAL_PCT * plain * 1e6:.0f} µs of the "
        f"{plain * 1e6:,.0f} µs plain step) and under {GOAL_INACTIVE_S * 1e6:.0f} µs per step when inactive, "
        "Lightning's dispatch included. The plain step is the median over rounds of both plain arms' step times "
        f"(the plain Trainer's and the identical A/A's; alone, their medians are "
        f"{plain_alone['plain Trainer'] * 1e6:,.0f} and {plain_alone['plain, A/A'] * 1e6:,.0f} µs); a verdict "
        "that would flip with either plain arm alone as the denominator is marked *borderline*. "
        "ProgressiveResizing and DropoutRemoval, when active, also change the "
        "model's own work (smaller images, no dropout masks): their whole-step Δ is a net effect, their overhead "
        "the callback's own time.",
        "",
        f"![Overhead per step of each callback against the goals]({out_dir.name}/overhead.png)",
        "",
        report(loop, alone),
        "",
    ]
    failed = []
    for name, r in loop.items():
        ok = _verdict(r, plain)
        if ok is None:
            continue
        limit = "≤ 1% of a step" + (" and < 100 µs" if r["variant"].state == "inactive" else "")
        figure = (
            f"{r['cost'] * 1e6:.1f} µs per step ({r['cost'] / plain:.2%}), of which Lightning's dispatch "
            f"{r['dispatch'] * 1e6:.1f} µs"
        )
        if borderline(r, loop):
            alone_pct = [f"{r['cost'] / plain_alone[arm]:.3%}" for arm in PLAIN_ARMS]
            figure += (
                f"; borderline: {alone_pct[0]} of the plain Trainer's median step alone, {alone_pct[1]} of the A/A's"
            )

        md.append(common.goal_marker(f"{name}: overhead {limit}", figure, ok, "overhead"))
        if not ok:
            failed.append((name, r))
    md += ["", notes(failed, plain, alone, loop)]
    return "\n".join(md)


def notes(
    failed: list[tuple[str, dict[str, Any]]],
    plain: float,
    alone: dict[str, float] | None = None,
    loop: dict[str, dict[str, Any]] | None = None,
) -> str:
    """The closing note: which goals are not met, and why (the causes were found by profiling)."""
    if not failed:
        return "Every callback met the overhead goals on this model."
    alone = alone or {}
    lines = ["**Not met, and why.**", ""]
    for name, r in failed:
        cost = r["cost"]
        part = parts(r)
        why = WHY.get(name, "Its largest parts per step (µs): {largest}.").format(
            largest=fallback_parts_text(r),
            alone=alone.get(name, float("nan")) * 1e6,
            transform=part.get("transform_batch", 0.0) * 1e6,
            end=part.get("on_train_batch_end", 0.0) * 1e6,
            seam=part.get("seam dispatch", 0.0) * 1e6,
            pre=part.get("pre_step", 0.0) * 1e6,
            post=part.get("post_step", 0.0) * 1e6,
            closure=(part.get("before_closure", 0.0) + part.get("after_closure", 0.0)) * 1e6,
            rng=alone.get(RNG, float("nan")) * 1e6,
            mix=alone.get(MIX, float("nan")) * 1e6,
            batch=" x ".join(map(str, (BATCH, *SHAPE))),
            targets=f"{BATCH} x {CLASSES}",
        )
        scale = (
            "it grows with the batch's pixels"
            if r["variant"].changes_work
            else f"about fixed per batch, so under 1% of any step longer than {_ceil_ms(cost / GOAL_PCT)} ms"
        )
        lines.append(
            f"- **{name}**: {cost * 1e6:.0f} µs per step ({r['dispatch'] * 1e6:.0f} µs of it Lightning's "
            f"dispatch), {cost / plain:.2%} of this {plain * 1e3:.1f} ms step; {scale}. {why}".rstrip()
        )
    lines += ["", common_why(loop or {}, alone)]
    return "\n".join(lines)


def _ceil_ms(seconds: float) -> str:
    """``seconds`` in ms rounded *up* to one decimal (a step longer than it is surely long enough)."""
    return f"{math.ceil(round(seconds * 1e4, 6)) / 10:.1f}"


def fallback_parts_text(row: dict[str, Any]) -> str:
    """The parts of a row's overhead per step (µs): per-step parts, the per-epoch share, Lightning's dispatch."""
    text = parts_text(row) or "none over 0.5 µs"
    epoch, batches = row.get("epoch_ours", 0.0), row.get("batches", 0.0)
    if epoch and batches:
        hooks = row.get("epoch_hooks", 0.0)
        pieces = {"the epoch list beyond the default shuffle's": epoch - hooks, "epoch hooks": hooks}
        split = ", ".join(f"{k} {v * 1e6:,.0f}" for k, v in pieces.items() if v * 1e6 >= 0.5)
        text += f"; per epoch {epoch * 1e6:,.0f}" + (f" ({split})" if split else "")
        text += f" over {batches:.0f} batches: {epoch / batches * 1e6:,.1f} per step"
    return text + f"; Lightning's dispatch {row.get('dispatch', 0.0) * 1e6:,.1f}"


def common_why(loop: dict[str, dict[str, Any]], alone: dict[str, float]) -> str:
    """What every callback pays per step, whatever it does, with this run's figures."""
    from lightning_speedups.base import SpeedupCallback

    ratios = [
        parts(r).get("transform_batch", 0.0) / alone[name]
        for name, r in loop.items()
        if alone.get(name) and parts(r).get("transform_batch")
    ]
    in_fit = (
        f": *transform_batch* took {min(ratios):.1f}x to {max(ratios):.1f}x its time alone in this run"
        if ratios
        else ""
    )
    with_callback = [r for r in loop.values() if r["variant"].state != "-"]
    # the callbacks whose on_train_batch_end is SpeedupCallback's own: the knob-logging check and nothing else
    ends = [
        parts(r)["on_train_batch_end"]
        for r in with_callback
        if "on_train_batch_end" in parts(r)
        and all(type(cb).on_train_batch_end is SpeedupCallback.on_train_batch_end for cb in r["variant"].make())
    ]
    check = ""
    if ends:
        check = f" ({statistics.median(ends) * 1e6:.1f} µs per step in this run: median over the callbacks that "
        check += "do nothing else there)"
    text = [
        "Common to all: inside a fit each small tensor op and Python call of ours costs more than in a tight "
        f"loop{in_fit} (caches are cold after the backward pass), and every `SpeedupCallback` checks in "
        f"`on_train_batch_end` whether to log its knobs{check}, reading Lightning's logging cadence from the fit "
        "loop's counters."
    ]
    if with_callback:
        low, high = (f(r["dispatch"] for r in with_callback) * 1e6 for f in (min, max))
        text.append(
            f"Lightning's dispatch of every hook to every callback ({low:.1f} to {high:.1f} µs per step here) is "
            "paid by any callback, ours or not."
        )
        text.append(
            "Lightning builds a profiler label from `state_key` at every hook call, profiler or not; "
            "`SpeedupCallback` works its key out once per fit (at `setup`), so a key that formats the callback's "
            "settings is not formatted again at each call."
        )
    text.append(
        "The seam's dispatch, shared by all the callbacks that transform batches, reads the trainer's stage once "
        "(not `trainer.training` and `trainer.sanity_checking`, two chains of Lightning properties and "
        "string-enum comparisons) and calls each of them."
    )
    return " ".join(text)


#: Causes found by profiling (``cProfile`` of each hook inside a fit, and tight-loop timing of its parts).
WHY: dict[str, str] = {
    "MixUp (active)": (
        "transform_batch: {transform:.0f} µs in the fit ({alone:.0f} µs alone). The mixing arithmetic and the "
        "one-hot targets on this {batch} batch (the functional `mix`) take {mix:.0f} µs alone; the rest is a "
        "fixed cost per batch: re-seeding the batch's draws from (seed, rank, batch index, class), which makes "
        "them reproducible and resumable (`SpeedupCallback.batch_random`, {rng:.0f} µs alone), the draws, the "
        "permutation and the batch fields. Each of these small calls costs several times its tight-loop time "
        "inside the fit (see below), so the fixed part, not the arithmetic, sets this figure on a small batch."
    ),
    "CutMix (active)": (
        "transform_batch: {transform:.0f} µs in the fit ({alone:.0f} µs alone): as MixUp's (draws, "
        "permutation, one-hot, lerp), plus the box draw and a full copy of the batch before pasting (never "
        "in place: a batch may alias the dataset's storage)."
    ),
    "LabelSmoothing (active)": (
        "transform_batch: {transform:.0f} µs in the fit ({alone:.0f} µs alone): the smoothed targets (one "
        "gather from a cached class table into a {targets} tensor), plus the batch fields; no random draw. "
        "`method='loss'` (a loss module attribute set per step) avoids the tensor ops."
    ),
    "ProgressiveResizing (active)": (
        "transform_batch: {transform:.0f} µs in the fit ({alone:.0f} µs alone), almost all the antialiased "
        "bilinear `F.interpolate` of the batch: the technique's own work; whether the smaller step repays it "
        "shows in *Δ whole step*, to be read against the A/A spread."
    ),
    "ProgressiveResizing (inactive)": (
        "Once the schedule is at full size for good (here from the first step; in a run, the fine-tune "
        "phase) transform_batch passes batches through ({transform:.0f} µs); on_train_batch_end "
        "({end:.0f} µs) and the seam ({seam:.0f} µs) make the rest."
    ),
    "LinearScalingWarmup (inactive)": (
        "Its optimizer step hooks run on every update even with a factor of 1: `_pre_step` ({pre:.0f} µs) "
        "finds the optimizer, works out the factor and, at exactly 1, leaves the groups alone but snapshots "
        "their learning rates for logging; `_post_step` ({post:.0f} µs) advances the warmup's clock."
    ),
    "LinearScalingWarmup (active)": (
        "`_pre_step` ({pre:.0f} µs) and `_post_step` ({post:.0f} µs) on every update: the factor, then one "
        "learning-rate scaling, snapshot and restore per param group, and the warmup's clock; around the "
        "step's closure, `_before_closure` and `_after_closure` ({closure:.0f} µs together) put the "
        "scheduler's value back for `training_step` and scale again after it."
    ),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="3 rounds of 150 steps instead of 7 of 400")
    args = parser.parse_args()
    print(section(args.quick, Path("docs/benchmarks")))


if __name__ == "__main__":
    main()
