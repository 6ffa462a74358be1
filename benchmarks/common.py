"""Helpers shared by the benchmark scripts: the machine, interleaved timing, Markdown tables, goal markers.

Nothing here asserts a time: the benchmarks report figures, the tests never time anything.

* :func:`machine` / :func:`machine_line` describe where a figure was taken (CPU model, cores, torch threads,
  versions, date, load average).
* :func:`interleaved` times several variants *taking turns*: each round runs every variant once, in an order
  shuffled per round, so a slow spell of a shared machine hits all of them alike; it returns the median per
  variant. :func:`interleaved_samples` returns every sample instead.
* :func:`markdown_table` formats rows; :func:`fmt_us`, :func:`fmt_seconds` format times.
* :func:`goal_marker` embeds a goal and its outcome in a section's Markdown as an HTML comment, which
  ``benchmarks/run.py`` collects into the summary table at the top of ``docs/benchmarks.md`` (any section,
  written by anyone, can add rows that way without importing the runner).
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import re
import statistics
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np


# ---------------------------------------------------------------------------------------------- the machine
def cpu_model() -> str:
    """The CPU model name from ``/proc/cpuinfo`` where there is one, else what ``platform`` says."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def usable_cores() -> int:
    """CPUs this process may run on (its affinity mask where the OS has one)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def load_average() -> float | None:
    """The 1-minute load average (``None`` where the OS has none)."""
    try:
        return round(os.getloadavg()[0], 2)
    except (AttributeError, OSError):
        return None


def _version(module: str) -> str | None:
    try:
        mod = __import__(module)
    except Exception:  # optional peers: any import failure means "not installed here"
        return None
    return str(getattr(mod, "__version__", "?"))


#: what the benchmarks write (`git status` pathspecs): not a change to the code they measure
_OUTPUTS = (":!docs/benchmarks.md", ":!docs/benchmarks")


def git_commit() -> str | None:
    """The checkout's commit (short), ``-dirty`` if tracked files differ from it (the benchmark document and its
    plots aside: a run of several sections rewrites them as it goes); ``None`` outside a git checkout."""
    import subprocess

    root = Path(__file__).resolve().parents[1]
    try:
        sha = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no", "--", ".", *_OUTPUTS],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None
    return f"{sha}-dirty" if dirty else sha


def machine(extra_modules: Iterable[str] = ()) -> dict[str, Any]:
    """What a figure was measured on: CPU, cores, torch threads, device, versions, UTC date, load average."""
    import torch

    info: dict[str, Any] = {
        "cpu": cpu_model(),
        "cores": usable_cores(),
        "torch_threads": torch.get_num_threads(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "lightning": _version("lightning"),
        "torchvision": _version("torchvision"),
        "numpy": np.__version__,
        "date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d"),
        "commit": git_commit(),
        "load_average": load_average(),
    }
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(0)
    for name in extra_modules:
        info[name] = _version(name)
    return info


def machine_line(info: Mapping[str, Any] | None = None, extra_modules: Iterable[str] = ()) -> str:
    """One Markdown line describing :func:`machine`."""
    m = dict(info) if info is not None else machine(extra_modules)
    parts = [
        f"CPU {m['cpu']}, {m['cores']} usable cores, torch threads: {m['torch_threads']}",
    ]
    if m.get("gpu"):
        parts.append(f"GPU {m['gpu']}")
    versions = [f"Python {m['python']}", f"torch {m['torch']}"]
    for key in ("lightning", "torchvision", "numpy", *extra_modules):
        if m.get(key):
            versions.append(f"{key} {m[key]}")
    parts.append(", ".join(versions))
    parts.append(f"date {m['date']}" + (f", commit {m['commit']}" if m.get("commit") else ""))
    if m.get("load_average") is not None:
        parts.append(f"load average {m['load_average']} at the start")
    return "- Machine: " + "; ".join(parts) + "."


# ---------------------------------------------------------------------------------------------- timing
@contextmanager
def torch_threads(n: int | None) -> Iterator[None]:
    """Run the block with ``n`` torch intra-op threads (``None``: leave as is), then put the old count back.

    On a small shared machine one thread is the robust choice for small ops: when another process also
    runs two OpenMP threads on the same two cores, spinning workers can slow a millisecond step fifty-fold.
    """
    import torch

    old = torch.get_num_threads()
    if n is not None:
        torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(old)


def interleaved_samples(
    variants: Mapping[str, Callable[[], Any]],
    rounds: int,
    *,
    warmup: int = 1,
    number: int = 1,
    seed: int = 0,
    timer: Callable[[], float] = time.perf_counter,
) -> dict[str, list[float]]:
    """Seconds per call of each variant, one sample per round; the variants take turns in a shuffled order.

    Each sample is the mean of ``number`` back-to-back calls (use ``number > 1`` for calls of a few µs,
    where the timer's own cost would show). ``warmup`` rounds run first, untimed, in the same fashion.
    """
    if rounds < 1 or number < 1 or warmup < 0:
        raise ValueError("`rounds` and `number` must be >= 1 and `warmup` >= 0.")
    names = list(variants)
    rng = np.random.default_rng(seed)
    samples: dict[str, list[float]] = {name: [] for name in names}
    for r in range(warmup + rounds):
        for i in rng.permutation(len(names)):
            fn = variants[names[i]]
            start = timer()
            for _ in range(number):
                fn()
            elapsed = (timer() - start) / number
            if r >= warmup:
                samples[names[i]].append(elapsed)
    return samples


def interleaved(
    variants: Mapping[str, Callable[[], Any]],
    rounds: int,
    *,
    warmup: int = 1,
    number: int = 1,
    seed: int = 0,
) -> dict[str, float]:
    """Median seconds per call of each variant, timed as :func:`interleaved_samples` does."""
    samples = interleaved_samples(variants, rounds, warmup=warmup, number=number, seed=seed)
    return {name: statistics.median(s) for name, s in samples.items()}


def shuffled_rounds(names: Sequence[str], rounds: int, seed: int = 0) -> list[list[str]]:
    """The order in which :func:`interleaved_samples` would run ``names``: one shuffled list per round.

    For benchmarks whose variants are not plain callables (a whole ``Trainer.fit`` per turn, say).
    """
    rng = np.random.default_rng(seed)
    return [[names[i] for i in rng.permutation(len(names))] for _ in range(rounds)]


def median(values: Iterable[float]) -> float:
    values = list(values)
    return statistics.median(values) if values else float("nan")


# ---------------------------------------------------------------------------------------------- formatting
def fmt_us(seconds: float, digits: int = 1) -> str:
    """Seconds as microseconds, e.g. ``12.3 µs``."""
    return f"{seconds * 1e6:,.{digits}f} µs"


def fmt_seconds(seconds: float) -> str:
    """A duration in the unit that reads best (µs, ms or s)."""
    if seconds != seconds:  # NaN
        return "-"
    magnitude = abs(seconds)
    if magnitude < 1e-3:
        return f"{seconds * 1e6:.1f} µs"
    if magnitude < 1.0:
        return f"{seconds * 1e3:.1f} ms"
    return f"{seconds:.2f} s"


def fmt_pct(fraction: float, digits: int = 1, signed: bool = False) -> str:
    """A fraction as a percentage, e.g. ``0.0123`` -> ``1.2%``."""
    if fraction != fraction:
        return "-"
    return f"{fraction * 100:{'+' if signed else ''}.{digits}f}%"


def markdown_table(headers: Sequence[str], rows: Iterable[Sequence[Any]], align: str | None = None) -> str:
    """A GitHub Markdown table; ``align`` is one letter per column (``l``, ``r``, ``c``), left by default."""
    headers = [str(h) for h in headers]
    marks = {"l": "---", "r": "---:", "c": ":---:"}
    spec = align or "l" * len(headers)
    if len(spec) != len(headers):
        raise ValueError(f"`align` has {len(spec)} letters for {len(headers)} columns.")
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join(marks[a] for a in spec) + "|"]
    for row in rows:
        cells = [str(c).replace("|", "\\|").replace("\n", " ") for c in row]
        if len(cells) != len(headers):
            raise ValueError(f"A row has {len(cells)} cells for {len(headers)} columns: {cells}.")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def command_block(command: str) -> str:
    return f"```bash\n{command}\n```"


# ---------------------------------------------------------------------------------------------- goals
_GOAL_RE = re.compile(r"<!-- goal: (\{.*?\}) -->")


def goal_marker(goal: str, figure: str, met: bool | None, section: str = "", outcome: str | None = None) -> str:
    """An HTML comment carrying one goal's outcome; ``met=None`` means not measured in this run.

    ``outcome`` replaces the summary's met / not met / not measured label, e.g. for a figure that stands in
    for a goal measured elsewhere (give it with ``met=None``: a stand-in is never counted as met).
    """
    payload: dict[str, Any] = {"goal": goal, "figure": figure, "met": met, "section": section}
    if outcome is not None:
        payload["outcome"] = outcome
    return f"<!-- goal: {json.dumps(payload, ensure_ascii=False)} -->"


def parse_goals(markdown: str) -> list[dict[str, Any]]:
    """The goals that :func:`goal_marker` embedded in ``markdown``, in order."""
    return [json.loads(m.group(1)) for m in _GOAL_RE.finditer(markdown)]


def met_label(met: bool | None) -> str:
    return {True: "met", False: "**not met**", None: "not measured"}[met]


def outcome_label(goal: Mapping[str, Any]) -> str:
    """The summary's outcome cell for a parsed goal: its own ``outcome`` if it has one, else :func:`met_label`."""
    return goal.get("outcome") or met_label(goal["met"])
