"""Schedules, sizes and the resize/crop ops of progressive resizing, against hand computations."""

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from lightning_speedups.functional import (
    ResizePlan,
    crop_at,
    crop_offsets,
    progressive_scale,
    ramp_resolution,
    resize_batch,
    resize_images,
    resize_masks,
    resolution_size,
    scaled_size,
)


# ---------------------------------------------------------------------------------------------- schedules
@pytest.mark.parametrize(
    ("progress", "expected"),
    [
        (0.0, 0.5),
        (0.3, 0.5),
        (0.4999, 0.5),
        (0.5, 0.5),
        (0.6, 0.5 + 0.5 * (0.6 - 0.5) / 0.3),  # on the ramp: 0.6667
        (0.65, 0.75),
        (0.8, 1.0),
        (0.9, 1.0),
        (1.0, 1.0),
    ],
)
def test_composer_schedule_at_chosen_points(progress, expected):
    assert progressive_scale(progress, 0.5, 0.5, 0.2) == pytest.approx(expected)


def test_the_issue_schedule_and_a_step_ramp():
    # 0.5 / 0.4 / 0.2: held until 40%, full size from 80%, linear in between
    assert [round(progressive_scale(p, 0.5, 0.4, 0.2), 4) for p in (0.2, 0.4, 0.5, 0.6, 0.7, 0.8)] == [
        0.5,
        0.5,
        0.625,
        0.75,
        0.875,
        1.0,
    ]
    # delay + finetune == 1: a step from initial_scale to 1 at delay_fraction
    assert progressive_scale(0.59, 0.25, 0.6, 0.4) == 0.25
    assert progressive_scale(0.6, 0.25, 0.6, 0.4) == 1.0


@given(
    p=st.floats(0, 1),
    scale=st.floats(0.05, 1),
    delay=st.floats(0, 1),
    finetune=st.floats(0, 1),
)
@settings(max_examples=200, deadline=None)
def test_composer_schedule_is_its_formula(p, scale, delay, finetune):
    if delay + finetune > 1 + 1e-9:
        with pytest.raises(ValueError, match="delay_fraction \\+ finetune_fraction"):
            progressive_scale(p, scale, delay, finetune)
        return
    if delay + finetune > 1:
        return  # within rounding of 1: either answer is fine
    got = progressive_scale(p, scale, delay, finetune)
    if p < delay:
        expected = scale
    elif p >= 1 - finetune or 1 - finetune - delay < 1e-12:  # a ramp within rounding of 0 is a step
        expected = 1.0
    else:
        expected = scale + (1 - scale) * (p - delay) / (1 - finetune - delay)
    assert got == pytest.approx(expected, abs=1e-9)
    assert scale - 1e-12 <= got <= 1.0


@pytest.mark.parametrize("epoch", [0, 5, 10, 10.5, 11, 11.9, 12, 12.5, 13, 14, 40])
def test_ffcv_ramp_is_np_interp_rounded_to_32(epoch):
    expected = int(np.round(np.interp(epoch, [10, 13], [160, 192]) / 32)) * 32
    if epoch <= 10:
        expected = 160
    if epoch >= 13:
        expected = 192
    assert ramp_resolution(epoch, 160, 192, start_ramp=10, end_ramp=13) == expected


def test_ffcv_ramp_values_by_hand():
    # 88-epoch FFCV config shape: 160 -> 192 between epochs 65 and 76
    values = [ramp_resolution(e, 160, 192, 65, 76) for e in range(63, 79)]
    assert values[:3] == [160, 160, 160]  # up to and including start_ramp
    assert values[-3:] == [192, 192, 192]  # from end_ramp on
    assert all(v % 32 == 0 for v in values) and values == sorted(values)
    assert ramp_resolution(70, 160, 256, 65, 75, round_to=16) == 208  # 160 + 96 * 0.5 = 208
    assert ramp_resolution(5, 64, 64, 0, 10) == 64
    # rounding never leaves [min_res, max_res]: 14 px would round to 0, 25 px to 32, 104 px to 96
    assert ramp_resolution(1, 12, 32, 0, 10) == 12
    assert ramp_resolution(1, 20, 30, 0, 2) == 30
    assert ramp_resolution(1, 100, 120, 0, 5) == 100
    with pytest.raises(ValueError, match="min_res"):
        ramp_resolution(0, 200, 100, 0, 1)


# ---------------------------------------------------------------------------------------------- sizes
@pytest.mark.parametrize(
    ("size", "scale", "inc", "expected"),
    [
        ((224, 224), 0.5, 4, (112, 112)),
        ((224, 224), 0.51, 4, (116, 116)),  # 114.24 / 4 = 28.56 -> 29 * 4
        ((224, 224), 0.51, 32, (128, 128)),  # 114.2 / 32 = 3.57 -> 4 * 32
        ((32, 24), 0.75, 4, (24, 20)),  # 24; 18 / 4 = 4.5 rounds half up -> 20 (half to even gave 16: 1.5:1)
        ((20, 12), 0.5, 4, (12, 8)),  # 2.5 and 1.5 both up: the sides rounded apart (8 x 8) when halves went to even
        ((30, 30), 0.99, 4, (28, 28)),  # 29.7 -> 28, never above the full side
        ((31, 31), 0.99, 4, (31, 31)),  # 30.69 -> 32 > 31: capped at the full side
        ((30, 30), 1.0, 4, (30, 30)),  # full size is kept even when not a multiple
        ((16, 16), 0.01, 4, (4, 4)),  # at least one increment
        ((2, 2), 0.5, 4, (2, 2)),  # smaller than the increment: the full side
    ],
)
def test_scaled_size_rounding(size, scale, inc, expected):
    assert scaled_size(size, scale, inc) == expected


@given(full=st.integers(1, 512), scale=st.floats(0.01, 1.0), inc=st.integers(1, 64))
@settings(max_examples=300, deadline=None)
def test_scaled_side_is_a_multiple_of_the_increment_or_full(full, scale, inc):
    (side, _) = scaled_size((full, full), scale, inc)
    assert 1 <= side <= full
    assert side == full or side % inc == 0
    if scale < 1 and inc <= full:
        assert abs(side - full * scale) <= inc / 2 + 1e-9 or side in (inc, full)


def test_resolution_size_is_shorter_side():
    assert resolution_size((256, 256), 160) == (160, 160)
    assert resolution_size((240, 320), 160, 8) == (160, 216)  # 320 * 160 / 240 = 213.3 -> 216
    assert resolution_size((320, 240), 160, 8) == (216, 160)
    assert resolution_size((16, 20), 8, 4) == (8, 12)  # 10 / 4 = 2.5 rounds up (to even it gave a square, 8 x 8)
    # a square stays square even off the increment (30 would round its "long" side to 32)
    assert resolution_size((30, 30), 30) == (30, 30) and resolution_size((30, 30), 26) == (26, 26)
    # the image's own size at its own shorter side (43 would round to 44, and a crop of 44 cannot fit in 43)
    assert resolution_size((30, 43), 30) == (30, 43) and resolution_size((43, 30), 30) == (43, 30)
    assert resolution_size((30, 43), 29) == (29, 40)  # 43 * 29 / 30 = 41.6 -> 40
    assert resolution_size((30, 43), 60) == (60, 88)  # upsampling: no cap
    # downsizing never makes the longer side exceed the image's (103 * 49 / 50 = 100.9 -> 104 by 8: capped)
    assert resolution_size((50, 103), 49, 8) == (49, 103) and resolution_size((103, 50), 49, 8) == (103, 49)
    assert ResizePlan(resolution=160, size_increment=8).size_for((320, 240)) == (216, 160)
    assert ResizePlan(scale=0.5).size_for((64, 48)) == (32, 24)
    assert ResizePlan().is_full and not ResizePlan(scale=0.9).is_full and not ResizePlan(resolution=64).is_full


# ---------------------------------------------------------------------------------------------- ops
@pytest.mark.parametrize("interpolation", ["nearest", "bilinear", "bicubic"])
def test_resize_images_shape_and_values(interpolation):
    x = torch.rand(3, 2, 32, 24)
    out = resize_images(x, (16, 12), interpolation)
    assert out.shape == (3, 2, 16, 12) and out.dtype == x.dtype
    kwargs = {} if interpolation == "nearest" else {"align_corners": False, "antialias": True}
    torch.testing.assert_close(out, F.interpolate(x, size=(16, 12), mode=interpolation, **kwargs))
    assert resize_images(x, (32, 24), interpolation) is x  # nothing to do


def test_antialias_averages_a_checkerboard():
    board = (torch.arange(16)[:, None] + torch.arange(16)[None, :]) % 2
    x = board.float().expand(1, 1, 16, 16)
    smooth = resize_images(x, (8, 8), "bilinear", antialias=True)
    aliased = resize_images(x, (8, 8), "nearest")
    assert torch.allclose(smooth, torch.full_like(smooth, 0.5), atol=0.05)  # the mean grey
    assert set(aliased.unique().tolist()) <= {0.0, 1.0}


def test_masks_follow_nearest_images_exactly_and_keep_their_dtype():
    labels = torch.randint(0, 200, (2, 1, 30, 20))
    as_images = resize_images(labels.float(), (12, 8), "nearest")
    masks = resize_masks(labels, (12, 8), "nearest")
    assert masks.dtype == torch.int64 and torch.equal(masks.float(), as_images)
    three_d = resize_masks(labels[:, 0].to(torch.uint8), (12, 8), "bilinear")
    assert three_d.shape == (2, 12, 8) and three_d.dtype == torch.uint8
    assert set(three_d.unique().tolist()) <= set(labels.unique().tolist())  # values are never blended
    # pixel-centre sampling for bilinear images: 4x downsizing picks source rows 2, 6, 10, ... (nearest-exact)
    ramp = torch.arange(16).view(1, 16, 1).expand(1, 16, 4)
    assert resize_masks(ramp, (4, 4), "bilinear")[0, :, 0].tolist() == [2, 6, 10, 14]
    assert resize_masks(ramp, (4, 4), "nearest")[0, :, 0].tolist() == [0, 4, 8, 12]


def test_half_precision_images_on_cpu_resize_in_float32():
    x = torch.rand(2, 3, 16, 12)
    for dtype in (torch.bfloat16, torch.float16):
        for interpolation in ("bilinear", "bicubic"):
            out = resize_images(x.to(dtype), (8, 6), interpolation)
            assert out.dtype == dtype
            by_hand = F.interpolate(x.to(dtype).float(), size=(8, 6), mode=interpolation, antialias=True)
            torch.testing.assert_close(out, by_hand.to(dtype))


def test_crop_and_resize_keep_the_memory_layout():
    x = torch.rand(4, 3, 12, 12)
    g = torch.Generator().manual_seed(0)
    for layout in (torch.contiguous_format, torch.channels_last):
        xl = x.contiguous(memory_format=layout)
        for mode in ("crop", "resize"):
            out, _ = resize_batch(xl, (8, 8), mode=mode, generator=g)
            assert out.is_contiguous(memory_format=layout), (mode, layout)


@pytest.mark.parametrize("mode", ["crop", "resize"])
def test_a_one_channel_batch_comes_out_row_major_so_conv_gradients_keep_their_layout(mode):
    # the permuted crop of a 1-channel batch had strides (H*W, 1, W, 1): "contiguous" and channels_last at once,
    # so a convolution took the channels_last path and its weight gradient had strides DDP's buckets do not
    # expect (torch warns "Grad strides do not match bucket view strides" and copies at every step)
    x = torch.rand(4, 1, 12, 12)
    out, _ = resize_batch(x, (8, 8), mode=mode, generator=torch.Generator().manual_seed(0))
    assert out.stride() == (64, 64, 8, 1)
    conv = torch.nn.Conv2d(1, 4, 3)
    conv(out).sum().backward()
    assert conv.weight.grad.stride() == (9, 9, 3, 1)


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.bool])
def test_nearest_resize_of_integer_images_keeps_channels_last(dtype):
    x = (torch.rand(2, 3, 12, 12) > 0.5).to(dtype).contiguous(memory_format=torch.channels_last)
    out = resize_images(x, (6, 6), "nearest")
    assert out.is_contiguous(memory_format=torch.channels_last) and out.dtype == dtype
    torch.testing.assert_close(out, x.contiguous()[:, :, ::2, ::2])  # nearest at half size: every other pixel


def test_a_non_image_input_to_the_functional_ops_gets_a_functional_hint():
    with pytest.raises(ValueError, match=r"shape \(3, 12, 12\).*x\.unsqueeze\(0\)"):
        resize_images(torch.rand(3, 12, 12), (6, 6))


def test_crop_takes_a_region_per_sample_with_its_mask():
    x = torch.arange(4 * 2 * 10 * 12, dtype=torch.float32).view(4, 2, 10, 12)
    mask = torch.arange(4 * 10 * 12).view(4, 10, 12)
    g = torch.Generator().manual_seed(0)
    out, out_mask = resize_batch(x, (6, 5), mode="crop", mask=mask, generator=g)
    assert out.shape == (4, 2, 6, 5) and out_mask.shape == (4, 6, 5)
    corners = set()
    for i in range(4):
        # each sample is a contiguous region of its own image, at the same place as its mask's region
        top, left = divmod(int(out_mask[i, 0, 0]) - i * 120, 12)
        corners.add((top, left))
        assert torch.equal(out[i], x[i, :, top : top + 6, left : left + 5])
        assert torch.equal(out_mask[i], mask[i, top : top + 6, left : left + 5])
    assert len(corners) > 1  # offsets are drawn per sample
    g2 = torch.Generator().manual_seed(0)
    again, _ = resize_batch(x, (6, 5), mode="crop", generator=g2)
    assert torch.equal(again, out)  # the generator decides everything
    assert torch.equal(crop_at(x, (10, 12), torch.zeros(4, dtype=torch.long), torch.zeros(4, dtype=torch.long)), x)


def test_resize_batch_resizes_masks_with_nearest():
    x = torch.rand(2, 3, 16, 16)
    mask = torch.randint(0, 3, (2, 16, 16))
    out, out_mask = resize_batch(x, (8, 8), mode="resize", interpolation="bilinear", mask=mask)
    assert out.shape == (2, 3, 8, 8) and out_mask.shape == (2, 8, 8) and out_mask.dtype == mask.dtype
    assert torch.equal(out_mask, mask[:, 1::2, 1::2])  # nearest-exact at 2x: centres of the 2x2 cells


@pytest.mark.parametrize(
    ("x", "message"),
    [
        (torch.rand(8, 10), r"\(N, C, H, W\), got a tensor of shape \(8, 10\)"),
        (torch.rand(8, 3, 10), r"got a tensor of shape \(8, 3, 10\)"),
        (torch.rand(2, 3, 4, 8, 8), r"got a tensor of shape \(2, 3, 4, 8, 8\)"),
    ],
)
def test_non_image_inputs_name_their_shape(x, message):
    with pytest.raises(ValueError, match=message):
        resize_images(x, (4, 4))
    with pytest.raises(ValueError, match=message):
        resize_batch(x, (4, 4))


def test_other_bad_inputs():
    with pytest.raises(TypeError, match=r"floating-point images, got dtype torch\.uint8"):
        resize_images(torch.zeros(1, 1, 8, 8, dtype=torch.uint8), (4, 4), "bilinear")
    assert resize_images(torch.zeros(1, 1, 8, 8, dtype=torch.uint8), (4, 4), "nearest").dtype == torch.uint8
    with pytest.raises(ValueError, match="does not fit"):
        resize_batch(torch.rand(1, 1, 8, 8), (10, 10), mode="crop")
    with pytest.raises(ValueError, match="`mode` must be"):
        resize_batch(torch.rand(1, 1, 8, 8), (4, 4), mode="zoom")
    for size, mode in (((0, 8), "crop"), ((-4, 8), "crop"), ((4, 0), "resize")):  # crop gave an empty batch
        with pytest.raises(ValueError, match=r"`size` must be \(height, width\) of at least 1 pixel"):
            resize_batch(torch.rand(1, 1, 8, 8), size, mode=mode)
    with pytest.raises(ValueError, match="height and width"):
        resize_batch(torch.rand(1, 1, 8, 8), (4, 4), mask=torch.zeros(1, 6, 6))
    with pytest.raises(ValueError, match="`size_increment` must be >= 1"):
        scaled_size((8, 8), 0.5, 0)
    for bad in (0.0, 1.5, -0.1):
        with pytest.raises(ValueError, match=r"`initial_scale` must be in \(0, 1\]"):
            progressive_scale(0.5, bad)
    assert math.isclose(progressive_scale(0.0, 1.0), 1.0)


@pytest.mark.parametrize("delay", [0.3, 0.6, 0.7, 0.9])
def test_a_step_ramp_is_full_size_at_the_delay_whatever_the_rounding(delay):
    finetune = round(1 - delay, 10)  # 1 - 0.3 - 0.7 is 5.6e-17, 1 - 0.7 - 0.3 is 0: both a step
    assert progressive_scale(delay, 0.5, delay, finetune) == 1.0
    assert progressive_scale(delay - 1e-9, 0.5, delay, finetune) == 0.5


def test_resolution_size_keeps_the_shorter_side_after_rounding():
    assert resolution_size((100, 101), 50, 8) == (50, 50)  # 50.5 rounds to 48 < 50: clamped
    assert resolution_size((101, 100), 50, 8) == (50, 50)
    assert ResizePlan(resolution=50, size_increment=8).size_for((100, 101)) == (50, 50)
    assert resolution_size((8, 9), 69, 32) == (69, 69)  # upsampling: 77.6 rounds to 64 < 69
    for h in range(8, 80, 3):
        for w in range(h + 1, h + 8):
            for res in range(4, 90, 5):
                for inc in (1, 4, 8, 32):
                    s = resolution_size((h, w), res, inc)
                    assert min(s) == res and (s[0] <= s[1]) == (h <= w), ((h, w), res, inc, s)
    with pytest.raises(ValueError, match="`size_increment` must be >= 1"):
        resolution_size((30, 40), 20, 0)


def test_crop_offsets_and_ramp_resolution_refuse_what_has_no_meaning():
    with pytest.raises(ValueError, match=r"`out_size` must be at least 1 x 1, got \(-1, 4\)"):
        crop_offsets(2, (9, 9), (-1, 4))  # drew offsets past the image (10 for a 9-row image)
    with pytest.raises(ValueError, match="`epoch` must be a number, got NaN"):
        ramp_resolution(float("nan"), 160, 192, start_ramp=10, end_ramp=13)


def test_crop_at_takes_any_leading_dims():
    tops, lefts = torch.tensor([0, 1]), torch.tensor([2, 3])
    vol = torch.rand(2, 3, 4, 10, 12)
    out = crop_at(vol, (5, 6), tops, lefts)
    assert out.shape == (2, 3, 4, 5, 6) and out.is_contiguous()
    assert torch.equal(out[0], vol[0, ..., 0:5, 2:8]) and torch.equal(out[1], vol[1, ..., 1:6, 3:9])
    mask = torch.randint(0, 5, (2, 10, 12))
    assert torch.equal(crop_at(mask, (5, 6), tops, lefts)[1], mask[1, 1:6, 3:9])
    with pytest.raises(ValueError, match=r"`x` must be \(N, \.\.\., H, W\)"):
        crop_at(torch.rand(2, 10), (5, 6), tops, lefts)


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.bool, torch.int16])
def test_nearest_resize_of_integer_and_bool_images(dtype):
    x = torch.randint(0, 2 if dtype == torch.bool else 255, (2, 3, 10, 12)).to(dtype)
    for size in [(5, 6), (23, 17)]:
        out = resize_images(x, size, "nearest")
        assert out.dtype == dtype
        assert torch.equal(out, resize_images(x.float(), size, "nearest").to(dtype))
        new_x, _ = resize_batch(x, size, interpolation="nearest")
        assert torch.equal(new_x, out)


def test_a_bad_mode_is_refused_even_at_the_same_size():
    with pytest.raises(ValueError, match="`mode` must be 'resize' or 'crop', got 'bogus'"):
        resize_batch(torch.rand(1, 1, 8, 8), (8, 8), mode="bogus")


def test_the_ramps_end_is_full_size_even_an_ulp_short():
    # 2/3 of the run with delay 1/3 and finetune 1/3: (2/3 - 1/3) / (1/3) is 0.9999999999999998 in floats
    scale = progressive_scale(2 / 3, 0.5, 1 / 3, 1 / 3)
    assert scale == 1.0 and scaled_size((30, 30), scale, 4) == (30, 30)  # not 28 x 28, one step early


def test_bad_plans_masks_and_offsets_are_refused_not_broadcast():
    import lightning_speedups.functional as LF

    x, m = torch.rand(4, 3, 16, 16), torch.randint(0, 5, (4, 16, 16))
    with pytest.raises(ValueError, match=r"batch size, height and width.*targets \(1, 16, 16\)"):
        LF.resize_batch(x, (8, 8), mask=m[:1])  # one mask for four images: never broadcast
    with pytest.raises(ValueError, match=r"one offset per sample, shape \(4,\); got \(1,\)"):
        LF.crop_at(x, (8, 8), torch.zeros(1, dtype=torch.long), torch.zeros(4, dtype=torch.long))
    for bad in ({"scale": -1.0}, {"scale": 0.0}, {"scale": math.inf}, {"resolution": 0}, {"size_increment": 0}):
        with pytest.raises(ValueError):
            LF.ResizePlan(**bad)
    with pytest.raises(ValueError, match="got nan"):
        LF.progressive_scale(math.nan)  # NaN would read as the end of training: full size
    with pytest.raises(ValueError, match="`min_res`"):
        LF.ramp_resolution(1, 0, 8, 0, 2)


def test_a_nan_scale_and_an_unknown_mask_interpolation_are_clear_errors():
    from lightning_speedups.functional import resize_masks, scaled_size

    with pytest.raises(ValueError, match="`scale` must be > 0, got nan"):
        scaled_size((16, 16), float("nan"))
    with pytest.raises(ValueError, match="`interpolation` must be one of"):
        resize_masks(torch.zeros(2, 16, 16, dtype=torch.long), (8, 8), "area")
