"""ProgressiveResizing(mode="pipeline"): the size reaches the dataset's transforms inside DataLoader workers."""

import os
import random
import sys
import warnings
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F
import torchvision.transforms.v2 as T
from lightning.pytorch import LightningModule, seed_everything
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from torch import Tensor
from torch.utils.data import Dataset, Subset, get_worker_info, random_split
from torchvision.datasets import FakeData

from lightning_speedups import ProgressiveResizing, ScheduledResize, SpeedupDataModule, SpeedupWarning
from lightning_speedups.data import ResumableDataLoader
from lightning_speedups.functional import ResizePlan
from lightning_speedups.pipeline import PlannedIndex, ResolutionDataset, ResolutionSampler, current_resize_plan
from tests.helpers import NUM_CLASSES, image_tensors, trainer
from tests.test_progressive_resizing import PooledNet

SIZE = 16


class TransformedImages(Dataset):
    """Synthetic 16 x 16 images through a transform; each sample says which process made it."""

    def __init__(self, n: int = 64, transform: Any = None, seed: int = 0) -> None:
        self.x, self.y = image_tensors(n, SIZE, seed=seed)
        self.transform = transform

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i: int) -> tuple[Tensor, Tensor, int]:
        x = self.x[i] if self.transform is None else self.transform(self.x[i])
        info = get_worker_info()
        return x, self.y[i], os.getpid() if info is not None else -1


class PipelineData(SpeedupDataModule):
    num_classes = NUM_CLASSES

    def __init__(self, n: int = 64, transform: Any = "default", **kwargs: Any) -> None:
        kwargs.setdefault("batch_size", 8)
        super().__init__(**kwargs)
        self.n = n
        self.transform = ScheduledResize() if transform == "default" else transform

    def setup(self, stage: str) -> None:
        self.train_dataset = TransformedImages(self.n, self.transform)
        self.val_dataset = TransformedImages(16, self.transform, seed=1)  # same transform: full size there

    def val_dataloader(self):
        return self.eval_dataloader(self.val_dataset)


class PipelineRecorder(LightningModule):
    """Records, per training step, the batch's size, what the on-device schedule says, and the producers."""

    def __init__(self) -> None:
        super().__init__()
        self.net = PooledNet()
        self.steps: list[tuple[int, tuple[int, int], tuple[int, int], set[int]]] = []
        self.val_sizes: list[tuple[int, int]] = []
        self.inputs: list[Tensor] = []

    def forward(self, x: Tensor) -> Tensor:
        return self.net(x)

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        x, y, pids = batch
        (cb,) = [c for c in self.trainer.callbacks if isinstance(c, ProgressiveResizing)]
        on_device = cb.current_plan(self.trainer).size_for((SIZE, SIZE))
        self.steps.append((self.trainer.global_step, tuple(x.shape[-2:]), on_device, set(pids.tolist())))
        self.inputs.append(x.detach().clone())
        return F.cross_entropy(self(x), y)

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        self.val_sizes.append(tuple(batch[0].shape[-2:]))

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.05)


@pytest.mark.parametrize("persistent", [True, False], ids=["persistent", "not-persistent"])
def test_sizes_are_made_in_worker_processes_at_the_step_they_train(persistent):
    model = PipelineRecorder()
    dm = PipelineData(num_workers=2, persistent_workers=persistent)
    cb = ProgressiveResizing(0.5, 0.25, 0.25, mode="pipeline", validation="full")
    trainer(callbacks=[cb], max_epochs=3).fit(model, datamodule=dm)
    assert len(model.steps) == 24
    main = os.getpid()
    for step, size, on_device, pids in model.steps:
        assert size == on_device, f"step {step}: the pipeline made {size}, the schedule says {on_device}"
        assert -1 not in pids and main not in pids  # made in worker processes
    sizes = [size for _, size, _, _ in model.steps]
    assert sizes[0] == (8, 8) and sizes[-1] == (16, 16) and (12, 12) in sizes
    assert len(set(sizes[8:16])) > 1  # the size changes inside an epoch, with workers prefetching ahead
    workers = set().union(*(pids for *_, pids in model.steps))
    assert len(workers) == (2 if persistent else 6)  # persistent: the same two workers all along
    assert set(model.val_sizes) == {(16, 16)}  # validation indices carry no plan: the same transform gives full size


def test_exact_under_accumulation_and_limited_batches():
    model = PipelineRecorder()
    cb = ProgressiveResizing(0.25, 0.2, 0.2, mode="pipeline", size_increment=2)
    t = trainer(callbacks=[cb], max_epochs=4, accumulate_grad_batches=2, limit_train_batches=0.75)
    t.fit(model, datamodule=PipelineData(num_workers=0))
    assert len(model.steps) == 4 * 6  # 6 of the 8 batches per epoch
    assert all(size == on_device for _, size, on_device, _ in model.steps)
    assert len({size for _, size, _, _ in model.steps}) >= 4


def test_exact_under_a_gradient_accumulation_scheduler():
    # epoch 0 steps every batch, then every second one: the pipeline's sizes must follow each epoch's own count
    from lightning.pytorch.callbacks import GradientAccumulationScheduler

    model = PipelineRecorder()
    cb = ProgressiveResizing(0.5, 0.25, 0.25, mode="pipeline", validation="full")
    t = trainer(callbacks=[GradientAccumulationScheduler({0: 1, 1: 2}), cb], max_epochs=3, limit_val_batches=0)
    t.fit(model, datamodule=PipelineData(num_workers=1))
    assert t.global_step == 8 + 4 + 4
    assert all(size == on_device for _, size, on_device, _ in model.steps)
    assert len({size for _, size, _, _ in model.steps}) == 3


class ChangingLength(PipelineData):
    """A training set whose length changes at each reload: 64, 32, 64, 64 samples."""

    def get_train_dataset(self):
        epoch = self.trainer.fit_loop.epoch_progress.current.processed if self.trainer is not None else 0
        return TransformedImages((64, 32, 64, 64)[min(epoch, 3)], self.transform)


@pytest.mark.parametrize("workers", [0, 1])
def test_exact_when_a_reloaded_loader_changes_length(workers):
    # the pipeline counted every earlier epoch at the new length: 12 -> 8 -> 12 px, then full size early
    model = PipelineRecorder()
    cb = ProgressiveResizing(0.5, 0.0, 0.0, mode="pipeline", validation="full")
    t = trainer(callbacks=[cb], max_epochs=4, max_steps=20, reload_dataloaders_every_n_epochs=1, limit_val_batches=0)
    t.fit(model, datamodule=ChangingLength(num_workers=workers))
    assert t.global_step == 20
    assert all(size == on_device for _, size, on_device, _ in model.steps), model.steps
    sizes = [size[0] for _, size, _, _ in model.steps]
    assert sizes == sorted(sizes) and sizes[0] == 8 and sizes[-1] == 16  # it never shrinks again


@pytest.mark.parametrize(
    ("step", "workers"),
    [
        (14, 0),
        # a worker prefetches while Lightning sets the loader up, before `on_train_start` restored the progress
        (14, 1),
        (12, 0),  # the last batch of epoch 1: the resumed run starts at epoch 2's first batch
    ],
)
def test_a_resume_mid_epoch_after_a_reload_of_another_length_keeps_the_pipeline_on_the_schedule(
    tmp_path, step, workers
):
    # Lightning runs no epoch start for the resumed epoch: the anchor's epoch comes from the checkpoint
    from lightning.pytorch.callbacks import ModelCheckpoint

    def run(ckpt_path=None):
        model = PipelineRecorder()
        cb = ProgressiveResizing(0.5, 0.0, 0.0, mode="pipeline", validation="full")
        saving = [] if ckpt_path else [ModelCheckpoint(dirpath=tmp_path, every_n_train_steps=step, save_top_k=-1)]
        t = trainer(
            callbacks=[cb, *saving],
            max_epochs=4,
            max_steps=20,
            reload_dataloaders_every_n_epochs=1,
            limit_val_batches=0,
            enable_checkpointing=not ckpt_path,
        )
        t.fit(model, datamodule=ChangingLength(num_workers=workers), ckpt_path=ckpt_path)
        return [(size, on_device) for _, size, on_device, _ in model.steps]

    full = run()
    (ckpt,) = tmp_path.glob(f"*-step={step}.ckpt")  # epochs of 8, 4, 8 batches
    resumed = run(str(ckpt))
    assert resumed == full[step:] and all(size == on_device for size, on_device in resumed)


class ShorterAfterEpoch0(PipelineData):
    """64 samples in epoch 0, then 32: with reloads every 2 epochs, epochs of 8, 8, 4, 4 batches."""

    def get_train_dataset(self):
        epoch = self.trainer.fit_loop.epoch_progress.current.processed if self.trainer is not None else 0
        return TransformedImages(64 if epoch < 1 else 32, self.transform)


def test_a_resume_at_an_epochs_last_batch_before_a_reload_of_another_length_plans_the_prefetched_batches_right(
    tmp_path,
):
    # the worker's first batches of epoch 2 were planned before Lightning recorded its reload, spread over the
    # rest of the run at the finished epoch's length
    from lightning.pytorch.callbacks import ModelCheckpoint

    def run(ckpt_path=None):
        model = PipelineRecorder()
        cb = ProgressiveResizing(0.25, 0.0, 0.0, mode="pipeline", validation="full")
        saving = [] if ckpt_path else [ModelCheckpoint(dirpath=tmp_path, every_n_train_steps=16, save_top_k=-1)]
        t = trainer(
            callbacks=[cb, *saving],
            max_epochs=4,
            reload_dataloaders_every_n_epochs=2,
            limit_val_batches=0,
            enable_checkpointing=not ckpt_path,
        )
        t.fit(model, datamodule=ShorterAfterEpoch0(num_workers=1), ckpt_path=ckpt_path)
        return [(size, on_device) for _, size, on_device, _ in model.steps]

    full = run()
    resumed = run(str(next(tmp_path.glob("*-step=16.ckpt"))))  # the last batch of epoch 1 (8 batches an epoch)
    assert resumed == full[16:] and all(size == on_device for size, on_device in resumed)


def test_uint8_images_validate_at_the_training_size_in_their_own_dtype():
    # the workers resize uint8 as torchvision does; validation at the training size raised at the first validation
    class Bytes(PipelineData):
        def setup(self, stage):
            super().setup(stage)
            for data in (self.train_dataset, self.val_dataset):
                data.x = (data.x.clamp(0, 1) * 255).to(torch.uint8)

    class FloatsIn(PipelineRecorder):
        def forward(self, x):
            return self.net(x.float() / 255)

        def validation_step(self, batch, batch_idx):
            assert batch[0].dtype == torch.uint8
            super().validation_step(batch, batch_idx)

    model = FloatsIn()
    cb = ProgressiveResizing(0.5, 0.5, 0.2, mode="pipeline")  # validation: "auto", the training size here
    trainer(callbacks=[cb], max_epochs=2).fit(model, datamodule=Bytes(n=32, num_workers=0))
    assert model.val_sizes == [(8, 8), (8, 8), (16, 16), (16, 16)]


def test_exact_under_manual_optimization_with_two_optimizers_and_max_steps():
    """Lightning's global step counts both optimizers' steps: max_steps=40 is 20 batches, and the pipeline's sizes
    must follow the on-device schedule over those 20 batches (not stay small as if there were 40)."""

    class TwoOptimizers(PipelineRecorder):
        def __init__(self) -> None:
            super().__init__()
            self.automatic_optimization = False

        def training_step(self, batch: Any, batch_idx: int) -> None:
            x, y, _ = batch
            (cb,) = [c for c in self.trainer.callbacks if isinstance(c, ProgressiveResizing)]
            self.steps.append((batch_idx, tuple(x.shape[-2:]), cb.current_plan(self.trainer).size_for((SIZE, SIZE))))
            for opt in self.optimizers():
                opt.zero_grad()
                self.manual_backward(F.cross_entropy(self(x), y))
                opt.step()

        def configure_optimizers(self) -> Any:
            return [
                torch.optim.SGD(self.net.conv.parameters(), lr=0.05),
                torch.optim.SGD(self.net.fc.parameters(), lr=0.05),
            ]

    model = TwoOptimizers()
    cb = ProgressiveResizing(0.5, 0.25, 0.25, mode="pipeline", validation="full")
    t = trainer(callbacks=[cb], max_epochs=10, max_steps=40, limit_val_batches=0)
    t.fit(model, datamodule=PipelineData(num_workers=0))
    assert t.global_step == 40 and len(model.steps) == 20
    assert all(size == on_device for _, size, on_device in model.steps)
    assert model.steps[0][1] == (8, 8) and model.steps[-1][1] == (16, 16)


class PrivateEpochShuffle(torch.utils.data.Sampler):
    """A per-epoch seeded shuffle that follows `set_epoch` but keeps its epoch private (no `.epoch`)."""

    def __init__(self, n: int, seed: int, epoch: int) -> None:
        self.n, self.seed, self._epoch = n, seed, epoch

    def set_epoch(self, epoch: int) -> None:
        self._epoch = epoch

    def __len__(self) -> int:
        return self.n

    def __iter__(self):
        return iter(torch.randperm(self.n, generator=torch.Generator().manual_seed(self.seed + self._epoch)).tolist())


class PrivateEpochProvider(Callback):
    def make_train_sampler(self, datamodule, dataset, *, epoch, num_replicas, rank, seed):
        return PrivateEpochShuffle(len(dataset), seed, epoch)


def test_sizes_follow_the_epochs_of_a_sampler_without_an_epoch_attribute():
    """The plans are numbered by the epoch Lightning sets, also when the wrapped sampler does not expose it."""
    model = PipelineRecorder()
    cb = ProgressiveResizing(0.5, 0.25, 0.25, mode="pipeline", validation="full")
    trainer(callbacks=[PrivateEpochProvider(), cb], max_epochs=3, limit_val_batches=0).fit(
        model, datamodule=PipelineData(num_workers=0)
    )
    assert len(model.steps) == 24
    assert all(size == on_device for _, size, on_device, _ in model.steps)
    assert model.steps[-1][1] == (16, 16)
    inner = PrivateEpochShuffle(8, seed=0, epoch=2)
    sampler = ResolutionSampler(inner, 4, lambda epoch, batch: ResizePlan(), epoch=2)
    assert sampler.epoch == 2
    sampler.set_epoch(3)
    assert sampler.epoch == inner._epoch == 3  # kept here and passed on


@pytest.mark.parametrize("split", ["subset", "random_split"])
def test_subsets_and_splits_of_the_dataset_work(split):
    """`Subset` (what `random_split` returns) fetches batches through `__getitems__`; each planned index must
    still load under its plan."""

    class Split(PipelineData):
        def setup(self, stage):
            super().setup(stage)
            full = self.train_dataset
            if split == "subset":
                self.train_dataset = Subset(full, list(range(0, 64, 2)))
            else:
                self.train_dataset, _ = random_split(full, [32, 32], generator=torch.Generator().manual_seed(0))

    model = PipelineRecorder()
    cb = ProgressiveResizing(0.5, 0.5, 0.0, mode="pipeline", validation="full")
    trainer(callbacks=[cb], max_epochs=2).fit(model, datamodule=Split(num_workers=1))
    assert len(model.steps) == 8
    assert all(size == on_device for _, size, on_device, _ in model.steps)
    assert [size for _, size, _, _ in model.steps][:4] == [(8, 8)] * 4


def test_factory_transforms_work_on_pil_images():
    sizes = []

    class Module(PipelineRecorder):
        def training_step(self, batch, batch_idx):
            x, y = batch
            sizes.append(tuple(x.shape[-2:]))
            return F.cross_entropy(self(x.mean(1, keepdim=True)), y % NUM_CLASSES)

    class Fake(SpeedupDataModule):
        def setup(self, stage):
            pipeline = T.Compose(
                [ScheduledResize(24, factory=T.RandomResizedCrop), T.ToImage(), T.ToDtype(torch.float32, scale=True)]
            )
            self.train_dataset = FakeData(32, image_size=(3, 40, 40), num_classes=4, transform=pipeline)

    cb = ProgressiveResizing(0.5, 0.5, 0.5, mode="pipeline", size_increment=8)  # a step to full size at 50%
    trainer(callbacks=[cb], max_epochs=2).fit(Module(), datamodule=Fake(batch_size=8, num_workers=1))
    assert sizes == [(16, 16)] * 4 + [(24, 24)] * 4  # 24 * 0.5 = 12 -> 16 (multiple of 8), then full 24


def test_a_fit_that_goes_on_from_steps_taken_stays_on_the_schedule(tmp_path):
    # a second fit with a loader of another length, and a resume from the epoch-end checkpoint of an epoch cut
    # by max_steps: steps taken, then this loader's length (the pipeline counted every epoch at the current length)
    model = PipelineRecorder()
    cb = ProgressiveResizing(0.25, 0.0, 0.0, mode="pipeline", validation="full", size_increment=1)
    t = trainer(callbacks=[cb], max_epochs=2, limit_val_batches=0)
    t.fit(model, datamodule=PipelineData(n=64, num_workers=1))  # 8 batches per epoch
    t.fit_loop.max_epochs = 4
    model.steps.clear()
    t.fit(model, datamodule=PipelineData(n=32, num_workers=1))  # then 4: 16 + 8 steps
    assert len(model.steps) == 8 and model.steps[-1][2] == (16, 16)
    assert all(size == on_device for _, size, on_device, _ in model.steps)

    saver = ModelCheckpoint(dirpath=tmp_path)  # saves at the end of the cut epoch
    cut = ProgressiveResizing(0.25, 0.0, 0.0, mode="pipeline", validation="full", size_increment=1)
    trainer(callbacks=[cut, saver], max_epochs=3, max_steps=12, limit_val_batches=0, enable_checkpointing=True).fit(
        PipelineRecorder(), datamodule=PipelineData(n=64, num_workers=1)
    )  # stops 4 batches into epoch 1; Lightning resumes at epoch 2, step 12
    model = PipelineRecorder()
    resumed = ProgressiveResizing(0.25, 0.0, 0.0, mode="pipeline", validation="full", size_increment=1)
    (ckpt,) = tmp_path.glob("*.ckpt")
    trainer(callbacks=[resumed], max_epochs=3, limit_val_batches=0).fit(
        model, datamodule=PipelineData(n=64, num_workers=1), ckpt_path=str(ckpt)
    )
    assert [step for step, *_ in model.steps] == list(range(12, 20))
    assert all(size == on_device for _, size, on_device, _ in model.steps)


def test_resume_mid_epoch_continues_at_the_same_sizes(tmp_path):
    def run(ckpt_path=None, save=False):
        seed_everything(5)
        model = PipelineRecorder()
        extra = [ModelCheckpoint(dirpath=tmp_path, every_n_train_steps=1, save_top_k=-1)] if save else []
        cb = ProgressiveResizing(0.5, 0.25, 0.25, mode="pipeline", validation="recalibrate")
        t = trainer(callbacks=[cb, *extra], max_epochs=3, enable_checkpointing=save)
        t.fit(model, datamodule=PipelineData(num_workers=1), ckpt_path=ckpt_path)
        return model

    full = run(save=True)
    resumed = run(ckpt_path=str(tmp_path / "epoch=1-step=11.ckpt"))  # 8 batches per epoch: mid-epoch, mid-ramp
    assert [s[:2] for s in resumed.steps] == [s[:2] for s in full.steps[11:]]
    assert len({s[1] for s in resumed.steps}) > 1
    for a, b in zip(full.inputs[11:], resumed.inputs, strict=True):
        assert torch.equal(a, b)  # the very same samples, at the same sizes
    for a, b in zip(full.state_dict().values(), resumed.state_dict().values(), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6)


def test_recalibration_loads_full_size_samples():
    shapes = []

    def forward(module, images):
        shapes.append(tuple(images.shape))
        return module(images)

    cb = ProgressiveResizing(
        0.5, 1.0, 0.0, mode="pipeline", validation="recalibrate", calibration_batches=3, calibration_forward=forward
    )
    model = PipelineRecorder()
    trainer(callbacks=[cb], max_epochs=1).fit(model, datamodule=PipelineData(num_workers=1))
    # first the check before the first step (two images of that batch), then three full-size batches
    assert cb.recalibrations == 1 and shapes == [(2, 1, 8, 8)] + [(8, 1, 16, 16)] * 3
    assert {s[1] for s in model.steps} == {(8, 8)}


@pytest.mark.parametrize("min_res", [8, SIZE], ids=["ramp", "full-size-ramp"])
def test_an_epoch_ramp_to_full_size_stops_recalibrating_as_on_the_device(min_res):
    """An epoch ramp's plans name a resolution: batches it brings to the images' own size count as full size, so
    recalibration stops once BatchNorm has forgotten the smaller sizes (29 batches at momentum 0.1) and never
    starts for a ramp that stays at full size, as in on-device mode (it recalibrated at every validation)."""
    counts = {}
    for mode in ("resize", "pipeline"):
        cb = ProgressiveResizing(
            mode=mode, validation="recalibrate", min_res=min_res, max_res=SIZE, start_ramp=0, end_ramp=1
        )
        data = PipelineData(transform="default" if mode == "pipeline" else None, num_workers=0)
        model = PipelineRecorder()
        trainer(callbacks=[cb], max_epochs=8, num_sanity_val_steps=0).fit(model, datamodule=data)  # 8 steps each
        assert [size for _, size, _, _ in model.steps[::8]] == [(min_res, min_res)] + [(SIZE, SIZE)] * 7
        counts[mode] = cb.recalibrations
    # after epochs 0 to 3 (0, 8, 16, 24 full-size batches in a row); none once it never trained smaller
    assert counts == {"resize": 4 if min_res < SIZE else 0, "pipeline": 4 if min_res < SIZE else 0}


class LargerImages(PipelineData):
    """The same data at 24 x 24: another full size for the next fit."""

    def setup(self, stage: str) -> None:
        super().setup(stage)
        for dataset in (self.train_dataset, self.val_dataset):
            dataset.x = F.interpolate(dataset.x, size=(24, 24))


def _pad_to_largest(samples: list[tuple[Tensor, Tensor, int]]) -> tuple[Tensor, Tensor, Tensor]:
    """Detection-style collate: images of several sizes padded to the batch's largest."""
    side = max(x.shape[-1] for x, _, _ in samples)
    xs = torch.stack([F.pad(x, (0, side - x.shape[-1], 0, side - x.shape[-2])) for x, _, _ in samples])
    return xs, torch.stack([y for _, y, _ in samples]), torch.tensor([pid for _, _, pid in samples])


class MixedSizes(PipelineData):
    """Native 16 x 16 images, and every fourth at 20 x 20; batches padded to their largest."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(collate_fn=_pad_to_largest, **kwargs)

    def setup(self, stage: str) -> None:
        super().setup(stage)
        x = self.train_dataset.x
        self.train_dataset.x = [F.pad(x[i], (2, 2, 2, 2)) if i % 4 == 0 else x[i] for i in range(len(x))]


def test_the_full_size_is_learned_per_fit_and_only_from_batches_of_one_size():
    ramp = dict(mode="pipeline", validation="recalibrate", min_res=8, max_res=SIZE, start_ramp=0, end_ramp=1)
    cb = ProgressiveResizing(**ramp)
    trainer(callbacks=[cb], max_epochs=2, num_sanity_val_steps=0).fit(
        PipelineRecorder(), datamodule=PipelineData(num_workers=0)
    )
    assert cb._full == (SIZE, SIZE) and cb.recalibrations == 2
    # the same callback on 24 x 24 data: the ramp (to 16) never reaches full size, every validation recalibrates
    trainer(callbacks=[cb], max_epochs=5, num_sanity_val_steps=0).fit(
        PipelineRecorder(), datamodule=LargerImages(num_workers=0)
    )
    assert cb._full == (24, 24) and cb.recalibrations == 2 + 5
    # padded batches of several sizes name no one full size: every validation recalibrates, as on the device
    cb = ProgressiveResizing(**ramp)
    trainer(callbacks=[cb], max_epochs=6, num_sanity_val_steps=0).fit(
        PipelineRecorder(), datamodule=MixedSizes(num_workers=0)
    )
    assert cb.recalibrations == 6
    # calibration batches of several sizes (padded, as the random draw makes them): no full size is learned
    cb = ProgressiveResizing(**ramp)
    cb._learn_full_size([torch.zeros(8, 1, 16, 16), torch.zeros(8, 1, 20, 20)])
    assert cb._full is None
    cb._learn_full_size([torch.zeros(8, 1, 20, 20)] * 2)
    assert cb._full == (20, 20)


def test_a_checkpoint_without_the_run_length_counts_full_size_batches_from_the_resume():
    cb = ProgressiveResizing(
        mode="pipeline", validation="recalibrate", min_res=8, max_res=SIZE, start_ramp=0, end_ramp=1
    )
    state = cb.state_dict()
    state.update(size=[SIZE, SIZE], full=None, full_batches=0)
    del state["run"]
    cb.load_state_dict(state)
    assert cb._run == 0  # not "forever": the batches before the checkpoint are not known to be full size


def test_recalibration_leaves_the_global_random_generators_alone():
    """Loading calibration samples runs the dataset's random augmentations in the main process; the rest of the
    run's randomness must not depend on whether validation recalibrated."""
    states = []

    class Record(Callback):
        def on_validation_start(self, trainer, pl_module):
            states.append((torch.get_rng_state(), random.getstate(), np.random.get_state()[1].copy()))

    class RandomFlip:  # draws from all three global generators, as augmentation code does
        def __call__(self, x):
            random.random(), np.random.rand()
            return x.flip(-1) if torch.rand(()) < 0.5 else x

    pipeline = T.Compose([RandomFlip(), ScheduledResize()])
    cb = ProgressiveResizing(0.5, 1.0, 0.0, mode="pipeline", validation="recalibrate", calibration_batches=2)
    model = PipelineRecorder()
    trainer(callbacks=[Record(), cb, Record()], max_epochs=1).fit(
        model, datamodule=PipelineData(transform=pipeline, num_workers=1)
    )
    assert cb.recalibrations == 1
    (torch_before, py_before, np_before), (torch_after, py_after, np_after) = states
    assert torch.equal(torch_before, torch_after) and py_before == py_after and (np_before == np_after).all()


def test_a_pipeline_without_the_transform_fails_clearly():
    dm = PipelineData(transform=None, num_workers=1)
    with pytest.raises(RuntimeError, match=r"never asked for the current size.*ScheduledResize"):
        trainer(callbacks=[ProgressiveResizing(mode="pipeline")], max_epochs=1).fit(PipelineRecorder(), datamodule=dm)


def test_a_train_dataloader_override_fails_with_its_cause():
    class OwnLoader(PipelineData):
        def train_dataloader(self):
            return torch.utils.data.DataLoader(
                self.train_dataset, batch_size=8, sampler=self.train_sampler(self.train_dataset)
            )

    with pytest.raises(
        RuntimeError, match=r"a `train_dataloader` override that builds its own.*super\(\)\.train_dataloader"
    ):
        trainer(callbacks=[ProgressiveResizing(mode="pipeline")], max_epochs=1).fit(
            PipelineRecorder(), datamodule=OwnLoader(num_workers=0)
        )


def test_a_loader_built_by_hand_before_the_trainer_is_told_to_pass_the_datamodule():
    dm = PipelineData(num_workers=0)
    dm.setup("fit")
    loader = dm.train_dataloader()  # no trainer yet: no callback could attach the sizes
    with pytest.raises(RuntimeError, match=r"while the datamodule was not this trainer.s.*datamodule=dm"):
        trainer(callbacks=[ProgressiveResizing(mode="pipeline")], max_epochs=1).fit(
            PipelineRecorder(), train_dataloaders=loader
        )

    dm = PipelineData(num_workers=0)  # attached to an earlier fit's trainer, then built by hand for this one
    trainer(callbacks=[ProgressiveResizing(mode="pipeline")], max_steps=1).fit(PipelineRecorder(), datamodule=dm)
    with pytest.raises(RuntimeError, match=r"while the datamodule was not this trainer.s.*datamodule=dm"):
        trainer(callbacks=[ProgressiveResizing(mode="pipeline")], max_epochs=1).fit(
            PipelineRecorder(), train_dataloaders=dm.train_dataloader()
        )

    class OwnResumableLoader(PipelineData):  # an override docs/data.md shows: not built by hand, not wrapped
        def train_dataloader(self):
            sampler = self.train_sampler(self.train_dataset)
            return ResumableDataLoader(self.train_dataset, batch_size=8, sampler=sampler, speedups_datamodule=self)

    with pytest.raises(RuntimeError, match=r"a `train_dataloader` override that builds its own"):
        trainer(callbacks=[ProgressiveResizing(mode="pipeline")], max_epochs=1).fit(
            PipelineRecorder(), datamodule=OwnResumableLoader(num_workers=0)
        )


class SwapTransformAtEpoch1(Callback):
    """Swaps the training dataset's transform through the loader, as a user's augmentation schedule can."""

    def on_train_epoch_start(self, trainer, pl_module) -> None:
        if trainer.current_epoch == 1:
            trainer.train_dataloader.dataset.transform = T.Compose([ScheduledResize(), T.Lambda(torch.zeros_like)])


@pytest.mark.parametrize("workers", [0, 2])
def test_an_attribute_set_on_the_training_loaders_dataset_reaches_the_dataset(workers):
    # it was set on the pipeline's wrapper, which the workers never read: the old transform stayed, silently
    model = PipelineRecorder()
    cb = ProgressiveResizing(0.5, 0.0, 0.0, mode="pipeline", validation="full")
    dm = PipelineData(num_workers=workers, persistent_workers=False)
    trainer(callbacks=[cb, SwapTransformAtEpoch1()], max_epochs=2).fit(model, datamodule=dm)
    assert isinstance(dm.train_dataset.transform, T.Compose)
    assert all(x.abs().sum() > 0 for x in model.inputs[:8]) and all(x.abs().sum() == 0 for x in model.inputs[8:])
    assert len(model.inputs) == 16 and model.inputs[8].shape[-1] < SIZE  # still at the scheduled size
    wrapped = ResolutionDataset(TransformedImages(4))
    del wrapped.transform
    assert not hasattr(wrapped.dataset, "transform") and wrapped._verified is False  # its own stay its own


@pytest.mark.parametrize("getter", [False, True], ids=["keys", "getter"])
def test_two_training_loaders_are_refused_for_what_they_are(getter):
    # with a getter and setter (what the resize mode's message advises) the pipeline check blamed a loader
    # "not built by SpeedupDataModule.train_dataloader()", which both were
    class Two(PipelineData):
        def train_dataloader(self):
            return {"a": super().train_dataloader(), "b": super().train_dataloader()}

    kwargs = {"batch_getter": lambda b: tuple(b["a"][:2]), "batch_setter": lambda b, x, y: b} if getter else {}
    cb = ProgressiveResizing(mode="pipeline", **kwargs)
    with pytest.raises(ValueError, match=r"2 dataloader\(s\) given as a dict.*concatenate the datasets\)\.$"):
        trainer(callbacks=[cb], max_epochs=1).fit(PipelineRecorder(), datamodule=Two(num_workers=0))


@pytest.mark.parametrize("factory", [None, T.RandomResizedCrop], ids=["resize", "factory"])
def test_an_image_and_its_mask_come_to_the_same_size_the_mask_with_nearest(factory):
    from torchvision import tv_tensors

    g = torch.Generator().manual_seed(0)
    image = tv_tensors.Image(torch.rand(3, SIZE, SIZE, generator=g))
    mask = tv_tensors.Mask(torch.randint(0, 5, (SIZE, SIZE), generator=g))
    resize = ScheduledResize(SIZE, factory=factory)

    class Pairs(Dataset):
        def __len__(self):
            return 1

        def __getitem__(self, i):  # the v2 way: one call, every input transformed alike
            return resize(image, mask), resize({"image": image, "mask": mask})

    (img, msk), as_dict = ResolutionDataset(Pairs())[PlannedIndex(0, ResizePlan(scale=0.5))]
    assert img.shape == (3, 8, 8) and msk.shape == (8, 8) and as_dict["mask"].shape == (8, 8)
    assert msk.dtype == torch.long and set(msk.unique().tolist()) <= set(mask.unique().tolist())  # nearest
    if factory is None:
        assert torch.equal(msk, mask[::2, ::2]) and torch.equal(as_dict["mask"], msk)
    (img, msk), _ = Pairs()[0]  # outside a planned batch: full size
    assert img.shape == (3, SIZE, SIZE) and msk.shape == (SIZE, SIZE)
    assert ScheduledResize(8)(image=img).shape == (3, 8, 8)  # the single-image keyword still works
    # a mask as a plain tensor is no mask to torchvision (left at full size): said, once per transform
    unmarked = ScheduledResize(SIZE)
    with pytest.warns(
        SpeedupWarning, match=r"image comes with a plain tensor or a one-channel PIL image.*tv_tensors\.Mask"
    ):
        unmarked(torch.rand(3, SIZE, SIZE), torch.zeros(SIZE, SIZE, dtype=torch.long))
    with warnings.catch_warnings():
        warnings.simplefilter("error", SpeedupWarning)
        unmarked(torch.rand(3, SIZE, SIZE), torch.zeros(SIZE, SIZE, dtype=torch.long))
        ScheduledResize(SIZE)(torch.rand(3, SIZE, SIZE), mask)  # a marked mask beside a plain image: fine
    with pytest.raises(TypeError, match=r"found no image in its inputs.*str"):
        ScheduledResize()("not an image", 3)


class Segmentation(Dataset):
    """Images and their masks (class 1 where the first channel is bright), through a v2 transform in one call."""

    def __init__(self, n: int, transform: Any = None, seed: int = 0) -> None:
        g = torch.Generator().manual_seed(seed)
        self.x = torch.rand(n, 3, SIZE, SIZE, generator=g)
        self.m = (self.x[:, 0] > 0.5).long()
        self.transform = transform

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> tuple[Tensor, Tensor]:
        from torchvision import tv_tensors

        image, mask = tv_tensors.Image(self.x[i]), tv_tensors.Mask(self.m[i])
        if self.transform is not None:
            image, mask = self.transform(image, mask)
        return image.as_subclass(Tensor), mask.as_subclass(Tensor)


class SegmentationData(SpeedupDataModule):
    def setup(self, stage: str) -> None:
        self.train_dataset = Segmentation(32, ScheduledResize(SIZE, interpolation="nearest"))
        self.val_dataset = Segmentation(8, seed=1)  # full size: the callback brings it to the training size

    def val_dataloader(self):
        return self.eval_dataloader(self.val_dataset)


class PixelClassifier(LightningModule):
    """Per-pixel logits at the input's size; its loss needs masks of that size too."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 2, 3, padding=1)
        self.val_pairs: list[tuple[tuple[int, ...], tuple[int, ...]]] = []

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        x, mask = batch
        return F.cross_entropy(self.conv(x), mask)

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, mask = batch
        self.val_pairs.append((tuple(x.shape[-2:]), tuple(mask.shape[-2:])))
        self.log("val_loss", F.cross_entropy(self.conv(x), mask))

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def test_validation_masks_follow_their_images_to_the_training_size_with_resize_targets():
    # the workers size the training masks; validation at the training size shrank the images only, and a model
    # whose loss needs masks of its output's size failed an epoch into training
    model = PixelClassifier()
    cb = ProgressiveResizing(0.5, 0.5, 0.2, mode="pipeline", resize_targets=True)
    trainer(callbacks=[cb], max_epochs=2, num_sanity_val_steps=0).fit(
        model, datamodule=SegmentationData(batch_size=8, num_workers=0)
    )
    assert model.val_pairs == [((8, 8), (8, 8)), ((16, 16), (16, 16))]
    # without it: said at the first training batch, before the first validation
    # nor where validation never shrinks anything: no validation, or a schedule at full size throughout
    quiet = [(ProgressiveResizing(1.0, mode="pipeline"), {})]
    quiet.append((ProgressiveResizing(0.5, 0.5, 0.2, mode="pipeline"), {"limit_val_batches": 0}))
    for cb, kwargs in quiet:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            trainer(callbacks=[cb], max_epochs=1, **kwargs).fit(
                PixelClassifier(), datamodule=SegmentationData(batch_size=8, num_workers=0)
            )
        assert not [w for w in caught if "look like masks" in str(w.message)]
    said = pytest.warns(SpeedupWarning, match=r"look like masks of the images' size.*`resize_targets=True`")
    with said, pytest.raises(RuntimeError, match="size"):  # an epoch into training: at the first validation
        trainer(callbacks=[ProgressiveResizing(0.5, 0.5, 0.2, mode="pipeline")], max_epochs=2).fit(
            PixelClassifier(), datamodule=SegmentationData(batch_size=8, num_workers=0)
        )


def test_a_channel_less_tensor_is_resized_as_one_image():
    # an (H, W) sample (grayscale, no channel) passed at full size, then crashed in torchvision at the first
    # reduced batch ("not enough values to unpack")
    wrapped = ResolutionDataset(TransformedImages(8, ScheduledResize(interpolation="nearest")))
    wrapped.dataset.x = wrapped.dataset.x[:, 0]  # (N, H, W)
    image = wrapped[PlannedIndex(0, ResizePlan(scale=0.5))][0]
    assert image.shape == (8, 8)
    assert torch.equal(image, wrapped[0][0][::2, ::2])  # nearest at half size: every other pixel
    assert wrapped[0][0].shape == (16, 16)
    # a 2-D tv_tensors.Mask on its own stays a Mask, resized with nearest (its labels kept), as torchvision does it
    from torchvision import tv_tensors

    mask = tv_tensors.Mask(torch.tensor([0, 5, 9, 5], dtype=torch.uint8).repeat_interleave(4).repeat(16, 1))

    class OneMask(Dataset):
        transform = ScheduledResize()  # bilinear for images

        def __len__(self) -> int:
            return 1

        def __getitem__(self, i: int) -> tuple[Tensor]:
            return (self.transform(mask),)

    small = ResolutionDataset(OneMask())[PlannedIndex(0, ResizePlan(scale=0.5))][0]
    assert isinstance(small, tv_tensors.Mask) and small.shape == (8, 8)
    assert set(small.unique().tolist()) == {0, 5, 9}


def test_wrappers_directly():
    base = TransformedImages(8, ScheduledResize(interpolation="nearest"))
    wrapped = ResolutionDataset(base)
    assert wrapped[PlannedIndex(0, ResizePlan(scale=0.5))][0].shape == (1, 8, 8)
    assert wrapped[0][0].shape == (1, 16, 16) and wrapped.y is base.y  # plain indices, attributes pass through
    assert [s[0].shape for s in wrapped.__getitems__([PlannedIndex(1, ResizePlan(scale=0.5)), 2])] == [
        (1, 8, 8),
        (1, 16, 16),
    ]
    base.__marker__ = True
    assert not hasattr(wrapped, "__marker__")  # special names are the wrapper's own, never the wrapped dataset's
    assert current_resize_plan() is None  # the plan is current only while a sample loads
    plans = []

    def plan_for_batch(epoch: int, batch: int) -> ResizePlan:
        plans.append((epoch, batch))
        return ResizePlan(scale=1 / (batch + 1))

    from lightning_speedups.data import EpochShuffleSampler

    sampler = ResolutionSampler(EpochShuffleSampler(range(10), num_replicas=1, rank=0, epoch=2), 4, plan_for_batch)
    items = list(sampler)
    assert len(sampler) == 10 and sorted(i.index for i in items) == list(range(10))
    assert [i.plan.scale for i in items] == [1.0] * 4 + [0.5] * 4 + [1 / 3] * 2
    assert plans == [(2, 0), (2, 1), (2, 2)] and sampler.epoch == 2
    sampler.set_epoch(3)
    sampler.skip_next(4)
    items = list(sampler)
    assert len(items) == 6 and plans[-2:] == [(3, 1), (3, 2)]  # skipped batch 0: numbering continues at 1
    with pytest.raises(ValueError, match="`size` must be"):
        ScheduledResize(size=(0, 4))
    with pytest.raises(ValueError, match="give the full `size`"):
        ScheduledResize(factory=T.Resize)


def test_a_sampler_that_cannot_skip_keeps_the_plans_numbered_from_the_resumed_batch():
    sampler = ResolutionSampler(PrivateEpochShuffle(10, seed=0, epoch=0), 4, lambda e, b: ResizePlan(scale=1 / (b + 1)))
    with pytest.warns(UserWarning, match="has no `skip_next`.*restarts the epoch's data from its first batch"):
        sampler.skip_next(4)
    items = list(sampler)
    assert sorted(i.index for i in items) == list(range(10))  # the data restarts: every sample again
    # the loop resumes at batch 1: its plan, not batch 0's (which would lag the schedule by one batch)
    assert [i.plan.scale for i in items] == [0.5] * 4 + [1 / 3] * 4 + [0.25] * 2
    assert [i.plan.scale for i in sampler][:1] == [1.0]  # the next pass starts at batch 0 again


@pytest.mark.skipif(sys.version_info < (3, 11), reason="exception notes are Python 3.11+")
def test_a_fixed_input_model_is_told_what_the_pipeline_did():
    class FixedInput(PipelineRecorder):
        def __init__(self) -> None:
            super().__init__()
            self.net = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(SIZE * SIZE, NUM_CLASSES))

    cb = ProgressiveResizing(0.5, 0.5, 0.2, mode="pipeline", validation="full")
    with pytest.raises(RuntimeError) as info:
        trainer(callbacks=[cb], max_epochs=1).fit(FixedInput(), datamodule=PipelineData(num_workers=0))
    notes = getattr(info.value, "__notes__", [])
    assert notes and "had its data pipeline make this step's images 8x8" in notes[0], notes


def test_an_epoch_ramp_beyond_the_images_warns_in_the_pipeline_too():
    model = PipelineRecorder()
    cb = ProgressiveResizing(min_res=8, max_res=24, start_ramp=0, end_ramp=1, res_increment=8, mode="pipeline")
    with pytest.warns(UserWarning, match=r"resolution of 24, above the images' shorter side \(16 of 16x16\)"):
        trainer(callbacks=[cb], max_epochs=2, limit_train_batches=1, limit_val_batches=0).fit(
            model, datamodule=PipelineData(num_workers=0)
        )
    assert [size for _, size, _, _ in model.steps] == [(8, 8), (24, 24)]


def test_a_transforms_warnings_are_said_by_rank_zeros_workers_only(monkeypatch):
    # workers forked from each DDP rank keep Lightning's record of the rank: one warning per run, not per rank
    from lightning.fabric.utilities.rank_zero import rank_zero_only

    def warned(rank):
        monkeypatch.setattr(rank_zero_only, "rank", rank)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            ScheduledResize(SIZE)(torch.rand(3, SIZE, SIZE), torch.zeros(SIZE, SIZE, dtype=torch.long))
            ResolutionDataset(TransformedImages(1, ScheduledResize()))[PlannedIndex(0, ResizePlan(resolution=32))]
        return sorted("Mask" in str(w.message) for w in caught if issubclass(w.category, SpeedupWarning))

    assert warned(1) == []
    assert warned(0) == [False, True]  # the upsampling and the unmarked mask
    # a worker started by spawn has no record of its rank: the transform brings its process's in the pickle
    import pickle

    monkeypatch.setattr(rank_zero_only, "rank", 1)
    sent = pickle.dumps(ScheduledResize(SIZE))
    monkeypatch.setattr(rank_zero_only, "rank", 0)  # what a spawned worker of rank 1 would read
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        pickle.loads(sent)(torch.rand(3, SIZE, SIZE), torch.zeros(SIZE, SIZE, dtype=torch.long))
    assert not [w for w in caught if issubclass(w.category, SpeedupWarning)]


class ScheduledRecorder(PipelineRecorder):
    """Reads ``estimated_stepping_batches`` in ``configure_optimizers`` (a OneCycle or cosine schedule would), so
    the training loader exists before a tuner's trial; records trial batches' sizes apart."""

    def __init__(self) -> None:
        super().__init__()
        self.lr = 0.05
        self.trial_sizes: list[tuple[int, int]] = []

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        if not any(isinstance(c, ProgressiveResizing) for c in self.trainer.callbacks):  # the tuner's trial
            self.trial_sizes.append(tuple(batch[0].shape[-2:]))
            return F.cross_entropy(self(batch[0]), batch[1])
        return super().training_step(batch, batch_idx)

    def configure_optimizers(self) -> Any:
        assert self.trainer.estimated_stepping_batches > 0
        return torch.optim.SGD(self.parameters(), lr=self.lr)


@pytest.mark.parametrize("tuner", ["lr_finder", "batch_size_finder"])
def test_a_tuner_trial_neither_shrinks_its_own_batches_nor_leaves_its_run_length_for_the_real_run(tuner, tmp_path):
    # The trial's short max_steps stayed cached in the epoch counts: the real run jumped to full size mid-ramp.
    from lightning.pytorch.callbacks import BatchSizeFinder, LearningRateFinder

    finder = LearningRateFinder(num_training_steps=5) if tuner == "lr_finder" else BatchSizeFinder(max_trials=1)
    model = ScheduledRecorder()
    cb = ProgressiveResizing(0.5, 0.25, 0.25, mode="pipeline", validation="full", size_increment=2)
    trainer(callbacks=[finder, cb], max_epochs=3, default_root_dir=tmp_path).fit(
        model, datamodule=PipelineData(n=32, batch_size=8, num_workers=0)
    )
    assert model.trial_sizes and set(model.trial_sizes) == {(SIZE, SIZE)}  # trials see full-size batches
    assert [size for _, size, _, _ in model.steps] == [on_device for _, _, on_device, _ in model.steps]
    assert model.steps[0][1] == (8, 8) and len({size for _, size, _, _ in model.steps}) >= 3
