"""RepeatFactorSampling and CurriculumOrdering in real fits: what each step saw, composition, resume, errors."""

import copy
import functools
import itertools
import math
import sys
import warnings

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from lightning.pytorch import seed_everything
from lightning.pytorch.callbacks import Callback, GradientAccumulationScheduler, LambdaCallback, ModelCheckpoint
from torch import nn
from torch.utils.data import DataLoader, IterableDataset, TensorDataset

from lightning_speedups import (
    CurriculumOrdering,
    LossScore,
    ProgressiveResizing,
    RepeatFactorSampling,
    ScheduledResize,
    SpeedupDataModule,
    SpeedupWarning,
)
from lightning_speedups.functional import sampling as fs
from lightning_speedups.samplers import EpochListSampler, SamplingPlan
from tests.helpers import IndexedImages, MemoryLogger, cosine_over_the_run, trainer
from tests.sampling_helpers import IndexDM, IndexModel, long_tail
from tests.test_data import Provider


def fit(callbacks, *, n=80, max_epochs=3, model=None, dm=None, **kwargs):
    model = model or IndexModel(n)
    t = trainer(max_epochs=max_epochs, callbacks=callbacks, **kwargs)
    t.fit(model, datamodule=dm or IndexDM(n))
    return model, t


def epochs_of(model, batches_per_epoch):
    flat = [
        [i for b in model.seen[k : k + batches_per_epoch] for i in b]
        for k in range(0, len(model.seen), batches_per_epoch)
    ]
    return flat


def ranks(order):
    r = np.empty(len(order), dtype=int)
    r[order] = np.arange(len(order))
    return r


# ---------------------------------------------------------------------------------------------- repeat factors


def test_repeat_factor_sampling_fit_draws_the_functional_epochs():
    seed_everything(3)  # the datamodule's seed, shared by every rank
    rfs = RepeatFactorSampling(threshold=0.1)
    model, t = fit([rfs], n=200, max_epochs=4)
    r = fs.repeat_factors(long_tail(200), threshold=0.1)
    length = round(r.sum())
    assert rfs.epoch_length == length == 209 and len(rfs.factors) == 200
    batches = math.ceil(length / 8)
    assert t.num_training_batches == batches
    seen = epochs_of(model, batches)
    assert len(seen) == 4 and all(len(e) == length for e in seen)  # constant epoch length
    for epoch, indices in enumerate(seen):
        assert indices == fs.repeat_factor_epoch(r, seed=3, epoch=epoch).tolist()
    # each epoch repeats the rare samples (r = 3.16 for the rarest class) and keeps the frequent ones once or so
    labels = long_tail(200)
    drawn = np.bincount(np.concatenate(seen), minlength=200) / 4
    assert drawn[labels == 3].mean() > 2.5 and drawn[labels == 0].mean() < 1.1
    assert seen[0] != seen[1]
    assert rfs.largest_class_factors(2) == pytest.approx({3: math.sqrt(10), 2: math.sqrt(2.5)})


def test_a_dataset_swapped_at_a_reload_gets_its_own_repeat_factors_even_of_the_same_length():
    from torch.utils.data import TensorDataset

    class Swapping(IndexDM):
        """From epoch 2 on, a training set of the same length whose rare class is elsewhere (labels reversed)."""

        def get_train_dataset(self):
            if self.trainer is not None and self.trainer.current_epoch >= 2:
                if not hasattr(self, "swapped"):
                    x, y = self.train_dataset.tensors
                    self.swapped = TensorDataset(x, y.flip(0))
                return self.swapped
            return self.train_dataset

    seed_everything(3)
    rfs = RepeatFactorSampling(threshold=0.1)
    model, t = fit([rfs], n=200, max_epochs=3, dm=Swapping(200), reload_dataloaders_every_n_epochs=1)
    flipped = long_tail(200)[::-1].copy()
    assert np.array_equal(rfs.factors, fs.repeat_factors(flipped, threshold=0.1))
    last = epochs_of(model, t.num_training_batches)[2]
    assert last == fs.repeat_factor_epoch(rfs.factors, seed=3, epoch=2).tolist()
    import pickle  # ddp_spawn pickles the callbacks: the reference to the dataset stays behind

    copy_ = pickle.loads(pickle.dumps(rfs))
    assert np.array_equal(copy_.factors, rfs.factors) and "_factors_of" not in copy_.__dict__


def test_labels_the_datamodule_changes_at_a_reload_change_the_repeat_factors():
    class Relabel(Callback):  # pseudo-labelling: new labels for the same training set at each epoch's end
        def on_train_epoch_end(self, trainer, pl_module):
            dm, epoch = trainer.datamodule, trainer.current_epoch
            if epoch == 0:
                dm.train_labels = np.zeros(80, dtype=np.int64)  # set anew
            dm.train_labels[:] = 0  # then changed in place
            dm.train_labels[epoch : epoch + 2] = 1  # two rare samples, moving

    seed_everything(3)
    given = long_tail(80)
    fixed = RepeatFactorSampling(threshold=0.3, labels=given)  # given to the callback: read once per dataset
    rfs = RepeatFactorSampling(threshold=0.3)
    model, t = fit([rfs, Relabel()], max_epochs=3, reload_dataloaders_every_n_epochs=1)
    new = np.zeros(80, dtype=np.int64)
    new[1:3] = 1  # set at the end of epoch 1, read at epoch 2's loader
    assert np.array_equal(rfs.factors, fs.repeat_factors(new, threshold=0.3))
    assert rfs.epoch_length == round(fs.repeat_factors(new, threshold=0.3).sum()) != 80
    last = [i for b in model.seen[-t.num_training_batches :] for i in b]
    assert last == fs.repeat_factor_epoch(rfs.factors, seed=3, epoch=2).tolist()
    model, _ = fit([fixed, Relabel()], max_epochs=2, reload_dataloaders_every_n_epochs=1)
    assert np.array_equal(fixed.factors, fs.repeat_factors(given, threshold=0.3))


def test_a_fresh_dataset_wrapper_per_call_is_warned_about_once_not_at_every_reload():
    from torch.utils.data import Subset

    class FreshSubset(IndexDM):
        def get_train_dataset(self):
            return Subset(self.train_dataset, range(len(self.train_dataset)))  # a new object each call

    rfs = RepeatFactorSampling(threshold=1e-6)  # no class that rare: every factor is 1
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fit([rfs], n=40, max_epochs=3, dm=FreshSubset(40), reload_dataloaders_every_n_epochs=1)
    said = [w for w in caught if "every repeat factor is 1" in str(w.message)]
    assert len(said) == 1 and rfs.epoch_length == 40


def test_a_threshold_that_repeats_most_of_the_data_is_warned_about():
    # every sample its own class with threshold 1: each factor is sqrt(40), epochs of 253 samples for 40, unsaid
    rfs = RepeatFactorSampling(threshold=1.0, labels=np.arange(40))
    with pytest.warns(
        SpeedupWarning, match=r"each epoch 6\.3x the dataset \(253 samples for 40; largest factor 6\.3\)"
    ):
        fit([rfs], n=40, max_epochs=1)
    assert rfs.epoch_length == 253 == round(40 * math.sqrt(40))
    with warnings.catch_warnings():  # 1.3x the dataset: rare classes oversampled, not warned about
        warnings.filterwarnings("error", ".*x the dataset", SpeedupWarning)
        fit([RepeatFactorSampling(threshold=0.5, labels=np.arange(40) % 2 + np.repeat([0, 2], [36, 4]))], n=40)


def test_labels_from_an_array_or_a_callable_and_multi_label():
    labels = [[0]] * 70 + [[0, 1]] * 8 + [[1, 2]] + [[]]
    a = RepeatFactorSampling(threshold=0.2, labels=labels)
    b = RepeatFactorSampling(threshold=0.2, labels=lambda dataset: labels[: len(dataset)])
    for cb in (a, b):
        fit([cb], max_epochs=1)
        np.testing.assert_allclose(cb.factors, fs.repeat_factors(labels, 0.2))
    assert a.factors[78] == pytest.approx(math.sqrt(0.2 / (1 / 80)))  # class 2, in one sample of 80
    assert a.factors[79] == 1.0


def test_knobs_are_logged():
    logger = MemoryLogger()
    rfs = RepeatFactorSampling(threshold=0.1)
    cur = CurriculumOrdering("linear", start_fraction=0.25, full_at=0.5)
    fit([rfs, cur], logger=logger, log_every_n_steps=1, max_epochs=2)
    h = logger.history
    assert h["repeat_factor_sampling/expected_epoch_length"][0][1] == pytest.approx(rfs.factors.sum())
    assert h["repeat_factor_sampling/epoch_length"][0][1] == rfs.epoch_length == 84
    assert h["repeat_factor_sampling/max_factor"][0][1] == pytest.approx(math.sqrt(8))
    assert h["repeat_factor_sampling/class_factor/3"][0][1] == pytest.approx(math.sqrt(8))
    fractions = [v for _, v in h["curriculum/fraction"]]
    assert fractions[0] == pytest.approx(0.25) and fractions[-1] == 1.0
    assert all(b >= a for a, b in itertools.pairwise(fractions))
    assert h["curriculum/pool_size"][0][1] == 20


def test_knobs_follow_the_factors_and_hand_out_copies():
    rfs = RepeatFactorSampling(threshold=0.1, log_top_k=0)
    fit([rfs], max_epochs=1)
    first = rfs.knobs()
    assert first["max_factor"] == pytest.approx(math.sqrt(8))
    first["max_factor"] = -1.0  # the caller's copy: the next reading is unchanged
    assert rfs.knobs()["max_factor"] == pytest.approx(math.sqrt(8))
    rfs.factors = np.array([1.0, 2.0, 4.0, 1.0])  # new factors (a new fit): new knobs
    assert rfs.knobs()["max_factor"] == 4.0 and rfs.knobs()["expected_epoch_length"] == 8.0
    assert rfs.knobs()["repeated_fraction"] == 0.5


# ---------------------------------------------------------------------------------------------- curricula


def test_first_paced_steps_see_only_the_easiest_fraction():
    cur = CurriculumOrdering("fixed_exponential", start_fraction=0.1, growth=2.0, step_length=2)
    model, _ = fit([cur])
    dm_difficulty = np.random.default_rng(1).permutation(80).astype(float)
    rank = ranks(np.argsort(dm_difficulty))
    pools = {0: 8, 1: 8, 2: 16, 3: 16, 4: 32, 5: 32, 6: 64, 7: 64}
    assert model.steps == list(range(30))
    for step, indices in zip(model.steps, model.seen, strict=True):
        assert rank[indices].max() < pools.get(step, 80), step
    first = {i for b in model.seen[:2] for i in b}
    assert first <= set(np.flatnonzero(rank < 8).tolist())
    assert len({pools.get(s, 80) for s in range(10)}) > 2  # the pool grew inside epoch 0
    epoch1, epoch2 = epochs_of(model, 10)[1:]
    assert sorted(epoch1) == sorted(epoch2) == list(range(80)) and epoch1 != epoch2  # all data: uniform epochs


def test_pacing_follows_the_real_steps_after_a_reload_with_another_batch_size():
    # The rebuilt loader's clock assumed every earlier epoch had its own (new) length: epoch 1 paced as if 20
    # steps had passed, not 10, over a run of 60 steps, not 50, with no warning.
    clocks = []

    class HalveTheBatch(Callback):
        def on_train_epoch_start(self, trainer, pl_module):
            clock = trainer.train_dataloader.sampler.plan.clock
            clocks.append((trainer.global_step, clock.first_step(trainer.current_epoch), clock.total_steps))

        def on_train_epoch_end(self, trainer, pl_module):
            trainer.datamodule.batch_size = 4  # from epoch 1 on: 20 batches per epoch instead of 10

    cur = CurriculumOrdering("linear", start_fraction=0.1, full_at=1.0)
    model, t = fit([cur, HalveTheBatch()], reload_dataloaders_every_n_epochs=1)
    assert t.global_step == 10 + 20 + 20
    assert clocks == [(0, 0, 30.0), (10, 10, 50.0), (30, 30, 50.0)]  # epoch 0 knew only its own length
    rank = ranks(np.argsort(np.random.default_rng(1).permutation(80).astype(float)))
    # epochs 1 and 2: the progress reached at the reload (10 of epoch 0's 30 steps) stands, the 40 steps left spread
    # the rest, so the pool never shrinks (10 / 50 would have taken it from 0.4 back to 0.28 of the data)
    for step, indices in zip(model.steps[10:], model.seen[10:], strict=True):
        progress = 1 / 3 + (2 / 3) * (step - 10) / 40
        assert rank[indices].max() < fs.pool_sizes(cur.pacing.fraction([step], progress=[progress]), 80)[0], step
    paced = [cur.pacing.fraction([s], progress=[1 / 3 + (2 / 3) * (s - 10) / 40])[0] for s in range(10, 50)]
    assert paced[0] == pytest.approx(0.4) and np.all(np.diff(paced) > 0)


def test_the_pool_never_shrinks_when_a_reload_grows_the_training_set():
    """64 samples, then 96, then 128 (batch 8): each reload lengthens the run, and the pool fell back at each one
    (0.733 of the data to 0.6 at step 8), returning samples it had made available to the unseen."""
    fractions = []

    class Record(Callback):
        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            plan = trainer.train_dataloader.sampler.plan
            fractions.append(plan.pool_fraction(plan.clock.step_of(batch_idx, trainer.current_epoch)))

    class Grows(IndexDM):
        def get_train_dataset(self):
            epoch = self.trainer.fit_loop.epoch_progress.current.processed if self.trainer is not None else 0
            n = 64 + 32 * epoch
            self.train_difficulty = np.arange(float(n))
            return TensorDataset(torch.arange(n, dtype=torch.float32)[:, None], torch.zeros(n, dtype=torch.long))

    cur = CurriculumOrdering("linear", start_fraction=0.2, full_at=0.5)
    fit([cur, Record()], max_epochs=3, dm=Grows(64), reload_dataloaders_every_n_epochs=1)
    assert len(fractions) == 8 + 12 + 16
    assert np.all(np.diff(fractions) >= 0) and fractions[-1] == 1.0
    # epoch 1 starts where epoch 0's pace left off: 8 of its 24 steps, all the data due at half of them
    assert fractions[8] == pytest.approx(0.2 + 0.8 * (8 / 24) / 0.5)


def test_a_reload_with_other_difficulties_reorders_even_at_the_same_length():
    # The order was kept while the dataset's length and the seed stayed: epoch 1 drew the new set's hardest.
    class Reversed(IndexDM):
        def train_dataloader(self):
            if self.trainer.current_epoch >= 1:
                self.train_difficulty = np.random.default_rng(1).permutation(80)[::-1].astype(float)
            return super().train_dataloader()

    cur = CurriculumOrdering("fixed_exponential", start_fraction=0.1, step_length=10**6)  # 8 easiest throughout
    model, t = fit([cur], max_epochs=2, dm=Reversed(), reload_dataloaders_every_n_epochs=1)
    first, second = epochs_of(model, t.num_training_batches)
    before = np.random.default_rng(1).permutation(80)
    assert set(first) <= set(np.flatnonzero(before < 8).tolist())
    assert set(second) <= set(np.flatnonzero(before[::-1] < 8).tolist())


class GrowsAtEpoch1(IndexDM):
    """From epoch 1 on (a loader reload), the training set plus ``extra`` samples valued ``n, n + 1, ...``."""

    def __init__(self, n: int, extra: int) -> None:
        super().__init__(n)
        self.extra = extra

    def get_train_dataset(self):
        if self.trainer is None or self.trainer.current_epoch < 1:
            return self.train_dataset
        if not hasattr(self, "grown"):
            x, y = self.train_dataset.tensors
            self.grown = type(self.train_dataset)(
                torch.cat([x, x[: self.extra] + self.n]), torch.cat([y, y[: self.extra]])
            )
        return self.grown


class EstimatingModel(IndexModel):
    """Reads ``estimated_stepping_batches`` in ``configure_optimizers`` when asked: a training loader built before
    Lightning restores a resumed run's loops."""

    def __init__(self, n: int, estimates: bool) -> None:
        super().__init__(n)
        self.estimates = estimates

    def configure_optimizers(self):
        if self.estimates:
            assert self.trainer.estimated_stepping_batches > 0
        return super().configure_optimizers()


def test_a_scorer_scores_a_training_set_of_another_size_at_a_reload():
    # The fit start's 40 scores were used for a set of 48: a ValueError after the first epoch.

    def by_value(pl_module, batch):  # difficulty = the sample's value
        return batch[0].reshape(-1)

    cur = CurriculumOrdering("fixed_exponential", start_fraction=0.1, step_length=10**6, difficulty=by_value)
    with pytest.warns(SpeedupWarning, match="has 48 samples at this loader reload, the difficulty was scored on 40"):
        model, t = fit([cur], n=40, max_epochs=2, dm=GrowsAtEpoch1(40, 8), reload_dataloaders_every_n_epochs=1)
    assert len(cur.scores) == 48 and t.global_step == 5 + 6
    assert {i for b in model.seen[5:] for i in b} <= set(range(5))  # ceil(0.1 x 48) easiest of the new set


@pytest.mark.parametrize("estimates", [False, True], ids=["plain", "estimated_stepping_batches"])
def test_a_run_resumed_after_a_reload_that_rescored_keeps_the_checkpoints_scores(tmp_path, estimates):
    # At fit start the datamodule still gave the first (40-sample) set, so the saved 48 scores were thrown away and
    # the set scored again with the resumed model: other scores, another order, other draws than the uninterrupted run.
    # `estimated_stepping_batches` builds a loader before the loops are restored: it too saw the first set.
    scored = []

    class Counted(LossScore):
        def __call__(self, pl_module, batch):
            scored.append(len(batch[0]))
            return super().__call__(pl_module, batch)

    def run(ckpt_path=None, save=False):
        seed_everything(0)
        scored.clear()
        model = EstimatingModel(40, estimates)
        cur = CurriculumOrdering("linear", start_fraction=0.2, difficulty=Counted())
        every = ModelCheckpoint(dirpath=tmp_path, every_n_epochs=1, save_top_k=-1, save_on_train_epoch_end=True)
        t = trainer(
            max_epochs=3,
            callbacks=[cur, every] if save else [cur],
            reload_dataloaders_every_n_epochs=1,
            enable_checkpointing=save,
        )
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            t.fit(model, datamodule=GrowsAtEpoch1(40, 8), ckpt_path=ckpt_path)
        return model, cur, [str(w.message) for w in caught if w.category is SpeedupWarning]

    full, full_cur, _ = run(save=True)
    resumed, cur, said = run(ckpt_path=next(tmp_path.glob("epoch=1*.ckpt")))
    # the first set is scored only for the loader `estimated_stepping_batches` builds before the restore
    assert sum(scored) == (40 if estimates else 0)
    assert len(cur.scores) == 48 and np.array_equal(cur.scores, full_cur.scores)
    assert resumed.seen == full.seen[-len(resumed.seen) :] and len(resumed.seen) == 6
    # neither scored again nor a pacing warning (the trainer counts 3 x 6 steps; the run had 5 + 6 + 6)
    assert said == []


@pytest.mark.parametrize("estimates", [False, True], ids=["plain", "estimated_stepping_batches"])
def test_repeat_factors_resumed_after_a_reload_that_resized_the_set_do_not_warn_of_changed_labels(tmp_path, estimates):
    # The checkpoint's epoch length (the reloaded set's) was compared with the fit's first set's: a false warning

    def run(ckpt_path=None, save=False):
        seed_everything(0)
        model, rfs = EstimatingModel(80, estimates), RepeatFactorSampling(threshold=0.1)
        every = ModelCheckpoint(dirpath=tmp_path, every_n_epochs=1, save_top_k=-1, save_on_train_epoch_end=True)
        callbacks = [rfs, every] if save else [rfs]
        t = trainer(max_epochs=3, callbacks=callbacks, reload_dataloaders_every_n_epochs=1, enable_checkpointing=save)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            t.fit(model, datamodule=GrowsAtEpoch1(80, 40), ckpt_path=ckpt_path)
        return model, [str(w.message) for w in caught if w.category is SpeedupWarning]

    full, _ = run(save=True)
    resumed, said = run(ckpt_path=next(tmp_path.glob("epoch=1*.ckpt")))
    assert resumed.seen == full.seen[-len(resumed.seen) :] and not [s for s in said if "checkpoint was trained" in s]


def test_difficulty_given_anew_or_a_dataset_grown_in_place_is_read_again_at_a_reload():
    # Values given to the callback were reused while the dataset object stayed: a new `difficulty` set between
    # epochs was ignored, and a dataset grown in place failed on the kept 40 task ids
    class Reassign(Callback):
        def on_train_epoch_end(self, trainer, pl_module):
            cur.difficulty = np.arange(80.0)[::-1].copy()  # now the high indices are easiest

    cur = CurriculumOrdering("fixed_exponential", start_fraction=0.1, step_length=10**6, difficulty=np.arange(80.0))
    model, _ = fit([cur, Reassign()], max_epochs=2, reload_dataloaders_every_n_epochs=1)
    assert {i for b in model.seen[:10] for i in b} <= set(range(8))
    assert {i for b in model.seen[10:] for i in b} <= set(range(72, 80))

    class GrowsInPlace(IndexDM):
        def train_dataloader(self):
            if self.trainer.current_epoch >= 1 and len(self.train_dataset) == 40:
                x, y = self.train_dataset.tensors
                self.train_dataset.tensors = (torch.cat([x, x[:8] + 40]), torch.cat([y, y[:8]]))
                self.train_difficulty = np.arange(48.0)
            return super().train_dataloader()

    cur = CurriculumOrdering(
        "fixed_exponential", start_fraction=0.1, step_length=10**6, tasks=lambda ds: np.zeros(len(ds))
    )
    fit([cur], n=40, max_epochs=2, dm=GrowsInPlace(40), reload_dataloaders_every_n_epochs=1)
    assert len(cur.order) == 48


class BatchOfEightThenFour(IndexDM):
    """Batch size 8 in epoch 0, 4 after it: a loader reloaded with another length."""

    def train_dataloader(self):
        self.batch_size = 8 if self.trainer.fit_loop.epoch_progress.current.processed == 0 else 4
        return super().train_dataloader()


@pytest.mark.parametrize(
    ("step", "every"),
    [(35, 2), (10, 1)],
    ids=["mid-epoch", "epoch-end-before-the-reload"],
)
def test_a_resume_around_a_reload_with_another_length_paces_as_the_uninterrupted_run(tmp_path, step, every):
    # Mid-epoch 2 (reloads every 2 epochs: 10 + 10 steps at batch 8, then 20 at 4): the reload's anchor was not in
    # the checkpoint, so the resumed run paced epoch 2 from 40 steps, not 20. At epoch 0's end, just before the
    # reload to batch 4: the resumed loader (already at batch 4) counted epoch 0 at its own length.
    def run(ckpt_path=None, save=False):
        seed_everything(0)
        model = IndexModel()
        if step == 10:  # Lightning's end-of-epoch checkpoint, saved in `on_train_epoch_end`
            every_step = {"every_n_epochs": 1, "save_on_train_epoch_end": True}
        else:
            every_step = {"every_n_train_steps": step}
        extra = [ModelCheckpoint(dirpath=tmp_path, save_top_k=-1, **every_step)] if save else []
        callbacks = [CurriculumOrdering("linear", start_fraction=0.1, full_at=1.0), *extra]
        t = trainer(
            max_epochs=3, callbacks=callbacks, reload_dataloaders_every_n_epochs=every, enable_checkpointing=save
        )
        t.fit(model, datamodule=BatchOfEightThenFour(), ckpt_path=ckpt_path)
        return model

    full = run(save=True)
    (ckpt,) = tmp_path.glob(f"*step={step}.ckpt")
    assert run(ckpt_path=str(ckpt)).seen == full.seen[step:]


class TwoOptimizerIndexModel(IndexModel):
    """Manual optimization with two optimizers: Lightning counts two global steps per batch."""

    def __init__(self, n: int = 80, read_run_length: bool = False) -> None:
        super().__init__(n)
        self.automatic_optimization = False
        self.other = nn.Linear(1, 4)
        self.read_run_length = read_run_length

    def training_step(self, batch, batch_idx):
        x, y = batch
        self.seen.append(x[:, 0].long().tolist())
        self.steps.append(self.global_step)
        for opt, net in zip(self.optimizers(), (self.net, self.other), strict=True):
            opt.zero_grad()
            self.manual_backward(F.cross_entropy(net(x / self.n), y))
            opt.step()

    def configure_optimizers(self):
        if self.read_run_length:  # builds the training loader before the optimizers exist (the OneCycle pattern)
            assert self.trainer.estimated_stepping_batches == 20
        return torch.optim.SGD(self.net.parameters(), lr=0.1), torch.optim.SGD(self.other.parameters(), lr=0.1)


@pytest.mark.parametrize("read_run_length", [False, True])
def test_pacing_under_manual_optimization_with_several_optimizers_reaches_all_the_data_at_max_steps(read_run_length):
    cur = CurriculumOrdering("linear", start_fraction=0.1, full_at=1.0)
    model = TwoOptimizerIndexModel(read_run_length=read_run_length)
    with warnings.catch_warnings():
        warnings.simplefilter("error", SpeedupWarning)  # the pacing's clock agrees with the trainer's run
        model, t = fit([cur], model=model, max_epochs=10, max_steps=20)  # 10 batches
    assert len(model.seen) == 10 and t.global_step == 20
    rank = ranks(np.argsort(np.random.default_rng(1).permutation(80).astype(float)))
    pools = [math.ceil(80 * (0.1 + 0.9 * b / 10)) for b in range(10)]  # linear over the run's 10 batches
    for b, indices in enumerate(model.seen):
        assert rank[indices].max() < pools[b], b
    assert cur.knobs()["fraction"] == pytest.approx(0.1 + 0.9 * 9 / 10)  # not 0.505: the pace took the whole run


def test_anti_curriculum_and_multitask_order():
    anti = CurriculumOrdering("step", start_fraction=0.1, full_at=0.5, anti_curriculum=True)
    model, _ = fit([anti], max_epochs=2)
    rank = ranks(np.argsort(np.random.default_rng(1).permutation(80).astype(float)))
    first_half = {i for b in model.seen[:10] for i in b}  # "step" pacing: 10% until half the run
    assert rank[list(first_half)].min() >= 72  # the hardest 10%

    multi = CurriculumOrdering("linear", start_fraction=0.3, full_at=1.0, task_order=[2, 0, 1])
    model, _ = fit([multi], dm=IndexDM(80, tasks=True), max_epochs=2)
    assert all(i % 3 == 2 for i in model.seen[0])  # 24 of 26 task-2 samples fill the first pool
    assert multi.order is not None and {int(i) % 3 for i in multi.order[:26]} == {2}
    assert [int(i) % 3 for i in multi.order[26:27]] == [0]


def test_difficulty_from_an_array_or_the_datamodule():
    dm = IndexDM(80)
    dm.setup("fit")
    from_dm = CurriculumOrdering().compute_order(dm, dm.train_dataset)
    np.testing.assert_array_equal(from_dm, np.argsort(dm.train_difficulty))
    reverse = CurriculumOrdering(difficulty=-dm.train_difficulty).compute_order(dm, dm.train_dataset)
    np.testing.assert_array_equal(reverse, from_dm[::-1])
    anti = CurriculumOrdering(anti_curriculum=True).compute_order(dm, dm.train_dataset)
    np.testing.assert_array_equal(anti, from_dm[::-1])
    # bfloat16 scores (a loss computed under bf16-mixed): raised "unsupported ScalarType BFloat16"; so did tasks
    bf16 = CurriculumOrdering(difficulty=torch.arange(80, 0, -1, dtype=torch.bfloat16)).compute_order(
        dm, dm.train_dataset
    )
    np.testing.assert_array_equal(bf16, np.arange(80)[::-1])
    tasks = torch.arange(80, dtype=torch.bfloat16) % 2
    by_task = CurriculumOrdering(tasks=tasks, task_order=[1, 0]).compute_order(dm, dm.train_dataset)
    assert (np.arange(80)[by_task[:40]] % 2 == 1).all()
    hard = np.arange(80) % 4 == 0  # a flag per sample: the flagged ones come last
    flagged = CurriculumOrdering(difficulty=hard).compute_order(dm, dm.train_dataset)
    assert not hard[flagged[:60]].any() and hard[flagged[60:]].all()


def per_sample_losses(model):
    """The loss of each of IndexDM(80)'s samples under ``model``, computed by hand."""
    dm = IndexDM(80)
    dm.setup("fit")
    x, y = dm.train_dataset.tensors
    with torch.no_grad():
        return F.cross_entropy(model(x), y, reduction="none").numpy()


class ScheduledIndexModel(IndexModel):
    """Sizes its LR schedule by `trainer.estimated_stepping_batches` (see `cosine_over_the_run`): the training
    loader, which needs the curriculum's order, is then built before `on_fit_start`."""

    def configure_optimizers(self):
        return cosine_over_the_run(self, lr=self.lr)


@pytest.mark.parametrize("model_class", [IndexModel, ScheduledIndexModel], ids=["loader-at-fit", "loader-in-setup"])
def test_loss_scorer_orders_by_the_initial_per_sample_loss(model_class):
    seed_everything(0)
    model = model_class(80)
    initial = copy.deepcopy(model)
    cur = CurriculumOrdering("fixed_exponential", difficulty=LossScore(), start_fraction=0.1, step_length=1000)
    fit([cur], model=model, max_epochs=1)
    loss = per_sample_losses(initial)
    np.testing.assert_allclose(cur.scores, loss, rtol=1e-6)
    easiest = set(np.argsort(loss, kind="stable")[:8].tolist())
    assert {i for b in model.seen for i in b} <= easiest  # the pool never grew (step_length 1000)
    assert model.training  # the scorer put the model back in train mode
    assert cur.state_dict()["scores"].shape == (80,)


def test_loss_scorer_scores_a_half_precision_model_in_float32():
    # under bf16-true the loss was computed in bfloat16: a confident sample's rounded to exactly 0, and half the
    # scores tied (ties are ordered at random)
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 4).to(torch.bfloat16)
    x = torch.randn(64, 8, dtype=torch.bfloat16) * 10
    y = model(x).argmax(1)  # mostly confident and right: losses near 0
    scores = LossScore()(model, [x, y])
    assert scores.dtype == torch.float32
    torch.testing.assert_close(scores, F.cross_entropy(model(x).float(), y, reduction="none"))
    in_bf16 = F.cross_entropy(model(x), y, reduction="none")
    assert (in_bf16 == 0).sum() >= 10 and (scores == 0).sum() == 0  # the ties bfloat16 makes, and none left
    assert scores.unique().numel() > in_bf16.unique().numel()
    # a loss of the user's own gets the output as the model made it (its weights may be bfloat16 too)
    weight = torch.ones(4, dtype=torch.bfloat16)
    own = LossScore(functools.partial(F.cross_entropy, weight=weight))(model, [x, y])
    assert own.dtype == torch.bfloat16


def test_loss_scorer_keeps_a_frozen_submodule_in_eval_mode():
    class FrozenPart(IndexModel):
        def __init__(self) -> None:
            super().__init__(80)
            self.frozen = torch.nn.BatchNorm1d(1).eval()  # a frozen part the user keeps in eval mode
            self.frozen_mode: list[bool] = []

        def training_step(self, batch, batch_idx):
            self.frozen_mode.append(self.frozen.training)
            return super().training_step(batch, batch_idx)

    model = FrozenPart()
    cur = CurriculumOrdering("fixed_exponential", difficulty=LossScore(), start_fraction=0.1, step_length=1000)
    fit([cur], model=model, max_epochs=1)
    assert model.frozen_mode and not any(model.frozen_mode)  # scoring did not switch it to train mode
    assert model.training and model.net.training


def test_a_second_fit_scores_its_own_model():
    seed_everything(0)
    cur = CurriculumOrdering("fixed_exponential", difficulty=LossScore(), start_fraction=0.1, step_length=1000)
    fit([cur], model=IndexModel(80), max_epochs=1)
    first = cur.scores.copy()
    seed_everything(1)
    second_model = IndexModel(80)
    initial = copy.deepcopy(second_model)
    fit([cur], model=second_model, max_epochs=1)
    loss = per_sample_losses(initial)
    np.testing.assert_allclose(cur.scores, loss, rtol=1e-6)
    assert not np.allclose(cur.scores, first)


def test_scores_restored_after_an_order_was_made_replace_that_order():
    """Strategies that restore checkpoints after their setup (FSDP, DeepSpeed) score the fresh model at fit start,
    then load the saved scores: the order must follow the saved ones."""
    cur = CurriculumOrdering("fixed_exponential", difficulty=LossScore(), start_fraction=0.1, step_length=1000)
    dm = IndexDM(80)
    dm.setup("fit")
    cur.scores = np.arange(80, dtype=np.float32)[::-1].copy()  # what a fit-start scoring of a fresh model gave
    cur.compute_order(dm, dm.train_dataset, seed=0)
    assert cur.order[0] == 79
    cur.load_state_dict({**cur.state_dict(), "scores": torch.arange(80, dtype=torch.float32)})  # the saved scores
    plan = SamplingPlan(num_samples=80, seed=0)
    cur.contribute_to_plan(plan, dm, dm.train_dataset, seed=0)
    assert cur.order[0] == 0 and cur.order[-1] == 79  # worked out again from the restored scores


def test_composed_repeat_factors_and_curriculum():
    seed_everything(5)
    rfs = RepeatFactorSampling(threshold=0.1)
    cur = CurriculumOrdering("linear", start_fraction=0.1, full_at=0.5)
    model, t = fit([rfs, cur], max_epochs=4)
    sampler = t.train_dataloader.sampler
    assert isinstance(sampler, EpochListSampler) and sampler.plan.sources == [
        "RepeatFactorSampling",
        "CurriculumOrdering",
    ]
    batches = math.ceil(84 / 8)
    seen = epochs_of(model, batches)
    assert [len(e) for e in seen] == [84] * 4
    rank = ranks(cur.order)
    assert rank[model.seen[0]].max() < 8  # ceil(0.1 * 80): the first step draws from the 8 easiest
    # after half the run the pace is full: the epoch is exactly the repeat-factor epoch
    r = fs.repeat_factors(long_tail(80), threshold=0.1)
    assert seen[3] == fs.repeat_factor_epoch(r, seed=5, epoch=3).tolist()
    # that the rare classes are oversampled within the pool while paced: the next test


class SizedIndexDM(IndexDM):
    """IndexDM whose samples are 8 x 8 images of their index, through the pipeline mode's transform."""

    def setup(self, stage: str) -> None:
        super().setup(stage)
        x, y = self.train_dataset.tensors
        self.train_dataset, self.train_labels = _ResizedIndices(x[:, 0], y), y.numpy()


class _ResizedIndices(torch.utils.data.Dataset):
    def __init__(self, x, y):
        self.x, self.y, self.resize = x, y, ScheduledResize(8)

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        return self.resize(self.x[i].expand(1, 8, 8)), self.y[i]


class SizedIndexModel(IndexModel):
    def training_step(self, batch, batch_idx):
        x, y = batch
        self.sizes.append(x.shape[-1])
        return super().training_step((x[:, :, 0, 0], y), batch_idx)

    def on_fit_start(self):
        self.sizes = []


def test_samplers_compose_with_pipeline_resizing():
    # the pipeline mode wraps the training sampler; the sampling callbacks must still find and drive it
    def run(pipeline):
        seed_everything(5)
        callbacks = [RepeatFactorSampling(threshold=0.1), CurriculumOrdering("linear", start_fraction=0.1, full_at=0.5)]
        if pipeline:
            callbacks.append(ProgressiveResizing(mode="pipeline", initial_scale=0.5, size_increment=2))
        model, _ = fit(callbacks, max_epochs=3, model=SizedIndexModel(80), dm=SizedIndexDM(80))
        return model

    plain, resized = run(False), run(True)
    assert resized.seen == plain.seen  # the same epochs, paced and repeated alike
    assert set(plain.sizes) == {8} and resized.sizes[0] == 4 and resized.sizes[-1] == 8


def test_the_rare_classes_are_oversampled_within_the_curriculum_pool():
    # 400 samples, t = 0.5: classes 1, 2, 3 (15%, 4%, 1%) get r = 1.8, 3.5, 7.1; the first half of the run is
    # paced, about 1000 draws from pools of the 10% .. 100% easiest samples.
    n, seed = 400, 5
    seed_everything(seed)
    rfs = RepeatFactorSampling(threshold=0.5)
    cur = CurriculumOrdering("linear", start_fraction=0.1, full_at=0.5)
    model, t = fit([rfs, cur], n=n, max_epochs=4, dm=IndexDM(n, batch_size=32))
    plan, per_epoch = t.train_dataloader.sampler.plan, t.num_training_batches
    rare = rfs.factors > 1
    assert set(long_tail(n)[rare].tolist()) == {1, 2, 3}
    # A paced draw picks one of the pool's entries of the epoch (its samples, each as often as the epoch's
    # stochastically rounded repeat factor says), uniformly: a rare draw with probability p, independently.
    drawn, p_weighted, p_uniform = 0, [], []
    for k, (step, batch) in enumerate(zip(model.steps, model.seen, strict=True)):
        pool = cur.order[: fs.pool_sizes([plan.pool_fraction(step)], n)[0]]
        if len(pool) == n:
            continue  # not paced
        assert ranks(cur.order)[batch].max() < len(pool)  # drawn from the pool
        drawn += int(rare[batch].sum())
        counts = fs.repeat_factor_counts(rfs.factors, seed=seed, epoch=k // per_epoch)[pool]
        p_weighted += [counts[rare[pool]].sum() / counts.sum()] * len(batch)
        p_uniform += [rare[pool].mean()] * len(batch)  # what the pool would give without repeat factors
    assert len(p_weighted) > 500

    def expected_and_tolerance(p):  # mean and 4 standard deviations of a sum of independent Bernoulli draws
        p = np.asarray(p)
        return p.sum(), 4 * math.sqrt(float(np.sum(p * (1 - p))))

    mean, tolerance = expected_and_tolerance(p_weighted)
    assert abs(drawn - mean) <= tolerance, (drawn, mean, tolerance)
    unweighted, tolerance_unweighted = expected_and_tolerance(p_uniform)
    assert drawn > unweighted + tolerance_unweighted, (drawn, unweighted)  # more than the pool alone gives


@pytest.mark.parametrize(
    "kwargs",
    [
        {"accumulate_grad_batches": 2, "limit_train_batches": 0.5, "max_epochs": 3},
        {"accumulate_grad_batches": 4, "max_epochs": 2, "max_steps": 5},
        {"scheduled": {1: 3, 2: 2}, "max_epochs": 4},
    ],
    ids=["accumulate-and-limit", "max-steps", "accumulation-scheduler"],
)
def test_the_step_clock_predicts_lightnings_steps(kwargs):
    """In-epoch pacing relies on knowing, while the loader is built, the step each batch will be trained at."""
    kwargs = dict(kwargs)
    scheduled = kwargs.pop("scheduled", None)
    callbacks = [RepeatFactorSampling(threshold=0.1), CurriculumOrdering("linear", start_fraction=0.1, full_at=1.0)]
    if scheduled:
        callbacks.append(GradientAccumulationScheduler(scheduled))
    model, t = fit(callbacks, dm=IndexDM(80, drop_last=True), **kwargs)
    clock = t.train_dataloader.sampler.plan.clock
    assert clock.batches_per_epoch == t.num_training_batches
    assert clock.total_steps == t.global_step  # each run went to its end
    per_epoch = t.num_training_batches
    predicted = [clock.step_of(b % per_epoch, b // per_epoch) for b in range(len(model.steps))]
    assert predicted == model.steps


# ---------------------------------------------------------------------------------------------- resume


def resume_run(tmp_path, ckpt_path=None, save=False):
    seed_everything(11)
    model = IndexModel(80)
    callbacks = [
        RepeatFactorSampling(threshold=0.1),
        CurriculumOrdering("linear", difficulty=LossScore(), start_fraction=0.1, full_at=0.8),
    ]
    if save:
        # after every batch (`on_train_batch_end`), and at every epoch end (`on_train_epoch_end`)
        callbacks.append(ModelCheckpoint(dirpath=tmp_path / "steps", every_n_train_steps=1, save_top_k=-1))
        callbacks.append(ModelCheckpoint(dirpath=tmp_path / "epochs", every_n_epochs=1, save_top_k=-1))
    t = trainer(callbacks=callbacks, max_epochs=3, enable_checkpointing=save)
    t.fit(model, datamodule=IndexDM(80), ckpt_path=ckpt_path)
    return model


@pytest.mark.parametrize(
    ("saved", "step"),
    [("steps", 11), ("steps", 16), ("epochs", 11), ("epochs", 22)],
    ids=["last-batch-of-epoch-0", "mid-epoch", "end-of-epoch-0", "end-of-epoch-1"],
)
def test_resume_draws_what_the_uninterrupted_run_draws(tmp_path, saved, step):
    full = resume_run(tmp_path, save=True)
    assert len(full.seen) == 33  # 84 samples / 8 = 11 batches per epoch
    (ckpt,) = (tmp_path / saved).glob(f"*step={step}.ckpt")
    epochs_done = torch.load(ckpt, weights_only=False)["loops"]["fit_loop"]["epoch_progress"]["current"]["processed"]
    # an epoch-end checkpoint has finished its epoch; one saved after the epoch's last batch has not, quite
    assert epochs_done == (step // 11 if saved == "epochs" else (step - 1) // 11)
    resumed = resume_run(tmp_path / "resumed", ckpt_path=str(ckpt))
    assert resumed.steps[0] == step
    assert resumed.seen == full.seen[step:]  # from an epoch end: the next epoch's indices, batch for batch
    for a, b in zip(full.state_dict().values(), resumed.state_dict().values(), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6)


def test_changed_labels_warn_on_resume_and_only_then(tmp_path):
    def run(rfs, ckpt_path=None, save=False, max_epochs=1):
        callbacks = [rfs, ModelCheckpoint(dirpath=tmp_path, save_last=True)] if save else [rfs]
        t = trainer(callbacks=callbacks, max_epochs=max_epochs, enable_checkpointing=save)
        t.fit(IndexModel(80), datamodule=IndexDM(80), ckpt_path=ckpt_path)

    run(RepeatFactorSampling(threshold=0.1), save=True)
    rfs = RepeatFactorSampling(threshold=0.1, labels=np.arange(80) % 2)  # no class is rare: epochs of 80
    with pytest.warns(SpeedupWarning, match="checkpoint was trained with epochs of 84 samples, these labels give 80"):
        run(rfs, ckpt_path=str(tmp_path / "last.ckpt"), max_epochs=2)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*checkpoint was trained", category=SpeedupWarning)
        run(rfs)  # a later fresh fit of the same callback has nothing to compare against


def test_shuffle_false_beside_a_sampling_callback_is_said_to_be_ignored():
    with pytest.warns(SpeedupWarning, match=r"IndexDM\(shuffle=False\) is ignored: RepeatFactorSampling orders"):
        trainer(callbacks=[RepeatFactorSampling(threshold=0.1)], max_steps=1).fit(
            IndexModel(80), datamodule=IndexDM(80, shuffle=False)
        )


# ---------------------------------------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    ("make", "error", "match"),
    [
        (lambda: RepeatFactorSampling(threshold=0.0), ValueError, r"`threshold` must be in \(0, 1\], got 0.0"),
        (lambda: RepeatFactorSampling(threshold=-0.1), ValueError, r"`threshold` must be in \(0, 1\]"),
        # a count taken for the fraction: every class repeated, epochs sqrt(10) times longer, nothing rebalanced
        (lambda: RepeatFactorSampling(threshold=10), ValueError, r"got 10\. .*not a count.*n / len\(dataset\)"),
        (lambda: RepeatFactorSampling(threshold=float("nan")), TypeError, "`threshold` must be a finite number"),
        (lambda: RepeatFactorSampling(labels=3), TypeError, "`labels` must be an array"),
        (lambda: CurriculumOrdering(start_fraction=0.0), ValueError, r"`start_fraction` must be in \(0, 1\]"),
        (lambda: CurriculumOrdering(start_fraction=1.2), ValueError, r"`start_fraction` must be in \(0, 1\]"),
        (lambda: CurriculumOrdering(start_fraction=-0.5), ValueError, r"`start_fraction` must be in \(0, 1\]"),
        (lambda: CurriculumOrdering("cosine"), ValueError, "`pacing` must be one of"),
        (lambda: CurriculumOrdering(full_at=0), ValueError, "`full_at` must be > 0"),
        (lambda: CurriculumOrdering(growth=0.9), ValueError, "`growth` must be > 1"),
        (lambda: CurriculumOrdering(step_length=0), ValueError, "`step_length` must be >= 1"),
        (lambda: CurriculumOrdering(step_length=2.0), TypeError, r"`step_length` must be an int >= 1, got 2\.0"),
        (lambda: CurriculumOrdering(difficulty="easy"), TypeError, "`difficulty` must be an array"),
        (lambda: CurriculumOrdering(task_order="abc"), TypeError, "`task_order` must be a sequence of task ids"),
        (lambda: CurriculumOrdering(task_order=[1, 0, 1]), ValueError, r"`task_order` must list each task once"),
        (lambda: CurriculumOrdering(anti_curriculum="no"), TypeError, "`anti_curriculum` must be True or False"),
    ],
)
def test_bad_arguments_fail_at_construction(make, error, match):
    with pytest.raises(error, match=match):
        make()


def test_task_order_may_be_a_generator():
    # taken once: the check of its items must not spend it
    assert CurriculumOrdering(task_order=(t for t in [2, 0, 1])).task_order == [2, 0, 1]
    with pytest.raises(ValueError, match=r"list each task once, got \[1, 1\]"):
        CurriculumOrdering(task_order=iter([1, 1]))


def nan_scorer(pl_module, batch):
    return torch.full((len(batch[0]),), float("nan"))


def short_scorer(pl_module, batch):
    return torch.zeros(1)


class NoLabels(SpeedupDataModule):
    def setup(self, stage):
        self.train_dataset = IndexedImages(16)


class OwnLoader(IndexDM):
    def train_dataloader(self):
        return DataLoader(self.train_dataset, batch_size=8, shuffle=True)


class DictOfLoaders(IndexDM):
    def train_dataloader(self):
        return {"main": super().train_dataloader()}  # Lightning combines them: no single loader to pace


difficulty_with_nan = np.arange(80.0)
difficulty_with_nan[7] = np.nan


@pytest.mark.parametrize(
    ("callbacks", "dm", "error", "match"),
    [
        (
            [RepeatFactorSampling(labels=np.zeros(79, int))],
            None,
            ValueError,
            "labels for 79 samples, but the training dataset has 80",
        ),
        ([RepeatFactorSampling(labels=lambda ds: [0] * 10)], None, ValueError, "labels for 10 samples"),
        ([RepeatFactorSampling(labels=[-1] * 80)], None, ValueError, "Class ids must be >= 0"),
        ([RepeatFactorSampling()], NoLabels(batch_size=8), ValueError, "needs class labels per training sample"),
        ([CurriculumOrdering(difficulty=difficulty_with_nan)], None, ValueError, "1 NaN or infinite value.*sample 7"),
        ([CurriculumOrdering(difficulty=np.arange(81.0))], None, ValueError, r"one value per training sample \(80\)"),
        ([CurriculumOrdering(difficulty=nan_scorer)], None, ValueError, "the scorer's difficulty has 80 NaN"),
        ([CurriculumOrdering(difficulty=short_scorer)], None, ValueError, "one score per sample"),
        ([CurriculumOrdering()], NoLabels(batch_size=8), ValueError, "needs a difficulty per training sample"),
        ([CurriculumOrdering(tasks=np.zeros(3))], None, ValueError, r"`tasks` must have one value per training sample"),
        ([CurriculumOrdering(task_order=[1, 0])], None, ValueError, r"`task_order=\[1, 0\]` needs a task id"),
        ([RepeatFactorSampling(), Provider()], None, ValueError, "Several callbacks supply the training sampler"),
        ([RepeatFactorSampling()], OwnLoader(), RuntimeError, "did not supply the training sampler"),
        ([CurriculumOrdering()], OwnLoader(), RuntimeError, "did not supply the training sampler"),
        ([RepeatFactorSampling()], DictOfLoaders(), RuntimeError, "needs a single training loader, and .* 1 in a dict"),
        ([CurriculumOrdering()], DictOfLoaders(), RuntimeError, "needs a single training loader"),
    ],
)
def test_bad_input_fails_before_the_first_step(callbacks, dm, error, match):
    model = IndexModel(80)
    with pytest.raises(error, match=match):
        trainer(max_epochs=1, callbacks=callbacks).fit(model, datamodule=dm or IndexDM(80))
    assert model.seen == []


@pytest.mark.parametrize("callback", [RepeatFactorSampling, CurriculumOrdering])
def test_overfit_batches_is_refused_with_its_cause(callback):
    model = IndexModel(80)
    with pytest.raises(RuntimeError, match=r"cannot run with `Trainer\(overfit_batches=2\)`"):
        trainer(overfit_batches=2, callbacks=[callback()]).fit(model, datamodule=IndexDM(80))
    assert model.seen == []


def test_needs_a_speedup_datamodule_and_a_run_length():
    model = IndexModel(80)
    dm = IndexDM(80)
    dm.setup("fit")
    loader = DataLoader(dm.train_dataset, batch_size=8)
    with pytest.raises(TypeError, match=r"through a `SpeedupDataModule`, but `trainer\.fit` got no datamodule"):
        trainer(callbacks=[RepeatFactorSampling()]).fit(model, train_dataloaders=loader)
    with pytest.raises(ValueError, match="has no `max_epochs` or `max_steps`"):
        trainer(max_epochs=-1, callbacks=[CurriculumOrdering("root")]).fit(model, datamodule=IndexDM(80))
    assert model.seen == []
    # a Trainer with neither runs Lightning's 1000 epochs: the pace spreads over them, which deserves a warning
    stop, stopped = LambdaCallback(on_train_batch_end=lambda t, *_: setattr(t, "should_stop", True)), IndexModel(80)
    with pytest.warns(SpeedupWarning, match=r"runs up to 1000 epochs \(Lightning's default"):
        trainer(max_epochs=None, callbacks=[CurriculumOrdering("root"), stop]).fit(stopped, datamodule=IndexDM(80))
    assert len(stopped.seen) == 1
    # fixed exponential pacing needs no run length
    trainer(max_epochs=-1, max_steps=3, callbacks=[CurriculumOrdering("fixed_exponential")]).fit(
        model, datamodule=IndexDM(80)
    )
    assert len(model.seen) == 3


class Stream(IterableDataset):
    def __iter__(self):
        return iter([(torch.zeros(1), torch.tensor(0))] * 8)


class StreamDM(IndexDM):
    def setup(self, stage):
        self.train_dataset = Stream()


@pytest.mark.parametrize(
    "make", [lambda: RepeatFactorSampling(labels=[[0]] * 8), lambda: CurriculumOrdering(difficulty=nan_scorer)]
)
def test_an_iterable_dataset_is_refused_with_the_reason(make):
    callback = make()
    with pytest.raises(TypeError, match=rf"{type(callback).__name__} orders samples by index .* map-style dataset"):
        trainer(max_epochs=1, callbacks=[callback]).fit(IndexModel(8), datamodule=StreamDM(8))


class SamplerOnPlainLoader(IndexDM):
    def train_dataloader(self):
        return DataLoader(self.train_dataset, batch_size=8, sampler=self.train_sampler(self.train_dataset))


def test_a_plain_loader_around_our_sampler_is_warned_about():
    """It samples right, but a mid-epoch resume would replay the epoch's first batches."""
    with pytest.warns(SpeedupWarning, match="keeps no state in checkpoints"):
        trainer(max_epochs=1, callbacks=[RepeatFactorSampling()]).fit(IndexModel(80), datamodule=SamplerOnPlainLoader())
    with warnings.catch_warnings():
        warnings.filterwarnings("error", "The training loader", SpeedupWarning)  # the datamodule's loader: none
        trainer(max_epochs=1, callbacks=[RepeatFactorSampling()]).fit(IndexModel(80), datamodule=IndexDM(80))


def test_scoring_leaves_the_global_random_generators_alone():
    """A run scored by the model draws (dropout, augmentation, worker seeds) what it would with given scores."""

    class State(Callback):
        def on_train_start(self, trainer, pl_module):
            self.state = torch.random.get_rng_state()

    states = []
    for difficulty in (np.arange(80.0), LossScore()):
        seed_everything(0)
        state = State()
        trainer(max_epochs=1, callbacks=[CurriculumOrdering(difficulty=difficulty), state]).fit(
            IndexModel(80), datamodule=IndexDM(80)
        )
        states.append(state.state)
    assert torch.equal(states[0], states[1])


def test_a_scorer_that_returns_no_scores_is_named():
    cur = CurriculumOrdering("fixed_exponential", difficulty=lambda module, batch: None, start_fraction=0.1)
    with pytest.raises(TypeError, match=r"the scorer returned NoneType; it must return one number per sample"):
        fit([cur], max_epochs=1)


def test_a_scorer_that_returns_complex_or_out_of_range_scores_is_told_so():
    # complex scores lost their imaginary part (all 0: a random order); finite float64 scores beyond float32's
    # range became inf and were called "NaN or infinite" although the scorer gave none
    def complex_scores(module, batch):
        return torch.full((len(batch[1]),), 1 + 2j)

    def huge(module, batch):
        return torch.full((len(batch[1]),), 1e300, dtype=torch.float64)

    with pytest.raises(TypeError, match=r"the scorer returned complex scores; they must be real numbers"):
        fit([CurriculumOrdering(difficulty=complex_scores)], max_epochs=1)
    with pytest.raises(ValueError, match=r"finite scores beyond float32's range.*rescale them"):
        fit([CurriculumOrdering(difficulty=huge)], max_epochs=1)


@pytest.mark.skipif(sys.version_info < (3, 11), reason="exception notes are Python 3.11+")
def test_a_scorer_of_the_users_that_fails_is_named_and_a_missing_field_error_left_as_it_is():
    def lookup(module, batch):
        return {}["score"]

    with pytest.raises(KeyError) as raised:
        fit([CurriculumOrdering(difficulty=lookup)], max_epochs=1)
    assert raised.value.__notes__ == [
        "CurriculumOrdering: raised by the scorer test_a_scorer_of_the_users_that_fails_is_named_and_a_missing_field_"
        "error_left_as_it_is.<locals>.lookup on a batch of the training set, a list of (Tensor (8, 1) float32, "
        "Tensor (8,) int64)."
    ]
    with pytest.raises(ValueError, match="no input at 'image'") as raised:  # already says what to fix
        fit([CurriculumOrdering(difficulty=LossScore(input_key="image", target_key=1))], max_epochs=1)
    assert not getattr(raised.value, "__notes__", None)


def test_a_scorer_that_fails_names_the_batch_and_where_loss_score_read_it():
    # the labels taken for the input: the model fails deep inside torch, the message says why
    cur = CurriculumOrdering(difficulty=LossScore(input_key=1, target_key=0))
    with pytest.raises(RuntimeError) as raised:  # torch's own error, its type kept (an OOM stays an OOM)
        fit([cur], max_epochs=1)
    assert type(raised.value) is RuntimeError
    notes = getattr(raised.value, "__notes__", None)
    if sys.version_info >= (3, 11):
        assert notes == [
            "CurriculumOrdering: raised by the scorer LossScore on a batch of the training set, a list of "
            "(Tensor (8, 1) float32, Tensor (8,) int64). LossScore read the input from 1 and the target from 0: if "
            "they are elsewhere, pass `input_key=` and `target_key=` to it."
        ]


class PoolRecorder(Callback):
    """The pool fraction of each training step, as the sampler paces it."""

    def __init__(self) -> None:
        self.fractions: dict[int, float] = {}

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        plan = trainer.train_dataloader.sampler.plan
        self.fractions[trainer.global_step] = plan.pool_fraction(plan.clock.step_of(batch_idx, trainer.current_epoch))


@pytest.mark.parametrize("reload", [0, 1])
def test_a_resume_with_more_epochs_paces_alike_from_an_epoch_end_or_mid_epoch(tmp_path, reload):
    """A loader of the same length keeps the clock it replaces, whose run length a resumed trainer works out anew:
    an epoch-end checkpoint paced the longer run from the shorter one's progress (0.625 at step 15, not 0.4375)."""

    def run(max_epochs, ckpt_path=None, save=False):
        seed_everything(0)
        recorder = PoolRecorder()
        saves = [
            ModelCheckpoint(dirpath=tmp_path / "e", save_top_k=-1, every_n_epochs=1, save_on_train_epoch_end=True),
            ModelCheckpoint(dirpath=tmp_path / "s", save_top_k=-1, every_n_train_steps=15),
        ]
        t = trainer(
            max_epochs=max_epochs,
            callbacks=[
                CurriculumOrdering("linear", start_fraction=0.1, full_at=1.0),
                recorder,
                *(saves if save else []),
            ],
            enable_checkpointing=save,
            reload_dataloaders_every_n_epochs=reload,
        )
        t.fit(IndexModel(), datamodule=IndexDM(), ckpt_path=ckpt_path)
        return recorder.fractions

    run(2, save=True)
    (epoch_end,), (mid_epoch,) = (tmp_path / "e").glob("*step=10.ckpt"), (tmp_path / "s").glob("*step=15.ckpt")
    fresh = run(4)
    for ckpt in (epoch_end, mid_epoch):
        resumed = run(4, ckpt_path=str(ckpt))
        assert {s: resumed[s] for s in (15, 20, 30)} == pytest.approx({s: fresh[s] for s in (15, 20, 30)})
    assert fresh[15] == pytest.approx(0.1 + 0.9 * 15 / 40)


def test_a_resume_by_the_same_callback_object_paces_as_a_fresh_one(tmp_path):
    """A second fit resumed from a checkpoint with the callback of the first took the first fit's final clock for
    the one its reload continued (another batch size each epoch: 8, 4, 2)."""

    class Shrinking(IndexDM):
        def train_dataloader(self):
            self.batch_size = {0: 8, 1: 4}.get(self.trainer.fit_loop.epoch_progress.current.processed, 2)
            return super().train_dataloader()

    def run(cur, ckpt_path=None, save=False):
        seed_everything(0)
        model = IndexModel()
        saves = [ModelCheckpoint(dirpath=tmp_path, save_top_k=-1, every_n_epochs=1, save_on_train_epoch_end=True)]
        t = trainer(
            max_epochs=3,
            callbacks=[cur, *(saves if save else [])],
            reload_dataloaders_every_n_epochs=1,
            enable_checkpointing=save,
        )
        t.fit(model, datamodule=Shrinking(), ckpt_path=ckpt_path)
        return model

    cur = CurriculumOrdering("linear", start_fraction=0.1, full_at=1.0)
    full = run(cur, save=True)
    (ckpt,) = tmp_path.glob("*step=10.ckpt")
    assert run(cur, ckpt_path=str(ckpt)).seen == full.seen[10:]
    assert cur._plan.clock.anchor_progress == pytest.approx(2 / 3)  # at epoch 2's reload, as uninterrupted


def test_a_resume_whose_first_loader_is_built_before_the_restore_keeps_the_checkpoints_pace(tmp_path):
    """The model reads `estimated_stepping_batches` in `configure_optimizers`, so a loader of the first training
    set is built before the checkpoint is restored: its clock (80 samples) was taken for the one the resumed epoch
    continues (160 after the reload), and epoch 2 paced at the full pool."""

    class Grows(IndexDM):
        def get_train_dataset(self):
            n = 160 if self.trainer is not None and self.trainer.current_epoch >= 1 else 80
            self.train_difficulty = np.arange(float(n))
            return TensorDataset(torch.arange(n, dtype=torch.float32)[:, None], torch.zeros(n, dtype=torch.long))

    def run(ckpt_path=None, save=False):
        seed_everything(0)
        model = EstimatingModel(80, estimates=True)
        saves = [ModelCheckpoint(dirpath=tmp_path, save_top_k=-1, every_n_epochs=1, save_on_train_epoch_end=True)]
        t = trainer(
            max_epochs=3,
            callbacks=[CurriculumOrdering("linear", start_fraction=0.1, full_at=1.0), *(saves if save else [])],
            reload_dataloaders_every_n_epochs=1,
            enable_checkpointing=save,
        )
        t.fit(model, datamodule=Grows(80), ckpt_path=ckpt_path)
        return model

    full = run(save=True)
    (ckpt,) = tmp_path.glob("*step=30.ckpt")
    resumed = run(ckpt_path=str(ckpt))
    assert resumed.seen == full.seen[30:]
