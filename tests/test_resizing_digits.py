"""On digits: under the default, mid-run validation tracks the model at its training size; full size would not."""

import pytest
import torch
from lightning.pytorch import seed_everything
from lightning.pytorch.callbacks import Callback

from lightning_speedups import ProgressiveResizing
from lightning_speedups.demo import DigitsDataModule, ImageClassifier
from lightning_speedups.functional import resize_images
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
