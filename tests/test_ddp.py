"""MixUp and the SpeedupDataModule under Lightning's DDP: 2 CPU processes (gloo), checked inside the workers."""

import sys

import pytest
import torch
import torch.distributed as dist
from lightning.pytorch.callbacks import Callback

from lightning_speedups import LabelSmoothing, MixUp
from lightning_speedups.seam import active_transforms
from tests.helpers import ImagesDataModule, RecordingModule, trainer

pytestmark = [
    pytest.mark.ddp,
    pytest.mark.skipif(sys.platform != "linux", reason="ddp_fork needs Linux"),
]


class CheckInWorkers(Callback):
    """Runs on each rank at the end of training; a failed assertion fails the test in the parent."""

    def on_train_end(self, trainer, pl_module):
        assert trainer.world_size == 2 and dist.is_initialized()
        assert [type(cb).__name__ for cb in active_transforms(trainer)] == ["MixUp", "LabelSmoothing"]
        sampler = trainer.train_dataloader.sampler
        assert type(sampler).__name__ == "EpochShuffleSampler"  # not wrapped or replaced by Lightning
        targets = [y for _, y in pl_module.train_batches]
        assert len(targets) == 4  # 64 samples / 2 ranks / batch 8
        assert all(y.is_floating_point() and torch.allclose(y.sum(1), torch.ones(len(y))) for y in targets)
        assert all(y.min() >= 0.1 / 4 - 1e-6 for y in targets)  # smoothed once: the floor is eps / C
        inputs = torch.cat([x for x, _ in pl_module.train_batches])
        gathered = [None, None]
        dist.all_gather_object(gathered, (list(sampler), inputs.sum().item()))
        (indices0, sum0), (indices1, sum1) = gathered
        assert not set(indices0) & set(indices1) and len(indices0) == len(indices1) == 32  # disjoint shards
        assert sum0 != sum1
        seeds = [None, None]  # each rank's process seed differed (`SeedPerRank`): the callbacks share rank zero's
        dist.all_gather_object(seeds, [cb.seed for cb in active_transforms(trainer)])
        assert seeds[0] == seeds[1] == [1000, 1000]
        pl_module.checked = True


class SeedPerRank(Callback):
    """A process seed of its own on each rank, as processes that no `seed_everything` aligned have."""

    def setup(self, trainer, pl_module, stage):
        torch.manual_seed(1000 + trainer.global_rank)


def test_mixup_and_smoothing_under_ddp_fork():
    model = RecordingModule()
    t = trainer(
        accelerator="cpu",
        devices=2,
        strategy="ddp_fork",
        max_epochs=1,
        callbacks=[SeedPerRank(), MixUp(alpha=1.0), LabelSmoothing(0.1), CheckInWorkers()],
    )
    t.fit(model, datamodule=ImagesDataModule(n=64, batch_size=8))
    assert t.state.finished  # every worker assertion passed, or fit would have raised
