"""Regenerate ``docs/benchmarks.md`` and its plots (``docs/benchmarks/*.png``) with one command.

    PYTHONPATH=. python benchmarks/run.py                      # every section, full size
    PYTHONPATH=. python benchmarks/run.py --quick              # smaller runs (minutes, CPU), to a scratch file
    PYTHONPATH=. python benchmarks/run.py --only overhead peers

The document is made of sections, each a module function ``section(quick: bool, out_dir: Path) -> str``
returning Markdown (heading, command, machine, date, tables, notes on unmet goals) and writing its plots into
``out_dir``. Sections: ``time_to_accuracy`` (``benchmarks/time_to_accuracy.py``), ``overhead``,
``efficiency`` (resizing and dropout, mid-run validation, sampling), ``peers`` and ``gpu``. With ``--only``,
the other sections are kept as they are in the existing document.

``--quick`` checks that every section runs and gives rough figures: vision-mild on digits alone for time to
accuracy, a fraction of the rounds and steps elsewhere, so its met/not-met verdicts are less sure than a full
run's. It writes ``benchmarks/results/quick.md`` unless ``--output`` says otherwise, leaving the published
document alone.

A section reports a goal by embedding ``benchmarks.common.goal_marker(goal, figure, met)`` (an HTML comment)
in its Markdown; the summary table at the top of the document lists every goal of every section, met or not.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# Run as a script, `benchmarks/` is first on sys.path, where `mnist1d.py` would hide the `mnist1d` package.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != ROOT / "benchmarks"]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks import common  # noqa: E402

DOC = ROOT / "docs" / "benchmarks.md"
QUICK_DOC = ROOT / "benchmarks" / "results" / "quick.md"  # git-ignored: quick figures stay out of the docs
PLOTS = ROOT / "docs" / "benchmarks"
QUICK_RUN = PLOTS / "quick_run.json"  # the last quick run of every section: how long it took (a goal)
QUICK_LIMIT_MIN = 10.0
SECTIONS = ("time_to_accuracy", "overhead", "efficiency", "peers", "gpu")
_BLOCK = re.compile(r"<!-- section: (\w+) -->\n(.*?)\n<!-- /section: \1 -->", re.S)


def _demote(markdown: str) -> str:
    """One heading level down (``## x`` -> ``### x``), for sub-sections."""
    return re.sub(r"^(#{2,5}) ", lambda m: m.group(1) + "# ", markdown, flags=re.M)


def time_to_accuracy(quick: bool, out_dir: Path) -> str:
    from benchmarks import time_to_accuracy as mod

    return mod.section(quick, out_dir)


def overhead(quick: bool, out_dir: Path) -> str:
    from benchmarks import overhead as mod

    return mod.section(quick, out_dir)


def efficiency(quick: bool, out_dir: Path) -> str:
    from benchmarks import resizing_and_dropout, resizing_validation, sampling

    parts = [
        "## Efficiency against the ideal",
        "",
        "Progressive resizing's step time against its FLOPs, data loading in pipeline mode, dropout removal's "
        "step-time change, mid-run validation under resizing, and the samplers' index generation against a "
        "per-sample Python loop.",
        "",
        _demote(resizing_and_dropout.section(quick, out_dir)),
        "",
        _demote(resizing_validation.section(quick, out_dir)),
        "",
        _demote(sampling.section(quick, out_dir)),
    ]
    return "\n".join(parts)


def peers(quick: bool, out_dir: Path) -> str:
    from benchmarks import peers as mod

    return mod.section(quick, out_dir)


def gpu(quick: bool, out_dir: Path) -> str:
    from benchmarks import gpu as mod

    return mod.section(quick, out_dir)


RUNNERS: dict[str, Callable[[bool, Path], str]] = {
    "time_to_accuracy": time_to_accuracy,
    "overhead": overhead,
    "efficiency": efficiency,
    "peers": peers,
    "gpu": gpu,
}


def existing_sections_from_text(text: str) -> dict[str, str]:
    """The sections of a generated document, by name."""
    return {m.group(1): m.group(2) for m in _BLOCK.finditer(text)}


def existing_sections(path: Path) -> dict[str, str]:
    return existing_sections_from_text(path.read_text(encoding="utf-8")) if path.exists() else {}


def quick_goal() -> list[str]:
    """The summary's row for the quick mode's running time, from the last quick run of every section."""
    goal = f"Quick mode (`run.py --quick`, every section) under {QUICK_LIMIT_MIN:g} minutes on CPU"
    if not QUICK_RUN.exists():
        return [goal, "no quick run of every section recorded", common.met_label(None), "quick mode"]
    run = json.loads(QUICK_RUN.read_text(encoding="utf-8"))
    minutes = run["seconds"] / 60
    figure = f"{minutes:.1f} min ({run['machine'].removeprefix('Machine: ').rstrip('.')})"  # its date and commit
    return [goal, figure, common.met_label(minutes < QUICK_LIMIT_MIN), "quick mode"]


def summary(blocks: dict[str, str]) -> str:
    rows = [quick_goal()]
    for name in SECTIONS:
        for g in common.parse_goals(blocks.get(name, "")):
            rows.append([g["goal"], g["figure"], common.outcome_label(g), name.replace("_", " ")])
    if not rows:
        return "No goal was measured."
    return common.markdown_table(["goal", "figure", "outcome", "section"], rows, "llll")


def document(blocks: dict[str, str], quick: bool, only: list[str] | None) -> str:
    ran = ", ".join(only) if only else "all sections"
    parts = [
        "# Benchmarks",
        "",
        "Performance figures, each with its command, machine and date; tests never assert wall-clock time. This "
        "file and its plots (`docs/benchmarks/`) are generated: do not edit them by hand, run",
        "",
        common.command_block("PYTHONPATH=. python benchmarks/run.py [--quick] [--only SECTION ...]"),
        "",
        f"Last run: `{' '.join(sys.argv[1:]) or '(no options)'}` ({ran}{', quick' if quick else ''}), "
        f"{common.machine()['date']}. The machine is small and shared: times are medians of repeats in which "
        "the variants take turns (a shuffled order each round; time to accuracy shuffles its arms within each seed "
        "after an untimed warm-up run; each section says how it orders its runs), and ratios are steadier than "
        "absolute times. Each section's machine line names the commit it ran at. The peers section times "
        "Composer's functional ops only where Composer imports, or `COMPOSER_PYTHON` names a Python that has it "
        "(its own environment: Composer pins older torch); without it that table has no Composer rows.",
        "",
        "## Goals",
        "",
        summary(blocks),
        "",
    ]
    for name in SECTIONS:
        body = blocks.get(name) or f"## {name.replace('_', ' ').capitalize()}\n\nNot run yet."
        parts += [f"<!-- section: {name} -->", body, f"<!-- /section: {name} -->", ""]
    return "\n".join(parts)


def failed_block(name: str, err: BaseException, previous: str) -> str:
    """A section that raised: the error, and its goals (from its last good run) listed as not measured."""
    goals = [
        common.goal_marker(g["goal"], f"not measured: the section failed ({type(err).__name__})", None, name)
        for g in common.parse_goals(previous)
    ]
    return "\n".join([f"## {name}", "", f"**Failed** in this run: `{type(err).__name__}: {err}`", "", *goals])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--quick",
        action="store_true",
        help=f"smaller runs (minutes on a CPU; rougher figures), written to {QUICK_DOC} by default",
    )
    parser.add_argument("--only", nargs="+", choices=SECTIONS, metavar="SECTION", help=f"any of {SECTIONS}")
    parser.add_argument(
        "--output", type=Path, default=None, help=f"the Markdown file to write (default: {DOC}, or {QUICK_DOC})"
    )
    args = parser.parse_args()
    if args.output is None:
        args.output = QUICK_DOC if args.quick else DOC
    out_dir = args.output.parent / args.output.stem
    out_dir.mkdir(parents=True, exist_ok=True)
    blocks = existing_sections(args.output)
    failed = []
    began = time.perf_counter()
    for name in args.only or SECTIONS:
        start = time.perf_counter()
        print(f"[run.py] {name} ...", file=sys.stderr, flush=True)
        try:
            blocks[name] = RUNNERS[name](args.quick, out_dir).strip()
        except Exception as err:  # keep the other sections; say what failed, in the document too
            traceback.print_exc()
            failed.append(name)
            blocks[name] = failed_block(name, err, blocks.get(name, ""))
        print(f"[run.py] {name} done in {time.perf_counter() - start:.0f} s", file=sys.stderr, flush=True)
    if args.quick and not args.only and not failed:  # the quick mode's own goal: its time, every section run
        record = {"seconds": round(time.perf_counter() - began, 1), "machine": common.machine_line()[2:]}
        record.update({k: common.machine()[k] for k in ("date", "commit")})
        QUICK_RUN.write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    args.output.write_text(document(blocks, args.quick, args.only), encoding="utf-8")
    print(f"[run.py] wrote {args.output}" + (f"; failed: {failed}" if failed else ""), file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
