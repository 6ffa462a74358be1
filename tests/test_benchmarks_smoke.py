"""Smoke tests of the benchmark helpers and the MNIST-1D task (no timing is asserted anywhere)."""

from __future__ import annotations

import importlib.util
import json
import random
from pathlib import Path

import pytest
import torch

from benchmarks import common


def test_markdown_table_formats_rows_and_alignment():
    table = common.markdown_table(["a", "b"], [[1, "x|y"], ["2", 3.5]], align="lr")
    assert table.splitlines() == ["| a | b |", "|---|---:|", "| 1 | x\\|y |", "| 2 | 3.5 |"]
    with pytest.raises(ValueError, match="cells"):
        common.markdown_table(["a", "b"], [[1]])
    with pytest.raises(ValueError, match="align"):
        common.markdown_table(["a", "b"], [], align="l")


def test_interleaved_samples_takes_turns_and_drops_the_warmup():
    calls: list[str] = []
    ticks = iter(range(10**6))
    samples = common.interleaved_samples(
        {"a": lambda: calls.append("a"), "b": lambda: calls.append("b")},
        rounds=5,
        warmup=2,
        number=3,
        timer=lambda: float(next(ticks)),  # a fake clock: one tick per reading
    )
    assert {k: len(v) for k, v in samples.items()} == {"a": 5, "b": 5}
    assert calls.count("a") == calls.count("b") == (2 + 5) * 3
    # each round runs every variant once, `number` calls in a row
    rounds = [calls[i : i + 6] for i in range(0, len(calls), 6)]
    assert all(sorted(r) == ["a"] * 3 + ["b"] * 3 for r in rounds)
    assert all(s == pytest.approx(1 / 3) for v in samples.values() for s in v)  # one tick over three calls


def test_shuffled_rounds_are_permutations():
    names = ["p", "q", "r", "s"]
    order = common.shuffled_rounds(names, 6, seed=0)
    assert len(order) == 6 and all(sorted(r) == names for r in order)
    assert len({tuple(r) for r in order}) > 1


def test_goal_markers_round_trip_and_formatting():
    md = "text\n" + common.goal_marker("g1", "1.2 µs", True, "s") + "\n" + common.goal_marker("g2", "n/a", None)
    goals = common.parse_goals(md)
    assert [g["goal"] for g in goals] == ["g1", "g2"]
    assert goals[0]["met"] is True and goals[1]["met"] is None
    assert [common.met_label(g["met"]) for g in goals] == ["met", "not measured"]
    assert common.fmt_seconds(2.5e-6) == "2.5 µs" and common.fmt_seconds(0.25) == "250.0 ms"
    assert common.fmt_pct(0.0123, 2, signed=True) == "+1.23%"


def test_torch_threads_restores_the_count():
    before = torch.get_num_threads()
    with common.torch_threads(1):
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == before


def test_machine_line_names_the_versions():
    line = common.machine_line()
    assert "torch" in line and "cores" in line and "date" in line


def test_runner_summary_and_placeholders(tmp_path: Path):
    from benchmarks import gpu, run

    blocks = {"overhead": "## x\n" + common.goal_marker("overhead goal", "3 µs", False, "overhead")}
    if not torch.cuda.is_available():
        blocks["gpu"] = gpu.section(True, tmp_path)
        assert "Not run" in blocks["gpu"] and "benchmarks/gpu.py" in blocks["gpu"]
    summary = run.summary(blocks)
    assert "overhead goal" in summary and "**not met**" in summary
    doc = run.document(blocks, quick=True, only=["overhead"])
    assert run.existing_sections_from_text(doc)["overhead"] == blocks["overhead"]


def test_quick_mode_leaves_the_published_document_alone(tmp_path: Path, monkeypatch):
    # rough quick-mode verdicts overwrote docs/benchmarks.md's full-run sections
    from benchmarks import run

    published, quick = tmp_path / "benchmarks.md", tmp_path / "results" / "quick.md"
    published.write_text("full run\n", encoding="utf-8")
    quick.parent.mkdir()
    monkeypatch.setattr(run, "DOC", published)
    monkeypatch.setattr(run, "QUICK_DOC", quick)
    seen = []
    monkeypatch.setitem(run.RUNNERS, "overhead", lambda q, out: seen.append((q, out)) or "## Overhead\n\nquick figures")
    monkeypatch.setattr("sys.argv", ["run.py", "--quick", "--only", "overhead"])
    assert run.main() == 0
    assert published.read_text(encoding="utf-8") == "full run\n"
    assert "quick figures" in quick.read_text(encoding="utf-8") and seen == [(True, tmp_path / "results" / "quick")]
    monkeypatch.setattr("sys.argv", ["run.py", "--only", "overhead"])  # a full run writes the published one
    assert run.main() == 0
    assert "quick figures" in published.read_text(encoding="utf-8") and seen[-1][0] is False


def test_a_quick_run_of_every_section_records_its_time_for_the_quick_mode_goal(tmp_path: Path, monkeypatch):
    # the "quick mode under 10 minutes" had no figure in the document, only a hand-written README note
    from benchmarks import run

    quick, record = tmp_path / "results" / "quick.md", tmp_path / "quick_run.json"
    quick.parent.mkdir()
    monkeypatch.setattr(run, "QUICK_DOC", quick)
    monkeypatch.setattr(run, "QUICK_RUN", record)
    assert run.quick_goal()[1:3] == ["no quick run of every section recorded", "not measured"]
    for name in run.SECTIONS:
        monkeypatch.setitem(run.RUNNERS, name, lambda q, out, name=name: f"## {name}\n\nquick")
    monkeypatch.setattr("sys.argv", ["run.py", "--quick", "--only", "overhead"])
    assert run.main() == 0 and not record.exists()  # some sections only: not the goal's run
    monkeypatch.setattr("sys.argv", ["run.py", "--quick"])
    assert run.main() == 0
    saved = json.loads(record.read_text(encoding="utf-8"))
    assert saved["seconds"] >= 0 and saved["date"] and "CPU" in saved["machine"]
    goal, figure, outcome, _ = run.quick_goal()
    assert "under 10 minutes" in goal and figure.startswith(f"{saved['seconds'] / 60:.1f} min") and outcome == "met"
    assert "Quick mode" in run.summary({})
    saved["seconds"] = 11 * 60
    record.write_text(json.dumps(saved), encoding="utf-8")
    assert run.quick_goal()[2] == "**not met**"


mnist1d_missing = importlib.util.find_spec("mnist1d") is None


@pytest.mark.skipif(mnist1d_missing, reason="needs the mnist1d package (the `bench` extra)")
def test_mnist1d_datamodule_shapes_labels_and_no_download(monkeypatch):
    from benchmarks import mnist1d

    data = mnist1d._import_mnist1d_data()

    def no_network(*args, **kwargs):
        raise AssertionError("MNIST-1D must be generated, not downloaded")

    monkeypatch.setattr(data.requests, "get", no_network)
    dm = mnist1d.MNIST1DDataModule(num_samples=500, batch_size=50)
    dm.setup("fit")
    x, y = dm.train_dataset.tensors
    assert x.shape == (400, 1, 40) and x.dtype == torch.float32
    assert y.dtype == torch.long and set(y.tolist()) <= set(range(10))
    assert dm.num_classes == 10 and len(dm.sample_labels()) == 400
    assert dm.val_dataset.tensors[0].shape == (100, 1, 40)
    again = mnist1d.load_mnist1d(num_samples=500)
    assert torch.equal(again[0], x)  # seeded


def test_mnist1d_classifier_from_json_kwargs():
    from benchmarks.mnist1d import MNIST1DClassifier

    kwargs = json.loads('{"num_classes": 10, "lr": 0.01, "channels": 8, "dropout": 0.1}')
    model = MNIST1DClassifier(**kwargs)
    assert model.num_classes == 10
    assert model(torch.randn(3, 1, 40)).shape == (3, 10)
    avg = MNIST1DClassifier(pool="avg")
    assert avg(torch.randn(2, 1, 24)).shape == (2, 10)  # any length with the pooled head
    with pytest.raises(ValueError, match="optimizer"):
        MNIST1DClassifier(optimizer="lamb")


def _verdict(preset, cpu, flops, delta, budget_reached=None, vs_budget=None, cpu_to_target=18.8):
    return {
        "preset": preset,
        "reached": "3/3" if cpu else "1/3",
        "final_delta": delta,
        "speedup_cpu": cpu,
        "speedup_wall": cpu,
        "speedup_flops": flops,
        "budget_reached": budget_reached,
        "vs_budget_cpu": vs_budget,
        "budget_cpu_total": 17.2,
        "cpu_to_target": cpu_to_target,
    }


def test_time_to_accuracy_goal_verdict_needs_every_condition():
    from benchmarks import time_to_accuracy as tta

    def verdict(*rows):
        (goal,) = common.parse_goals("\n".join(tta.goal_lines(list(rows))))
        return goal

    # 2.5x in CPU time and FLOPs, 0.1 point lower, 1.5x against the equal-budget control: met
    met = verdict(_verdict("a", 2.5, 2.2, -0.001, True, 1.5), _verdict("b", 1.1, 1.2, 0.0, True, 1.0))
    assert met["met"] is True and met["figure"].startswith("met by a:")
    assert verdict(_verdict("a", 2.5, 1.9, -0.001, True, 1.5))["met"] is False  # FLOPs speedup short of 2x
    assert verdict(_verdict("a", 2.5, 2.2, -0.004, True, 1.5))["met"] is False  # 0.4 points lower
    assert verdict(_verdict("a", 2.5, 2.2, -0.001, True, 1.2))["met"] is False  # not 1.3x the control
    # the control never reaches the target: the preset must reach it in at most 1/1.3 of the control's whole run
    assert verdict(_verdict("a", 2.5, 2.2, 0.0, False, cpu_to_target=13.0))["met"] is True  # 17.2 s / 13.0 s
    late = verdict(_verdict("a", 2.5, 2.2, 0.0, False))  # 18.8 s to the target, more than the control's 17.2 s
    assert late["met"] is False and "less than 1.3x less" in late["figure"]
    never = verdict(_verdict("a", None, None, -0.006))
    assert never["met"] is False and never["figure"].startswith("no vision preset reaches the target")
    assert "closest: a, final accuracy -0.60 points, reached in 1/3 seeds" in never["figure"]


def test_time_to_accuracy_goal_is_met_by_any_preset_not_only_the_fastest():
    from benchmarks import time_to_accuracy as tta

    def verdict(*rows):
        (goal,) = common.parse_goals("\n".join(tta.goal_lines(list(rows))))
        return goal

    fast_but_worse = _verdict("fast", 3.0, 3.0, -0.006, True, 2.0)  # the fastest misses the accuracy condition
    slower_ok = _verdict("slower", 2.1, 2.2, -0.001, True, 1.4)
    goal = verdict(fast_but_worse, slower_ok)
    assert goal["met"] is True and goal["figure"].startswith("met by slower:")
    both = verdict(_verdict("x", 2.6, 2.6, 0.0, True, 1.5), _verdict("y", 2.2, 2.2, 0.0, False, cpu_to_target=9.0))
    assert both["met"] is True and "met by x:" in both["figure"] and "also met by y" in both["figure"]
    # none meets all three: the closest (by speed) is reported with what it misses
    none = verdict(fast_but_worse, _verdict("slow", 1.5, 1.5, 0.0, True, 1.4))
    assert none["met"] is False and none["figure"].startswith("no vision preset meets every condition; closest: fast")
    assert "misses: ≤ 0.3 points below" in none["figure"]
    # a preset without a shortened control (it saves no FLOPs) is judged against the baseline itself
    assert verdict(_verdict("nc", 2.5, 2.5, 0.0, None, None))["met"] is True
    # quick mode runs one preset: a miss is not measured (another preset might meet it), a pass is met
    (quick,) = common.parse_goals("\n".join(tta.goal_lines([fast_but_worse], all_presets=False)))
    assert quick["met"] is None and common.outcome_label(quick) == "quick mode: only fast ran"
    (quick,) = common.parse_goals("\n".join(tta.goal_lines([slower_ok], all_presets=False)))
    assert quick["met"] is True


def test_time_to_accuracy_shuffles_each_seeds_order_with_the_controls_after_seed_zero(monkeypatch):
    from benchmarks import time_to_accuracy as tta
    from lightning_speedups import compare
    from lightning_speedups.meter import Checkpoint

    calls: list[tuple[int, str, int]] = []

    def fake_run(arm, repeat, cfg, make_model, make_dm, callbacks, extra, bar, max_steps=-1):
        steps = max_steps if max_steps > 0 else 100
        flops = 10.0 * steps if callbacks == [] else 500.0  # every preset: the FLOPs of 50 baseline steps
        calls.append((repeat, arm, max_steps))
        history = [Checkpoint(step=steps, epoch=0, wall=1.0, cpu=1.0, flops=flops, metric=0.9)]
        return compare.RunResult(arm=arm, repeat=repeat, history=history, flops=flops, steps=steps)

    monkeypatch.setattr(compare, "_run", fake_run)
    task = tta.Task("digits", "t", *(tta.TASKS["digits"].model, tta.TASKS["digits"].datamodule), 1, tta.VISION)
    result = tta.run_task(task, seeds=3, log=lambda *a: None)
    control = tta.control_label(50)
    assert calls[0] == (0, "warm-up", tta.WARM_UP_STEPS)  # untimed, before every timed run
    orders = [[arm for seed, arm, _ in calls[1:] if seed == s] for s in range(3)]
    assert all(order.count(control) == 1 and len(order) == 5 for order in orders)
    assert orders[0][-1] == control  # seed 0: its budget needs the presets' FLOPs first
    assert sorted(orders[1]) == sorted(orders[2]) == sorted(orders[0])
    assert orders[1] != orders[2]  # each seed its own shuffle, the control in it (a rotation kept neighbours)
    expected = [["baseline", *(label for label, _, _ in tta.VISION)]]
    expected += [["baseline", *(label for label, _, _ in tta.VISION), control] for _ in range(2)]
    for seed, names in enumerate(expected):
        random.Random(tta.ORDER_SEED + seed).shuffle(names)
        assert orders[seed][: len(names)] == names
    assert all(max_steps == 50 for _, arm, max_steps in calls if arm == control)
    assert result["controls"] == {label: control for label, _, _ in tta.VISION} and result["mismatches"] == []
    # read from the datamodule: 20% of each class, rounded per class, is 359 of the 1,797 digits (not 360)
    assert result["val_size"] == 359
    text = tta.resolution_text([{**result, "target": 358 / 359}])
    assert "359 validation samples, so one sample is 0.28 points" in text and "99.72% means at most 1 error" in text
    assert tta.correct_text({**result, "target": 358 / 359}) == " (358 of 359 validation samples)"


def test_time_to_accuracy_speedups_are_medians_of_per_seed_ratios():
    from benchmarks import time_to_accuracy as tta
    from lightning_speedups import compare
    from lightning_speedups.meter import Checkpoint

    def run(arm, seed, cpu):  # reaches 0.9 at `cpu` seconds, or never (None)
        metric, at = (0.9, cpu) if cpu is not None else (0.5, 99.0)
        history = [Checkpoint(step=10, epoch=0, wall=at, cpu=at, flops=at, metric=metric)]
        return compare.RunResult(arm=arm, repeat=seed, history=history, flops=at, steps=10)

    base, arm = [10.0, 20.0, 40.0], [5.0, 40.0, 10.0]  # per seed: 2x, 0.5x, 4x -> median 2x
    runs = [run("baseline", i, c) for i, c in enumerate(base)] + [run("x", i, c) for i, c in enumerate(arm)]
    assert tta.seed_ratio(runs, "baseline", "x", 0.9, "cpu") == pytest.approx(2.0)
    # a ratio of medians would say 20 / 10 = 2x too here; with a miss it differs: seed 2 counts as 0
    runs[-1] = run("x", 2, None)
    assert tta.seed_ratio(runs, "baseline", "x", 0.9, "cpu") == pytest.approx(0.5)
    runs[-2] = run("x", 1, None)
    assert tta.seed_ratio(runs, "baseline", "x", 0.9, "cpu") is None  # misses in most seeds
    # the numerator missing (an equal-budget control) counts as infinitely slow, not as a seed left out:
    # per seed 1.0, 1.5 and a control that misses -> median 1.5 (leaving it out gave 1.25)
    control = [run("control", 0, 10.0), run("control", 1, 15.0), run("control", 2, None)]
    preset = [run("x", i, 10.0) for i in range(3)]
    assert tta.seed_ratio(control + preset, "control", "x", 0.9, "cpu") == pytest.approx(1.5)
    # two seeds, the arm missing one: no speedup (the mean of 0 and 4x said 2x beside "not reached")
    runs = [run("baseline", i, 20.0) for i in range(2)] + [run("x", 0, 5.0), run("x", 1, None)]
    assert tta.seed_ratio(runs, "baseline", "x", 0.9, "cpu") is None
    runs[-1] = run("x", 1, 10.0)  # both seeds reached: the lower median of 4x and 2x
    assert tta.seed_ratio(runs, "baseline", "x", 0.9, "cpu") == pytest.approx(2.0)


def test_gpu_digits_section_runs_the_time_to_accuracy_task_on_the_gpu(monkeypatch):
    from benchmarks import gpu
    from lightning_speedups import compare, presets
    from lightning_speedups.meter import Checkpoint

    accelerators: set[str] = set()

    def fake_run(arm, repeat, cfg, make_model, make_dm, callbacks, extra, bar, max_steps=-1):
        accelerators.add(cfg.accelerator)
        steps = max_steps if max_steps > 0 else 100
        flops = 10.0 * steps if callbacks == [] else 500.0
        history = [Checkpoint(step=steps, epoch=0, wall=1.0, cpu=1.0, flops=flops, metric=0.9)]
        return compare.RunResult(arm=arm, repeat=repeat, history=history, flops=flops, steps=steps)

    monkeypatch.setattr(compare, "_run", fake_run)
    text = gpu.digits(quick=True)
    assert accelerators == {"gpu"}
    assert "Digits time to accuracy on the GPU" in text and "--accelerator gpu --only vision-mild" in text
    assert "vision-mild" in text and "Target 0.9000" in text
    assert "32-bit" not in text and f"precision `{presets.recommended_precision('gpu')}`" in text


def test_goal_marker_outcome_overrides_the_label_in_the_summary(tmp_path: Path, monkeypatch):
    from benchmarks import run

    monkeypatch.setattr(run, "QUICK_RUN", tmp_path / "none.json")  # no quick run's row (met) in this summary
    marker = common.goal_marker("cpu stand-in", "107% on CPU", None, "efficiency", outcome="CPU stand-in")
    (goal,) = common.parse_goals(marker)
    assert goal["met"] is None and common.outcome_label(goal) == "CPU stand-in"
    summary = run.summary({"efficiency": marker})
    assert "| cpu stand-in | 107% on CPU | CPU stand-in | efficiency |" in summary and "| met |" not in summary


def test_overhead_dispatch_and_notes_render():
    from benchmarks import overhead

    dispatch = overhead.measure_dispatch({"on_train_batch_end": 1.0, "on_train_epoch_start": 0.04}, rounds=1)
    with_callback = [v.name for v in overhead.variants() if v.state != "-"]
    assert set(dispatch) == {*with_callback, overhead.EMPTY}
    assert all(isinstance(x, float) for x in dispatch.values())
    # the notes format every WHY entry with this run's figures (no leftover placeholders)
    plain = 3e-3
    loop = {}
    for v in overhead.variants():
        row = {"variant": v, "own": 5e-5, "dispatch": 0.0 if v.state == "-" else 1e-5}
        row["cost"] = row["own"] + row["dispatch"]
        row.update({"part:transform_batch": 4e-5, "part:on_train_batch_end": 2e-6, "part:pre_step": 1e-6})
        loop[v.name] = row
    alone = {name: 2e-5 for name in overhead.WHY} | {overhead.RNG: 1e-5, overhead.MIX: 5e-6}
    failed = [(name, loop[name]) for name in [*overhead.WHY, "MixUp (inactive)"]]
    text = overhead.notes(failed, plain, alone, loop)
    assert "{" not in text and "Lightning's dispatch" in text and "µs alone" in text
    assert "took 2.0x to 2.0x its time alone in this run" in text
    assert "Its largest parts per step (µs): transform_batch 40, on_train_batch_end 2, pre_step 1; " in text
    assert "Lightning's dispatch 10.0." in text
    assert "`SpeedupCallback` works its key out once per fit" in text and "whose key formats" not in text
    # the threshold is rounded up to one decimal: 60 µs per step is under 1% of any step longer than 6.0 ms
    assert "under 1% of any step longer than 6.0 ms" in text
    assert overhead._ceil_ms(4.44e-3) == "4.5" and overhead._ceil_ms(4.4e-3) == "4.4"
    # a sampler's per-epoch work is shared over the epoch's batches in the fallback "why"
    sampler = {**loop["RepeatFactorSampling (active)"], "epoch_ours": 300e-6, "epoch_hooks": 20e-6, "batches": 25.0}
    why = overhead.notes([("RepeatFactorSampling (active)", sampler)], plain, alone, loop)
    assert "per epoch 300 (the epoch list beyond the default shuffle's 280, epoch hooks 20)" in why
    assert "over 25 batches: 12.0 per step; Lightning's dispatch 10.0." in why


def test_overhead_plain_step_pools_both_plain_arms_and_marks_borderline_verdicts():
    from benchmarks import overhead

    vs = {v.name: v for v in overhead.variants()}
    loop = {
        "plain Trainer": {"variant": vs["plain Trainer"], "step": 3.0e-3, "steps": [2.9e-3, 3.0e-3, 3.1e-3]},
        "plain, A/A": {"variant": vs["plain, A/A"], "step": 3.4e-3, "steps": [3.3e-3, 3.4e-3, 3.5e-3]},
    }
    assert overhead.plain_step(loop) == pytest.approx(3.2e-3)  # the median of all six, not 3.0e-3
    clear = {"variant": vs["MixUp (active)"], "cost": 20e-6}
    close = {"variant": vs["MixUp (active)"], "cost": 31e-6}  # met against 3.2 or 3.4 ms, not against 3.0 ms
    assert overhead._verdict(close, overhead.plain_step(loop)) is True
    assert not overhead.borderline(clear, loop) and overhead.borderline(close, loop)


def test_gpu_throughput_harness_times_a_window_of_steps_on_device_batches(monkeypatch):
    """The GPU harness, run on the CPU with its CUDA calls patched out: the fit takes whole pre-made batches
    (no collation), and the timed window spans exactly the steps after the warm-up."""
    from benchmarks import gpu
    from lightning_speedups import ProgressiveResizing

    monkeypatch.setattr(gpu, "ACCELERATOR", "cpu")
    monkeypatch.setattr(torch.Tensor, "cuda", lambda self, *a, **k: self)
    syncs: list[int] = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: syncs.append(1))
    loader = gpu.fake_loader(batch_size=2, batches=2, num_classes=10)
    x, y = next(iter(loader))
    assert x.shape == (2, 3, 224, 224) and x.dtype == torch.uint8 and y.shape == (2,)
    clock = iter(range(100))
    monkeypatch.setattr(gpu, "_clock", lambda: float(next(clock)) + 1.0)
    per_step = gpu.fit_steps([ProgressiveResizing(0.5, 1.0, 0.0)], loader, steps=3, warmup=1)
    assert len(syncs) == 2  # at the window's two ends only, not at every step
    assert per_step == pytest.approx(1 / 3)  # two clock reads, one tick apart, over 3 steps
    # every variant the section times builds and fits on these whole-batch loaders (the warmup's could not read
    # a batch size from them, so the section always failed)
    for name, make in gpu.make_variants(batch_size=2).items():
        assert gpu.fit_steps(make(), loader, steps=1, warmup=1) > 0, name


def test_a_failed_section_keeps_its_goals_as_not_measured():
    from benchmarks import common, run

    previous = "## overhead\n\n" + common.goal_marker("MixUp (active): overhead ≤ 1% of a step", "215 µs", False)
    block = run.failed_block("overhead", ValueError("boom"), previous)
    assert "**Failed** in this run: `ValueError: boom`" in block
    (goal,) = common.parse_goals(block)
    assert goal["goal"] == "MixUp (active): overhead ≤ 1% of a step" and goal["met"] is None
    assert "the section failed" in goal["figure"]
    assert common.parse_goals(run.failed_block("peers", ValueError("x"), "")) == []  # no earlier run: no goals


def test_timed_callback_calls_draw_afresh_each_call(monkeypatch):
    """The peers and overhead benchmarks time a callback call after call: each must be a new batch's draws (a
    CutMix box of another size), as in a fit, not the first batch's again."""
    from benchmarks import overhead, peers

    calls = peers.groups(8, 3, 16, 16, classes=4)
    for group, name in (
        ("mixup", "ours: MixUp callback (transform_batch)"),
        ("cutmix", "ours: CutMix callback (transform_batch)"),
    ):
        targets = [calls[group][name]()[1] for _ in range(4)]
        assert any(not torch.equal(targets[0], t) for t in targets[1:]), name

    seen: list[torch.Tensor] = []

    def record(fns, rounds, **kwargs):
        seen.extend(fns["CutMix (active)"]()[1] for _ in range(4))
        return {name: 0.0 for name in fns}

    monkeypatch.setattr(overhead.common, "interleaved", record)
    overhead.measure_transforms(rounds=1)
    assert any(not torch.equal(seen[0], t) for t in seen[1:])
