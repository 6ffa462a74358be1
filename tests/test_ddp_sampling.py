"""RepeatFactorSampling + CurriculumOrdering under Lightning's DDP: 2 CPU processes (gloo), checked in the workers."""

import sys

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from lightning.pytorch.callbacks import Callback

from lightning_speedups import CurriculumOrdering, LossScore, RepeatFactorSampling
from lightning_speedups.samplers import EpochListSampler
from tests.helpers import trainer
from tests.sampling_helpers import IndexDM, IndexModel

pytestmark = [
    pytest.mark.ddp,
    pytest.mark.skipif(sys.platform != "linux", reason="ddp_fork needs Linux"),
]

BATCH = 8


class CheckShards(Callback):
    """Runs on each rank; a failed assertion fails the test in the parent."""

    def __init__(self, curriculum):
        self.curriculum = curriculum

    def on_train_start(self, trainer, pl_module):
        # The scores were computed on half the data per rank and gathered: they equal a local computation.
        x, y = trainer.datamodule.train_dataset.tensors
        with torch.no_grad():
            local = F.cross_entropy(pl_module(x), y, reduction="none").numpy()
        np.testing.assert_allclose(self.curriculum.scores, local, rtol=1e-5)

    def on_train_end(self, trainer, pl_module):
        assert trainer.world_size == 2 and dist.is_initialized()
        sampler = trainer.train_dataloader.sampler
        assert type(sampler) is EpochListSampler  # neither wrapped nor replaced by Lightning
        assert sampler.num_replicas == 2 and sampler.rank == trainer.global_rank
        per_rank = len(sampler)
        assert per_rank == 42  # round(sum r) = 84 entries, 42 per rank
        batches = -(-per_rank // BATCH)
        seen = pl_module.seen
        assert len(seen) == 2 * batches
        mine = [[i for b in seen[e * batches : (e + 1) * batches] for i in b] for e in range(2)]
        for epoch in range(2):
            assert mine[epoch] == sampler.rank_indices(epoch).tolist()
        gathered = [None, None]
        dist.all_gather_object(gathered, (mine, self.curriculum.order.tolist(), seen[0]))
        (mine0, order0, first0), (mine1, order1, first1) = gathered
        assert order0 == order1  # every rank ordered the data alike
        for epoch in range(2):
            everything = sampler.epoch_indices(epoch).tolist()
            assert len(mine0[epoch]) == len(mine1[epoch]) == 42
            assert mine0[epoch] == everything[0::2] and mine1[epoch] == everything[1::2]  # disjoint positions
        rank = np.empty(80, dtype=int)
        rank[np.asarray(order0)] = np.arange(80)
        assert rank[first0 + first1].max() < 8  # the first step (both ranks) drew from the easiest 10%
        assert mine0[0] != mine0[1]


def test_repeat_factors_and_curriculum_under_ddp_fork():
    curriculum = CurriculumOrdering("linear", difficulty=LossScore(), start_fraction=0.1, full_at=0.5)
    t = trainer(
        accelerator="cpu",
        devices=2,
        strategy="ddp_fork",
        max_epochs=2,
        callbacks=[RepeatFactorSampling(threshold=0.1), curriculum, CheckShards(curriculum)],
    )
    t.fit(IndexModel(80), datamodule=IndexDM(80, batch_size=BATCH))
    assert t.state.finished  # every worker assertion passed, or fit would have raised
