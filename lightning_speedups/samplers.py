"""Training samplers built from a :class:`SamplingPlan`, to which the sampling callbacks contribute.

A plan holds what each sampling callback adds: per-sample repeat factors (:class:`RepeatFactorSampling`), a
difficulty order and a pacing function (:class:`CurriculumOrdering`). Callbacks compose by contributing to one
plan: with both, each epoch rounds the repeat factors stochastically, and each position draws from the easiest
samples available at its step, weighted by how often the epoch repeats them.

:class:`EpochListSampler` turns a plan into indices. It subclasses ``torch.utils.data.DistributedSampler``, so
Lightning neither wraps nor reshuffles it under DDP (``use_distributed_sampler`` can stay on), and it is built
knowing its epoch. Every rank derives the same epoch list from ``(seed, epoch)`` and takes the positions
``rank, rank + W, ...``: disjoint shards of equal length, whose lengths never change between epochs (Lightning
fixes the number of batches once). :meth:`EpochListSampler.skip_next` lets a run resumed mid-epoch continue
where it stopped.

.. code-block:: python

    from lightning_speedups.samplers import EpochListSampler, SamplingPlan

    plan = SamplingPlan(num_samples=1000, seed=0)
    plan.add_repeat_factors(factors, seed=0)   # factors: one float >= 1 per sample
    sampler = EpochListSampler(dataset, plan, epoch=0, num_replicas=2, rank=1)
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import numpy as np
from lightning.pytorch.utilities import rank_zero_warn
from torch.utils.data import Dataset, DistributedSampler

from lightning_speedups.base import (
    SpeedupWarning,
    _clock,
    accumulation_schedule,
    cap_by_max_steps,
    training_epochs,
)
from lightning_speedups.functional import sampling as fs

if TYPE_CHECKING:
    import lightning.pytorch as pl

    from lightning_speedups.data import SpeedupDataModule

_CHUNK = 1 << 16  # indices converted to Python ints per chunk while iterating


@dataclass
class RepeatPart:
    """Repeat factors contributed to a plan."""

    factors: np.ndarray
    seed: int
    length: int
    source: str

    def __post_init__(self) -> None:
        # Whole-number factors round to themselves: each epoch's counts are known without a draw, and all ones
        # (a threshold that repeats no class) is the plain shuffle. The same lists as rounding them each epoch.
        whole = bool(np.all(self.factors == np.floor(self.factors)))
        self.fixed_counts: np.ndarray | None = self.factors.astype(np.int64) if whole else None
        self.all_ones = whole and bool(np.all(self.factors == 1.0))

    def counts(self, epoch: int) -> np.ndarray | None:
        """How often each sample appears in ``epoch`` (``None``: once each)."""
        if self.all_ones:
            return None
        if self.fixed_counts is not None:
            return self.fixed_counts
        return fs.repeat_factor_counts(self.factors, seed=self.seed, epoch=epoch)


@dataclass
class CurriculumPart:
    """A difficulty order (easiest first) and its pacing, contributed to a plan."""

    order: np.ndarray
    pacing: fs.Pacing
    seed: int
    source: str


@dataclass
class SamplingPlan:
    """What the epoch lists of a training run are made of; see the module docstring.

    Args:
        num_samples: length of the training dataset.
        seed: the seed of the shuffle when no contribution brings its own.
    """

    num_samples: int
    seed: int = 0
    repeat: RepeatPart | None = None
    curriculum: CurriculumPart | None = None
    #: maps epoch positions to optimizer steps; needed by a curriculum's pacing.
    clock: fs.StepClock | None = None
    sources: list[str] = field(default_factory=list)

    def add_repeat_factors(
        self, factors: np.ndarray, *, seed: int, length: int | None = None, source: str = "repeat factors"
    ) -> None:
        """Repeat each sample ``factors[i]`` times per epoch on average; epochs have ``length`` entries
        (default ``round(sum(factors))``)."""
        if self.repeat is not None:
            raise ValueError(f"Two callbacks supply repeat factors ({self.repeat.source}, {source}); keep one.")
        factors = np.asarray(factors, dtype=np.float64)
        if factors.shape != (self.num_samples,):
            raise ValueError(
                f"{source} has {factors.shape[0] if factors.ndim else 0} repeat factors but the training dataset "
                f"has {self.num_samples} samples."
            )
        factors = fs.check_factors(factors, f"{source}'s repeat factors")
        if factors.size and factors.max() < 1:  # an epoch might round every factor down: no sample to draw
            raise ValueError(f"{source}: at least one repeat factor must be >= 1 (the largest is {factors.max():g}).")
        self.repeat = RepeatPart(
            factors, int(seed), fs.epoch_length(factors) if length is None else int(length), source
        )
        self.sources.append(source)

    def add_curriculum(self, order: np.ndarray, pacing: fs.Pacing, *, seed: int, source: str = "curriculum") -> None:
        """Order the epochs by ``order`` (sample indices, easiest first) and ``pacing``."""
        if self.curriculum is not None:
            raise ValueError(f"Two callbacks supply a curriculum ({self.curriculum.source}, {source}); keep one.")
        order = np.asarray(order)
        if order.shape != (self.num_samples,):
            raise ValueError(
                f"{source} orders {order.shape[0] if order.ndim else 0} samples but the training dataset has "
                f"{self.num_samples}."
            )
        dtype = fs.index_dtype(self.num_samples - 1)  # the order holds sample indices
        self.curriculum = CurriculumPart(order.astype(dtype, copy=False), pacing, int(seed), source)
        self.sources.append(source)

    @property
    def length(self) -> int:
        """Entries of every epoch list, before padding to a multiple of the number of ranks."""
        return self.repeat.length if self.repeat is not None else self.num_samples

    @property
    def shuffle_seed(self) -> int:
        if self.repeat is not None:
            return self.repeat.seed
        return self.curriculum.seed if self.curriculum is not None else self.seed

    def epoch_indices(
        self, epoch: int, total_size: int | None = None, *, rank: int = 0, num_replicas: int = 1
    ) -> np.ndarray:
        """The epoch list of ``epoch`` with ``total_size`` entries (default :attr:`length`), all ranks'; or,
        with ``num_replicas > 1``, rank ``rank``'s positions of it (``rank, rank + num_replicas, ...``)."""
        n = self.num_samples
        total = self.length if total_size is None else int(total_size)
        if n == 0:
            raise ValueError("The training dataset is empty.")
        shard = {"rank": rank, "num_replicas": num_replicas}
        counts = self.repeat.counts(epoch) if self.repeat is not None else None
        cur = self.curriculum
        if cur is None or cur.pacing.start >= 1.0:  # a pace that starts at all the data: uniform throughout
            return fs.shuffled_epoch(n, total, seed=self.shuffle_seed, epoch=epoch, counts=counts, **shard)
        if self.clock is None:
            raise RuntimeError("A curriculum plan needs a `clock` mapping epoch positions to optimizer steps.")
        pools, batch = fs.position_pools(total, epoch=epoch, clock=self.clock, pacing=cur.pacing, num_samples=n)
        unpaced = None
        if np.any(pools >= n):
            unpaced = fs.shuffled_epoch(n, total, seed=self.shuffle_seed, epoch=epoch, counts=counts, **shard)
            if np.all(pools >= n):
                return unpaced
        return fs.curriculum_epoch(
            cur.order, pools, batch, total, seed=cur.seed, epoch=epoch, counts=counts, unpaced=unpaced, **shard
        )

    def pool_fraction(self, step: int) -> float:
        """The fraction of the data a curriculum makes available at optimizer ``step`` (1 without one)."""
        if self.curriculum is None:
            return 1.0
        if self.clock is None:
            return float(self.curriculum.pacing.fraction([step], math.inf)[0])
        return float(self.clock.pool_fractions(self.curriculum.pacing, [step])[0])


class EpochListSampler(DistributedSampler):
    """The rank's shard of a plan's epoch list; a ``DistributedSampler``, so Lightning leaves it alone.

    Args:
        dataset: the training dataset (for its length only).
        plan: the :class:`SamplingPlan`.
        epoch: the epoch the first pass draws (Lightning's ``fit_loop.epoch_progress.current.processed``).
        num_replicas: number of ranks.
        rank: this rank.
        drop_last: drop the tail of the epoch list that does not fill every rank (else pad it, cyclically).

    Example::

        >>> import numpy as np
        >>> plan = SamplingPlan(num_samples=6, seed=0)
        >>> plan.add_repeat_factors(np.array([1, 1, 1, 1, 1, 2.5]), seed=0)
        >>> shards = [list(EpochListSampler(range(6), plan, epoch=3, num_replicas=2, rank=r)) for r in (0, 1)]
        >>> len(shards[0]) == len(shards[1]) == 4  # round(7.5) = 8 entries, 4 per rank
        True
    """

    def __init__(
        self,
        dataset: Dataset | Sequence[Any],
        plan: SamplingPlan,
        *,
        epoch: int = 0,
        num_replicas: int = 1,
        rank: int = 0,
        drop_last: bool = False,
    ) -> None:
        super().__init__(
            dataset,  # type: ignore[arg-type]
            num_replicas=num_replicas,
            rank=rank,
            shuffle=True,
            seed=plan.shuffle_seed,
            drop_last=drop_last,
        )
        if len(dataset) != plan.num_samples:  # type: ignore[arg-type]
            raise ValueError(f"The plan covers {plan.num_samples} samples, the dataset has {len(dataset)}.")  # type: ignore[arg-type]
        self.plan = plan
        self.num_samples = fs.shard_size(plan.length, num_replicas, drop_last=drop_last)
        self.total_size = self.num_samples * num_replicas
        self.set_epoch(epoch)
        self._skip = 0
        self._cache: tuple[int, np.ndarray] | None = None
        self.iterated = False  # whether a loader has drawn from it yet (`retime`)

    def skip_next(self, n: int) -> None:
        """Skip the first ``n`` indices of this rank's next pass (a run resumed mid-epoch)."""
        self._skip = max(0, int(n))

    @property
    def order_seeds(self) -> tuple[int, ...]:
        """Every seed the epoch lists follow: the repeat factors' and the curriculum's (each callback's own
        ``seed``, or the datamodule's), what a resumed run must share to draw the same lists."""
        parts = (self.plan.repeat, self.plan.curriculum)
        seeds = tuple(int(part.seed) for part in parts if part is not None)
        return seeds or (int(self.plan.seed),)

    def epoch_indices(self, epoch: int | None = None) -> np.ndarray:
        """The whole epoch list (all ranks) of ``epoch`` (default: the current one)."""
        return self.plan.epoch_indices(self.epoch if epoch is None else epoch, self.total_size)

    def rank_indices(self, epoch: int | None = None) -> np.ndarray:
        """This rank's shard of the epoch list."""
        epoch = self.epoch if epoch is None else epoch
        if self._cache is not None and self._cache[0] == epoch:
            return self._cache[1]
        indices = self.plan.epoch_indices(epoch, self.total_size, rank=self.rank, num_replicas=self.num_replicas)
        self._cache = (epoch, indices)
        return indices

    def retime(self, total_steps: float) -> None:
        """Pace over ``total_steps`` instead of the total the plan's clock assumed; only before any draw."""
        if self.iterated:
            raise RuntimeError("The sampler's epoch list is drawn: a new run length would change it mid-epoch.")
        if self.plan.clock is not None:
            self.plan.clock = dataclasses.replace(self.plan.clock, total_steps=float(total_steps))
        self._cache = None

    def __iter__(self) -> Iterator[int]:
        self.iterated = True
        skip, self._skip = self._skip, 0
        indices = self.rank_indices()[skip:]
        return itertools.chain.from_iterable(indices[i : i + _CHUNK].tolist() for i in range(0, len(indices), _CHUNK))

    def __len__(self) -> int:
        return self.num_samples


@runtime_checkable
class PlanContributor(Protocol):
    """A sampling callback that adds to a shared :class:`SamplingPlan`, so that several of them compose."""

    def contribute_to_plan(
        self, plan: SamplingPlan, datamodule: SpeedupDataModule, dataset: Dataset, *, seed: int
    ) -> None: ...


def build_train_sampler(
    providers: Sequence[Any],
    datamodule: SpeedupDataModule,
    dataset: Dataset,
    *,
    epoch: int,
    num_replicas: int,
    rank: int,
    seed: int,
) -> EpochListSampler:
    """The training sampler of one or more sampling callbacks that compose (:class:`PlanContributor`)."""
    names = ", ".join(type(p).__name__ for p in providers)
    if not all(isinstance(p, PlanContributor) for p in providers):
        raise ValueError(
            f"Several callbacks supply the training sampler ({names}); keep one, or only ones that compose "
            "(RepeatFactorSampling with CurriculumOrdering)."
        )
    # the pacing clock of the loader this one replaces (a reload), whose progress the new one keeps
    # (in a resumed run, until its first epoch's loader is built, the checkpoint's)
    previous = next((c for c in (getattr(p, "restored_clock", None) for p in providers) if c is not None), None)
    if previous is None:
        old_plans = [getattr(p, "_plan", None) for p in providers]
        previous = next((old.clock for old in old_plans if old is not None and old.clock is not None), None)
    plan = SamplingPlan(num_samples=len(dataset), seed=int(seed))  # type: ignore[arg-type]
    for provider in providers:
        provider.contribute_to_plan(plan, datamodule, dataset, seed=int(seed))
    drop_last = bool(getattr(datamodule, "drop_last", False))
    sampler = EpochListSampler(dataset, plan, epoch=epoch, num_replicas=num_replicas, rank=rank, drop_last=drop_last)
    batch_size = int(getattr(datamodule, "batch_size", 1) or 1)
    trainer = getattr(datamodule, "trainer", None)
    # a resumed run's anchor, which a reload with another length had set in the checkpoint's run
    restored = next((a for a in (getattr(p, "restored_clock_anchor", None) for p in providers) if a), None)
    plan.clock = step_clock(
        trainer,
        sampler.num_samples,
        batch_size,
        num_replicas,
        drop_last=drop_last,
        restored_anchor=restored,
        previous=previous,
    )
    return sampler


def step_clock(
    trainer: pl.Trainer | None,
    samples_per_rank: int,
    batch_size: int,
    num_replicas: int,
    *,
    drop_last: bool = False,
    restored_anchor: tuple[int, ...] | None = None,
    previous: fs.StepClock | None = None,
) -> fs.StepClock:
    """The :class:`~lightning_speedups.functional.sampling.StepClock` of a loader in ``trainer``'s run.

    Mirrors Lightning's own counts (``num_training_batches`` and ``estimated_stepping_batches``), which do
    not exist yet while the loader is being built: batches per epoch after ``limit_train_batches``,
    ``accumulate_grad_batches``, and the run's length from ``max_epochs`` and ``max_steps``. A loader built
    between epochs (``reload_dataloaders_every_n_epochs``, or a run resumed at an epoch's end) is anchored at the
    steps the run has taken: its earlier epochs may have had another length (another batch size, a resized
    dataset), and the progress the ``previous`` loader's clock had reached there stands (a pace never goes back).
    A run resumed mid-epoch takes the anchor its checkpoint kept (``restored_anchor``: epoch, step and progress).
    """
    batches = samples_per_rank // batch_size if drop_last else -(-samples_per_rank // batch_size)
    if trainer is None:
        return fs.StepClock(batch_size * num_replicas, batches)
    limit = trainer.limit_train_batches
    if isinstance(limit, int) and not isinstance(limit, bool):
        batches = min(batches, limit)
    elif isinstance(limit, float):
        batches = int(batches * limit)
    schedule = accumulation_schedule(trainer)
    accumulate = schedule[0][1] if schedule else max(1, int(trainer.accumulate_grad_batches))
    # Between epochs (a reload, or a run resumed from an epoch's end), the next epoch starts at the steps taken so
    # far, exactly; mid-epoch (a resumed run) at what the checkpoint kept. A loader built before anything trained
    # (a fresh run, or one built before the checkpoint's loops are restored) takes the checkpoint's too, if any.
    progress, clock = trainer.fit_loop.epoch_progress.current, _clock(trainer)
    anchor, reached = (0, 0), 0.0
    same_length = previous is not None and (previous.batches_per_epoch, previous.accumulate) == (batches, accumulate)
    if clock > 0 and progress.started == progress.processed and same_length:
        # the loader this one replaces had this length: its clock stands (its run's length worked out anew below,
        # under this trainer's bounds, as a resumed run with another `max_epochs` does)
        anchor, reached = previous.anchor, previous.anchor_progress
    elif clock > 0 and progress.started == progress.processed:
        anchor = (int(progress.processed), clock)
        before = previous.progress([clock]) if previous is not None else None
        reached = float(before[0]) if before is not None else 0.0
    elif restored_anchor is not None:
        anchor = (int(restored_anchor[0]), int(restored_anchor[1]))
        reached = float(restored_anchor[2]) if len(restored_anchor) > 2 else 0.0
    clock = fs.StepClock(
        batch_size * num_replicas,
        batches,
        accumulate,
        accumulate_from=schedule,
        anchor=anchor,
        anchor_progress=min(max(reached, 0.0), 1.0),
    )
    # max_steps in this clock's unit (batches under manual optimization, see `cap_by_max_steps`): the total the
    # callbacks' own progress uses
    max_epochs = training_epochs(trainer)
    total = math.inf if max_epochs is None or max_epochs == -1 else float(clock.first_step(max(max_epochs, 1)))
    return dataclasses.replace(clock, total_steps=cap_by_max_steps(trainer, total))


def require_speedup_datamodule(trainer: pl.Trainer, who: str) -> SpeedupDataModule:
    """The trainer's :class:`~lightning_speedups.data.SpeedupDataModule`; raise if it has none.

    The sampling callbacks reach the training loader through it: with any other data source they would
    silently do nothing.
    """
    from lightning_speedups.data import SpeedupDataModule

    datamodule = getattr(trainer, "datamodule", None)
    if not isinstance(datamodule, SpeedupDataModule):
        got = "no datamodule" if datamodule is None else f"a {type(datamodule).__name__}"
        raise TypeError(
            f"{who} supplies the training sampler through a `SpeedupDataModule`, but `trainer.fit` got {got}. "
            "Subclass `lightning_speedups.SpeedupDataModule` and pass it as `trainer.fit(model, datamodule=...)`."
        )
    return datamodule


def datamodule_seed(datamodule: Any) -> int:
    """The seed a :class:`~lightning_speedups.data.SpeedupDataModule` gives its samplers (same on every rank)."""
    return int(datamodule._seed())


def training_plan(trainer: pl.Trainer) -> SamplingPlan | None:
    """The :class:`SamplingPlan` behind the trainer's training loader, if it uses an :class:`EpochListSampler`."""
    sampler = training_sampler(trainer)
    return None if sampler is None else sampler.plan


def training_sampler(trainer: pl.Trainer) -> EpochListSampler | None:
    """The :class:`EpochListSampler` of the trainer's training loader, if it uses one."""
    loader = getattr(trainer, "train_dataloader", None)
    for candidate in (
        getattr(loader, "sampler", None),
        getattr(getattr(loader, "batch_sampler", None), "sampler", None),
    ):
        # Samplers that wrap ours (the pipeline mode's ResolutionSampler) keep it as `.sampler`.
        for _ in range(4):
            if candidate is None or isinstance(candidate, EpochListSampler):
                break
            candidate = candidate.__dict__.get("sampler")
        if isinstance(candidate, EpochListSampler):
            return candidate
    return None


def check_plan_in_use(trainer: pl.Trainer, who: str) -> SamplingPlan:
    """The plan of the training loader; raise if ``who`` did not contribute to it (so it would do nothing)."""
    plan = training_plan(trainer)
    if (plan is None or who not in plan.sources) and trainer.overfit_batches > 0:
        raise RuntimeError(
            f"{who} cannot run with `Trainer(overfit_batches={trainer.overfit_batches})`: Lightning then replaces "
            "the training sampler with a sequential one, so the sampling would silently not happen. Remove "
            f"{who} for overfitting runs, or drop `overfit_batches`."
        )
    loaders = getattr(trainer, "train_dataloader", None)
    if (plan is None or who not in plan.sources) and isinstance(loaders, Mapping | list | tuple):
        raise RuntimeError(
            f"{who} needs a single training loader, and `train_dataloader` returns {len(loaders)} in a "
            f"{type(loaders).__name__} (Lightning combines them): the epoch list and its pacing follow one loader's "
            "batches. Return `super().train_dataloader()` alone from the SpeedupDataModule's `train_dataloader`."
        )
    if plan is None or who not in plan.sources:
        raise RuntimeError(
            f"{who} did not supply the training sampler: the training loader does not come from "
            "`SpeedupDataModule.train_dataloader()` (or its sampler from `train_sampler()`), so training would "
            "run without it. Keep the SpeedupDataModule's `train_dataloader` (or return "
            "`super().train_dataloader()` from yours), or build yours as "
            "`lightning_speedups.data.ResumableDataLoader(dataset, sampler=self.train_sampler(dataset), "
            "speedups_datamodule=self, ...)`: a plain DataLoader does not resume mid-epoch."
        )
    if not callable(getattr(trainer.train_dataloader, "state_dict", None)):
        rank_zero_warn(
            "The training loader uses the SpeedupDataModule's sampler but keeps no state in checkpoints (it is not "
            "a `lightning_speedups.data.ResumableDataLoader`): a run resumed from a mid-epoch checkpoint would "
            "train the epoch's first batches again instead of the rest. Return `super().train_dataloader()` from "
            "your `train_dataloader`, or build a ResumableDataLoader.",
            category=SpeedupWarning,
        )
    return plan


def weak_ref(obj: Any) -> Callable[[], Any]:
    """A weak reference to ``obj`` (a callback remembers the dataset it worked something out for, without keeping
    it alive); a strong one for an object that takes no weak reference (a plain list as the dataset)."""
    try:
        return weakref.ref(obj)
    except TypeError:
        return lambda: obj
