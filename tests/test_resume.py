"""A run resumed from a mid-training checkpoint ends with the weights of the uninterrupted run."""

import pytest
import torch
from lightning.pytorch import seed_everything
from lightning.pytorch.callbacks import ModelCheckpoint

from lightning_speedups import CutMix, LabelSmoothing, MixUp
from tests.helpers import ImagesDataModule, RecordingModule, trainer


def callbacks(seed=None):
    return [MixUp(alpha=0.4, seed=seed), CutMix(p=0.5, start=0.25, seed=seed), LabelSmoothing(0.1, end=0.9)]


def run(tmp_path, ckpt_path=None, save=False, seed=None):
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
    t = trainer(callbacks=[*callbacks(seed), *extra], max_epochs=3, enable_checkpointing=save)
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


def test_only_the_callbacks_draws_differing_gives_different_weights(tmp_path):
    """The comparison above can fail: the same initial weights, data and order, with only the callbacks'
    random draws changed (their seed), end with other weights."""
    a, b = run(tmp_path), run(tmp_path, seed=99)
    assert not torch.allclose(a.net.fc.weight, b.net.fc.weight)
    torch.testing.assert_close(run(tmp_path).net.fc.weight, a.net.fc.weight, rtol=0, atol=0)  # same seed: same run
