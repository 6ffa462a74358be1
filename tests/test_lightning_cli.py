"""LightningCLI: every callback by short name, a preset by name (SpeedupCLI --preset), and the shipped configs."""

from __future__ import annotations

import pytest
import yaml
from lightning.pytorch.cli import LightningCLI

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
from lightning_speedups.lightning_cli import SpeedupCLI

TRAINER = ["--trainer.accelerator=cpu", "--trainer.logger=false", "--trainer.enable_checkpointing=false"]


@pytest.fixture(autouse=True)
def _no_pytest_argv(monkeypatch):
    monkeypatch.setattr("sys.argv", ["train.py"])  # LightningCLI warns when sys.argv and args both have options


def cli(args: list[str], cls=LightningCLI, **kwargs):
    return cls(
        ImageClassifier, DigitsDataModule, run=False, args=[*TRAINER, *args], save_config_callback=None, **kwargs
    )


@pytest.mark.parametrize(
    ("short", "cls", "arg", "value"),
    [
        ("MixUp", MixUp, "alpha", 0.4),
        ("CutMix", CutMix, "alpha", 0.5),
        ("LabelSmoothing", LabelSmoothing, "smoothing", 0.2),
        ("ProgressiveResizing", ProgressiveResizing, "initial_scale", 0.25),
        ("DropoutRemoval", DropoutRemoval, "start", 0.3),
        ("LinearScalingWarmup", LinearScalingWarmup, "reference_batch_size", 128),
        ("RepeatFactorSampling", RepeatFactorSampling, "threshold", 0.01),
        ("CurriculumOrdering", CurriculumOrdering, "start_fraction", 0.3),
    ],
)
def test_every_callback_by_short_name(short, cls, arg, value):
    c = cli([f"--trainer.callbacks+={short}", f"--trainer.callbacks.{arg}={value}"])
    ours = [cb for cb in c.trainer.callbacks if isinstance(cb, cls)]
    assert len(ours) == 1
    read = ours[0].pacing.start if arg == "start_fraction" else getattr(ours[0], arg)
    assert read == value


def test_the_curriculums_loss_scorer_from_the_command_line():
    # the type of `difficulty` gave jsonargparse no class to build: "Does not validate against any of the Union"
    from lightning_speedups import LossScore

    c = cli(["--trainer.callbacks+=CurriculumOrdering", "--trainer.callbacks.difficulty=lightning_speedups.LossScore"])
    (curriculum,) = [cb for cb in c.trainer.callbacks if isinstance(cb, CurriculumOrdering)]
    assert isinstance(curriculum.difficulty, LossScore)


def test_a_bad_callback_argument_fails_before_training_and_names_it():
    with pytest.raises(ValueError, match="`alpha` must be > 0"):
        cli(["--trainer.callbacks+=MixUp", "--trainer.callbacks.alpha=-1"])


def test_preset_by_name_puts_the_command_lines_other_callbacks_after_its_own_as_python_does():
    c = cli(["--preset=vision-medium", "--trainer.callbacks+=DropoutRemoval"], cls=SpeedupCLI)
    ours = [type(cb) for cb in c.trainer.callbacks if type(cb).__module__.startswith("lightning_speedups")]
    assert ours == [ProgressiveResizing, LabelSmoothing, MixUp, LinearScalingWarmup, DropoutRemoval]
    in_python = presets.get("vision-medium", accelerator="cpu").trainer(callbacks=[DropoutRemoval()], logger=False)
    assert [type(cb) for cb in in_python.callbacks if type(cb).__module__.startswith("lightning_speedups")] == ours


def test_preset_brings_its_recommended_precision_unless_the_command_line_chose(monkeypatch):
    # as on a GPU with native bf16 (bf16-mixed also runs on CPU, so the Trainer can be built here)
    monkeypatch.setattr(presets, "recommended_precision", lambda accelerator="auto": "bf16-mixed")
    assert cli(["--preset=vision-mild"], cls=SpeedupCLI).trainer.precision == "bf16-mixed"
    assert cli(["--preset=vision-mild", "--trainer.precision=32-true"], cls=SpeedupCLI).trainer.precision == "32-true"
    assert cli([], cls=SpeedupCLI).trainer.precision == "32-true"  # no preset: the Trainer's default


def test_the_command_line_wins_over_a_presets_trainer_settings(monkeypatch):
    name = "test-accumulate-4"
    monkeypatch.setattr(presets, "_REGISTRY", dict(presets._REGISTRY))  # this test's registration stays here
    presets.register(
        presets.declarative(name, "s", "d", [("LabelSmoothing", {})], trainer={"accumulate_grad_batches": 4})
    )
    assert cli([f"--preset={name}"], cls=SpeedupCLI).trainer.accumulate_grad_batches == 4
    chosen = cli([f"--preset={name}", "--trainer.accumulate_grad_batches=2"], cls=SpeedupCLI)
    assert chosen.trainer.accumulate_grad_batches == 2  # as `presets.get(name).trainer(accumulate_grad_batches=2)`
    chosen = cli([f"--preset={name}", "--trainer.accumulate_grad_batches=1"], cls=SpeedupCLI)
    assert chosen.trainer.accumulate_grad_batches == 1  # the Trainer's default, chosen: it wins too


def test_unknown_preset_is_a_parser_error_naming_the_closest(capsys):
    with pytest.raises(SystemExit):
        cli(["--preset=vision-mid"], cls=SpeedupCLI)
    err = capsys.readouterr().err
    assert "Unknown preset 'vision-mid'" in err and "Did you mean" in err


@pytest.mark.parametrize("name", ["vision-aggressive", "large-batch", "baseline"])
def test_shipped_config_loads_in_a_plain_lightning_cli(name):
    c = cli([f"--config={presets.config_path(name)}"])
    expected = [type(cb) for cb in presets.get(name, accelerator="cpu").callbacks]
    got = [type(cb) for cb in c.trainer.callbacks if type(cb) in set(expected)]
    assert got == expected
    if name == "large-batch":
        warmup = next(cb for cb in c.trainer.callbacks if isinstance(cb, LinearScalingWarmup))
        assert warmup.reference_batch_size == "initial" and warmup.warmup_unit == "fraction"


def test_print_config_carries_the_presets_settings(monkeypatch, capsys, tmp_path):
    name = "test-accumulate-4"
    monkeypatch.setattr(presets, "_REGISTRY", dict(presets._REGISTRY))
    presets.register(
        presets.declarative(name, "s", "d", [("LabelSmoothing", {})], trainer={"accumulate_grad_batches": 4})
    )
    with pytest.raises(SystemExit) as info:
        cli([f"--preset={name}", "--print_config"], cls=SpeedupCLI)
    assert info.value.code == 0
    printed = yaml.safe_load(capsys.readouterr().out)
    assert printed["preset"] == name and printed["trainer"]["accumulate_grad_batches"] == 4
    # re-running from the printed config keeps them; the command line still wins
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(printed))
    assert cli([f"--config={tmp_path / 'config.yaml'}"], cls=SpeedupCLI).trainer.accumulate_grad_batches == 4
    with pytest.raises(SystemExit):
        cli([f"--preset={name}", "--trainer.accumulate_grad_batches=2", "--print_config"], cls=SpeedupCLI)
    assert yaml.safe_load(capsys.readouterr().out)["trainer"]["accumulate_grad_batches"] == 2


def test_the_scripts_trainer_defaults_win_over_the_presets_settings(monkeypatch):
    # `LightningCLI(trainer_defaults=...)` is the script author's choice: like the command line, it wins
    monkeypatch.setattr(presets, "_REGISTRY", dict(presets._REGISTRY))
    presets.register(
        presets.declarative(
            "test-accumulate-4", "s", "d", [("LabelSmoothing", {})], trainer={"accumulate_grad_batches": 4}
        )
    )
    chosen = {"precision": "bf16-mixed", "accumulate_grad_batches": 3}
    c = cli(["--preset=test-accumulate-4"], cls=SpeedupCLI, trainer_defaults=chosen)
    assert c.trainer.precision == "bf16-mixed" and c.trainer.accumulate_grad_batches == 3
    c = cli(["--preset=test-accumulate-4", "--trainer.precision=32-true"], cls=SpeedupCLI, trainer_defaults=chosen)
    assert c.trainer.precision == "32-true"  # the command line still wins over both


def test_a_users_callback_of_a_presets_class_replaces_the_presets_in_the_cli(monkeypatch):
    # Lightning refused the pair ("Found more than one stateful callback of type `MixUp`"), and a different `p`
    # would have mixed twice: the user's explicit callback wins, as on the command line
    said: list[str] = []
    monkeypatch.setattr(presets, "rank_zero_info", lambda message, *a, **k: said.append(message), raising=False)
    monkeypatch.setattr(presets, "rank_zero_warn", lambda message, *a, **k: said.append(message), raising=False)
    c = cli(
        ["--preset=vision-medium", "--trainer.callbacks+=MixUp", "--trainer.callbacks.alpha=0.4"],
        cls=SpeedupCLI,
        trainer_defaults={"callbacks": [LabelSmoothing(0.05)]},
    )
    ours = [cb for cb in c.trainer.callbacks if type(cb).__module__.startswith("lightning_speedups")]
    # the command line's MixUp takes the preset's slot; the script's default LabelSmoothing, which Lightning adds
    # at the end, drops the preset's
    assert [type(cb) for cb in ours] == [ProgressiveResizing, MixUp, LinearScalingWarmup, LabelSmoothing]
    assert ours[1].alpha == 0.4 and ours[-1].smoothing == 0.05
    assert [s.split(",")[0] for s in said] == [  # each differs from the preset's: said with the arguments
        "Preset 'vision-medium': your LabelSmoothing replaces the preset's LabelSmoothing",
        "Preset 'vision-medium': your MixUp replaces the preset's MixUp",
    ]
    assert "smoothing=0.05 (the preset's: 0.1)" in said[0] and "alpha=0.4 (the preset's: 0.2)" in said[1]


def test_a_class_from_the_command_line_and_the_scripts_defaults_is_refused_as_without_a_preset(monkeypatch):
    # the command line's LabelSmoothing(0.2) was placed in the preset's slot, then dropped as if it were the
    # preset's by the script's default one: the user's 0.2 vanished without a word
    args = ["--preset=vision-mild", "--trainer.callbacks+=LabelSmoothing", "--trainer.callbacks.smoothing=0.2"]
    for extra in ([], args[:1]):
        with pytest.raises(Exception, match="more than one stateful callback of type `LabelSmoothing`"):
            cli(args[1:] + extra, cls=SpeedupCLI, trainer_defaults={"callbacks": [LabelSmoothing(0.05)]})


def test_a_batch_size_finder_preset_on_several_devices_is_a_parser_error(capsys):
    with pytest.raises(SystemExit):
        cli(["--preset=large-batch", "--trainer.devices=2"], cls=SpeedupCLI)
    err = capsys.readouterr().err
    assert "Preset 'large-batch' has a BatchSizeFinder, which runs on one device only" in err
    assert "--trainer.callbacks+=LinearScalingWarmup --trainer.callbacks.reference_batch_size=B" in err  # CLI form
    with pytest.raises(SystemExit):
        cli(["--preset=large-batch", "--trainer.strategy=ddp"], cls=SpeedupCLI)
    assert "strategy='ddp'" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # several nodes: refused as in Python, before any process starts
        cli(["--preset=large-batch", "--trainer.num_nodes=2"], cls=SpeedupCLI)
    assert "num_nodes=2" in capsys.readouterr().err


def test_a_function_preset_is_built_once_per_cli_run():
    calls = []

    @presets.register_preset("counted-recipe")
    def counted_recipe():
        calls.append(1)  # e.g. a side effect: reading a file, a log line
        return [LabelSmoothing(0.2)]

    try:
        c = cli(["--preset=counted-recipe"], cls=SpeedupCLI)
    finally:
        presets._REGISTRY.pop("counted-recipe")
    assert len(calls) == 1
    assert [cb.smoothing for cb in c.trainer.callbacks if isinstance(cb, LabelSmoothing)] == [0.2]


def test_a_misspelt_preset_with_print_config_is_a_parser_error_not_a_printed_config(capsys):
    with pytest.raises(SystemExit) as info:
        cli(["--preset=vison-mild", "--print_config"], cls=SpeedupCLI)
    captured = capsys.readouterr()
    assert info.value.code != 0 and "Did you mean 'vision-mild'?" in captured.err
    assert "preset: vison-mild" not in captured.out
