"""The index math of repeat-factor sampling and curricula, against hand computations, statistics and properties."""

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.data import Subset, TensorDataset

from lightning_speedups.data import dataset_labels
from lightning_speedups.functional import sampling as fs
from lightning_speedups.samplers import EpochListSampler, SamplingPlan

# ---------------------------------------------------------------------------------------------- repeat factors


def test_repeat_factors_by_hand():
    # 100 samples: class 0 in all, class 1 in 4 (f = 0.04), class 2 in 1 (f = 0.01); t = 0.16
    labels = [[0]] * 95 + [[0, 1]] * 4 + [[0, 1, 2, 2]]  # a class listed twice in a sample counts once
    table = fs.repeat_factor_table(labels, threshold=0.16)
    np.testing.assert_allclose(table.class_frequencies, [1.0, 0.05, 0.01])
    np.testing.assert_allclose(table.class_factors, [1.0, math.sqrt(0.16 / 0.05), 4.0])
    r = table.sample_factors
    np.testing.assert_allclose(r[:95], 1.0)
    np.testing.assert_allclose(r[95:99], math.sqrt(3.2))
    assert r[99] == pytest.approx(4.0)  # the max over the sample's labels
    no_sqrt = fs.repeat_factors(labels, threshold=0.16, sqrt=False)
    assert no_sqrt[99] == pytest.approx(16.0) and no_sqrt[0] == 1.0


def test_label_formats_agree():
    ids = np.array([0, 0, 0, 1, 2, 0, 1, 0])
    expected = fs.repeat_factors(ids, threshold=0.5)
    assert expected[4] == pytest.approx(math.sqrt(0.5 / (1 / 8)))
    np.testing.assert_allclose(fs.repeat_factors(ids.tolist(), 0.5), expected)
    np.testing.assert_allclose(fs.repeat_factors(torch.from_numpy(ids), 0.5), expected)
    np.testing.assert_allclose(fs.repeat_factors([[int(i)] for i in ids], 0.5), expected)
    multi_hot = np.eye(3, dtype=bool)[ids]
    np.testing.assert_allclose(fs.repeat_factors(multi_hot, 0.5), expected)
    # a dtype NumPy lacks (raised "unsupported ScalarType BFloat16"), and class ids held as 0-d tensors or arrays
    # (refused: "Class ids must be integers, got tensor(0)")
    np.testing.assert_allclose(fs.repeat_factors(torch.from_numpy(multi_hot).bfloat16(), 0.5), expected)
    np.testing.assert_allclose(fs.repeat_factors([[torch.tensor(int(i))] for i in ids], 0.5), expected)
    np.testing.assert_allclose(fs.repeat_factors([[np.array(i)] for i in ids], 0.5), expected)
    np.testing.assert_allclose(fs.repeat_factors([torch.tensor(i, dtype=torch.bfloat16) for i in ids], 0.5), expected)
    grad = [torch.tensor(float(i), requires_grad=True) for i in ids]  # NumPy refuses them: read one at a time
    np.testing.assert_allclose(fs.repeat_factors(grad, 0.5), expected)
    dataset = TensorDataset(torch.zeros(len(ids)), torch.from_numpy(ids).bfloat16())  # a datamodule's default
    np.testing.assert_array_equal(dataset_labels(dataset), ids)
    np.testing.assert_array_equal(dataset_labels(Subset(dataset, [4, 1])), ids[[4, 1]])
    # sparse, large class ids give the same factors as their compact equivalents
    np.testing.assert_allclose(fs.repeat_factors(ids * 10**9, 0.5), expected)

    class Series:  # an array-like that is not a Sequence (pandas, polars)
        def __init__(self, values):
            self.values = values

        def __len__(self):
            return len(self.values)

        def __array__(self, dtype=None, copy=None):
            return np.asarray(self.values, dtype=dtype)

    np.testing.assert_allclose(fs.repeat_factors(Series(ids), 0.5), expected)
    # samples without labels get 1 and count in the denominator of f(c)
    r = fs.repeat_factors([[], [1], [], []], threshold=1.0)
    np.testing.assert_allclose(r, [1.0, 2.0, 1.0, 1.0])


def test_an_integer_column_is_class_ids_and_a_boolean_or_float_column_is_one_class_multi_hot():
    import torch

    ids = np.array([0, 0, 0, 0, 0, 0, 1, 1])  # binary class ids: f(0) = 6/8, f(1) = 2/8
    expected = fs.repeat_factors(ids, threshold=1.0)
    np.testing.assert_allclose(expected, [math.sqrt(8 / 6)] * 6 + [2.0] * 2)  # both classes are repeated
    for column in (ids[:, None], ids[:, None].astype(np.uint8), torch.from_numpy(ids).unsqueeze(1)):
        np.testing.assert_allclose(fs.repeat_factors(column, threshold=1.0), expected)
    samples, classes, n = fs.label_sets(ids[:, None])
    assert samples.tolist() == list(range(8)) and classes.tolist() == ids.tolist() and n == 8
    # a column of more than two classes was refused as "not 0/1 multi-hot"
    many = np.array([0, 0, 0, 1, 2, 0, 1, 0])
    np.testing.assert_allclose(fs.repeat_factors(many[:, None], 0.5), fs.repeat_factors(many, 0.5))
    # booleans and floats stay multi-hot: one class, present or not (no labels -> factor 1, f = 2/8)
    for column in (ids[:, None].astype(bool), ids[:, None].astype(np.float32)):
        samples, classes, n = fs.label_sets(column)
        assert samples.tolist() == [6, 7] and classes.tolist() == [0, 0] and n == 8
        np.testing.assert_allclose(fs.repeat_factors(column, threshold=1.0), [1.0] * 6 + [2.0] * 2)


def test_an_object_table_of_numbers_reads_as_its_numeric_twin():
    """A mixed-type DataFrame's `to_numpy()` is a 2-D object array: a 0/1 table is multi-hot (it was read as
    lists of class ids, [1, 0, 0] listing classes 1 and 0), an integer column is class ids."""
    table = np.zeros((40, 3), dtype=np.int64)
    table[:39, 0], table[39, 2] = 1, 1  # class 2 is rare: its sample is repeated
    expected = fs.repeat_factors(table, threshold=0.2)
    assert expected[39] == pytest.approx(math.sqrt(0.2 * 40))
    np.testing.assert_allclose(fs.repeat_factors(table.astype(object), threshold=0.2), expected)
    column = np.array([[0], [2], [1]], dtype=object)
    assert fs.label_sets(column)[1].tolist() == [0, 2, 1]
    # a column of Python or NumPy booleans is one class, present or not, as a boolean array is
    for flags in ([[True], [False], [False]], [[np.True_], [np.False_], [np.False_]]):
        samples, classes, _ = fs.label_sets(np.array(flags, dtype=object))
        assert samples.tolist() == [0] and classes.tolist() == [0]
    # whole-number floats per sample pass, as in a float array; ints beside them stay exact
    assert fs.label_sets([np.array([0.0]), np.array([0.0, 1.0])])[1].tolist() == [0, 0, 1]
    assert fs.label_sets([[2**60 + 1, 1.0], [0]])[1].tolist() == [1, 2**60 + 1, 0]
    for bad, said in (([[0, 1.5], [2]], "got 1.5"), ([[0, float("nan")], [2]], "got nan")):
        with pytest.raises(ValueError, match=f"Class ids must be integers, {said}"):
            fs.label_sets(bad)
    # one label per sample in a float array: the value and the sample named (was "got dtype float64"), and NaN for
    # a missing label told to be an empty list; booleans told how to read them
    for bad, said in (
        (
            np.array([0.0, 1.0, np.nan]),
            r"got nan at sample 2 \(dtype float64\)\. Give a sample without labels an empty",
        ),
        (np.array([0.0, 1.5]), r"got 1\.5 at sample 1"),
        (np.array([True, False]), r"got booleans: `\.astype\(int\)`.*shape \(N, 1\)"),
    ):
        with pytest.raises(ValueError, match=f"Class ids must be integers, {said}"):
            fs.repeat_factors(bad, 0.5)
    for huge in ([[0, 1e19], [2]], [[2**64], [1]]):
        with pytest.raises(ValueError, match=r"Class ids must be below 2\*\*63"):
            fs.label_sets(huge)
    with pytest.raises(ValueError, match=r"multi-hot.*Got None in a 2-D object array"):
        fs.label_sets(np.array([[0], [None]], dtype=object))
    with pytest.raises(TypeError, match=r"got 'cat'\. Class names\?"):
        fs.label_sets(np.array(["cat", ["dog"]], dtype=object))


@pytest.mark.parametrize(
    ("labels", "match"),
    [
        ([0, -1, 2], "must be >= 0"),
        ([[0], [-3]], "must be >= 0"),
        (np.array([0.5, 1.0]), "must be integers"),
        ([[0], ["cat"]], r"must be integers, got 'cat'\. Class names\? Map them to ids"),
        (np.array([["cat"], ["dog"]], dtype=object), r"multi-hot.*Class names\? Map them"),
        (np.array([[0, 2], [1, 1]], dtype=object), "multi-hot"),  # as its numeric twin
        (["cat", "dog", "cat"], r"must be integers, got dtype <U3 \(e.g. class names\)"),
        (np.array([[0, 2], [1, 1]]), "multi-hot"),
        (np.array([[0.0], [2.0]]), r"multi-hot.*integer column \(N, 1\) of class ids"),
        ([], "empty"),
        # a multi-hot row inside a sample's list is no list of class ids (0-d tensors there are)
        ([[torch.tensor([0, 1, 1])], [torch.tensor([1, 0, 0])]], r"must be integers, got tensor\(\[0, 1, 1\]\)"),
    ],
)
def test_bad_labels(labels, match):
    with pytest.raises(ValueError, match=match):
        fs.repeat_factors(labels, 0.1)


def test_bad_threshold():
    with pytest.raises(ValueError, match=r"`threshold` must be a finite number > 0, got 0\.0"):
        fs.repeat_factors([0, 1], threshold=0.0)
    with pytest.raises(ValueError, match="`threshold` must be a finite number > 0, got inf"):
        fs.repeat_factors([[0], [1]], threshold=float("inf"))  # inf factors, then an OverflowError


def test_stochastic_rounding_is_unbiased():
    values = np.array([1.0, 1.25, 2.5, 3.9])
    rounded = np.stack([fs.stochastic_round(values, fs.epoch_rng(0, e, 1)) for e in range(4000)])
    assert set(np.unique(rounded[:, 1])) == {1, 2} and set(np.unique(rounded[:, 3])) == {3, 4}
    assert np.all(rounded[:, 0] == 1)
    np.testing.assert_allclose(rounded.mean(0), values, atol=4 * 0.5 / math.sqrt(4000))


def long_tailed_labels(num_classes=10, head=2000, ratio=0.5, seed=0):
    counts = np.maximum(1, (head * ratio ** np.arange(num_classes)).astype(int))
    labels = np.repeat(np.arange(num_classes), counts)
    return np.random.default_rng(seed).permutation(labels), counts


def test_class_frequencies_over_many_epochs_match_the_repeat_factors():
    """Each class's share of the samples drawn over 300 epochs is what the repeat factors say."""
    labels, counts = long_tailed_labels()  # 2000, 1000, ..., 3 samples
    table = fs.repeat_factor_table(labels, threshold=0.05)
    r = table.sample_factors
    length = fs.epoch_length(r)
    epochs = 300
    drawn = np.zeros(len(labels))
    lengths = set()
    for epoch in range(epochs):
        e = fs.repeat_factor_epoch(r, seed=3, epoch=epoch)
        lengths.add(len(e))
        drawn += np.bincount(e, minlength=len(labels))
    assert lengths == {length}  # constant epoch length
    per_class = np.bincount(labels, weights=drawn) / epochs
    expected = counts * table.class_factors
    # Per epoch, a class count varies by the rounding of its samples (variance <= n_c / 4) and by the
    # padding/truncation to a fixed length (|M - L| ~ sqrt(N / 4) entries, drawn proportionally).
    slack = math.sqrt(len(labels) / 4)
    sd = np.sqrt(counts / 4 + expected / length * slack + 1) / math.sqrt(epochs)
    assert np.all(np.abs(per_class - expected) < 5 * sd + 0.002 * expected), (per_class, expected)
    # rare classes are oversampled: the rarest by sqrt(0.05 / f) ~ 5.2x
    assert per_class[-1] / counts[-1] > 4.5 and per_class[0] / counts[0] == pytest.approx(1.0, abs=0.01)
    # and per sample: each appears r_i times per epoch on average
    assert np.abs(drawn / epochs - r).max() < 0.2


def test_repeat_factor_epochs_differ_per_epoch_and_repeat_per_seed():
    r = fs.repeat_factors(long_tailed_labels(head=200)[0], threshold=0.2)
    a, b = fs.repeat_factor_epoch(r, seed=1, epoch=0), fs.repeat_factor_epoch(r, seed=1, epoch=1)
    assert not np.array_equal(a, b)
    np.testing.assert_array_equal(a, fs.repeat_factor_epoch(r, seed=1, epoch=0))
    assert not np.array_equal(a, fs.repeat_factor_epoch(r, seed=2, epoch=0))


# ---------------------------------------------------------------------------------------------- pacing


def test_pacing_functions_by_hand():
    steps = np.array([0, 10, 20, 40, 80, 100])
    total = 100  # full_at 0.4 -> all data at step 40

    def pace(kind):
        return fs.Pacing(kind, start=0.2, full_at=0.4).fraction(steps, total)

    np.testing.assert_allclose(pace("linear"), [0.2, 0.4, 0.6, 1.0, 1.0, 1.0])
    np.testing.assert_allclose(pace("quad"), [0.2, 0.25, 0.4, 1.0, 1.0, 1.0])
    np.testing.assert_allclose(pace("root"), [0.2, 0.6, 0.2 + 0.8 * math.sqrt(0.5), 1.0, 1.0, 1.0])
    np.testing.assert_allclose(pace("step"), [0.2, 0.2, 0.2, 1.0, 1.0, 1.0])
    exp = pace("exp")
    assert exp[0] == pytest.approx(0.2) and exp[3] == pytest.approx(1.0)
    assert exp[1] == pytest.approx(0.2 + 0.8 * math.expm1(2.5) / math.expm1(10))
    log = pace("log")
    assert log[0] == pytest.approx(0.2) and log[3] == pytest.approx(1.0)
    assert log[2] == pytest.approx(0.2 + 0.8 * (1 + math.log(0.5 + math.exp(-10)) / 10))
    for kind in ("linear", "quad", "root", "exp", "log"):
        assert np.all(np.diff(pace(kind)) >= 0), kind
    # Hacohen & Weinshall: 0.04, x1.9 every 100 steps
    fixed = fs.Pacing("fixed_exponential", start=0.04, growth=1.9, step_length=100)
    np.testing.assert_allclose(fixed.fraction([0, 99, 100, 250, 600]), [0.04, 0.04, 0.076, 0.1444, 1.0])


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"start": 0.0}, r"`start_fraction` must be in \(0, 1\]"),
        ({"start": 1.5}, r"`start_fraction` must be in \(0, 1\]"),
        ({"start": -0.2}, r"`start_fraction` must be in \(0, 1\]"),
        ({"kind": "cosine"}, "`pacing` must be one of"),
        ({"full_at": 0.0}, "`full_at` must be > 0"),
        ({"growth": 1.0}, "`growth` must be > 1"),
        ({"step_length": 0}, "`step_length` must be an int >= 1"),
    ],
)
def test_bad_pacing(kwargs, match):
    with pytest.raises(ValueError, match=match):
        fs.Pacing(**kwargs)


def test_step_pacing_opens_all_the_data_at_its_step_despite_float_rounding():
    # 0.07 x 100 = 7.000000000000001: u was just below 1 at step 7, so all the data came a step late
    for full_at, total, at in ((0.07, 100, 7), (0.14, 100, 14), (0.28, 50, 14)):
        pace = fs.Pacing("step", start=0.2, full_at=full_at).fraction([at - 1, at], total)
        np.testing.assert_array_equal(pace, [0.2, 1.0])


def test_pacing_over_the_run_needs_its_length():
    with pytest.raises(ValueError, match="set `max_epochs` or `max_steps`"):
        fs.Pacing("linear").fraction([0], math.inf)


def test_step_clock():
    clock = fs.StepClock(global_batch_size=8, batches_per_epoch=5, accumulate=2, total_steps=9)
    assert clock.steps_per_epoch == 3  # Lightning steps at the end of the epoch with a partial accumulation
    np.testing.assert_array_equal(clock.batch_steps(7, epoch=1), [3, 3, 4, 4, 5, 5, 5])
    assert clock.step_of(4, epoch=2) == 8


# ---------------------------------------------------------------------------------------------- curricula


def test_difficulty_order_ties_tasks_and_anti():
    d = np.array([0.5, 0.1, 0.5, 0.3, 0.5])
    order = fs.difficulty_order(d, seed=0)
    assert order[:2].tolist() == [1, 3] and sorted(order[2:].tolist()) == [0, 2, 4]
    ties = {tuple(fs.difficulty_order(d, seed=s)[2:].tolist()) for s in range(20)}
    assert len(ties) > 1  # equal difficulties are not kept in dataset order
    assert fs.difficulty_order(d, anti=True, seed=0).tolist() == order[::-1].tolist()
    tasks = np.array([2, 2, 7, 7, 2])
    by_mean = fs.difficulty_order(d, tasks=tasks)  # by mean difficulty: task 2 (0.367) before task 7 (0.4)
    assert by_mean[0] == 1 and set(by_mean[:3].tolist()) == {0, 1, 4}
    assert fs.difficulty_order(d, tasks=tasks, task_order=[7, 2])[:2].tolist() == [3, 2]
    assert sorted(fs.difficulty_order(None, tasks=tasks, task_order=[7, 2])[:2].tolist()) == [2, 3]
    with pytest.raises(ValueError, match=r"does not list the tasks \[7\]"):
        fs.difficulty_order(d, tasks=tasks, task_order=[2])
    with pytest.raises(ValueError, match=r"lists the tasks \[7\] more than once"):
        fs.difficulty_order(d, tasks=tasks, task_order=[7, 2, 7])


def test_curriculum_epoch_draws_from_the_pool_of_each_batch():
    n, batch = 100, 10
    order = np.random.default_rng(0).permutation(n)
    pools = np.array([5, 5, 20, 50, 100, 100])
    unpaced = np.arange(60)[::-1]
    e = fs.curriculum_epoch(order, pools, batch, 60, seed=0, epoch=0, unpaced=unpaced)
    rank = np.empty(n, int)
    rank[order] = np.arange(n)
    for b, pool in enumerate(pools[:4]):
        assert rank[e[b * batch : (b + 1) * batch]].max() < pool
    assert e[40:].tolist() == unpaced[40:].tolist()  # all data available: the shuffled list's entries
    # a shard draws what the whole list has at its positions
    # (ranks that divide the batch take whole runs of it; 3 does not; 57 positions end in a partial batch)
    part = fs.curriculum_epoch(order, pools, batch, 57, seed=0, epoch=0, unpaced=unpaced[:57])
    assert part.tolist() == e[:57].tolist()
    for world in (2, 3, 5):
        for r in range(world):
            shard = fs.curriculum_epoch(
                order, pools, batch, 57, seed=0, epoch=0, unpaced=unpaced[r:57:world], rank=r, num_replicas=world
            )
            assert shard.tolist() == e[r:57:world].tolist()
    assert len(set(e[:10].tolist())) <= 5
    # with counts, a sample is drawn in proportion to its count within the pool
    counts = np.ones(n, int)
    counts[order[0]] = 9  # the easiest sample: 9 of the 10 entries of a pool of 2
    big = fs.curriculum_epoch(order, np.full(400, 2), 10, 4000, seed=1, epoch=0, counts=counts)
    assert np.mean(big == order[0]) == pytest.approx(0.9, abs=0.03)
    counts[order[0]] = 999  # beyond uint8; and a zero count still leaves its sample in the pool, once
    counts[order[1]] = 0
    big = fs.curriculum_epoch(order, np.full(400, 2), 10, 4000, seed=1, epoch=0, counts=counts)
    assert np.mean(big == order[0]) == pytest.approx(999 / 1000, abs=0.003)
    assert set(big.tolist()) <= {order[0], order[1]}


# ---------------------------------------------------------------------------------------------- properties


def make_plan(n, seed, factors_seed=None, curriculum=False, batch=4):
    plan = SamplingPlan(num_samples=n, seed=seed)
    if factors_seed is not None:
        labels = np.random.default_rng(factors_seed).integers(0, 5, n) ** 2  # uneven classes
        plan.add_repeat_factors(fs.repeat_factors(labels, threshold=0.3), seed=seed)
    if curriculum:
        order = np.random.default_rng(seed + 1).permutation(n)
        plan.add_curriculum(order, fs.Pacing("linear", start=0.1, full_at=0.8), seed=seed)
    return plan


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(1, 300),
    world=st.integers(1, 8),
    seed=st.integers(0, 2**31 - 1),
    epoch=st.integers(0, 50),
    repeat=st.booleans(),
    curriculum=st.booleans(),
    drop_last=st.booleans(),
)
def test_shards_are_equal_disjoint_and_deterministic(n, world, seed, epoch, repeat, curriculum, drop_last):
    plan = make_plan(n, seed, factors_seed=seed if repeat else None, curriculum=curriculum)
    samplers = [
        EpochListSampler(range(n), plan, epoch=epoch, num_replicas=world, rank=r, drop_last=drop_last)
        for r in range(world)
    ]
    per_rank = samplers[0].num_samples
    plan.clock = fs.StepClock(global_batch_size=4 * world, batches_per_epoch=-(-per_rank // 4), total_steps=50)
    expected = per_rank if drop_last and plan.length >= world else -(-plan.length // world)
    assert per_rank == expected and per_rank * world >= (plan.length - world + 1)
    shards = [list(s) for s in samplers]
    assert all(len(s) == per_rank == len(sampler) for s, sampler in zip(shards, samplers, strict=True))
    assert all(0 <= i < n for s in shards for i in s)
    # disjoint positions: rank r holds positions r, r + W, ... of one epoch list shared by all ranks
    full = samplers[0].epoch_indices()
    for r, s in enumerate(shards):
        assert s == full[r::world].tolist()
    # every rank (and a rebuilt sampler, as in a resumed run) derives the same list from (seed, epoch)
    again = EpochListSampler(range(n), plan, epoch=epoch, num_replicas=world, rank=0, drop_last=drop_last)
    np.testing.assert_array_equal(again.epoch_indices(), full)
    assert samplers[-1].epoch_indices().tolist() == full.tolist()
    # skipping applies to the next pass only
    samplers[0].skip_next(3)
    assert list(samplers[0]) == shards[0][3:] and list(samplers[0]) == shards[0]


@settings(max_examples=40, deadline=None)
@given(n=st.integers(2, 400), seed=st.integers(0, 1000), epoch=st.integers(0, 5), world=st.integers(1, 8))
def test_without_a_curriculum_or_repeats_an_epoch_is_a_permutation(n, seed, epoch, world):
    plan = SamplingPlan(num_samples=n, seed=seed)
    e = plan.epoch_indices(epoch)
    assert sorted(e.tolist()) == list(range(n))
    total = fs.shard_size(n, world) * world
    padded = plan.epoch_indices(epoch, total)
    assert padded[:n].tolist() == e.tolist()  # padding appends, cyclically
    assert np.bincount(padded, minlength=n).min() >= 1


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 200), seed=st.integers(0, 1000), epoch=st.integers(0, 3))
def test_repeat_factor_epochs_have_the_fixed_length_and_the_rounded_counts(n, seed, epoch):
    r = 1 + np.random.default_rng(seed).random(n) * 3
    e = fs.repeat_factor_epoch(r, seed=seed, epoch=epoch)
    assert len(e) == fs.epoch_length(r) == max(1, round(r.sum()))
    counts = fs.repeat_factor_counts(r, seed=seed, epoch=epoch)
    assert np.all((counts == np.floor(r)) | (counts == np.floor(r) + 1))
    drawn = np.bincount(e, minlength=n)
    if counts.sum() >= len(e):  # truncated: never more than its count
        assert np.all(drawn <= counts)
    else:  # padded: at least its count
        assert np.all(drawn >= counts)


# ---------------------------------------------------------------------------------------------- index dtypes


def test_index_dtype_is_chosen_from_the_largest_index():
    assert fs.index_dtype(0) is np.int32 and fs.index_dtype(2**31 - 1) is np.int32
    assert fs.index_dtype(2**31) is np.int64 and fs.index_dtype(5 * 10**9) is np.int64


@pytest.mark.parametrize("min_count", [1, 0], ids=["every-sample", "some-dropped"])
def test_repeated_entries_past_the_small_index_range_keep_their_sample(monkeypatch, min_count):
    # At int32 this needs sum(counts) >= 2**31 entries while the dataset has fewer than 2**31 samples. The same
    # code runs here with int8 as the "small" dtype: 100 samples fit it, the 300 positions of the multiset do not.
    counts = np.random.default_rng(0).integers(min_count, 6, size=100)
    counts[:3] = 5  # some positions past 127 for sure
    size = int(counts.sum())
    assert size > 127
    reference = fs.shuffled_epoch(100, size, seed=4, epoch=1, counts=counts)  # int32 throughout
    monkeypatch.setattr(fs, "_SMALL_INDEX", np.int8)
    out = fs.shuffled_epoch(100, size, seed=4, epoch=1, counts=counts)
    assert out.dtype == np.int8  # sample ids up to 99 fit the small dtype, as they should
    np.testing.assert_array_equal(np.bincount(out, minlength=100), counts)  # each sample its count, none wrapped
    np.testing.assert_array_equal(out, reference)  # the very same epoch as with int32


def test_a_pool_of_zero_samples_is_refused():
    order = np.arange(10)
    for counts in (None, np.ones(10, int)):
        with pytest.raises(ValueError, match="`batch_pools` must be >= 1"):
            fs.curriculum_epoch(order, np.array([0, 5]), 4, 8, seed=0, epoch=0, counts=counts)


def test_pacing_takes_numpy_scalars_and_refuses_bools():
    p = fs.Pacing("fixed_exponential", start=np.float32(0.25), growth=np.float64(2.0), step_length=np.int64(10))
    assert p == fs.Pacing("fixed_exponential", start=0.25, growth=2.0, step_length=10)
    assert type(p.start) is float and type(p.step_length) is int
    assert p.fraction([0, 10, 20]).tolist() == [0.25, 0.5, 1.0]
    with pytest.raises(ValueError, match="`step_length` must be an int >= 1"):
        fs.Pacing(step_length=True)
    with pytest.raises(ValueError, match="`start_fraction` must be in"):
        fs.Pacing(start=True)


def test_stochastic_round_of_a_scalar():
    got = [int(fs.stochastic_round(2.5, np.random.default_rng(s))) for s in range(200)]
    assert set(got) == {2, 3}
    assert fs.stochastic_round(np.float64(4.0), np.random.default_rng(0)).shape == ()


def test_stochastic_round_refuses_values_that_are_not_finite():
    # NaN and inf became the most negative int64, with a NumPy warning at best
    for bad in (np.nan, np.inf, -np.inf):
        with pytest.raises(ValueError, match="must be finite"):
            fs.stochastic_round(np.array([1.5, bad]), np.random.default_rng(0))


def test_shuffled_epoch_counts_need_one_per_sample():
    # a single count broadcast over every sample, silently: samples 2 to 4 never appeared
    with pytest.raises(ValueError, match=r"one count per sample, shape \(5,\); got \(1,\)"):
        fs.shuffled_epoch(5, 12, seed=0, epoch=0, counts=np.array([2]))
    with pytest.raises(ValueError, match="one count per sample"):
        fs.shuffled_epoch(5, 12, seed=0, epoch=0, counts=[1, 2, 3])


def test_rank_and_num_replicas_are_checked():
    with pytest.raises(ValueError, match=r"`rank` must be in \[0, 4\)"):
        fs.shuffled_epoch(5, 8, seed=0, epoch=0, rank=5, num_replicas=4)
    with pytest.raises(ValueError, match=r"`rank` must be in \[0, 2\)"):
        fs.shuffled_epoch(5, 8, seed=0, epoch=0, rank=-1, num_replicas=2)
    with pytest.raises(ValueError, match="`num_replicas` must be >= 1"):
        fs.shard(np.arange(3), 0, 0)
    with pytest.raises(ValueError, match="`num_replicas` must be >= 1"):
        fs.curriculum_epoch(np.arange(10), np.array([5, 5]), 4, 8, seed=0, epoch=0, num_replicas=0)


@pytest.mark.parametrize(
    "factors", [[1.0] * 50, [1.0] * 40 + [2.0] * 10, [1.0] * 40 + [1.7] * 10, [0.0] * 5 + [1.0] * 45]
)
def test_a_plan_gives_the_epoch_lists_of_rounding_its_factors_each_epoch(factors):
    factors = np.array(factors)
    plan = SamplingPlan(num_samples=len(factors), seed=3)
    plan.add_repeat_factors(factors, seed=3)  # whole-number factors take a shortcut: no draw, or no counts at all
    for epoch in range(3):
        counts = fs.repeat_factor_counts(factors, seed=3, epoch=epoch)
        expected = fs.shuffled_epoch(len(factors), plan.length, seed=3, epoch=epoch, counts=counts)
        np.testing.assert_array_equal(plan.epoch_indices(epoch), expected)
        np.testing.assert_array_equal(plan.epoch_indices(epoch, rank=1, num_replicas=2), expected[1::2])


def test_bad_shapes_and_lengths_are_refused():
    with pytest.raises(
        ValueError, match=r"`difficulty` must hold one value per sample, shape \(N,\); got shape \(4, 1\)"
    ):
        fs.difficulty_order(np.array([[0.3], [0.1], [0.2], [0.0]]))  # argsort of a column repeated one sample
    with pytest.raises(ValueError, match="`difficulty` has 3 values and `tasks` 2"):
        fs.difficulty_order(np.array([0.3, 0.1, 0.2]), tasks=np.array([0, 1]))
    with pytest.raises(ValueError, match="`length` must be >= 0"):
        fs.shuffled_epoch(5, -2, seed=0, epoch=0)
    with pytest.raises(ValueError, match="accumulate=0"):
        fs.StepClock(global_batch_size=8, batches_per_epoch=4, accumulate=0)


def test_bad_scores_factors_and_counts_are_clear_errors_not_a_wrong_order_or_a_crash_later():
    # NaN sorted last: silently the hardest (with tasks, its whole task moved to the end)
    with pytest.raises(ValueError, match=r"`difficulty` has NaN scores \(the first at index 1\)"):
        fs.difficulty_order(np.array([0.5, np.nan, 0.1, 0.3]))
    assert fs.difficulty_order(np.array([0.5, np.inf, 0.1]), seed=0).tolist() == [2, 0, 1]  # inf: the hardest
    for factors in ([1.0, np.nan], [1.0, -1.0], [[1.0, 2.0]]):
        with pytest.raises(ValueError, match="`factors` must be one finite number >= 0 per sample"):
            fs.repeat_factor_epoch(np.array(factors), seed=0, epoch=0)
    # factors all below 1: some epoch rounds every one down, and had no sample to draw (epoch 2 of this seed)
    plan = SamplingPlan(num_samples=3, seed=0)
    with pytest.raises(ValueError, match=r"at least one repeat factor must be >= 1 \(the largest is 0.4\)"):
        plan.add_repeat_factors(np.array([0.0, 0.4, 0.4]), seed=0, source="mine")
    order = np.arange(4)
    with pytest.raises(ValueError, match="`counts` has 3 values for 4 samples"):
        fs.curriculum_epoch(order, np.array([2]), 4, 4, seed=0, epoch=0, counts=np.ones(3, dtype=np.int64))
    empty = fs.curriculum_epoch(order, np.array([2]), 4, 0, seed=0, epoch=0, counts=np.ones(4, dtype=np.int64))
    assert empty.tolist() == []
