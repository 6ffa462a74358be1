"""GPU figures: ResNet-18 at 224 px over ``FakeData``, ``bf16-mixed``, ``channels_last`` (needs CUDA; not a test).

Three measurements, each over real ``Trainer.fit`` runs, the variants taking turns in a shuffled order:

1. **Progressive-resizing throughput**: images per second of training steps at scale 0.5, 0.75 and 1.0
   (``ProgressiveResizing`` holding the scale, ``mode="resize"``), against the FLOPs ratio of the forward and
   backward pass (``torch.utils.flop_counter``). Goal (issue 7): at scale 0.5, at least 80% of the FLOPs ideal,
   i.e. ``throughput(0.5) / throughput(1.0) >= 0.8 * FLOPs(1.0) / FLOPs(0.5)``.
2. **Callback overhead**: the median step time with each callback against a plain Trainer: MixUp, CutMix,
   LabelSmoothing and LinearScalingWarmup active; ``DropoutRemoval(1.0)`` inactive (``start=1.0``, and ResNet-18
   has no dropout), so its row is the cost of carrying the callback (the samplers' cost is on the CPU, building
   index lists, and is measured in the CPU sections).
3. **Digits time to accuracy** on the GPU: ``benchmarks/time_to_accuracy.py``'s digits task and protocol with
   ``accelerator="gpu"`` (vision-mild only in quick mode), the device and the precision used recorded.

The data is ``torchvision.datasets.FakeData`` (random images made in memory; nothing is downloaded), decoded
once to ``uint8`` batches that stay on the GPU (each step takes one of them: no collation, no host-to-device
copy) and turned into floats in ``on_after_batch_transfer``, before the callbacks see the batch. So neither the
loader nor a transfer sits in the step: at scale 0.5 a ResNet-18 step is a few milliseconds, and a fixed
per-step cost of loading would hide what resizing saves. Times are taken over a window of steps, synchronised
only at its two ends, so the CPU queues work ahead as in a real run (a synchronisation at every step would add
Lightning's own Python time to each step's GPU time). Without CUDA the script says so and exits 0.

Usage::

    PYTHONPATH=. python benchmarks/gpu.py [--quick] [--batch-size 128] [--steps 80] [--no-digits]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks import common  # noqa: E402

COMMAND = "PYTHONPATH=. python benchmarks/gpu.py"
#: the overhead table's row for DropoutRemoval, which never acts here (``start=1.0``; ResNet-18 has no dropout)
DROPOUT_ROW = "DropoutRemoval(1.0) (inactive: start 1.0, and ResNet-18 has no dropout)"
SCALES = (0.5, 0.75, 1.0)
#: where the fits run; the smoke test sets "cpu" (with ``.cuda()`` and synchronisation patched out)
ACCELERATOR = "gpu"
_clock = time.perf_counter  # the window's clock (a name of its own, so a test can replace it alone)
GOAL_EFFICIENCY = 0.8


def _imports() -> dict[str, Any]:
    import lightning.pytorch as pl
    import torch.nn.functional as F
    import torchvision
    from lightning.pytorch.callbacks import Callback
    from torch.utils.data import DataLoader, TensorDataset

    return {
        "pl": pl,
        "F": F,
        "torchvision": torchvision,
        "Callback": Callback,
        "DataLoader": DataLoader,
        "TensorDataset": TensorDataset,
    }


def make_module(num_classes: int = 1000) -> Any:
    m = _imports()
    pl, F, torchvision = m["pl"], m["F"], m["torchvision"]

    class ResNet18(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.num_classes = num_classes
            self.model = torchvision.models.resnet18(num_classes=num_classes).to(memory_format=torch.channels_last)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.model(x.contiguous(memory_format=torch.channels_last))

        def on_after_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
            x, y = batch
            return x.float().div_(255.0), y

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            x, y = batch
            loss = F.cross_entropy(self(x), y)
            self.log("train_loss", loss)
            return loss

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.9, nesterov=True, weight_decay=5e-5)

    return ResNet18()


class _DeviceBatches(torch.utils.data.Dataset):
    """Whole batches already on the GPU: item ``i`` is batch ``i`` (a slice, no copy)."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor, batch_size: int) -> None:
        self.x, self.y, self.batch_size = x, y, batch_size

    def __len__(self) -> int:
        return len(self.y) // self.batch_size

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        window = slice(i * self.batch_size, (i + 1) * self.batch_size)
        return self.x[window], self.y[window]


def fake_loader(batch_size: int, batches: int, num_classes: int = 1000) -> Any:
    """``FakeData`` images (224 x 224, made in memory), as ``uint8`` batches on the GPU (``batch_size=None``)."""
    m = _imports()
    torchvision = m["torchvision"]
    from torchvision.transforms import v2

    n = batch_size * batches
    data = torchvision.datasets.FakeData(
        size=n, image_size=(3, 224, 224), num_classes=num_classes, transform=v2.PILToTensor(), random_offset=0
    )
    xs, ys = zip(*(data[i] for i in range(n)), strict=True)
    labels = torch.stack([torch.as_tensor(t, dtype=torch.long) for t in ys])
    dataset = _DeviceBatches(torch.stack(xs).cuda(), labels.cuda(), batch_size)
    return m["DataLoader"](dataset, batch_size=None, shuffle=False)


def fit_steps(callbacks: list[Any], loader: Any, steps: int, warmup: int) -> float:
    """Seconds per step of one fit: the steps after ``warmup``, timed as one window synchronised at its ends."""
    m = _imports()
    pl = m["pl"]

    class Window(m["Callback"]):
        def __init__(self) -> None:
            self.start = self.end = 0.0

        def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
            done = trainer.global_step  # updates so far, this one included
            if done == warmup or done == warmup + steps:
                torch.cuda.synchronize()
                if done == warmup:
                    self.start = _clock()
                else:
                    self.end = _clock()

    window = Window()
    trainer = pl.Trainer(
        accelerator=ACCELERATOR,
        devices=1,
        precision="bf16-mixed",
        max_steps=warmup + steps,
        callbacks=[*callbacks, window],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=0,
        num_sanity_val_steps=0,
    )
    trainer.fit(make_module(), train_dataloaders=loader)
    if not window.end > window.start > 0:
        raise RuntimeError(f"the timed window of {steps} steps after {warmup} did not run (fit ended early?)")
    return (window.end - window.start) / steps


def flops(scale: float, batch_size: int) -> float:
    from torch.utils.flop_counter import FlopCounterMode

    from lightning_speedups.functional import scaled_size

    model = make_module().model.cuda()
    size = scaled_size((224, 224), scale, 4)
    x = torch.randn(batch_size, 3, *size, device="cuda").contiguous(memory_format=torch.channels_last)
    with FlopCounterMode(display=False) as counter, torch.autocast("cuda", dtype=torch.bfloat16):
        model(x).float().sum().backward()
    return float(counter.get_total_flops())


def make_variants(batch_size: int) -> dict[str, Any]:
    """Each timed variant: a function that makes its callbacks (fresh for every fit)."""
    from lightning_speedups import (
        CutMix,
        DropoutRemoval,
        LabelSmoothing,
        LinearScalingWarmup,
        MixUp,
        ProgressiveResizing,
    )

    variants: dict[str, Any] = {
        f"scale {s}": (lambda s=s: [ProgressiveResizing(s, 1.0, 0.0)] if s < 1 else []) for s in SCALES
    }
    variants.update(
        {
            "MixUp": lambda: [MixUp(0.2, num_classes=1000)],
            "CutMix": lambda: [CutMix(1.0, num_classes=1000)],
            "LabelSmoothing": lambda: [LabelSmoothing(0.1, num_classes=1000)],
            DROPOUT_ROW: lambda: [DropoutRemoval(1.0)],
            # the loader yields whole batches (`batch_size=None`): the warmup is told the batch size
            "LinearScalingWarmup (warming up)": lambda: [
                LinearScalingWarmup(batch_size // 2, 1.0, "fraction", batch_size=batch_size)
            ],
        }
    )
    return variants


def measure(quick: bool, batch_size: int = 128, steps: int | None = None) -> dict[str, Any]:

    info = common.machine()  # before the fits: its load average is the one at the start
    warnings.filterwarnings("ignore")
    # cuDNN picks its kernels per input size in the untimed warm-up steps of each fit; the setting is this
    # section's only: the digits runs after it meet new sizes inside their timed runs, where tuning would count
    tuned, torch.backends.cudnn.benchmark = torch.backends.cudnn.benchmark, True
    steps = steps or (30 if quick else 80)
    warmup, rounds = 10, (2 if quick else 5)
    loader = fake_loader(batch_size, max(4, (steps + warmup) // 8))
    variants = make_variants(batch_size)
    times: dict[str, list[float]] = {k: [] for k in variants}
    try:
        for order in common.shuffled_rounds(list(variants), rounds, seed=4):
            for name in order:
                times[name].append(fit_steps(variants[name](), loader, steps, warmup))
    finally:
        torch.backends.cudnn.benchmark = tuned
    step = {k: statistics.median(v) for k, v in times.items()}
    return {
        "machine": info,
        "batch_size": batch_size,
        "steps": steps,
        "rounds": rounds,
        "step": step,
        "flops": {s: flops(s, batch_size) for s in SCALES},
    }


def render(results: dict[str, Any], command: str) -> str:
    step, fl, bs = results["step"], results["flops"], results["batch_size"]
    full = step["scale 1.0"]
    rows = []
    for s in SCALES:
        t = step[f"scale {s}"]
        speedup, ideal = full / t, fl[1.0] / fl[s]
        rows.append(
            [s, f"{bs / t:,.0f}", f"{t * 1e3:.1f}", f"{speedup:.2f}x", f"{ideal:.2f}x", f"{speedup / ideal:.0%}"]
        )
    eff = (full / step["scale 0.5"]) / (fl[1.0] / fl[0.5])
    over = [
        [k, f"{v * 1e3:.2f}", common.fmt_pct(v / full - 1, 2, signed=True)] for k, v in step.items() if "scale" not in k
    ]
    return "\n".join(
        [
            "## On a GPU: ResNet-18, 224 px, FakeData, bf16-mixed, channels_last",
            "",
            common.command_block(command),
            "",
            common.machine_line(results["machine"]),
            f"- Batch {bs}; {results['rounds']} rounds of one fit per variant, interleaved; in each fit "
            f"{results['steps']} steps after a warm-up are timed as one window (synchronised at its ends only), on "
            "uint8 batches kept on the GPU; median over rounds of the time per step.",
            "",
            common.markdown_table(
                ["scale", "images/s", "step (ms)", "speed-up", "FLOPs ideal", "of the ideal"], rows, "rrrrrr"
            ),
            "",
            common.markdown_table(["callback (active unless marked)", "step (ms)", "vs plain"], over, "lrr"),
            "",
            common.goal_marker(
                "ProgressiveResizing throughput ≥ 80% of the FLOPs ideal at scale 0.5 on GPU",
                f"{eff:.0%} of the ideal",
                eff >= GOAL_EFFICIENCY,
                "gpu",
            ),
        ]
    )


def not_run(reason: str) -> str:
    return "\n".join(
        [
            "## On a GPU: ResNet-18, 224 px, FakeData, bf16-mixed, channels_last",
            "",
            f"**Not run**: {reason} Run it on a machine with one CUDA GPU:",
            "",
            common.command_block(COMMAND),
            "",
            "It measures progressive-resizing throughput at scales 0.5 / 0.75 / 1.0 against the FLOPs ideal, "
            "the step-time overhead of MixUp, CutMix, LabelSmoothing and LinearScalingWarmup (active) and of "
            "DropoutRemoval (inactive: ResNet-18 has no dropout) against a plain Trainer (ResNet-18, batch 128, "
            "`bf16-mixed`, `channels_last`, `torchvision.datasets.FakeData`), and the digits time to accuracy "
            "trained on the GPU.",
            "",
            common.goal_marker(
                "ProgressiveResizing throughput ≥ 80% of the FLOPs ideal at scale 0.5 on GPU",
                "not run (no GPU)",
                None,
                "gpu",
            ),
        ]
    )


def digits(quick: bool) -> str:
    """The digits time-to-accuracy table, trained on the GPU."""
    from benchmarks import time_to_accuracy as tta
    from lightning_speedups import presets

    only = ["vision-mild"] if quick else None
    info = common.machine()  # before the runs: its load average is the one at the start
    # the precision compare._run gives every arm (run_task passes no preset Trainer settings)
    precision = presets.recommended_precision("gpu")
    result = tta.run_task(tta.TASKS["digits"], seeds=tta.SEEDS, only=only, accelerator="gpu")
    table, _ = tta.task_table(result)
    return "\n".join(
        [
            "### Digits time to accuracy on the GPU",
            "",
            common.command_block(
                "PYTHONPATH=. python benchmarks/time_to_accuracy.py --tasks digits --accelerator gpu"
                + (" --only vision-mild" if quick else "")
            ),
            "",
            common.machine_line(info),
            f"- The CPU section's protocol and task ({tta.SEEDS} seeds, shuffled arms, equal-budget control), "
            f"trained on the GPU, precision `{precision}` for every arm. Target {result['target']:.4f}.",
            "",
            table,
        ]
    )


def section(quick: bool, out_dir: Path) -> str:
    if not torch.cuda.is_available():
        return not_run("no CUDA device on this machine (none was lent to this run).")
    return render(measure(quick), COMMAND + (" --quick" if quick else "")) + "\n\n" + digits(quick)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--steps", type=int, default=None)
    parser.add_argument("--no-digits", action="store_true", help="skip the digits time to accuracy")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("benchmarks/gpu.py: skipped, no CUDA device here (torch.cuda.is_available() is False).")
        return
    command = " ".join([COMMAND, *sys.argv[1:]])
    print(render(measure(args.quick, args.batch_size, args.steps), command))
    if not args.no_digits:
        print("\n" + digits(args.quick))


if __name__ == "__main__":
    main()
