"""TrainingMeter: FLOPs counted per batch shape against a hand computation; history at each validation."""

import time
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.utils._python_dispatch import _get_current_dispatch_mode
from torch.utils.data import DataLoader, TensorDataset

from lightning_speedups.meter import MissingMetricError, TrainingMeter
from tests.helpers import RecordingModule, trainer


class Linear(RecordingModule):
    def __init__(self):
        super().__init__(record=False)
        self.net = nn.Linear(10, 4, bias=False)

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_acc", (self(x).argmax(1) == y).float().mean())


def data(n):
    return DataLoader(TensorDataset(torch.randn(n, 10), torch.randint(0, 4, (n,))), batch_size=16)


def test_flops_are_counted_per_shape_and_match_hand_computation():
    meter = TrainingMeter("val_acc")
    # 40 samples in batches of 16: shapes 16, 16, 8 per epoch; 2 epochs
    trainer(callbacks=[meter], max_epochs=2).fit(Linear(), data(40), data(16))
    # forward x @ W^T: 2*N*10*4; backward: grad of W only (inputs need no grad): 2*N*10*4
    per_sample = 2 * 10 * 4 * 2
    assert meter.flops_per_shape and sorted(meter.flops_per_shape.values()) == [8 * per_sample, 16 * per_sample]
    assert meter.flops == 2 * 40 * per_sample
    assert [c.step for c in meter.history] == [3, 6]
    assert meter.history[-1].flops == meter.flops
    assert 0 <= meter.history[0].metric <= 1 and meter.history[1].wall >= meter.history[0].wall > 0


def test_validating_or_testing_after_the_fit_leaves_its_record_as_it_ended(tmp_path):
    # validate/test(ckpt_path=...) restored the checkpoint's history and FLOPs into the meter, and every
    # validate added a point of its own, numbered as the fit's last step
    from lightning.pytorch.callbacks import ModelCheckpoint

    meter = TrainingMeter("val_acc")
    ckpt = ModelCheckpoint(dirpath=tmp_path, every_n_epochs=1, save_top_k=-1, filename="{epoch}")
    t = trainer(callbacks=[meter, ckpt], max_epochs=3, enable_checkpointing=True)
    module = Linear()
    t.fit(module, data(32), data(16))
    history, flops = list(meter.history), meter.flops
    assert [c.step for c in history] == [2, 4, 6] and flops > 0
    t.validate(module, data(16), ckpt_path=str(tmp_path / "epoch=0.ckpt"), verbose=False)
    t.test(module, data(16), ckpt_path=str(tmp_path / "epoch=1.ckpt"), verbose=False)
    t.validate(module, data(16), verbose=False)
    assert meter.history == history and meter.flops == flops
    assert meter.validations == 3


def test_steps_of_one_shape_but_another_cost_are_counted_at_their_own_cost():
    """A backbone frozen from the second epoch, and StochasticWeightAveraging's BatchNorm epoch (forward only):
    the count of the first step of a shape was reused for every later step of that shape."""
    from lightning.pytorch.callbacks import Callback, StochasticWeightAveraging

    class TwoLayers(Linear):
        def __init__(self):
            super().__init__()
            self.net = nn.Sequential(nn.Linear(10, 8, bias=False), nn.Linear(8, 4, bias=False))

    class Freeze(Callback):  # after the meter: it must read the flags after every epoch-start hook
        def on_train_epoch_start(self, trainer, pl_module):
            first, second = pl_module.net[0].weight, pl_module.net[1].weight
            first.requires_grad_(trainer.current_epoch != 1)  # epoch 1: the first layer frozen
            second.requires_grad_(trainer.current_epoch != 2)  # epoch 2: the second (as many trainable tensors)

    meter = TrainingMeter("val_acc")
    trainer(callbacks=[meter, Freeze()], max_epochs=3).fit(TwoLayers(), data(32), data(16))
    forward = 2 * 10 * 8 + 2 * 8 * 4  # per sample
    trained = forward + 2 * 8 * 4 + 2 * 8 * 4 + 2 * 10 * 8  # backward: W2's grad, layer 2's input grad, W1's grad
    first_frozen = forward + 2 * 8 * 4  # backward: W2's grad only
    second_frozen = forward + 2 * 8 * 4 + 2 * 10 * 8  # backward: layer 2's input grad, W1's grad
    assert meter.flops == 32 * (trained + first_frozen + second_frozen)

    class Normed(Linear):
        def __init__(self):
            super().__init__()
            self.net = nn.Sequential(nn.Linear(10, 4, bias=False), nn.BatchNorm1d(4))

    meter = TrainingMeter("val_acc")
    swa = StochasticWeightAveraging(swa_lrs=0.01, swa_epoch_start=1)
    trainer(callbacks=[swa, meter], max_epochs=2).fit(Normed(), data(32), data(16))
    # two training epochs, then SWA's extra epoch of forward passes that re-estimate the BatchNorm statistics
    assert meter.flops == 2 * 32 * (2 * 2 * 10 * 4) + 32 * (2 * 10 * 4)


class Trimming(Linear):
    """Padded inputs (one shape) trimmed to the rows that hold data: the FLOPs depend on the data."""

    def forward(self, x):
        rows = int((x.abs().sum(1) > 0).sum())
        return self.net(x[:rows])

    def training_step(self, batch, batch_idx):
        x, y = batch
        rows = int((x.abs().sum(1) > 0).sum())
        return nn.functional.cross_entropy(self(x), y[:rows])


def test_steps_whose_flops_depend_on_the_data_are_counted_every_eighth_step():
    x = torch.randn(48, 10)
    x[4:16] = 0  # the first batch has 4 rows of data, the second and third 16
    loader = DataLoader(TensorDataset(x, torch.randint(0, 4, (48,))), batch_size=16)
    meter = TrainingMeter("val_acc")
    trainer(callbacks=[meter], max_epochs=1).fit(Trimming(), loader, data(16))
    per_sample = 2 * 10 * 4 * 2
    assert meter.varying and meter.flops == (4 + 16 + 16) * per_sample  # the first count reused gave 12 rows
    # the count of a varying shape is sampled: every 8th step after its second, the steps between add the latest
    x = torch.randn(20 * 16, 10)
    for i in range(20):  # batch i holds i % 4 + 1 rows of data: 1, 2, 3, 4, 1, ...
        x[i * 16 + i % 4 + 1 : (i + 1) * 16] = 0
    loader = DataLoader(TensorDataset(x, torch.randint(0, 4, (20 * 16,))), batch_size=16)
    meter = TrainingMeter("val_acc")
    trainer(callbacks=[meter], max_epochs=1).fit(Trimming(), loader, data(16))
    # counted: steps 0, 1, 9 and 17 (rows 1, 2, 2, 2); each step between adds the 2 rows of the latest count
    assert meter.flops == (1 + 19 * 2) * per_sample  # every step counted: 50 rows
    # a shape whose first two steps agree is counted twice, then reused
    meter = TrainingMeter("val_acc")
    trainer(callbacks=[meter], max_epochs=2).fit(Linear(), data(48), data(16))
    assert not meter.varying and meter.flops == 2 * 48 * per_sample


class Scale(nn.Module):
    """A LayerScale-style gain: a parameter in an elementwise product, which the counter skips by design."""

    def __init__(self):
        super().__init__()
        self.gamma = nn.Parameter(torch.ones(10))

    def forward(self, x):
        return x * self.gamma


class Recurrent(Linear):
    def __init__(self):
        super().__init__()
        self.rnn, self.norm, self.scale = nn.LSTM(10, 10, batch_first=True), nn.LayerNorm(10), Scale()
        self.scripted = torch.jit.script(nn.Linear(10, 10))  # takes no hooks
        self.norm2d = nn.LayerNorm([1, 10])  # a 2-D gain, elementwise still
        self.expert = nn.Linear(10, 10)  # given no tokens: nothing to count

    def forward(self, x):
        h = self.scripted(self.scale(self.norm(self.rnn(x[:, None])[0][:, -1])))
        self.expert(input=x[:0])
        return self.net(self.norm2d(h[:, None])[:, 0])


def test_modules_the_counter_counts_nothing_for_are_named():
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as mode:  # the LSTM's fused op on CPU: counted by this torch or not
        nn.LSTM(10, 10)(torch.randn(1, 4, 10))
    meter = TrainingMeter("val_acc")
    trainer(callbacks=[meter], max_steps=2).fit(Recurrent(), data(32), data(16))
    # never the LayerNorm and the gain (elementwise: nothing to count), nor the counted head and scripted layer
    assert meter.uncounted == ({} if mode.get_total_flops() else {"rnn": "LSTM"})
    meter = TrainingMeter("val_acc")
    trainer(callbacks=[meter], max_steps=2).fit(Linear(), data(32), data(16))
    assert meter.uncounted == {}


def test_a_metric_that_was_not_logged_is_named():
    with pytest.raises(MissingMetricError, match=r"'val_accuracy' was not logged.*val_acc"):
        trainer(callbacks=[TrainingMeter("val_accuracy")], max_epochs=1).fit(Linear(), data(16), data(16))


def test_counting_stops_on_exception():
    class Boom(Linear):
        def training_step(self, batch, batch_idx):
            raise RuntimeError("boom")

    meter = TrainingMeter()
    with pytest.raises(RuntimeError, match="boom"):
        trainer(callbacks=[meter], max_epochs=1).fit(Boom(), data(16))
    assert meter._counting is None
    assert _get_current_dispatch_mode() is None  # no FlopCounterMode left active


def test_the_clocks_include_work_done_at_fit_start(monkeypatch):
    # BatchSizeFinder runs its trial steps in on_fit_start, ahead of every other callback: the recipe pays them.
    # A fake clock that only that hook advances: the meter must count its 100 "seconds".
    from types import SimpleNamespace

    from lightning.pytorch.callbacks import Callback

    from lightning_speedups import meter as meter_module

    clock = {"now": 0.0}
    fake_time = SimpleNamespace(perf_counter=lambda: clock["now"], process_time=lambda: clock["now"])
    monkeypatch.setattr(meter_module, "time", fake_time)  # the meter's clocks only, not the process's
    # and no child processes' CPU time: a DataLoader worker another test left alive would add real ticks
    monkeypatch.setattr(meter_module, "cpu_seconds", lambda: clock["now"])

    class SlowStart(Callback):
        def on_fit_start(self, trainer, pl_module):
            clock["now"] += 100.0

    meter = TrainingMeter()
    trainer(callbacks=[SlowStart(), meter], max_epochs=1).fit(Linear(), data(16), data(16))
    assert meter.history[0].wall == 100.0 and meter.history[0].cpu == 100.0


class BusyDataset(torch.utils.data.Dataset):
    """Each sample costs at least 5 ms of CPU time where it is loaded (a worker process here)."""

    def __len__(self):
        return 32

    def __getitem__(self, i):
        start = time.process_time()
        while time.process_time() - start < 0.005:
            pass
        return torch.randn(10), i % 4


def test_cpu_time_includes_the_dataloader_workers():
    meter = TrainingMeter()
    loader = DataLoader(BusyDataset(), batch_size=8, num_workers=2)
    before = time.process_time()
    trainer(callbacks=[meter], max_epochs=2).fit(Linear(), loader, data(16))
    main_process = time.process_time() - before
    # 64 samples loaded in the workers, at least 5 ms of CPU each: none of it in this process's own clock
    assert meter.history[-1].cpu >= main_process * 0.9 + 64 * 0.005 * 0.9


def test_a_skipped_batch_leaves_no_counter_on():
    class SkipsFirst(Linear):
        def on_train_batch_start(self, batch, batch_idx):
            return -1 if self.current_epoch == 0 else None  # ends epoch 0 before its first step

    meter = TrainingMeter()
    trainer(callbacks=[meter], max_epochs=2).fit(SkipsFirst(), data(32), data(16))
    assert meter._counting is None and _get_current_dispatch_mode() is None
    assert meter.flops == 32 * 2 * 10 * 4 * 2  # epoch 1's two batches, counted once each


def _burn_cpu(seconds):
    start = time.process_time()
    while time.process_time() - start < seconds:
        pass


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads live workers from /proc")
def test_cpu_seconds_counts_a_finished_worker_once():
    import multiprocessing

    from lightning_speedups.meter import cpu_seconds

    child = multiprocessing.get_context("fork").Process(target=_burn_cpu, args=(0.3,))
    before = cpu_seconds()
    child.start()
    stat = Path(f"/proc/{child.pid}/stat")
    while stat.read_text().rsplit(")", 1)[1].split()[0] != "Z":  # not `is_alive()`: that would reap it
        time.sleep(0.01)  # until it has exited, not yet waited for
    first, second = cpu_seconds(), cpu_seconds()
    assert first - before >= 0.25  # its CPU time is in the first reading already
    assert abs(second - first) < 0.1


def _burn_cpu_then_wait(seconds, done, read):
    _burn_cpu(seconds)
    done.set()
    read.wait(60)  # alive, its work done, until the parent has read the time (a sleep raced a slow parent)


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads live workers from /proc")
def test_cpu_seconds_keeps_a_forkserver_workers_time_after_it_exits():
    import multiprocessing

    from lightning_speedups.meter import cpu_seconds

    ctx = multiprocessing.get_context("forkserver")
    done, read = ctx.Event(), ctx.Event()
    child = ctx.Process(target=_burn_cpu_then_wait, args=(0.3, done, read))
    before = cpu_seconds()
    child.start()
    assert done.wait(60)
    while_alive = cpu_seconds()  # its time, read from /proc
    read.set()
    child.join()  # the fork server, not this process, reaps it: RUSAGE_CHILDREN never gets its time
    after = cpu_seconds()
    assert while_alive - before >= 0.25
    assert after >= while_alive - 0.01  # not dropped when it exits


def test_the_shape_key_reads_nested_batch_objects_and_survives_a_cycle():
    from lightning_speedups.meter import _shape_key

    class Inputs:
        def __init__(self, x):
            self.x = x

    class Batch:
        def __init__(self, x):
            self.inputs, self.y, self.me = Inputs(x), torch.zeros(2), None

    def batch(width):
        b = Batch(torch.zeros(2, width))
        b.me = b  # refers back to itself
        return ({"batch": b}, torch.arange(2))

    assert _shape_key(batch(8)) == _shape_key(batch(8)) != _shape_key(batch(16))  # the shape three objects deep
    # a batch object that holds its dataset is read up to a bound, not whole at every step
    holder = Inputs(torch.zeros(2, 8))
    holder.dataset = [{"i": i} for i in range(100_000)]
    key = _shape_key(holder)
    assert len(str(key)) < 100_000 and key[0] == ("x", ((2, 8), "torch.float32"))
