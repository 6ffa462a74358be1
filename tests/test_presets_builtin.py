"""The built-in presets: each trains with a real Trainer on CPU; shipped configs match and load in LightningCLI."""

from __future__ import annotations

import pytest
import torch
from lightning.pytorch.callbacks import BatchSizeFinder

from lightning_speedups import (
    CurriculumOrdering,
    CutMix,
    DropoutRemoval,
    LabelSmoothing,
    LinearScalingWarmup,
    MixUp,
    ProgressiveResizing,
    RepeatFactorSampling,
    presets,
)
from lightning_speedups.demo import DigitsDataModule, ImageClassifier

BUILT_IN = [
    "baseline",
    "curriculum",
    "large-batch",
    "long-tail",
    "vision-aggressive",
    "vision-medium",
    "vision-mild",
]
EXPECTED = {
    "baseline": [],
    "vision-mild": [ProgressiveResizing, LabelSmoothing, LinearScalingWarmup],
    "vision-medium": [ProgressiveResizing, LabelSmoothing, MixUp, LinearScalingWarmup],
    "vision-aggressive": [ProgressiveResizing, LabelSmoothing, MixUp, CutMix, DropoutRemoval, LinearScalingWarmup],
    "long-tail": [RepeatFactorSampling],
    "curriculum": [CurriculumOrdering],
    "large-batch": [BatchSizeFinder, LinearScalingWarmup],
}


def test_the_built_in_presets_are_registered_with_what_they_promise():
    assert set(BUILT_IN) <= set(presets.names())
    for name, classes in EXPECTED.items():
        assert [type(cb) for cb in presets.get(name, accelerator="cpu").callbacks] == classes, name
        assert presets.describe(name).startswith(f"{name}: ")


@pytest.mark.filterwarnings("ignore:.*every repeat factor is 1")  # digits are balanced: long-tail is a no-op
@pytest.mark.parametrize("name", BUILT_IN)
def test_every_preset_trains_with_a_real_trainer_on_cpu(name, tmp_path):
    torch.manual_seed(0)
    overrides = {"BatchSizeFinder": {"max_trials": 3}} if name == "large-batch" else {}
    recipe = presets.get(name, accelerator="cpu", **overrides)
    dm = DigitsDataModule(size=16, batch_size=32)
    model = ImageClassifier(widths=(8, 16), dropout=0.1)
    trainer = recipe.trainer(
        max_epochs=2,
        limit_train_batches=4,
        limit_val_batches=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=tmp_path,  # BatchSizeFinder writes a temporary checkpoint
    )
    before = [p.detach().clone() for p in model.parameters()]
    trainer.fit(model, datamodule=dm)
    assert trainer.global_step == 8 and trainer.state.finished
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
    assert torch.isfinite(trainer.callback_metrics["val_loss"])
    if name == "large-batch":
        assert dm.batch_size == 8  # 2 -> 4 -> 8 within max_trials=3
        warmup = next(cb for cb in recipe.callbacks if isinstance(cb, LinearScalingWarmup))
        assert warmup.scale == pytest.approx(8 / 32)  # tuned at the 32 the datamodule asked for
    if name.startswith("vision"):
        resizing = next(cb for cb in recipe.callbacks if isinstance(cb, ProgressiveResizing))
        assert resizing.knobs()["scale"] == 1.0 and resizing.knobs()["height"] == 16.0  # full size at the end


@pytest.mark.parametrize("name", BUILT_IN)
def test_shipped_config_matches_the_registry(name):
    assert presets.config_path(name).read_text() == presets.to_yaml(name), (
        'regenerate with: python -c "from lightning_speedups import presets; '
        "[(presets.CONFIG_DIR / f'{n}.yaml').write_text(presets.to_yaml(n)) for n in presets.names()]\""
    )
