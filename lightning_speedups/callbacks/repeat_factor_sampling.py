"""Repeat-factor sampling: oversample the images of rare classes (Gupta et al., LVIS, 2019)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np
from torch.utils.data import Dataset, Sampler

from lightning_speedups import _checks
from lightning_speedups.base import SpeedupCallback
from lightning_speedups.functional import sampling as fs
from lightning_speedups.samplers import (
    SamplingPlan,
    build_train_sampler,
    check_plan_in_use,
    require_speedup_datamodule,
    weak_ref,
)

if TYPE_CHECKING:
    import lightning.pytorch as pl

    from lightning_speedups.data import SpeedupDataModule

#: Labels: one class id per sample (an (N, 1) integer column too), a list of class ids per sample, or a multi-hot
#: matrix (N, C).
Labels = Any


#: epochs longer than this many times the dataset are warned about (a threshold meant for rarer classes)
_LONG_EPOCH = 5


class RepeatFactorSampling(SpeedupCallback):
    """Repeat each training sample ``r`` times per epoch on average, ``r`` large for samples of rare classes.

    The LVIS rule: ``f(c)`` is the fraction of samples whose labels include class ``c``,
    ``r(c) = max(1, sqrt(threshold / f(c)))``, and a sample's factor is the largest ``r(c)`` over its labels
    (multi-label samples are supported; a sample without labels gets 1). Classes in at least a ``threshold``
    fraction of the samples are not repeated.

    Each epoch rounds the factors stochastically (2.3 becomes 2 or 3, 2.3 on average) with a generator seeded
    by ``(seed, epoch)``, shuffles, and pads or truncates to a constant ``round(sum(r))`` entries, so every DDP
    rank draws the same epoch, a resumed run draws what the uninterrupted run would have, and the number of
    batches per epoch never changes. The padding and truncation make the averages exact only up to
    ``round(sum(r)) / sum(r)``: on a dataset of a few samples the ratios shift, and a sample can miss an epoch.
    The sampler is a ``DistributedSampler``: Lightning leaves it alone under DDP and each rank takes a disjoint
    shard of equal length. Composes with :class:`CurriculumOrdering`.

    Needs a :class:`~lightning_speedups.SpeedupDataModule`, whose training loader takes its sampler from this
    callback.

    Args:
        threshold: ``t`` of the rule, a fraction in (0, 1]; LVIS uses 0.001. Larger values repeat more classes,
            more often.
        labels: class labels per training sample: an array or sequence (one class id per sample, a list of
            ids per sample, or a multi-hot ``(N, C)`` array or tensor of booleans or 0/1, not a Python list, whose
            rows are read as lists of ids; an ``(N, 1)`` integer array is a column of class ids), or a callable
            taking the training dataset and returning them. ``None`` reads the datamodule's ``sample_labels()``,
            again at each loader reload (labels changed there, pseudo-labels say, change the factors); an array
            or callable given here is read once per training dataset (set ``labels`` anew to change it).
        sqrt: ``r(c) = max(1, sqrt(t / f(c)))`` (the LVIS rule); ``False`` uses ``max(1, t / f(c))``.
        log_top_k: how many of the largest class factors to log (``class_factor/<class id>``).
        seed: seed of the rounding and shuffling; ``None`` takes the datamodule's seed (``PL_GLOBAL_SEED``,
            which ``seed_everything`` sets, else 0), which every rank shares.
        log_knobs: log the knobs below through the trainer's loggers.

    Logged (``repeat_factor_sampling/...``): ``expected_epoch_length`` (``sum(r)``), ``epoch_length``,
    ``max_factor``, ``repeated_fraction`` (share of samples with ``r > 1``), ``class_factor/<id>``.

    Example::

        import lightning.pytorch as pl
        from lightning_speedups import RepeatFactorSampling
        from lightning_speedups.demo import DigitsDataModule, ImageClassifier

        # The datamodule's sample_labels() gives the classes (here a TensorDataset's second tensor). The
        # digits are balanced (f about 0.1 per class): t = 0.2 repeats every sample about sqrt(2) times.
        rfs = RepeatFactorSampling(threshold=0.2)
        trainer = pl.Trainer(max_epochs=1, limit_train_batches=3, callbacks=[rfs], logger=False)
        trainer.fit(ImageClassifier(), datamodule=DigitsDataModule(size=8))
        print(rfs.epoch_length, rfs.largest_class_factors(2))  # 2034 {8: 1.438..., 0: 1.423...}
    """

    log_name = "repeat_factor_sampling"

    def __init__(
        self,
        threshold: float = 0.001,
        *,
        labels: Labels | Callable[[Dataset], Labels] | None = None,
        sqrt: bool = True,
        log_top_k: int = 5,
        seed: int | None = None,
        log_knobs: bool = True,
    ) -> None:
        super().__init__(seed=seed, log_knobs=log_knobs)
        self.threshold = _checks.in_range(
            "threshold",
            threshold,
            0.0,
            1.0,
            low_open=True,
            hint=(
                "It is the fraction of samples below which a class is repeated (LVIS uses 0.001), not a count: "
                "for classes in fewer than n samples pass n / len(dataset). Above 1 every class would be repeated, "
                "as with threshold=1 in epochs sqrt(threshold) times longer."
            ),
        )
        if labels is not None and not callable(labels) and (isinstance(labels, str) or not hasattr(labels, "__len__")):
            raise TypeError(
                f"`labels` must be an array or sequence of class labels per sample, or a callable taking the "
                f"training dataset and returning them; got {type(labels).__name__}."
            )
        self.labels = labels
        self.sqrt = _checks.flag("sqrt", sqrt)
        self.log_top_k = _checks.optional_int("log_top_k", log_top_k, minimum=0)
        self.factors: np.ndarray | None = None
        self.epoch_length = 0
        self._class_ids = np.zeros(0, dtype=np.int64)
        self._class_factors = np.zeros(0)
        self._restored_length: int | None = None

    # ------------------------------------------------------------------ factors
    def compute_factors(self, datamodule: SpeedupDataModule, dataset: Dataset) -> np.ndarray:
        """Per-sample repeat factors from the labels; checks the labels against ``dataset``."""
        who = type(self).__name__
        labels = self.labels
        if labels is None:
            labels = datamodule.sample_labels()
            source = f"`{type(datamodule).__name__}.sample_labels()`"
            if labels is None:
                raise ValueError(
                    f"{who} needs class labels per training sample, and `{type(datamodule).__name__}` has none: "
                    "set `self.train_labels` in its `setup`, override `sample_labels()`, or pass `labels=` to "
                    f"{who}."
                )
        elif callable(labels):
            labels = labels(dataset)
            source = "`labels(dataset)`"
        else:
            source = "`labels`"
        try:
            table = fs.repeat_factor_table(labels, self.threshold, sqrt=self.sqrt)
        except (TypeError, ValueError) as err:
            raise ValueError(f"{who}: the labels from {source} are not usable: {err}") from err
        size = len(dataset)  # type: ignore[arg-type]
        if len(table.sample_factors) != size:
            raise ValueError(
                f"{who}: {source} gives labels for {len(table.sample_factors)} samples, but the training dataset "
                f"has {size}. Give one entry per training sample, in dataset order (an empty list for a sample "
                "without labels)."
            )
        again = self.factors is not None and np.array_equal(self.factors, table.sample_factors)
        self._class_ids, self._class_factors = table.class_ids, table.class_factors
        self.factors = factors = table.sample_factors
        self._factors_of = weak_ref(dataset)
        self._labels_given = self.labels  # what `contribute_to_plan` compares
        self.epoch_length = fs.epoch_length(factors)
        # the same factors for another dataset object (a fresh wrapper per call) were said already
        if not again and self._class_factors.size == 0:
            self.warn("no sample has a label, so every repeat factor is 1 and this is a plain shuffle.")
        elif not again and self._class_factors.max() <= 1.0:
            self.warn(
                f"no class is in fewer than {self.threshold:g} of the samples, so every repeat factor is 1 and "
                "this is a plain shuffle. Raise `threshold` to oversample the rarer classes."
            )
        elif not again and size and self.epoch_length > _LONG_EPOCH * size:
            self.warn(
                f"the repeat factors make each epoch {self.epoch_length / size:.1f}x the dataset ({self.epoch_length} "
                f"samples for {size}; largest factor {float(self._class_factors.max()):.1f}): `threshold="
                f"{self.threshold:g}` repeats much of the data, not only its rare classes. Lower `threshold`, or "
                "set `max_epochs` with this length in mind."
            )
        return factors

    def _check_restored_length(self) -> None:
        """Warn once if a restored checkpoint's epoch length differs from the current labels' one."""
        if self.factors is None or self._restored_length is None:
            return
        restored, self._restored_length = self._restored_length, None  # checked once: a later fit starts clean
        if restored != self.epoch_length:
            self.warn(
                f"the checkpoint was trained with epochs of {restored} samples, these labels give "
                f"{self.epoch_length}: the labels or `threshold` changed, so the resumed run does not draw what "
                "the original would have."
            )

    # ------------------------------------------------------------------ sampler
    def contribute_to_plan(
        self, plan: SamplingPlan, datamodule: SpeedupDataModule, dataset: Dataset, *, seed: int
    ) -> None:
        """Add the repeat factors to ``plan`` (how the callback composes with others)."""
        # Worked out again for another dataset (a loader reload that swapped it, of the same length too), for
        # `labels` set anew, or for the datamodule's labels changed at a reload (pseudo-labels, relabelling): those
        # are read at every loader built. Labels given to the callback (an array; a callable, which may read every
        # sample) are read once per dataset.
        of = self.__dict__.get("_factors_of")
        same = (
            self.factors is not None
            and len(self.factors) == len(dataset)  # type: ignore[arg-type]
            and of is not None
            and of() is dataset
            and self.__dict__.get("_labels_given") is self.labels
        )
        if not same or self.labels is None:  # the datamodule's: changed in place too, so worked out anew (cheap)
            self.compute_factors(datamodule, dataset)
        assert self.factors is not None
        plan.add_repeat_factors(
            self.factors,
            seed=self._given_seed if self._given_seed is not None else seed,
            length=self.epoch_length,
            source=type(self).__name__,
        )

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
        datamodule = require_speedup_datamodule(trainer, type(self).__name__)
        dataset = datamodule.indexed_train_dataset(type(self).__name__)
        self.compute_factors(datamodule, dataset)  # bad labels fail here, before training
        self._restored_length = None  # a checkpoint's, restored after this hook

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        super().on_train_start(trainer, pl_module)
        check_plan_in_use(trainer, type(self).__name__)
        # here, where the loader of the resumed epoch is built: loaders built before it (for
        # `estimated_stepping_batches`) may still see the fit's first training set, not a later reload's
        self._check_restored_length()

    # ------------------------------------------------------------------ logging and state
    def knobs(self) -> dict[str, float]:
        if self.factors is None:
            return {}
        cached = self.__dict__.get("_knobs_cache")
        if cached is not None and cached[0] is self.factors:
            return dict(cached[1])
        # fixed while the factors are: worked out once, not at every logging step (O(dataset) each time)
        out = {
            "expected_epoch_length": float(self.factors.sum()),
            "epoch_length": float(self.epoch_length),
            "max_factor": float(self.factors.max()),
            "repeated_fraction": float(np.mean(self.factors > 1.0)),
        }
        if self.log_top_k:
            top = np.argsort(-self._class_factors, kind="stable")[: self.log_top_k]
            out.update({f"class_factor/{int(self._class_ids[i])}": float(self._class_factors[i]) for i in top})
        self._knobs_cache = (self.factors, out)
        return dict(out)

    def largest_class_factors(self, k: int = 5) -> dict[int, float]:
        """The ``k`` largest class repeat factors, ``{class id: r(c)}``."""
        top = np.argsort(-self._class_factors, kind="stable")[:k]
        return {int(self._class_ids[i]): float(self._class_factors[i]) for i in top}

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "threshold": self.threshold, "epoch_length": self.epoch_length}

    def __getstate__(self) -> dict[str, Any]:
        # picklable (ddp_spawn sends the callbacks to its processes): without the reference to the dataset the
        # factors were worked out for, so a copy works them out again for the dataset it meets
        state = super().__getstate__()
        state.pop("_factors_of", None)
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        super().load_state_dict(state_dict)
        self._restored_length = state_dict.get("epoch_length")  # compared at train start
