"""SpeedupDataModule: loader defaults, the seeded per-epoch shuffle, resumable loaders, sampler providers."""

import functools
import operator
import time
import warnings

import numpy as np
import pytest
import torch
from lightning.pytorch import seed_everything
from lightning.pytorch.callbacks import BatchSizeFinder, Callback, ModelCheckpoint
from lightning.pytorch.strategies import SingleDeviceStrategy
from torch.utils.data import ConcatDataset, DataLoader, DistributedSampler, Sampler, TensorDataset

from lightning_speedups import SpeedupDataModule, SpeedupWarning
from lightning_speedups.data import EpochShuffleSampler, ResumableDataLoader, default_num_workers
from tests.helpers import ImagesDataModule, IndexedImages, RecordingModule, cosine_over_the_run, trainer


class IndexedDM(SpeedupDataModule):
    def __init__(self, n=40, **kwargs):
        super().__init__(**kwargs)
        self.n = n

    def setup(self, stage):
        self.train_dataset = TensorDataset(torch.arange(self.n).float().unsqueeze(1), torch.arange(self.n) % 4)


def test_loader_defaults():
    dm = ImagesDataModule()
    dm.setup("fit")
    loader = dm.train_dataloader()
    assert isinstance(loader, ResumableDataLoader) and isinstance(loader.sampler, DistributedSampler)
    assert loader.num_workers == 0  # in-memory tensors: workers would only add copies
    assert loader.pin_memory is False  # no trainer on CUDA
    assert default_num_workers(IndexedImages(), processes_per_node=1) >= 0
    dm = ImagesDataModule(num_workers=2)
    dm.setup("fit")
    loader = dm.train_dataloader()
    assert loader.num_workers == 2 and loader.persistent_workers is True
    dm = ImagesDataModule(num_workers=2, persistent_workers=False)
    dm.setup("fit")
    assert dm.train_dataloader().persistent_workers is False


def test_the_evaluation_loader_takes_its_own_worker_settings():
    # its workers persisted beside the training loader's, idle between validations, with no way to say otherwise
    dm = ImagesDataModule(num_workers=2)
    dm.setup("fit")
    ds = dm.train_dataset
    assert dm.eval_dataloader(ds).persistent_workers is True and dm.eval_dataloader(ds).num_workers == 2
    assert dm.eval_dataloader(ds, persistent_workers=False).persistent_workers is False
    fewer = dm.eval_dataloader(ds, num_workers=1)
    assert fewer.num_workers == 1 and fewer.persistent_workers is True
    none = dm.eval_dataloader(ds, num_workers=0, persistent_workers=True)  # no workers: nothing to keep alive
    assert none.num_workers == 0 and none.persistent_workers is False
    with pytest.raises(TypeError, match="`persistent_workers` must be True, False or None"):
        dm.eval_dataloader(ds, persistent_workers="no")


def test_a_batch_larger_than_each_process_share_with_drop_last_is_said():
    # 5 samples in batches of 8 with drop_last: the fit "trained" 0 batches behind Lightning's generic warnings
    module = IndexModule()
    with pytest.warns(
        SpeedupWarning, match=r"gets 5 samples \(5 in the dataset over 1 process\(es\)\), fewer than batch_size=8"
    ):
        trainer(max_epochs=1).fit(module, datamodule=IndexedDM(n=5, batch_size=8, drop_last=True))
    assert module.seen == []
    module = IndexModule()
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*fewer than batch_size", category=SpeedupWarning)
        trainer(max_epochs=1).fit(module, datamodule=IndexedDM(n=5, batch_size=8))  # without drop_last: one batch
    assert len(module.seen) == 1


def test_a_batch_size_kept_in_hparams_but_not_handed_over_is_warned_about():
    class Kept(SpeedupDataModule):  # a DataModule moved over without passing batch_size to super().__init__
        def __init__(self, batch_size=32, pass_it_on=False):
            super().__init__(**({"batch_size": batch_size} if pass_it_on else {}))
            self.save_hyperparameters()

        def setup(self, stage):
            self.train_dataset = TensorDataset(torch.zeros(64, 1), torch.zeros(64, dtype=torch.long))

    dm = Kept()
    dm.setup("fit")
    with pytest.warns(
        SpeedupWarning, match=r"hparams say batch_size=32, but its loaders use the default 64.*super\(\)\.__init__"
    ):
        assert dm.train_dataloader().batch_size == 64
    quiet = [Kept(pass_it_on=True), Kept()]
    quiet[1].batch_size = 128  # set after construction (a sweep): the user's choice
    for dm in quiet:
        dm.setup("fit")
        with warnings.catch_warnings():
            warnings.simplefilter("error", SpeedupWarning)
            assert dm.train_dataloader().batch_size == dm.batch_size


def test_default_workers_follow_the_cpu_count(monkeypatch):
    import lightning_speedups.data as data

    monkeypatch.setattr(data, "available_cpus", lambda: 16)
    assert default_num_workers(IndexedImages(), processes_per_node=1) == 8
    assert default_num_workers(IndexedImages(), processes_per_node=4) == 3
    monkeypatch.setattr(data, "available_cpus", lambda: 1)
    assert default_num_workers(IndexedImages(), processes_per_node=1) == 0
    # in-memory tensors, also split or concatenated: no workers, whatever the CPU count
    monkeypatch.setattr(data, "available_cpus", lambda: 16)
    tensors = TensorDataset(torch.zeros(8, 2))
    train, _ = torch.utils.data.random_split(tensors, [6, 2])
    assert default_num_workers(train) == default_num_workers(ConcatDataset([train, tensors])) == 0
    assert default_num_workers(ConcatDataset([train, IndexedImages()])) == 8


def test_seeded_shuffle_per_epoch_and_shards():
    ds = list(range(30))
    e0 = list(EpochShuffleSampler(ds, epoch=0, num_replicas=1, rank=0, seed=5))
    e1 = list(EpochShuffleSampler(ds, epoch=1, num_replicas=1, rank=0, seed=5))
    assert sorted(e0) == ds and e0 != e1
    assert e0 == list(EpochShuffleSampler(ds, epoch=0, num_replicas=1, rank=0, seed=5))
    shards = [list(EpochShuffleSampler(ds, epoch=3, num_replicas=3, rank=r, seed=5)) for r in range(3)]
    assert all(len(s) == 10 for s in shards) and sorted(functools.reduce(operator.iadd, shards, [])) == ds
    s = EpochShuffleSampler(ds, epoch=0, num_replicas=1, rank=0, seed=5)
    s.skip_next(7)
    assert list(s) == e0[7:] and list(s) == e0  # skipping applies to one pass only


class IndexModule(RecordingModule):
    """Records the sample indices of each training batch of an IndexedDM."""

    def __init__(self):
        super().__init__(record=False)
        self.seen = []

    def training_step(self, batch, batch_idx):
        self.seen.append(batch[0].flatten().long().tolist())
        return self.net.fc.weight.sum() * 0


def test_fit_sees_each_sample_once_per_epoch_in_a_new_order():
    model = IndexModule()
    trainer(max_epochs=2).fit(model, datamodule=IndexedDM(batch_size=8))
    epoch0, epoch1 = (
        functools.reduce(operator.iadd, model.seen[:5], []),
        functools.reduce(operator.iadd, model.seen[5:], []),
    )
    assert sorted(epoch0) == sorted(epoch1) == list(range(40))
    assert epoch0 != epoch1


def test_a_loader_lightning_rebuilds_still_records_its_position():
    # overfit_batches makes Lightning rebuild the loader from its constructor arguments with another sampler
    dm = IndexedDM(batch_size=8)
    t = trainer(max_epochs=1, overfit_batches=2)
    t.fit(IndexModule(), datamodule=dm)
    loader = t.train_dataloader
    assert isinstance(loader, ResumableDataLoader) and not isinstance(loader.sampler, EpochShuffleSampler)
    assert loader.speedups_datamodule is dm
    assert loader.state_dict()["batches"] == 2  # so a mid-epoch resume warns that it cannot skip, not silently
    with pytest.warns(UserWarning, match="has no `skip_next`: a run resumed mid-epoch restarts"):
        loader.load_state_dict({"epoch": 0, "batches": 1, "epoch_done": 0})


def test_workers_and_persistent_workers_in_a_fit():
    class DM(SpeedupDataModule):
        def setup(self, stage):
            self.train_dataset = IndexedImages(32)

    model = RecordingModule()
    trainer(max_epochs=2).fit(model, datamodule=DM(batch_size=8, num_workers=1))
    assert len(model.train_batches) == 8


class Provider(Callback):
    def __init__(self):
        self.calls = []

    def make_train_sampler(self, datamodule, dataset, *, epoch, num_replicas, rank, seed):
        self.calls.append((epoch, num_replicas, rank))
        return EpochShuffleSampler(dataset, epoch=epoch, num_replicas=num_replicas, rank=rank, shuffle=False)


def test_sampler_providers_plug_in():
    provider = Provider()
    model = IndexModule()
    trainer(max_epochs=2, callbacks=[provider], reload_dataloaders_every_n_epochs=1).fit(
        model, datamodule=IndexedDM(batch_size=8)
    )
    assert provider.calls == [(0, 1, 0), (1, 1, 0)]
    assert functools.reduce(operator.iadd, model.seen[:5], []) == list(
        range(40)
    )  # the provider's (unshuffled) order was used
    with pytest.raises(ValueError, match="Several callbacks supply the training sampler"):
        trainer(max_epochs=1, callbacks=[Provider(), Provider()]).fit(IndexModule(), datamodule=IndexedDM())


class DoubleTheFirst(Callback):
    """Only contributes to the plan (the `PlanContributor` protocol): sample 0 twice per epoch."""

    def contribute_to_plan(self, plan, datamodule, dataset, *, seed):
        factors = np.ones(len(dataset))
        factors[0] = 2.0
        plan.add_repeat_factors(factors, seed=seed, source="DoubleTheFirst")


def test_a_callback_that_only_contributes_to_the_plan_is_not_left_out():
    from lightning_speedups import CurriculumOrdering

    for extra in ([], [CurriculumOrdering("linear", difficulty=np.arange(40.0))]):
        model = IndexModule()
        t = trainer(max_epochs=1, callbacks=[DoubleTheFirst(), *extra])
        t.fit(model, datamodule=IndexedDM(batch_size=8))
        seen = functools.reduce(operator.iadd, model.seen, [])
        assert len(seen) == 41 and seen.count(0) == 2  # was a plain shuffle of 40, silently
        assert t.train_dataloader.sampler.plan.sources[0] == "DoubleTheFirst"


class SkippableShuffle(Sampler):
    """A seeded shuffle that offers `skip_next` (skip the first indices of its next pass)."""

    def __init__(self, n, seed):
        self.n, self.seed, self._skip = n, seed, 0

    def skip_next(self, n):
        self._skip = n

    def __len__(self):
        return self.n

    def order_seed(self):
        return self.seed

    def __iter__(self):
        skip, self._skip = self._skip, 0
        return iter(torch.randperm(self.n, generator=torch.Generator().manual_seed(self.order_seed())).tolist()[skip:])


class PrivateEpochShuffle(SkippableShuffle):
    """A per-epoch seeded shuffle that follows `set_epoch`, but keeps its epoch private."""

    def __init__(self, n, seed, epoch):
        super().__init__(n, seed)
        self._epoch = epoch

    def set_epoch(self, epoch):
        self._epoch = epoch

    def order_seed(self):
        return self.seed + self._epoch


class PrivateEpochProvider(Callback):
    def make_train_sampler(self, datamodule, dataset, *, epoch, num_replicas, rank, seed):
        return PrivateEpochShuffle(len(dataset), seed, epoch)


def test_resume_mid_epoch_with_a_sampler_without_an_epoch_attribute(tmp_path):
    """The loader records the epoch in progress, not `getattr(sampler, "epoch", 0)`: with a worker prefetching from
    the first iterator, a sampler put on epoch 0 would replay epoch 0's order in a resumed later epoch."""

    def run(ckpt_path=None, save=False):
        model = IndexModule()
        extra = [ModelCheckpoint(dirpath=tmp_path, every_n_train_steps=6, save_top_k=-1)] if save else []
        t = trainer(max_epochs=2, callbacks=[PrivateEpochProvider(), *extra], enable_checkpointing=save)
        t.fit(model, datamodule=IndexedDM(n=32, batch_size=8, seed=0, num_workers=1), ckpt_path=ckpt_path)
        return model

    full = run(save=True)
    resumed = run(ckpt_path=str(tmp_path / "epoch=1-step=6.ckpt"))  # 4 batches per epoch: epoch 1, 2 batches in
    assert full.seen[2:4] != full.seen[6:]  # replaying epoch 0 would show
    assert resumed.seen == full.seen[6:]


class FixedEpochShuffle(SkippableShuffle):
    """Shows an `epoch` it never changes (no `set_epoch`): one order for every epoch."""

    epoch = 0


class FixedEpochProvider(Callback):
    def make_train_sampler(self, datamodule, dataset, *, epoch, num_replicas, rank, seed):
        return FixedEpochShuffle(len(dataset), seed)


def test_a_mid_epoch_resume_in_a_later_epoch_with_a_sampler_whose_epoch_never_changes(tmp_path):
    # its checkpoints record epoch 0 in epoch 1: taken for an epoch that ended early, the resume replayed batches
    def run(ckpt_path=None, save=False):
        model = IndexModule()
        extra = [ModelCheckpoint(dirpath=tmp_path, every_n_train_steps=6, save_top_k=-1)] if save else []
        t = trainer(max_epochs=2, callbacks=[FixedEpochProvider(), *extra], enable_checkpointing=save)
        t.fit(model, datamodule=IndexedDM(n=32, batch_size=8, seed=0), ckpt_path=ckpt_path)
        return model

    full = run(save=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error", SpeedupWarning)
        resumed = run(ckpt_path=str(tmp_path / "epoch=1-step=6.ckpt"))
    assert resumed.seen == full.seen[6:]


def test_resuming_with_another_shuffle_seed_is_warned_about(tmp_path):
    """The order follows the datamodule's seed (``seed_everything``'s by default), which a checkpoint cannot
    restore once the loader is built: a resumed script that seeds differently is told, with the seed to use."""

    def run(seed, ckpt_path=None):
        save = ckpt_path is None
        extra = [ModelCheckpoint(dirpath=tmp_path, every_n_train_steps=2, save_top_k=-1)] if save else []
        t = trainer(max_epochs=1, callbacks=extra, enable_checkpointing=save)
        t.fit(IndexModule(), datamodule=IndexedDM(n=32, batch_size=8, seed=seed), ckpt_path=ckpt_path)

    run(3)
    ckpt = str(tmp_path / "epoch=0-step=2.ckpt")
    with pytest.warns(SpeedupWarning, match=r"seed 3, this run with seed 4.*`seed_everything\(3\)`"):
        run(4, ckpt)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", "The checkpoint's run shuffled", SpeedupWarning)
        run(3, ckpt)


def test_resuming_from_an_epoch_end_with_another_shuffle_seed_is_warned_about(tmp_path):
    # Lightning hands the loader no state at an epoch-end resume: every later epoch shuffled otherwise, unsaid
    def run(seed, ckpt_path=None):
        save = ckpt_path is None
        extra = [ModelCheckpoint(dirpath=tmp_path, every_n_epochs=1, save_top_k=-1, filename="{epoch}")] if save else []
        model = IndexModule()
        t = trainer(max_epochs=3, callbacks=extra, enable_checkpointing=save)
        t.fit(model, datamodule=IndexedDM(n=32, batch_size=8, seed=seed), ckpt_path=ckpt_path)
        return model

    full = run(3)
    ckpt = str(tmp_path / "epoch=0.ckpt")
    with pytest.warns(SpeedupWarning, match=r"seed 3, this run with seed 4.*`seed_everything\(3\)`") as caught:
        other = run(4, ckpt)
    assert sum("shuffled its training data" in str(w.message) for w in caught) == 1
    assert other.seen != full.seen[4:]
    with warnings.catch_warnings():
        warnings.filterwarnings("error", "The checkpoint's run shuffled", SpeedupWarning)
        assert run(3, ckpt).seen == full.seen[4:]


class LoaderInConfigureOptimizers(IndexModule):
    def configure_optimizers(self):
        _ = self.trainer.estimated_stepping_batches  # builds the training loader while the checkpoint is restored
        return super().configure_optimizers()


@pytest.mark.parametrize("checkpoint", ["epoch=0-step=2.ckpt", "end-epoch=0.ckpt"])
def test_a_resume_with_another_seed_is_warned_about_once_and_a_later_fit_not_at_all(tmp_path, checkpoint):
    # a loader built while the checkpoint was restored (`estimated_stepping_batches`) kept its state pending: the
    # epoch's reload, and a later fit on the same trainer with no checkpoint, warned again
    saving = [
        ModelCheckpoint(dirpath=tmp_path, every_n_train_steps=2, save_top_k=-1),
        ModelCheckpoint(dirpath=tmp_path, every_n_epochs=1, save_top_k=-1, filename="end-{epoch}"),
    ]
    t = trainer(max_epochs=1, callbacks=saving, enable_checkpointing=True)
    t.fit(IndexModule(), datamodule=IndexedDM(n=32, batch_size=8, seed=3))
    t = trainer(max_epochs=3, reload_dataloaders_every_n_epochs=1)
    dm = IndexedDM(n=32, batch_size=8, seed=4)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        t.fit(LoaderInConfigureOptimizers(), datamodule=dm, ckpt_path=str(tmp_path / checkpoint))
        t.fit_loop.max_epochs = 4
        t.fit(LoaderInConfigureOptimizers(), datamodule=dm)
    assert sum("shuffled its training data" in str(w.message) for w in caught) == 1


def test_resuming_mid_epoch_with_other_training_data_is_warned_about(tmp_path):
    # the resumed epoch skipped `batches x the new batch size` of a permutation of the new data, silently: with
    # batch 16 instead of 8 it trained nothing more of epoch 0, leaving 32 samples unseen
    def run(n=32, batch_size=8, ckpt_path=None):
        save = ckpt_path is None
        extra = [ModelCheckpoint(dirpath=tmp_path, every_n_train_steps=2, save_top_k=-1)] if save else []
        t = trainer(max_epochs=1, callbacks=extra, enable_checkpointing=save)
        t.fit(IndexModule(), datamodule=IndexedDM(n=n, batch_size=batch_size, seed=3), ckpt_path=ckpt_path)

    run()
    ckpt = str(tmp_path / "epoch=0-step=2.ckpt")  # 2 of 4 batches
    with pytest.warns(SpeedupWarning, match=r"other training data \(samples per batch 8 -> 16\)"):
        run(batch_size=16, ckpt_path=ckpt)
    with pytest.warns(SpeedupWarning, match=r"\(samples 32 -> 40\).*skips its first 2 batches"):
        run(n=40, ckpt_path=ckpt)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", ".*other training data", SpeedupWarning)
        run(ckpt_path=ckpt)


def test_a_mid_epoch_checkpoint_without_a_loader_position_is_warned_about(tmp_path):
    # a run moved to SpeedupDataModule, resumed from a checkpoint of its plain DataLoader: the epoch restarted at its
    # first batch while Lightning counted 2 done, silently (Lightning warns only for loaders without state)
    class Plain(IndexedDM):
        def train_dataloader(self):
            return DataLoader(self.train_dataset, batch_size=8)

    every_2 = ModelCheckpoint(tmp_path, every_n_train_steps=2, save_top_k=-1)
    t = trainer(max_epochs=1, callbacks=[every_2], enable_checkpointing=True)
    t.fit(IndexModule(), datamodule=Plain(n=32))
    ckpt = str(tmp_path / "epoch=0-step=2.ckpt")  # 2 of 4 batches
    with pytest.warns(SpeedupWarning, match=r"saved mid-epoch \(2 batches done\) but holds no position"):
        trainer(max_epochs=1).fit(IndexModule(), datamodule=IndexedDM(n=32, batch_size=8), ckpt_path=ckpt)


def test_a_checkpoint_of_an_epoch_cut_short_by_max_steps_resumes_as_lightning_does_whatever_the_workers(tmp_path):
    # saved at the end of an epoch `max_steps` cut short: Lightning counts it finished and sets the next epoch, which
    # without workers (a lazy sampler) skipped that epoch's first batches, with workers (prefetched) did not
    def run(num_workers, ckpt_path=None, max_steps=6, every=None):
        model, save = IndexModule(), ckpt_path is None or every is not None
        where = tmp_path / (str(num_workers) if every is None else f"{num_workers}-steps")
        kwargs = {"every_n_train_steps": every, "save_top_k": -1} if every else {"save_on_train_epoch_end": True}
        extra = [ModelCheckpoint(where, **kwargs)] if save else []
        t = trainer(max_epochs=-1, max_steps=max_steps, callbacks=extra, enable_checkpointing=save)
        t.fit(model, datamodule=IndexedDM(n=32, batch_size=8, seed=3, num_workers=num_workers), ckpt_path=ckpt_path)
        return model

    full = run(0, max_steps=16)  # 4 batches per epoch
    resumed = []
    for workers in (0, 1):
        run(workers)  # stops 2 batches into epoch 1
        ckpt = tmp_path / str(workers) / "epoch=1-step=6.ckpt"
        with pytest.warns(SpeedupWarning, match=r"end of epoch 1, which ended early \(`max_steps`.* after 2 batches"):
            resumed.append(run(workers, str(ckpt), max_steps=12, every=9).seen)
    # as Lightning counts: epoch 1's last 2 batches from epoch 2's order, then epoch 3's order for epoch 2
    assert resumed[0] == resumed[1] == full.seen[8:10] + full.seen[12:16]
    # a mid-epoch checkpoint of that resumed run (where Lightning's epoch counters stay apart) resumes exactly
    with warnings.catch_warnings():
        warnings.simplefilter("error", SpeedupWarning)
        again = run(0, str(tmp_path / "0-steps" / "epoch=2-step=9.ckpt"), max_steps=12).seen
    assert again == resumed[0][3:]


def test_a_loader_built_before_the_restore_is_not_compared_with_another_epochs_data(tmp_path):
    # `estimated_stepping_batches` builds a loader while the loops still say epoch 0: a training set that grows
    # at each reload had 16 samples there, 24 in the checkpoint's epoch 1, and a good resume was warned about
    class Grows(IndexedDM):
        def get_train_dataset(self):
            n = 16 + 8 * (self.trainer.current_epoch if self.trainer is not None else 0)
            return TensorDataset(torch.arange(n).float().unsqueeze(1), torch.arange(n) % 4)

    class Early(IndexModule):
        def configure_optimizers(self):
            assert self.trainer.estimated_stepping_batches > 0
            return super().configure_optimizers()

    def run(ckpt_path=None):
        save = ckpt_path is None
        extra = [ModelCheckpoint(dirpath=tmp_path, every_n_train_steps=1, save_top_k=-1)] if save else []
        t = trainer(max_epochs=3, callbacks=extra, enable_checkpointing=save, reload_dataloaders_every_n_epochs=1)
        t.fit(Early(), datamodule=Grows(batch_size=4, seed=0), ckpt_path=ckpt_path)
        return t

    run()
    with warnings.catch_warnings():
        warnings.filterwarnings("error", ".*other training data", SpeedupWarning)
        assert run(str(next(tmp_path.glob("epoch=1-step=6*.ckpt")))).global_step == 4 + 6 + 8  # mid-epoch 1


def test_pinned_memory_is_left_out_beside_persistent_workers_and_reloads():
    from types import SimpleNamespace

    from lightning.pytorch.accelerators import CUDAAccelerator

    dm = IndexedDM(num_workers=2)
    dm.setup("fit")
    for reloads, pinned in ((0, True), (1, False)):  # Lightning: "can lead to instability" (pytorch#91252)
        dm.trainer = SimpleNamespace(accelerator=CUDAAccelerator(), reload_dataloaders_every_n_epochs=reloads)
        assert dm.loader_kwargs(dm.train_dataset)["pin_memory"] is pinned
    # an evaluation loader decides for its own workers (the training ones pinned, and then not: the other way)
    dm = IndexedDM(num_workers=2, persistent_workers=False)
    dm.setup("fit")
    dm.trainer = SimpleNamespace(accelerator=CUDAAccelerator(), reload_dataloaders_every_n_epochs=1)
    assert dm.eval_dataloader(dm.train_dataset, persistent_workers=True).pin_memory is False
    assert dm.eval_dataloader(dm.train_dataset).pin_memory is True
    dm.persistent_workers = True
    assert dm.eval_dataloader(dm.train_dataset, num_workers=0).pin_memory is True
    assert dm.eval_dataloader(dm.train_dataset, persistent_workers=False).pin_memory is True
    assert IndexedDM(num_workers=2, pin_memory=True).eval_dataloader(dm.train_dataset).pin_memory is True  # given

    class NeverPins(IndexedDM):
        def loader_kwargs(self, dataset):
            return {**super().loader_kwargs(dataset), "pin_memory": False}

    never = NeverPins(num_workers=2)
    never.trainer = dm.trainer
    assert never.eval_dataloader(dm.train_dataset, num_workers=0).pin_memory is False  # the override's choice

    class AddsATimeout(IndexedDM):  # an override that leaves pinning alone: the default for the loader's workers
        def loader_kwargs(self, dataset):
            return {**super().loader_kwargs(dataset), "timeout": 60}

    timeout = AddsATimeout(num_workers=0)
    timeout.trainer = dm.trainer
    assert timeout.eval_dataloader(dm.train_dataset, num_workers=2, persistent_workers=True).pin_memory is False


def test_metadata_defaults():
    dm = IndexedDM()
    dm.setup("fit")
    np.testing.assert_array_equal(dm.sample_labels(), np.arange(40) % 4)
    assert dm.sample_difficulty() is None
    dm.train_labels = [[0, 1]] * 40
    dm.train_difficulty = np.linspace(0, 1, 40)
    assert dm.sample_labels()[0] == [0, 1] and dm.sample_difficulty()[-1] == 1.0

    class WithTargets(SpeedupDataModule):
        def setup(self, stage):
            self.train_dataset = IndexedImages(8)
            self.train_dataset.targets = [3] * 8

    dm = WithTargets()
    dm.setup("fit")
    assert dm.sample_labels() == [3] * 8


def test_labels_through_random_split_and_concat():
    x, y = torch.zeros(10, 1), torch.arange(10) % 3
    train, _ = torch.utils.data.random_split(TensorDataset(x, y), [6, 4], generator=torch.Generator().manual_seed(0))
    listed = IndexedImages(4)
    listed.targets = [[0, 1], [2], [], [1]]  # multi-label, a plain list

    class Split(SpeedupDataModule):
        def setup(self, stage):
            self.train_dataset = torch.utils.data.ConcatDataset([train, torch.utils.data.Subset(listed, [3, 0])])

    dm = Split()
    dm.setup("fit")
    labels = dm.sample_labels()
    assert len(labels) == len(dm.train_dataset) == 8
    assert [int(v) for v in labels[:6]] == [int(y[i]) for i in train.indices]  # the split's own samples
    assert labels[6:] == [[1], [0, 1]]


class _IndexedSeries:
    """What a pandas Series of labels does that matters here: ``s[i]`` looks ``i`` up in its index (a shuffled
    or filtered frame's is not ``0..N-1``), while ``np.asarray(s)`` and iteration go by position."""

    def __init__(self, values, index):
        self.values, self.index = list(values), list(index)

    def __getitem__(self, key):
        return self.values[self.index.index(key)]

    def __len__(self):
        return len(self.values)

    def __iter__(self):
        return iter(self.values)

    def __array__(self, dtype=None, copy=None):
        return np.asarray(self.values, dtype=dtype)


def test_labels_of_a_subset_are_read_by_position_from_an_indexed_series():
    from lightning_speedups.data import dataset_labels

    frame = IndexedImages(4)
    frame.targets = _IndexedSeries([3, 2, 1, 0], index=[3, 2, 1, 0])  # a frame shuffled (here reversed)
    subset = torch.utils.data.Subset(frame, [0, 1])
    np.testing.assert_array_equal(dataset_labels(subset), [3, 2])  # by index label: [0, 1], another class
    filtered = IndexedImages(2)
    filtered.targets = _IndexedSeries([1, 3], index=[1, 3])  # rows 0 and 2 dropped: no label 0 in the index
    np.testing.assert_array_equal(dataset_labels(torch.utils.data.Subset(filtered, [1, 0])), [3, 1])
    concat = torch.utils.data.ConcatDataset([frame, filtered])
    np.testing.assert_array_equal(dataset_labels(concat), [3, 2, 1, 0, 1, 3])

    class LabelList(list):  # a sequence, indexed by position already: its rows stay lists of ids
        def __array__(self, dtype=None, copy=None):
            return np.asarray(list(self), dtype=dtype)

    listed = IndexedImages(3)
    listed.targets = LabelList([[0, 1], [1, 0], [2]])
    assert dataset_labels(torch.utils.data.Subset(listed, [1, 2])) == [[1, 0], [2]]


@pytest.mark.parametrize("dtype", [torch.int64, torch.bool, torch.float32])
def test_multi_hot_labels_through_concat_stay_multi_hot(dtype):
    from lightning_speedups.data import dataset_labels
    from lightning_speedups.functional import repeat_factors

    hot = torch.tensor([[1, 0, 0], [1, 1, 0], [1, 0, 1]]).to(dtype)  # class 2 in one sample of six
    parts = [TensorDataset(torch.zeros(3, 1), hot), TensorDataset(torch.zeros(3, 1), hot[[0, 0, 1]])]
    labels = dataset_labels(torch.utils.data.ConcatDataset(parts))
    assert isinstance(labels, np.ndarray) and labels.shape == (6, 3)
    whole = dataset_labels(TensorDataset(torch.zeros(6, 1), torch.cat([hot, hot[[0, 0, 1]]])))
    np.testing.assert_array_equal(repeat_factors(labels, 0.5), repeat_factors(whole, 0.5))
    assert repeat_factors(labels, 0.5)[2] == pytest.approx(3**0.5)  # sqrt(0.5 / (1/6))


def test_concat_labels_of_different_shapes_are_an_error_not_a_guess():
    from lightning_speedups.data import dataset_labels

    ids = TensorDataset(torch.zeros(2, 1), torch.tensor([0, 1]))
    hot = TensorDataset(torch.zeros(2, 1), torch.tensor([[1, 0], [0, 1]]))
    with pytest.raises(ValueError, match=r"labels of different shapes \(\(2,\), \(2, 2\)\)"):
        dataset_labels(torch.utils.data.ConcatDataset([ids, hot]))
    listed = IndexedImages(2)
    listed.targets = [[0], [1]]
    with pytest.raises(ValueError, match="and part a Python sequence"):
        dataset_labels(torch.utils.data.ConcatDataset([hot, listed]))


def test_missing_dataset_and_bad_arguments():
    with pytest.raises(RuntimeError, match=r"set `self\.train_dataset`"):
        SpeedupDataModule().train_dataloader()
    with pytest.raises(ValueError, match="`batch_size` must be >= 1"):
        SpeedupDataModule(batch_size=0)
    with pytest.raises(ValueError, match="`num_workers` must be >= 0"):
        SpeedupDataModule(num_workers=-1)


@pytest.mark.parametrize("name", ["shuffle", "drop_last", "persistent_workers", "pin_memory"])
def test_a_string_flag_is_refused_not_read_as_true(name):
    # bool("False") is True: a flag from a config string silently did the opposite
    with pytest.raises(TypeError, match=rf"`{name}` must be True(, | or )False.*got 'False'"):
        SpeedupDataModule(**{name: "False"})
    assert getattr(SpeedupDataModule(**{name: np.False_}), name) is False  # a NumPy bool is a bool
    assert SpeedupDataModule(pin_memory=None).pin_memory is None  # None: decided by the accelerator


def test_an_iterable_dataset_is_refused_with_a_message():
    class Stream(torch.utils.data.IterableDataset):
        def __iter__(self):
            return iter(range(4))

    class StreamData(SpeedupDataModule):
        def setup(self, stage):
            self.train_dataset = Stream()

    dm = StreamData(batch_size=2)
    dm.setup("fit")
    with pytest.raises(TypeError, match="needs a map-style dataset; got the IterableDataset Stream"):
        dm.train_dataloader()


def test_an_evaluation_stream_gets_no_workers_by_default(monkeypatch):
    # each default worker (CPUs - 1) iterated the whole stream: every sample validated once per worker
    import lightning_speedups.data as data

    class Stream(torch.utils.data.IterableDataset):
        def __iter__(self):
            return iter(range(10))

    monkeypatch.setattr(data, "available_cpus", lambda: 4)
    dm = SpeedupDataModule(batch_size=2)
    assert dm.eval_dataloader(Stream()).num_workers == 0
    assert sorted(int(i) for batch in dm.eval_dataloader(Stream()) for i in batch) == list(range(10))
    assert SpeedupDataModule(batch_size=2, num_workers=2).eval_dataloader(Stream()).num_workers == 2  # asked for
    with pytest.raises(ValueError, match="`drop_last=True` needs a `batch_size`"):
        SpeedupDataModule(batch_size=None, drop_last=True)


def test_an_id_column_part_and_an_ids_part_of_a_concat_are_ids():
    from lightning_speedups.data import dataset_labels

    column = TensorDataset(torch.zeros(3, 1), torch.tensor([[0], [1], [2]]))
    ids = TensorDataset(torch.zeros(2, 1), torch.tensor([3, 1]))
    labels = dataset_labels(torch.utils.data.ConcatDataset([column, ids]))
    assert np.asarray(labels).tolist() == [0, 1, 2, 3, 1]


class ScheduledIndexModule(IndexModule):
    """Sizes its LR schedule by `trainer.estimated_stepping_batches` (see `cosine_over_the_run`)."""

    def configure_optimizers(self):
        return cosine_over_the_run(self)


def full_and_resumed(tmp_path, step, make_datamodule, module=None, strategy=None, callbacks=None, **kwargs):
    """The indices each step saw in a 3-epoch run (checkpoints every 2 steps) and in one resumed from its
    checkpoint at ``step`` (4 batches per epoch: 6 is mid-epoch 1, 8 its end); resuming must not restart an epoch.
    ``callbacks``: makes a callback for the resumed run."""

    def run(ckpt_path=None, save=False):
        model = (module or ScheduledIndexModule)()
        extra = [ModelCheckpoint(dirpath=tmp_path, every_n_train_steps=2, save_top_k=-1)] if save else []
        if callbacks is not None and not save:
            extra.append(callbacks())
        more = {"strategy": strategy()} if strategy else {}
        trainer(max_epochs=3, callbacks=extra, enable_checkpointing=save, **more, **kwargs).fit(
            model, datamodule=make_datamodule(), ckpt_path=ckpt_path
        )
        return model.seen

    full = run(save=True)
    (ckpt,) = tmp_path.glob(f"*step={step}.ckpt")
    with warnings.catch_warnings():
        warnings.filterwarnings("error", ".*restarts the epoch", UserWarning)
        resumed = run(ckpt_path=str(ckpt))
    assert full[2:4] != full[step : step + 2]  # starting the epoch over would show
    return full, resumed


@pytest.mark.parametrize("num_workers", [0, 1])
@pytest.mark.parametrize("step", [6, 8], ids=["mid-epoch", "epoch-end"])
def test_resume_when_the_loader_is_built_before_the_restore(tmp_path, step, num_workers):
    full, resumed = full_and_resumed(
        tmp_path, step, lambda: IndexedDM(n=32, batch_size=8, seed=0, num_workers=num_workers)
    )
    assert resumed == full[step:]


class RestoresAfterSetup(SingleDeviceStrategy):
    """Restores the checkpoint after its setup, as FSDP, DeepSpeed and ModelParallel do."""

    def __init__(self):
        super().__init__(device="cpu")

    @property
    def restore_checkpoint_after_setup(self):
        return True


class MeasuresItsLoaderFirst(ScheduledIndexModule):
    """Builds a training loader only for its length, before `estimated_stepping_batches` builds the real one."""

    def configure_optimizers(self):
        assert len(self.trainer.datamodule.train_dataloader()) == 4
        return super().configure_optimizers()


@pytest.mark.parametrize("num_workers", [0, 1])
def test_resume_when_the_strategy_restores_after_the_loader_is_built(tmp_path, num_workers):
    # the loader is built in `configure_optimizers` during the strategy's setup and the position arrives later:
    # with workers, its iterator had already drawn the epoch's first batches (it restarted the epoch, silently)
    full, resumed = full_and_resumed(
        tmp_path, 6, lambda: IndexedDM(n=32, batch_size=8, seed=0, num_workers=num_workers), strategy=RestoresAfterSetup
    )
    assert resumed == full[6:]


def test_resume_when_a_loader_is_built_only_for_its_length_first(tmp_path):
    # that first loader took the restored position, and the one that trains started the epoch over, silently
    full, resumed = full_and_resumed(
        tmp_path, 6, lambda: IndexedDM(n=32, batch_size=8, seed=0, num_workers=1), module=MeasuresItsLoaderFirst
    )
    assert resumed == full[6:]


class RecordsTheRealRun(IndexModule):
    def on_train_start(self):
        self.seen.clear()  # a BatchSizeFinder's trials came before


class SaysItSearches(BatchSizeFinder):
    def on_fit_start(self, trainer, pl_module):
        super().on_fit_start(trainer, pl_module)  # still searches at fit start


@pytest.mark.parametrize("finder", [BatchSizeFinder, SaysItSearches], ids=["lightnings", "a-subclass"])
def test_a_batch_size_search_in_a_resumed_fit_trains_the_whole_epoch_as_lightnings_loops_do(tmp_path, finder):
    # the finder's trials restore a checkpoint of their own, after which Lightning's loops start at step 0: the data
    # must too (the position of the resumed checkpoint, kept for every loader, skipped batches nobody counted)
    saver = ModelCheckpoint(dirpath=tmp_path, every_n_train_steps=2, save_top_k=-1)
    trainer(max_epochs=1, callbacks=[saver], enable_checkpointing=True, limit_val_batches=0).fit(
        IndexModule(), datamodule=WithValidation(n=64, batch_size=8, seed=0)
    )
    module = RecordsTheRealRun()
    t = trainer(
        max_epochs=1, callbacks=[finder(mode="power", steps_per_trial=1, init_val=8, max_trials=2)], limit_val_batches=0
    )
    dm = WithValidation(n=64, batch_size=8, seed=0)  # the finder resets the validation loaders too
    t.fit(module, datamodule=dm, ckpt_path=str(tmp_path / "epoch=0-step=2.ckpt"))
    assert sorted(i for batch in module.seen for i in batch) == list(range(64))
    assert t.global_step == len(module.seen)


class SearchesAtEpochStart(BatchSizeFinder):
    """Lightning's finetuning pattern: no search at fit start, one at the start of chosen epochs."""

    def __init__(self, milestones, **kwargs):
        super().__init__(**kwargs)
        self.milestones = milestones

    def on_fit_start(self, trainer, pl_module):
        return

    def on_train_epoch_start(self, trainer, pl_module):
        if trainer.current_epoch in self.milestones:
            self.scale_batch_size(trainer, pl_module)


def test_a_batch_size_finder_that_leaves_the_loops_resumed_keeps_the_position(tmp_path):
    # at an epoch's start (the restore is over), and at fit start under a strategy that restores after its setup:
    # Lightning's loops resume mid-epoch, so the data must (the loader is built before the restore, as in #20550)
    def finder_at_epoch_start():
        return SearchesAtEpochStart((10,), init_val=8, max_trials=1, steps_per_trial=1)

    def dm():
        return IndexedDM(n=32, batch_size=8, seed=0, num_workers=1)

    full, resumed = full_and_resumed(tmp_path, 6, dm, callbacks=finder_at_epoch_start)
    assert resumed == full[6:]
    full, resumed = full_and_resumed(
        tmp_path / "late",
        6,
        lambda: WithValidation(n=32, batch_size=8, seed=0, num_workers=1),
        module=RecordsTheRealRunOnASchedule,
        strategy=RestoresAfterSetup,
        callbacks=lambda: BatchSizeFinder(init_val=8, max_val=8, max_trials=1, steps_per_trial=1),
        limit_val_batches=0,
    )
    assert resumed == full[6:]


class RecordsTheRealRunOnASchedule(ScheduledIndexModule):
    def on_train_start(self):
        self.seen.clear()  # a BatchSizeFinder's trials came before


def test_a_resume_leaves_an_earlier_fits_loader_alone(tmp_path):
    # the datamodule's loader of an earlier fit, alive with its trainer: handing it the position compared its seed
    # with the checkpoint's (a false warning); the resumed run's own loader is built after the restore
    saver = ModelCheckpoint(dirpath=tmp_path, every_n_train_steps=2, save_top_k=-1)
    full = IndexModule()
    trainer(max_epochs=2, callbacks=[saver], enable_checkpointing=True).fit(
        full, datamodule=IndexedDM(n=32, batch_size=8, seed=2)
    )
    dm = IndexedDM(n=32, batch_size=8, seed=1)
    earlier = trainer(max_epochs=1)
    earlier.fit(IndexModule(), datamodule=dm)
    dm.seed = 2
    resumed = IndexModule()
    with warnings.catch_warnings():
        warnings.simplefilter("error", SpeedupWarning)
        trainer(max_epochs=2).fit(resumed, datamodule=dm, ckpt_path=str(tmp_path / "epoch=1-step=6.ckpt"))
    assert resumed.seen == full.seen[6:]


class GroupedBatches(torch.utils.data.BatchSampler):
    """Batches of one group each (index parity), in the order the sampler's indices fill them: torchvision's
    GroupedBatchSampler, aspect-ratio or length bucketing. Batch k is not the sampler's k-th block of indices."""

    def __iter__(self):
        buffers: dict[int, list[int]] = {0: [], 1: []}
        for i in self.sampler:
            buffer = buffers[i % 2]
            buffer.append(i)
            if len(buffer) == self.batch_size:
                yield list(buffer)
                buffer.clear()
        yield from (buffer for buffer in buffers.values() if buffer)


class OwnLoaderDM(IndexedDM):
    """A `train_dataloader` of the user's own: a ResumableDataLoader given the datamodule (docs/data.md), with the
    sampler passed directly or inside a batch sampler (plain, or one that groups)."""

    def __init__(self, batch_sampler=False, **kwargs):
        super().__init__(**kwargs)
        self.use_batch_sampler = batch_sampler

    def train_dataloader(self):
        dataset = self.train_dataset
        sampler = self.train_sampler(dataset)
        if self.use_batch_sampler:
            kind = GroupedBatches if self.use_batch_sampler == "grouped" else torch.utils.data.BatchSampler
            batches = kind(sampler, self.batch_size, drop_last=False)
            return ResumableDataLoader(dataset, batch_sampler=batches, speedups_datamodule=self, num_workers=1)
        return ResumableDataLoader(dataset, batch_size=self.batch_size, sampler=sampler, speedups_datamodule=self)


@pytest.mark.parametrize("batch_sampler", [False, True, "grouped"], ids=["sampler", "batch-sampler", "grouped"])
@pytest.mark.parametrize("step", [6, 8], ids=["mid-epoch", "epoch-end"])
def test_a_users_own_resumable_loader_resumes_where_the_run_stopped(tmp_path, step, batch_sampler):
    # Its own loader was never registered with the datamodule (the epoch restarted under #20550), and with a batch
    # sampler the position went to the loader's unused default sampler (a wrong warning, epoch 0's order replayed).
    full, resumed = full_and_resumed(tmp_path, step, lambda: OwnLoaderDM(batch_sampler, n=32, batch_size=8, seed=0))
    assert resumed == full[step:]


def test_a_grouping_batch_sampler_around_a_sampler_that_cannot_replay_its_order_restarts_the_epoch_and_says_so():
    # a RandomSampler draws another order on resume: leaving out the first batches of that one would lose samples
    dataset = TensorDataset(torch.arange(32).float().unsqueeze(1))
    loader = ResumableDataLoader(
        dataset, batch_sampler=GroupedBatches(torch.utils.data.RandomSampler(dataset), 4, False)
    )
    with pytest.warns(UserWarning, match="RandomSampler replays no epoch's order.*restarts the epoch"):
        loader.load_state_dict({"epoch": 0, "batches": 2, "epoch_done": 0, "seeds": [0]})
    assert sorted(int(i) for b in loader for i in b[0].flatten()) == list(range(32))

    # a batch sampler that shows no sampler cannot be replayed: said so, by its name
    class Own:
        def __iter__(self):
            return iter([[0, 1], [2, 3], [4, 5]])

        def __len__(self):
            return 3

    with pytest.warns(SpeedupWarning, match="The batch sampler Own shows no sampler whose order replays"):
        ResumableDataLoader(dataset, batch_sampler=Own()).load_state_dict({"epoch": 0, "batches": 1, "epoch_done": 0})
    # a DistributedSampler after `set_epoch` replays its order, even with the iterator made before the restore
    shuffled = DistributedSampler(dataset, num_replicas=1, rank=0, seed=3)
    loader = ResumableDataLoader(dataset, batch_sampler=GroupedBatches(shuffled, 4, False))
    shuffled.set_epoch(1)
    full = [b[0].flatten().tolist() for b in loader]
    early = iter(loader)
    with warnings.catch_warnings():
        warnings.simplefilter("error", SpeedupWarning)
        loader.load_state_dict({"epoch": 1, "batches": 3, "epoch_done": 0, "seeds": [3]})
    assert [b[0].flatten().tolist() for b in early] == full[3:]
    # a SequentialSampler replays its order: the batches after the first two, exactly
    loader = ResumableDataLoader(
        dataset, batch_sampler=GroupedBatches(torch.utils.data.SequentialSampler(dataset), 4, False)
    )
    full = [b[0].flatten().tolist() for b in loader]
    loader.load_state_dict({"epoch": 0, "batches": 2, "epoch_done": 0, "seeds": [0]})
    assert [b[0].flatten().tolist() for b in loader] == full[2:]


def test_a_replaced_loader_under_a_users_batch_sampler_lets_its_workers_go():
    # a reload swaps loaders without stopping the old one's persistent workers: they must end with its last
    # reference, not wait for the cycle collector (the resume wrapper held the loader strongly: a cycle)
    import gc
    import multiprocessing

    dataset = TensorDataset(torch.arange(16).float().unsqueeze(1))
    before = len(multiprocessing.active_children())
    batches = GroupedBatches(torch.utils.data.SequentialSampler(dataset), 4, False)
    loader = ResumableDataLoader(dataset, batch_sampler=batches, num_workers=1, persistent_workers=True)
    assert len(list(loader)) == 4
    assert len(next(iter(loader))[0]) == 4  # a pass left unfinished (limit_train_batches, a stopped epoch)
    assert len(multiprocessing.active_children()) == before + 1
    gc.disable()
    try:
        del loader
        deadline = time.monotonic() + 10
        while len(multiprocessing.active_children()) > before and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(multiprocessing.active_children()) == before
    finally:
        gc.enable()


def test_a_batch_sampler_around_our_sharded_sampler_shows_it_to_lightning():
    # Lightning reads `loader.sampler` (a default SequentialSampler beside a batch sampler) to decide whether to
    # replace the order under DDP: it swapped our sharded sampler for its own DistributedSampler (checked on 2
    # ddp_spawn processes: the seeded order, the sampling callbacks and the resume position were lost)
    from lightning_speedups.data import EpochShuffleSampler

    dataset = TensorDataset(torch.arange(32).float().unsqueeze(1), torch.arange(32) % 4)
    shard = EpochShuffleSampler(dataset, num_replicas=2, rank=1, seed=0)
    loader = ResumableDataLoader(dataset, batch_sampler=torch.utils.data.BatchSampler(shard, 4, drop_last=False))
    assert loader.sampler is shard is loader.order_sampler
    seen = [b[0].flatten().long().tolist() for b in loader]
    assert seen == [[int(i) for i in batch] for batch in loader.batch_sampler]
    # on one device nothing is swapped: the default stays, and Lightning's rebuild for overfit_batches keeps the
    # batch sampler (shown ours, it was rebuilt without it: batches of 1)
    single = EpochShuffleSampler(dataset, num_replicas=1, rank=0, seed=0)
    loader = ResumableDataLoader(dataset, batch_sampler=torch.utils.data.BatchSampler(single, 4, drop_last=False))
    assert isinstance(loader.sampler, torch.utils.data.SequentialSampler) and loader.order_sampler is single


def seeded_epoch(tmp_path, global_seed, callbacks, datamodule, ckpt_path=None):
    """The indices each step of a one-epoch fit saw, under ``seed_everything(global_seed)``; a fit that does not
    resume saves a checkpoint every 2 steps in ``tmp_path`` (``epoch=0-step=2.ckpt``: mid-epoch)."""
    seed_everything(global_seed)
    save = ckpt_path is None
    extra = [ModelCheckpoint(dirpath=tmp_path, every_n_train_steps=2, save_top_k=-1)] if save else []
    model = IndexModule()
    trainer(max_epochs=1, callbacks=[*callbacks, *extra], enable_checkpointing=save).fit(
        model, datamodule=datamodule, ckpt_path=ckpt_path
    )
    return model.seen


def test_a_sampling_callbacks_own_seed_sets_the_order_and_the_resume_check(tmp_path):
    # The checkpoint recorded the datamodule's seed although RepeatFactorSampling(seed=5) set the order: a resume
    # under another global seed was warned about (and told to change it), though it trains the same batches.
    from lightning_speedups import RepeatFactorSampling

    def run(global_seed, sampler_seed=5, ckpt_path=None):
        callbacks = [RepeatFactorSampling(threshold=0.3, seed=sampler_seed)]
        return seeded_epoch(tmp_path, global_seed, callbacks, IndexedDM(n=32, batch_size=8), ckpt_path)

    full = run(1)
    ckpt = str(tmp_path / "epoch=0-step=2.ckpt")
    with warnings.catch_warnings():
        warnings.filterwarnings("error", "The checkpoint's run shuffled", SpeedupWarning)
        assert run(2, ckpt_path=ckpt) == full[2:]
    with pytest.warns(SpeedupWarning, match=r"seed 5, this run with seed 6.*Pass `seed=5` to the sampling callback"):
        run(1, sampler_seed=6, ckpt_path=ckpt)


def test_composed_samplers_record_every_seed_their_order_follows(tmp_path):
    # RepeatFactorSampling(seed=7) beside a curriculum that follows the datamodule's seed: only 7 was recorded, so
    # a resume under another global seed trained on other batches without a word
    from lightning_speedups import CurriculumOrdering, RepeatFactorSampling

    class Difficulty(IndexedDM):
        def setup(self, stage):
            super().setup(stage)
            self.train_difficulty = np.arange(self.n, dtype=float)

    def run(global_seed, ckpt_path=None):
        callbacks = [RepeatFactorSampling(threshold=0.3, seed=7), CurriculumOrdering("linear")]
        return seeded_epoch(tmp_path, global_seed, callbacks, Difficulty(n=32, batch_size=8), ckpt_path)

    full = run(1)
    ckpt = str(tmp_path / "epoch=0-step=2.ckpt")
    with warnings.catch_warnings():
        warnings.filterwarnings("error", "The checkpoint's run shuffled", SpeedupWarning)
        assert run(1, ckpt_path=ckpt) == full[2:]
    with pytest.warns(SpeedupWarning, match=r"seed 7, 1, this run with seed 7, 2.*`seed_everything\(1\)`"):
        run(2, ckpt_path=ckpt)


def test_a_loader_position_applies_only_while_a_checkpoint_is_restored():
    """BatchSizeFinder's trials restore a checkpoint of their own: its position must not reach a loader built
    later (a reload at the next epoch would start that epoch in the trial's place)."""
    dm = IndexedDM(n=32, batch_size=8, seed=0)
    dm.setup("fit")
    dm.load_state_dict({"train_loader_position": {"epoch": 0, "batches": 2, "epoch_done": 0, "seed": 0}})
    seen = [int(i) for batch in dm.train_dataloader() for i in batch[0].flatten().long()]
    assert sorted(seen) == list(range(32))  # no restore under way: the whole epoch, nothing skipped
    assert dm.__dict__.get("_pending_loader_state") is None  # and consumed: not applied to a later loader


def test_the_datamodule_pickles_after_building_its_loader():
    """ddp_spawn pickles the datamodule: after a first fit it holds a weak reference to its last loader."""
    import pickle

    dm = IndexedDM(n=32, batch_size=8)
    trainer(max_epochs=1).fit(IndexModule(), datamodule=dm)
    copy = pickle.loads(pickle.dumps(dm))
    assert "_train_loader" not in copy.__dict__ and copy.batch_size == 8


class WithValidation(IndexedDM):
    def val_dataloader(self):
        return self.eval_dataloader(self.train_dataset)


class Validates(ScheduledIndexModule):
    def validation_step(self, batch, batch_idx):
        return None


def test_a_position_restored_by_validate_does_not_reach_a_later_fit(tmp_path):
    saver = ModelCheckpoint(dirpath=tmp_path, every_n_train_steps=3, save_top_k=-1)
    trainer(max_epochs=1, callbacks=[saver], enable_checkpointing=True, limit_val_batches=0).fit(
        Validates(), datamodule=WithValidation(n=32, batch_size=8, seed=0)
    )
    dm = WithValidation(n=32, batch_size=8, seed=0)
    trainer().validate(Validates(), datamodule=dm, ckpt_path=str(tmp_path / "epoch=0-step=3.ckpt"))
    assert dm.__dict__.get("_pending_loader_state") is None  # validate builds no training loader to take it
