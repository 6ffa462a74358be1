"""Benchmarks for progressive resizing and dropout removal (CPU; not a test).

Three measurements, each as the median of interleaved repeats (the variants take turns, so a slow spell of a
shared machine hits all of them alike):

1. ``step``: one training step (forward, backward, SGD) of a small ResNet at scale 0.5, 0.75 and 1.0 of a
   64 x 64 input, beside the FLOPs ratio counted by ``torch.utils.flop_counter.FlopCounterMode``;
2. ``pipeline``: data loading of one batch through ``ProgressiveResizing(mode="pipeline")``'s wrappers, JPEG
   decoding plus ``ScheduledResize(224, factory=RandomResizedCrop)``, flip, to-tensor and normalise, at scale
   0.5 and 1.0 (decoding stays at full size; everything after the crop runs on fewer pixels);
3. ``dropout``: one training step of a 2-layer transformer encoder with dropout 0.1 and with it removed.

Usage::

    PYTHONPATH=. python benchmarks/resizing_and_dropout.py            # all three
    PYTHONPATH=. python benchmarks/resizing_and_dropout.py step --repeats 30
"""

from __future__ import annotations

import argparse
import io
import platform
import statistics
import time
from collections.abc import Callable

import numpy as np
import torch
import torch.nn.functional as F
import torchvision.transforms.v2 as T
from PIL import Image
from torch import nn
from torch.utils.data import Dataset
from torch.utils.data._utils.collate import default_collate
from torch.utils.flop_counter import FlopCounterMode

from lightning_speedups import ScheduledResize
from lightning_speedups.demo import SmallResNet
from lightning_speedups.functional import ResizePlan, disable_dropout, scaled_size
from lightning_speedups.pipeline import PlannedIndex, ResolutionDataset


def interleaved(variants: dict[str, Callable[[], None]], repeats: int, warmup: int = 2) -> dict[str, float]:
    """Median seconds per call of each variant, the variants taking turns (order shuffled each round)."""
    for fn in variants.values():
        for _ in range(warmup):
            fn()
    times: dict[str, list[float]] = {name: [] for name in variants}
    rng = np.random.default_rng(0)
    names = list(variants)
    for _ in range(repeats):
        for i in rng.permutation(len(names)):
            start = time.perf_counter()
            variants[names[i]]()
            times[names[i]].append(time.perf_counter() - start)
    return {name: statistics.median(t) for name, t in times.items()}


def train_step(model: nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor) -> None:
    opt.zero_grad(set_to_none=True)
    F.cross_entropy(model(x), y).backward()
    opt.step()


# ---------------------------------------------------------------------------------------------- 1. step time
def bench_step(repeats: int, batch: int = 32, full: int = 64) -> None:
    torch.manual_seed(0)
    model = SmallResNet(num_classes=10, in_channels=3, widths=(32, 64, 128))
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    y = torch.randint(0, 10, (batch,))
    scales = (0.5, 0.75, 1.0)
    inputs = {s: torch.randn(batch, 3, *scaled_size((full, full), s, 4)) for s in scales}
    flops = {}
    for s, x in inputs.items():
        with FlopCounterMode(display=False) as counter:
            train_step(model, opt, x, y)
        flops[s] = counter.get_total_flops()
    medians = interleaved({f"{s}": (lambda x=x: train_step(model, opt, x, y)) for s, x in inputs.items()}, repeats)
    print(f"\n### Step time, SmallResNet(widths=(32, 64, 128)), batch {batch}, input 3 x {full} x {full}\n")
    print("| scale | input | step time (median) | time ratio | FLOPs (fwd+bwd) | FLOPs ratio |")
    print("|---|---|---|---|---|---|")
    for s in scales:
        h, w = inputs[s].shape[-2:]
        print(
            f"| {s} | {h} x {w} | {medians[str(s)] * 1e3:.1f} ms | {medians[str(s)] / medians['1.0']:.2f} | "
            f"{flops[s] / 1e9:.2f} GFLOP | {flops[s] / flops[1.0]:.2f} |"
        )


# ---------------------------------------------------------------------------------------------- 2. pipeline
class JpegImages(Dataset):
    """In-memory JPEGs (random noise, made here: nothing is downloaded), decoded per sample like ImageFolder."""

    def __init__(self, n: int, side: int, transform: Callable) -> None:
        rng = np.random.default_rng(0)
        self.blobs = []
        for _ in range(n):
            img = Image.fromarray(rng.integers(0, 256, (side, side, 3), dtype=np.uint8))
            buf = io.BytesIO()
            img.save(buf, format="JPEG", quality=90)
            self.blobs.append(buf.getvalue())
        self.transform = transform

    def __len__(self) -> int:
        return len(self.blobs)

    def __getitem__(self, i: int):
        image = Image.open(io.BytesIO(self.blobs[i])).convert("RGB")
        return self.transform(image), 0


def bench_pipeline(repeats: int, batch: int = 32) -> None:
    transform = T.Compose(
        [
            ScheduledResize(224, factory=T.RandomResizedCrop),
            T.RandomHorizontalFlip(),
            T.ToImage(),
            T.ToDtype(torch.float32, scale=True),
            T.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225]),
        ]
    )
    dataset = ResolutionDataset(JpegImages(batch, 256, transform))
    plans = {"0.5": ResizePlan(scale=0.5), "1.0": ResizePlan(scale=1.0)}

    def load(plan: ResizePlan) -> None:
        default_collate([dataset[PlannedIndex(i, plan)] for i in range(batch)])

    decode_only = {"decode": lambda: [Image.open(io.BytesIO(b)).convert("RGB") for b in dataset.dataset.blobs]}
    medians = interleaved({**{k: (lambda p=p: load(p)) for k, p in plans.items()}, **decode_only}, repeats)
    print(f"\n### Data loading, one batch of {batch} JPEGs (256 x 256) in one process\n")
    print("| scale | output | load time (median) | ratio | of which JPEG decoding |")
    print("|---|---|---|---|---|")
    for k in plans:
        side = scaled_size((224, 224), float(k), 4)[0]
        print(
            f"| {k} | {side} x {side} | {medians[k] * 1e3:.1f} ms | {medians[k] / medians['1.0']:.2f} | "
            f"{medians['decode'] * 1e3:.1f} ms |"
        )


# ---------------------------------------------------------------------------------------------- 3. dropout
def bench_dropout(repeats: int, batch: int = 32, tokens: int = 128) -> None:
    def encoder() -> nn.Module:
        torch.manual_seed(0)
        layer = nn.TransformerEncoderLayer(256, 4, 1024, dropout=0.1, batch_first=True)
        return nn.Sequential(
            nn.TransformerEncoder(layer, 2, enable_nested_tensor=False), nn.Flatten(), nn.LazyLinear(8)
        )

    with_dropout, without = encoder(), encoder()
    x = torch.randn(batch, tokens, 256)
    y = torch.randint(0, 8, (batch,))
    for m in (with_dropout, without):
        m(x)  # materialise the lazy layer
    removed = len(disable_dropout(without))
    opts = {m: torch.optim.SGD(m.parameters(), lr=0.01) for m in (with_dropout, without)}
    medians = interleaved(
        {
            "dropout 0.1": lambda: train_step(with_dropout, opts[with_dropout], x, y),
            "removed": lambda: train_step(without, opts[without], x, y),
        },
        repeats,
    )
    base = medians["removed"]
    print(f"\n### Step time, 2-layer TransformerEncoder (d=256, 4 heads, ff 1024), batch {batch} x {tokens} tokens\n")
    print(f"disable_dropout (what DropoutRemoval calls) switched off {removed} dropouts.\n")
    print("| variant | step time (median) | ratio to removed |")
    print("|---|---|---|")
    for name, t in medians.items():
        print(f"| {name} | {t * 1e3:.1f} ms | {t / base:.2f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("which", nargs="*", help="any of: step, pipeline, dropout (default: all)")
    parser.add_argument("--repeats", type=int, default=20, help="interleaved rounds per measurement")
    args = parser.parse_args()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {platform.processor() or platform.machine()}")
    benches = {"step": bench_step, "pipeline": bench_pipeline, "dropout": bench_dropout}
    unknown = set(args.which) - set(benches)
    if unknown:
        parser.error(f"unknown benchmark(s) {sorted(unknown)}; choose from {list(benches)}")
    for which in args.which or list(benches):
        benches[which](args.repeats)


if __name__ == "__main__":
    main()
