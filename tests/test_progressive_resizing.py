"""ProgressiveResizing in real `Trainer.fit` runs on CPU: sizes per step, modes, validation, resume, logs, errors."""

import copy
import pickle
import re
import sys
import warnings
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from lightning.pytorch import LightningModule, seed_everything
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from torch import Tensor, nn
from torch.utils.data import DataLoader, TensorDataset

from lightning_speedups import ProgressiveResizing, SpeedupCallback, SpeedupWarning
from lightning_speedups.functional import progressive_scale, recalibrate_batchnorm, scaled_size
from tests.helpers import NUM_CLASSES, ImagesDataModule, MemoryLogger, image_tensors, loaders, trainer, unpack

SIZE = 16  # images are 16 x 16; 64 samples in batches of 16: 4 steps per epoch


class PooledNet(nn.Module):
    """Any input size works (global average pooling); BatchNorm optional."""

    def __init__(self, batchnorm: bool = True) -> None:
        super().__init__()
        self.conv = nn.Conv2d(1, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8) if batchnorm else nn.Identity()
        self.fc = nn.Linear(8, NUM_CLASSES)

    def forward(self, x: Tensor) -> Tensor:
        return self.fc(F.relu(self.bn(self.conv(x))).mean((2, 3)))


class SizeRecorder(LightningModule):
    """Records what each training and validation step received (sizes, and the inputs themselves)."""

    def __init__(self, batchnorm: bool = True, lr: float = 0.1) -> None:
        super().__init__()
        self.net = PooledNet(batchnorm)
        self.lr = lr
        self.train_seen: list[tuple[int, tuple[int, int], Tensor, Tensor]] = []
        self.val_seen: list[tuple[int, tuple[int, ...]]] = []

    def forward(self, x: Tensor) -> Tensor:
        return self.net(x)

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        x, y = unpack(batch)
        self.train_seen.append((self.trainer.global_step, tuple(x.shape[-2:]), x.detach().clone(), y.detach().clone()))
        return F.cross_entropy(self(x), y)

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = unpack(batch)
        self.val_seen.append((self.trainer.global_step, tuple(x.shape)))
        logits = self(x)
        self.log("val_loss", F.cross_entropy(logits, y))
        self.log("val_acc", (logits.argmax(1) == y).float().mean())

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=self.lr)


def expected_size(step: int, total: int, *schedule: float) -> tuple[int, int]:
    return scaled_size((SIZE, SIZE), progressive_scale(step / total, *schedule), 4)


# ---------------------------------------------------------------------------------------------- sizes
def test_resize_follows_the_schedule_step_by_step():
    model = SizeRecorder()
    t = trainer(callbacks=[ProgressiveResizing(0.5, 0.25, 0.25, validation="full")], max_epochs=4)
    t.fit(model, *loaders("list", n=64, size=SIZE))
    sizes = [size for _, size, _, _ in model.train_seen]
    assert sizes == [expected_size(step, 16, 0.5, 0.25, 0.25) for step in range(16)]
    assert sizes[:4] == [(8, 8)] * 4 and sizes[-4:] == [(16, 16)] * 4 and (12, 12) in sizes  # a real ramp
    # the content is the original batch, resized (antialiased bilinear), never altered otherwise
    originals = [unpack(b) for b in loaders("list", n=64, size=SIZE)[0]]
    x0, y0 = originals[1]
    _, _, x, y = model.train_seen[1]
    torch.testing.assert_close(x, F.interpolate(x0, size=(8, 8), mode="bilinear", antialias=True))
    assert torch.equal(y, y0)


def test_full_size_phase_skips_the_schedule_and_a_new_fit_starts_over(monkeypatch):
    cb = ProgressiveResizing(0.5, 0.25, 0.25, validation="full")
    planned: list[float] = []
    plan_at = cb.plan_at
    monkeypatch.setattr(cb, "plan_at", lambda progress, epoch: planned.append(progress) or plan_at(progress, epoch))
    for _ in range(2):  # the same callback in a second fit resizes from the start again
        model = SizeRecorder()
        planned.clear()
        trainer(callbacks=[cb], max_epochs=4).fit(model, *loaders("list", n=64, size=SIZE))
        assert [size for _, size, _, _ in model.train_seen] == [
            expected_size(s, 16, 0.5, 0.25, 0.25) for s in range(16)
        ]
        # steps 0..12 work out the plan; step 12 (progress 0.75) is the fine-tune phase's first: full size for good
        assert planned == [s / 16 for s in range(13)]


@pytest.mark.parametrize("kind", ["tuple", "dict", "namedtuple", "dataclass"])
def test_any_batch_container(kind):
    model = SizeRecorder()
    trainer(callbacks=[ProgressiveResizing(0.5, 0.5, 0.0)], max_steps=2).fit(model, loaders(kind, size=SIZE)[0])
    assert [size for _, size, _, _ in model.train_seen] == [(8, 8), (8, 8)]


def test_crop_takes_random_windows_of_the_originals():
    model = SizeRecorder()
    cb = ProgressiveResizing(0.5, 0.5, 0.25, mode="crop", interpolation="nearest", seed=3)
    trainer(callbacks=[cb], max_epochs=2).fit(model, loaders("list", n=64, size=SIZE)[0])
    originals = [unpack(b)[0] for b in loaders("list", n=64, size=SIZE)[0]] * 2
    offsets = set()
    for (_, size, x, _), x0 in zip(model.train_seen, originals, strict=True):
        h, w = size
        for i in range(len(x)):
            windows = x0[i].unfold(1, h, 1).unfold(2, w, 1)  # (C, H-h+1, W-w+1, h, w)
            hits = (windows == x[i][:, None, None]).flatten(3).all(-1).all(0).nonzero().tolist()
            assert hits, "a cropped sample is not a window of its original"
            offsets.add(tuple(hits[0]))
    assert len(offsets) > 5  # random per sample
    assert [size for _, size, _, _ in model.train_seen][:4] == [(8, 8)] * 4


def test_ffcv_epoch_ramp():
    model = SizeRecorder()
    cb = ProgressiveResizing(min_res=8, max_res=16, start_ramp=1, end_ramp=3, res_increment=4, validation="full")
    trainer(callbacks=[cb], max_epochs=5, limit_train_batches=2).fit(model, loaders("list", size=SIZE)[0])
    per_epoch = [size for _, size, _, _ in model.train_seen][::2]
    # epochs 0, 1: min_res; epoch 2: 8 + 8 * (2 - 1) / 2 = 12 (a multiple of 4); epochs 3, 4: max_res
    assert per_epoch == [(8, 8), (8, 8), (12, 12), (16, 16), (16, 16)]


def test_an_epoch_ramp_coarser_than_its_range_stays_within_it():
    # res_increment 32 on a 6 -> 16 px ramp: every size on the ramp rounds to 0 or 32 unless kept in range
    model = SizeRecorder()
    cb = ProgressiveResizing(min_res=6, max_res=16, start_ramp=0, end_ramp=4, mode="crop", validation="full")
    trainer(callbacks=[cb], max_epochs=5, limit_train_batches=1).fit(model, loaders("list", size=SIZE)[0])
    # epochs 1-3: 8.5, 11 and 13.5 px round to 0 with res_increment 32, held at min_res; epoch 4: max_res
    assert [size for _, size, _, _ in model.train_seen] == [(6, 6)] * 4 + [(16, 16)]


def test_dense_targets_are_resized_and_cropped_with_their_images():
    _, y = image_tensors(32, SIZE)
    mask = torch.arange(SIZE * SIZE).view(1, SIZE, SIZE).expand(32, SIZE, SIZE).contiguous()  # its own position
    image = mask[:, None].float()  # the same numbers as an image: any misalignment shows

    class Seg(SizeRecorder):
        def training_step(self, batch, batch_idx):
            self.train_seen.append((0, tuple(batch["image"].shape[-2:]), batch["image"].clone(), batch["mask"].clone()))
            return self(batch["image"]).sum() * 0

    for mode in ("resize", "crop"):
        train = DataLoader(
            TensorDataset(image, mask, y),
            batch_size=16,
            collate_fn=lambda s: dict(
                zip(("image", "mask", "label"), map(torch.stack, zip(*s, strict=True)), strict=True)
            ),
        )
        model = Seg()
        cb = ProgressiveResizing(0.5, 1.0, 0.0, mode=mode, interpolation="nearest", resize_targets=True)
        cb.fields.target_key = "mask"
        trainer(callbacks=[cb], max_steps=2).fit(model, train)
        for _, size, img, m in model.train_seen:
            assert size == (8, 8) and m.shape == (16, 8, 8) and m.dtype == torch.int64
            assert torch.equal(img[:, 0].long(), m)


# ---------------------------------------------------------------------------------------------- validation
class StatsProbe(Callback):
    """Listed after ProgressiveResizing: sees the model as validation does, and after it."""

    def __init__(self) -> None:
        self.during: list[tuple[Tensor, Tensor, bool, bool]] = []
        self.before: list[Tensor] = []
        self.after: list[Tensor] = []

    def on_validation_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0):
        bn = pl_module.net.bn
        self.during.append((bn.running_mean.clone(), bn.running_var.clone(), pl_module.training, bn.training))

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.before.append(pl_module.net.bn.running_mean.clone())

    def on_validation_end(self, trainer, pl_module):
        self.after.append(pl_module.net.bn.running_mean.clone())


@pytest.mark.parametrize("validation", ["full", "recalibrate", "train_size", "auto"])
def test_what_validation_sees(validation):
    model = SizeRecorder()
    cb = ProgressiveResizing(0.5, 0.5, 0.25, validation=validation)
    t = trainer(callbacks=[cb], max_epochs=4, num_sanity_val_steps=1)
    t.fit(model, *loaders("list", n=64, size=SIZE))
    sanity, *during_fit = model.val_seen
    assert sanity[1][-2:] == (16, 16)  # sanity check: always full size
    by_step = {step: shape[-2:] for step, shape in during_fit}
    # validations after epochs 1..4 (steps 4, 8, 12, 16); the plan of the last training batch: scales 0.5,
    # 0.5, 0.5 + 0.5 * (11/16 - 0.5) / 0.25 = 0.875, 1.0
    if validation in ("train_size", "auto"):
        assert by_step == {4: (8, 8), 8: (8, 8), 12: (16, 16), 16: (16, 16)}  # 16 * 0.875 = 14 -> 16 (inc 4)
    else:
        assert set(by_step.values()) == {(16, 16)}
    # validate/test after fit see full size whatever the setting
    model.val_seen.clear()
    t.validate(model, loaders("list", n=64, size=SIZE)[1], verbose=False)
    assert {shape[-2:] for _, shape in model.val_seen} == {(16, 16)}


def test_train_size_validation_is_the_model_at_its_training_size():
    x, y = image_tensors(32, SIZE, seed=1)
    model = SizeRecorder()
    seen = []

    class Reference(Callback):  # the model's own accuracy at its training size, computed independently
        def on_validation_start(self, trainer, pl_module):
            with torch.no_grad():
                small = F.interpolate(x, size=cb._size, mode="bilinear", antialias=True)
                seen.append((pl_module(small).argmax(1) == y).float().mean().item())

        def on_validation_end(self, trainer, pl_module):
            seen[-1] = (seen[-1], trainer.callback_metrics["val_acc"].item())

    cb = ProgressiveResizing(0.5, 0.5, 0.25, validation="train_size")
    trainer(callbacks=[Reference(), cb], max_epochs=2).fit(model, *loaders("list", n=64, size=SIZE))
    assert len(seen) == 2
    for reference, logged in seen:
        assert logged == pytest.approx(reference, abs=1e-6)


def test_recalibration_during_validation_only_and_restored():
    probe = StatsProbe()
    model = SizeRecorder()
    cb = ProgressiveResizing(0.5, 1.0, 0.0, validation="recalibrate", calibration_batches=2)  # always at half size
    trainer(callbacks=[cb, probe], max_epochs=2).fit(model, *loaders("list", n=64, size=SIZE))
    assert cb.recalibrations == 2
    val_mean, _, module_training, bn_training = probe.during[-1]
    assert not module_training and not bn_training  # validation itself runs in eval mode as usual
    # the statistics validation used differ from the training ones, which are put back exactly after it
    assert not torch.allclose(val_mean, probe.before[7])
    assert torch.equal(probe.after[0], probe.before[3]) and torch.equal(probe.after[1], probe.before[7])
    assert torch.equal(model.net.bn.running_mean, probe.before[-1])
    assert model.net.bn.momentum == 0.1 and model.training
    assert not cb._cache  # no batch references left after fit


def test_recalibration_goes_on_after_full_size_until_the_statistics_forgot_the_small_sizes():
    # It stopped at the first full-size batch, and the validations of the next ~1/momentum steps read running
    # statistics still mostly of the smaller sizes (186% off right after the ramp, in a review's measure)
    model = SizeRecorder()
    model.net.bn.momentum = 0.5  # (1 - 0.5) ** 5 < 0.05: five full-size batches to forget
    cb = ProgressiveResizing(0.5, 0.25, 0.5, validation="recalibrate", calibration_batches=2)
    seen = []

    class Record(Callback):  # after `cb` in the list: its decision for this validation is made
        def on_validation_start(self, trainer, pl_module):
            if not trainer.sanity_checking:  # full-size training batches since the last smaller one
                seen.append((cb._full_batches, cb.recalibrations))

    trainer(callbacks=[cb, Record()], max_epochs=4, val_check_interval=1).fit(model, *loaders("list", size=SIZE))
    counts = [0] + [r for _, r in seen]
    for (since, _), before, after in zip(seen, counts, counts[1:], strict=False):
        assert after - before == (since < 5), since
    assert {since for since, _ in seen} >= {0, 1, 4, 5}  # 0.5 ** 5 < 0.05: recalibrated through 4, not at 5


def test_no_recalibration_in_a_run_that_never_trains_below_full_size():
    for cb in (
        ProgressiveResizing(1.0, mode="crop"),  # "auto": recalibrate in crop mode
        ProgressiveResizing(min_res=SIZE, max_res=SIZE, start_ramp=0, end_ramp=1, validation="recalibrate"),
    ):
        trainer(callbacks=[cb], max_epochs=2, val_check_interval=2).fit(SizeRecorder(), *loaders("list", size=SIZE))
        assert cb.recalibrations == 0


def test_a_run_resumed_after_the_ramp_recalibrates_where_the_uninterrupted_one_does(tmp_path):
    def run(ckpt_path=None, save=False):
        seed_everything(0)
        model = SizeRecorder()
        model.net.bn.momentum = 0.5  # recalibrated through 4 full-size batches
        cb = ProgressiveResizing(0.5, 0.25, 0.25, validation="recalibrate", calibration_batches=2)
        done = []

        class Record(Callback):
            def on_validation_end(self, trainer, pl_module):
                if not trainer.sanity_checking:
                    done.append((trainer.global_step, cb.recalibrations))

        every = [ModelCheckpoint(dirpath=tmp_path, every_n_train_steps=1, save_top_k=-1)] if save else []
        t = trainer(callbacks=[cb, Record(), *every], max_epochs=4, val_check_interval=1, enable_checkpointing=save)
        t.fit(model, *loaders("list", size=SIZE), ckpt_path=ckpt_path)
        return [(step, b - a) for (step, b), (_, a) in zip(done, [(0, 0), *done], strict=False)]

    full = run(save=True)  # full size from step 11 (16 px: 14 rounds up), recalibrated through step 14
    resumed = run(ckpt_path=next(tmp_path.glob("*step=12.ckpt")))  # 2 full-size batches in
    assert [r for _, r in resumed] == [r for step, r in full if step > 12] and resumed[0][1] == 1


def test_a_lazy_batchnorm_layer_is_recalibrated_from_the_first_validation():
    """Its statistics exist only after the first batch, past the point where the callback looks for layers."""
    model = SizeRecorder()
    model.net.bn = nn.LazyBatchNorm2d()
    cb = ProgressiveResizing(0.5, 1.0, 0.0, validation="recalibrate", calibration_batches=2)  # always at half size
    trainer(callbacks=[cb], max_epochs=2).fit(model, *loaders("list", n=64, size=SIZE))
    assert cb.recalibrations == 2  # was 0: validated with the half-size statistics, without a word


def test_recalibrated_statistics_equal_a_hand_recalibration():
    probe = StatsProbe()
    model = SizeRecorder()
    weights: list[dict[str, Tensor]] = []

    class Snapshot(Callback):  # before ProgressiveResizing: the model as training left it
        def on_validation_start(self, trainer, pl_module):
            weights.append(copy.deepcopy(pl_module.net.state_dict()))

    cb = ProgressiveResizing(0.5, 1.0, 0.0, validation="recalibrate", calibration_batches=2)
    trainer(callbacks=[Snapshot(), cb, probe], max_epochs=1).fit(model, *loaders("list", n=64, size=SIZE))
    net = PooledNet()
    net.load_state_dict(weights[0])
    originals = [unpack(b)[0] for b in loaders("list", n=64, size=SIZE)[0]]
    recalibrate_batchnorm(net, originals[2:4])  # the last two full-size batches of the epoch
    assert cb.recalibrations == 1
    val_mean, val_var, _, _ = probe.during[0]
    torch.testing.assert_close(val_mean, net.bn.running_mean)
    torch.testing.assert_close(val_var, net.bn.running_var)


class BeforeValidation(Callback):
    """Listed before ProgressiveResizing: the BatchNorm statistics as training left them."""

    def __init__(self) -> None:
        self.means: list[Tensor] = []

    def on_validation_start(self, trainer, pl_module):
        self.means.append(pl_module.net.bn.running_mean.clone())


def test_a_validation_that_raises_leaves_the_training_statistics():
    class FailsInValidation(SizeRecorder):
        def validation_step(self, batch, batch_idx):
            raise ArithmeticError("user bug in validation")

    before, probe = BeforeValidation(), StatsProbe()
    model = FailsInValidation()
    cb = ProgressiveResizing(0.5, 1.0, 0.0, validation="recalibrate", calibration_batches=2)
    with pytest.raises(ArithmeticError, match="user bug"):
        trainer(callbacks=[before, cb, probe], max_epochs=1).fit(model, *loaders("list", n=64, size=SIZE))
    assert cb.recalibrations == 1 and not torch.allclose(probe.during[0][0], before.means[0])  # recalibrated
    assert torch.equal(model.net.bn.running_mean, before.means[0]) and model.net.bn.momentum == 0.1
    assert not cb._cache


def test_a_checkpoint_taken_during_validation_stores_the_training_statistics(tmp_path):
    path, weights_only = tmp_path / "during-validation.ckpt", tmp_path / "weights-only.ckpt"
    seen: list[Tensor] = []
    exported: list[dict] = []
    copies: list[tuple] = []

    class SaveDuringValidation(Callback):  # after ProgressiveResizing: the model holds the recalibrated statistics
        def on_validation_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0):
            if batch_idx == 0:
                seen.append(pl_module.net.bn.running_mean.clone())
                trainer.save_checkpoint(path)
                # Lightning calls no callback for a weights-only checkpoint; an export reads the state dict alone
                trainer.save_checkpoint(weights_only, weights_only=True)
                exported.append({k: v.clone() for k, v in pl_module.state_dict().items()})  # as saved then
                pickle.dumps(pl_module)  # `torch.save(model)` meanwhile: the hook behind this must pickle too
                copies.append((copy.deepcopy(pl_module), pickle.loads(pickle.dumps(pl_module))))

    before = BeforeValidation()
    cb = ProgressiveResizing(0.5, 1.0, 0.0, validation="recalibrate", calibration_batches=2)
    trainer(callbacks=[before, cb, SaveDuringValidation()], max_epochs=1).fit(
        SizeRecorder(), *loaders("list", n=64, size=SIZE)
    )
    assert cb.recalibrations == 1 and not torch.allclose(seen[0], before.means[0])  # validation saw other stats
    state = torch.load(path, weights_only=False)["state_dict"]
    assert torch.equal(state["net.bn.running_mean"], before.means[0])  # but the checkpoint keeps the model's own
    assert state["net.bn.running_mean"] is not seen[0]
    assert torch.equal(
        torch.load(weights_only, weights_only=False)["state_dict"]["net.bn.running_mean"], state["net.bn.running_mean"]
    )
    assert torch.equal(exported[0]["net.bn.running_mean"], before.means[0])
    # copies made meanwhile report their own statistics: the hook the callback removes is the original's only,
    # and a copy's reported that validation's training statistics for good, whatever the copy did after
    for clone in copies[0]:
        clone.net.bn.running_mean.add_(1.0)
        assert torch.equal(clone.state_dict()["net.bn.running_mean"], clone.net.bn.running_mean)


def test_recalibration_errors_clearly_and_takes_a_custom_forward():
    class DictForward(SizeRecorder):
        def forward(self, batch):
            return self.net(batch["x"])

        def training_step(self, batch, batch_idx):
            x, y = unpack(batch)
            return F.cross_entropy(self({"x": x}), y)

        def validation_step(self, batch, batch_idx):
            pass

    cb = ProgressiveResizing(0.5, 1.0, 0.0, validation="recalibrate")
    model = DictForward()
    before = [p.detach().clone() for p in model.parameters()]
    t = trainer(callbacks=[cb], max_epochs=1)
    with pytest.raises(RuntimeError, match=r"calling `pl_module\(images\)`, which fails.*calibration_forward"):
        t.fit(model, *loaders("list", size=SIZE))
    assert t.global_step == 0 and all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
    cb = ProgressiveResizing(
        0.5, 1.0, 0.0, validation="recalibrate", calibration_forward=lambda module, images: module({"x": images})
    )
    trainer(callbacks=[cb], max_epochs=1).fit(DictForward(), *loaders("list", size=SIZE))
    assert cb.recalibrations == 1
    # a run that never validates needs no calibration forward: none is checked, no batch kept for it
    train, val = loaders("list", size=SIZE)
    for kwargs, fit_loaders in (({"limit_val_batches": 0}, (train, val)), ({}, (train,))):
        cb = ProgressiveResizing(0.5, 1.0, 0.0, mode="crop")  # "auto" is "recalibrate" in crop mode
        t = trainer(callbacks=[cb], max_epochs=1, **kwargs)
        t.fit(DictForward(), *fit_loaders)
        assert t.global_step == 4 and cb.recalibrations == 0 and not cb._cache


def test_weight_averaging_validates_its_own_statistics_so_recalibration_stands_aside(tmp_path):
    from lightning.pytorch.callbacks import EMAWeightAveraging

    cb = ProgressiveResizing(0.5, 1.0, 0.0, mode="crop", validation="recalibrate")
    # validation then scores the averaged model at full size, as a checkpoint saves it: no monitor warning
    checkpoint = ModelCheckpoint(dirpath=tmp_path, monitor="val_loss", save_top_k=1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer(callbacks=[cb, EMAWeightAveraging(decay=0.5), checkpoint], max_epochs=1, enable_checkpointing=True).fit(
            SizeRecorder(), *loaders("list", size=SIZE)
        )
    ours = [str(w.message) for w in caught if w.category is SpeedupWarning]
    assert len(ours) == 1 and re.search(r"EMAWeightAveraging validates its averaged weights.*'train_size'", ours[0])
    assert cb.recalibrations == 0 and not cb._cache


class DeviceNormalize(SpeedupCallback):
    """Preprocessing on the device, of training and validation batches alike: x -> (x - 5) * 10."""

    def transform_batch(self, trainer, pl_module, batch):
        x, y = batch
        return [(x - 5.0) * 10.0, y]

    def transform_validation_batch(self, trainer, pl_module, batch):
        return self.transform_batch(trainer, pl_module, batch)


def test_recalibration_sees_the_images_normalised_as_validation_sees_them():
    seen = []

    def record(module, images):
        seen.append(images.clone())
        return module(images)

    cb = ProgressiveResizing(0.5, 1.0, 0.0, mode="crop", validation="recalibrate", calibration_forward=record)
    train, val = loaders("list", size=SIZE)
    trainer(callbacks=[DeviceNormalize(), cb], max_epochs=1).fit(SizeRecorder(), train, val)
    raw = torch.cat([x for x, _ in train])
    torch.testing.assert_close(torch.cat(seen[1:]).sort(0).values, ((raw - 5.0) * 10.0).sort(0).values)


@pytest.mark.parametrize("mixup_first", [True, False])
def test_recalibration_sees_the_images_as_they_came_not_mixed(mixup_first):
    # with a MixUp before it, the cached images were the mixed ones: statistics of data validation never sees
    from lightning_speedups import MixUp

    seen = []

    def record(module, images):
        seen.append(images.clone())
        return module(images)

    cb = ProgressiveResizing(0.5, 1.0, 0.0, mode="crop", validation="recalibrate", calibration_forward=record)
    mixup = MixUp(alpha=1.0, num_classes=NUM_CLASSES)
    train, val = loaders("list", size=SIZE)
    trainer(callbacks=[mixup, cb] if mixup_first else [cb, mixup], max_epochs=1).fit(SizeRecorder(), train, val)
    raw = torch.cat([x for x, _ in train])
    calibration = torch.cat(seen[1:])  # after the fit-start check of two images
    assert cb.recalibrations == 1 and len(calibration) == len(raw)
    assert all((raw == image).flatten(1).all(1).any() for image in calibration)  # each one a sample as it came


def test_recalibration_leaves_the_runs_random_draws_alone():
    # a forward that draws in eval mode (noise injection): the recalibration's forwards moved the global generator
    class Noisy(SizeRecorder):
        def forward(self, x):
            h = F.relu(self.net.bn(self.net.conv(x)))
            return self.net.fc((h + 0.01 * torch.randn_like(h)).mean((2, 3)))

    weights = {}
    for validation in ("full", "recalibrate"):
        seed_everything(0)
        model = Noisy()
        cb = ProgressiveResizing(0.5, 1.0, 0.0, mode="crop", validation=validation, seed=1)
        trainer(callbacks=[cb], max_epochs=1, val_check_interval=2).fit(model, *loaders("list", size=SIZE))
        weights[validation] = model.net.conv.weight.detach().clone()
    assert cb.recalibrations >= 1 and torch.equal(weights["full"], weights["recalibrate"])


def test_checkpoint_selection_on_ramp_metrics_is_warned_about_and_full_validation_is_not(tmp_path):
    # measured with ModelCheckpoint(monitor="val_acc"): the best checkpoint, logged at 0.99 at the training size,
    # scored 0.12 at full size; nothing said so
    class LogsLoss(SizeRecorder):
        def training_step(self, batch, batch_idx):
            loss = super().training_step(batch, batch_idx)
            self.log("train_loss", loss)
            return loss

        def validation_step(self, batch, batch_idx):
            x, y = unpack(batch)
            self.log("val_loss", F.cross_entropy(self(x), y))

    selecting = ModelCheckpoint(dirpath=tmp_path, monitor="val_loss")
    with pytest.warns(
        SpeedupWarning, match=r"validation runs at the training size, and ModelCheckpoint\(monitor='val_loss'"
    ):
        trainer(callbacks=[ProgressiveResizing(), selecting], max_epochs=1, enable_checkpointing=True).fit(
            LogsLoss(), *loaders("list", size=SIZE)
        )
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*compares those metrics", category=SpeedupWarning)
        selecting = ModelCheckpoint(dirpath=tmp_path, monitor="val_loss")
        trainer(
            callbacks=[ProgressiveResizing(validation="full"), selecting], max_epochs=1, enable_checkpointing=True
        ).fit(LogsLoss(), *loaders("list", size=SIZE))
        on_training = ModelCheckpoint(dirpath=tmp_path, monitor="train_loss")  # measured as trained: no warning
        trainer(callbacks=[ProgressiveResizing(), on_training], max_epochs=1, enable_checkpointing=True).fit(
            LogsLoss(), *loaders("list", size=SIZE)
        )


class FrozenAndHead(SizeRecorder):
    """A BatchNorm frozen in eval mode (pretrained statistics 0.7) and a BatchNorm'd head that `forward` skips."""

    def __init__(self) -> None:
        super().__init__()
        self.frozen = nn.BatchNorm2d(1)
        self.frozen.running_mean.fill_(0.7)
        self.head_bn = nn.BatchNorm1d(NUM_CLASSES)
        self.frozen_modes: list[bool] = []

    def on_fit_start(self) -> None:
        self.frozen.eval()

    def forward(self, x: Tensor) -> Tensor:
        return self.net(self.frozen(x))

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        x, y = unpack(batch)
        self.frozen_modes.append(self.frozen.training)
        return F.cross_entropy(self.head_bn(self(x)), y)


def test_recalibration_leaves_frozen_layers_and_layers_it_cannot_reach():
    seen: list[tuple[Tensor, Tensor, Tensor]] = []
    trained: list[Tensor] = []

    class Probe(Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            trained.append(pl_module.head_bn.running_mean.clone())

        def on_validation_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0):
            m = pl_module
            seen.append((m.frozen.running_mean.clone(), m.head_bn.running_mean.clone(), m.net.bn.running_mean.clone()))

    model = FrozenAndHead()
    cb = ProgressiveResizing(0.5, 1.0, 0.0, validation="recalibrate")
    with pytest.warns(SpeedupWarning, match=r"never runs the BatchNorm layers \['head_bn'\]"):
        trainer(callbacks=[cb, Probe()], max_epochs=2).fit(model, *loaders("list", n=64, size=SIZE))
    assert cb.recalibrations == 2
    assert model.frozen_modes == [False] * 8  # the calibration check did not put the frozen layer in train mode
    for frozen, head, _ in seen:
        assert torch.equal(frozen, torch.full((1,), 0.7))  # frozen statistics are not re-estimated
        assert head.abs().sum() > 0  # the unreached head keeps its training statistics (not reset to 0)
    assert torch.equal(seen[-1][1], trained[-1])


class FreezesItsBatchNormAtEpoch3(SizeRecorder):
    def on_train_epoch_start(self):
        if self.current_epoch >= 3:
            self.net.bn.eval()  # a finetuning schedule freezes the layer, after the resizing reached full size


def test_a_layer_frozen_after_the_schedule_reached_full_size_keeps_its_statistics_at_validation():
    kept: list[bool] = []

    class Probe(Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            self.stats = pl_module.net.bn.running_mean.clone()

        def on_validation_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0):
            if batch_idx == 0 and trainer.current_epoch == 3:
                kept.append(torch.equal(pl_module.net.bn.running_mean, self.stats))

    # full size from step 8 (epoch 2) of 16; within the 29 full-size batches, so validation still recalibrates
    cb = ProgressiveResizing(0.5, 0.25, 0.5, mode="crop", validation="recalibrate", calibration_batches=2)
    trainer(callbacks=[cb, Probe()], max_epochs=4).fit(FreezesItsBatchNormAtEpoch3(), *loaders("list", n=64, size=SIZE))
    assert cb._settled and kept == [True]  # trained layers are listed every epoch, at full size too


# ---------------------------------------------------------------------------------------------- resume, logs
def run(tmp_path, ckpt_path=None, save=False, mode="crop"):
    seed_everything(11)
    model = SizeRecorder()
    extra = (
        [
            ModelCheckpoint(dirpath=tmp_path, every_n_train_steps=1, save_top_k=-1),
            ModelCheckpoint(dirpath=tmp_path / "val", every_n_epochs=1, save_top_k=-1),  # on_validation_end
        ]
        if save
        else []
    )
    cb = ProgressiveResizing(0.5, 0.25, 0.25, mode=mode, validation="recalibrate")
    t = trainer(callbacks=[cb, *extra], max_epochs=4, enable_checkpointing=save)
    t.fit(model, datamodule=ImagesDataModule(n=64, size=SIZE), ckpt_path=ckpt_path)
    return model


@pytest.mark.parametrize(
    ("mode", "step", "pattern"),
    [("crop", 6, "*step=6.ckpt"), ("resize", 8, "*step=8.ckpt"), ("resize", 8, "val/epoch=1-step=8.ckpt")],
    ids=["crop-mid-epoch", "resize-epoch-end", "resize-after-recalibrated-validation"],
)
def test_resume_mid_ramp_continues_at_the_same_scale(tmp_path, mode, step, pattern):
    full = run(tmp_path, save=True, mode=mode)
    (ckpt,) = tmp_path.glob(pattern)
    resumed = run(tmp_path / "resumed", ckpt_path=str(ckpt), mode=mode)
    sizes = [(s, size) for s, size, _, _ in full.train_seen]
    assert [(s, size) for s, size, _, _ in resumed.train_seen] == sizes[step:]
    assert len({size for _, size in sizes[step:]}) > 1  # resumed on the ramp
    for a, b in zip(full.state_dict().values(), resumed.state_dict().values(), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6)  # weights and BatchNorm buffers


def test_logs_scale_and_size():
    logger = MemoryLogger()
    cb = ProgressiveResizing(0.5, 0.25, 0.25, validation="train_size")
    trainer(callbacks=[cb], max_epochs=4, logger=logger, log_every_n_steps=1).fit(
        SizeRecorder(), *loaders("list", n=64, size=SIZE)
    )
    scales = dict(logger.history["progressive_resizing/scale"])
    heights = dict(logger.history["progressive_resizing/height"])
    assert (
        scales[0] == 0.5
        and scales[15] == 1.0
        and scales[6] == pytest.approx(progressive_scale(6 / 16, 0.5, 0.25, 0.25))
    )
    assert heights[0] == 8 and heights[15] == 16
    assert logger.history["progressive_resizing/val_height"][0][1] == 8.0
    assert cb.state_dict()["plan"] == {"scale": 1.0, "resolution": None, "size_increment": 4}
    # logged once per validation below full size, at its step (not at step 11, where the scale, still below 1,
    # rounds to the full 16 pixels, nor after), never with the training knobs (which would repeat the last
    # validation's size at every step until the next)
    assert logger.history["progressive_resizing/val_height"] == [(3, 8.0), (7, 12.0)]
    assert len(logger.history["progressive_resizing/val_width"]) == 2


def test_validation_loaders_of_other_sizes_log_no_single_validation_size():
    # val_height/val_width named the last loader's size, and labelled the other loaders' metrics with it
    train, val = loaders("list", n=64, size=SIZE)
    _, other = loaders("list", n=32, size=SIZE + 8)
    logger = MemoryLogger()

    class TwoLoaders(SizeRecorder):
        def validation_step(self, batch, batch_idx, dataloader_idx=0):
            super().validation_step(batch, batch_idx)

    cb = ProgressiveResizing(0.5, 1.0, 0.0, validation="train_size")
    with pytest.warns(SpeedupWarning, match="several image sizes.*val_height and val_width.*are not logged"):
        trainer(callbacks=[cb], max_epochs=2, logger=logger, log_every_n_steps=1).fit(TwoLoaders(), train, [val, other])
    assert "progressive_resizing/val_height" not in logger.history
    assert "progressive_resizing/height" in logger.history


def test_crop_after_cutmix_is_refused_and_before_it_is_fine():
    from lightning_speedups import CutMix

    with pytest.raises(ValueError, match=r"runs after CutMix here.*Put ProgressiveResizing before CutMix"):
        trainer(callbacks=[CutMix(num_classes=NUM_CLASSES), ProgressiveResizing(0.5, mode="crop")], max_steps=1).fit(
            SizeRecorder(), loaders("list", n=64, size=SIZE)[0]
        )
    model = SizeRecorder()
    trainer(callbacks=[ProgressiveResizing(0.5, mode="crop"), CutMix(num_classes=NUM_CLASSES)], max_steps=1).fit(
        model, loaders("list", n=64, size=SIZE)[0]
    )
    assert [size for _, size, _, _ in model.train_seen] == [(8, 8)]
    assert model.train_seen[0][3].is_floating_point()  # CutMix acted, on the cropped batch


# ---------------------------------------------------------------------------------------------- errors
@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"initial_scale": 0.0}, r"`initial_scale` must be in \(0, 1\], got 0.0"),
        ({"initial_scale": 1.5}, r"`initial_scale` must be in \(0, 1\], got 1.5"),
        ({"initial_scale": -0.5}, r"`initial_scale` must be in \(0, 1\]"),
        ({"delay_fraction": 0.6, "finetune_fraction": 0.5}, r"`delay_fraction \+ finetune_fraction` must be <= 1"),
        ({"delay_fraction": 1.2}, r"`delay_fraction` must be in \[0, 1\]"),
        ({"size_increment": 0}, "`size_increment` must be >= 1, got 0"),
        ({"size_increment": 2.5}, r"`size_increment` must be an int >= 1, got 2\.5\.$"),  # no "or None": refused
        ({"size_increment": True}, r"`size_increment` must be an int >= 1, got True\.$"),
        ({"mode": "zoom"}, "`mode` must be one of"),
        ({"interpolation": "area"}, "`interpolation` must be one of"),
        ({"validation": "never"}, "`validation` must be one of"),
        ({"calibration_batches": 0}, "`calibration_batches` must be >= 1"),
        ({"min_res": 8}, "missing"),
        ({"min_res": 16, "max_res": 8, "start_ramp": 0, "end_ramp": 1}, "`max_res` .* must be >= `min_res`"),
        ({"min_res": 8, "max_res": 16, "start_ramp": 3, "end_ramp": 1}, "`end_ramp` .* must be >= `start_ramp`"),
        ({"min_res": 8, "max_res": 16, "start_ramp": 0, "end_ramp": 1, "initial_scale": 0.3}, "not both"),
        ({"calibration_forward": 3}, "`calibration_forward` must be callable"),
    ],
)
def test_bad_arguments_fail_at_construction(kwargs, message):
    with pytest.raises((ValueError, TypeError), match=message):
        ProgressiveResizing(**kwargs)


def fit_expecting(callback, message, train, model=None, error=(ValueError, TypeError)):
    model = model or SizeRecorder()
    before = [p.detach().clone() for p in model.parameters()]
    with pytest.raises(error, match=message):
        trainer(callbacks=[callback], max_epochs=1).fit(model, train)
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))  # no step was taken


def test_non_image_input_names_the_shape_before_any_step():
    flat = DataLoader(TensorDataset(torch.randn(32, 10), torch.arange(32) % NUM_CLASSES), batch_size=16)
    fit_expecting(ProgressiveResizing(), r"\(N, C, H, W\), got a tensor of shape \(16, 10\)", flat)
    seq = DataLoader(TensorDataset(torch.randn(32, 3, 20), torch.arange(32) % NUM_CLASSES), batch_size=16)
    fit_expecting(ProgressiveResizing(), r"got a tensor of shape \(16, 3, 20\)", seq)


def test_other_bad_batches_before_any_step():
    x, y = image_tensors(32, SIZE)
    ints = DataLoader(TensorDataset((x * 50).to(torch.uint8), y), batch_size=16)
    fit_expecting(ProgressiveResizing(), "floating-point images, got dtype torch.uint8", ints)
    labels = DataLoader(TensorDataset(x, y), batch_size=16)
    fit_expecting(ProgressiveResizing(resize_targets=True), r"needs dense targets .* got \(16,\)", labels)
    fit_expecting(ProgressiveResizing(input_key="pixels"), r"no input at 'pixels'", loaders("dict", size=SIZE)[0])
    fit_expecting(
        ProgressiveResizing(mode="pipeline"),
        "needs the training loader of a `lightning_speedups.SpeedupDataModule`",
        loaders("list", size=SIZE)[0],
        error=RuntimeError,
    )


def test_an_epoch_ramp_beyond_the_images():
    fit_expecting(
        ProgressiveResizing(mode="crop", min_res=8, max_res=32, start_ramp=0, end_ramp=1),
        r"max_res=32, but the images are \(16, 16\): a crop cannot be larger",
        loaders("list", size=SIZE)[0],
    )
    model = SizeRecorder()
    cb = ProgressiveResizing(min_res=8, max_res=24, start_ramp=0, end_ramp=1, res_increment=8)
    with pytest.warns(SpeedupWarning, match="upsampled"):
        trainer(callbacks=[cb], max_epochs=2, limit_train_batches=1).fit(model, loaders("list", size=SIZE)[0])
    assert [size for _, size, _, _ in model.train_seen] == [(8, 8), (24, 24)]


class FixedInput(SizeRecorder):
    """A flatten before the classifier: full-size (16 x 16) inputs only."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Flatten(), nn.Linear(SIZE * SIZE, NUM_CLASSES))


def test_a_model_with_a_fixed_input_size_is_told_what_the_resizing_did():
    with pytest.raises(RuntimeError) as info:
        trainer(callbacks=[ProgressiveResizing(0.5, 0.5, 0.2)], max_epochs=1).fit(FixedInput(), *loaders(size=SIZE))
    notes = getattr(info.value, "__notes__", [])
    if sys.version_info >= (3, 11):
        assert notes and "resized this step's images to 8x8 (from 16x16)" in notes[0]

    # a model that trained at a reduced size and fails later for its own reasons gets no such note
    class FailsLater(SizeRecorder):
        def training_step(self, batch, batch_idx):
            if self.trainer.global_step == 2:
                raise RuntimeError("the model's own error")
            return super().training_step(batch, batch_idx)

    with pytest.raises(RuntimeError, match="the model's own error") as info:
        trainer(callbacks=[ProgressiveResizing(0.5, 0.5, 0.2)], max_epochs=1).fit(FailsLater(), *loaders(size=SIZE))
    assert not getattr(info.value, "__notes__", [])

    class FailsAtOnce(SizeRecorder):  # size-agnostic, failing at its first step for a reason of its own
        def training_step(self, batch, batch_idx):
            raise RuntimeError("CUDA error: device-side assert triggered")

    with pytest.raises(RuntimeError, match="device-side assert") as info:
        trainer(callbacks=[ProgressiveResizing(0.5, 0.5, 0.2)], max_epochs=1).fit(FailsAtOnce(), *loaders(size=SIZE))
    assert not getattr(info.value, "__notes__", [])  # not a shape error: no word about the resizing


def test_the_calibration_check_runs_in_the_precision_context():
    """Under 64-true Lightning makes float64 the default dtype inside its forward context: a model that builds a
    tensor there (here a projection) must pass the up-front check of the calibration forward as it trains."""

    class Projecting(SizeRecorder):
        def forward(self, x: Tensor) -> Tensor:
            net = self.net
            h = F.relu(net.bn(net.conv(x))).mean((2, 3))
            return net.fc(h @ torch.eye(h.shape[1]))  # the default dtype: float64 under 64-true

    model = Projecting()
    cb = ProgressiveResizing(0.5, 0.5, 0.2, validation="recalibrate")
    trainer(callbacks=[cb], max_epochs=2, precision="64-true").fit(model, *loaders(size=SIZE))
    assert cb.recalibrations >= 1 and model.train_seen[0][2].dtype == torch.float64


def test_the_epoch_ramp_needs_no_run_length():
    """The FFCV-style ramp follows the epoch number alone: a run whose length is unknown (here a stream without
    `max_steps`; `max_time` alone is the same) still trains at the ramp's sizes; the fraction schedule refuses."""

    class Stream(torch.utils.data.IterableDataset):
        def __iter__(self):
            x, y = image_tensors(32, SIZE)
            return iter(zip(x, y, strict=True))

    model = SizeRecorder()
    cb = ProgressiveResizing(min_res=8, max_res=16, start_ramp=0, end_ramp=2, res_increment=4, validation="full")
    trainer(callbacks=[cb], max_epochs=3).fit(model, DataLoader(Stream(), batch_size=8))
    assert [size for _, size, _, _ in model.train_seen] == [(8, 8)] * 4 + [(12, 12)] * 4 + [(16, 16)] * 4
    with pytest.raises(RuntimeError, match="ProgressiveResizing follows training progress"):
        trainer(callbacks=[ProgressiveResizing()], max_epochs=1).fit(SizeRecorder(), DataLoader(Stream(), batch_size=8))


def test_several_training_dataloaders_are_refused_before_the_first_step():
    """One batch per loader: the first loader's images alone would be resized (tensor batches), or the first
    step would fail with advice about `input_key`; the error comes at train start instead, naming the cause."""
    from lightning.pytorch.utilities import CombinedLoader

    images = DataLoader(image_tensors(32, SIZE)[0], batch_size=8)  # bare image tensors
    model = SizeRecorder()
    with pytest.raises(ValueError, match=r"ProgressiveResizing acts on training batches with one image input.*2 data"):
        trainer(callbacks=[ProgressiveResizing()], max_epochs=1).fit(model, CombinedLoader([images, images]))
    assert model.train_seen == []
