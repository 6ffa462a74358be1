"""The pure math of linear scaling and warmup: batch scale, warmup length and the factor per update."""

import itertools
import math
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from lightning_speedups.functional import (
    batch_scale,
    global_batch_size,
    steps_per_epoch,
    warmup_factor,
    warmup_length,
)


def test_goyal_numbers():
    """The paper's ImageNet setting: 256 GPUs x 32 = 8k samples, lr 0.1 per 256 -> 3.2, warmup 5 epochs."""
    k = batch_scale(global_batch_size(32, world_size=256), 256)
    assert k == 32 and 0.1 * k == pytest.approx(3.2)
    per_epoch = steps_per_epoch(1_281_167 // 8192)
    assert warmup_length(5, "epochs", steps_per_epoch=per_epoch) == 5 * 156
    assert warmup_factor(0, 780, k) == 1.0  # starts at the unscaled lr
    assert warmup_factor(390, 780, k) == pytest.approx(16.5)  # halfway
    assert warmup_factor(780, 780, k) == 32.0


@pytest.mark.parametrize(
    ("batch", "acc", "world", "ref", "rule", "expected"),
    [
        (16, 1, 1, 8, "linear", 2.0),
        (16, 2, 1, 8, "linear", 4.0),
        (16, 2, 2, 8, "linear", 8.0),
        (64, 1, 1, 256, "linear", 0.25),
        (64, 2, 2, 64, "sqrt", 2.0),
        (32, 1, 1, 128, "sqrt", 0.5),
    ],
)
def test_batch_scale(batch, acc, world, ref, rule, expected):
    assert batch_scale(global_batch_size(batch, acc, world), ref, rule) == pytest.approx(expected)


@pytest.mark.parametrize(("batches", "acc", "steps"), [(4, 1, 4), (4, 2, 2), (5, 2, 3), (1, 4, 1), (0, 2, 0)])
def test_steps_per_epoch_counts_the_last_partial_window(batches, acc, steps):
    assert steps_per_epoch(batches, acc) == steps


def test_warmup_length_units():
    assert warmup_length(7, "steps") == 7
    assert warmup_length(1.5, "epochs", steps_per_epoch=2) == 3
    assert warmup_length(0.25, "fraction", total_steps=40) == 10
    assert warmup_length(0.001, "fraction", total_steps=40) == 1  # a positive warmup lasts at least one update
    assert warmup_length(0, "epochs", steps_per_epoch=100) == 0


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"warmup": -1, "unit": "steps"}, ValueError, "turns the warmup off"),
        ({"warmup": 2.5, "unit": "steps"}, ValueError, "whole number"),
        ({"warmup": 1.5, "unit": "fraction", "total_steps": 10}, ValueError, r"\[0, 1\]"),
        ({"warmup": 0.5, "unit": "fraction"}, ValueError, "total_steps"),
        ({"warmup": 0.5, "unit": "fraction", "total_steps": math.inf}, ValueError, "total_steps"),
        ({"warmup": 1, "unit": "epochs"}, ValueError, "steps_per_epoch"),
        ({"warmup": 1, "unit": "hours"}, ValueError, "unit"),
        ({"warmup": "5", "unit": "steps"}, TypeError, "finite number"),
    ],
)
def test_warmup_length_rejects(kwargs, error, match):
    with pytest.raises(error, match=match):
        warmup_length(**kwargs)


def test_factor_from_zero_spends_no_update_at_zero():
    factors = [warmup_factor(t, 3, scale=2.0, start="zero") for t in range(5)]
    assert factors == pytest.approx([0.5, 1.0, 1.5, 2.0, 2.0])


def test_no_warmup_and_small_batches():
    assert warmup_factor(0, 0, scale=4.0) == 4.0
    # below the reference batch there is nothing to warm up to from the unscaled lr: scale at once
    assert [warmup_factor(t, 4, scale=0.5) for t in range(3)] == [0.5, 0.5, 0.5]
    assert warmup_factor(0, 4, scale=0.5, start="zero") == pytest.approx(0.1)


def test_factor_at_a_fractional_update_interpolates_the_ramp():
    # an epoch warmup whose updates per epoch changed is at a fractional update of its current length
    assert warmup_factor(Fraction(3, 2), 4, scale=3.0) == pytest.approx(1.75)  # 1 + (3 - 1) * 1.5 / 4
    assert warmup_factor(2.5, 4, scale=3.0, start="zero") == pytest.approx(3.0 * 3.5 / 5)
    assert warmup_factor(Fraction(4), 4, scale=3.0) == 3.0
    whole = [warmup_factor(t, 4, 3.0) for t in range(5)]
    assert [warmup_factor(Fraction(t), 4, 3.0) for t in range(5)] == whole  # the same as counting updates


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: batch_scale(0, 256), "global_batch"),
        (lambda: batch_scale(256, 0), "reference_batch_size"),
        (lambda: batch_scale(256, 256, rule="cubic"), "rule"),
        (lambda: global_batch_size(8, accumulate_grad_batches=0), "accumulate_grad_batches"),
        (lambda: warmup_factor(-1, 4, 2.0), "step"),
        (lambda: warmup_factor(float("nan"), 4, 2.0), "step"),  # would be a NaN learning rate
        (lambda: warmup_factor(0, 4, 0.0), "scale"),
        (lambda: warmup_factor(1, 4, float("inf")), "scale"),  # (inf - 1) x 0 in the ramp: NaN
        (lambda: warmup_factor(0, 4, 2.0, start="one"), "start"),
    ],
)
def test_bad_arguments(call, match):
    with pytest.raises(ValueError, match=match):
        call()


@given(
    warmup=st.integers(1, 500),
    scale=st.floats(0.05, 64),
    start=st.sampled_from(["unscaled", "zero"]),
)
def test_factor_is_a_monotone_ramp_that_ends_at_the_scale(warmup, scale, start):
    factors = [warmup_factor(t, warmup, scale, start) for t in range(warmup + 3)]
    assert all(0 < f <= scale * (1 + 1e-12) for f in factors)
    assert all(b >= a - 1e-12 for a, b in itertools.pairwise(factors))
    assert factors[warmup:] == [scale] * 3
    if warmup > 1 and scale > 1:
        assert factors[warmup - 1] < scale  # the ramp really lasts `warmup` updates


def test_numpy_integers_are_ints():
    assert global_batch_size(np.int64(64), np.int32(2), np.int64(4)) == 512
    assert type(global_batch_size(np.int64(64))) is int
    assert batch_scale(np.int64(512), np.int64(256)) == 2.0
    assert steps_per_epoch(np.int64(5), np.int64(2)) == 3
    with pytest.raises(ValueError, match="`batch_size` must be a positive int"):
        global_batch_size(True)


def test_a_warmup_length_rounds_halves_up_not_to_even():
    assert [warmup_length(0.5, "epochs", steps_per_epoch=n) for n in (5, 7)] == [3, 4]  # 2.5 -> 3, 3.5 -> 4
    assert warmup_length(0.5, "fraction", total_steps=9) == 5


@pytest.mark.parametrize("steps", [0, -3, None])
def test_an_epoch_warmup_needs_a_positive_epoch_length(steps):
    with pytest.raises(ValueError, match="`steps_per_epoch` >= 1"):
        warmup_length(5, "epochs", steps_per_epoch=steps)


def test_a_bad_start_and_a_negative_run_length_are_clear_errors_wherever_the_ramp_is():
    from lightning_speedups.functional import warmup_factor, warmup_length

    for step, steps in ((5, 4), (0, 0), (1, 4)):  # after the ramp and without one too, not only during it
        with pytest.raises(ValueError, match="`start` must be one of"):
            warmup_factor(step, steps, scale=2.0, start="zeros")
    with pytest.raises(ValueError, match="finite `total_steps` >= 0, got -5"):
        warmup_length(0.1, "fraction", total_steps=-5)
