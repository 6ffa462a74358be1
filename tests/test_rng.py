"""Per-batch draws: reproducible from (seed, rank, batch index, class), independent across batches, right law."""

from __future__ import annotations

import itertools
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from lightning.pytorch.trainer.states import RunningStage, TrainerFn
from scipy import stats

from lightning_speedups import CutMix, MixUp, SpeedupCallback
from lightning_speedups._rng import BatchRandom, batch_key
from lightning_speedups.functional import cutmix_box, sample_lambda, sample_permutation


def _draws(r: BatchRandom) -> tuple:
    return r.random(), r.beta(0.2, 0.2), r.integers(7), r.permutation(16).tolist(), r.random()


def test_the_same_key_gives_the_same_draws_and_reseeding_restarts_the_stream():
    r = BatchRandom()
    first = _draws(r.reseed(42))
    assert _draws(BatchRandom().reseed(42)) == first
    assert _draws(r.reseed(42)) == first  # the object is reused: reseeding starts over, tensors included
    assert _draws(r.reseed(43)) != first


def test_the_key_tells_every_field_apart():
    grid = list(itertools.product([0, 1, 2**62], [0, 1, 7], [0, 1, 2**40], [0, 1, 2**31]))
    keys = {batch_key(seed, rank, batch, salt) for seed, rank, batch, salt in grid}
    assert len(keys) == len(grid)
    # and the draws differ between neighbouring keys in each field
    base = _draws(BatchRandom().reseed(batch_key(5, 0, 10, 3)))
    for seed, rank, batch, salt in [(6, 0, 10, 3), (5, 1, 10, 3), (5, 0, 11, 3), (5, 0, 10, 4)]:
        assert _draws(BatchRandom().reseed(batch_key(seed, rank, batch, salt)))[:3] != base[:3]


def test_draws_of_consecutive_batches_follow_their_laws():
    # one draw per reseed with consecutive batch indices, as the callbacks use it: the first draw of each
    # batch's stream must still be Beta(a, a) (or uniform) distributed across batches
    r = BatchRandom()
    lam = np.array([r.reseed(batch_key(0, 0, b, 1)).beta(0.2, 0.2) for b in range(4000)])
    u = np.array([r.reseed(batch_key(0, 0, b, 1)).random() for b in range(4000)])
    k = np.array([r.reseed(batch_key(0, 0, b, 1)).integers(5) for b in range(5000)])
    assert stats.kstest(lam, stats.beta(0.2, 0.2).cdf).pvalue > 1e-3
    assert stats.kstest(u, "uniform").pvalue > 1e-3
    assert stats.chisquare(np.bincount(k, minlength=5)).pvalue > 1e-3
    assert lam.min() >= 0 and lam.max() <= 1 and k.min() == 0 and k.max() == 4


def test_permutations_are_permutations_and_uniform_over_positions():
    r = BatchRandom()
    perms = torch.stack([r.reseed(batch_key(1, 0, b, 2)).permutation(6) for b in range(3000)])
    assert perms.dtype == torch.int64 and (perms.sort(1).values == torch.arange(6)).all()
    # where sample 0 goes: uniform over the 6 positions
    where = (perms == 0).int().argmax(1).numpy()
    assert stats.chisquare(np.bincount(where, minlength=6)).pvalue > 1e-3


def test_numpy_escape_hatch_is_seeded_from_the_stream():
    a = BatchRandom().reseed(9).numpy().normal(size=3)
    b = BatchRandom().reseed(9).numpy().normal(size=3)
    c = BatchRandom().reseed(10).numpy().normal(size=3)
    assert np.array_equal(a, b) and not np.array_equal(a, c)


def test_functional_ops_take_a_batch_random():
    r = BatchRandom().reseed(3)
    lam = sample_lambda(1.0, r)
    perm = sample_permutation(8, "cpu", r)
    box = cutmix_box((10, 10), lam, r)
    assert 0 <= lam <= 1 and sorted(perm.tolist()) == list(range(8)) and len(box) == 2
    again = BatchRandom().reseed(3)
    assert sample_lambda(1.0, again) == lam and sample_permutation(8, "cpu", again).equal(perm)


def _trainer(rank: int, batch: int, val_batch: int | None = None) -> SimpleNamespace:
    """What the draws read of a trainer: in a training batch, or in validation batch ``val_batch`` of the fit."""
    progress = SimpleNamespace(total=SimpleNamespace(started=batch, completed=batch))
    val_loop = SimpleNamespace(batch_progress=SimpleNamespace(total=SimpleNamespace(started=val_batch)))
    loop = SimpleNamespace(epoch_loop=SimpleNamespace(batch_progress=progress, val_loop=val_loop))
    stage = RunningStage.TRAINING if val_batch is None else RunningStage.VALIDATING
    state = SimpleNamespace(stage=stage, fn=TrainerFn.FITTING)
    return SimpleNamespace(global_rank=rank, fit_loop=loop, state=state)


def test_each_validation_batch_draws_its_own_and_never_a_training_batchs():
    def first(trainer):
        return cb.batch_random(trainer).random()

    cb = SpeedupCallback(seed=3)
    val = [first(_trainer(0, 5, val_batch=v)) for v in range(3)]
    assert len(set(val)) == 3  # each validation batch its own draws
    assert val[0] == first(_trainer(0, 5, val_batch=0))  # reproducibly
    assert val[0] != first(_trainer(0, 7, val_batch=0))  # the next validation run: others
    assert not {first(_trainer(0, b)) for b in range(64)} & set(val)  # never a training batch's


def test_callback_draws_depend_on_seed_rank_batch_and_class():
    def draws(cb, rank=0, batch=0):
        return _draws(cb.batch_random(_trainer(rank, batch)))

    mixup = MixUp(seed=1)
    reference = draws(mixup)
    assert draws(MixUp(seed=1)) == reference  # a fresh instance (a resumed run) draws the same
    assert draws(mixup) == reference  # and so does a second call in the same batch
    assert draws(mixup, rank=1) != reference
    assert draws(mixup, batch=1) != reference
    assert draws(MixUp(seed=2)) != reference
    assert draws(CutMix(seed=1)) != reference  # two techniques do not share their draws
    # the tensor generator is the same stream's: equal for equal keys, different otherwise
    g1 = mixup.torch_generator(_trainer(0, 5))
    x = torch.rand(4, generator=g1)
    assert torch.equal(torch.rand(4, generator=MixUp(seed=1).torch_generator(_trainer(0, 5))), x)
    assert not torch.equal(torch.rand(4, generator=mixup.torch_generator(_trainer(0, 6))), x)


@pytest.mark.parametrize("seed", [None, 0])
def test_unset_seed_falls_back_to_the_process_seed(seed):
    torch.manual_seed(77)
    cb = MixUp(seed=seed)
    other = MixUp(seed=77 if seed is None else 0)
    assert _draws(cb.batch_random(_trainer(0, 3))) == _draws(other.batch_random(_trainer(0, 3)))
