"""SpeedupCallback: progress, knob logging, warnings, state and state keys."""

import warnings

import pytest
import torch
from lightning.pytorch import LightningDataModule, seed_everything
from lightning.pytorch.callbacks import GradientAccumulationScheduler, ModelCheckpoint, StochasticWeightAveraging
from torch import nn

from lightning_speedups import (
    LabelSmoothing,
    LinearScalingWarmup,
    MixUp,
    ProgressiveResizing,
    RepeatFactorSampling,
    ScheduledResize,
    SpeedupCallback,
    SpeedupWarning,
    training_progress,
)
from tests.helpers import MemoryLogger, RecordingModule, image_tensors, loaders, trainer
from tests.test_warmup import BothEveryBatch  # two optimizers, each stepping at every batch


class ProgressProbe(SpeedupCallback):
    log_name = "probe"

    def __init__(self):
        super().__init__()
        self.seen: list[tuple[int, float]] = []
        self.calls = 0

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.seen.append((trainer.global_step, self.progress(trainer)))
        self.calls += 1

    def knobs(self):
        return {"calls": self.calls}

    def state_dict(self):
        return {**super().state_dict(), "calls": self.calls}

    def load_state_dict(self, state):
        super().load_state_dict(state)
        self.calls = state["calls"]


@pytest.mark.parametrize(
    ("trainer_kwargs", "total"),
    [
        ({"max_epochs": 2}, 8),  # 64 samples / 16 = 4 batches per epoch
        ({"max_steps": 6, "max_epochs": -1}, 6),
        ({"max_epochs": 3, "accumulate_grad_batches": 2}, 6),
        ({"max_epochs": 2, "limit_train_batches": 2}, 4),
    ],
)
def test_progress_is_the_fraction_of_optimizer_steps(trainer_kwargs, total):
    probe = ProgressProbe()
    trainer(callbacks=[probe], **trainer_kwargs).fit(RecordingModule(record=False), loaders()[0])
    assert probe.seen, "no batch was seen"
    for step, progress in probe.seen:
        assert progress == pytest.approx(step / total)
    assert probe.seen[0][1] == 0.0
    assert probe.seen[-1][1] == pytest.approx((total - 1) / total)


def test_progress_continues_after_resume(tmp_path):
    ckpt = ModelCheckpoint(dirpath=tmp_path, every_n_train_steps=3, save_top_k=-1)
    first = ProgressProbe()
    trainer(callbacks=[first, ckpt], max_epochs=2, enable_checkpointing=True).fit(
        RecordingModule(record=False), loaders()[0]
    )
    resumed = ProgressProbe()
    trainer(callbacks=[resumed], max_epochs=2).fit(
        RecordingModule(record=False), loaders()[0], ckpt_path=str(tmp_path / "epoch=0-step=3.ckpt")
    )
    assert resumed.calls == 3 + len(resumed.seen)  # the state came back from the checkpoint
    assert resumed.seen == first.seen[3:]


def test_progress_needs_a_finite_run():
    class T:
        global_step = 3

    with pytest.raises(RuntimeError, match="max_steps"):
        training_progress(T(), float("inf"))
    assert training_progress(T(), 12) == 0.25


class Stream(torch.utils.data.IterableDataset):
    def __iter__(self):
        x, y = image_tensors(32)
        return iter(zip(x, y, strict=True))


def test_an_iterable_dataset_without_max_steps_has_no_progress_rather_than_full_progress():
    # Lightning's estimated_stepping_batches is -1 here; read as a length, every step would be past the end
    probe = ProgressProbe()
    with pytest.raises(RuntimeError, match="ProgressProbe follows training progress, which needs a finite run length"):
        trainer(callbacks=[probe], max_epochs=1).fit(
            RecordingModule(record=False), torch.utils.data.DataLoader(Stream(), batch_size=8)
        )
    probe = ProgressProbe()
    trainer(callbacks=[probe], max_steps=4).fit(
        RecordingModule(record=False), torch.utils.data.DataLoader(Stream(), batch_size=8)
    )
    assert [p for _, p in probe.seen] == [0, 0.25, 0.5, 0.75]


def test_a_max_time_run_is_refused_before_its_first_step_by_the_callback_that_needs_a_length():
    model = RecordingModule()
    with pytest.raises(RuntimeError, match=r"MixUp follows training progress.*`max_time` alone"):
        trainer(callbacks=[MixUp(end=0.5)], max_epochs=None, max_steps=-1, max_time={"minutes": 5}).fit(
            model, *loaders()
        )
    assert not model.train_batches


def test_progress_counts_each_epochs_accumulation_under_a_scheduler():
    # 4 batches per epoch, accumulation 1 then 2 then 4: 4 + 2 + 1 = 7 steps (Lightning would say 3 x 4 = 12)
    probe = ProgressProbe()
    t = trainer(callbacks=[probe, GradientAccumulationScheduler({0: 1, 1: 2, 2: 4})], max_epochs=3)
    t.fit(RecordingModule(record=False), loaders()[0])
    assert t.global_step == 7
    assert [p for _, p in probe.seen] == pytest.approx([s / 7 for s, _ in probe.seen])


@pytest.mark.parametrize(
    "kwargs",
    [{"max_epochs": 2}, {"max_steps": 12, "max_epochs": -1}, {"max_epochs": 2, "reload_dataloaders_every_n_epochs": 1}],
)
def test_progress_under_manual_optimization_with_two_optimizers(kwargs):
    probe = ProgressProbe()
    t = trainer(callbacks=[probe], **kwargs)
    t.fit(BothEveryBatch(), loaders()[0])
    batches = len(probe.seen)
    assert t.global_step == 2 * batches  # Lightning counts both optimizers' steps
    assert [p for _, p in probe.seen] == pytest.approx([b / batches for b in range(batches)])


@pytest.mark.parametrize("manual", [False, True], ids=["automatic", "manual"])
def test_a_second_fit_with_another_loader_length_counts_the_steps_taken_then_the_new_length(manual):
    # 4 batches in the first fit, then max_epochs raised to 3 with 8 batches per epoch: 4 + 2 x 8 = 20 batches
    probe = ProgressProbe()
    t = trainer(callbacks=[probe], max_epochs=1)
    module = BothEveryBatch() if manual else RecordingModule(record=False)
    t.fit(module, loaders(n=64)[0])
    probe.seen.clear()
    t.fit_loop.max_epochs = 3
    t.fit(module, loaders(n=128)[0])
    steps_per_batch = 2 if manual else 1
    assert t.global_step == 20 * steps_per_batch
    # taken as 3 x 8 = 24 batches, the run ended at 19/24 with its windows and ramps short of their end
    assert [p for _, p in probe.seen] == pytest.approx([step / steps_per_batch / 20 for step, _ in probe.seen])
    assert probe.seen[-1][1] == pytest.approx(19 / 20)


def test_a_second_fit_bounded_by_max_steps_alone_under_manual_optimization_has_a_length():
    # two optimizers, 4 batches per epoch, no max_epochs: max_steps alone bounds each fit
    probe = ProgressProbe()
    t = trainer(callbacks=[probe], max_steps=8, max_epochs=-1)
    module = BothEveryBatch()
    t.fit(module, loaders(n=64)[0])
    probe.seen.clear()
    t.fit_loop.epoch_loop.max_steps = 16
    t.fit(module, loaders(n=64)[0])  # refused as a run of no length once
    assert t.global_step == 16
    assert [p for _, p in probe.seen] == pytest.approx([step / 16 for step, _ in probe.seen])


def growing(module_cls, from_epoch=1):
    """``module_cls`` whose training loader (reloaded every epoch) has 4 batches before ``from_epoch``, 8 after."""

    class Growing(module_cls):
        def train_dataloader(self):
            epoch = self.trainer.fit_loop.epoch_progress.current.processed  # the epoch starting, resumed ones too
            return loaders(n=64 if epoch < from_epoch else 128)[0]

    return Growing


def test_a_manual_optimization_run_resumed_at_an_epochs_end_before_a_reload_continues_the_same_progress(tmp_path):
    # 4, 4, 8, 8 batches; resumed from the end of epoch 1: the progress reached at the reload is read under the
    # checkpoint's bound, as the uninterrupted run read it (it was read under this fit's, 1/3 where 1/2 was due)
    def run(ckpt=None):
        probe = ProgressProbe()
        saver = ModelCheckpoint(dirpath=tmp_path, every_n_epochs=1, save_top_k=-1, save_on_train_epoch_end=True)
        extra = [] if ckpt else [saver]
        trainer(
            callbacks=[probe, *extra], max_epochs=4, reload_dataloaders_every_n_epochs=1, enable_checkpointing=not ckpt
        ).fit(growing(BothEveryBatch, from_epoch=2)(), ckpt_path=ckpt)
        return probe.seen

    full = run()
    resumed = run(str(tmp_path / "epoch=1-step=16.ckpt"))
    assert [step for step, _ in resumed] == [step for step, _ in full[8:]]
    assert [p for _, p in resumed] == pytest.approx([p for _, p in full[8:]]) and resumed[0][1] == 0.5


class StepsEverySecondBatch(RecordingModule):
    """Manual optimization with one optimizer that accumulates two batches per step: half a global step a batch."""

    def __init__(self) -> None:
        super().__init__(record=False)
        self.automatic_optimization = False

    def training_step(self, batch, batch_idx):
        x, y = batch
        self.manual_backward(torch.nn.functional.cross_entropy(self(x), y) / 2)
        if batch_idx % 2 == 1:
            self.optimizers().step()
            self.optimizers().zero_grad()


@pytest.mark.parametrize(
    ("module", "max_steps"), [(BothEveryBatch, 24), (StepsEverySecondBatch, 10)], ids=["two-a-batch", "every-second"]
)
def test_a_reload_under_manual_optimization_bounded_by_max_steps_alone_follows_its_share(module, max_steps):
    # 4 then 8 batches per epoch: refused as a run of no length; then, stepping every second batch, at 1.0 from step
    # 5 of 10 (batches counted as steps)
    probe = ProgressProbe()
    t = trainer(callbacks=[probe], max_steps=max_steps, max_epochs=-1, reload_dataloaders_every_n_epochs=1)
    t.fit(growing(module)())
    assert t.global_step == max_steps
    assert [p for _, p in probe.seen] == pytest.approx([step / max_steps for step, _ in probe.seen])


def test_a_reload_under_manual_optimization_reads_the_progress_reached_under_the_old_bound():
    # the max_epochs bound: the progress reached at the reload was read under the new loader's bound (0.5 -> 0.25)
    probe = ProgressProbe()
    trainer(callbacks=[probe], max_epochs=4, reload_dataloaders_every_n_epochs=1).fit(
        growing(BothEveryBatch, from_epoch=2)()
    )
    seen = [p for _, p in probe.seen]
    assert seen == sorted(seen) and seen[8] == pytest.approx(0.5) and seen[-1] > 0.95


def test_progress_under_manual_optimization_that_steps_every_second_batch():
    probe = ProgressProbe()
    t = trainer(callbacks=[probe], max_epochs=2)
    t.fit(StepsEverySecondBatch(), loaders()[0])
    batches = len(probe.seen)
    assert batches == 8 and t.global_step == 4  # 4 batches per epoch, a step every second one
    # the whole run, not half of it: global steps per batch would read 0, 0, 1/8, 1/8, ... and end at 1/2
    assert [p for _, p in probe.seen] == pytest.approx([b / batches for b in range(batches)])
    probe = ProgressProbe()  # bounded by max_steps, which counts optimizer steps: their share
    trainer(callbacks=[probe], max_steps=4, max_epochs=-1).fit(StepsEverySecondBatch(), loaders()[0])
    assert [p for _, p in probe.seen] == pytest.approx([step / 4 for step, _ in probe.seen]) and len(probe.seen) == 8


class GrowingLoader(RecordingModule):
    """4 batches in epoch 0, then 8: the loader reloads with another length."""

    def train_dataloader(self):
        n = 64 if self.trainer.current_epoch == 0 else 128
        return loaders(n=n)[0]


def test_progress_after_a_reload_keeps_the_steps_taken_and_counts_the_rest_at_the_new_length():
    probe = ProgressProbe()
    t = trainer(callbacks=[probe], max_epochs=3, reload_dataloaders_every_n_epochs=1)
    t.fit(GrowingLoader(record=False))
    assert t.global_step == 4 + 8 + 8
    progress = [p for _, p in probe.seen]
    assert progress[:4] == pytest.approx([s / 12 for s in range(4)])  # 4 + 4 + 4 planned in epoch 0
    # at the reload, 4 of 12 planned steps were done: the progress reached (1/3) stands, and the 16 steps left
    # spread the remaining 2/3, so it never goes back and ends where an uninterrupted schedule would
    assert progress[4:] == pytest.approx([1 / 3 + (2 / 3) * (s - 4) / 16 for s in range(4, 20)])
    assert progress == sorted(progress)


def test_knobs_go_to_every_logger_at_the_logging_cadence():
    loggers = [MemoryLogger(), MemoryLogger()]
    probe = ProgressProbe()
    trainer(callbacks=[probe], max_epochs=2, logger=loggers, log_every_n_steps=3).fit(
        RecordingModule(record=False), loaders()[0]
    )
    for logger in loggers:
        history = logger.history["probe/calls"]
        # 8 steps, logged every 3rd: after steps 3 and 6
        assert [step for step, _ in history] == [2, 5]
        assert [value for _, value in history] == [3.0, 6.0]


@pytest.mark.parametrize("accumulate", [1, 2])
def test_knobs_are_logged_exactly_when_lightning_logs_self_log(accumulate):
    """Our cadence check is Lightning's `should_update_logs` rule written out; both must log the same steps."""

    class LogsEveryStep(RecordingModule):
        def training_step(self, batch, batch_idx):
            loss = super().training_step(batch, batch_idx)
            self.log("train_probe", float(batch_idx))
            return loss

    logger = MemoryLogger()
    trainer(
        callbacks=[ProgressProbe()],
        max_epochs=3,
        logger=logger,
        log_every_n_steps=2,
        accumulate_grad_batches=accumulate,
    ).fit(LogsEveryStep(record=False), loaders()[0])
    ours = [step for step, _ in logger.history["probe/calls"]]
    assert ours and ours == [step for step, _ in logger.history["train_probe"]]


def test_warn_is_a_speedup_warning_from_rank_zero(monkeypatch):
    from lightning.pytorch.utilities import rank_zero

    probe = ProgressProbe()
    with pytest.warns(SpeedupWarning, match="ProgressProbe: look") as record:
        probe.warn("look")
    assert record[0].filename == __file__  # where `warn` was called, not inside the base class
    monkeypatch.setattr(rank_zero.rank_zero_only, "rank", 1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        probe.warn("quiet")
    assert not caught


def test_two_instances_with_different_windows_have_distinct_state_keys():
    early, late = MixUp(end=0.5), MixUp(start=0.5)
    assert early.state_key != late.state_key
    trainer(callbacks=[early, late], max_steps=2).fit(RecordingModule(record=False), loaders()[0])


def test_two_instances_of_one_class_draw_apart_and_log_apart():
    def run(callbacks):
        logger = MemoryLogger()
        trainer(callbacks=callbacks, max_epochs=2, logger=logger, log_every_n_steps=1).fit(
            RecordingModule(record=False), loaders()[0]
        )
        return {k: [v for _, v in pts] for k, pts in logger.history.items()}

    seed_everything(0)
    alone = run([MixUp(p=0.5)])
    seed_everything(0)
    pair = run([MixUp(p=0.5), MixUp(p=0.5, end=0.99)])
    assert pair["mixup/lam"] == alone["mixup/lam"]  # the first draws what it draws alone
    assert len(pair["mixup_2/lam"]) == len(pair["mixup/lam"]) == 8  # the second logs under its own name
    assert pair["mixup_2/applied"] != pair["mixup/applied"] and pair["mixup_2/lam"] != pair["mixup/lam"]


def test_the_state_key_is_worked_out_once_per_fit():
    """Lightning reads `state_key` at every hook call it dispatches; ours is computed at setup, then reused."""

    class Counting(MixUp):
        calls = 0

        def state_key_fields(self):
            Counting.calls += 1
            return super().state_key_fields()

    cb = Counting(end=0.5)
    key = cb.state_key
    Counting.calls = 0
    trainer(callbacks=[cb], max_epochs=2).fit(RecordingModule(record=False), loaders()[0])  # 8 steps
    assert Counting.calls <= 6  # the hooks dispatched before setup: not once per hook call (over 60 here)
    assert cb.state_key == key
    cb.end = 0.25  # outside a fit the key follows the settings
    assert cb.state_key != key


def test_seed_is_resolved_at_fit_and_survives_state_dict():
    torch.manual_seed(1234)
    cb = MixUp(num_classes=4)
    trainer(callbacks=[cb], max_steps=1).fit(RecordingModule(record=False), loaders()[0])
    assert cb.seed == 1234
    other = MixUp()
    other.load_state_dict(cb.state_dict())
    assert other.seed == 1234


@pytest.mark.parametrize(
    "make, name",
    [
        (lambda v: MixUp(log_knobs=v), "log_knobs"),
        (lambda v: LabelSmoothing(check_loss=v), "check_loss"),
        (lambda v: ProgressiveResizing(antialias=v), "antialias"),
        (lambda v: ProgressiveResizing(resize_targets=v), "resize_targets"),
        (lambda v: RepeatFactorSampling(sqrt=v), "sqrt"),
        (lambda v: ScheduledResize(antialias=v), "antialias"),
    ],
)
def test_a_flag_given_as_a_string_is_refused_not_read_as_true(make, name):
    # bool("false") is True: `antialias: "false"` from a config silently kept antialiasing
    with pytest.raises(TypeError, match=rf"`{name}` must be True or False, got 'false'"):
        make("false")
    assert getattr(make(False), name) is False


@pytest.mark.parametrize("seed", [-1, 1.5, "a"])
def test_bad_seed(seed):
    with pytest.raises((ValueError, TypeError), match="seed"):
        MixUp(seed=seed)


class LoaderOfLengths(RecordingModule):
    """Epoch e's loader has ``batches[e]`` batches of 16 (the last for later epochs)."""

    def __init__(self, batches: tuple[int, ...], by_processed: bool = False) -> None:
        super().__init__(record=False)
        self.batches, self.by_processed = batches, by_processed

    def train_dataloader(self):
        # the epoch Lightning gives the sampler (`processed`) is the next one already when it saved at an epoch's end
        progress = self.trainer.fit_loop.epoch_progress.current
        epoch = progress.processed if self.by_processed else self.trainer.current_epoch
        return loaders(n=16 * self.batches[min(epoch, len(self.batches) - 1)])[0]


@pytest.mark.parametrize(
    ("batches", "step"),
    [
        ((4, 8), 6),  # mid-epoch 1
        ((4, 8), 12),  # the last batch of epoch 1
        # the last batch of an epoch before a shorter one: Lightning resumes with the finished epoch's loader and
        # reloads the next without its `on_train_epoch_start`; the rest of the run was spread at the old length
        ((8, 8, 4), 16),
        ((8, 4), 8),  # the same at epoch 0, whose checkpoint holds no anchor (no progress before the reload)
        # saved at epoch 0's end by a loader sized by the sampler's epoch: the resumed run's first loader is epoch
        # 1's, so the run's length must come from the checkpoint though no reload had moved its anchor yet
        ((4, 8), "epoch end"),
    ],
)
def test_progress_after_a_reload_resumes_where_the_uninterrupted_run_was(tmp_path, batches, step):
    at_epoch_end = step == "epoch end"
    if at_epoch_end:
        ckpt = ModelCheckpoint(dirpath=tmp_path, every_n_epochs=1, save_on_train_epoch_end=True, save_top_k=-1)
    else:
        ckpt = ModelCheckpoint(dirpath=tmp_path, every_n_train_steps=step, save_top_k=-1)
    first = ProgressProbe()
    epochs = len(batches) + 1
    trainer(
        callbacks=[first, ckpt], max_epochs=epochs, reload_dataloaders_every_n_epochs=1, enable_checkpointing=True
    ).fit(LoaderOfLengths(batches, by_processed=at_epoch_end))
    resumed = ProgressProbe()
    step = batches[0] if at_epoch_end else step
    path = next(tmp_path.glob(f"epoch=0-step={step}.ckpt" if at_epoch_end else f"*step={step}.ckpt"))
    trainer(callbacks=[resumed], max_epochs=epochs, reload_dataloaders_every_n_epochs=1).fit(
        LoaderOfLengths(batches, by_processed=at_epoch_end), ckpt_path=str(path)
    )
    assert [s for s, _ in resumed.seen] == [s for s, _ in first.seen[step:]]
    assert [p for _, p in resumed.seen] == pytest.approx([p for _, p in first.seen[step:]])


def test_a_reload_run_resumed_with_more_epochs_spreads_progress_over_the_new_length(tmp_path):
    # the checkpoint kept the run's length, worked out for 2 epochs: a resume asking for 4 ran at twice the pace
    ckpt = ModelCheckpoint(dirpath=tmp_path, every_n_train_steps=2, save_top_k=-1)
    short = trainer(
        callbacks=[ProgressProbe(), ckpt], max_epochs=2, reload_dataloaders_every_n_epochs=1, enable_checkpointing=True
    )
    short.fit(LoaderOfLengths((4,)))
    longer, resumed = ProgressProbe(), ProgressProbe()
    trainer(callbacks=[longer], max_epochs=4, reload_dataloaders_every_n_epochs=1).fit(LoaderOfLengths((4,)))
    trainer(callbacks=[resumed], max_epochs=4, reload_dataloaders_every_n_epochs=1).fit(
        LoaderOfLengths((4,)), ckpt_path=str(tmp_path / "epoch=0-step=2.ckpt")
    )
    assert [s for s, _ in resumed.seen] == [s for s, _ in longer.seen[2:]]
    assert [p for _, p in resumed.seen] == pytest.approx([p for _, p in longer.seen[2:]])


def test_a_reload_run_resumed_from_its_end_with_more_epochs_continues_like_one_that_does_not_reload(tmp_path):
    # every epoch's reload re-anchored the schedule at the progress reached under the old length, so "train
    # longer" from the last checkpoint ran at another pace than the same resume without reloads
    for reloads in (0, 1):
        ckpt = ModelCheckpoint(dirpath=tmp_path / str(reloads), save_top_k=-1, every_n_epochs=1)
        trainer(
            callbacks=[ProgressProbe(), ckpt],
            max_epochs=2,
            reload_dataloaders_every_n_epochs=reloads,
            enable_checkpointing=True,
        ).fit(LoaderOfLengths((4,)))
        longer, resumed = ProgressProbe(), ProgressProbe()
        trainer(callbacks=[longer], max_epochs=4).fit(LoaderOfLengths((4,)))
        trainer(callbacks=[resumed], max_epochs=4, reload_dataloaders_every_n_epochs=reloads).fit(
            LoaderOfLengths((4,)), ckpt_path=str(tmp_path / str(reloads) / "epoch=1-step=8.ckpt")
        )
        assert [p for _, p in resumed.seen] == pytest.approx([p for _, p in longer.seen[8:]]), reloads


def test_a_reload_run_resumed_twice_continues_the_uninterrupted_schedule(tmp_path):
    # the first resume saved its anchor beside a length worked out from epoch 0: the second resume ran to the end
    # of the schedule two steps early
    def run(folder, ckpt_path=None):
        probe = ProgressProbe()
        saving = ModelCheckpoint(dirpath=tmp_path / folder, every_n_train_steps=1, save_top_k=-1)
        trainer(
            callbacks=[probe, saving], max_epochs=3, reload_dataloaders_every_n_epochs=1, enable_checkpointing=True
        ).fit(LoaderOfLengths((8, 4)), ckpt_path=ckpt_path)
        return dict(probe.seen)

    full = run("full")
    once = run("once", str(tmp_path / "full" / "epoch=2-step=13.ckpt"))
    twice = run("twice", str(tmp_path / "once" / "epoch=2-step=14.ckpt"))
    assert sorted(once) == [13, 14, 15] and sorted(twice) == [14, 15]
    for resumed in (once, twice):
        assert [resumed[s] for s in sorted(resumed)] == pytest.approx([full[s] for s in sorted(resumed)])


def test_progress_read_after_the_last_epoch_leaves_the_schedule_as_it_is(monkeypatch):
    # a read after fit (Lightning's epoch then past the last) re-anchored at the end: a later resume was stuck at 1
    import lightning.pytorch.loops.fit_loop as fit_loop

    said = []
    monkeypatch.setattr(fit_loop, "rank_zero_info", said.append)

    class ReadsAtTheEnd(ProgressProbe):
        def on_train_end(self, trainer, pl_module):
            self.schedule = (self._total_steps, self._anchor)
            self.at_end = [self.progress(trainer) for _ in range(3)][-1]

    probe = ReadsAtTheEnd()
    t = trainer(callbacks=[probe], max_epochs=2, reload_dataloaders_every_n_epochs=1)
    t.fit(LoaderOfLengths((4, 6)))
    assert len([m for m in said if "stopped" in m]) == 1  # reads ask nothing of Lightning's loop that logs
    assert probe.at_end == 1.0 and (probe._total_steps, probe._anchor) == probe.schedule
    assert probe.progress(t) == 1.0 and (probe._total_steps, probe._anchor) == probe.schedule  # after fit too


def test_a_reload_run_of_unbounded_length_trains_with_a_callback_that_does_not_follow_progress():
    # every reload worked out the progress reached, which has no meaning without a run length, and raised
    class Stream(torch.utils.data.IterableDataset):
        def __iter__(self):
            data = loaders(n=8)[0].dataset
            return iter([data[i] for i in range(8)])

    class StreamModule(RecordingModule):
        def train_dataloader(self):
            return torch.utils.data.DataLoader(Stream(), batch_size=4)

    callback = SpeedupCallback()
    t = trainer(callbacks=[callback], max_epochs=2, reload_dataloaders_every_n_epochs=1)
    t.fit(StreamModule(record=False))
    assert t.global_step == 4 and "progress" not in callback.state_dict()  # no finite length to keep


def test_progress_read_while_another_trainer_only_validates_builds_no_training_loader():
    # a callback that trained with reloads, reused by an evaluation script's trainer: reading progress in a
    # validation hook re-anchored, building that trainer's training loader (which its datamodule lacks)
    class ReadsInValidation(ProgressProbe):
        def on_validation_start(self, trainer, pl_module):
            self.seen.append((trainer.global_step, self.progress(trainer)))

    class ValidationOnly(LightningDataModule):
        def val_dataloader(self):
            return loaders(n=16)[1]

    probe = ReadsInValidation()
    trainer(callbacks=[probe], max_epochs=2, reload_dataloaders_every_n_epochs=1, limit_val_batches=0).fit(
        LoaderOfLengths((4, 6))
    )
    probe.seen.clear()
    schedule = (probe._total_steps, probe._anchor)
    trainer(callbacks=[probe], reload_dataloaders_every_n_epochs=1).validate(
        LoaderOfLengths((4, 6)), datamodule=ValidationOnly(), verbose=False
    )
    assert len(probe.seen) == 1 and (probe._total_steps, probe._anchor) == schedule  # read, not re-anchored


def test_numpy_integers_from_a_config_are_accepted():
    import numpy as np

    from lightning_speedups import LinearScalingWarmup, ProgressiveResizing

    mix = MixUp(num_classes=np.int64(4), seed=np.int64(3))
    assert mix.seed == 3 and type(mix.seed) is int
    assert LinearScalingWarmup(np.int64(8)).reference_batch_size == 8
    assert ProgressiveResizing(size_increment=np.int32(4)).size_increment == 4
    with pytest.raises(TypeError, match="`seed` must be an int"):
        MixUp(seed=True)


def test_a_warning_about_a_ranks_own_data_comes_from_that_rank(monkeypatch):
    from lightning.pytorch.utilities import rank_zero_only

    monkeypatch.setattr(rank_zero_only, "rank", 1)  # as in DDP rank 1's process
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.distributed, "get_world_size", lambda: 2)
    monkeypatch.setattr(torch.distributed, "get_rank", lambda: 1)
    cb = SpeedupCallback()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cb.warn("a setting")  # the same on every rank: rank zero says it
        cb.warn("this rank's first batch", every_rank=True)
    assert [str(w.message) for w in caught] == ["SpeedupCallback: this rank's first batch (rank 1)"]
    assert caught[0].category is SpeedupWarning


def test_a_knob_that_is_not_a_number_is_named_in_the_error():
    class Named(SpeedupCallback):
        def knobs(self):
            return {"fine": 1.0, "schedule": "cosine"}

    with pytest.raises(TypeError, match=r"Named\.knobs\(\) gave 'schedule' = 'cosine'.*knobs must be numbers"):
        trainer(callbacks=[Named()], max_steps=1, logger=MemoryLogger(), log_every_n_steps=1).fit(
            RecordingModule(), loaders("list")[0]
        )


def test_a_knob_that_is_not_a_number_fails_at_the_first_step_not_the_first_logging_step():
    class Named(SpeedupCallback):
        def knobs(self):
            return {"schedule": "cosine"}

    t = trainer(callbacks=[Named()], max_steps=4, logger=MemoryLogger(), log_every_n_steps=50)
    with pytest.raises(TypeError, match=r"Named\.knobs\(\) gave 'schedule' = 'cosine'"):
        t.fit(RecordingModule(), loaders("list")[0])
    assert t.global_step == 1
    # with logging off (`log_every_n_steps=0`) no knob is ever read, nor refused
    trainer(callbacks=[Named()], max_steps=2, logger=MemoryLogger(), log_every_n_steps=0).fit(
        RecordingModule(), loaders("list")[0]
    )


def test_an_override_of_on_train_batch_end_without_super_is_told_its_knobs_went_unlogged():
    class Schedule(SpeedupCallback):
        def __init__(self, call_super):
            super().__init__()
            self.call_super = call_super

        def knobs(self):
            return {"weight_decay": 0.1}

        def state_key_fields(self):
            return {"call_super": self.call_super}

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            if self.call_super:
                super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)

    for every in (1, 50):  # a logging step first, or not
        logger = MemoryLogger()
        with pytest.warns(SpeedupWarning, match=r"Schedule: logged none of its knobs \(weight_decay\).*skip `super"):
            trainer(callbacks=[Schedule(False)], max_steps=2, logger=logger, log_every_n_steps=every).fit(
                RecordingModule(), loaders("list")[0]
            )
        assert not logger.history
        with warnings.catch_warnings():
            warnings.filterwarnings("error", message=".*logged none", category=SpeedupWarning)
            trainer(callbacks=[Schedule(True)], max_steps=2, logger=MemoryLogger(), log_every_n_steps=every).fit(
                RecordingModule(), loaders("list")[0]
            )


def test_a_resumed_run_with_nothing_left_to_train_is_not_told_its_knobs_went_unlogged(tmp_path):
    # a checkpoint at the last batch, mid-epoch (not "done" for Lightning): the resumed fit trains no batch
    from lightning.pytorch.callbacks import ModelCheckpoint

    from lightning_speedups import MixUp

    every = ModelCheckpoint(dirpath=tmp_path, every_n_train_steps=2, save_top_k=-1)
    trainer(callbacks=[MixUp(), every], max_steps=4, enable_checkpointing=True).fit(
        RecordingModule(), loaders("list")[0]
    )
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*logged none", category=SpeedupWarning)
        t = trainer(callbacks=[MixUp()], max_epochs=1, logger=MemoryLogger(), log_every_n_steps=1)
        t.fit(RecordingModule(), loaders("list")[0], ckpt_path=str(next(tmp_path.glob("*step=4.ckpt"))))
    assert t.global_step == 4


class BatchNormModule(RecordingModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Conv2d(1, 4, 3, padding=1),
            nn.BatchNorm2d(4),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
            nn.Linear(4, 4),
        )


def test_the_batchnorm_epoch_of_stochastic_weight_averaging_is_not_training():
    """SWA adds an epoch to a model with BatchNorm (forward passes only, re-estimating the statistics): the
    schedules end with the epochs the user asked for, and that epoch's batches come as they are."""
    resizing = ProgressiveResizing(initial_scale=0.5, delay_fraction=0.5, finetune_fraction=0.2, size_increment=2)
    warmup = LinearScalingWarmup(reference_batch_size=8, warmup=1.0, warmup_unit="fraction")
    mixup = MixUp(alpha=0.2)
    swa = StochasticWeightAveraging(swa_lrs=0.05, swa_epoch_start=2)
    seen = []

    class Record(SpeedupCallback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            seen.append((trainer.fit_loop._skip_backward, self.progress(trainer), batch[0].shape[-1], batch[1].dtype))

    module = BatchNormModule()
    trainer(max_epochs=3, callbacks=[resizing, warmup, mixup, Record(), swa]).fit(module, *loaders())
    training = [s for s in seen if not s[0]]
    swa_epoch = [s for s in seen if s[0]]
    assert len(training) == 12 and len(swa_epoch) == 4
    assert training[-1][1] == 1.0 and training[-1][2] == 8  # the run's end: full size (it was 0.75 and 6 px)
    assert training[-3][1] < 1.0  # the progress of the user's 12 steps, not of 16
    assert all(s[2] == 8 and s[3] == torch.int64 for s in swa_epoch)  # neither resized nor mixed
    assert warmup.updates == [12]  # the BatchNorm epoch's update is not a warmup step
    assert warmup.knobs()["factor"] == pytest.approx(2.0 * 11 / 12 + 1.0 / 12)  # the last ramp step, from 1 to 2


def test_manual_progress_reads_the_cached_run_length(monkeypatch):
    """Progress is read several times per batch: under manual optimization its max_epochs bound (a loop over the
    epochs) is worked out once per fit, not at every read."""
    import lightning_speedups.base as base

    calls = []
    original = base.run_length
    monkeypatch.setattr(base, "run_length", lambda *a, **k: (calls.append(k), original(*a, **k))[1])
    probe = ProgressProbe()
    trainer(callbacks=[probe], max_epochs=4).fit(StepsEverySecondBatch(), loaders()[0])
    assert len(probe.seen) == 16 and probe.seen[-1][1] == pytest.approx(15 / 16)
    assert len(calls) <= 4  # not one per read (16 here)


def test_draws_in_every_hook_of_a_batch_are_that_batchs():
    # the stream was keyed on `started`, one ahead after `on_train_batch_start`: a draw in a later hook was the
    # draw the next batch's transform would make
    class Noise(SpeedupCallback):
        def __init__(self):
            super().__init__(seed=3)
            self.draws: dict[str, list[float]] = {"transform": [], "optimizer": [], "end": []}

        def transform_batch(self, trainer, pl_module, batch):
            self.draws["transform"].append(self.batch_random(trainer).random())
            return batch

        def on_before_optimizer_step(self, trainer, pl_module, optimizer):
            self.draws["optimizer"].append(self.batch_random(trainer).random())

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            self.draws["end"].append(self.batch_random(trainer).random())

    noise = Noise()
    trainer(callbacks=[noise], max_epochs=2).fit(RecordingModule(record=False), loaders("list")[0])
    assert len(noise.draws["transform"]) == 8 and len(set(noise.draws["transform"])) == 8
    assert noise.draws["optimizer"] == noise.draws["end"] == noise.draws["transform"]


def test_a_reused_callback_works_the_new_runs_length_out_even_without_super_in_on_train_start():
    class NoSuper(ProgressProbe):
        def on_train_start(self, trainer, pl_module):  # no super(): progress works the length out itself
            pass

    probe = NoSuper()
    trainer(callbacks=[probe], max_epochs=1).fit(RecordingModule(record=False), loaders("list")[0])
    probe.seen.clear()
    trainer(callbacks=[probe], max_epochs=4).fit(RecordingModule(record=False), loaders("list")[0])
    assert [p for _, p in probe.seen][4] == pytest.approx(4 / 16)  # not 4 / 4: the first fit's 4 steps


def test_a_script_class_draws_alike_under_ddp_spawn_and_restores_from_another_module():
    def noise_of(module):
        return type("Noise", (SpeedupCallback,), {"__module__": module, "__qualname__": "Noise"})(seed=1)

    # the launching script's class, in ddp_spawn's processes too (Python names that module `__mp_main__`)
    script, spawned, imported = noise_of("__main__"), noise_of("__mp_main__"), noise_of("train_module")
    assert script._class_id() == spawned._class_id() == "__main__.Noise"
    assert script._salt() == spawned._salt() != imported._salt()  # another package's Noise draws its own stream
    # the checkpoint key has no module: a script's callback restores into the class imported by another script
    assert script.state_key == imported.state_key == "Noise"
    assert MixUp(p=0.5).state_key == "MixUp{'p': 0.5, 'start': 0.0, 'end': 1.0}"


def test_an_iterable_loader_with_max_epochs_and_max_steps_is_warned_about_where_progress_is_read():
    with pytest.warns(SpeedupWarning, match=r"no length, so progress counts against max_steps=100; if .*max_epochs=2"):
        trainer(callbacks=[ProgressProbe()], max_epochs=2, max_steps=100).fit(
            RecordingModule(record=False), torch.utils.data.DataLoader(Stream(), batch_size=8)
        )
    with warnings.catch_warnings():  # a MixUp over the whole run never reads progress: nothing to say
        warnings.filterwarnings("error", ".*no length, so progress", SpeedupWarning)
        trainer(callbacks=[MixUp()], max_epochs=2, max_steps=100).fit(
            RecordingModule(record=False), torch.utils.data.DataLoader(Stream(), batch_size=8)
        )
