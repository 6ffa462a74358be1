"""A run resumed from a mid-training checkpoint ends with the weights of the uninterrupted run."""

import pytest
import torch
from lightning.pytorch import seed_everything
from lightning.pytorch.callbacks import ModelCheckpoint

from lightning_speedups import CutMix, LabelSmoothing, MixUp
from tests.helpers import ImagesDataModule, RecordingModule, trainer


def callbacks():
    return [MixUp(alpha=0.4), CutMix(p=0.5, start=0.25), LabelSmoothing(0.1, end=0.9)]


def run(tmp_path, ckpt_path=None, save=False):
    seed_everything(7)
    model = RecordingModule(record=False)
    extra = (
        [
            ModelCheckpoint(dirpath=tmp_path, every_n_train_steps=2, save_top_k=-1),
            ModelCheckpoint(dirpath=tmp_path / "val", every_n_epochs=1, save_top_k=-1),  # on_validation_end
        ]
        if save
        else []
    )
    t = trainer(callbacks=[*callbacks(), *extra], max_epochs=3, enable_checkpointing=save)
    t.fit(model, datamodule=ImagesDataModule(n=64, kind="dict"), ckpt_path=ckpt_path)
    return model


@pytest.mark.parametrize(
    "pattern",
    ["*step=4.ckpt", "*step=6.ckpt", "val/epoch=0*.ckpt"],
    ids=["last-batch", "mid-epoch", "val-end"],
)
def test_resume_matches_uninterrupted_run(tmp_path, pattern):
    full = run(tmp_path, save=True)
    (ckpt,) = tmp_path.glob(pattern)
    resumed = run(tmp_path / "resumed", ckpt_path=str(ckpt))
    for a, b in zip(full.state_dict().values(), resumed.state_dict().values(), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6)


def test_a_different_seed_gives_different_weights(tmp_path):
    """The comparison above can fail: runs that draw differently end differently."""
    a = run(tmp_path)
    seed_everything(8)
    model = RecordingModule(record=False)
    trainer(callbacks=[MixUp(alpha=0.4, seed=99)], max_epochs=3).fit(model, datamodule=ImagesDataModule(n=64))
    assert not torch.allclose(a.net.fc.weight, model.net.fc.weight)
