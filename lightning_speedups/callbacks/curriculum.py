"""Curriculum ordering: train on the easiest samples first, then on more and more of the data."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.nn.functional as F
from lightning.pytorch.utilities import move_data_to_device
from torch import Tensor
from torch.utils.data import DataLoader, Dataset, Sampler, Subset

from lightning_speedups import _checks
from lightning_speedups._rng import global_rng_kept
from lightning_speedups.base import SpeedupCallback, cap_by_max_steps, run_length
from lightning_speedups.batch import BatchFieldError, BatchFields, Key
from lightning_speedups.functional import sampling as fs
from lightning_speedups.samplers import (
    SamplingPlan,
    build_train_sampler,
    check_plan_in_use,
    datamodule_seed,
    require_speedup_datamodule,
    training_sampler,
    weak_ref,
)

#: the ``max_epochs`` Lightning gives a Trainer with neither ``max_epochs`` nor ``max_steps`` (nor ``max_time``)
_LIGHTNING_DEFAULT_EPOCHS = 1000

if TYPE_CHECKING:
    import lightning.pytorch as pl

    from lightning_speedups.data import SpeedupDataModule

#: ``scorer(pl_module, batch) -> (B,)`` difficulty of each sample of a batch (higher = harder).
Scorer = Callable[[Any, Any], Tensor]


class LossScore:
    """A scorer: the model's per-sample loss (``reduction="none"``), higher for harder samples.

    Used as ``CurriculumOrdering(difficulty=LossScore())``, it scores each training sample with the model as
    it is when training starts (in eval mode, without gradients). A model at its random initialisation ranks
    samples poorly: the scores are useful when the model starts from pretrained weights, or pass a scorer
    that uses a separate teacher (Hacohen & Weinshall's transfer scoring).

    The scoring batches come from the training dataset through the datamodule's ``collate_fn`` and reach the
    device with Lightning's ``move_data_to_device``, not through your ``on_before_batch_transfer``,
    ``transfer_batch_to_device`` or ``on_after_batch_transfer`` hooks (nor any training-batch callback): if your
    batches need those to become model inputs, do the same inside a scorer of your own.

    Under half-precision training (``bf16-true``, ``16-true``) the default cross entropy gets the output as
    float32: in bfloat16 the loss of every confidently right sample rounds to 0, and those ties would be
    ordered at random. A ``loss`` of your own gets the output as the model made it: compute in float32 there.

    Args:
        loss: ``loss(output, target, reduction="none") -> (B,)``; cross entropy by default.
        input_key: where the batch keeps the input (see :class:`~lightning_speedups.BatchFields`).
        target_key: where the batch keeps the target.

    Example::

        >>> import torch
        >>> model = torch.nn.Linear(3, 2)
        >>> LossScore()(model, [torch.zeros(4, 3), torch.tensor([0, 1, 0, 1])]).shape
        torch.Size([4])
    """

    def __init__(
        self,
        loss: Callable[..., Tensor] = F.cross_entropy,
        *,
        input_key: Key | None = None,
        target_key: Key | None = None,
    ) -> None:
        self.loss = loss
        self.fields = BatchFields(input_key=input_key, target_key=target_key)

    def __call__(self, pl_module: Any, batch: Any) -> Tensor:
        x, y = self.fields.get(batch)
        out = pl_module(x)
        if self.loss is F.cross_entropy and isinstance(out, Tensor) and out.dtype in (torch.float16, torch.bfloat16):
            # a half-precision loss rounds a confident sample's to exactly 0: under bf16-true half the scores
            # tied, and ties are ordered at random; the loss in float32 keeps the ranking of the forward pass
            out = out.float()
            if isinstance(y, Tensor) and y.dtype in (torch.float16, torch.bfloat16):  # soft targets
                y = y.float()
        return self.loss(out, y, reduction="none")

    def __repr__(self) -> str:
        """``LossScore(loss=nll_loss, input_key='image')``: the settings that differ from the defaults (so two
        scorers compare by what they do, e.g. in a preset replacement's warning)."""
        parts = [] if self.loss is F.cross_entropy else [f"loss={getattr(self.loss, '__qualname__', self.loss)!s}"]
        parts += [
            f"{k}={v!r}"
            for k, v in (("input_key", self.fields.input_key), ("target_key", self.fields.target_key))
            if v is not None
        ]
        return f"LossScore({', '.join(parts)})"


def _describe_batch(batch: Any) -> str:
    """A batch's structure in a few words, for error messages: ``a list of (Tensor (8,) int64, ...)``."""

    def one(x: Any) -> str:
        if isinstance(x, Tensor):
            return f"Tensor {tuple(x.shape)} {str(x.dtype).removeprefix('torch.')}"
        return type(x).__name__

    if isinstance(batch, Mapping):
        return f"a {type(batch).__name__} of {{{', '.join(f'{k!r}: {one(v)}' for k, v in batch.items())}}}"
    if isinstance(batch, list | tuple):
        return f"a {type(batch).__name__} of ({', '.join(one(v) for v in batch)})"
    return f"a {one(batch)}"


class CurriculumOrdering(SpeedupCallback):
    """Train on the easiest data first: a pool of the easiest samples that grows as training advances.

    A difficulty score per sample orders the training set from easiest to hardest (hardest first with
    ``anti_curriculum=True``); a pacing function gives the fraction of that order available at each optimizer
    step. Pacing works inside an epoch: each position of the epoch list draws (with replacement) from the pool
    of the step it will be trained at. Once the pace reaches all the data, epochs are plain uniform shuffles.

    Pacing functions (``start_fraction`` is the fraction available at the first step):

    * ``"fixed_exponential"`` (Hacohen & Weinshall 2019): the pool starts at ``start_fraction`` and grows by
      ``growth`` every ``step_length`` steps (their CIFAR-100 setting: 0.04, 1.9, 100);
    * ``"linear"``, ``"quad"``, ``"root"``, ``"step"``, ``"exp"``, ``"log"`` (Wu et al. 2021): from
      ``start_fraction`` at the first step to all the data at ``full_at`` of the run's steps.

    Multitask: with a task id per sample, samples are ordered by task (``task_order``, easiest task first;
    by default by mean difficulty, or by id), then by difficulty within each task, so the pool takes in the
    harder tasks as it grows.

    The order is identical on every DDP rank (scores from a scorer are computed on a shard per rank and
    gathered), every rank takes a disjoint shard of equal length of the same epoch list, and the sampler is a
    ``DistributedSampler`` that Lightning leaves alone. A resumed run draws what the uninterrupted run would
    have: scores from a scorer are saved in checkpoints. Composes with :class:`RepeatFactorSampling` (each
    position then draws from the pool weighted by the epoch's repeats). Needs a
    :class:`~lightning_speedups.SpeedupDataModule`.

    Args:
        pacing: one of ``"fixed_exponential"``, ``"linear"``, ``"quad"``, ``"root"``, ``"step"``, ``"exp"``,
            ``"log"``.
        difficulty: per-sample difficulty (higher = harder, finite; booleans read as 0/1): an array, a scorer
            ``scorer(pl_module, batch) -> (B,)`` run over the training set when training starts (e.g.
            :class:`LossScore`), or ``None`` for the datamodule's ``sample_difficulty()``.
        start_fraction: fraction of the easiest data available at the first step, in (0, 1].
        full_at: (Wu et al.'s pacings) fraction of the run's steps after which all data is available, > 0.
        growth: (``"fixed_exponential"``) factor by which the pool grows, > 1.
        step_length: (``"fixed_exponential"``) optimizer steps between growths, >= 1.
        anti_curriculum: hardest samples first (with tasks: the whole order reversed, hardest task first).
        tasks: a task id per sample, an array or a callable taking the training dataset; ``None`` reads the
            datamodule's ``sample_tasks()`` (no tasks if it returns ``None``).
        task_order: task ids from easiest to hardest.
        seed: seed of the draws; ``None`` takes the datamodule's seed, which every rank shares.
        log_knobs: log the knobs below.

    Logged (``curriculum/...``): ``fraction`` (of the data available at the last batch's step) and
    ``pool_size``.

    Example::

        import lightning.pytorch as pl
        from lightning_speedups import CurriculumOrdering
        from lightning_speedups.demo import DigitsDataModule, ImageClassifier

        # Difficulty from the datamodule (`self.train_difficulty`), an array, or a scorer run at fit start:
        # here the pixel variance, low for faint digits; set `train_difficulty` in your datamodule likewise.
        dm = DigitsDataModule(size=8)
        dm.setup("fit")
        curriculum = CurriculumOrdering(
            "linear", difficulty=-dm.train_dataset.tensors[0].var(dim=(1, 2, 3)), start_fraction=0.2, full_at=0.5
        )
        trainer = pl.Trainer(max_epochs=2, callbacks=[curriculum], logger=False)
        trainer.fit(ImageClassifier(), datamodule=dm)  # the first steps draw from the 20% easiest digits
    """

    log_name = "curriculum"

    def __init__(
        self,
        pacing: str = "linear",
        *,
        difficulty: np.ndarray | Sequence[float] | Tensor | LossScore | Scorer | None = None,
        start_fraction: float = 0.2,
        full_at: float = 0.5,
        growth: float = 1.9,
        step_length: int = 100,
        anti_curriculum: bool = False,
        tasks: np.ndarray | Sequence[int] | Tensor | Callable[[Dataset], Any] | None = None,
        task_order: Sequence[int] | None = None,
        seed: int | None = None,
        log_knobs: bool = True,
    ) -> None:
        super().__init__(seed=seed, log_knobs=log_knobs)
        if pacing not in fs.PACING_KINDS:
            raise ValueError(f"`pacing` must be one of {fs.PACING_KINDS}, got {pacing!r}.")
        start = _checks.in_range(
            "start_fraction",
            start_fraction,
            0.0,
            1.0,
            low_open=True,
            hint="It is the fraction of the easiest data available at the first step (1 = no curriculum).",
        )
        full = _checks.positive(
            "full_at", full_at, hint="It is the fraction of training steps after which all the data is available."
        )
        grow = _checks.real("growth", growth)
        if grow <= 1.0:
            raise ValueError(f"`growth` must be > 1, got {growth!r}: the pool grows by this factor each step_length.")
        if step_length is None or not _checks.is_integral(step_length):
            raise TypeError(f"`step_length` must be an int >= 1, got {step_length!r}.")
        step_length = _checks.optional_int("step_length", step_length, minimum=1)
        self.pacing = fs.Pacing(pacing, start, full, grow, int(step_length))
        for name, value in (("difficulty", difficulty), ("tasks", tasks)):
            if value is not None and not callable(value) and (isinstance(value, str) or not hasattr(value, "__len__")):
                raise TypeError(f"`{name}` must be an array of one value per sample or a callable, got {value!r}.")
        self.difficulty = difficulty
        self.anti_curriculum = _checks.flag("anti_curriculum", anti_curriculum, "True orders hardest first.")
        self.tasks = tasks
        if task_order is not None and not isinstance(task_order, str | bytes) and hasattr(task_order, "__iter__"):
            task_order = list(task_order)  # once: a generator would be spent by the check below
        if task_order is not None and (
            isinstance(task_order, str | bytes)
            or not hasattr(task_order, "__iter__")
            or not all(isinstance(t, int | np.integer) and not isinstance(t, bool) for t in task_order)
        ):
            raise TypeError(f"`task_order` must be a sequence of task ids (ints), easiest first; got {task_order!r}.")
        self.task_order = None if task_order is None else [int(t) for t in task_order]
        if self.task_order is not None and len(set(self.task_order)) != len(self.task_order):
            raise ValueError(f"`task_order` must list each task once, got {self.task_order}.")
        self.scores: np.ndarray | None = None  # from a scorer; saved in checkpoints
        self.order: np.ndarray | None = None
        self._order_seed: int | None = None
        # the difficulty and task ids the order was worked out from: a reloaded loader whose datamodule gives
        # other values (a new dataset, of the same length too) gets a new order, the same values keep it
        self._order_inputs: tuple[np.ndarray | None, np.ndarray | None] | None = None
        self._plan: SamplingPlan | None = None
        #: the pacing clock's anchor a resumed run takes from its checkpoint (see ``samplers.step_clock``)
        self.restored_clock_anchor: tuple[int, ...] | None = None
        #: the pacing clock of the checkpoint's loader, whose progress a loader built between epochs keeps
        self.restored_clock: fs.StepClock | None = None
        self._fraction = start
        # (plan, batch index, epoch) of the last batch: its step and fraction are worked out only when the knobs
        # are read (logging), as computing them every step cost more than the rest of the per-step work.
        self._fraction_at: tuple[int, int] | None = None  # (batch index, epoch) of the last batch trained

    @property
    def _who(self) -> str:
        return type(self).__name__

    @property
    def uses_scorer(self) -> bool:
        """Whether difficulty comes from a scorer run over the training set at fit start."""
        return callable(self.difficulty)

    # ------------------------------------------------------------------ difficulty and order
    def _checked(self, values: Any, name: str, size: int, *, finite: bool = True) -> np.ndarray:
        if hasattr(values, "detach"):
            values = fs.tensor_numpy(values)
        arr = np.asarray(values)
        if arr.ndim != 1 or len(arr) != size:
            raise ValueError(
                f"{self._who}: {name} must have one value per training sample ({size}), got shape {arr.shape}."
            )
        if finite:
            if arr.dtype == np.bool_:  # a flag per sample (hard or not): hard is 1, after the easy 0s
                arr = arr.astype(np.float64)
            if not np.issubdtype(arr.dtype, np.number) or np.issubdtype(arr.dtype, np.complexfloating):
                raise ValueError(f"{self._who}: {name} must be real numbers, got dtype {arr.dtype}.")
            bad = np.flatnonzero(~np.isfinite(arr.astype(np.float64)))
            if len(bad):
                raise ValueError(
                    f"{self._who}: {name} has {len(bad)} NaN or infinite value(s), the first at sample {bad[0]} "
                    f"({arr[bad[0]]!r}). Give every sample a finite score."
                )
        return arr

    def _difficulty_array(self, datamodule: SpeedupDataModule, size: int) -> np.ndarray | None:
        if self.uses_scorer:
            trainer = datamodule.trainer
            if self.scores is None and trainer is not None and trainer.lightning_module is not None:
                # The training loader is being built before fit start: `estimated_stepping_batches` read in
                # `configure_optimizers` builds it inside the strategy's setup, with the model already on its
                # device (and, on resume, the saved scores already restored). Score now rather than fail.
                self.scores = self.score(trainer, trainer.lightning_module, datamodule)
            return self.scores
        if self.difficulty is not None:
            return self._checked(self.difficulty, "`difficulty`", size).astype(np.float64)
        values = datamodule.sample_difficulty()
        if values is None:
            return None
        return self._checked(values, f"`{type(datamodule).__name__}.sample_difficulty()`", size).astype(np.float64)

    def _task_array(self, datamodule: SpeedupDataModule, dataset: Dataset, size: int) -> np.ndarray | None:
        tasks = self.tasks(dataset) if callable(self.tasks) else self.tasks
        name = "`tasks`"
        if tasks is None:
            tasks, name = datamodule.sample_tasks(), f"`{type(datamodule).__name__}.sample_tasks()`"
        if tasks is None:
            return None
        arr = self._checked(tasks, name, size)
        if not np.all(np.mod(arr, 1) == 0):
            raise ValueError(f"{self._who}: {name} must be integer task ids.")
        return arr.astype(np.int64)

    def compute_order(self, datamodule: SpeedupDataModule, dataset: Dataset, seed: int = 0) -> np.ndarray:
        """The training set's order from easiest to hardest (hardest first for an anti-curriculum).

        Equal difficulties are ordered at random by ``seed`` (the callback's own seed, if it has one).
        """
        seed = self._given_seed if self._given_seed is not None else seed
        difficulty, tasks = self._order_values(datamodule, dataset)
        return self._order_from(difficulty, tasks, datamodule, dataset, seed)

    def _order_values(
        self, datamodule: SpeedupDataModule, dataset: Dataset
    ) -> tuple[np.ndarray | None, np.ndarray | None]:
        """The difficulty and the task ids of each sample of ``dataset``, checked. Those given to the callback
        (an array, a ``tasks`` callable that may read every sample) are read once per dataset; the datamodule's
        and a scorer's are read each time (a reload may have changed them)."""
        size = len(dataset)  # type: ignore[arg-type]
        if size == 0:
            raise ValueError(f"{self._who}: the training dataset is empty.")
        kept = self._order_inputs
        # reused only for the same dataset object, of the same size, with the same objects given to the callback
        # (a `difficulty` or `tasks` set anew is read; an array changed in place is not seen)
        of = self.__dict__.get("_order_of")
        same = (
            kept is not None
            and of is not None
            and of() is dataset
            and _same_objects(self.__dict__.get("_order_from_given"), (size, self.difficulty, self.tasks))
        )
        given = self.difficulty is not None and not self.uses_scorer
        difficulty = kept[0] if same and given else self._difficulty_array(datamodule, size)  # type: ignore[index]
        tasks = kept[1] if same and self.tasks is not None else self._task_array(datamodule, dataset, size)  # type: ignore[index]
        return difficulty, tasks

    def _order_from(
        self,
        difficulty: np.ndarray | None,
        tasks: np.ndarray | None,
        datamodule: SpeedupDataModule,
        dataset: Dataset,
        seed: int,
    ) -> np.ndarray:
        if self.task_order is not None and tasks is None:
            raise ValueError(
                f"{self._who}: `task_order={self.task_order}` needs a task id per sample, and none was given: pass "
                f"`tasks=` or set `train_tasks` on `{type(datamodule).__name__}` (or drop `task_order`)."
            )
        if difficulty is None and tasks is None:
            if self.uses_scorer:
                raise RuntimeError(f"{self._who}: the scorer has not run yet; it runs once the fit has a model.")
            raise ValueError(
                f"{self._who} needs a difficulty per training sample, and `{type(datamodule).__name__}` has none: "
                "set `self.train_difficulty` in its `setup`, override `sample_difficulty()`, pass "
                "`difficulty=` (an array, or a scorer such as `LossScore()`), or give task ids (`tasks=`)."
            )
        try:
            order = fs.difficulty_order(
                difficulty,
                tasks=tasks,
                task_order=self.task_order,
                anti=self.anti_curriculum,
                seed=seed,
            )
        except ValueError as err:
            raise ValueError(f"{self._who}: {err}") from err
        self.order, self._order_seed, self._order_inputs = order, seed, (difficulty, tasks)
        self._remember_dataset(dataset)
        return order

    def _remember_dataset(self, dataset: Dataset) -> None:
        """The dataset and the given objects the order's values were read for (see ``_order_values``)."""
        self._order_of = weak_ref(dataset)
        # the objects themselves, not their ids: an id is reused once its object is freed
        self._order_from_given = (len(dataset), self.difficulty, self.tasks)  # type: ignore[arg-type]

    def _scorer_note(self, scorer: Any, batch: Any) -> str:
        """What a scorer that raised was given, and for ``LossScore`` where it read the input and target."""
        name = getattr(scorer, "__qualname__", type(scorer).__name__)
        note = f"{self._who}: raised by the scorer {name} on a batch of the training set, {_describe_batch(batch)}."
        if isinstance(scorer, LossScore):
            try:
                where = [scorer.fields.key_of(batch, which) for which in ("input", "target")]
            except Exception:  # no such fields: not what went wrong, as the scorer read them
                return note
            note += (
                f" LossScore read the input from {where[0]!r} and the target from {where[1]!r}: if they are elsewhere,"
                " pass `input_key=` and `target_key=` to it."
            )
        return note

    def score(self, trainer: pl.Trainer, pl_module: pl.LightningModule, datamodule: SpeedupDataModule) -> np.ndarray:
        """Run the scorer over the training set: each rank scores a contiguous part, then all ranks gather."""
        scorer = self.difficulty
        assert callable(scorer)
        dataset = datamodule.get_train_dataset()
        n = len(dataset)  # type: ignore[arg-type]
        world, rank = max(1, trainer.world_size), trainer.global_rank
        per = -(-n // world)
        lo, hi = min(n, rank * per), min(n, (rank + 1) * per)
        loader = DataLoader(
            Subset(dataset, range(lo, hi)),
            batch_size=datamodule.batch_size,
            shuffle=False,
            collate_fn=datamodule.collate_fn,
        )
        parts: list[Tensor] = []
        modes = {module: module.training for module in pl_module.modules()}  # frozen submodules stay frozen
        pl_module.eval()
        try:
            # the loader's seed draw, the dataset's random transforms and the scorer must not move the global
            # generators: the run after scoring draws what it would with an array of difficulties
            with global_rng_kept(), torch.no_grad(), trainer.precision_plugin.val_step_context():
                done = 0
                for batch in loader:
                    batch = move_data_to_device(trainer.precision_plugin.convert_input(batch), pl_module.device)
                    try:
                        raw = scorer(pl_module, batch)
                    except Exception as err:  # e.g. LossScore reading an index column as the input
                        if hasattr(err, "add_note") and not isinstance(err, BatchFieldError):  # Python 3.11+
                            # a note, not another exception: its type stays what `except` clauses (an OOM's) expect
                            err.add_note(self._scorer_note(scorer, batch))
                        raise
                    try:
                        scores = torch.as_tensor(raw).detach().reshape(-1)
                    except (TypeError, RuntimeError, ValueError) as err:
                        raise TypeError(
                            f"{self._who}: the scorer returned {type(raw).__name__}; it must return one number per "
                            "sample of the batch (a tensor or array of shape (B,))."
                        ) from err
                    expected = min(int(loader.batch_size or 1), hi - lo - done)
                    if scores.numel() != expected:  # fail at the first batch, not after scoring the whole set
                        raise ValueError(
                            f"{self._who}: the scorer returned {scores.numel()} scores for a batch of {expected} "
                            "samples; it must return one score per sample of the batch, shape (B,)."
                        )
                    done += expected
                    if scores.is_complex():
                        raise TypeError(f"{self._who}: the scorer returned complex scores; they must be real numbers.")
                    kept = scores.float()
                    if not bool(torch.isfinite(kept).all()) and bool(torch.isfinite(scores).all()):
                        raise ValueError(
                            f"{self._who}: the scorer returned finite scores beyond float32's range (about 3.4e38), "
                            "in which scores are kept; rescale them (their logarithm orders the samples alike)."
                        )
                    parts.append(kept.cpu())  # float32: what checkpoints keep, exactly
        finally:
            for module, training in modes.items():
                module.training = training
        local = torch.cat(parts) if parts else torch.zeros(0)  # hi - lo scores: each batch was checked above
        padded = torch.full((per,), math.nan)
        padded[: len(local)] = local
        gathered = trainer.strategy.all_gather(padded.to(pl_module.device))
        scores = gathered.reshape(-1)[:n].cpu().numpy()
        return self._checked(scores, "the scorer's difficulty", n).astype(np.float32)

    # ------------------------------------------------------------------ sampler
    def contribute_to_plan(
        self, plan: SamplingPlan, datamodule: SpeedupDataModule, dataset: Dataset, *, seed: int
    ) -> None:
        """Add the order and the pacing to ``plan`` (how the callback composes with others)."""
        seed = self._given_seed if self._given_seed is not None else seed
        size = len(dataset)  # type: ignore[arg-type]
        restored = self.__dict__.get("_restored_scores")
        if self.uses_scorer and restored is not None and len(restored) == size and self.scores is not restored:
            # the checkpoint's scores, of the training set a reload gave before it was saved: a resumed run builds
            # the loader of its epoch after loaders that still saw the fit's first set (at fit start, or for
            # `estimated_stepping_batches`), which were scored for themselves
            self.scores, self.order = restored, None
        if self.uses_scorer and self.scores is not None and len(self.scores) != size:
            # a reloaded loader with a training set of another size: the fit start's scores are of other samples
            if restored is None:  # (not said for the loaders a resumed run builds before its epoch's)
                self.warn(
                    f"the training set has {size} samples at this loader reload, the difficulty was scored on "
                    f"{len(self.scores)}: it is scored again, with the model as trained so far (not as it was at "
                    "fit start)."
                )
            self.scores = None  # `_difficulty_array` scores the new set
        values = self._order_values(datamodule, dataset)
        if self.order is None or self._order_seed != seed or not _same_values(values, self._order_inputs):
            self._order_from(*values, datamodule, dataset, seed)
        else:
            self._remember_dataset(dataset)
        assert self.order is not None
        plan.add_curriculum(self.order, self.pacing, seed=seed, source=self._who)
        self._plan = plan

    def make_train_sampler(
        self,
        datamodule: SpeedupDataModule,
        dataset: Dataset,
        *,
        epoch: int,
        num_replicas: int,
        rank: int,
        seed: int,
    ) -> Sampler:
        """The training sampler (the ``SamplerProvider`` protocol of ``SpeedupDataModule``)."""
        return build_train_sampler(
            [self], datamodule, dataset, epoch=epoch, num_replicas=num_replicas, rank=rank, seed=seed
        )

    # ------------------------------------------------------------------ hooks
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        super().setup(trainer, pl_module, stage)
        if stage != "fit":
            return
        datamodule = require_speedup_datamodule(trainer, self._who)
        # A new fit scores the model it starts from; a resumed one gets its saved scores back after setup.
        self.order, self.scores, self._order_inputs, self._restored_scores = None, None, None, None
        self.restored_clock_anchor = self.restored_clock = None  # likewise a resumed run's pacing anchor and clock
        self._plan = None  # an earlier fit's: not the clock this fit's loaders continue
        dataset = datamodule.indexed_train_dataset(self._who)
        if not self.uses_scorer:  # bad scores fail here, before training; a scorer runs at fit start
            self.compute_order(datamodule, dataset, datamodule_seed(datamodule))
        if self.pacing.needs_total_steps and trainer.max_steps == -1 and trainer.max_epochs in (None, -1):
            raise ValueError(
                f"{self._who}(pacing={self.pacing.kind!r}) paces over the run's length, but the Trainer has no "
                "`max_epochs` or `max_steps`. Set one, or use pacing='fixed_exponential'."
            )
        lightning_default = trainer.max_steps == -1 and trainer.max_epochs == _LIGHTNING_DEFAULT_EPOCHS
        if self.pacing.needs_total_steps and lightning_default:
            # what Lightning sets a Trainer with neither (before this hook), so the error above cannot see that case
            self.warn(
                f"pacing={self.pacing.kind!r} paces over the run's length, and the Trainer runs up to "
                f"{_LIGHTNING_DEFAULT_EPOCHS} epochs (Lightning's default where neither `max_epochs` nor `max_steps` "
                "is given): the pool grows over all of them, so a run stopped early sees little more than "
                "`start_fraction` of the data. If that is not the length you train, set `max_epochs` or `max_steps`."
            )

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        super().on_fit_start(trainer, pl_module)
        if not self.uses_scorer:
            return
        datamodule = require_speedup_datamodule(trainer, self._who)
        # The model is set up and on its device; a resumed run restored its scores before this hook. They may be of
        # a training set a reload gave, while the datamodule still gives the first one here (Lightning restores the
        # epoch after this hook): that one is scored, and the loader of the resumed epoch takes the checkpoint's.
        dataset = datamodule.get_train_dataset()
        restored = self.__dict__.get("_restored_scores")
        if restored is not None and len(restored) != len(dataset) and trainer.reload_dataloaders_every_n_epochs:  # type: ignore[arg-type]
            return  # a reload's set: the loader of the resumed epoch takes them (an earlier one scores its own)
        if self.scores is None or len(self.scores) != len(dataset):  # type: ignore[arg-type]
            self.scores = self.score(trainer, pl_module, datamodule)
        self.compute_order(datamodule, dataset, datamodule_seed(datamodule))

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        super().on_train_start(trainer, pl_module)
        plan = check_plan_in_use(trainer, self._who)
        # the resumed epoch's loader is built: later reloads score their own sets, and continue its clock
        self._restored_scores = self.restored_clock = None
        clock = plan.clock
        if clock is None:
            return
        batches = trainer.num_training_batches
        total = cap_by_max_steps(trainer, run_length(trainer, with_max_steps=False))
        batches_differ = math.isfinite(batches) and int(batches) != clock.batches_per_epoch
        total_differs = (
            total is not None
            and clock.anchor == (0, 0)  # else earlier epochs ran at another length, which the trainer's count misses
            and math.isfinite(total)
            and math.isfinite(clock.total_steps)
            and total != clock.total_steps
        )
        sampler = training_sampler(trainer)
        if total_differs and not batches_differ and sampler is not None and not sampler.iterated:
            # A loader built before the trainer knew its optimizers (`trainer.estimated_stepping_batches` read in
            # `configure_optimizers`, under manual optimization with several of them) took `max_steps` as one
            # step per batch. Nothing is drawn yet: pace over the run the trainer will train.
            sampler.retime(total)
        elif batches_differ or total_differs:
            why = ""
            if total_differs and not pl_module.automatic_optimization:
                why = (
                    " Under manual optimization a loader built before the optimizers exist (by reading "
                    "`trainer.estimated_stepping_batches` in `configure_optimizers`) counts `max_steps` as one step "
                    "per batch: set `max_epochs` instead of `max_steps`, or use `num_workers=0`, whose loader "
                    "draws late enough to be corrected."
                )
            self.warn(
                f"the pacing assumed {clock.batches_per_epoch} batches per epoch and {clock.total_steps:g} steps, "
                f"but the trainer runs {batches} and {total}: the pool will grow at another pace than set.{why}"
            )

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        # where the pool stands, worked out only when the knobs are read (`trainer.current_epoch`, without its chain
        # of properties); the plan is the training loader's (`contribute_to_plan` set it when the loader was built)
        self._fraction_at = (batch_idx, trainer.fit_loop.epoch_progress.current.completed)
        super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)

    def _repr_values(self) -> dict[str, Any]:
        pace = self.pacing  # the pacing arguments, kept together in one `Pacing`
        paced = {"start_fraction": pace.start, "full_at": pace.full_at, "growth": pace.growth}
        return {**super()._repr_values(), "pacing": pace.kind, **paced, "step_length": pace.step_length}

    # ------------------------------------------------------------------ logging and state
    def knobs(self) -> dict[str, float]:
        plan = self._plan
        if self._fraction_at is not None and plan is not None and plan.clock is not None:
            batch_idx, epoch = self._fraction_at
            self._fraction, self._fraction_at = plan.pool_fraction(plan.clock.step_of(batch_idx, epoch)), None
        out = {"fraction": float(self._fraction)}
        if self.order is not None:
            out["pool_size"] = float(fs.pool_sizes(np.array([self._fraction]), len(self.order))[0])
        return out

    def __getstate__(self) -> dict[str, Any]:
        # picklable (ddp_spawn sends the callbacks to its processes): without the reference to the dataset the
        # order was worked out for, so a copy reads the difficulty again for the dataset it meets
        state = super().__getstate__()
        state.pop("_order_of", None)
        return state

    def state_dict(self) -> dict[str, Any]:
        state = {**super().state_dict(), "pacing": self.pacing.kind}
        if self.scores is not None:
            state["scores"] = torch.from_numpy(np.asarray(self.scores, dtype=np.float32))
        clock = self._plan.clock if self._plan is not None else None
        if clock is not None:  # the clock a resumed run's loaders continue (its anchor, set by a reload, included)
            state["pace_clock"] = [
                *clock.anchor,
                clock.anchor_progress,
                float(clock.total_steps),
                clock.batches_per_epoch,
                clock.accumulate,
            ]
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        super().load_state_dict(state_dict)
        pace = state_dict.get("pace_clock")
        self.restored_clock = (
            fs.StepClock(
                1,
                int(pace[4]),
                int(pace[5]),
                total_steps=float(pace[3]),
                anchor=(int(pace[0]), int(pace[1])),
                anchor_progress=float(pace[2]),
            )
            if pace
            else None
        )
        # (epoch, step, progress reached there) of a reload's anchor; checkpoints from before kept only its
        # `clock_anchor` (epoch, step)
        clock = self.restored_clock
        anchor = [*clock.anchor, clock.anchor_progress] if clock is not None else state_dict.get("clock_anchor")
        restored = (int(anchor[0]), int(anchor[1]), *map(float, anchor[2:3])) if anchor else None
        self.restored_clock_anchor = restored if restored is not None and restored[:2] != (0, 0) else None
        scores = state_dict.get("scores")
        if scores is not None and self.uses_scorer:
            self.scores = np.asarray(scores.numpy() if hasattr(scores, "numpy") else scores, dtype=np.float32)
            self._restored_scores = self.scores
            # an order worked out before this restore (strategies that restore after their setup score the fresh
            # model at fit start) came from other scores: the next loader works it out again from these
            self.order = None


def _same_values(
    values: tuple[np.ndarray | None, np.ndarray | None],
    before: tuple[np.ndarray | None, np.ndarray | None] | None,
) -> bool:
    """Whether an order's difficulty and task ids are those ``before`` (None: no order yet)."""
    if before is None:
        return False
    return all(
        (a is None and b is None) or (a is not None and b is not None and a.shape == b.shape and np.array_equal(a, b))
        for a, b in zip(values, before, strict=True)
    )


def _same_objects(before: tuple[int, Any, Any] | None, now: tuple[int, Any, Any]) -> bool:
    """Whether ``(size, difficulty, tasks)`` are the size and the very objects given ``before``."""
    return before is not None and before[0] == now[0] and before[1] is now[1] and before[2] is now[2]
