"""LinearScalingWarmup in real fits: the learning rate each update *uses* (read inside `optimizer.step`) equals
the scheduler's value times the warmup factor, whatever the scheduler, and nothing leaks into the scheduler."""

from __future__ import annotations

import contextlib
import copy
import itertools
import math
import sys
import warnings

import pytest
import torch
import torch.distributed as dist
from lightning.pytorch import seed_everything
from lightning.pytorch.callbacks import (
    BackboneFinetuning,
    BatchSizeFinder,
    Callback,
    GradientAccumulationScheduler,
    LearningRateMonitor,
    ModelCheckpoint,
)
from lightning.pytorch.plugins.precision import MixedPrecision
from torch.utils.data import BatchSampler, DataLoader, IterableDataset, SequentialSampler, TensorDataset

from lightning_speedups import LinearScalingWarmup, SpeedupWarning
from tests.helpers import ImagesDataModule, MemoryLogger, RecordingModule, image_tensors, trainer

LR = 0.1


# torch hooks `step` per class at the first instance: with SGD's own step hooked too, RecordingSGD's
# `super().step()` runs the step hooks a second time inside the first, as a user's optimizer subclass can
torch.optim.SGD([torch.zeros(1, requires_grad=True)])


class RecordingSGD(torch.optim.SGD):
    """SGD that records, inside `step`, the learning rate of each group that this very update uses."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.used: list[list[float]] = []

    def step(self, closure=None):
        loss = None
        if closure is not None:  # training_step and backward first, as SGD's own step does
            with torch.enable_grad():
                loss = closure()
        self.used.append([float(g["lr"]) for g in self.param_groups])
        super().step()
        return loss


def make_scheduler(kind: str, opt: torch.optim.Optimizer, total: int):
    if kind == "cosine":
        return torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=total)
    if kind == "onecycle":
        return torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=LR, total_steps=total + 1)
    if kind == "step":
        return torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.5)
    if kind == "plateau":
        return torch.optim.lr_scheduler.ReduceLROnPlateau(opt, patience=0, factor=0.5)
    assert kind == "none"
    return None


def scheduled_lrs(kind: str, total: int) -> list[float]:
    """The learning rate of each of `total` updates by the scheduler alone, without Lightning or the callback."""
    opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=LR)
    sched = make_scheduler(kind, opt, total)
    out = []
    for _ in range(total):
        out.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    return out


class WarmupModule(RecordingModule):
    """Tiny classifier with a chosen scheduler (stepped every update) and a `batch_size` for BatchSizeFinder."""

    def __init__(self, scheduler: str = "cosine", total: int = 8, batch_size: int = 16, groups: int = 1) -> None:
        super().__init__(record=False, lr=LR)
        self.scheduler, self.total, self.batch_size, self.groups = scheduler, total, batch_size, groups
        self.opt: RecordingSGD | None = None
        self.sched = None
        self.after_batch: list[float] = []  # param_groups[0]["lr"] after each batch: must be the scheduler's
        self.sched_states: list[dict] = []  # the scheduler's state_dict after each batch

    def training_step(self, batch, batch_idx):
        loss = super().training_step(batch, batch_idx)
        self.log("const", 1.0)  # a metric that never improves, for ReduceLROnPlateau
        return loss

    def on_train_batch_end(self, outputs, batch, batch_idx):
        self.after_batch.append(self.opt.param_groups[0]["lr"])
        if self.sched is not None:
            self.sched_states.append(copy.deepcopy(self.sched.state_dict()))

    def configure_optimizers(self):
        if self.groups == 1:
            params = self.parameters()
        else:
            params = [{"params": self.net.conv.parameters()}, {"params": self.net.fc.parameters(), "lr": LR / 10}]
        self.opt = RecordingSGD(params, lr=LR)
        self.sched = make_scheduler(self.scheduler, self.opt, self.total)
        if self.sched is None:
            return self.opt
        config = {"scheduler": self.sched, "interval": "step"}
        if self.scheduler == "plateau":
            config.update(monitor="const", interval="epoch")
        return {"optimizer": self.opt, "lr_scheduler": config}

    def train_dataloader(self):
        return DataLoader(TensorDataset(*image_tensors(64)), batch_size=self.batch_size)

    def val_dataloader(self):  # BatchSizeFinder's trials run validation too
        return DataLoader(TensorDataset(*image_tensors(16, seed=1)), batch_size=16)

    @property
    def used(self) -> list[float]:
        return [lrs[0] for lrs in self.opt.used]


def fit(module, callbacks=(), **kwargs):
    t = trainer(callbacks=list(callbacks), **kwargs)
    t.fit(module)
    return t


def ramp(t: int, warmup: int, scale: float) -> float:
    """The paper's gradual warmup, written out: from the unscaled lr to `scale` times it over `warmup` updates."""
    return 1 + (scale - 1) * min(1.0, t / warmup) if warmup else scale


# ---------------------------------------------------------------------- the effective learning rate
@pytest.mark.parametrize("scheduler", ["cosine", "onecycle"])
@pytest.mark.parametrize("accumulate", [1, 2])
def test_effective_lr_is_the_schedule_times_the_formula(scheduler, accumulate):
    # 64 samples / batch 16 = 4 batches per epoch; 8 updates in all. Global batch 16 * accumulate vs reference 8.
    scale, warmup = 2.0 * accumulate, 4
    module = WarmupModule(scheduler)
    cb = LinearScalingWarmup(reference_batch_size=8, warmup=warmup, warmup_unit="steps")
    fit(module, [cb], max_epochs=2 * accumulate, accumulate_grad_batches=accumulate)

    sched = scheduled_lrs(scheduler, 8)
    expected = [lr * ramp(t, warmup, scale) for t, lr in enumerate(sched)]
    assert module.used == pytest.approx(expected, rel=1e-9)
    assert module.used[0] == pytest.approx(sched[0])  # the paper's warmup starts at the unscaled lr
    assert cb.scale == scale and cb.updates == [8]
    # between updates the param group holds the scheduler's value: nothing leaked into the chainable schedule
    stepped = module.after_batch[accumulate - 1 :: accumulate]
    assert stepped == pytest.approx([*sched[1:], module.sched.get_last_lr()[0]], rel=1e-9)


@pytest.mark.parametrize("scheduler", ["step", "plateau", "none"])
def test_composes_multiplicatively_with_other_schedulers(scheduler):
    seed_everything(0)
    plain = WarmupModule(scheduler, total=12)
    fit(plain, max_epochs=3)
    seed_everything(0)
    warmed = WarmupModule(scheduler, total=12)
    fit(warmed, [LinearScalingWarmup(8, warmup=0.5, warmup_unit="epochs")], max_epochs=3)  # 2 updates
    assert len(set(plain.used)) > 1 or scheduler == "none"  # the scheduler did change the lr
    ratios = [w / p for w, p in zip(warmed.used, plain.used, strict=True)]
    assert ratios == pytest.approx([1.0, 1.5] + [2.0] * 10)
    assert warmed.after_batch == pytest.approx(plain.after_batch)  # the scheduler's own values are untouched


@pytest.mark.parametrize("scheduler", ["cosine", "onecycle", "step", "plateau"])
def test_scheduler_state_is_the_same_as_without_the_callback(scheduler):
    plain, warmed = WarmupModule(scheduler, total=12), WarmupModule(scheduler, total=12)
    fit(plain, max_epochs=3)
    fit(warmed, [LinearScalingWarmup(4, warmup=5, warmup_unit="steps")], max_epochs=3)
    assert len(plain.sched_states) == 12
    assert plain.sched_states == warmed.sched_states  # bit for bit, after every step
    assert plain.opt.param_groups[0]["lr"] == warmed.opt.param_groups[0]["lr"]
    assert warmed.used != pytest.approx(plain.used)  # and yet the updates used other learning rates


def test_warmup_from_zero_and_sqrt_rule():
    module = WarmupModule("none")
    cb = LinearScalingWarmup(4, warmup=3, warmup_unit="steps", rule="sqrt", warmup_from="zero")
    fit(module, [cb], max_epochs=2)
    assert cb.scale == 2.0  # sqrt(16 / 4)
    assert module.used == pytest.approx([LR * f for f in [0.5, 1.0, 1.5, 2, 2, 2, 2, 2]])


def test_warmup_in_epochs_and_fractions_counts_optimizer_updates():
    cb = LinearScalingWarmup(8, warmup=1.5, warmup_unit="epochs")
    fit(WarmupModule("none"), [cb], max_epochs=3, accumulate_grad_batches=2)  # 2 updates per epoch
    assert cb.warmup_steps == 3
    cb = LinearScalingWarmup(8, warmup=0.25, warmup_unit="fraction")
    fit(WarmupModule("none", total=12), [cb], max_epochs=3)
    assert cb.warmup_steps == 3


@pytest.mark.parametrize("scheduler_first", [True, False])
def test_gradient_accumulation_scheduler_changes_the_scale_per_epoch(scheduler_first):
    # the plan is re-read at each epoch's first update, after every callback's epoch start: either order works
    module = WarmupModule("none")
    cb = LinearScalingWarmup(8, warmup=0, warmup_unit="steps")
    scheduler = GradientAccumulationScheduler({0: 1, 1: 2})
    fit(module, [scheduler, cb] if scheduler_first else [cb, scheduler], max_epochs=2)
    # epoch 0: 4 updates of 16 samples (x2); epoch 1: 2 updates of 32 samples (x4)
    assert module.used == pytest.approx([LR * 2] * 4 + [LR * 4] * 2)


def test_an_epoch_warmup_follows_a_change_in_updates_per_epoch():
    # 4 batches per epoch: epoch 0 takes 4 updates of 16 samples (k = 2), epochs 1 and 2 take 2 updates of 32
    # samples (k = 4). A 2-epoch warmup must ramp over both epochs, whatever their number of updates.
    module, warmup = WarmupModule("none"), 2
    cb = LinearScalingWarmup(8, warmup=warmup, warmup_unit="epochs")
    fit(module, [GradientAccumulationScheduler({0: 1, 1: 2}), cb], max_epochs=3)
    epoch = [0] * 4 + [1] * 2 + [2] * 2  # the epoch of each update
    per_epoch = {0: 4, 1: 2, 2: 2}  # updates in that epoch
    scale = {0: 2.0, 1: 4.0, 2: 4.0}  # k in that epoch
    factors = [lr / LR for lr in module.used]
    assert len(factors) == len(epoch)
    # k changes with the global batch, by design; the warmup's share of the way from 1 to k must not jump
    done = [(f - 1) / (scale[e] - 1) for f, e in zip(factors, epoch, strict=True)]
    assert all(b >= a for a, b in itertools.pairwise(factors))  # the factor never goes down
    for t in range(1, len(done)):
        share = 1 / (warmup * per_epoch[epoch[t - 1]])  # what the previous update adds to the warmup
        assert 0 <= done[t] - done[t - 1] <= share + 1e-12
    # the full factor is reached exactly after `warmup` epochs: not before (the audit saw it at epoch 1), not after
    first_after = epoch.index(warmup)
    assert max(done[:first_after]) < 1 and done[first_after:] == pytest.approx([1.0] * (len(done) - first_after))
    assert done == pytest.approx([0, 1 / 8, 2 / 8, 3 / 8, 4 / 8, 6 / 8, 1, 1])
    assert cb.updates == [8] and cb.warmup_progress == [1.0]


def test_a_tensor_learning_rate_is_replaced_during_the_update_never_changed_in_place():
    class TensorLr(WarmupModule):
        def configure_optimizers(self):
            self.opt = RecordingSGD(self.parameters(), lr=torch.tensor(LR))
            self.tensor_lr = self.opt.param_groups[0]["lr"]
            self.sched = make_scheduler("cosine", self.opt, self.total)
            return {"optimizer": self.opt, "lr_scheduler": {"scheduler": self.sched, "interval": "step"}}

    module = TensorLr("cosine")
    fit(module, [LinearScalingWarmup(8, warmup=4, warmup_unit="steps")], max_epochs=2)
    assert module.used == pytest.approx([lr * ramp(t, 4, 2.0) for t, lr in enumerate(scheduled_lrs("cosine", 8))])
    assert module.opt.param_groups[0]["lr"] is module.tensor_lr  # the scheduler's own tensor, which it fills
    assert float(module.tensor_lr) == pytest.approx(module.sched.get_last_lr()[0])


def test_an_update_that_raises_leaves_the_schedulers_learning_rate():
    class Crash(WarmupModule):
        def training_step(self, batch, batch_idx):
            if self.global_step == 2:  # inside optimizer.step: the factor is applied around this closure
                raise KeyError("boom")
            return super().training_step(batch, batch_idx)

    module = Crash("cosine")
    with pytest.raises(KeyError, match="boom"):
        fit(module, [LinearScalingWarmup(8, warmup=4, warmup_unit="steps")], max_epochs=2)
    sched = scheduled_lrs("cosine", 8)
    assert module.opt.param_groups[0]["lr"] == pytest.approx(sched[2])  # restored: safe to checkpoint or go on


def test_training_step_reads_and_sets_the_schedulers_learning_rate():
    """Inside `optimizer.step`'s closure the group holds the unscaled value: a value set there is scaled too."""

    class SetsLr(WarmupModule):
        def training_step(self, batch, batch_idx):
            self.read = [*getattr(self, "read", []), self.opt.param_groups[0]["lr"]]
            self.opt.param_groups[0]["lr"] = 0.1 * (self.global_step + 1)
            return super().training_step(batch, batch_idx)

    module = SetsLr("none")
    fit(module, [LinearScalingWarmup(4, warmup=0)], max_epochs=1)  # batch 16 / reference 4: x 4 at once
    assert module.used == pytest.approx([0.4, 0.8, 1.2, 1.6])  # the value set in training_step, scaled
    assert module.read == pytest.approx([LR, 0.1, 0.2, 0.3])  # the user's own values, never the scaled ones
    assert module.opt.param_groups[0]["lr"] == pytest.approx(0.4)  # and kept after the update


@pytest.mark.parametrize("reference", [16, 8], ids=["factor-1", "factor-2"])
def test_the_logged_learning_rate_is_the_one_the_update_used_when_training_step_sets_it(reference):
    # at a factor of 1 the closure is not wrapped: the snapshot taken before it logged the previous value
    class PlainSGD(torch.optim.Optimizer):  # its step calls no parent step: the step hooks run once, around it
        def __init__(self, params, lr):
            super().__init__(params, {"lr": lr})
            self.used: list[list[float]] = []

        @torch.no_grad()
        def step(self, closure=None):
            with torch.enable_grad():
                loss = closure()
            self.used.append([float(g["lr"]) for g in self.param_groups])
            for group in self.param_groups:
                for param in group["params"]:
                    param.add_(param.grad, alpha=-group["lr"])
            return loss

    class SetsLr(WarmupModule):
        def configure_optimizers(self):
            self.opt = PlainSGD(self.parameters(), lr=LR)
            return self.opt

        def training_step(self, batch, batch_idx):
            self.opt.param_groups[0]["lr"] = 0.1 * (self.global_step + 2)
            return super().training_step(batch, batch_idx)

    module, logger = SetsLr("none"), MemoryLogger()
    fit(module, [LinearScalingWarmup(reference, warmup=0)], max_epochs=1, logger=logger, log_every_n_steps=1)
    logged = [v for _, v in logger.history["lr_warmup/lr-PlainSGD"]]
    assert module.used == pytest.approx([0.1 * (t + 2) * 16 / reference for t in range(4)])
    assert logged == pytest.approx(module.used)


def test_a_fit_that_raises_takes_its_step_hooks_off_the_optimizer():
    class Crash(WarmupModule):
        def training_step(self, batch, batch_idx):
            if self.global_step == 2:
                raise KeyError("boom")
            return super().training_step(batch, batch_idx)

    module, cb = Crash("none"), LinearScalingWarmup(8, warmup=4, warmup_unit="steps")
    with pytest.raises(KeyError, match="boom"):
        fit(module, [cb], max_epochs=2)
    assert cb.updates == [2]
    module.opt.step()  # the user's own step after the failed fit: neither scaled nor counted
    assert module.used[-1] == pytest.approx(LR) and cb.updates == [2]


# ---------------------------------------------------------------------- groups, optimizers, logging
@pytest.mark.parametrize("opt_out", ["key", "pair", "index"])
def test_a_param_group_can_opt_out(opt_out):
    class KeyOptOut(WarmupModule):
        def configure_optimizers(self):
            config = super().configure_optimizers()
            self.opt.param_groups[1]["lr_scaling"] = False
            return config

    module = (KeyOptOut if opt_out == "key" else WarmupModule)("none", groups=2)
    exclude = {"key": (), "pair": [(0, 1)], "index": [1]}[opt_out]
    fit(module, [LinearScalingWarmup(8, warmup=0, warmup_unit="steps", exclude_groups=exclude)], max_epochs=1)
    assert [lr for lrs in module.opt.used for lr in lrs] == pytest.approx([LR * 2, LR / 10] * 4)


class TwoOptimizers(RecordingModule):
    """Manual optimization: the first optimizer steps every batch, the second every other batch."""

    def __init__(self) -> None:
        super().__init__(record=False)
        self.automatic_optimization = False

    def training_step(self, batch, batch_idx):
        first, second = self.optimizers()
        x, y = batch
        loss = torch.nn.functional.cross_entropy(self(x), y)
        first.zero_grad()
        second.zero_grad()
        self.manual_backward(loss)
        first.step()
        if batch_idx % 2 == 0:
            second.step()

    def configure_optimizers(self):
        self.first = RecordingSGD(self.net.conv.parameters(), lr=LR)
        self.second = RecordingSGD(self.net.fc.parameters(), lr=LR)
        return self.first, self.second

    def train_dataloader(self):
        return DataLoader(TensorDataset(*image_tensors(64)), batch_size=16)


def test_several_optimizers_each_warm_up_on_their_own_updates():
    module, logger = TwoOptimizers(), MemoryLogger()
    cb = LinearScalingWarmup(8, warmup=4, warmup_unit="steps")
    fit(module, [cb], max_epochs=2, logger=logger, log_every_n_steps=1)
    assert [u[0] for u in module.first.used] == pytest.approx([LR * ramp(t, 4, 2.0) for t in range(8)])
    assert [u[0] for u in module.second.used] == pytest.approx([LR * ramp(t, 4, 2.0) for t in range(4)])
    assert cb.updates == [8, 4]
    assert {"lr_warmup/lr-RecordingSGD", "lr_warmup/lr-RecordingSGD-1"} <= logger.history.keys()
    # each optimizer's own factor: the second, with half the updates, is still warming up at the end
    assert logger.history["lr_warmup/factor-RecordingSGD"][-1][1] == pytest.approx(ramp(7, 4, 2.0))
    assert logger.history["lr_warmup/factor-RecordingSGD-1"][-1][1] == pytest.approx(ramp(3, 4, 2.0))


class BothEveryBatch(TwoOptimizers):
    """Both optimizers step at every batch: Lightning's global step counts two per batch."""

    def training_step(self, batch, batch_idx):
        x, y = batch
        for opt in self.optimizers():
            opt.zero_grad()
            self.manual_backward(torch.nn.functional.cross_entropy(self(x), y))
            opt.step()


@pytest.mark.parametrize(("kwargs", "updates"), [({"max_steps": 8, "max_epochs": 10}, 4), ({"max_epochs": 2}, 8)])
def test_a_fraction_warmup_under_manual_optimization_counts_each_optimizers_updates(kwargs, updates):
    module, cb = BothEveryBatch(), LinearScalingWarmup(8, warmup=0.5, warmup_unit="fraction")
    fit(module, [cb], **kwargs)
    assert cb.updates == [updates, updates] and cb.warmup_steps == updates // 2
    expected = [LR * ramp(t, updates // 2, 2.0) for t in range(updates)]  # the scaled lr is reached mid-run
    assert [u[0] for u in module.first.used] == pytest.approx(expected)


def test_manual_optimization_resumed_from_a_checkpoint_without_the_callback(tmp_path):
    fit(BothEveryBatch(), [ModelCheckpoint(dirpath=tmp_path, save_last=True)], max_steps=4, enable_checkpointing=True)
    module, cb = BothEveryBatch(), LinearScalingWarmup(8, warmup=8, warmup_unit="steps")
    t = trainer(callbacks=[cb], max_steps=6, max_epochs=3)
    t.fit(module, ckpt_path=str(tmp_path / "last.ckpt"))
    assert cb.updates == [3, 3]  # 2 updates each before the checkpoint, 1 after: not the global step 4 + 1
    assert module.first.used[0][0] == pytest.approx(LR * ramp(2, 8, 2.0))


def test_logs_the_effective_lr_where_lr_monitor_shows_the_schedulers():
    module, logger = WarmupModule("cosine", groups=2), MemoryLogger()
    callbacks = [LinearScalingWarmup(8, warmup=4, warmup_unit="steps"), LearningRateMonitor("step")]
    fit(module, callbacks, max_epochs=2, logger=logger, log_every_n_steps=1)
    h = {k: [v for _, v in pts] for k, pts in logger.history.items()}
    for j in (0, 1):
        used = [lrs[j] for lrs in module.opt.used]
        assert h[f"lr_warmup/lr-RecordingSGD/pg{j + 1}"] == pytest.approx(used)
        scheduled = [u / ramp(t, 4, 2.0) for t, u in enumerate(used)]
        assert h[f"lr-RecordingSGD/pg{j + 1}"] == pytest.approx(scheduled)  # LearningRateMonitor's view
    assert h["lr_warmup/scale"] == [2.0] * 8 and h["lr_warmup/global_batch_size"] == [16.0] * 8
    assert h["lr_warmup/factor"] == pytest.approx([ramp(t, 4, 2.0) for t in range(8)])


class SchedulerOnTheSecond(TwoOptimizers):
    """LearningRateMonitor names optimizers with a scheduler first, and takes a scheduler config's `name`."""

    def __init__(self, sched_name=None):
        super().__init__()
        self.sched_name = sched_name

    def configure_optimizers(self):
        first, second = super().configure_optimizers()
        for group in second.param_groups:
            group["lr"] = LR / 10  # tells the two apart
        config = {"scheduler": torch.optim.lr_scheduler.StepLR(second, 100), "interval": "step"}
        if self.sched_name:
            config["name"] = self.sched_name
        return [first, second], [config]


@pytest.mark.parametrize("sched_name", [None, "head"])
def test_effective_lr_keys_match_lr_monitors_for_each_optimizer(sched_name):
    module, logger = SchedulerOnTheSecond(sched_name), MemoryLogger()
    cb = LinearScalingWarmup(16, warmup=0, warmup_unit="steps")  # factor 1: effective == scheduled
    fit(module, [cb, LearningRateMonitor("step")], max_epochs=1, logger=logger, log_every_n_steps=1)
    monitor = {k for k in logger.history if k.startswith("lr-") or k == sched_name}
    ours = {k.removeprefix("lr_warmup/") for k in logger.history if k.startswith("lr_warmup/")} - {
        "scale",
        "factor",
        "global_batch_size",
    }
    factors = {k for k in ours if k.startswith("factor-")}  # one per optimizer, named as its learning rate
    assert factors == {f"factor-{k.removeprefix('lr-')}" for k in monitor}
    ours -= factors
    assert monitor == ours and len(ours) == 2
    second = sched_name or "lr-RecordingSGD"  # the optimizer with the scheduler comes first
    assert logger.history[f"lr_warmup/{second}"][-1][1] == pytest.approx(module.second.param_groups[0]["lr"])


def test_a_second_fit_reports_only_its_own_optimizers():
    logger = MemoryLogger()
    cb = LinearScalingWarmup(8, warmup=2, warmup_unit="steps")
    fit(TwoOptimizers(), [cb], max_epochs=1)
    fit(WarmupModule("none"), [cb], max_epochs=1, logger=logger, log_every_n_steps=1)  # one optimizer now
    assert "lr_warmup/lr-RecordingSGD-1" not in logger.history
    assert len(logger.history["lr_warmup/lr-RecordingSGD"]) == 4


# ---------------------------------------------------------------------- BatchSizeFinder
@pytest.mark.parametrize("order", ["finder-first", "warmup-first"])
def test_follows_the_batch_size_that_batch_size_finder_picks(tmp_path, order):
    module = WarmupModule("cosine", batch_size=16)
    finder = BatchSizeFinder(mode="power", init_val=2, max_trials=3, steps_per_trial=1)
    cb = LinearScalingWarmup(4, warmup=4, warmup_unit="steps")
    callbacks = [finder, cb] if order == "finder-first" else [cb, finder]
    fit(module, callbacks, max_epochs=1, default_root_dir=tmp_path)
    assert finder.optimal_batch_size == module.batch_size == 8  # 2 -> 4 -> 8: 8 batches of 8
    trials, real = module.used[:3], module.used[3:]  # the trials step the same optimizer
    assert trials == pytest.approx(scheduled_lrs("cosine", 8)[:3])  # unscaled: the callback sat the trials out
    assert cb.scale == 2.0 and cb.updates == [8]  # 8 / 4; the trials' steps did not count
    assert real == pytest.approx([lr * ramp(t, 4, 2.0) for t, lr in enumerate(scheduled_lrs("cosine", 8))])


@pytest.mark.parametrize("order", ["finder-first", "warmup-first"])
def test_initial_reference_is_the_batch_asked_for_before_the_finder_changes_it(tmp_path, order):
    module = WarmupModule("cosine", batch_size=4)
    finder = BatchSizeFinder(mode="power", init_val=2, max_trials=3, steps_per_trial=1)
    cb = LinearScalingWarmup("initial", warmup=4, warmup_unit="steps")
    callbacks = [finder, cb] if order == "finder-first" else [cb, finder]
    fit(module, callbacks, max_epochs=1, default_root_dir=tmp_path)
    assert module.batch_size == 8 and cb.scale == 2.0  # tuned at 4 (what the module asked for), trained at 8
    assert cb.state_dict()["initial_reference"] == 4
    assert module.used[3:] == pytest.approx([lr * ramp(t, 4, 2.0) for t, lr in enumerate(scheduled_lrs("cosine", 8))])


def test_a_second_fit_keeps_the_initial_reference_the_finder_changed_the_batch_from(tmp_path):
    # the second fit read the module's batch size again, which the finder had set: the scale fell from 2 to 1
    module = WarmupModule("none", batch_size=4)
    finder = BatchSizeFinder(mode="power", init_val=2, max_trials=3, steps_per_trial=1)
    cb = LinearScalingWarmup("initial", warmup=0)
    t = trainer(callbacks=[finder, cb], max_epochs=1, default_root_dir=tmp_path)
    t.fit(module)
    assert module.batch_size == 8 and cb.scale == 2.0
    t.fit_loop.max_epochs = 2
    t.fit(module)
    assert cb.scale == 2.0 and module.used[-8:] == pytest.approx([LR * 2] * 8)


def test_resuming_with_a_batch_size_finder_is_refused_and_resuming_without_it_continues(tmp_path):
    """Lightning's BatchSizeFinder searches before the checkpoint's loops are restored and its trial restore drops
    them: the run would start over at step 0 with the full factor at once. Refused before anything runs."""
    from lightning.pytorch.callbacks import ModelCheckpoint

    def finder():
        return BatchSizeFinder(mode="power", init_val=2, max_trials=3, steps_per_trial=1)

    saver = ModelCheckpoint(dirpath=tmp_path / "ckpt", every_n_train_steps=4, save_top_k=-1)
    first = WarmupModule("cosine", batch_size=4)
    first_trainer = fit(
        first,
        [finder(), LinearScalingWarmup("initial", warmup=4, warmup_unit="steps"), saver],
        max_epochs=1,
        default_root_dir=tmp_path,
        enable_checkpointing=True,
    )
    ckpt = str(tmp_path / "ckpt" / "epoch=0-step=4.ckpt")
    again = WarmupModule("cosine", batch_size=4)
    t = trainer(
        callbacks=[finder(), LinearScalingWarmup("initial", warmup=4, warmup_unit="steps")],
        max_epochs=1,
        default_root_dir=tmp_path,
    )
    refused = r"resuming from a checkpoint with Lightning's BatchSizeFinder.*restart training from step 0"
    with pytest.raises(ValueError, match=refused):
        t.fit(again, ckpt_path=ckpt)
    assert again.opt is None or again.used == []  # refused before any step
    with pytest.raises(ValueError, match=refused):  # the first run's Trainer, which keeps that fit's optimizers
        first_trainer.fit(WarmupModule("cosine", batch_size=4), ckpt_path=ckpt)
    # a checkpoint saved without the callback (a baseline run's): refused all the same, before any step
    plain_saver = ModelCheckpoint(dirpath=tmp_path / "plain", every_n_train_steps=4, save_top_k=-1)
    fit(
        WarmupModule("cosine", batch_size=4),
        [plain_saver],
        max_epochs=1,
        default_root_dir=tmp_path,
        enable_checkpointing=True,
    )
    plain = WarmupModule("cosine", batch_size=4)
    t = trainer(callbacks=[LinearScalingWarmup("initial", warmup=4, warmup_unit="steps"), finder()], max_epochs=1)
    with pytest.raises(ValueError, match=refused):
        t.fit(plain, ckpt_path=str(tmp_path / "plain" / "epoch=0-step=4.ckpt"))
    assert plain.opt is None or plain.used == []
    resumed = WarmupModule("cosine", batch_size=first.batch_size)  # the batch the first run found, no finder
    cb = LinearScalingWarmup("initial", warmup=4, warmup_unit="steps")
    trainer(callbacks=[cb], max_epochs=1, default_root_dir=tmp_path).fit(resumed, ckpt_path=ckpt)
    assert cb.scale == 2.0 and cb.updates == [8]  # the reference the checkpoint kept (4), the count continued
    assert resumed.used == pytest.approx(first.used[3 + 4 :])  # the last 4 updates of the first run, as they were


@pytest.mark.parametrize("lr_find_between", [False, True])
def test_initial_reference_is_the_batch_asked_for_before_the_tuners_search(tmp_path, lr_find_between):
    from lightning.pytorch.tuner import Tuner

    module = WarmupModule("cosine", batch_size=4)
    cb = LinearScalingWarmup("initial", warmup=4, warmup_unit="steps")
    t = trainer(callbacks=[cb], max_epochs=1, default_root_dir=tmp_path)
    found = Tuner(t).scale_batch_size(module, mode="power", init_val=2, max_trials=3, steps_per_trial=1)
    assert found == module.batch_size == 8
    if lr_find_between:  # its own fit spent the reference kept from before the batch search: k was 1
        Tuner(t).lr_find(module, num_training=3, update_attr=False)
    t.fit(module)
    assert cb.scale == 2.0 and cb.state_dict()["initial_reference"] == 4
    fit(module, [cb], max_epochs=1)  # a later fit on its own reads the batch asked for then
    assert cb.scale == 1.0


def test_an_lr_find_alone_leaves_the_next_fit_to_read_its_batch(tmp_path):
    # an lr_find with no batch search before it kept its reference (4) for a fit at another batch (16): x4
    from lightning.pytorch.tuner import Tuner

    module = WarmupModule("cosine", batch_size=4)
    cb = LinearScalingWarmup("initial", warmup=4, warmup_unit="steps")
    t = trainer(callbacks=[cb], max_epochs=1, default_root_dir=tmp_path)  # the finder's temporary checkpoint
    Tuner(t).lr_find(module, num_training=3, update_attr=False)
    module.batch_size = 16
    t.fit(module)
    assert cb.scale == 1.0 and cb.state_dict()["initial_reference"] == 16


def test_initial_reference_with_a_dataset_of_whole_batches_leaves_the_learning_rate_alone():
    # DataLoader(batch_size=None): the sampler's length counts batches, which capped the reference at 10 (x 3.2)
    class WholeBatches(torch.utils.data.Dataset):
        def __len__(self):
            return 10

        def __getitem__(self, i):
            return image_tensors(32, seed=i)

    class PreBatched(WarmupModule):
        def train_dataloader(self):
            return DataLoader(WholeBatches(), batch_size=None)

    module = PreBatched("none")
    del module.batch_size
    cb = LinearScalingWarmup("initial", warmup=0, warmup_unit="steps", batch_size=32)
    fit(module, [cb], max_steps=3)
    assert cb.scale == 1.0 and module.used == pytest.approx([LR] * 3)


def test_a_second_fit_on_the_same_trainer_continues_an_epoch_warmup():
    # The second fit recounted the first fit's 4 updates at the new 2 updates per epoch: the warmup jumped to done.
    def run(epochs_per_fit):
        module = WarmupModule("none")
        cb = LinearScalingWarmup(8, warmup=2, warmup_unit="epochs")
        t = trainer(callbacks=[GradientAccumulationScheduler({0: 1, 1: 2}), cb], max_epochs=epochs_per_fit[0])
        t.fit(module)
        used = list(module.used)
        for epochs in epochs_per_fit[1:]:
            t.fit_loop.max_epochs = epochs
            t.fit(module)
            used += module.used
        return used, cb

    in_one, _ = run([3])
    in_two, cb = run([1, 3])
    assert in_two == pytest.approx(in_one) and cb.updates == [8]
    assert [lr / LR for lr in in_two][4:6] == pytest.approx([1 + 3 * 4 / 8, 1 + 3 * 6 / 8])  # still ramping


@pytest.mark.parametrize("stage", ["validate", "test"])
def test_an_evaluation_from_an_earlier_checkpoint_between_two_fits_leaves_the_warmup_where_the_fit_left_it(
    tmp_path, stage
):
    # Lightning restores callback state in `validate/test(ckpt_path=...)` too: the second fit went on from the
    # epoch-0 checkpoint's 4 updates, not the first fit's 8, and its learning rate stepped back down the ramp
    def warmup():
        return LinearScalingWarmup(8, warmup=3, warmup_unit="epochs")  # x2 over 12 updates of 4 per epoch

    whole = WarmupModule("none")
    fit(whole, [warmup()], max_epochs=4)
    module, cb = WarmupModule("none"), warmup()
    checkpoints = ModelCheckpoint(dirpath=tmp_path, every_n_epochs=1, save_top_k=-1, filename="{epoch}")
    t = trainer(callbacks=[cb, checkpoints], max_epochs=2, enable_checkpointing=True)
    t.fit(module)
    used = list(module.used)
    getattr(t, stage)(module, module.val_dataloader(), ckpt_path=str(tmp_path / "epoch=0.ckpt"), verbose=False)
    assert cb.updates == [8]
    t.fit_loop.max_epochs = 4
    t.fit(module)
    assert used + module.used == pytest.approx(whole.used)
    assert [lr / LR for lr in whole.used] == pytest.approx([ramp(u, 12, 2.0) for u in range(16)])
    # a checkpoint without this callback's state (a baseline run's) leaves nothing behind that would drop a
    # `load_state_dict` called by hand afterwards
    baseline = tmp_path / "baseline.ckpt"
    t.save_checkpoint(baseline)
    checkpoint = torch.load(baseline, weights_only=False)
    checkpoint["callbacks"] = {}
    torch.save(checkpoint, baseline)
    getattr(t, stage)(module, module.val_dataloader(), ckpt_path=str(baseline), verbose=False)
    cb.load_state_dict({**cb.state_dict(), "updates": [3]})
    assert cb.updates == [3]


def test_a_fresh_fit_after_validating_a_checkpoint_of_another_batch_does_not_warn_of_a_resumed_batch(tmp_path):
    fit(
        WarmupModule("none", batch_size=8),
        [LinearScalingWarmup(4, warmup=0)],
        max_epochs=1,
        default_root_dir=tmp_path,
        enable_checkpointing=True,
    )
    (ckpt,) = tmp_path.glob("**/*.ckpt")
    module, cb = WarmupModule("none", batch_size=16), LinearScalingWarmup(4, warmup=0)
    t = trainer(callbacks=[cb], max_epochs=1)
    t.validate(module, ckpt_path=str(ckpt), verbose=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error", SpeedupWarning)  # was: "the checkpoint's run had a global batch of 8"
        t.fit(module)
    assert cb.scale == 4.0


def test_initial_reference_on_one_device_leaves_the_learning_rate_alone():
    module = WarmupModule("cosine", batch_size=16)
    cb = LinearScalingWarmup("initial", warmup=2, warmup_unit="steps")
    fit(module, [cb], max_epochs=1, accumulate_grad_batches=2)
    assert cb.scale == 1.0 and cb.state_dict()["initial_reference"] == 32  # 16 x 2 accumulated
    assert module.used == pytest.approx(scheduled_lrs("cosine", 8)[:2])  # 2 updates, exactly the scheduler's


class LoaderOnlyBatchSize(WarmupModule):
    """No `batch_size` attribute: the warmup reads the batch size from the loader."""

    def __init__(self, scheduler: str) -> None:
        super().__init__(scheduler)
        del self.batch_size

    def train_dataloader(self):
        return DataLoader(TensorDataset(*image_tensors(64)), batch_size=16)


@pytest.mark.parametrize("batch_size_on_module", [True, False])
def test_initial_reference_counts_a_scheduled_accumulation_as_the_trainer_setting(batch_size_on_module):
    # GradientAccumulationScheduler({0: 2}) asks for what Trainer(accumulate_grad_batches=2) does: scale 1
    module = WarmupModule("cosine", batch_size=16) if batch_size_on_module else LoaderOnlyBatchSize("cosine")
    cb = LinearScalingWarmup("initial", warmup=2, warmup_unit="steps")
    fit(module, [GradientAccumulationScheduler({0: 2}), cb], max_epochs=1)
    assert cb.scale == 1.0 and cb.state_dict()["initial_reference"] == 32
    assert module.used == pytest.approx(scheduled_lrs("cosine", 8)[:2])


def test_initial_reference_is_the_batch_size_given_to_the_callback():
    # manual accumulation over 2 batches of 16, told as batch_size=32: one device, so the scale is 1 (the module's
    # own `batch_size` of 16 was taken instead, a scale of 2)
    class ManualAccumulation(WarmupModule):
        def __init__(self):
            super().__init__("none", batch_size=16)
            self.automatic_optimization = False

        def training_step(self, batch, batch_idx):
            self.manual_backward(super().training_step(batch, batch_idx) / 2)
            if batch_idx % 2:
                self.opt.step()
                self.opt.zero_grad()

    module, cb = ManualAccumulation(), LinearScalingWarmup("initial", warmup=0, batch_size=32)
    fit(module, [cb], max_epochs=1)
    assert cb.scale == 1.0 and module.used == pytest.approx([LR] * 2)


def test_initial_reference_is_restored_from_a_checkpoint():
    cb = LinearScalingWarmup("initial")
    cb.load_state_dict({"seed": None, "updates": [3], "initial_reference": 64})
    assert cb._reference() == 64


class ShrinkBatchAfterFirstEpoch(Callback):
    def on_train_epoch_end(self, trainer, pl_module):
        pl_module.batch_size = 8  # the loader is rebuilt with it (reload_dataloaders_every_n_epochs=1)


def test_a_batch_size_changed_mid_run_is_read_again():
    module = WarmupModule("none", batch_size=16)
    cb = LinearScalingWarmup(8, warmup=0, warmup_unit="steps")
    fit(module, [cb, ShrinkBatchAfterFirstEpoch()], max_epochs=2, reload_dataloaders_every_n_epochs=1)
    assert module.used == pytest.approx([LR * 2] * 4 + [LR * 1] * 8)  # batch 16 -> x2, then batch 8 -> x1
    assert cb.updates == [12] and cb.scale == 1.0


# ---------------------------------------------------------------------- resume and skipped fp16 steps
class AmpModule(WarmupModule):
    """fp16 autocast with a grad scaler; the loss is infinite at the given global steps, so those are skipped."""

    def __init__(self, inf_steps=(1, 2), **kwargs) -> None:
        super().__init__("cosine", total=12, **kwargs)
        self.inf_steps = inf_steps
        self.skipped_seen: list[bool] = []

    def training_step(self, batch, batch_idx):
        loss = super().training_step(batch, batch_idx)
        return loss * math.inf if self.global_step in self.inf_steps else loss

    def on_train_batch_end(self, outputs, batch, batch_idx):
        super().on_train_batch_end(outputs, batch, batch_idx)
        self.skipped_seen.append(self.global_step - 1 in self.inf_steps)


def amp_plugin(device: str = "cpu") -> MixedPrecision:
    return MixedPrecision("16-mixed", device, scaler=torch.amp.GradScaler(device))


@pytest.mark.parametrize(
    "device",
    ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU"))],
)
def test_steps_skipped_by_the_grad_scaler_neither_advance_nor_corrupt_the_warmup(device):
    module = AmpModule()
    cb = LinearScalingWarmup(8, warmup=4, warmup_unit="steps")
    fit(module, [cb], max_epochs=3, plugins=[amp_plugin(device)], accelerator=device)
    sched = scheduled_lrs("cosine", 12)
    real = [t for t in range(12) if t not in (1, 2)]  # global steps whose update was applied
    assert len(module.used) == 10 and cb.updates == [10]  # torch never ran the two skipped updates
    expected = [sched[t] * ramp(u, 4, 2.0) for u, t in enumerate(real)]
    assert module.used == pytest.approx(expected, rel=1e-9)  # update u of the warmup, whatever the global step
    assert module.after_batch == pytest.approx([*sched[1:], module.sched.get_last_lr()[0]], rel=1e-9)


def test_a_fused_optimizer_stepped_through_skipped_fp16_steps_does_not_advance_the_warmup():
    # torch steps a fused optimizer even when the grad scaler found inf gradients (the kernel skips the update):
    # both step hooks ran, so every skipped step advanced the ramp
    class Fused(AmpModule):
        def configure_optimizers(self):
            self.opt = RecordingSGD(self.parameters(), lr=LR, fused=True)
            self.sched = make_scheduler("cosine", self.opt, 12)
            return {"optimizer": self.opt, "lr_scheduler": {"scheduler": self.sched, "interval": "step"}}

    module = Fused()
    cb = LinearScalingWarmup(8, warmup=4, warmup_unit="steps")
    fit(module, [cb], max_epochs=3, plugins=[amp_plugin()])
    assert len(module.used) == 12 and cb.updates == [10]  # stepped 12 times, 2 of them skipped in the kernel
    sched = scheduled_lrs("cosine", 12)
    real = [t for t in range(12) if t not in (1, 2)]
    assert [module.used[t] for t in real] == pytest.approx([sched[t] * ramp(u, 4, 2.0) for u, t in enumerate(real)])
    assert module.after_batch == pytest.approx([*sched[1:], module.sched.get_last_lr()[0]], rel=1e-9)
    # once the warmup is done, `found_inf` is not read (on a GPU each read waits for the device): the skipped
    # steps after it are counted as the ramp no longer depends on the count
    cb = LinearScalingWarmup(8, warmup=1, warmup_unit="steps")
    fit(Fused(), [cb], max_epochs=3, plugins=[amp_plugin()])
    assert cb.updates == [12]


def run_resumable(tmp_path, callbacks, ckpt_path=None, plugins=(), save_every=None):
    seed_everything(3)
    module = AmpModule(inf_steps=(1, 2) if plugins else ())
    extra = [ModelCheckpoint(dirpath=tmp_path, every_n_train_steps=save_every, save_top_k=-1)] if save_every else []
    t = trainer(callbacks=[*callbacks, *extra], max_epochs=3, plugins=list(plugins), enable_checkpointing=bool(extra))
    t.fit(module, datamodule=ImagesDataModule(n=64, batch_size=16), ckpt_path=ckpt_path)
    return module


@pytest.mark.parametrize("amp", [False, True], ids=["fp32", "fp16-skips"])
def test_a_run_resumed_mid_warmup_continues_the_same_sequence(tmp_path, amp):
    plugins = [amp_plugin()] if amp else []
    full = run_resumable(
        tmp_path, [LinearScalingWarmup(8, warmup=8, warmup_unit="steps")], plugins=plugins, save_every=5
    )
    ckpt = torch.load(tmp_path / "epoch=1-step=5.ckpt", weights_only=False)
    assert ckpt["optimizer_states"][0]["param_groups"][0]["lr"] == pytest.approx(scheduled_lrs("cosine", 12)[5])
    assert ckpt["callbacks"]["LinearScalingWarmup"]["updates"] == [3 if amp else 5]  # mid-warmup
    cb = LinearScalingWarmup(8, warmup=8, warmup_unit="steps")
    resumed = run_resumable(
        tmp_path / "resumed", [cb], ckpt_path=str(tmp_path / "epoch=1-step=5.ckpt"), plugins=plugins
    )
    done = 3 if amp else 5  # updates applied before the checkpoint
    assert resumed.used == pytest.approx(full.used[done:], rel=1e-12)
    for a, b in zip(full.state_dict().values(), resumed.state_dict().values(), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6)


@pytest.mark.parametrize("old_format", [False, True], ids=["checkpoint", "checkpoint-before-fraction-shares"])
def test_a_fraction_warmup_resumed_mid_warmup_continues_the_same_sequence(tmp_path, old_format):
    def warmup():
        return LinearScalingWarmup(8, warmup=0.75, warmup_unit="fraction")  # 9 of the run's 12 updates

    full = run_resumable(tmp_path, [warmup()], save_every=5)
    path = tmp_path / "epoch=1-step=5.ckpt"
    if old_format:  # as an earlier version wrote it: no unit, and the fraction's shares never advanced
        ckpt = torch.load(path, weights_only=False)
        state = ckpt["callbacks"]["LinearScalingWarmup"]
        state.pop("warmup_done_unit")
        state["warmup_done"] = [0.0]
        torch.save(ckpt, path)
    resumed = run_resumable(tmp_path / "resumed", [warmup()], ckpt_path=str(path))
    assert resumed.used == pytest.approx(full.used[5:], rel=1e-12)
    factors = [u / lr for u, lr in zip(full.used, scheduled_lrs("cosine", 12), strict=True)]
    assert factors == pytest.approx([1 + u / 9 for u in range(9)] + [2.0] * 3)  # mid-ramp at the checkpoint


def test_a_resume_at_an_epoch_end_under_an_accumulation_schedule_does_not_warn(tmp_path):
    # the global batch doubles with the schedule's accumulation: the checkpoint's was taken for a change of batch
    def run(ckpt_path=None, save=False):
        module = WarmupModule("none")
        saving = [ModelCheckpoint(dirpath=tmp_path, every_n_epochs=1, save_top_k=-1)] if save else []
        callbacks = [GradientAccumulationScheduler({0: 1, 1: 2}), LinearScalingWarmup(8, warmup=0), *saving]
        trainer(callbacks=callbacks, max_epochs=2, enable_checkpointing=save).fit(module, ckpt_path=ckpt_path)
        return module.used

    full = run(save=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error", SpeedupWarning)  # "the checkpoint's run had a global batch of 16, ..."
        resumed = run(ckpt_path=str(tmp_path / "epoch=0-step=4.ckpt"))
    assert resumed == pytest.approx(full[4:]) and full == pytest.approx([LR * 2] * 4 + [LR * 4] * 2)
    # a fixed accumulation changed between the runs is a change of batch: said
    module = WarmupModule("none")
    with pytest.warns(SpeedupWarning, match="the checkpoint's run had a global batch of 16, this one has 32"):
        trainer(callbacks=[LinearScalingWarmup(8, warmup=0)], max_epochs=2, accumulate_grad_batches=2).fit(
            module, ckpt_path=str(tmp_path / "epoch=0-step=4.ckpt")
        )


class ResumableAccumulationScheduler(GradientAccumulationScheduler):
    """Lightning's scheduler sets its factor only in `on_train_epoch_start`, which Lightning (2.6) skips for the
    epoch a checkpoint saved at a batch end resumes in: the resumed epoch would accumulate 1 batch, not 2."""

    def on_train_start(self, trainer, pl_module):
        super().on_train_start(trainer, pl_module)
        self.on_train_epoch_start(trainer)


@pytest.mark.parametrize("step", [4, 5], ids=["epoch-end", "mid-epoch"])
def test_an_epoch_warmup_resumed_after_the_updates_per_epoch_changed_continues_the_same_sequence(tmp_path, step):
    # 4 updates in epoch 0, then 2 per epoch; a 2-epoch warmup, so after step 5 the warmup is 4/8 + 1/4 = 3/4
    # done, which `updates / updates-per-warmup-now` (5/4) would not give: the checkpoint must carry it.
    def callbacks():
        return [ResumableAccumulationScheduler({0: 1, 1: 2}), LinearScalingWarmup(8, warmup=2, warmup_unit="epochs")]

    full = run_resumable(tmp_path, callbacks(), save_every=step)
    assert len(full.used) == 8
    ckpt_path = next(tmp_path.glob(f"epoch=*-step={step}.ckpt"))
    state = torch.load(ckpt_path, weights_only=True)["callbacks"]["LinearScalingWarmup"]
    assert state["updates"] == [step] and state["warmup_done"] == [pytest.approx(0.5 if step == 4 else 0.75)]
    resumed = run_resumable(tmp_path / "resumed", callbacks(), ckpt_path=str(ckpt_path))
    assert resumed.used == pytest.approx(full.used[step:], rel=1e-12)
    for a, b in zip(full.state_dict().values(), resumed.state_dict().values(), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6)


# ---------------------------------------------------------------------- DDP
class CheckEffectiveLrInWorkers(Callback):
    def on_train_end(self, trainer, pl_module):
        assert trainer.world_size == 2 and dist.is_initialized()
        # per rank 32 samples / 8 = 4 batches, accumulating 2 -> 2 updates per epoch; global batch 8 * 2 * 2 = 32
        expected = [LR * ramp(t, 2, 4.0) for t in range(4)]
        assert pl_module.used == pytest.approx(expected, rel=1e-9)
        gathered = [None, None]
        dist.all_gather_object(gathered, pl_module.used)
        assert gathered[0] == gathered[1]


@pytest.mark.ddp
@pytest.mark.skipif(sys.platform != "linux", reason="ddp_fork needs Linux")
def test_world_size_enters_the_scale_under_ddp():
    module = WarmupModule("none")
    callbacks = [LinearScalingWarmup(8, warmup=2, warmup_unit="steps"), CheckEffectiveLrInWorkers()]
    t = trainer(devices=2, strategy="ddp_fork", max_epochs=2, accumulate_grad_batches=2, callbacks=callbacks)
    t.fit(module, datamodule=ImagesDataModule(n=64, batch_size=8))
    assert t.state.finished  # the workers' assertions passed, or fit would have raised


# ---------------------------------------------------------------------- bad input
@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"reference_batch_size": 0}, ValueError, r"`reference_batch_size` must be > 0, got 0\. It is the global"),
        ({"reference_batch_size": -256}, ValueError, "`reference_batch_size` must be > 0, got -256"),
        ({"reference_batch_size": 25.6}, TypeError, "`reference_batch_size` must be a positive int or .initial., got"),
        ({"warmup": -1}, ValueError, r"`warmup` must be >= 0 \(0 applies the scaled learning rate"),
        ({"warmup": -0.1, "warmup_unit": "fraction"}, ValueError, "`warmup` must be >= 0"),
        ({"warmup": 1.5, "warmup_unit": "fraction"}, ValueError, r"`warmup` must be in \[0, 1\], got 1.5"),
        ({"warmup": 2.5, "warmup_unit": "steps"}, ValueError, "whole number of optimizer updates, got 2.5"),
        ({"warmup": math.inf}, TypeError, "`warmup` must be a finite number"),
        ({"warmup_unit": "epoch"}, ValueError, r"`warmup_unit` must be one of \('steps', 'epochs', 'fraction'\)"),
        ({"rule": "log"}, ValueError, "`rule` must be one of .* Use 'sqrt' for Adam"),
        ({"warmup_from": "half"}, ValueError, "`warmup_from` must be one of"),
        ({"batch_size": 0}, ValueError, "`batch_size` must be >= 1"),
        ({"exclude_groups": [(0, -1)]}, ValueError, "`exclude_groups` items must be"),
        ({"exclude_groups": 1}, TypeError, "`exclude_groups` must be a list"),
    ],
)
def test_bad_arguments_fail_at_construction(kwargs, error, match):
    with pytest.raises(error, match=match):
        LinearScalingWarmup(**kwargs)


def test_a_warmup_longer_than_training_warns(monkeypatch):
    with pytest.warns(SpeedupWarning, match=r"warmup \(100 steps = 100 updates\) is longer than training \(4 updates"):
        fit(WarmupModule("none"), [LinearScalingWarmup(8, warmup=100, warmup_unit="steps")], max_epochs=1)
    # a scale of at most 1 from the unscaled learning rate has no ramp: it holds from the first update
    said: list[str] = []
    monkeypatch.setattr("lightning_speedups.callbacks.warmup.rank_zero_info", said.append)
    with warnings.catch_warnings():
        warnings.simplefilter("error", SpeedupWarning)
        fit(WarmupModule("none"), [LinearScalingWarmup(1024, warmup=100, warmup_unit="steps")], max_epochs=1)
    # 16 per device x 1 x 1 over a reference of 1024 = 0.015625, printed with 4 significant digits
    assert "learning rate x 0.01562 (linear rule, reference 1024), no warmup (nothing to ramp up to" in said[0]
    with pytest.warns(SpeedupWarning, match=r"is longer than training"):  # from zero, the ramp is real
        fit(
            WarmupModule("none"),
            [LinearScalingWarmup(1024, warmup=100, warmup_unit="steps", warmup_from="zero")],
            max_epochs=1,
        )
    # a scale that rises above 1 mid-run (accumulation 1 -> 4: x 0.5 -> x 2) gets its ramp, and the warning then
    schedule = GradientAccumulationScheduler({0: 1, 1: 4})
    with pytest.warns(SpeedupWarning, match=r"longer than training \(6 updates\), so the scaled learning rate \(x 2\)"):
        fit(WarmupModule("none"), [schedule, LinearScalingWarmup(32, warmup=100, warmup_unit="steps")], max_epochs=3)


def test_a_trainer_with_no_optimizer_is_refused():
    class NoOptimizer(WarmupModule):
        def configure_optimizers(self):
            return None

    with pytest.raises(RuntimeError, match="scales the learning rate of your optimizers, but this trainer has none"):
        fit(NoOptimizer(), [LinearScalingWarmup(8, warmup=1, warmup_unit="steps")], max_epochs=1)


def test_excluded_optimizers_must_exist_and_groups_not_yet_there_get_a_warning():
    with pytest.raises(ValueError, match=r"names optimizer 1 in \(1, 0\), but there are 1 optimizer"):
        fit(WarmupModule(), [LinearScalingWarmup(8, exclude_groups=[(1, 0)])], max_epochs=1)
    with pytest.warns(SpeedupWarning, match=r"names param group 3, but the optimizers have \[1\] param group"):
        fit(WarmupModule(), [LinearScalingWarmup(8, exclude_groups=[3])], max_epochs=1)


def test_a_group_that_backbone_finetuning_adds_later_can_be_kept_unscaled():
    class Backbone(WarmupModule):
        def __init__(self):
            super().__init__("none")
            self.backbone = self.net.conv  # what BackboneFinetuning freezes, then thaws into a new group

        def configure_optimizers(self):
            self.opt = RecordingSGD([p for p in self.net.fc.parameters()], lr=LR)
            return self.opt

    module = Backbone()
    thaw = BackboneFinetuning(unfreeze_backbone_at_epoch=1, backbone_initial_ratio_lr=0.1)
    with pytest.warns(SpeedupWarning, match="kept unscaled if it is added later"):
        fit(module, [thaw, LinearScalingWarmup(8, warmup=0, exclude_groups=[(0, 1)])], max_epochs=2)
    assert [len(lrs) for lrs in module.opt.used] == [1] * 4 + [2] * 4
    assert [lrs[0] / LR for lrs in module.opt.used] == pytest.approx([2.0] * 8)  # the head: x2
    assert [lrs[1] for lrs in module.opt.used[4:]] == pytest.approx([LR * 0.1] * 4)  # the thawed backbone: as set


def test_a_fraction_warmup_never_goes_back_when_a_reloaded_loader_changes_the_runs_length():
    class Reloads(WarmupModule):
        def train_dataloader(self):  # 4 batches in epoch 0, 16 from epoch 1 on (the same batch size)
            return DataLoader(
                TensorDataset(*image_tensors(64 if self.trainer.current_epoch == 0 else 256)), batch_size=16
            )

    module = Reloads("none")
    cb = LinearScalingWarmup(8, warmup=0.5, warmup_unit="fraction")
    t = fit(module, [cb], max_epochs=3, reload_dataloaders_every_n_epochs=1)
    factors = [lr / LR for lr in module.used]
    assert len(factors) == 4 + 16 + 16  # 36 updates: the run's real length
    assert cb.warmup_steps == 18  # half of them
    assert all(b >= a for a, b in itertools.pairwise(factors))  # the ramp never goes back
    # epoch 0 at its own plan (12 updates, W = 6), then the share done so far stands and the rest goes by 1/18
    assert factors[:4] == pytest.approx([1 + u / 6 for u in range(4)])
    done = 4 / 6
    assert factors[4:6] == pytest.approx([1 + done, 1 + done + 1 / 18])
    assert factors[-1] == 2.0 and t.global_step == 36


class BatchesOfFour(torch.utils.data.Sampler):
    """A batch sampler without a `batch_size` attribute."""

    def __iter__(self):
        return iter([list(range(i, i + 4)) for i in range(0, 64, 4)])

    def __len__(self):
        return 16


def test_a_batch_size_that_cannot_be_read_must_be_given():
    class CustomSampler(WarmupModule):
        def train_dataloader(self):
            return DataLoader(TensorDataset(*image_tensors(64)), batch_sampler=BatchesOfFour())

    with pytest.raises(ValueError, match=r"cannot read the per-device batch size.*batch_size=<samples per device"):
        fit(CustomSampler("none"), [LinearScalingWarmup(8, warmup=1)], max_epochs=1)
    module = CustomSampler("none")
    cb = LinearScalingWarmup(2, warmup=0, warmup_unit="steps", batch_size=4)
    fit(module, [cb], max_epochs=1, limit_train_batches=2)
    assert module.used == pytest.approx([LR * 2] * 2)

    class BatchSamplerLoader(WarmupModule):  # a standard BatchSampler is read
        def train_dataloader(self):
            sampler = BatchSampler(SequentialSampler(range(64)), batch_size=32, drop_last=False)
            return DataLoader(TensorDataset(*image_tensors(64)), batch_sampler=sampler)

    cb = LinearScalingWarmup(8, warmup=0, warmup_unit="steps")
    fit(BatchSamplerLoader("none"), [cb], max_epochs=1)
    assert cb.scale == 4.0


class Stream(IterableDataset):
    def __iter__(self):
        x, y = image_tensors(32)
        return iter(zip(x, y, strict=True))


def test_a_fraction_warmup_needs_a_bounded_run():
    class Streaming(WarmupModule):
        def train_dataloader(self):
            return DataLoader(Stream(), batch_size=8)

    # Lightning's own estimate is -1 here: never a warmup of one update
    # `max_epochs` is set: the fix named is the one that bounds a loader with no length
    with pytest.raises(ValueError, match=r"warmup_unit='fraction'\) needs a finite run: set `max_steps` \(the"):
        fit(Streaming("none"), [LinearScalingWarmup(8, warmup=0.5, warmup_unit="fraction")], max_epochs=2)


def test_a_fraction_warmup_counts_each_epochs_scheduled_accumulation():
    # 4 batches per epoch, accumulation 1, 1, 4: 4 + 4 + 1 = 9 updates, so half the run is 4.5 -> 5 updates
    module = WarmupModule("none")
    cb = LinearScalingWarmup(16, warmup=0.5, warmup_unit="fraction")
    fit(module, [cb, GradientAccumulationScheduler({0: 1, 2: 4})], max_epochs=3)
    assert cb.updates == [9] and cb.warmup_steps == 5
    assert module.used[:5] == pytest.approx([LR * ramp(t, 5, 1.0) for t in range(5)])
    assert module.used[8] == pytest.approx(LR * 4.0)  # 16 x 4 accumulated / 16: the scale of the last epoch


def test_a_warmup_in_epochs_needs_a_sized_loader():
    class Streaming(WarmupModule):
        def train_dataloader(self):
            return DataLoader(Stream(), batch_size=8)

    with pytest.raises(ValueError, match=r"needs a training loader with a length.*warmup_unit='steps'"):
        fit(Streaming("none"), [LinearScalingWarmup(8, warmup=1)], max_steps=4)
    cb = LinearScalingWarmup(8, warmup=2, warmup_unit="steps")
    fit(Streaming("none"), [cb], max_steps=4)
    assert cb.updates == [4]
    cb = LinearScalingWarmup(4, warmup=0)  # no ramp: scaling alone needs no length, in epochs or fractions
    module = Streaming("none")
    fit(module, [cb], max_steps=2)
    assert cb.warmup_steps == 0 and module.used == pytest.approx([LR * 2] * 2)


class SkipsFirstBatches(WarmupModule):
    """Returns None (Lightning's way to skip a batch) from its first two `training_step` calls."""

    def training_step(self, batch, batch_idx):
        loss = super().training_step(batch, batch_idx)
        return None if batch_idx < 2 else loss


def test_a_skipped_training_step_is_no_warmup_update_in_32_bit():
    """Lightning still calls `optimizer.step` (with no gradients) in 32-bit; its mixed precision skips it."""
    module = SkipsFirstBatches("none")
    warmup = LinearScalingWarmup(8, warmup=4, warmup_unit="steps")  # x 2 over 4 updates
    fit(module, [warmup], max_epochs=1)
    assert module.used[2:] == pytest.approx([LR * 1.0, LR * 1.25])  # the first real updates: ramp from the start
    assert warmup.updates == [2]


class CaughtFailure(RecordingModule):
    """Manual optimization whose second update raises inside `step`, caught by the user (an OOM skipped)."""

    def __init__(self, step_scheduler: bool, tensor_lr: bool = False) -> None:
        super().__init__(record=False)
        self.automatic_optimization = False
        self.step_scheduler = step_scheduler
        self.tensor_lr = tensor_lr
        self.after_batch: list[float] = []

    def training_step(self, batch, batch_idx):
        x, y = batch
        opt = self.optimizers()
        opt.zero_grad()
        self.manual_backward(torch.nn.functional.cross_entropy(self(x), y))
        self.opt.fail = batch_idx == 1
        with contextlib.suppress(RuntimeError):  # the user's "skip the batch on OOM"
            opt.step()
        if self.step_scheduler:
            self.lr_schedulers().step()

    def on_train_batch_end(self, outputs, batch, batch_idx):
        self.after_batch.append(float(self.opt.param_groups[0]["lr"]))  # a tensor lr is filled in place later

    def configure_optimizers(self):
        class Flaky(torch.optim.SGD):
            def step(self, closure=None):
                if getattr(self, "fail", False):
                    raise RuntimeError("out of memory (simulated)")
                return super().step(closure)

        self.opt = Flaky(self.parameters(), lr=torch.tensor(LR) if self.tensor_lr else LR)
        return [self.opt], [torch.optim.lr_scheduler.ExponentialLR(self.opt, 0.9)]

    def train_dataloader(self):
        return DataLoader(TensorDataset(*image_tensors(64)), batch_size=16)


def test_a_step_that_raised_and_was_caught_leaves_no_factor_behind():
    module = CaughtFailure(step_scheduler=False)
    fit(module, [LinearScalingWarmup(8, warmup=2, warmup_unit="steps")], max_epochs=1)
    assert module.after_batch == [LR] * 4  # the scheduler's value after every batch, the failed one included


def test_a_scheduler_stepped_after_a_caught_failure_is_warned_about():
    # a tensor lr the scheduler fills in place is the same object: it was taken for unchanged, and the pre-step
    # value was put back over the scheduler's step without a word
    after = {}
    for tensor_lr in (False, True):
        module = CaughtFailure(step_scheduler=True, tensor_lr=tensor_lr)
        with pytest.warns(SpeedupWarning, match="optimizer 0's step raised and the error was caught"):
            fit(module, [LinearScalingWarmup(8, warmup=2, warmup_unit="steps")], max_epochs=1)
        after[tensor_lr] = module.after_batch
    assert after[True] == pytest.approx(after[False])  # the scheduler's step is kept alike (not put back)
    assert after[True][1] != pytest.approx(after[True][0])


def test_a_run_resumed_with_another_global_batch_is_warned_about(tmp_path):
    run_resumable(tmp_path, [LinearScalingWarmup(8, warmup=2, warmup_unit="steps")], save_every=5)
    t = trainer(callbacks=[LinearScalingWarmup(8, warmup=2, warmup_unit="steps")], max_epochs=3)
    with pytest.warns(SpeedupWarning, match=r"global batch of 16, this one has 32 .* from x 2 to x 4 at once"):
        t.fit(AmpModule(), datamodule=ImagesDataModule(n=64, batch_size=32), ckpt_path=tmp_path / "epoch=1-step=5.ckpt")


def test_a_batch_larger_than_the_dataset_scales_by_the_samples_it_holds():
    """BatchSizeFinder stops at or beyond a small dataset's size; the batch a step sees is the dataset."""
    module = WarmupModule("none", batch_size=128)  # 64 samples: one batch of 64 per epoch
    warmup = LinearScalingWarmup(16, warmup=0, warmup_unit="steps")
    fit(module, [warmup], max_epochs=1)
    assert warmup.scale == 4.0 and module.used == pytest.approx([LR * 4])  # not x 8


class AdamModule(WarmupModule):
    def configure_optimizers(self):
        self.opt = torch.optim.AdamW(self.parameters(), lr=LR)
        return self.opt


def test_the_linear_rule_on_an_adaptive_optimizer_suggests_the_square_root_rule():
    with pytest.warns(SpeedupWarning, match=r"linear rule multiplies the learning rate of AdamW by 2.*rule='sqrt'"):
        fit(AdamModule("none"), [LinearScalingWarmup(8, warmup=1, warmup_unit="steps")], max_epochs=1)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", "the linear rule", SpeedupWarning)
        fit(AdamModule("none"), [LinearScalingWarmup(8, warmup=1, warmup_unit="steps", rule="sqrt")], max_epochs=1)
        fit(WarmupModule("none"), [LinearScalingWarmup(8, warmup=1, warmup_unit="steps")], max_epochs=1)  # SGD


def test_a_batch_asked_beyond_the_dataset_keeps_the_scale_at_one_on_one_device():
    module = WarmupModule("none", batch_size=128)  # 64 samples; the reference is the batch asked for
    warmup = LinearScalingWarmup("initial", warmup=0, warmup_unit="steps")
    fit(module, [warmup], max_epochs=1)
    assert warmup.scale == 1.0 and module.used == pytest.approx([LR])


class SkipsEverySecondBatch(WarmupModule):
    def training_step(self, batch, batch_idx):
        loss = super().training_step(batch, batch_idx)
        return None if batch_idx % 2 else loss


def test_under_accumulation_a_skipped_last_batch_still_counts_as_the_windows_update():
    """The window's earlier gradients are applied: a real update, which the warmup counts."""
    warmup = LinearScalingWarmup(8, warmup=4, warmup_unit="steps")
    t = fit(SkipsEverySecondBatch("none"), [warmup], max_epochs=2, accumulate_grad_batches=2)
    assert warmup.updates == [t.global_step] == [4]  # 4 batches per epoch, 2 per update
