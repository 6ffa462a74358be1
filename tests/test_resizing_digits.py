"""On digits: under the default, mid-run validation tracks the model at its training size; full size would not."""

import pytest
import torch
from lightning.pytorch import seed_everything
from lightning.pytorch.callbacks import Callback

from lightning_speedups import ProgressiveResizing
from lightning_speedups.demo import DigitsDataModule, ImageClassifier
from lightning_speedups.functional import resize_batch, resize_images
from tests.helpers import trainer


class Reference(Callback):
    """Listed before ProgressiveResizing. Before each validation, on the whole validation set, independently:
    the model's accuracy at its current training size and at full size, as trained (its own statistics)."""

    def __init__(self, callback: ProgressiveResizing) -> None:
        self.callback = callback
        self.rows: list[dict[str, float]] = []

    def on_validation_start(self, trainer, pl_module):
        x, y = trainer.datamodule.val_dataset.tensors
        plan = self.callback._plan
        size = plan.size_for(tuple(x.shape[-2:]))
        with torch.no_grad():
            at_train_size = (pl_module(resize_images(x, size)).argmax(1) == y).float().mean().item()
            at_full_size = (pl_module(x).argmax(1) == y).float().mean().item()
        self.rows.append({"scale": plan.scale, "train_size": at_train_size, "full_size": at_full_size})

    def on_validation_end(self, trainer, pl_module):
        self.rows[-1]["logged"] = trainer.callback_metrics["val_acc"].item()


def test_mid_run_validation_tracks_the_model_at_its_training_size():
    seed_everything(0)
    callback = ProgressiveResizing(initial_scale=0.5, delay_fraction=0.4, finetune_fraction=0.2)  # the issue's
    reference = Reference(callback)
    t = trainer(callbacks=[reference, callback], max_epochs=4, val_check_interval=0.5)
    t.fit(ImageClassifier(widths=(8, 16, 32)), DigitsDataModule(size=16))
    mid_run = [row for row in reference.rows if row["scale"] < 1.0]
    assert len(mid_run) >= 4
    for row in mid_run:  # the default validation stays within a few points of the model at its training size
        assert row["logged"] == pytest.approx(row["train_size"], abs=0.03), row
    # ... where plain full-size validation would be blind: the model is good at its size, poor at full size
    learned = [row for row in mid_run if row["train_size"] >= 0.85]
    assert learned, reference.rows
    assert all(row["full_size"] < row["train_size"] - 0.3 for row in learned), reference.rows
    assert reference.rows[-1]["scale"] == 1.0 and reference.rows[-1]["logged"] > 0.8  # full size at the end


class CropReference(Reference):
    """In crop mode the training size is a random window: the model's accuracy on such windows (a fixed draw)."""

    def on_validation_start(self, trainer, pl_module):
        x, y = trainer.datamodule.val_dataset.tensors
        plan = self.callback._plan
        size = plan.size_for(tuple(x.shape[-2:]))
        windows, _ = resize_batch(x, size, "crop", generator=torch.Generator().manual_seed(0))
        with torch.no_grad():
            at_train_size = (pl_module(windows).argmax(1) == y).float().mean().item()
            at_full_size = (pl_module(x).argmax(1) == y).float().mean().item()
        self.rows.append({"side": size[0], "train_size": at_train_size, "full_size": at_full_size})


def test_crop_mode_default_recalibrates_and_validation_tracks_training():
    seed_everything(0)
    callback = ProgressiveResizing(initial_scale=0.5, delay_fraction=0.4, finetune_fraction=0.2, mode="crop")
    assert callback.val_remedy == "recalibrate"  # the default in crop mode: full size, BatchNorm re-estimated
    reference = CropReference(callback)
    t = trainer(callbacks=[reference, callback], max_epochs=4, val_check_interval=0.5)
    t.fit(ImageClassifier(widths=(8, 16, 32)), DigitsDataModule(size=16))
    mid_run = [row for row in reference.rows if row["side"] < 16]  # trained on windows smaller than the image
    # (and the validations at full size within ~29 steps of the ramp's end, whose statistics still hold the small)
    assert len(mid_run) >= 4 and len(mid_run) < callback.recalibrations <= len(reference.rows)
    for row in mid_run:  # never below the model's own accuracy on its training windows (less a few points)
        assert row["logged"] >= row["train_size"] - 0.03, row
    # and well above full-size validation on the training statistics, which the remedy replaces
    gains = sorted(row["logged"] - row["full_size"] for row in mid_run)
    assert gains[len(gains) // 2] > 0.1, reference.rows
