"""`lightning-speedups compare` and `presets` from the command line: output files and clear errors."""

import json
import re

import pytest

from lightning_speedups.cli import main
from lightning_speedups.compare import CompareConfig, parse_callback, run_comparison

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
    assert baseline["flops"] > 0 and baseline["steps"] == 12  # 1437 samples / 128 per batch
    assert baseline["speedup_flops"] == pytest.approx(1.0)


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


def test_repeats_interleave_and_target_is_reported():
    cfg = CompareConfig(
        callbacks=["LabelSmoothing"],
        model="lightning_speedups.demo:ImageClassifier",
        datamodule="lightning_speedups.demo:DigitsDataModule",
        model_args={"widths": [8]},
        datamodule_args={"size": 8, "batch_size": 256},
        accelerator="cpu",
        max_epochs=1,
        repeats=2,
        target=0.05,
        output=None,
        progress=False,
    )
    report = run_comparison(cfg)
    assert [(r.arm, r.repeat) for r in report.runs] == [
        ("baseline", 0),
        ("callbacks: LabelSmoothing", 0),
        ("callbacks: LabelSmoothing", 1),  # the first two arms swap places every other repeat
        ("baseline", 1),
    ]
    assert report.target == 0.05 and all(s.reached == 2 for s in report.summaries)


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
        (["--target", "1.5"], r"--target must be in \(0, 1\]"),
        (["--repeats", "0"], "--repeats must be >= 1"),
        (["--preset", "baseline", "--callback", "MixUp"], "not both"),
        (["--callback", "MixUpp"], "No callback class named 'MixUpp'"),
        (["--preset", "baseline"], "compare the baseline with itself"),
        (["--callback", "MixUp:alpha"], "arguments look like 'name=value'"),
        (["--callback", "MixUp:alpha=-1"], "`alpha` must be > 0"),
        (["--model-args", "[1]"], None),
    ],
)
def test_bad_input_gives_a_message_not_a_traceback(args, message, capsys):
    if message is None:  # argparse rejects it while parsing
        with pytest.raises(SystemExit) as exit_info:
            main(["compare", *args])
        assert exit_info.value.code == 2
        assert "expected a JSON object" in capsys.readouterr().err
        return
    assert main(["compare", *args, "--no-progress", "--output", "unused"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ")
    assert re.search(message, err), err
    assert "Traceback" not in err


def test_a_model_that_does_not_log_the_metric(capsys):
    code = main(["compare", "--callback", "MixUp", *TINY, "--metric", "val_top1", "--output", "unused"])
    assert code == 2
    assert "'val_top1' was not logged" in capsys.readouterr().err


def test_parse_callback():
    cb = parse_callback("MixUp:alpha=0.4,p=0.5,end=0.9")
    assert (cb.alpha, cb.p, cb.end) == (0.4, 0.5, 0.9)
    assert type(parse_callback("EarlyStopping:monitor=val_acc")).__name__ == "EarlyStopping"


def test_presets_command(capsys):
    assert main(["presets"]) == 0
    assert "baseline" in capsys.readouterr().out
    assert main(["presets", "baseline"]) == 0
    assert "callbacks: none" in capsys.readouterr().out
    assert main(["presets", "nope"]) == 2
    assert "Unknown preset 'nope'" in capsys.readouterr().err
