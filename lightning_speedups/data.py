"""`SpeedupDataModule`: a LightningDataModule base that builds a sound training DataLoader.

It is also where the sampling callbacks plug in: a callback that implements ``make_train_sampler`` (the
:class:`SamplerProvider` protocol) supplies the training sampler, and reads per-sample metadata (class labels,
difficulty scores) from :meth:`SpeedupDataModule.sample_labels` and :meth:`SpeedupDataModule.sample_difficulty`.
"""

from __future__ import annotations

import itertools
import os
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

import lightning.pytorch as pl
import numpy as np
from lightning.pytorch.accelerators import CUDAAccelerator
from lightning.pytorch.callbacks import BatchSizeFinder
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities import rank_zero_warn
from torch import Tensor
from torch.utils.data import (
    BatchSampler,
    ConcatDataset,
    DataLoader,
    Dataset,
    DistributedSampler,
    IterableDataset,
    Sampler,
    SequentialSampler,
    Subset,
    TensorDataset,
)

from lightning_speedups import _checks
from lightning_speedups.base import SpeedupWarning
from lightning_speedups.functional.sampling import tensor_numpy


@runtime_checkable
class SamplerProvider(Protocol):
    """A callback that supplies the training sampler of a :class:`SpeedupDataModule`.

    The sampler must give every rank a disjoint shard of equal length of an epoch list that all ranks derive
    alike (from ``seed`` and ``epoch``), should subclass ``torch.utils.data.DistributedSampler`` so that
    Lightning neither wraps nor reshuffles it under DDP, and should offer ``skip_next(n)`` (skip the first
    ``n`` indices of the next pass) so that a run resumed mid-epoch continues where it stopped.
    """

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
        """The training sampler of rank ``rank`` of ``num_replicas``, on epoch ``epoch``, seeded by ``seed``."""


@runtime_checkable
class TrainDataWrapper(Protocol):
    """A callback that wraps the training dataset and sampler of a :class:`SpeedupDataModule`.

    ``wrap_train_data`` runs each time the training loader is built, after the sampler is chosen, and returns
    the ``(dataset, sampler)`` the loader uses; ``ProgressiveResizing(mode="pipeline")`` attaches the image
    size of each batch this way. The returned sampler must keep the wrapped one's ``set_epoch``, ``epoch``
    and ``skip_next``, and stay a ``DistributedSampler`` under DDP.
    """

    def wrap_train_data(
        self, datamodule: SpeedupDataModule, dataset: Dataset, sampler: Sampler
    ) -> tuple[Dataset, Sampler]: ...


class EpochShuffleSampler(DistributedSampler):
    """``DistributedSampler`` built knowing its epoch, able to skip the start of its next pass.

    Shuffles by ``(seed, epoch)`` and shards over ranks exactly like ``DistributedSampler`` (single process
    included), so Lightning leaves it alone under DDP. :meth:`skip_next` drops the first indices of the next
    ``__iter__`` only: that is how a run resumed mid-epoch continues where it stopped.
    """

    def __init__(self, dataset: Dataset, *, epoch: int = 0, **kwargs: Any) -> None:
        super().__init__(dataset, **kwargs)
        self.set_epoch(epoch)
        self._skip = 0

    def skip_next(self, n: int) -> None:
        """Skip the first ``n`` indices of this rank's next pass."""
        self._skip = max(0, int(n))

    def __iter__(self) -> Iterator[int]:
        skip, self._skip = self._skip, 0
        return itertools.islice(super().__iter__(), skip, None)


#: `SpeedupDataModule`'s batch size per device when none is given
_DEFAULT_BATCH_SIZE = 64

#: the datamodule's checkpoint entry with its training loader's position
_LOADER_STATE = "train_loader_position"


class ResumableDataLoader(DataLoader):
    """A DataLoader that Lightning can resume mid-epoch.

    Lightning saves the ``state_dict`` of stateful training loaders in checkpoints. Ours records the epoch and
    how many batches of it the trainer has processed; on load, the sampler (if it has ``skip_next``) skips
    those samples, so the resumed epoch continues with the batches the uninterrupted run would have seen.
    """

    def __init__(self, *args: Any, speedups_datamodule: SpeedupDataModule | None = None, **kwargs: Any) -> None:
        # A constructor argument, not an attribute set afterwards: Lightning rebuilds loaders from their
        # constructor arguments (e.g. with another sampler under `overfit_batches`), and the rebuilt one must
        # still record its position.
        super().__init__(*args, **kwargs)
        inner = getattr(self.batch_sampler, "sampler", None)
        if self.batch_size is None and isinstance(inner, DistributedSampler) and inner.num_replicas > 1:
            # `sampler` is then a default SequentialSampler nobody iterates, which Lightning takes for the loader's
            # order: under DDP it would swap the batch sampler's own sampler (ours, already sharded) for its
            # DistributedSampler, silently. Showing ours there lets Lightning leave it alone. (On one device
            # nothing is swapped, and a rebuild for `overfit_batches` keeps the batch sampler as it is.)
            object.__setattr__(self, "sampler", inner)  # DataLoader refuses a plain set
        self.speedups_datamodule = speedups_datamodule
        if speedups_datamodule is not None:
            # the datamodule's training loader, wherever it was built (its own `train_dataloader` or a user's
            # override): it records this loader's position in checkpoints and hands it a restored one
            speedups_datamodule._adopt_train_loader(self)

    def __iter__(self) -> Any:
        if not self.__dict__.get("_restart_checked"):
            self._restart_checked = True
            self._warn_position_lost()
        trainer = self.speedups_datamodule.trainer if self.speedups_datamodule is not None else None
        if trainer is not None:  # Lightning's count of epochs as this one starts (see `state_dict`)
            self._epochs_at_start = int(trainer.fit_loop.epoch_progress.current.processed)
        return super().__iter__()

    def _warn_position_lost(self) -> None:
        """A run resumed mid-epoch from a checkpoint that holds no position of the training data (saved by a loader
        that kept none, before a move to SpeedupDataModule): the epoch's data restart at its first batch while
        Lightning counts the batches done, so some are trained twice and others not at all. Lightning warns of it
        for loaders without state; being one with state, this one must say it itself."""
        dm = self.speedups_datamodule
        trainer = dm.trainer if dm is not None else None
        if trainer is None or "_loaded_state" in self.__dict__ or not trainer.fit_loop.restarting:
            return
        done = int(trainer.fit_loop.epoch_loop.batch_progress.current.processed)
        if 0 < done < trainer.num_training_batches:
            rank_zero_warn(
                f"The checkpoint was saved mid-epoch ({done} batches done) but holds no position of the training "
                "data (its run's loader kept none): this epoch's data start again at their first batch while "
                f"Lightning counts {done} done, so some batches are trained twice and others not at all. Resume "
                "from an epoch-end checkpoint for a clean epoch; checkpoints of this run record the position.",
                category=SpeedupWarning,
            )

    @property
    def order_sampler(self) -> Any:
        """The sampler that orders the samples: the ``batch_sampler``'s own sampler when one was given (the
        loader's ``sampler`` is then a default ``SequentialSampler`` nobody iterates), else ``sampler``."""
        if self.batch_size is None and self.batch_sampler is not None:
            return getattr(self.batch_sampler, "sampler", self.sampler)
        return self.sampler

    def _samples_per_batch(self) -> int | None:
        """Samples per batch, to skip a resumed epoch's first batches at the sampler; None where the batches are
        not the sampler's indices taken in order, ``batch_size`` at a time (a batch sampler of the user's)."""
        if self.batch_size is not None:
            return int(self.batch_size)
        if self.batch_sampler is None:
            return 1  # automatic batching off: each sample is a batch
        if type(self.batch_sampler).__iter__ is not BatchSampler.__iter__:
            # grouping by aspect ratio or length, say: batch k holds other indices than the sampler's k-th block
            return None
        size = getattr(self.batch_sampler, "batch_size", None)
        return size if isinstance(size, int) and size > 0 else None

    @property
    def _index_sampler(self) -> Any:
        # what DataLoader iterators draw their batches' indices from; under a batch sampler of the user's, one
        # that leaves out the first batches of its next pass after a mid-epoch resume (read at its first batch)
        index_sampler = super()._index_sampler
        if index_sampler is self.batch_sampler and self._samples_per_batch() is None:
            return _SkipFirstBatches(index_sampler, self)
        return index_sampler

    def _order_seeds(self, dm: SpeedupDataModule) -> list[int]:
        """The seeds the order follows: the sampler's own (``order_seeds`` of the sampling callbacks' sampler, each
        callback's ``seed`` or the datamodule's; a ``seed`` attribute), else the datamodule's."""
        sampler = self.order_sampler
        seeds = getattr(sampler, "order_seeds", None)
        if seeds is None:
            seed = getattr(sampler, "seed", None)
            seeds = (seed,) if isinstance(seed, int) else (dm._seed(),)
        return [int(s) for s in seeds]

    def state_dict(self) -> dict[str, int]:
        dm = self.speedups_datamodule
        trainer = dm.trainer if dm is not None else None
        if trainer is None:
            return {}
        batches = int(trainer.fit_loop.epoch_loop.batch_progress.current.processed)
        counted = int(trainer.fit_loop.epoch_progress.current.processed)
        return {
            "epoch": self._epoch_in_progress(trainer),
            "batches": batches,
            "epoch_done": int(batches >= trainer.num_training_batches),
            # saved at the end hooks of an epoch (Lightning has counted it since it started): with batches left, one
            # that ended early (`max_steps`, `should_stop`), which Lightning resumes as finished. Not `processed >
            # completed`: a run resumed with `max_steps` keeps those apart all along.
            "epoch_counted": int(counted > self.__dict__.get("_epochs_at_start", counted)),
            "seeds": self._order_seeds(dm),  # compared on resume: the order follows them
            **self._geometry(trainer),  # likewise: what the skipped batches held
        }

    def _geometry(self, trainer: pl.Trainer | None) -> dict[str, int]:
        """What a number of batches done means: the dataset's length, samples per batch and processes."""
        try:
            size = len(self.dataset)  # type: ignore[arg-type]
        except TypeError:
            return {}
        per_batch = self._samples_per_batch()
        world = int(getattr(trainer, "world_size", 1) or 1) if trainer is not None else 1
        return {"num_samples": size, "world_size": world, **({"per_batch": per_batch} if per_batch else {})}

    def _epoch_in_progress(self, trainer: pl.Trainer) -> int:
        """The epoch of the pass the trainer is in: the sampler's ``epoch`` where it has one (what ``set_epoch``
        gave it), else the trainer's current epoch, which is that epoch while training runs. A sampler may follow
        ``set_epoch`` without exposing ``epoch``: recording 0 for it would replay epoch 0's order on resume."""
        epoch = getattr(self.order_sampler, "epoch", None)
        return int(trainer.current_epoch if epoch is None else epoch)

    @staticmethod
    def _warn_seeds(saved: list[int], seeds: list[int], dm: SpeedupDataModule) -> None:
        # each seed is the datamodule's, or a sampling callback's own `seed=`, which then sets its part of the order
        fixes = []
        for was, now in zip(saved, seeds, strict=False):
            if was == now:
                continue
            if now == dm._seed():
                fixes.append(
                    f"Call `seed_everything({was})` before `fit`, or pass `seed={was}` to {type(dm).__name__}."
                )
            else:
                fixes.append(f"Pass `seed={was}` to the sampling callback whose seed is {now}.")
        if len(saved) != len(seeds):
            fixes.append("The sampling callbacks differ from the checkpoint's run too.")
        shown = [", ".join(map(str, s)) for s in (saved, seeds)]
        rank_zero_warn(
            f"The checkpoint's run shuffled its training data with seed {shown[0]}, this run with seed {shown[1]}: "
            f"the resumed run will not train on the batches the uninterrupted one would have. {' '.join(fixes)}",
            category=SpeedupWarning,
        )

    def _warn_geometry(self, state_dict: dict[str, int], dm: SpeedupDataModule | None) -> None:
        """A mid-epoch resume skips as many batches as were done: with another dataset length, batch size or
        number of processes, those are not the samples the checkpoint's run trained on."""
        trainer = dm.trainer if dm is not None else None
        if trainer is not None and trainer.current_epoch != state_dict["epoch"]:
            # a loader built before Lightning restored its loops (`estimated_stepping_batches`): its data may be
            # another epoch's (reloads), and the loader of the resumed epoch, built later, is checked then
            return
        now = self._geometry(trainer)
        names = {"num_samples": "samples", "per_batch": "samples per batch", "world_size": "processes"}
        changed = [
            f"{names[k]} {state_dict[k]} -> {now[k]}"
            for k in names
            if k in state_dict and k in now and int(state_dict[k]) != now[k]
        ]
        if changed:
            rank_zero_warn(
                f"The checkpoint was saved mid-epoch by a run with other training data ({', '.join(changed)}): the "
                f"resumed epoch skips its first {state_dict['batches']} batches of this run's order, which are not "
                "the samples that run trained on, so the rest of the epoch may repeat some and miss others. Resume "
                "from an epoch-end checkpoint to start a clean epoch.",
                category=SpeedupWarning,
            )

    @staticmethod
    def _warn_cut_epoch(state_dict: dict[str, int]) -> None:
        rank_zero_warn(
            f"The checkpoint was saved at the end of epoch {state_dict['epoch']}, which ended early (`max_steps`, "
            f"`should_stop`, `max_time`) after {state_dict['batches']} batches: Lightning 2.6 counts that epoch as "
            "finished, so the resumed run trains its remaining batches from the next epoch's order, and each later "
            "epoch one epoch's order ahead of the uninterrupted run. For an exact resume use a checkpoint saved "
            "mid-epoch (`ModelCheckpoint(every_n_train_steps=...)`, at the step `max_steps` stopped), not one saved at "
            "the epoch's end (`save_last`, `save_on_train_epoch_end`).",
            category=SpeedupWarning,
        )

    def _check_seeds(self, state_dict: dict[str, Any]) -> None:
        """Warn (once per pair of seeds) where the checkpoint's run shuffled with other seeds than this run."""
        dm = self.speedups_datamodule
        # "seed": a checkpoint saved before every seed of the order was recorded
        saved = state_dict.get("seeds", [state_dict["seed"]] if "seed" in state_dict else None)
        seeds = self._order_seeds(dm) if dm is not None else None
        if dm is not None:
            dm._seeds_checked = dict(state_dict)  # a later loader of this restore need not check again
        if seeds is None or saved is None or [int(s) for s in saved] == seeds:
            return
        pair = ([int(s) for s in saved], seeds)
        if self.__dict__.get("_seeds_warned") != pair:
            self._seeds_warned = pair
            self._warn_seeds(*pair, dm)  # type: ignore[arg-type]

    def load_state_dict(self, state_dict: dict[str, int]) -> None:
        # Called before Lightning creates the first iterator of the resumed run, and before it calls
        # set_epoch: the sampler must be put on the right epoch here, or that iterator replays a stale one.
        # It may come twice with the same state (from the datamodule's checkpoint entry, then from Lightning's
        # loop state): the second time changes nothing and says nothing again.
        if "epoch" not in state_dict or state_dict == self.__dict__.get("_loaded_state"):
            return
        self._loaded_state = dict(state_dict)
        dm = self.speedups_datamodule
        self._check_seeds(state_dict)
        done = bool(state_dict.get("epoch_done"))
        trainer = dm.trainer if dm is not None else None
        if not done and state_dict.get("batches") and state_dict.get("epoch_counted") and trainer is not None:
            # saved at the end hooks of an epoch that ended early: Lightning counts it finished and goes on with
            # the next epoch's order, for the batches the cut epoch had left
            self._warn_cut_epoch(state_dict)
            state_dict = {**state_dict, "epoch": int(trainer.fit_loop.epoch_progress.current.processed), "batches": 0}
        if not done and state_dict.get("batches"):
            self._warn_geometry(state_dict, dm)
        epoch = state_dict["epoch"] + 1 if done else state_dict["epoch"]
        sampler = self.order_sampler
        if hasattr(sampler, "set_epoch"):
            sampler.set_epoch(epoch)
        if done or not state_dict.get("batches"):
            return
        skip, per_batch = getattr(sampler, "skip_next", None), self._samples_per_batch()
        if per_batch is None:
            # a batch sampler of the user's, around a sampler that replays an epoch's order (ours and a
            # DistributedSampler after `set_epoch` above, a SequentialSampler): that pass drawn again and its first
            # batches left out, whatever it groups; indices only, no sample is loaded for them
            inner = getattr(self.batch_sampler, "sampler", None)
            if skip is not None or isinstance(inner, SequentialSampler | DistributedSampler):
                self._skip_batches = int(state_dict["batches"])
                return
            what = (
                f"The training sampler {type(inner).__name__} replays no epoch's order"
                if inner is not None
                else f"The batch sampler {type(self.batch_sampler).__name__} shows no sampler whose order replays"
            )
        elif skip is not None:
            skip(state_dict["batches"] * per_batch)
            return
        else:
            what = f"The training sampler {type(sampler).__name__} has no `skip_next`"
        rank_zero_warn(
            f"{what}: a run resumed mid-epoch restarts the epoch's data from its first batch.", category=SpeedupWarning
        )


class _SkipFirstBatches:
    """A loader's batch sampler whose next pass leaves out the loader's pending ``_skip_batches`` batches."""

    def __init__(self, batch_sampler: Any, loader: ResumableDataLoader) -> None:
        # weakly: a persistent iterator holds this, and the loader holds the iterator; a strong reference would
        # keep a replaced loader (a reload) and its worker processes alive until the cycle collector ran
        self.batch_sampler, self._loader = batch_sampler, weakref.ref(loader)

    def __iter__(self) -> Iterator[Any]:
        # read at the first batch, as a sampler's `skip_next` is: an iterator made before the position was
        # restored still starts where the checkpoint stopped
        loader = self._loader()
        skip = loader.__dict__.get("_skip_batches", 0) if loader is not None else 0
        if skip and loader is not None:
            loader._skip_batches = 0
        del loader  # a pass left unfinished must not hold it: loader -> its iterator -> this paused generator
        yield from itertools.islice(iter(self.batch_sampler), skip, None)

    def __len__(self) -> int:
        return len(self.batch_sampler)


def _restoring_checkpoint(trainer: pl.Trainer | None) -> bool:
    """Whether Lightning holds a checkpoint it is restoring (between loading the file and restoring the loops):
    a loader built then is the resumed run's. Not after a ``BatchSizeFinder`` trial's own restore, whose
    position is the trial's."""
    connector = getattr(trainer, "_checkpoint_connector", None)
    return bool(getattr(connector, "_loaded_checkpoint", None))


def _searches_before_the_loops_resume(trainer: pl.Trainer | None) -> bool:
    """Whether Lightning's own ``BatchSizeFinder`` searches at fit start, between the restore of the datamodule
    and that of the loops (not under a strategy that restores the checkpoint after its setup). A subclass that
    searches at fit start too is seen when its trials begin (:meth:`SpeedupDataModule._in_finder_trial`)."""
    if trainer is None or getattr(getattr(trainer, "strategy", None), "restore_checkpoint_after_setup", False):
        return False
    return any(
        isinstance(cb, BatchSizeFinder) and type(cb).on_fit_start is BatchSizeFinder.on_fit_start
        for cb in trainer.callbacks
    )


def _trains_with(trainer: pl.Trainer, loader: DataLoader) -> bool:
    """Whether ``loader`` is among the training loaders Lightning holds for this fit."""
    loaders = trainer.train_dataloader  # None before Lightning sets one up
    if isinstance(loaders, Mapping):
        loaders = list(loaders.values())
    return any(item is loader for item in (loaders if isinstance(loaders, list | tuple) else [loaders]))


def available_cpus() -> int:
    """CPUs this process may run on (the affinity mask where the OS has one)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def _in_memory_tensors(dataset: Any) -> bool:
    if isinstance(dataset, TensorDataset):
        return True
    if isinstance(dataset, Subset):
        return _in_memory_tensors(dataset.dataset)
    if isinstance(dataset, ConcatDataset):
        return bool(dataset.datasets) and all(_in_memory_tensors(d) for d in dataset.datasets)
    return False


def dataset_labels(dataset: Dataset) -> np.ndarray | Sequence[Any] | None:
    """The class labels ``dataset`` carries: a torchvision-style ``targets``, a ``TensorDataset``'s second
    tensor, or those of the datasets under a ``Subset`` or ``ConcatDataset``; ``None`` if it has none."""
    if getattr(dataset, "targets", None) is not None:
        return _positional(dataset.targets)  # type: ignore[attr-defined]
    if isinstance(dataset, TensorDataset) and len(dataset.tensors) >= 2:
        return tensor_numpy(dataset.tensors[1])
    if isinstance(dataset, Subset):
        inner = dataset_labels(dataset.dataset)
        if inner is None:
            return None
        if isinstance(inner, np.ndarray | Tensor):
            inner = tensor_numpy(inner) if isinstance(inner, Tensor) else inner
            return inner[np.asarray(dataset.indices, dtype=np.int64)]
        return [inner[int(i)] for i in dataset.indices]
    if isinstance(dataset, ConcatDataset):
        parts = [dataset_labels(d) for d in dataset.datasets]
        if any(p is None for p in parts):
            return None
        # an (N, 1) integer column is class ids (as the labels' docs say): compare it as (N,)
        arrays = [_id_column_as_ids(np.asarray(p)) for p in parts if isinstance(p, np.ndarray | Tensor)]
        if len(arrays) == len(parts):
            # ids (N,) or multi-hot rows (N, C): concatenated as one array, so multi-hot rows stay multi-hot (a
            # list of rows would be read as lists of class ids)
            if len({a.shape[1:] for a in arrays}) > 1:
                shapes = ", ".join(str(a.shape) for a in arrays)
                raise ValueError(
                    f"The datasets of this ConcatDataset carry labels of different shapes ({shapes}), which cannot "
                    "be put together as one label array. Give the labels yourself (`labels=` of the callback, or "
                    "`sample_labels()`/`train_labels` on the datamodule)."
                )
            return np.concatenate(arrays)
        if any(a.ndim > 1 for a in arrays):
            raise ValueError(
                "Part of this ConcatDataset carries array labels of 2 or more dims (multi-hot rows?) and part a "
                "Python sequence, which cannot be put together without guessing. Give the labels yourself "
                "(`labels=` of the callback, or `sample_labels()`/`train_labels` on the datamodule)."
            )
        return [label for p in parts for label in p]  # type: ignore[union-attr]
    return None


def _positional(labels: Any) -> Any:
    """``labels`` indexable by position: an array-like that is neither a list, a tuple, an array nor a tensor (a
    pandas Series or DataFrame) becomes an array, since ``series[i]`` looks ``i`` up in its index (a shuffled or
    filtered frame's is not ``0..N-1``) and iterating a DataFrame gives its column names."""
    if isinstance(labels, Sequence | np.ndarray | Tensor) or not hasattr(labels, "__array__"):
        return labels  # a Sequence (pandas' are not) is indexed by position already; ragged lists stay lists
    try:
        return np.asarray(labels)
    except ValueError:  # not one array: left to be read as a sequence
        return labels


def _id_column_as_ids(labels: np.ndarray) -> np.ndarray:
    integral = np.issubdtype(labels.dtype, np.integer)
    return labels[:, 0] if labels.ndim == 2 and labels.shape[1] == 1 and integral else labels


def default_num_workers(dataset: Dataset, processes_per_node: int = 1) -> int:
    """Worker processes for a training loader: none for in-memory tensors, else a share of the CPUs.

    A ``TensorDataset`` is plain indexing: worker processes would only add inter-process copies; so is a
    ``Subset`` of one (what ``random_split`` returns) or a ``ConcatDataset`` of them. An ``IterableDataset`` gets
    none either: each worker would iterate the whole stream unless it splits itself by ``get_worker_info()``
    (give ``num_workers`` for one that does). Otherwise each training process gets its share of the CPUs, minus one
    for the process itself, at most 8.
    """
    if _in_memory_tensors(dataset) or isinstance(dataset, IterableDataset):
        return 0
    return max(0, min(8, available_cpus() // max(1, processes_per_node) - 1))


class SpeedupDataModule(pl.LightningDataModule):
    """A DataModule whose ``train_dataloader`` has sound defaults and takes samplers from our callbacks.

    Subclass it and set ``self.train_dataset`` in ``setup`` (or override :meth:`get_train_dataset`); write
    ``val_dataloader`` as usual, or with :meth:`eval_dataloader` for the same defaults.

    Defaults: worker processes from the CPU count (none for in-memory tensors), ``pin_memory`` when training
    on CUDA, persistent workers, and a shuffle seeded by ``(seed, epoch)`` that is sharded across DDP ranks.
    The training loader is resumable: a run resumed from a checkpoint, at an epoch boundary or mid-epoch,
    sees the data in the order the uninterrupted run would have.

    Args:
        batch_size: samples per batch and per process.
        num_workers: DataLoader workers; ``None`` chooses as described above.
        pin_memory: page-locked host memory; ``None`` enables it when the trainer trains on CUDA.
        persistent_workers: keep workers alive between epochs (when there are workers).
        drop_last: drop the last incomplete batch.
        shuffle: shuffle the training set each epoch.
        seed: seed of the shuffle; ``None`` takes ``PL_GLOBAL_SEED`` (set by ``seed_everything``), else 0.
        collate_fn: passed to the DataLoaders.

    Example::

        import torch
        from torch.utils.data import TensorDataset
        from lightning_speedups import SpeedupDataModule

        class Blobs(SpeedupDataModule):
            num_classes = 3

            def setup(self, stage):
                x, y = torch.randn(300, 2), torch.randint(0, 3, (300,))
                self.train_dataset = TensorDataset(x[:240], y[:240])
                self.val_dataset = TensorDataset(x[240:], y[240:])

            def val_dataloader(self):
                return self.eval_dataloader(self.val_dataset)

        dm = Blobs(batch_size=32)
    """

    #: the training dataset; set it in ``setup`` or override :meth:`get_train_dataset`.
    train_dataset: Dataset | None = None

    def __init__(
        self,
        batch_size: int = _DEFAULT_BATCH_SIZE,
        *,
        num_workers: int | None = None,
        pin_memory: bool | None = None,
        persistent_workers: bool = True,
        drop_last: bool = False,
        shuffle: bool = True,
        seed: int | None = None,
        collate_fn: Callable[[list[Any]], Any] | None = None,
    ) -> None:
        super().__init__()
        self.batch_size = _checks.optional_int("batch_size", batch_size, minimum=1)
        self.num_workers = _checks.optional_int("num_workers", num_workers, minimum=0)
        self.pin_memory = _checks.flag("pin_memory", pin_memory, optional=True)
        self.persistent_workers = _checks.flag("persistent_workers", persistent_workers)
        self.drop_last = _checks.flag("drop_last", drop_last)
        if self.batch_size is None and self.drop_last:
            raise ValueError(
                "`drop_last=True` needs a `batch_size`: with batch_size=None each sample is a batch of its own, so "
                "there is no incomplete batch to drop. Set `batch_size`, or leave drop_last=False."
            )
        self.shuffle = _checks.flag("shuffle", shuffle)
        self.seed = _checks.optional_int("seed", seed, minimum=0)
        self.collate_fn = collate_fn

    # ------------------------------------------------------------------ what users provide
    def get_train_dataset(self) -> Dataset:
        """The training dataset; by default ``self.train_dataset``."""
        if self.train_dataset is None:
            raise RuntimeError(
                f"{type(self).__name__} has no training dataset: set `self.train_dataset` in `setup()` or "
                "override `get_train_dataset()`."
            )
        return self.train_dataset

    def sample_labels(self) -> np.ndarray | Sequence[Sequence[int]] | None:
        """Class labels of each training sample, for samplers that balance classes.

        One int per sample, or a sequence of ints per sample for multi-label data. By default:
        ``self.train_labels`` if set, else the dataset's ``targets`` (torchvision datasets), else the second
        tensor of a ``TensorDataset``, also through a ``Subset`` (``random_split``) or ``ConcatDataset`` of
        those; ``None`` if none of those exists.
        """
        labels = getattr(self, "train_labels", None)
        if labels is not None:
            return labels
        return dataset_labels(self.get_train_dataset())

    def sample_difficulty(self) -> np.ndarray | None:
        """A difficulty score per training sample (higher = harder), for curricula; ``self.train_difficulty``."""
        return getattr(self, "train_difficulty", None)

    def sample_tasks(self) -> np.ndarray | None:
        """A task id per training sample, for multitask curricula; ``self.train_tasks``."""
        return getattr(self, "train_tasks", None)

    # ------------------------------------------------------------------ loaders
    def _processes_per_node(self) -> int:
        trainer = self.trainer
        return int(getattr(trainer, "num_devices", 1) or 1) if trainer is not None else 1

    def loader_kwargs(self, dataset: Dataset) -> dict[str, Any]:
        """DataLoader keyword arguments shared by the training and evaluation loaders."""
        workers = self.num_workers
        if workers is None:
            workers = default_num_workers(dataset, self._processes_per_node())
        # an evaluation loader's own workers, where `eval_dataloader` is building one (an override of this method
        # that leaves pinning alone gets the default for them too)
        own_workers, own_persistent = self.__dict__.get("_eval_workers") or (None, self.persistent_workers)
        pinned_workers = workers if own_workers is None else own_workers
        pin = self._default_pin(pinned_workers, own_persistent) if self.pin_memory is None else self.pin_memory
        kwargs: dict[str, Any] = {"num_workers": workers, "pin_memory": pin, "collate_fn": self.collate_fn}
        if workers > 0:
            kwargs["persistent_workers"] = self.persistent_workers
        return kwargs

    def _default_pin(self, workers: int, persistent: bool) -> bool:
        """Pinned memory when training on CUDA, but not beside persistent workers in reloaded loaders: the three
        together are unstable (pytorch#91252, which Lightning warns about)."""
        if self.trainer is None or not isinstance(self.trainer.accelerator, CUDAAccelerator):
            return False
        return not (workers > 0 and persistent and self.trainer.reload_dataloaders_every_n_epochs)

    def _sampler_context(self) -> dict[str, int]:
        trainer = self.trainer
        if trainer is None:
            return {"epoch": 0, "num_replicas": 1, "rank": 0, "seed": self._seed()}
        return {
            # The epoch Lightning will pass to set_epoch: right also while resuming, when current_epoch is not.
            "epoch": int(trainer.fit_loop.epoch_progress.current.processed),
            "num_replicas": int(trainer.world_size),
            "rank": int(trainer.global_rank),
            "seed": self._seed(),
        }

    def _seed(self) -> int:
        return self.seed if self.seed is not None else int(os.environ.get("PL_GLOBAL_SEED", 0))

    def sampler_providers(self) -> list[Any]:
        """The trainer's callbacks that supply a training sampler (a :class:`SamplerProvider`) or add to the plan
        of one (a :class:`~lightning_speedups.samplers.PlanContributor`)."""
        trainer = self.trainer
        callbacks = trainer.callbacks if trainer is not None else []
        return [
            cb
            for cb in callbacks
            if isinstance(cb, SamplerProvider) or callable(getattr(cb, "contribute_to_plan", None))
        ]

    def train_sampler(self, dataset: Dataset) -> Sampler:
        """The training sampler: a sampling callback's, else a per-epoch seeded shuffle sharded over ranks."""
        ctx = self._sampler_context()
        providers = self.sampler_providers()
        if providers and not self.shuffle:
            rank_zero_warn(
                f"{type(self).__name__}(shuffle=False) is ignored: "
                f"{', '.join(type(p).__name__ for p in providers)} orders the training data. Remove the sampling "
                "callback for a fixed order.",
                category=SpeedupWarning,
            )
        if len(providers) > 1 or (providers and not isinstance(providers[0], SamplerProvider)):
            # composing callbacks (or one that only contributes) add to one plan; any other pair is refused there
            from lightning_speedups.samplers import build_train_sampler

            return build_train_sampler(providers, self, dataset, **ctx)
        if len(providers) == 1:
            return providers[0].make_train_sampler(self, dataset, **ctx)
        return EpochShuffleSampler(
            dataset,
            epoch=ctx["epoch"],
            num_replicas=ctx["num_replicas"],
            rank=ctx["rank"],
            shuffle=self.shuffle,
            seed=ctx["seed"],
            drop_last=self.drop_last,
        )

    def indexed_train_dataset(self, who: str | None = None) -> Dataset:
        """The training dataset, which must be map-style: the training loader and the sampling callbacks
        (``who``) order samples by index. Raises a ``TypeError`` that says so for an ``IterableDataset``."""
        dataset = self.get_train_dataset()
        if isinstance(dataset, IterableDataset):
            what = who or f"{type(self).__name__}'s training loader"
            raise TypeError(
                f"{what} orders samples by index (seeded shuffle, resumable loading, sampling callbacks), so it "
                f"needs a map-style dataset; got the IterableDataset {type(dataset).__name__}. Give "
                "`train_dataset` `__len__` and `__getitem__`, or override `train_dataloader` for a stream "
                "(without the sampling callbacks)."
            )
        return dataset

    def train_dataloader(self) -> DataLoader:
        """The training loader: resumable mid-epoch, with the sampler from :meth:`train_sampler`."""
        self._check_batch_size_hparam()
        dataset = self.indexed_train_dataset()
        wrapped, sampler = dataset, self.train_sampler(dataset)
        for wrapper in self.trainer.callbacks if self.trainer is not None else []:
            if isinstance(wrapper, TrainDataWrapper):
                wrapped, sampler = wrapper.wrap_train_data(self, wrapped, sampler)
        self._check_a_batch_fits(dataset, sampler)
        loader = ResumableDataLoader(
            wrapped,
            batch_size=self.batch_size,
            sampler=sampler,
            drop_last=self.drop_last,
            **self.loader_kwargs(dataset),
            speedups_datamodule=self,  # which registers it (`_adopt_train_loader`)
        )
        return loader

    def _check_a_batch_fits(self, dataset: Dataset, sampler: Sampler) -> None:
        """``drop_last`` with fewer samples per process than a batch: no step would train, and Lightning's own
        warnings ("length ... is zero", "No training batches") do not say why. A warning, not an error: the trials
        of Lightning's ``BatchSizeFinder`` (which hide the callbacks) double the batch past the dataset's length."""
        per_process = len(sampler) if hasattr(sampler, "__len__") else None
        if not self.drop_last or self.batch_size is None or per_process is None or per_process >= self.batch_size:
            return
        processes = self._sampler_context()["num_replicas"]
        rank_zero_warn(
            f"{type(self).__name__}: each training process gets {per_process} samples ({len(dataset)} in the dataset "
            f"over {processes} process(es)), fewer than batch_size={self.batch_size}, and drop_last=True drops that "
            "incomplete batch: no step trains. Lower `batch_size`, or set drop_last=False (a BatchSizeFinder, which "
            "doubles the batch up to the dataset's length, can overshoot each process's share).",
            category=SpeedupWarning,
        )

    def _check_batch_size_hparam(self) -> None:
        """A subclass whose ``__init__`` takes ``batch_size`` (saved in its hparams) without handing it to
        ``super().__init__``: the loader would use the default, silently."""
        hparams = getattr(self, "hparams", None)
        wanted = hparams.get("batch_size") if isinstance(hparams, Mapping) else None
        # only while the loaders keep the default: a batch size handed on (per device, say) or set later is the
        # user's choice, whatever the hparams hold
        if wanted is None or wanted == self.batch_size or self.batch_size != _DEFAULT_BATCH_SIZE:
            return
        if self.__dict__.get("_warned_batch_size"):
            return
        self._warned_batch_size = True
        rank_zero_warn(
            f"{type(self).__name__}'s hparams say batch_size={wanted!r}, but its loaders use the default "
            f"{_DEFAULT_BATCH_SIZE} (`self.batch_size`, which `SpeedupDataModule.__init__` sets): if its `__init__` "
            "takes the batch size, pass it on, `super().__init__(batch_size=batch_size, ...)`.",
            category=SpeedupWarning,
        )

    def _adopt_train_loader(self, loader: ResumableDataLoader) -> None:
        """Make ``loader`` the training loader whose position checkpoints record, and hand it the position of the
        checkpoint being restored, if any (every loader built while it is restored, but a finder trial's)."""
        self._train_loader = weakref.ref(loader)  # not kept alive (nor its workers) by the datamodule
        pending = self.__dict__.get("_pending_loader_state")
        if pending and _restoring_checkpoint(self.trainer) and not self._in_finder_trial():
            # kept for every loader built while the checkpoint is restored: one built only for its length (in
            # `configure_optimizers`) may come before the one that trains
            loader.load_state_dict(pending)
        else:
            checked = pending == self.__dict__.get("_seeds_checked")  # by a loader built while it was restored
            if pending and not checked and self.trainer is not None and not self._in_finder_trial():
                # the first loader after the restore, built once it ended: an epoch-end checkpoint's resume, which
                # Lightning hands no loader state (its next epoch's order needs none), but whose seeds still count
                loader._check_seeds(pending)
            self._pending_loader_state = None

    def _in_finder_trial(self) -> bool:
        """Whether a ``BatchSizeFinder`` present at the restore is searching now (Lightning takes the callbacks
        out for its trials)."""
        finders, trainer = self.__dict__.get("_finders", ()), self.trainer
        return bool(finders) and trainer is not None and not any(cb is f for f in finders for cb in trainer.callbacks)

    # A resumed run gets the loader's position from the checkpoint twice: here, from the datamodule's own entry
    # (restored before the strategy's setup), and from Lightning's loop state (restored after it). Lightning's
    # alone is lost when the training loader is built before the restore, as `trainer.estimated_stepping_batches`
    # in `configure_optimizers` does (Lightning issue #20550): the resumed epoch would start at its first batch.
    def state_dict(self) -> dict[str, Any]:
        """The datamodule's state for checkpoints: the training loader's position (see :class:`ResumableDataLoader`)."""
        state = dict(super().state_dict())
        ref = self.__dict__.get("_train_loader")
        loader = ref() if ref is not None else None
        position = loader.state_dict() if loader is not None else {}
        if position:
            state[_LOADER_STATE] = position
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Keep the checkpoint's loader position for the next training loader built (call ``super()``)."""
        super().load_state_dict(state_dict)
        fitting = self.trainer is None or self.trainer.state.fn == TrainerFn.FITTING
        # validate/test/predict(ckpt_path=...) restore it too, but build no training loader to take it
        self._pending_loader_state = state_dict.get(_LOADER_STATE) if fitting else None
        self._seeds_checked = None  # a new restore: its seeds are checked afresh
        # a BatchSizeFinder that searches before the loops are restored (at fit start) restores a checkpoint of
        # its own after its trials, which leaves Lightning's loops at the run's start (the resumed training state
        # is lost): the loaders built in its trials, the one it trains with among them, start there too
        trainer = self.trainer
        self._finders = tuple(cb for cb in trainer.callbacks if isinstance(cb, BatchSizeFinder)) if trainer else ()
        if _searches_before_the_loops_resume(trainer):  # the stock finder: not even the loader built before it
            self._pending_loader_state = None
        ref = self.__dict__.get("_train_loader")
        loader = ref() if ref is not None else None
        if (
            self._pending_loader_state
            and loader is not None
            and _restoring_checkpoint(trainer)
            and getattr(getattr(trainer, "strategy", None), "restore_checkpoint_after_setup", False)
            and _trains_with(trainer, loader)  # built in this fit's setup, not kept from an earlier fit
        ):
            self._position_built_loader(loader, self._pending_loader_state)

    def _position_built_loader(self, loader: ResumableDataLoader, position: dict[str, Any]) -> None:
        """A strategy that restores the checkpoint after its setup (FSDP, DeepSpeed, ModelParallel) with the
        training loader built already (``estimated_stepping_batches`` in ``configure_optimizers``): Lightning
        builds no other, and its own copy of the position is applied only to loaders it builds."""
        loader.load_state_dict(position)  # enough where no iterator has drawn from the sampler yet
        fit_loop = getattr(self.trainer, "fit_loop", None)
        if loader.num_workers > 0 and loader.__dict__.get("_restart_checked") and fit_loop is not None:
            # its worker iterator prefetched the epoch's first batches when it was made: Lightning must build
            # the loader anew (as for a reload), which then gets the position from Lightning's loop state
            fit_loop._combined_loader = None

    def __getstate__(self) -> dict[str, Any]:
        # picklable (ddp_spawn sends the datamodule to its processes): no weak reference, no pending position
        state = dict(self.__dict__)
        state.pop("_train_loader", None)
        state.pop("_pending_loader_state", None)
        state.pop("_finders", None)
        state.pop("_seeds_checked", None)
        return state

    def eval_dataloader(
        self,
        dataset: Dataset,
        batch_size: int | None = None,
        *,
        num_workers: int | None = None,
        persistent_workers: bool | None = None,
    ) -> DataLoader:
        """An evaluation loader (no shuffle) with the same worker and memory defaults as training.

        Its workers persist too (``persistent_workers``): between validations they sit idle beside the training
        loader's, each holding its copy of the dataset, which saves starting them at every validation. Pass
        ``persistent_workers=False`` (or fewer ``num_workers``) where memory is tight or validation is rare.
        """
        workers = _checks.optional_int("num_workers", num_workers, minimum=0)
        keep = _checks.flag("persistent_workers", persistent_workers, optional=True)
        persistent = self.persistent_workers if keep is None else keep
        self._eval_workers = (workers, persistent)  # the default pinning for this loader's own workers
        try:
            kwargs = self.loader_kwargs(dataset)
        finally:
            self._eval_workers = None
        kwargs["num_workers"] = kwargs["num_workers"] if workers is None else workers
        kwargs.pop("persistent_workers", None)  # a DataLoader without workers refuses it
        if kwargs["num_workers"] > 0:
            kwargs["persistent_workers"] = persistent
        return DataLoader(dataset, batch_size=batch_size or self.batch_size, shuffle=False, **kwargs)
