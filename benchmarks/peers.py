"""Our MixUp, CutMix, label smoothing and resizing ops against the peers', on the same batches (CPU; not a test).

Peers: ``torchvision.transforms.v2.MixUp`` / ``CutMix``, timm's ``Mixup`` (a mixup-only and a cutmix-only
instance) and, where it is installed, Composer's functional ops (``mixup_batch``, ``cutmix_batch``,
``resize_batch``, ``smooth_labels``). Ours: the functional ops of :mod:`lightning_speedups.functional` and the
callbacks' own path (``MixUp.transform_batch`` / ``CutMix.transform_batch``: per-batch seeded generator,
batch fields, the op).

Fairness: every variant gets the same float32 batch on the same device and thread count, and produces soft
targets ``(N, C)``. Where a peer returns hard targets (Composer's ``mixup_batch``/``cutmix_batch`` return the
partners' labels and ``lam``; its MixUp/CutMix algorithms mix the losses instead), the timed call includes
building the soft targets from them, ``lerp(onehot(y_perm), onehot(y), lam)``; the op alone is shown too.
timm's ``Mixup`` mixes the batch **in place** (our contract forbids that: a batch may alias a dataset's
storage), so it gets its own copy of the batch, mixed again at every call. Composer's crop takes one window
for the whole batch (a view), ours a window per sample (a copy): shown, not compared.

Each figure is the median of interleaved samples (the variants of a group take turns in a shuffled order each
round), each sample the mean of several calls.

Usage::

    PYTHONPATH=. python benchmarks/peers.py [--quick] [--threads 1]
    COMPOSER_PYTHON=/path/to/venv/bin/python PYTHONPATH=. python benchmarks/peers.py   # Composer elsewhere

Composer (``mosaicml``) pins its own torch, so it may live in another virtual environment that sees this
one's packages; with ``COMPOSER_PYTHON`` set and Composer not importable here, the measurement runs in that
interpreter (``--json``) and this one formats it.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script: make `benchmarks` and `lightning_speedups` importable
    sys.path.insert(0, str(ROOT))

from benchmarks import common  # noqa: E402
from lightning_speedups import CutMix, MixUp  # noqa: E402
from lightning_speedups.functional import cutmix_batch, mixup_batch, resize_batch, smooth_labels  # noqa: E402

THREADS = 1
#: (name, N, C, H, W, classes)
BATCHES = [
    ("256 x 3 x 32 x 32, 10 classes", 256, 3, 32, 32, 10),
    ("64 x 3 x 224 x 224, 1000 classes", 64, 3, 224, 224, 1000),
]
#: CutMix's work grows with its random box. alpha = 1000 makes lam ~ Beta(alpha, alpha) about 0.5 for every
#: implementation (the box about half the image before clipping at the borders), so that the variants do the
#: same work; the box position stays random, as in training.
MIX_ALPHA, CUT_ALPHA, SMOOTHING = 0.2, 1000.0, 0.1


def _optional(name: str) -> Any:
    try:
        if name == "timm":
            from timm.data import Mixup

            return Mixup
        if name == "torchvision":
            from torchvision.transforms import v2

            return v2
        if name == "composer":
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                import composer.functional as cf

            return cf
    except Exception:  # an optional peer: any failure to import means "not here"
        return None
    return None


def _versions() -> dict[str, str | None]:
    out = {}
    for mod in ("torchvision", "timm", "composer"):
        try:
            out[mod] = __import__(mod).__version__
        except Exception:
            out[mod] = None
    return out


def _soft(y: torch.Tensor, y_perm: torch.Tensor, lam: float, classes: int) -> torch.Tensor:
    """Soft targets from a peer's hard ones: ``lam * onehot(y) + (1 - lam) * onehot(y_perm)``."""
    return torch.lerp(F.one_hot(y_perm, classes).float(), F.one_hot(y, classes).float(), float(lam))


def groups(n: int, c: int, h: int, w: int, classes: int) -> dict[str, dict[str, Callable[[], Any]]]:
    """The timed calls, by group (mixup, cutmix, smoothing, resize), on one batch."""
    import lightning.pytorch as pl

    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, c, h, w, generator=g)
    y = torch.randint(0, classes, (n,), generator=g)
    rng = np.random.default_rng(0)
    trainer = pl.Trainer(accelerator="cpu", logger=False, enable_progress_bar=False, enable_model_summary=False)
    mix_cb, cut_cb = MixUp(MIX_ALPHA, num_classes=classes), CutMix(CUT_ALPHA, num_classes=classes)
    mix_cb.transform_batch(trainer, None, [x, y])  # first-batch checks, outside the timing
    cut_cb.transform_batch(trainer, None, [x, y])
    progress = trainer.fit_loop.epoch_loop.batch_progress.total

    def callback_call(cb: Any) -> Callable[[], Any]:
        def call() -> Any:
            # the next batch: fresh draws (a CutMix box of another size), as in a fit, where the draws are keyed
            # by the count of completed batches
            progress.started += 1
            progress.completed += 1
            return cb.transform_batch(trainer, None, [x, y])

        return call

    out: dict[str, dict[str, Callable[[], Any]]] = {
        "mixup": {
            "ours: functional mixup_batch": lambda: mixup_batch(x, y, MIX_ALPHA, classes, rng),
            "ours: MixUp callback (transform_batch)": callback_call(mix_cb),
        },
        "cutmix": {
            "ours: functional cutmix_batch": lambda: cutmix_batch(x, y, CUT_ALPHA, classes, rng),
            "ours: CutMix callback (transform_batch)": callback_call(cut_cb),
        },
        "smoothing": {"ours: smooth_labels": lambda: smooth_labels(y, SMOOTHING, classes)},
        "resize": {
            "ours: resize_batch, nearest, scale 0.5": lambda: resize_batch(x, (h // 2, w // 2), "resize", "nearest"),
            "ours: resize_batch, bilinear antialiased (our default)": lambda: resize_batch(x, (h // 2, w // 2)),
            "ours: resize_batch, crop per sample": lambda: resize_batch(
                x, (h // 2, w // 2), "crop", generator=torch.Generator().manual_seed(0)
            ),
        },
    }
    v2 = _optional("torchvision")
    if v2 is not None:
        tv_mix, tv_cut = v2.MixUp(alpha=MIX_ALPHA, num_classes=classes), v2.CutMix(alpha=CUT_ALPHA, num_classes=classes)
        out["mixup"]["torchvision v2.MixUp"] = lambda: tv_mix(x, y)
        out["cutmix"]["torchvision v2.CutMix"] = lambda: tv_cut(x, y)
    Mixup = _optional("timm")
    if Mixup is not None and n % 2 == 0:
        kw = {"prob": 1.0, "label_smoothing": 0.0, "num_classes": classes}
        timm_mix = Mixup(mixup_alpha=MIX_ALPHA, cutmix_alpha=0.0, **kw)
        timm_cut = Mixup(mixup_alpha=0.0, cutmix_alpha=CUT_ALPHA, **kw)
        x_mix, x_cut = x.clone(), x.clone()  # timm mixes in place: its own copies
        out["mixup"]["timm Mixup (mixup only, in place)"] = lambda: timm_mix(x_mix, y)
        out["cutmix"]["timm Mixup (cutmix only, in place)"] = lambda: timm_cut(x_cut, y)
        from timm.data.mixup import mixup_target

        out["smoothing"]["timm mixup_target(lam=1, smoothing)"] = lambda: mixup_target(y, classes, 1.0, SMOOTHING)
    cf = _optional("composer")
    if cf is not None:
        logits = torch.zeros(n, classes)

        def composer_mix() -> Any:
            mixed, y_perm, lam = cf.mixup_batch(x, y, alpha=MIX_ALPHA)
            return mixed, _soft(y, y_perm, 1.0 - lam, classes)  # Composer: (1 - lam) * x + lam * x_perm

        def composer_cut() -> Any:
            cut, y_perm, lam, _ = cf.cutmix_batch(x, y, alpha=CUT_ALPHA)
            return cut, _soft(y, y_perm, lam, classes)

        out["mixup"]["Composer mixup_batch + soft targets"] = composer_mix
        out["mixup"]["Composer mixup_batch alone (hard targets)"] = lambda: cf.mixup_batch(x, y, alpha=MIX_ALPHA)
        out["cutmix"]["Composer cutmix_batch + soft targets"] = composer_cut
        out["cutmix"]["Composer cutmix_batch alone (hard targets)"] = lambda: cf.cutmix_batch(x, y, alpha=CUT_ALPHA)
        out["smoothing"]["Composer smooth_labels"] = lambda: cf.smooth_labels(logits, y, SMOOTHING)
        out["resize"]["Composer resize_batch, nearest, scale 0.5"] = lambda: cf.resize_batch(x, y, 0.5, "resize")
        out["resize"]["Composer resize_batch, one crop for the batch (a view)"] = lambda: cf.resize_batch(
            x, y, 0.5, "crop"
        )
    return out


def measure(quick: bool, threads: int | None = None) -> dict[str, Any]:
    """Median seconds per call of every variant, per batch and group; JSON-friendly."""
    threads = THREADS if threads is None else threads
    warnings.filterwarnings("ignore")
    import logging

    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    results: dict[str, Any] = {"batches": {}, "versions": _versions()}
    start = time.perf_counter()
    with common.torch_threads(threads):
        results["machine"] = common.machine()
        for label, n, c, h, w, classes in BATCHES:
            big = h * w > 100 * 100
            rounds = (7 if quick else 25) if big else (10 if quick else 40)
            number = 2 if big else 10
            per_group = {}
            for group, fns in groups(n, c, h, w, classes).items():
                calls = 50 * number if group == "smoothing" else number
                per_group[group] = common.interleaved(fns, rounds, warmup=1, number=calls, seed=3)
            results["batches"][label] = {"rounds": rounds, "number": number, "groups": per_group}
    results["elapsed"] = time.perf_counter() - start
    return results


#: groups whose goal is "ours at least as fast as the fastest peer"
GOAL_GROUPS = {"mixup": "MixUp", "cutmix": "CutMix"}


def _is_ours(name: str) -> bool:
    return name.startswith("ours")


def _comparable_peer(name: str) -> bool:
    """Peers that give the same output as ours (soft targets); Composer's op alone does not."""
    return not _is_ours(name) and "alone (hard targets)" not in name and "(a view)" not in name


def render(results: dict[str, Any], quick: bool, command: str) -> str:
    machine = results["machine"]
    versions = results["versions"]
    installed = ", ".join(f"{k} {v}" for k, v in versions.items() if v) or "none"
    missing = [k for k, v in versions.items() if not v]
    md = [
        "## Peers: MixUp, CutMix, label smoothing and resizing on the same batch",
        "",
        common.command_block(command),
        "",
        common.machine_line(machine),
        f"- Peers installed: {installed}."
        + (f" Not installed, not run: {', '.join(missing)}." if missing else "")
        + f" {machine['torch_threads']} torch thread, float32, CPU. Ran in {results['elapsed']:.0f} s.",
        "- Same batch, same dtype, same output kind (soft targets `(N, C)`) for every variant of a group. timm "
        "mixes in place (on its own copy of the batch); Composer's `mixup_batch`/`cutmix_batch` return the "
        "partners' hard labels, so the compared call adds the soft targets (the op alone is listed too); "
        f"Composer's crop is one window for the batch (a view), ours one per sample (a copy). MixUp alpha "
        f"{MIX_ALPHA:g}; CutMix alpha {CUT_ALPHA:g}, so that lam is about 0.5 for every implementation and each "
        "call's box is about half the image before clipping at the borders (the same clipping for every "
        "implementation; the work grows with the box, and its position stays random).",
        "",
    ]
    goals = []
    for label, data in results["batches"].items():
        md.append(f"**{label}** (median µs per call; {data['rounds']} interleaved rounds)")
        md.append("")
        rows = []
        for group, times in data["groups"].items():
            peers = {k: v for k, v in times.items() if _comparable_peer(k)}
            fastest = min(peers.values()) if peers else None
            for name, t in sorted(times.items(), key=lambda kv: kv[1]):
                ratio = f"{t / fastest:.2f}" if fastest else "-"
                rows.append([group, name, f"{t * 1e6:,.1f}", ratio])
            if group in GOAL_GROUPS and peers:
                best_peer = min(peers, key=peers.get)
                for ours in ("functional", "callback"):
                    name = next(k for k in times if _is_ours(k) and ours in k)
                    ok = times[name] <= peers[best_peer]
                    goals.append(
                        common.goal_marker(
                            f"{GOAL_GROUPS[group]} ({ours}) at least as fast as the fastest peer, {label}",
                            f"{times[name] * 1e6:,.0f} µs vs {best_peer} {peers[best_peer] * 1e6:,.0f} µs "
                            f"({times[name] / peers[best_peer]:.2f}x)",
                            ok,
                            "peers",
                        )
                    )
        md.append(common.markdown_table(["group", "variant", "µs per call", "x fastest comparable peer"], rows, "llrr"))
        md.append("")
    md += goals
    md += ["", *unmet_notes(results), "", NOTES]
    return "\n".join(md)


def unmet_notes(results: dict[str, Any]) -> list[str]:
    """Why each unmet goal is unmet, from the measured figures."""
    lines = []
    for label, data in results["batches"].items():
        for group, what in GOAL_GROUPS.items():
            times = data["groups"][group]
            peers = {k: v for k, v in times.items() if _comparable_peer(k)}
            if not peers:
                continue
            best = min(peers, key=peers.get)
            functional = next(v for k, v in times.items() if _is_ours(k) and "functional" in k)
            callback = next(v for k, v in times.items() if _is_ours(k) and "callback" in k)
            if callback > peers[best] and functional <= peers[best] and callback / peers[best] < 1.02:
                lines.append(
                    f"- {what} (callback), {label}: {callback * 1e6:,.0f} µs against {best}'s "
                    f"{peers[best] * 1e6:,.0f} µs ({callback / peers[best] - 1:+.1%}), within the spread of this "
                    f"measurement; the op itself (functional, {functional * 1e6:,.0f} µs) is faster than every peer."
                )
            elif callback > peers[best] and functional <= peers[best]:
                lines.append(
                    f"- {what} (callback), {label}: {callback * 1e6:,.0f} µs against {best}'s "
                    f"{peers[best] * 1e6:,.0f} µs ({callback / peers[best] - 1:+.1%}). The op itself (functional, "
                    f"{functional * 1e6:,.0f} µs) is faster than every peer; the callback adds "
                    f"{(callback - functional) * 1e6:,.0f} µs per batch: re-seeding the batch's draws from (seed, "
                    "rank, batch index), which makes them reproducible and resumable, reading and rebuilding the "
                    "batch, "
                    "and the probability and window checks. A fixed cost per batch: it shows on small batches."
                )
            elif functional > peers[best]:
                lines.append(
                    f"- {what} (functional), {label}: {functional * 1e6:,.0f} µs against {best}'s "
                    f"{peers[best] * 1e6:,.0f} µs ({functional / peers[best] - 1:+.1%})."
                    + (" Within the spread of this measurement." if functional / peers[best] < 1.02 else "")
                    + (
                        f" The callback: {callback * 1e6:,.0f} µs ({callback / peers[best] - 1:+.1%})."
                        if callback > peers[best]
                        else ""
                    )
                )
    return ["**Not met, and why.**", "", *lines] if lines else ["Our MixUp and CutMix met the goal on both batches."]


#: Findings from reading and profiling the ops (kept beside the code that measured them).
NOTES = (
    "**Where the differences come from.** On a CPU every new batch-sized buffer costs page faults on first touch "
    "as well as memory traffic, so the fastest implementations allocate the fewest. Our MixUp computes the mix "
    "in place in its one new buffer, the partner copy (`x.index_select(0, perm).lerp_(x, lam)`), where it "
    "used to write `torch.lerp` into a second new buffer (changed with this benchmark). timm "
    "mixes the caller's batch in place but makes a flipped copy first; torchvision rolls the batch and allocates "
    "`lam * x` besides; Composer's `(1 - lam) * x + lam * x[perm]` allocates four batch-sized tensors. For CutMix "
    "every implementation copies the batch once (timm: the flipped copy; ours, Composer's and torchvision's: the "
    "output, torchvision a rolled copy too) and pastes the box; ours gathers the partners' box straight into its "
    "copy (`torch.index_select(..., out=)`, also since this benchmark) instead of through a box-sized temporary. "
    "Label smoothing: ours gathers the smoothed one-hot rows of class indices from a small cached (C, C) table "
    "(one kernel, no fill and scatter). Resizing: ours and "
    "Composer's nearest resize are the same `F.interpolate` call; our default (antialiased bilinear) does more "
    "work per pixel, and our crop mode cuts a window per sample (Composer's crop is one window for the batch, a "
    "view, hence its near-zero time). In the resize group the ratio is to Composer's nearest resize."
)


def run_elsewhere(python: str, quick: bool) -> dict[str, Any]:
    """Measure in another interpreter (one that has Composer) and return its JSON."""
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    cmd = [python, str(ROOT / "benchmarks" / "peers.py"), "--json", "--threads", str(THREADS)]
    cmd += ["--quick"] if quick else []
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True, cwd=ROOT)
    return json.loads(done.stdout.strip().splitlines()[-1])


def plot(results: dict[str, Any], path: Path) -> None:
    """MixUp and CutMix: µs per call of each variant, one panel per batch and group."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    batches = list(results["batches"].items())
    fig, axes = plt.subplots(len(batches), 2, figsize=(11, 2.6 * len(batches)), squeeze=False)
    for i, (label, data) in enumerate(batches):
        for j, group in enumerate(GOAL_GROUPS):
            times = sorted(data["groups"][group].items(), key=lambda kv: -kv[1])
            ax = axes[i][j]
            ax.barh(
                [k for k, _ in times],
                [v * 1e3 for _, v in times],
                color=["tab:blue" if _is_ours(k) else "tab:grey" for k, _ in times],
            )
            ax.set_title(f"{GOAL_GROUPS[group]}, {label}", fontsize=9)
            ax.set_xlabel("ms per call (median)", fontsize=8)
            ax.tick_params(labelsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def section(quick: bool, out_dir: Path) -> str:
    other = os.environ.get("COMPOSER_PYTHON")
    command = f"PYTHONPATH=. python benchmarks/peers.py{' --quick' if quick else ''}"
    if _optional("composer") is None and other:
        results = run_elsewhere(other, quick)
        command = f"COMPOSER_PYTHON={other} {command}"
    else:
        results = measure(quick)
    plot(results, out_dir / "peers.png")
    md = render(results, quick, command)
    picture = f"![MixUp and CutMix, ours (blue) and the peers (grey)]({out_dir.name}/peers.png)"
    return md.replace("\n\n**", f"\n\n{picture}\n\n**", 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer rounds")
    parser.add_argument("--json", action="store_true", help="print the raw results as one JSON line")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    args = parser.parse_args()
    global THREADS
    THREADS = args.threads
    if args.json:
        print(json.dumps(measure(args.quick, args.threads)))
    else:
        print(section(args.quick, Path("docs/benchmarks")))


if __name__ == "__main__":
    main()
