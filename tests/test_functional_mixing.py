"""The math of MixUp, CutMix and label smoothing against hand computation."""

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from lightning_speedups.functional import (
    as_probabilities,
    box_lambda,
    cut_and_paste,
    cutmix_batch,
    cutmix_box,
    mix,
    mixup_batch,
    sample_lambda,
    smooth_labels,
)


def test_mix_equals_convex_combination_by_hand():
    x = torch.tensor([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]])
    y = torch.tensor([0, 2, 1])
    perm = torch.tensor([2, 0, 1])
    mx, my = mix(x, y, 0.25, perm, num_classes=3)
    # sample 0 mixes with sample 2: 0.25*[1,2] + 0.75*[5,6] = [4, 5]
    assert torch.allclose(mx[0], torch.tensor([4.0, 5.0]))
    # its target: 0.25*onehot(0) + 0.75*onehot(1)
    assert torch.allclose(my[0], torch.tensor([0.25, 0.75, 0.0]))
    assert torch.allclose(mx[1], torch.tensor([0.25 * 3 + 0.75 * 1, 0.25 * 4 + 0.75 * 2]))
    assert torch.allclose(my[1], torch.tensor([0.75, 0.0, 0.25]))


def test_mix_and_cutmix_keep_the_memory_layout():
    x = torch.rand(4, 3, 6, 6)
    y = torch.tensor([0, 1, 2, 0])
    perm = torch.tensor([1, 2, 3, 0])
    for layout in (torch.contiguous_format, torch.channels_last):
        xl = x.contiguous(memory_format=layout)
        mx, _ = mix(xl, y, 0.3, perm, num_classes=3)
        assert mx.is_contiguous(memory_format=layout)
        assert torch.allclose(mx, 0.3 * x + 0.7 * x[perm])
        cx, _, _ = cut_and_paste(xl, y, (slice(1, 4), slice(2, 5)), perm, 3)
        assert cx.is_contiguous(memory_format=layout)
    transposed = x.transpose(2, 3)  # not dense in any standard layout: still mixed right
    assert torch.allclose(mix(transposed, y, 0.3, perm, 3)[0], 0.3 * transposed + 0.7 * transposed[perm])


def test_mixup_batch_matches_drawn_lambda_and_partner():
    x, y = torch.randn(8, 3, 4, 4), torch.randint(0, 5, (8,))
    mx, my, lam, perm = mixup_batch(x, y, alpha=0.4, num_classes=5, generator=3)
    onehot = F.one_hot(y, 5).float()
    assert 0.0 <= lam <= 1.0
    assert sorted(perm.tolist()) == list(range(8))
    assert torch.allclose(mx, lam * x + (1 - lam) * x[perm], atol=1e-6)
    assert torch.allclose(my, lam * onehot + (1 - lam) * onehot[perm], atol=1e-6)
    assert torch.allclose(my.sum(1), torch.ones(8))


def test_mixup_is_reproducible_from_its_generator_and_does_not_mutate():
    x, y = torch.randn(6, 2), torch.randint(0, 3, (6,))
    x0 = x.clone()
    a = mixup_batch(x, y, num_classes=3, generator=np.random.default_rng(7))
    b = mixup_batch(x, y, num_classes=3, generator=np.random.default_rng(7))
    assert torch.equal(a[0], b[0]) and a[2] == b[2]
    assert torch.equal(x, x0)


def test_mixed_soft_target_loss_equals_weighted_hard_losses():
    logits = torch.randn(5, 4)
    y = torch.tensor([0, 1, 2, 3, 0])
    perm = torch.tensor([1, 2, 3, 4, 0])
    lam = 0.3
    _, my = mix(torch.zeros(5, 1), y, lam, perm, num_classes=4)
    expected = lam * F.cross_entropy(logits, y) + (1 - lam) * F.cross_entropy(logits, y[perm])
    assert torch.allclose(F.cross_entropy(logits, my), expected, atol=1e-6)


def test_sample_lambda_follows_beta():
    rng = np.random.default_rng(0)
    draws = np.array([sample_lambda(0.2, rng) for _ in range(4000)])
    # Beta(0.2, 0.2): mean 0.5, variance ab/((a+b)^2 (a+b+1)) = 0.04/(0.16*1.4) = 0.1786
    assert abs(draws.mean() - 0.5) < 0.03
    assert abs(draws.var() - 0.04 / (0.16 * 1.4)) < 0.02


def test_cutmix_lambda_is_the_kept_area_share():
    x = torch.zeros(2, 1, 10, 10)
    x[1] = 1.0
    y = torch.tensor([0, 1])
    box = (slice(2, 6), slice(3, 8))  # 4 x 5 = 20 of 100 pixels
    out, target, lam = cut_and_paste(x, y, box, torch.tensor([1, 0]), num_classes=2)
    assert lam == pytest.approx(0.8)
    assert out[0].sum().item() == 20.0  # the partner's ones were pasted in the box only
    assert out[0, 0, 2:6, 3:8].eq(1).all() and out[1, 0, 2:6, 3:8].eq(0).all()
    assert torch.allclose(target[0], torch.tensor([0.8, 0.2]))
    assert torch.allclose(target[1], torch.tensor([0.2, 0.8]))


@settings(max_examples=60, deadline=None)
@given(
    h=st.integers(1, 40),
    w=st.integers(1, 40),
    lam=st.floats(0.0, 1.0),
    seed=st.integers(0, 2**31),
)
def test_cutmix_box_area_and_lambda(h, w, lam, seed):
    box = cutmix_box((h, w), lam, seed)
    for s, size in zip(box, (h, w), strict=True):
        assert 0 <= s.start <= s.stop <= size
    kept = box_lambda((h, w), box)
    # Clipping only shrinks the box, so the kept share is at least the requested one (up to rounding).
    cut = [round(size * math.sqrt(1 - lam)) for size in (h, w)]
    assert kept >= 1 - (cut[0] * cut[1]) / (h * w) - 1e-9
    x = torch.arange(2 * h * w, dtype=torch.float32).reshape(2, 1, h, w)
    out, _, got = cut_and_paste(x, torch.tensor([0, 1]), box, torch.tensor([1, 0]), num_classes=2)
    changed = (out[0] != x[0]).float().mean().item()
    assert got == pytest.approx(kept)
    assert changed == pytest.approx(1 - kept)


def test_cutmix_batch_one_and_three_spatial_dims():
    seq = torch.randn(4, 2, 50)
    out, tgt, lam, perm = cutmix_batch(seq, torch.tensor([0, 1, 2, 3]), num_classes=4, generator=1)
    assert out.shape == seq.shape
    onehot = torch.eye(4)
    assert torch.allclose(tgt, lam * onehot + (1 - lam) * onehot[perm])
    vol = torch.randn(2, 1, 6, 6, 6)
    out, _, lam, _ = cutmix_batch(vol, torch.tensor([0, 1]), num_classes=2, generator=2)
    assert out.shape == vol.shape and 0.0 <= lam <= 1.0


def test_smoothed_targets_sum_to_one_and_match_torch_label_smoothing():
    logits = torch.randn(7, 5)
    y = torch.randint(0, 5, (7,))
    soft = smooth_labels(y, 0.1, num_classes=5)
    assert torch.allclose(soft.sum(1), torch.ones(7))
    # by hand: 1 - eps + eps/C on the true class, eps/C elsewhere
    assert torch.allclose(soft[torch.arange(7), y], torch.full((7,), 0.9 + 0.02))
    assert torch.allclose(F.cross_entropy(logits, soft), F.cross_entropy(logits, y, label_smoothing=0.1))


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.uint8])
def test_smoothed_class_indices_equal_smoothed_one_hot_probabilities(dtype):
    y = torch.tensor([2, 0, 3, 3, 1], dtype=dtype)
    from_indices = smooth_labels(y, 0.2, num_classes=4)
    from_probs = smooth_labels(F.one_hot(y.long(), 4).float(), 0.2)
    assert from_indices.dtype == torch.float32
    torch.testing.assert_close(from_indices, from_probs)
    assert torch.allclose(from_indices[torch.arange(5), y.long()], torch.full((5,), 0.8 + 0.05))
    assert torch.allclose(from_indices.sum(1), torch.ones(5))


@pytest.mark.parametrize("num_classes", [4, 1100])  # a cached table up to 1024 classes, a scatter beyond
@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.int16, torch.uint8])
def test_one_hot_and_smoothed_rows_by_hand(num_classes, dtype):
    y = torch.tensor([2, 0, 3, 3, 1], dtype=dtype)
    expected = torch.zeros(5, num_classes)
    expected[torch.arange(5), y.long()] = 1.0
    one_hot = as_probabilities(y, num_classes)
    assert one_hot.dtype == torch.float32 and torch.equal(one_hot, expected)
    smoothed = smooth_labels(y, 0.3, num_classes)
    torch.testing.assert_close(smoothed, expected * 0.7 + 0.3 / num_classes)
    # outputs are fresh tensors: changing one changes nothing cached
    one_hot.fill_(7.0)
    smoothed.fill_(7.0)
    assert torch.equal(as_probabilities(y, num_classes), expected)
    torch.testing.assert_close(smooth_labels(y, 0.3, num_classes), expected * 0.7 + 0.3 / num_classes)


def test_rows_built_under_inference_mode_serve_a_later_training_step():
    y = torch.tensor([1, 0])
    with torch.inference_mode():
        first = smooth_labels(y, 0.123, num_classes=13)  # builds the cached table here (unique settings)
    logits = torch.zeros(2, 13, requires_grad=True)
    again = smooth_labels(y, 0.123, num_classes=13)
    again.mul_(1.0)  # in place: a fresh tensor, not an inference tensor (nor a view of the cached table)
    F.cross_entropy(logits, again).backward()
    assert logits.grad is not None and torch.allclose(first, again)


def test_smoothing_commutes_with_mixing():
    y = torch.tensor([0, 1, 2, 1])
    perm = torch.tensor([3, 2, 1, 0])
    x = torch.zeros(4, 1)
    _, mixed_then_smoothed = mix(x, y, 0.3, perm, num_classes=3)
    mixed_then_smoothed = smooth_labels(mixed_then_smoothed, 0.1)
    _, smoothed_then_mixed = mix(x, smooth_labels(y, 0.1, num_classes=3), 0.3, perm)
    assert torch.allclose(mixed_then_smoothed, smoothed_then_mixed)


@pytest.mark.parametrize(
    ("target", "message"),
    [
        (torch.zeros(4, 3, dtype=torch.long), "class indices of shape"),
        (torch.zeros(4), "class probabilities"),
        (torch.zeros(4, 3, 2), "class probabilities"),
    ],
)
def test_as_probabilities_rejects_other_targets(target, message):
    with pytest.raises(ValueError, match=message):
        as_probabilities(target, num_classes=3)


def test_integer_inputs_are_refused():
    with pytest.raises(TypeError, match="floating-point inputs"):
        mix(torch.zeros(2, 3, dtype=torch.uint8), torch.tensor([0, 1]), 0.5, torch.tensor([1, 0]), 2)


def test_cutmix_needs_spatial_dims_and_bad_alpha():
    with pytest.raises(ValueError, match=r"\(N, C, \*spatial\)"):
        cutmix_batch(torch.zeros(4, 10), torch.arange(4), num_classes=4)
    for alpha in (0.0, float("nan"), float("inf")):  # NaN and inf would draw NaN weights, mixing a NaN batch
        with pytest.raises(ValueError, match="alpha"):
            sample_lambda(alpha)
        with pytest.raises(ValueError, match="alpha"):
            cutmix_batch(torch.rand(2, 1, 4, 4), torch.arange(2), alpha=alpha, num_classes=2)
    with pytest.raises(ValueError, match="smoothing"):
        smooth_labels(torch.arange(3), 1.0, num_classes=3)


def test_mismatched_batches_empty_regions_and_no_classes_are_clear_errors():
    # each failed deep inside torch or numpy (an index out of range, `high <= 0`, a division by zero)
    shapes = r"the same for both; got inputs \(4, 3\) and targets \(3,\)"
    with pytest.raises(ValueError, match=shapes):
        mixup_batch(torch.rand(4, 3), torch.arange(3), 0.4, 5, 1)
    with pytest.raises(ValueError, match=r"got inputs \(\) and targets \(\)"):
        mixup_batch(torch.tensor(1.0), torch.tensor(0), 0.4, 2, 0)
    with pytest.raises(ValueError, match=r"got inputs \(4, 1, 4, 4\) and targets \(5,\)"):
        cutmix_batch(torch.rand(4, 1, 4, 4), torch.arange(5), 1.0, 5, 0)
    with pytest.raises(ValueError, match=r"non-empty region to paste; got shape \(2, 1, 0, 4\)"):
        cutmix_batch(torch.rand(2, 1, 0, 4), torch.tensor([0, 1]), 1.0, 2, 0)
    for call in (lambda: smooth_labels(torch.tensor([0, 0]), 0.1, 0), lambda: as_probabilities(torch.arange(2), 0)):
        with pytest.raises(ValueError, match="`num_classes` must be an int >= 1, got 0"):
            call()
    for count in (np.int64(3), 3.0, np.float64(3), torch.tensor(3)):  # a config's whole float, NumPy, tensors
        assert smooth_labels(torch.tensor([0, 2]), 0.3, count).shape == (2, 3)
        assert as_probabilities(torch.tensor([0, 2]), count).shape == (2, 3)
    for bad in (2.5, True, torch.tensor(3.0)):
        with pytest.raises(ValueError, match="`num_classes` must be an int >= 1"):
            as_probabilities(torch.tensor([0, 1]), bad)


@pytest.mark.parametrize(
    "make",
    [
        lambda: torch.rand(4, 3, 8, 8).to(memory_format=torch.channels_last).requires_grad_(),
        lambda: torch.rand(4, 8, 3).transpose(1, 2).requires_grad_(),
    ],
    ids=["channels_last", "transposed"],
)
def test_mix_of_a_non_contiguous_input_that_requires_grad_backpropagates(make):
    x, y, perm = make(), torch.tensor([0, 1, 2, 3]), torch.tensor([2, 0, 3, 1])
    mx, _ = mix(x, y, 0.3, perm, 4)
    assert torch.allclose(mx, 0.3 * x + 0.7 * x[perm])
    assert mx.stride() == x.stride()  # the input's layout kept (a channels_last batch stays channels_last)
    mx.sum().backward()
    assert torch.allclose(x.grad, torch.ones_like(x))  # each sample weighs lam as itself, 1 - lam as a partner
    mixed = mixup_batch(make(), y, num_classes=4, generator=0)[0]
    assert mixed.requires_grad


@pytest.mark.parametrize("lam", [-0.1, 1.5, float("nan")])
def test_a_weight_outside_zero_one_is_refused(lam):
    x, y, perm = torch.rand(2, 1, 4, 4), torch.tensor([0, 1]), torch.tensor([1, 0])
    with pytest.raises(ValueError, match=r"`lam` must be a weight in \[0, 1\]"):
        mix(x, y, lam, perm, 2)  # would give negative "probabilities"
    with pytest.raises(ValueError, match=r"`lam` must be a weight in \[0, 1\]"):
        cutmix_box((4, 4), lam, 0)


def test_boxes_are_clipped_to_the_sample_and_take_none_bounds():
    x, y, perm = torch.rand(4, 3, 16, 16), torch.tensor([0, 1, 2, 3]), torch.tensor([1, 0, 3, 2])
    out, probs, lam = cut_and_paste(x, y, (slice(0, 100), slice(0, 100)), perm, 4)
    assert lam == 0.0 and torch.equal(out, x[perm]) and torch.equal(probs, torch.eye(4)[perm])
    assert box_lambda((16, 16), (slice(None, 4), slice(0, 8))) == 1 - 32 / 256
    assert box_lambda((16, 16), (slice(-4, None), slice(None))) == 1 - 64 / 256
    assert box_lambda((16, 16), (slice(20, 30), slice(0, 8))) == 1.0  # wholly outside: nothing pasted
    out, _, lam = cut_and_paste(x, y, (slice(-4, None), slice(None, 8)), perm, 4)
    ref = x.clone()
    ref[:, :, -4:, :8] = x[perm][:, :, -4:, :8]
    assert torch.equal(out, ref) and lam == 1 - 32 / 256
    with pytest.raises(ValueError, match=r"`box`.*step 1"):
        cut_and_paste(x, y, (slice(0, 8, 2), slice(0, 8)), perm, 4)
    with pytest.raises(ValueError, match="`box` has 1 dims"):
        box_lambda((16, 16), (slice(0, 8),))


def test_class_indices_out_of_range_give_a_value_error_naming_the_range():
    x = torch.rand(4, 3, 8, 8)
    for bad in (torch.tensor([0, 1, 2, 10]), torch.tensor([0, -100, 1, 2])):
        with pytest.raises(ValueError, match=r"Class indices must lie in \[0, 10\)"):
            smooth_labels(bad, 0.1, num_classes=10)
        if bad.min() >= 0:  # a dtype torch has no min/max for: the message all the same
            with pytest.raises(ValueError, match=r"Class indices must lie in \[0, 10\), got 0..10"):
                smooth_labels(bad.to(torch.uint16), 0.1, num_classes=10)
        with pytest.raises(ValueError, match=r"ignore_index"):
            mix(x, bad, 0.5, torch.tensor([1, 0, 3, 2]), 10)
    with pytest.raises(IndexError):  # still an IndexError too, as torch's own error was
        as_probabilities(torch.tensor([0, 1, 2, 2000]), 2000)  # the scatter path (beyond the cached tables)


def test_bad_partners_generators_and_regions_are_clear_errors():
    x, y = torch.rand(4, 3, 8, 8), torch.tensor([0, 1, 2, 1])
    for perm, match in ((torch.tensor([1, 0, 3]), r"shape \(4,\)"), (torch.tensor([1.0, 0, 3, 2]), "int64 or int32")):
        with pytest.raises(ValueError, match=match):
            mix(x, y, 0.5, perm, num_classes=3)
        with pytest.raises(ValueError, match=match):
            cut_and_paste(x, y, (slice(0, 4), slice(0, 4)), perm, num_classes=3)
    # targets left on another device than the inputs (meta stands in for a GPU here): torch's error came from
    # deep inside the mix, or (meta) made-up probabilities
    perm = torch.tensor([1, 0, 3, 2])
    with pytest.raises(ValueError, match=r"Inputs are on cpu, targets on meta: put the whole batch on one device"):
        mix(x, y.to("meta"), 0.5, perm, num_classes=3)
    with pytest.raises(ValueError, match=r"Inputs are on cpu, targets on meta"):
        cut_and_paste(x, y.to("meta"), (slice(0, 4), slice(0, 4)), perm, num_classes=3)
    with pytest.raises(TypeError, match=r"`generator` must be a NumPy Generator, a torch\.Generator"):
        sample_lambda(0.2, generator="seed")
    for shape in ((0, 8), ()):
        with pytest.raises(ValueError, match="non-empty region"):
            cutmix_box(shape, 0.5)
    with pytest.raises(ValueError, match="non-empty region"):
        box_lambda((0, 8), (slice(0, 1), slice(0, 1)))


def test_a_torch_generator_seeds_the_draws():
    draws = [sample_lambda(0.4, generator=torch.Generator().manual_seed(3)) for _ in range(2)]
    assert draws[0] == draws[1] and 0.0 <= draws[0] <= 1.0
    assert sample_lambda(0.4, generator=torch.Generator().manual_seed(4)) != draws[0]


def test_beta_draws_stay_symmetric_for_a_tiny_alpha():
    from lightning_speedups.functional import BatchRandom

    rng = BatchRandom()
    rng.reseed(0)
    draws = np.array([rng.beta(1e-4, 1e-4) for _ in range(4000)])
    # Beta(a, a) is symmetric around 0.5; Python's betavariate gave 0 whenever its first gamma draw underflowed
    assert abs(draws.mean() - 0.5) < 0.05 and (draws == 1.0).mean() > 0.4
