"""ProgressiveResizing and DropoutRemoval under Lightning's DDP: 2 CPU processes (gloo), checked inside the workers."""

import sys
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.strategies import DDPStrategy
from torch.utils.data import DataLoader, Dataset, Subset

from lightning_speedups import DropoutRemoval, ProgressiveResizing, SpeedupDataModule
from lightning_speedups.functional import find_dropout, pool_batchnorm_statistics
from lightning_speedups.pipeline import ResolutionSampler
from tests.helpers import ImagesDataModule, trainer
from tests.test_pipeline_resizing import PipelineData, PipelineRecorder
from tests.test_progressive_resizing import SizeRecorder

pytestmark = [
    pytest.mark.ddp,
    pytest.mark.skipif(sys.platform != "linux", reason="ddp_fork needs Linux"),
]


def gather(value):
    out = [None, None]
    dist.all_gather_object(out, value)
    return out


class CheckInWorkers(Callback):
    """Listed after the callbacks under test; a failed assertion in a worker fails the test in the parent."""

    def __init__(self) -> None:
        self.checked_validations = 0

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.training_stats = pl_module.net.bn.running_mean.clone()

    def on_validation_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0):
        if trainer.sanity_checking or batch_idx:
            return
        (cb,) = [c for c in trainer.callbacks if isinstance(c, ProgressiveResizing)]
        if cb._snapshot is None:
            return  # not recalibrated (full size)
        mean0, mean1 = gather(pl_module.net.bn.running_mean.clone())
        assert torch.equal(mean0, mean1)  # pooled over ranks: one set of statistics
        assert not torch.allclose(mean0, self.training_stats)
        self.checked_validations += 1

    def on_validation_end(self, trainer, pl_module):
        assert torch.equal(pl_module.net.bn.running_mean, self.training_stats)  # training statistics are back

    def on_train_end(self, trainer, pl_module):
        assert trainer.world_size == 2 and dist.is_initialized()
        assert self.checked_validations == 2
        # pooled with the strategy's own reduce, as the callback does: mean 0 and 2, variance 1 on each rank
        # pool to mean 1 and variance 2 (Lightning's reduce works in place: the spread of the means was lost, 1)
        bn = torch.nn.BatchNorm1d(1)
        bn.running_mean.fill_(2.0 * trainer.global_rank)
        pool_batchnorm_statistics(bn, lambda t: trainer.strategy.reduce(t, reduce_op="mean"))
        assert bn.running_mean.item() == 1.0 and bn.running_var.item() == 2.0
        removed = [s for s in find_dropout(pl_module) if s.value > 0]
        assert not removed  # DropoutRemoval(start=0.5) acted on this rank
        pl_module.checked = True


class WithDropout(SizeRecorder):
    def __init__(self):
        super().__init__()
        self.net.fc = torch.nn.Sequential(torch.nn.Dropout(0.3), self.net.fc)


class PipelineChecks(CheckInWorkers):
    def on_train_end(self, trainer, pl_module):
        assert isinstance(trainer.train_dataloader.sampler, ResolutionSampler)  # not wrapped by Lightning
        assert all(size == on_device for _, size, on_device, _ in pl_module.steps)
        shards = gather(sorted(i.index for i in trainer.train_dataloader.sampler))
        assert not set(shards[0]) & set(shards[1]) and len(shards[0]) == len(shards[1]) == 32
        super().on_train_end(trainer, pl_module)


class PipelineWithDropout(PipelineRecorder):
    def __init__(self):
        super().__init__()
        self.net.fc = torch.nn.Sequential(torch.nn.Dropout(0.3), self.net.fc)


@pytest.mark.parametrize("mode", ["resize", "pipeline"])
def test_recalibration_pooled_and_dropout_removed_on_every_rank(mode):
    cb = ProgressiveResizing(0.5, 1.0, 0.0, mode=mode, validation="recalibrate", calibration_batches=2)
    if mode == "resize":
        model, dm, check = WithDropout(), ImagesDataModule(n=64, size=16, batch_size=8), CheckInWorkers()
    else:
        model, dm, check = PipelineWithDropout(), PipelineData(n=64, batch_size=8, num_workers=1), PipelineChecks()
    t = trainer(strategy="ddp_fork", devices=2, max_epochs=2, callbacks=[cb, DropoutRemoval(start=0.5), check])
    t.fit(model, datamodule=dm)
    assert t.state.finished  # every worker assertion passed, or fit would have raised


class TwoSizes(Dataset):
    """Even indices 16 x 16, odd ones 4 x 4: unshuffled, rank 0 trains on the large images, rank 1 on the small."""

    def __len__(self):
        return 16

    def __getitem__(self, i):
        side = 16 if i % 2 == 0 else 4
        return torch.randn(1, side, side, generator=torch.Generator().manual_seed(i)), torch.tensor(i % 4)


class TwoSizesData(SpeedupDataModule):
    def setup(self, stage):
        self.train_dataset = TwoSizes()

    def val_dataloader(self):
        return DataLoader(Subset(TwoSizes(), [0, 2]), batch_size=2)


def test_recalibration_decided_alike_on_every_rank():
    """Rank 1's 4 x 4 images are at full size even at scale 0.5, rank 0's are not: both must still recalibrate
    (pooling is a collective), or rank 0 waits for rank 1 until the process group times out."""
    cb = ProgressiveResizing(0.5, 0.5, 0.0, validation="recalibrate", calibration_batches=1)

    class RecalibratedOnEveryRank(Callback):  # not only no hang: each rank recalibrated, as often as the other
        def on_train_end(self, trainer, pl_module):
            counts = [None, None]
            dist.all_gather_object(counts, cb.recalibrations)
            assert counts[0] == counts[1] > 0, counts

    strategy = DDPStrategy(start_method="fork", timeout=timedelta(seconds=60))  # a regression fails, not hangs
    callbacks = [cb, RecalibratedOnEveryRank()]
    t = trainer(strategy=strategy, devices=2, max_epochs=2, val_check_interval=2, callbacks=callbacks)
    t.fit(SizeRecorder(), datamodule=TwoSizesData(batch_size=2, shuffle=False))
    assert t.state.finished
