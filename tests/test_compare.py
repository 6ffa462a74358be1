"""`lightning-speedups compare` and `presets` from the command line: output files and clear errors."""

import io
import json
import re
import sys
from dataclasses import asdict

import pytest
import torch

from lightning_speedups import presets
from lightning_speedups.cli import main
from lightning_speedups.compare import (
    CompareConfig,
    CompareError,
    _median_to_target,
    _run,
    load_object,
    parse_callback,
    run_comparison,
)
from lightning_speedups.demo import DigitsDataModule, ImageClassifier
from lightning_speedups.meter import Checkpoint

TINY = [
    "--model",
    "lightning_speedups.demo:ImageClassifier",
    "--datamodule",
    "lightning_speedups.demo:DigitsDataModule",
    "--model-args",
    '{"widths": [8, 16]}',
    "--datamodule-args",
    '{"size": 8, "batch_size": 128}',
    "--accelerator",
    "cpu",
    "--max-epochs",
    "1",
    "--no-progress",
]


def test_compare_on_a_tiny_budget_writes_its_table_and_plot(tmp_path, capsys):
    out = tmp_path / "out"
    assert (
        main(["compare", "--callback", "MixUp:alpha=0.4", "--callback", "LabelSmoothing", *TINY, "--output", str(out)])
        == 0
    )
    printed = capsys.readouterr().out
    assert "| baseline |" in printed and "| callbacks: MixUp:alpha=0.4, LabelSmoothing |" in printed
    assert (out / "report.md").read_text().startswith("## callbacks: MixUp:alpha=0.4, LabelSmoothing vs baseline")
    assert (out / "accuracy.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    results = json.loads((out / "results.json").read_text())
    arms = {run["arm"] for run in results["runs"]}
    assert arms == {"baseline", "callbacks: MixUp:alpha=0.4, LabelSmoothing"}  # same FLOPs: no budget arm
    baseline = next(s for s in results["summaries"] if s["arm"] == "baseline")
    assert baseline["flops"] > 0 and baseline["steps"] == 12  # 1438 samples / 128 per batch
    assert baseline["speedup_flops"] == pytest.approx(1.0)
    assert "No baseline shortened to the recipe's FLOPs: the recipe's training FLOPs are not below" in printed


def test_a_flop_saving_preset_gets_the_equal_budget_baseline(tmp_path, capsys):
    tiny = [a if a != '{"size": 8, "batch_size": 128}' else '{"size": 16, "batch_size": 128}' for a in TINY]
    tiny[tiny.index("--max-epochs") + 1] = "2"
    assert main(["compare", "--preset", "vision-mild", "--repeats", "1", *tiny, "--output", str(tmp_path)]) == 0
    printed = capsys.readouterr().out
    results = json.loads((tmp_path / "results.json").read_text())
    by_arm = {s["arm"]: s for s in results["summaries"]}
    base, mild, budget = by_arm["baseline"], by_arm["vision-mild"], by_arm["baseline @ recipe FLOPs"]
    assert mild["flops"] < 0.8 * base["flops"]  # half the run at half size (8 px of 16)
    # the control trains the baseline for the recipe's FLOPs: steps = recipe FLOPs / baseline FLOPs per step
    assert budget["steps"] == round(mild["flops"] / (base["flops"] / base["steps"])) < base["steps"]
    assert budget["flops"] == pytest.approx(mild["flops"], rel=0.1)
    assert "Against the baseline shortened to the recipe's FLOPs" in printed


def _labelsmoothing_config(**overrides):
    """Two repeats of LabelSmoothing against the baseline on a tiny digits model, no output files."""
    settings = dict(
        callbacks=["LabelSmoothing"],
        model="lightning_speedups.demo:ImageClassifier",
        datamodule="lightning_speedups.demo:DigitsDataModule",
        model_args={"widths": [8]},
        datamodule_args={"size": 8, "batch_size": 256},
        accelerator="cpu",
        max_epochs=1,
        repeats=2,
        output=None,
        progress=False,
    )
    return CompareConfig(**{**settings, **overrides})


def test_repeats_interleave_and_target_is_reported():
    cfg = _labelsmoothing_config(target=0.05)
    report = run_comparison(cfg)
    assert [(r.arm, r.repeat) for r in report.runs] == [
        ("callbacks: LabelSmoothing", 0),  # the recipe first: a recipe that cannot run fails before the baseline
        ("baseline", 0),
        ("baseline", 1),  # the first two arms swap places every other repeat
        ("callbacks: LabelSmoothing", 1),
    ]
    assert report.target == 0.05 and all(s.reached == 2 for s in report.summaries)


def test_with_an_even_number_of_repeats_the_default_target_is_reached_by_the_baseline():
    cfg = _labelsmoothing_config(model_args={"widths": [4]}, datamodule_args={"size": 8, "batch_size": 512}, seed=3)
    report = run_comparison(cfg)
    finals = sorted(r.final for r in report.runs if r.arm == "baseline")
    assert finals[0] < finals[1]  # two different finals, so the plain median (their mean) would differ
    assert report.target == finals[0]  # the lower median
    baseline = report.summary("baseline")
    assert baseline.reached == 2 and baseline.wall_to_target is not None and baseline.speedup_wall == 1.0


def _at(wall: float) -> Checkpoint:
    return Checkpoint(step=int(wall), epoch=0, wall=wall, cpu=wall, flops=wall, metric=1.0)


def test_a_target_equal_to_a_logged_float32_accuracy_is_reached():
    from lightning_speedups.compare import RunResult

    logged = float(torch.tensor([1.0] * 9 + [0.0]).mean())  # 9 of 10 correct, as a logged metric: 0.89999998
    run = RunResult(arm="a", repeat=0, flops=1.0, steps=1, history=[Checkpoint(1, 0, 1.0, 1.0, 1.0, logged)])
    assert logged < 0.9 and run.to_target(0.9) is not None
    assert run.to_target(0.9000001) is None  # a target above it, in float32 too, is not reached


def test_the_verdict_never_calls_a_slower_recipe_faster():
    from lightning_speedups.compare import _relative

    assert _relative(1.5, "faster", "slower") == "1.50× faster"
    assert _relative(0.4, "faster", "slower") == "2.50× slower"
    assert _relative(None, "faster", "slower") == "–"


def test_time_to_target_counts_a_missed_run_as_never_reaching():
    # three repeats, two reach at 10 s and 20 s: the median of (10, 20, never) is 20, not the 15 of the two hits
    assert _median_to_target([_at(10.0), None, _at(20.0)], "wall") == 20.0
    assert _median_to_target([_at(10.0), _at(30.0), _at(20.0)], "wall") == 20.0
    assert _median_to_target([_at(10.0), None], "wall") is None  # half the repeats missed: not reached
    assert _median_to_target([None, None, _at(5.0)], "step") is None
    assert _median_to_target([], "wall") is None


def test_the_equal_budget_run_is_validated_at_its_last_step_even_mid_epoch():
    cfg = CompareConfig(accelerator="cpu", max_epochs=2, progress=False, output=None)
    result = _run(
        "budget",
        0,
        cfg,
        lambda: ImageClassifier(widths=[4]),
        lambda: DigitsDataModule(size=8, batch_size=128),  # 12 steps an epoch
        [],
        {},
        None,
        max_steps=17,
    )
    assert result.steps == 17
    assert [c.step for c in result.history] == [12, 17]  # the end of epoch 1, then the budget's last step


def test_a_batch_size_the_recipe_changed_is_recorded_and_reported():
    # the large-batch recipe's BatchSizeFinder picks the batch: the report said nothing of it
    from lightning.pytorch.callbacks import BatchSizeFinder

    from lightning_speedups.compare import Report, _summarise, format_report

    cfg = CompareConfig(accelerator="cpu", max_epochs=1, progress=False, output=None)
    finder = BatchSizeFinder(mode="power", steps_per_trial=1, init_val=128, max_trials=2)  # 128, then 256
    make_dm = lambda: DigitsDataModule(size=8, batch_size=128)  # noqa: E731
    recipe = _run("recipe", 0, cfg, lambda: ImageClassifier(widths=[4]), make_dm, [finder], {}, None)
    base = _run("baseline", 0, cfg, lambda: ImageClassifier(widths=[4]), make_dm, [], {}, None)
    assert (base.batch_size, recipe.batch_size) == (128, 256)
    runs = [base, recipe]
    summaries = [_summarise(arm, [r for r in runs if r.arm == arm], 0.1) for arm in ("baseline", "recipe")]
    config = asdict(CompareConfig(repeats=1, output=None))
    text = format_report(Report(config=config, recipe="recipe", target=0.1, summaries=summaries, runs=runs))
    assert "Batch size (per device): baseline 128, recipe 256 (set by the recipe" in text
    recipe.batch_size = 128  # the same batch: nothing to say
    assert "Batch size" not in format_report(Report(config, "recipe", 0.1, summaries, runs))


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--preset", "vison-mild"], "Unknown preset 'vison-mild'. Did you mean 'vision-mild'?"),
        (["--preset", "zzz"], "Known presets: baseline"),
        (["--model", "no_such_pkg.mod:Model", "--datamodule", "x.y:Z"], "cannot import module 'no_such_pkg.mod'"),
        (
            ["--model", "lightning_speedups.demo:Nope", "--datamodule", "lightning_speedups.demo:DigitsDataModule"],
            "has no attribute 'Nope'",
        ),
        (
            [
                "--model",
                "lightning_speedups.demo:SmallResNet",
                "--datamodule",
                "lightning_speedups.demo:DigitsDataModule",
            ],
            "is not a LightningModule class",
        ),
        (["--model", "lightning_speedups.demo"], "Give both --model and --datamodule"),
        (["--model", "nocolon", "--datamodule", "x"], "is not an import path"),
        (["--target", "1.5"], r"--target must be in \(0, 1\] \(an accuracy, as a fraction\), got 1\.5\.$"),
        (["--target", "1.0000001"], r"got 1\.0000001\.$"),
        (["--target", "95"], r"got 95\.0 \(a percentage\? --target 0\.95\)"),
        (["--repeats", "0"], "--repeats must be >= 1"),
        (["--seed", "-1"], r"--seed must be in \[0, 4294967293\] with --repeats 3"),
        (["--seed", "4294967295", "--repeats", "2"], r"--seed must be in \[0, 4294967294\]"),
        (["--metric", "val_loss"], "looks like a lower-is-better metric"),
        (["--metric", "val_err"], "looks like a lower-is-better metric"),
        (["--metric", "val/mse"], "looks like a lower-is-better metric"),
        (["--metric", "val_nll"], "looks like a lower-is-better metric"),
        (["--callback", "MixUpp"], "No callback class named 'MixUpp'"),
        (["--preset", "baseline"], "compare the baseline with itself"),
        (["--precision", "fp16"], r"--precision must be one of 16-mixed, 16-true, 32-true, 64-true, bf16-mixed"),
        (["--preset", ""], "--preset needs a preset's name, got ''"),
        (["--callback", "MixUp:alpha"], "arguments look like 'name=value'"),
        (["--callback", "MixUp:alpha=-1"], "`alpha` must be > 0"),
        (["--model-args", "[1]"], None),
        (
            [*TINY[:6], "--callback", "LabelSmoothing:num_classes=5"],  # digits has 10 classes: fails in fit
            r"the 'callbacks: LabelSmoothing:num_classes=5' run could not start or stopped: ValueError: "
            r"LabelSmoothing: class indices must lie in \[0, 5\).*or the labels\.(?!\.)",  # one full stop
        ),
        (["--accelerator", "gpu", *TINY[:4], "--callback", "MixUp"], "MisconfigurationException"),
        (["--model", "./my_model.py:Net", "--datamodule", "x:Y"], "is a file path; give the module's import path"),
        (["--model", ".hidden:Net", "--datamodule", "x:Y"], "cannot import module '.hidden'"),
        (["--callback", "MixUp", "--output", "FILE"], "--output '.*a_file' cannot be a folder for the report"),
    ],
)
def test_bad_input_gives_a_message_not_a_traceback(args, message, capsys, tmp_path):
    if message is None:  # argparse rejects it while parsing
        with pytest.raises(SystemExit) as exit_info:
            main(["compare", *args])
        assert exit_info.value.code == 2
        assert "expected a JSON object" in capsys.readouterr().err
        return
    (tmp_path / "a_file").write_text("")
    args = [str(tmp_path / "a_file") if a == "FILE" else a for a in args]
    output = [] if "--output" in args else ["--output", str(tmp_path / "unused")]
    assert main(["compare", *args, "--no-progress", *output]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ")
    assert re.search(message, err), err
    assert "Traceback" not in err


def test_a_model_that_does_not_log_the_metric(capsys, tmp_path):
    code = main(["compare", "--callback", "MixUp", *TINY, "--metric", "val_top1", "--output", str(tmp_path / "o")])
    assert code == 2
    err = capsys.readouterr().err
    assert "'val_top1' was not logged" in err and re.search(r"the '(baseline|callbacks: MixUp)' run \(\d+ steps", err)
    assert "compare needs it at every validation" in err  # where a short run missed a metric logged in some epochs
    assert "`--metric NAME` compares another" in err
    # said before the timed runs, by the untimed warm-up, so that a misnamed metric costs seconds, not a whole run
    warned = err.index("compare, in its untimed warm-up run: The validation metric 'val_top1' was not logged")
    assert warned < err.index("error: ") and re.match(r"[^\n]*\(logged: [^)]*\bval_acc\b", err[warned:])


def test_a_module_in_the_current_folder_is_found(tmp_path, monkeypatch):
    # the `lightning-speedups` console script does not put the current folder on sys.path; `load_object` does
    (tmp_path / "my_speedup_models.py").write_text("from lightning_speedups.demo import ImageClassifier as Net\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    assert load_object("my_speedup_models:Net", "model") is ImageClassifier
    sys.modules.pop("my_speedup_models", None)


def test_a_class_that_cannot_be_built_says_where_or_which_flag_passes_its_arguments(tmp_path, monkeypatch, capsys):
    (tmp_path / "my_init_models.py").write_text(
        "import torch\n"
        "from lightning_speedups.demo import DigitsDataModule, ImageClassifier\n"
        "class NeedsWidth(ImageClassifier):\n"
        "    def __init__(self, width):\n"
        "        super().__init__()\n"
        "class BadInit(DigitsDataModule):\n"
        "    def __init__(self):\n"
        "        torch.tensor([0.5]) + '0.5'\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    base = ["compare", "--callback", "MixUp", "--no-progress", "--output", str(tmp_path / "o")]
    dm = ["--datamodule", "lightning_speedups.demo:DigitsDataModule"]
    assert main([*base, "--model", "my_init_models:NeedsWidth", *dm]) == 2
    err = capsys.readouterr().err
    assert "Could not build the model NeedsWidth(): " in err and "--model-args '{\"name\": value}'" in err
    model = ["--model", "lightning_speedups.demo:ImageClassifier"]
    assert main([*base, *model, "--datamodule", "my_init_models:BadInit"]) == 2
    err = capsys.readouterr().err
    assert re.search(
        r"Could not build the datamodule BadInit\(\): .*\(raised at .*my_init_models.py:8, in __init__\)", err
    )
    assert "--datamodule-args" not in err  # the user's own bug, not a missing argument
    # a file name, not an import path, whatever follows it
    assert main([*base, "--model", "my_init_models.py", *dm]) == 2
    assert "is a file path; give the module's import path" in capsys.readouterr().err
    sys.modules.pop("my_init_models", None)


def test_parse_callback():
    cb = parse_callback("MixUp:alpha=0.4,p=0.5,end=0.9")
    assert (cb.alpha, cb.p, cb.end) == (0.4, 0.5, 0.9)
    cb = parse_callback("lightning_speedups.callbacks.mixup:MixUp:alpha=0.3")  # module:Class, as --model takes
    assert type(cb).__name__ == "MixUp" and cb.alpha == 0.3
    assert type(parse_callback("lightning.pytorch.callbacks:LearningRateMonitor")).__name__ == "LearningRateMonitor"
    assert type(parse_callback("EarlyStopping:monitor=val_acc")).__name__ == "EarlyStopping"
    # a misspelt argument: the class asked for is named (not the base class whose __init__ refuses it)
    with pytest.raises(CompareError, match=r"MixUp has no argument 'alph' \('alph': did you mean 'alpha'"):
        parse_callback("MixUp:alph=0.4")
    # true/false as YAML and shells spell them: read as bools (the string "false" was a truthy flag)
    assert parse_callback("ProgressiveResizing:antialias=false").antialias is False
    assert parse_callback("MixUp:log_knobs=True,check_loss=FALSE").check_loss is False
    with pytest.raises(CompareError, match="`antialias` must be True or False, got 'no'"):
        parse_callback("ProgressiveResizing:antialias=no")


def test_a_callback_that_raises_its_own_error_in_init_is_a_message(tmp_path, monkeypatch):
    # only TypeError and ValueError were turned into a message: a RuntimeError was a traceback
    (tmp_path / "my_gpu_callbacks.py").write_text(
        "from lightning.pytorch import Callback\n\n\nclass NeedsGPU(Callback):\n"
        "    def __init__(self):\n        raise RuntimeError('needs a GPU')\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(
        CompareError,
        match=r"--callback 'my_gpu_callbacks:NeedsGPU': NeedsGPU\(\.\.\.\) raised RuntimeError: needs a GPU",
    ):
        parse_callback("my_gpu_callbacks:NeedsGPU")
    sys.modules.pop("my_gpu_callbacks", None)


def test_an_error_in_a_batch_transform_names_its_callback(tmp_path, monkeypatch, capsys):
    # a KeyError (the generic branch) printed no note: which callback raised it was lost
    (tmp_path / "my_key_callbacks.py").write_text(
        "from lightning_speedups import SpeedupCallback\n\n\nclass Picky(SpeedupCallback):\n"
        "    def transform_batch(self, trainer, pl_module, batch):\n        return batch[0]['pixels']\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    assert main(["compare", "--callback", "my_key_callbacks:Picky", *TINY, "--output", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert re.search(r"run stopped: \w+Error: .*Raised in the callback Picky\.transform_batch\.", err), err
    sys.modules.pop("my_key_callbacks", None)


def test_presets_command(capsys):
    assert main(["presets"]) == 0
    assert "baseline" in capsys.readouterr().out
    assert main(["presets", "baseline"]) == 0
    assert "callbacks: none" in capsys.readouterr().out
    assert main(["presets", "nope"]) == 2
    assert "Unknown preset 'nope'" in capsys.readouterr().err


def test_a_preset_that_cannot_build_its_callbacks_gives_a_message(capsys, tmp_path, monkeypatch):
    from lightning_speedups import MixUp
    from lightning_speedups.presets import register_preset

    monkeypatch.setattr(presets, "_REGISTRY", dict(presets._REGISTRY))

    @register_preset("needs-alpha")
    def needs_alpha(alpha):
        """MixUp with a required alpha."""
        return [MixUp(alpha)]

    assert main(["compare", "--preset", "needs-alpha", *TINY, "--no-progress", "--output", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert (
        err.startswith("error: preset 'needs-alpha' could not build its callbacks: TypeError")
        and "Traceback" not in err
    )


def test_a_batch_size_finder_preset_on_several_devices_stops_before_training(capsys, tmp_path):
    args = ["compare", "--preset", "large-batch", "--devices", "2", *TINY, "--no-progress", "--output", str(tmp_path)]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: preset 'large-batch': Preset 'large-batch' has a BatchSizeFinder, which runs on one")
    assert "With compare: run it with --devices 1" in err  # not only the fix in Python its message gives
    assert "Traceback" not in err and not list(tmp_path.iterdir())  # nothing trained, nothing written


def test_a_preset_with_callbacks_takes_them_as_recipe_trainer_does():
    # docs/presets.md promised it; compare refused "--preset or --callback, not both"
    from lightning_speedups import LabelSmoothing, MixUp
    from lightning_speedups.compare import CompareConfig, _recipe

    cfg = CompareConfig(preset="vision-mild", callbacks=["LabelSmoothing:smoothing=0.05", "MixUp"], accelerator="cpu")
    label, make, _ = _recipe(cfg)
    assert label == "vision-mild + LabelSmoothing:smoothing=0.05, MixUp"
    built = make()
    expected = [type(c) for c in presets.get("vision-mild").callbacks] + [MixUp]  # the replacement in its slot
    assert [type(c) for c in built] == expected
    assert next(c for c in built if isinstance(c, LabelSmoothing)).smoothing == 0.05
    assert all(a is not b for a, b in zip(built, make(), strict=True))  # a fresh set for each run
    # a preset's class changes the arguments given only: the warmup was rebuilt from its class's defaults
    # (reference 256, not 'initial': a quarter of the learning rate at batch 64)
    _, make, _ = _recipe(CompareConfig(preset="vision-mild", callbacks=["LinearScalingWarmup:warmup=0.1"]))
    (warmup,) = [c for c in make() if type(c).__name__ == "LinearScalingWarmup"]
    assert (warmup.reference_batch_size, warmup.warmup, warmup.warmup_unit) == ("initial", 0.1, "fraction")
    with pytest.raises(CompareError, match="changed by an earlier --callback already; give its arguments in one"):
        _recipe(CompareConfig(preset="vision-mild", callbacks=["LabelSmoothing:smoothing=0.05", "LabelSmoothing"]))
    label, make, _ = _recipe(CompareConfig(preset="baseline", callbacks=["MixUp"], accelerator="cpu"))
    assert label == "callbacks: MixUp" and [type(c) for c in make()] == [MixUp]  # the baseline plus MixUp


def test_without_leaves_a_presets_callback_out():
    # non-image inputs could run vision-mild only by listing its other callbacks by hand
    from lightning_speedups.compare import _recipe

    cfg = CompareConfig(preset="vision-mild", without=["ProgressiveResizing"], callbacks=["MixUp"], accelerator="cpu")
    label, make, _ = _recipe(cfg)
    assert label == "vision-mild - ProgressiveResizing + MixUp"
    kept = [type(c).__name__ for c in presets.get("vision-mild").callbacks if type(c).__name__ != "ProgressiveResizing"]
    assert [type(c).__name__ for c in make()] == [*kept, "MixUp"]
    with pytest.raises(CompareError, match=r"--without Resizing: preset 'vision-mild' has no such callback; its call"):
        _recipe(CompareConfig(preset="vision-mild", without=["Resizing"]))
    with pytest.raises(CompareError, match="--without leaves callbacks out of a preset"):
        _recipe(CompareConfig(callbacks=["MixUp"], without=["MixUp"]))


def test_without_from_the_command_line(tmp_path, capsys):
    args = ["compare", *TINY, "--repeats", "1", "--without", "ProgressiveResizing", "--output", str(tmp_path / "o")]
    assert main(args) == 0
    report = (tmp_path / "o" / "report.md").read_text()
    assert "## vision-mild - ProgressiveResizing vs baseline" in report


def test_a_presets_own_precision_is_part_of_its_arm(tmp_path, monkeypatch):
    from lightning_speedups.compare import CompareConfig, _recipe

    monkeypatch.setattr(presets, "_REGISTRY", dict(presets._REGISTRY))
    presets.register(
        presets.declarative("bf16-smooth", "s", "d", [("LabelSmoothing", {})], trainer={"precision": "bf16-mixed"})
    )
    _, _, extra = _recipe(CompareConfig(preset="bf16-smooth", accelerator="cpu"))
    assert extra == {"precision": "bf16-mixed"}  # kept for the recipe's arm; the baseline keeps the recommended one
    _, _, extra = _recipe(CompareConfig(preset="vision-mild", accelerator="cpu"))
    assert extra == {}


def _write_module(tmp_path, monkeypatch, name: str, source: str) -> None:
    """``name.py`` in ``tmp_path``, importable (and forgotten again after the test)."""
    (tmp_path / f"{name}.py").write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(sys.modules, name, None)  # undone last: the module is gone after the test
    monkeypatch.delitem(sys.modules, name)


NO_VALIDATION = """
import lightning.pytorch as pl
from torch.utils.data import DataLoader
from lightning_speedups.demo import DigitsDataModule, ImageClassifier

class NoValData(DigitsDataModule):
    def val_dataloader(self):
        return DataLoader([])

class NoValStep(ImageClassifier):
    validation_step = pl.LightningModule.validation_step
"""


@pytest.mark.parametrize(
    ("model", "datamodule"),
    [
        ("lightning_speedups.demo:ImageClassifier", "no_val_mods:NoValData"),
        ("no_val_mods:NoValStep", "lightning_speedups.demo:DigitsDataModule"),
    ],
)
def test_a_run_that_never_validates_is_an_error_not_a_table_of_nan(model, datamodule, tmp_path, monkeypatch, capsys):
    _write_module(tmp_path, monkeypatch, "no_val_mods", NO_VALIDATION)
    tiny = [*TINY[4:], "--repeats", "1", "--callback", "LabelSmoothing", "--output", str(tmp_path / "out")]
    assert main(["compare", "--model", model, "--datamodule", datamodule, *tiny]) == 2
    err = capsys.readouterr().err
    assert "never validated" in err and "validation_step" in err and "Traceback" not in err
    assert not (tmp_path / "out" / "results.json").exists()


@pytest.mark.parametrize(
    ("source", "error"),
    [
        ("def broken(:\n", "SyntaxError"),
        ("undefined_name\n", "NameError: name 'undefined_name' is not defined"),
        ("raise RuntimeError('needs a GPU')\n", "RuntimeError: needs a GPU"),
    ],
)
def test_a_module_that_fails_at_import_gives_a_message(source, error, tmp_path, monkeypatch, capsys):
    _write_module(tmp_path, monkeypatch, "broken_speedup_model", source)
    args = ["--model", "broken_speedup_model:Net", "--datamodule", "lightning_speedups.demo:DigitsDataModule"]
    assert main(["compare", *args, "--no-progress", "--output", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --model 'broken_speedup_model:Net': importing module 'broken_speedup_model' failed")
    assert error in err and "Traceback" not in err


def test_a_typo_in_the_preset_leaves_no_output_folder_behind(tmp_path, capsys):
    out = tmp_path / "typo" / "nested"
    assert main(["compare", "--preset", "vison-mild", *TINY, "--output", str(out)]) == 2
    assert "Unknown preset 'vison-mild'" in capsys.readouterr().err and not (tmp_path / "typo").exists()


def test_without_matplotlib_the_report_says_no_plot_was_saved(tmp_path, capsys, monkeypatch):
    import lightning_speedups.compare as compare

    monkeypatch.setattr(compare, "plot_report", lambda report, path: False)
    assert main(["compare", "--callback", "LabelSmoothing", *TINY, "--output", str(tmp_path)]) == 0
    printed = capsys.readouterr().out
    assert "no plot: matplotlib is not installed" in printed and "accuracy.png" not in printed
    assert not (tmp_path / "accuracy.png").exists()
    (tmp_path / "accuracy.png").write_text("an older run's plot")
    assert main(["compare", "--callback", "LabelSmoothing", *TINY, "--output", str(tmp_path)]) == 0
    assert not (tmp_path / "accuracy.png").exists()  # not left beside a report it does not belong to


def test_an_output_folder_that_cannot_hold_the_report_fails_before_training(tmp_path, capsys):
    (tmp_path / "out" / "report.md").mkdir(parents=True)  # in the way of the report, for root too
    assert main(["compare", "--callback", "MixUp", *TINY, "--output", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --output") and "report.md" in err and "Traceback" not in err
    # a level that cannot be made (a file in the way): the folders made before it are removed too
    (tmp_path / "file").write_text("")
    assert main(["compare", *TINY, "--output", str(tmp_path / "new" / ".." / "file" / "o")]) == 2
    assert capsys.readouterr().err.startswith("error: --output") and not (tmp_path / "new").exists()


def test_an_error_while_saving_the_report_gives_a_message(tmp_path, monkeypatch):
    from lightning_speedups import compare

    def refuse(*args, **kwargs):
        raise PermissionError(13, "Permission denied", str(tmp_path / "report.md"))

    monkeypatch.setattr(compare, "save_report", refuse)  # as a folder made read-only while the runs trained
    with pytest.raises(compare.CompareError, match=r"could not save the report.*Permission denied"):
        run_comparison(_labelsmoothing_config(repeats=1, budget_baseline=False, output=tmp_path))


@pytest.mark.parametrize(
    ("metrics", "target"),
    [
        ([0.1, 0.6, 0.9, 0.95], 0.95),  # the usual case: zoomed to 0.1 below the target
        ([0.9, 0.95, 0.97], 0.5),  # a target below every accuracy
        ([0.2, 0.3], 0.9),  # a target above every accuracy
        ([0.99, 1.0], 1.0),
        ([], 0.5),
        ([float("nan"), 0.7], 0.6),
    ],
)
def test_accuracy_plot_limits_hold_the_curves_top_and_the_target(metrics, target):
    from lightning_speedups.compare import accuracy_ylim

    lower, upper = accuracy_ylim(metrics, target)
    assert lower < target < upper
    assert upper > max([m for m in metrics if m == m], default=target)
    assert lower >= target - 0.1 - 0.005 - 1e-9  # zoomed in: at most 0.1 (and the padding) below the target


def test_accuracy_plot_limits_zoom_below_the_target():
    from lightning_speedups.compare import accuracy_ylim

    # lowest 0.1 clipped at 0.1 below the target (0.85), less the 0.005 pad; highest 0.95 < target + 0.02, plus pad
    assert accuracy_ylim([0.1, 0.6, 0.9, 0.95], 0.95) == pytest.approx((0.845, 0.975))


def test_a_callback_module_in_the_current_folder_is_found_as_a_model_module_is(tmp_path, monkeypatch):
    # the console script does not put the current folder on the path: --model was looked for there, --callback not
    (tmp_path / "cwd_callbacks.py").write_text(
        "from lightning.pytorch.callbacks import Callback\n\n"
        "class Noise(Callback):\n    def __init__(self, std=0.0):\n        self.std = std\n"
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    monkeypatch.setitem(sys.modules, "cwd_callbacks", None)  # undone last: the module is gone after the test
    monkeypatch.delitem(sys.modules, "cwd_callbacks")
    assert parse_callback("cwd_callbacks:Noise:std=0.1").std == 0.1
    with pytest.raises(CompareError, match="looked for in the current folder and on PYTHONPATH"):
        parse_callback("no_such_module:Noise")


def test_parse_callback_with_lists_tuples_and_quoted_commas():
    from lightning_speedups.compare import CompareError, _split_args

    cb = parse_callback("LinearScalingWarmup:exclude_groups=[0, 1],warmup=2")
    assert set(cb.exclude_groups) == {0, 1} and cb.warmup == 2
    assert _split_args("s", "a=(1, 2),b='x,y', c={'k': [1, 2]}") == ["a=(1, 2)", "b='x,y'", "c={'k': [1, 2]}"]
    assert parse_callback("EarlyStopping:monitor='val,acc',mode=max").monitor == "val,acc"
    with pytest.raises(CompareError, match="unbalanced brackets"):
        parse_callback("LinearScalingWarmup:exclude_groups=[0,1")
    # a bracket or quote inside a plain string value opens nothing: the value stays a string
    assert _split_args("s", "name=it's,tag=a(b, p=0.5") == ["name=it's", "tag=a(b", "p=0.5"]
    assert parse_callback("EarlyStopping:monitor=val_acc(top1),mode=max").monitor == "val_acc(top1)"


def test_presets_config_without_a_name_is_an_error(capsys):
    assert main(["presets", "--config"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --config") and "presets vision-mild --config" in err


UNUSUAL_MODELS = """
import torch
from torch import nn
from lightning_speedups.demo import ImageClassifier

class EveryOther(ImageClassifier):
    def validation_step(self, batch, batch_idx):
        if self.current_epoch % 2 == 0:
            return super().validation_step(batch, batch_idx)

class OddEpochs(ImageClassifier):
    def validation_step(self, batch, batch_idx):
        if self.current_epoch % 2 == 1:
            return super().validation_step(batch, batch_idx)

class FlatNet(ImageClassifier):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.head = nn.Linear(64, 10)  # 8 x 8 inputs only

    def forward(self, x):
        return self.head(x.mean(1).flatten(1))

class UsesLogger(ImageClassifier):
    def on_train_start(self):
        self.logger.log_hyperparams({"lr": 0.1})  # compare trains without a logger

class NoneAttribute(ImageClassifier):
    def training_step(self, batch, batch_idx):
        teacher = None
        logger = None  # a name that merely contains "logger" on the failing line
        return teacher.shape if logger is None else teacher  # a bug of the user's, not compare's

class NeedsWidth(ImageClassifier):
    def __init__(self, width):
        super().__init__()

class BrokenStep(ImageClassifier):
    def training_step(self, batch, batch_idx):
        return {}["image"]  # a bug of the user's, in a step

class ExitsInStep(ImageClassifier):
    def training_step(self, batch, batch_idx):
        import sys

        sys.exit("bad config")  # the user's own way of stopping, not Ctrl-C

from lightning.pytorch.callbacks import Callback

class Interrupt(Callback):
    def on_train_batch_start(self, *args):
        raise KeyboardInterrupt  # Ctrl-C during training

from lightning_speedups.demo import DigitsDataModule

class Missing(torch.utils.data.Dataset):
    def __len__(self):
        return 8

    def __getitem__(self, i):
        return {}["missing"]  # a bug of the user's, in the data

class NoneMeta(Missing):
    import logging

    logger, meta = logging.getLogger("data"), None

    def __getitem__(self, i):
        self.logger.debug("%s", self.meta.size)  # a bug of the user's: meta is None, the logger is fine

class BrokenData(DigitsDataModule):
    def __init__(self, dataset="Missing", **kwargs):
        super().__init__(**kwargs)
        self.dataset = dataset

    def setup(self, stage):
        super().setup(stage)
        self.train_dataset = globals()[self.dataset]()

class Terminated(Callback):
    def on_train_batch_start(self, *args):
        from lightning.pytorch.utilities.exceptions import SIGTERMException

        raise SIGTERMException  # as Lightning raises it on a SIGTERM (`timeout`, a scheduler)
"""


@pytest.mark.parametrize(
    ("model", "epochs"),
    [
        # Lightning keeps the last logged value: read again, it would be a new point with a later time
        ("EveryOther", [0, 2]),
        # from its second validation on: the untimed warm-up's one validation (epoch 0) logged nothing, which
        # stopped the comparison, blaming the baseline
        ("OddEpochs", [1, 3]),
    ],
)
def test_a_validation_that_does_not_log_the_metric_adds_no_point(tmp_path, monkeypatch, model, epochs):
    _write_module(tmp_path, monkeypatch, "unusual_models", UNUSUAL_MODELS)
    cfg = _labelsmoothing_config(model=f"unusual_models:{model}", max_epochs=4, repeats=1, budget_baseline=False)
    report = run_comparison(cfg, out=io.StringIO())
    for run in report.runs:
        assert [c.epoch for c in run.history] == epochs


def test_ctrl_c_during_training_stops_with_status_130_and_says_so(tmp_path, monkeypatch, capsys):
    # Lightning turns a KeyboardInterrupt inside fit into sys.exit(1), and compare silenced its notice: rc 1, silent
    import signal

    _write_module(tmp_path, monkeypatch, "unusual_models", UNUSUAL_MODELS)
    out = tmp_path / "out"
    before = signal.getsignal(signal.SIGINT)
    try:
        assert main(["compare", *TINY, "--callback", "unusual_models:Interrupt", "--output", str(out)]) == 130
        assert signal.getsignal(signal.SIGINT) is before  # Lightning leaves Ctrl-C ignored; compare puts it back
    finally:
        signal.signal(signal.SIGINT, before)
    assert "interrupted: no report written." in capsys.readouterr().err
    assert not (out / "report.md").exists()


def test_a_presets_own_trainer_settings_apply_except_those_compare_sets(tmp_path, monkeypatch):
    monkeypatch.setattr(presets, "_REGISTRY", dict(presets._REGISTRY))
    presets.register(
        presets.declarative(
            "short-accumulating",
            "s",
            "d",
            [("LabelSmoothing", {})],
            trainer={"max_epochs": 1, "accumulate_grad_batches": 2, "enable_progress_bar": True},
        )
    )
    cfg = _labelsmoothing_config(callbacks=[], preset="short-accumulating", max_epochs=2, repeats=1)
    report = run_comparison(cfg, out=io.StringIO())  # was: Trainer() got multiple values for 'max_epochs'
    steps = {run.arm: run.steps for run in report.runs}
    assert steps["short-accumulating"] * 2 == steps["baseline"] == 2 * 6  # 2 epochs of 6 batches, every 2nd steps


def test_a_failing_default_preset_is_told_how_to_choose_its_callbacks(tmp_path, monkeypatch, capsys):
    _write_module(tmp_path, monkeypatch, "unusual_models", UNUSUAL_MODELS)
    args = ["--model", "unusual_models:FlatNet", "--datamodule", "lightning_speedups.demo:DigitsDataModule"]
    assert main(["compare", *args, *TINY[4:], "--repeats", "1", "--output", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "change its arguments with `--callback Name:arg=value`" in err
    assert "or list your own with --callback alone" in err
    assert "`lightning-speedups presets vision-mild` shows the preset's" in err


def test_a_report_that_cannot_be_saved_is_still_printed(tmp_path, monkeypatch):
    from lightning_speedups import compare

    def full_disk(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(compare, "save_report", full_disk)
    out = io.StringIO()
    with pytest.raises(CompareError, match="could not save the report"):
        run_comparison(_labelsmoothing_config(repeats=1, output=tmp_path / "o"), out=out)
    assert "| baseline |" in out.getvalue()  # the comparison's results are not lost with the file


def test_a_broken_pipe_inside_training_is_not_taken_for_a_reader_that_stopped(tmp_path, monkeypatch, capsys):
    _write_module(
        tmp_path,
        monkeypatch,
        "pipe_models",
        "from lightning_speedups.demo import ImageClassifier\n"
        "class PipeNet(ImageClassifier):\n"
        "    def training_step(self, batch, batch_idx):\n"
        "        raise BrokenPipeError('a pipe of the model')\n",
    )
    args = ["--model", "pipe_models:PipeNet", *TINY[2:], "--callback", "MixUp", "--repeats", "1"]
    assert main(["compare", *args, "--output", str(tmp_path / "o")]) == 2  # was: a silent exit 0
    assert "run stopped: BrokenPipeError: a pipe of the model (raised at" in capsys.readouterr().err


def test_a_reader_that_stops_early_gets_no_traceback(tmp_path):
    import subprocess

    child = subprocess.Popen(
        [sys.executable, "-m", "lightning_speedups", "presets", "vision-mild"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    child.stdout.close()  # as `| head` does once it has read enough: every write now fails
    err = child.stderr.read().decode()
    assert child.wait(timeout=120) == 0 and "Traceback" not in err, err


def test_a_recipe_the_model_cannot_take_gives_a_message_naming_the_run_and_the_line(tmp_path, monkeypatch, capsys):
    _write_module(tmp_path, monkeypatch, "unusual_models", UNUSUAL_MODELS)
    args = ["--model", "unusual_models:FlatNet", "--datamodule", "lightning_speedups.demo:DigitsDataModule"]
    tiny = [*TINY[4:], "--repeats", "1", "--callback", "ProgressiveResizing:initial_scale=0.5,size_increment=2"]
    out = tmp_path / "out"
    assert main(["compare", *args, *tiny, "--output", str(out)]) == 2
    err = capsys.readouterr().err
    assert re.search(r"the 'callbacks: ProgressiveResizing.*' run could not start or stopped: RuntimeError", err)
    assert "unusual_models.py" in err and "in forward" in err and "Traceback" not in err
    assert "ProgressiveResizing had resized this step's images to 4x4 (from 8x8)" in err  # the cause, named
    assert not out.exists()  # no empty report folder left behind


def test_a_target_every_run_reaches_at_its_first_validation_is_called_uninformative():
    # a baseline ending at chance made every arm "reach" it at once: a 4x speedup was reported, meaning nothing
    from lightning_speedups.compare import CompareConfig, Report, RunResult, _summarise, format_report
    from lightning_speedups.meter import Checkpoint

    def history(*metrics):
        return [Checkpoint(step=i, epoch=i, wall=i, cpu=i, flops=1e9 * i, metric=m) for i, m in enumerate(metrics, 1)]

    config = asdict(CompareConfig(repeats=1, output=None))
    for recipe_history, uninformative in (((0.11, 0.12), True), ((0.05, 0.12), False)):
        runs = [
            RunResult("baseline", 0, history(0.102, 0.101), 2e9, 2),  # at chance from its first validation on
            RunResult("recipe", 0, history(*recipe_history), 1e9, 2),
        ]
        summaries = [_summarise(arm, [r for r in runs if r.arm == arm], 0.101) for arm in ("baseline", "recipe")]
        text = format_report(Report(config=config, recipe="recipe", target=0.101, summaries=summaries, runs=runs))
        said = "Every run reached the target (0.1010) at its first validation" in text
        assert said is uninformative
        # the baseline that fell from its first validation is named as such when the first note does not apply
        assert ("The baseline ended no better than its first validation" in text) is not uninformative
    # a baseline that learned: neither note
    runs = [RunResult("baseline", 0, history(0.5, 0.9), 2e9, 2), RunResult("recipe", 0, history(0.6, 0.9), 1e9, 2)]
    summaries = [_summarise(arm, [r for r in runs if r.arm == arm], 0.9) for arm in ("baseline", "recipe")]
    text = format_report(Report(config=config, recipe="recipe", target=0.9, summaries=summaries, runs=runs))
    assert "first validation" not in text
    runs = [RunResult("baseline", 0, history(0.5), 1e9, 1), RunResult("recipe", 0, history(0.6), 1e9, 1)]
    summaries = [_summarise(arm, [r for r in runs if r.arm == arm], 0.5) for arm in ("baseline", "recipe")]
    text = format_report(Report(config=config, recipe="recipe", target=0.5, summaries=summaries, runs=runs))
    assert "ended no better" not in text  # one validation: nothing to say it fell


def test_an_arm_below_the_zoomed_plot_range_is_named_so_in_the_legend(tmp_path, monkeypatch):
    pytest.importorskip("matplotlib")
    from matplotlib.figure import Figure

    from lightning_speedups.compare import Report, RunResult, plot_report
    from lightning_speedups.meter import Checkpoint

    def history(*metrics):
        return [Checkpoint(step=i, epoch=i, wall=i, cpu=i, flops=1e9 * i, metric=m) for i, m in enumerate(metrics)]

    runs = [
        RunResult("baseline", 0, history(0.5, 0.9, 0.95), 3e9, 3),
        RunResult("recipe", 0, history(0.6, 0.94, 0.96), 2e9, 3),
        RunResult("baseline @ 1 steps", 0, history(0.1, 0.2), 1e9, 1),  # far below the target's window
    ]
    report = Report(config={"metric": "val_acc"}, recipe="recipe", target=0.95, summaries=[], runs=runs)
    legends = []
    monkeypatch.setattr(Figure, "savefig", lambda fig, *a, **k: legends.append(fig.axes[0].get_legend()))
    assert plot_report(report, tmp_path / "a.png")
    labels = [t.get_text() for t in legends[0].get_texts()]
    assert labels == ["baseline", "recipe", "baseline @ 1 steps (below the plotted range; best 0.2000)"]
    # an arm that ran in a later repeat only is in the legend too (only repeat 0's runs were labelled)
    legends.clear()
    runs[2] = RunResult("baseline @ 1 steps", 1, history(0.93, 0.95), 1e9, 1)
    assert plot_report(
        Report(config={"metric": "val_acc"}, recipe="recipe", target=0.95, summaries=[], runs=runs), tmp_path / "b.png"
    )
    assert [t.get_text() for t in legends[0].get_texts()] == ["baseline", "recipe", "baseline @ 1 steps"]


def test_a_run_whose_last_validation_did_not_log_the_metric_is_said_in_the_report():
    # a model logging the metric in some epochs only: the shortened baseline's final accuracy was read 7 steps
    # before its budget ended, beside the FLOPs and steps of the whole run, without a word
    from lightning_speedups.compare import CompareConfig, Report, RunResult, _summarise, format_report
    from lightning_speedups.meter import Checkpoint

    def history(*steps):
        return [Checkpoint(step=s, epoch=i, wall=s, cpu=s, flops=1e9 * s, metric=0.5) for i, s in enumerate(steps)]

    config = asdict(CompareConfig(repeats=1, output=None))
    runs = [RunResult("baseline", 0, history(23, 46), 46e9, 46), RunResult("recipe", 0, history(23), 30e9, 30)]
    summaries = [_summarise(arm, [r for r in runs if r.arm == arm], 0.5) for arm in ("baseline", "recipe")]
    text = format_report(Report(config=config, recipe="recipe", target=0.5, summaries=summaries, runs=runs))
    assert "**Not measured at the end**: 1 run(s) have no val_acc at their last step (no validation there" in text
    assert "(recipe (repeat 0): step 23 of 30)" in text and "baseline (repeat 0)" not in text


def test_a_model_whose_flops_are_not_counted_is_said_so_not_called_flop_neutral():
    # a model of operations `torch.utils.flop_counter` does not count: every arm 0 FLOPs, and the report said the
    # recipe's FLOPs were "not below the baseline's", for a recipe that trained half the run at half size
    from lightning_speedups.compare import Report, RunResult, _summarise, format_report

    def run(arm, flops):
        return RunResult(arm, 0, [Checkpoint(step=8, epoch=1, wall=2.0, cpu=2.0, flops=flops, metric=0.9)], flops, 8)

    config = asdict(CompareConfig(repeats=1, output=None))
    for flops, uncounted in ((0.0, True), (8e9, False)):
        runs = [run("baseline", flops), run("recipe", flops)]
        summaries = [_summarise(arm, [r for r in runs if r.arm == arm], 0.9) for arm in ("baseline", "recipe")]
        text = format_report(Report(config=config, recipe="recipe", target=0.9, summaries=summaries, runs=runs))
        assert ("**No FLOPs counted**" in text) is uncounted
        assert ("training FLOPs are not below the baseline's" in text) is not uncounted


def test_modules_whose_flops_are_not_counted_and_data_dependent_flops_are_said_in_the_report():
    from lightning_speedups.compare import Report, RunResult, _summarise, format_report

    def run(arm, **kwargs):
        return RunResult(
            arm, 0, [Checkpoint(step=8, epoch=1, wall=2.0, cpu=2.0, flops=8e9, metric=0.9)], 8e9, 8, **kwargs
        )

    config = asdict(CompareConfig(repeats=1, output=None))
    for flagged in (False, True):
        extra = {"uncounted": {"rnn": "LSTM"}, "flops_vary": True} if flagged else {}
        runs = [run("baseline", **extra), run("recipe")]
        summaries = [_summarise(arm, [r for r in runs if r.arm == arm], 0.9) for arm in ("baseline", "recipe")]
        text = format_report(Report(config=config, recipe="recipe", target=0.9, summaries=summaries, runs=runs))
        assert ("**FLOPs undercounted**: `torch.utils.flop_counter` counts nothing for `rnn` (LSTM)" in text) is flagged
        assert ("FLOPs per step varied within one batch shape" in text) is flagged


PERCENT = """
from lightning_speedups.demo import ImageClassifier

class Percent(ImageClassifier):
    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_acc", (self(x).argmax(1) == y).float().mean() * 100)

class NanAtFirst(ImageClassifier):
    def validation_step(self, batch, batch_idx):
        x, y = batch
        accuracy = (self(x).argmax(1) == y).float().mean()
        self.log("val_acc", accuracy if self.global_step > 2 else float("nan"))

class Infinite(ImageClassifier):
    def validation_step(self, batch, batch_idx):
        self.log("val_acc", float("inf"))
"""


def test_a_metric_logged_as_a_percentage_is_refused_before_the_timed_runs(tmp_path, monkeypatch, capsys):
    # a target is a fraction, so every arm would "reach" one at its first validation; the default target would
    # work but the plot and --target would not: compare reads an accuracy in [0, 1] and says so
    _write_module(tmp_path, monkeypatch, "percent_mods", PERCENT)
    args = ["compare", "--model", "percent_mods:Percent", *TINY[2:], "--output", str(tmp_path / "out")]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "the 'baseline' run logged val_acc=" in err and "outside [0, 1]" in err and "`acc * 100`" in err
    assert "Traceback" not in err and not (tmp_path / "out" / "results.json").exists()
    # NaN is no scale: a run that diverged (here its untimed warm-up only) is not refused as a percentage
    args = ["compare", "--model", "percent_mods:NanAtFirst", *TINY[2:], "--output", str(tmp_path / "nan")]
    assert main(args) == 0, capsys.readouterr().err
    # an infinite value is no accuracy either (a loss or a perplexity named by --metric): refused, not ignored
    args = ["compare", "--model", "percent_mods:Infinite", *TINY[2:], "--output", str(tmp_path / "inf")]
    assert main(args) == 2
    assert "val_acc=inf, outside [0, 1]" in capsys.readouterr().err


def test_a_preset_that_does_not_suit_the_model_points_to_choosing_callbacks(tmp_path, monkeypatch, capsys):
    _write_module(tmp_path, monkeypatch, "unusual_models", UNUSUAL_MODELS)
    args = ["--model", "unusual_models:FlatNet", "--datamodule", "lightning_speedups.demo:DigitsDataModule"]
    out = tmp_path / "out"
    assert main(["compare", *args, *TINY[4:], "--repeats", "1", "--preset", "vision-mild", "--output", str(out)]) == 2
    err = capsys.readouterr().err
    assert "ProgressiveResizing had resized" in err and "change its arguments with `--callback Name:arg=value`" in err


def test_a_module_not_found_says_where_it_is_looked_for(capsys, tmp_path):
    args = ["--model", "no_such_package.models:Net", "--datamodule", "x:Y", "--output", str(tmp_path / "o")]
    assert main(["compare", *args, "--no-progress"]) == 2
    assert "run from the folder that holds it, or add that folder to PYTHONPATH" in capsys.readouterr().err


def test_the_untimed_warm_up_run_raises_no_warning_of_its_own(tmp_path):
    """A recipe judged against a 2-step run would warn (a warmup longer than training) about runs that are fine."""
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        args = ["--callback", "LinearScalingWarmup:reference_batch_size=64,warmup=1", "--repeats", "1"]
        assert main(["compare", *args, *TINY, "--no-budget-baseline", "--output", str(tmp_path / "o")]) == 0
    assert not [w for w in caught if "longer than training" in str(w.message)]


@pytest.mark.parametrize(
    ("model", "message"),
    [
        (
            "UsesLogger",
            r"AttributeError: 'NoneType' object has no attribute 'log_hyperparams' \(raised at .*"
            r"unusual_models.py:\d+, in on_train_start\)\. compare trains without a logger",
        ),
        ("BrokenStep", r"KeyError: 'image' \(raised at .*unusual_models.py:\d+, in training_step\)\.\n"),
        (
            "NoneAttribute",
            r"AttributeError: .* attribute 'shape' \(raised at .*unusual_models.py:\d+, in training_step\)\.\n",
        ),
    ],
)
def test_an_error_in_the_users_code_is_a_message_naming_the_run_and_the_line(
    tmp_path, monkeypatch, capsys, model, message
):
    _write_module(tmp_path, monkeypatch, "unusual_models", UNUSUAL_MODELS)
    tiny = [*TINY[2:], "--repeats", "1", "--callback", "LabelSmoothing"]
    assert main(["compare", "--model", f"unusual_models:{model}", *tiny, "--output", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert re.search(r"the 'baseline' run stopped: " + message, err) and "Traceback" not in err


def test_a_callback_module_that_fails_to_import_is_a_clear_error(tmp_path, monkeypatch, capsys):
    _write_module(tmp_path, monkeypatch, "broken_callbacks", "class Cls(:\n")
    assert main(["compare", *TINY, "--callback", "broken_callbacks:Cls", "--output", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "--callback 'broken_callbacks:Cls': importing it raised SyntaxError" in err and "Traceback" not in err


def test_an_error_raised_inside_the_package_is_not_reported_as_the_users_line(capsys):
    # an editable install is outside site-packages: compare's own frames looked like the user's code
    assert main(["compare", *TINY[:-5], "--accelerator", "bogus", "--callback", "MixUp", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "bogus" in err and "raised at" not in err


def test_the_progress_bar_moves_one_step_per_epoch_of_each_run_whatever_the_validations():
    from lightning_speedups.compare import _Progress

    class Bar:
        n = 0

        def update(self, k):
            self.n += k

    class Trainer:
        sanity_checking = False

    bar = Bar()
    for validations in (0, 2, 4, 6):  # a shortened run, one that validates more often than each epoch
        progress = _Progress(bar, 4)
        for _ in range(validations):
            progress.on_validation_end(Trainer(), None)
        progress.finish()
    assert bar.n == 16


def test_a_model_that_cannot_be_built_is_said_once_not_wrapped_as_a_run_error(tmp_path, monkeypatch, capsys):
    _write_module(tmp_path, monkeypatch, "unusual_models", UNUSUAL_MODELS)
    tiny = [*TINY[2:], "--repeats", "1", "--callback", "LabelSmoothing"]
    assert main(["compare", "--model", "unusual_models:NeedsWidth", *tiny, "--output", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "width" in err and "CompareError" not in err and "run stopped" not in err


def test_the_users_line_is_found_in_a_model_installed_as_a_package(tmp_path, monkeypatch):
    from lightning_speedups.compare import _raised_at

    site = tmp_path / "site-packages"
    site.mkdir()
    (site / "installed_model.py").write_text("def step(batch):\n    return batch['image']\n")
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setitem(sys.modules, "installed_model", None)
    monkeypatch.delitem(sys.modules, "installed_model")
    import installed_model

    with pytest.raises(KeyError) as info:
        installed_model.step({})
    err = info.value.with_traceback(info.value.__traceback__.tb_next)  # from the model's frame on, as in a fit
    assert re.fullmatch(r" \(raised at .*site-packages/installed_model.py:2, in step\)", _raised_at(err))


def test_an_error_raised_inside_lightnings_own_dependencies_names_no_line_of_the_users():
    import dataclasses

    from lightning_utilities.core.apply_func import apply_to_collection

    from lightning_speedups.compare import _raised_at

    @dataclasses.dataclass(frozen=True)
    class Batch:
        x: torch.Tensor

    with pytest.raises(ValueError, match="frozen dataclass") as info:
        apply_to_collection(Batch(torch.zeros(1)), torch.Tensor, lambda t: t)
    err = info.value.with_traceback(info.value.__traceback__.tb_next)  # without this test's own frame
    assert _raised_at(err) == ""


def test_precision_reaches_every_run(tmp_path, monkeypatch, capsys):
    # a callback that fails any run whose Trainer does not train in bf16-mixed (the recommended CPU one is 32-true)
    _write_module(
        tmp_path,
        monkeypatch,
        "precision_probe",
        "from lightning.pytorch import Callback\n"
        "class InBf16(Callback):\n"
        "    def on_train_start(self, trainer, pl_module):\n"
        "        assert trainer.precision == 'bf16-mixed', trainer.precision\n",
    )
    out = tmp_path / "out"
    args = [*TINY, "--repeats", "1", "--precision", "bf16", "--callback", "precision_probe:InBf16"]  # Lightning's alias
    assert main(["compare", *args, "--callback", "LabelSmoothing", "--output", str(out)]) == 0, capsys.readouterr().err
    assert "precision bf16-mixed;" in (out / "report.md").read_text()
    assert json.loads((out / "results.json").read_text())["config"]["precision"] == "bf16-mixed"
    assert main(["compare", *TINY, "--repeats", "1", "--callback", "precision_probe:InBf16", "--output", str(out)]) == 2
    assert "AssertionError: 32-true" in capsys.readouterr().err


def test_the_report_names_each_sides_precision_where_a_preset_fixes_its_own(tmp_path, monkeypatch):
    from lightning.pytorch import Callback

    from lightning_speedups import presets

    seen = []

    class Probe(Callback):
        def on_train_start(self, trainer, pl_module):
            seen.append(trainer.precision)

    monkeypatch.setattr(presets, "_REGISTRY", dict(presets._REGISTRY))  # the preset is forgotten after the test
    presets.register_preset("fixed64", trainer={"precision": "64"})(lambda: [Probe()])  # Lightning's short name
    out = tmp_path / "out"
    args = [*TINY, "--repeats", "1", "--no-budget-baseline", "--preset", "fixed64", "--output", str(out)]
    assert main(["compare", *args]) == 0
    assert seen == ["64-true"]  # the preset's own precision: its arm's
    assert "precision 32-true (baseline), 64-true (recipe);" in (out / "report.md").read_text()
    config = json.loads((out / "results.json").read_text())["config"]
    assert (config["precision"], config["recipe_precision"]) == ("32-true", "64-true")


def test_a_diverged_baseline_repeat_is_left_out_of_the_target_whatever_its_order(tmp_path, monkeypatch):
    # NaN has no place in an order: the lower median of [0.9, nan, 0.8] was nan, 0.8 or 0.9 by which repeat diverged
    from lightning_speedups import compare as compare_module
    from lightning_speedups.compare import RunResult, _finish

    nan = float("nan")

    def run(arm, repeat, final):
        return RunResult(
            arm, repeat, [Checkpoint(step=10, epoch=0, wall=1.0, cpu=1.0, flops=1e9, metric=final)], 1e9, 10
        )

    for finals in ([0.9, nan, 0.8], [nan, 0.9, 0.8], [0.8, 0.9, nan]):
        runs = [r for i, f in enumerate(finals) for r in (run("baseline", i, f), run("recipe", i, 0.85))]
        out = io.StringIO()
        report = _finish(CompareConfig(output=None, repeats=3), runs, "recipe", out)
        assert report.target == 0.8  # the lower median of the finite finals
        assert report.summary("recipe").reached == 3
        assert report.summary("baseline").final == 0.8  # the diverged repeat counted lowest, not anywhere
        assert "**Diverged**: 1 run(s) ended with val_acc = NaN" in out.getvalue()
        assert "the baseline's left out of the target" in out.getvalue()
    # a recipe run that diverged counts lowest in its arm's median; it never fed the target, so nothing says it did
    out = io.StringIO()
    _finish(CompareConfig(output=None, repeats=1), [run("baseline", 0, 0.9), run("recipe", 0, nan)], "recipe", out)
    assert "**Diverged**: 1 run(s) ended with val_acc = NaN (recipe (repeat 0))" in out.getvalue()
    assert "left out" not in out.getvalue()
    # every baseline run diverged: a clear error, and no empty --output folder left behind
    runs = [run("baseline", i, nan) for i in range(2)] + [run("vision-mild", i, 0.85) for i in range(2)]
    with pytest.raises(CompareError, match=r"Every baseline run ended with val_acc = NaN.*set --target"):
        _finish(CompareConfig(output=None, repeats=2), runs, "vision-mild", io.StringIO())
    monkeypatch.setattr(compare_module, "_run_arms", lambda *args: runs)
    with pytest.raises(CompareError, match="Every baseline run ended"):
        run_comparison(CompareConfig(repeats=2, output=tmp_path / "out", progress=False), io.StringIO())
    assert not (tmp_path / "out").exists()
    # a diverged run's NaN is written to results.json as null: strict JSON, readable by any parser
    runs = [run("baseline", 0, 0.9), run("vision-mild", 0, nan)]  # the default preset's arm
    monkeypatch.setattr(compare_module, "_run_arms", lambda *args: runs)
    run_comparison(CompareConfig(repeats=1, output=tmp_path / "out", progress=False), io.StringIO())
    data = json.loads((tmp_path / "out" / "results.json").read_text(), parse_constant=pytest.fail)
    assert data["runs"][1]["history"][0]["metric"] is None and data["summaries"][1]["final"] is None


def test_small_flop_counts_are_printed_in_a_unit_that_shows_them():
    # a user's small model: 1.5 MFLOP printed as "0.00" GFLOP beside a speedup of 1.00x
    from lightning_speedups.compare import Report, RunResult, _summarise, format_report

    def run(arm, flops):
        return RunResult(arm, 0, [Checkpoint(step=8, epoch=1, wall=2.0, cpu=2.0, flops=flops, metric=0.9)], flops, 8)

    config = asdict(CompareConfig(repeats=1, output=None))
    for flops, unit, shown in ((1.5e6, "MFLOP", "1.50"), (3e9, "GFLOP", "3.00"), (400.0, "FLOP", "400.00")):
        runs = [run("baseline", 2 * flops), run("recipe", flops)]
        summaries = [_summarise(arm, [r for r in runs if r.arm == arm], 0.9) for arm in ("baseline", "recipe")]
        text = format_report(Report(config=config, recipe="recipe", target=0.9, summaries=summaries, runs=runs))
        assert f"| train {unit} |" in text and f"| {unit} to target |" in text
        assert f"| recipe | 0.9000 | 2.0 | 2.0 | {shown} | 8 |" in text


@pytest.mark.parametrize("workers", [0, 1])
@pytest.mark.parametrize(
    ("dataset", "error"), [("Missing", "KeyError: 'missing'"), ("NoneMeta", "AttributeError: .* attribute 'size'")]
)
def test_an_error_in_the_users_data_is_one_line_with_its_place_whether_or_not_a_worker_loads_it(
    tmp_path, monkeypatch, capsys, workers, dataset, error
):
    # in a worker, torch re-raises it with the worker's whole traceback as its message: that was printed, 12 lines
    # of traceback and no "raised at"
    _write_module(tmp_path, monkeypatch, "unusual_models", UNUSUAL_MODELS)
    dm_args = {"dataset": dataset, "size": 8, "num_workers": workers}
    data = ["--datamodule", "unusual_models:BrokenData", "--datamodule-args", json.dumps(dm_args)]
    args = [*TINY[:2], *TINY[4:6], *data, *TINY[8:], "--repeats", "1", "--output", str(tmp_path / "o")]
    assert main(["compare", *args]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    where = r" \(in DataLoader worker process 0\)" if workers else ""
    assert re.search(rf"{error}{where} \(raised at .*unusual_models.py:\d+, in __getitem__\)\.$", err.strip()), err
    # the logger hint is for `self.logger` of a LightningModule only: a worker's error named no attribute, and the
    # hint came for any line that mentions `logger.`
    assert "without a logger" not in err


def test_a_module_that_exits_as_it_is_imported_or_during_a_run_is_a_message(tmp_path, monkeypatch, capsys):
    # SystemExit is no Exception: a training script without a __main__ guard ended compare with status 0 and no
    # report, and sys.exit in a step was reported as Ctrl-C (status 130, the user's message lost)
    _write_module(tmp_path, monkeypatch, "script_like", "import sys\n\nsys.exit(0)\n")
    out = tmp_path / "nested" / "o"
    for given in (["--model", "script_like:Net", *TINY[2:4]], [*TINY[:4], "--callback", "script_like:Cb"]):
        assert main(["compare", *given, *TINY[8:], "--output", str(out)]) == 2
        err = capsys.readouterr().err
        assert "importing module 'script_like' called sys.exit(0)" in err and '__name__ == "__main__"' in err, err
    _write_module(tmp_path, monkeypatch, "unusual_models", UNUSUAL_MODELS)
    args = ["--model", "unusual_models:ExitsInStep", *TINY[2:4], *TINY[8:], "--repeats", "1", "--output", str(out)]
    assert main(["compare", *args]) == 2
    err = capsys.readouterr().err
    assert re.search(
        r"the 'baseline' run stopped: the code it ran called sys.exit\('bad config'\) \(raised at "
        r".*unusual_models.py:\d+, in training_step\)\.",
        err,
    ), err
    assert not (tmp_path / "nested").exists()  # the failed run's folder, and the parent it made, are gone
    # a path through a folder the run makes and `..`: `pre`, there before, stays (it was taken for one made)
    (tmp_path / "pre").mkdir()
    monkeypatch.chdir(tmp_path)
    args[-1] = "new/../pre/o"
    assert main(["compare", *args]) == 2
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_dir() and not p.name.startswith("_")) == [
        "pre"
    ] and not any((tmp_path / "pre").iterdir())


def test_a_sigterm_during_training_is_an_interruption_not_the_users_exit(tmp_path, monkeypatch, capsys):
    # Lightning raises SIGTERMException, a SystemExit: taken for `sys.exit(None)` in the user's code
    _write_module(tmp_path, monkeypatch, "unusual_models", UNUSUAL_MODELS)
    assert main(["compare", *TINY, "--callback", "unusual_models:Terminated", "--output", str(tmp_path / "o")]) == 130
    assert "interrupted: no report written." in capsys.readouterr().err
