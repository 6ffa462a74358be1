"""How long one epoch's index list takes to build for 10 million samples.

Times the vectorised epoch lists of :mod:`lightning_speedups.functional.sampling` (repeat-factor sampling, a
paced curriculum, both composed), each as the whole epoch list plus one rank's shard of 8, and a per-sample
Python loop of the kind detectron2's ``RepeatFactorTrainingSampler`` uses (stochastic rounding vectorised,
then ``indices.extend([i] * reps[i])`` for each sample, then a permutation).

    PYTHONPATH=. python benchmarks/sampling.py                # 10M samples, 5 epochs each
    PYTHONPATH=. python benchmarks/sampling.py --num-samples 1000000 --epochs 3

Prints a Markdown table of the median seconds per epoch (and the one-off set-up: repeat factors from labels,
the difficulty order). Nothing is downloaded; labels are a synthetic long tail (Zipf over 1,000 classes).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import numpy as np
import torch

from lightning_speedups.functional import sampling as fs
from lightning_speedups.samplers import SamplingPlan


def timed(fn: Callable[[], object], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def python_loop_epoch(factors: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """The per-sample loop: round stochastically, list each index ``reps`` times in Python, permute."""
    whole = torch.trunc(factors)
    reps = whole + (torch.rand(len(factors), generator=generator) < factors - whole).float()
    indices: list[int] = []
    for i, r in enumerate(reps.tolist()):
        indices.extend([i] * int(r))
    out = torch.tensor(indices, dtype=torch.int64)
    return out[torch.randperm(len(out), generator=generator)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--num-samples", type=int, default=10_000_000)
    parser.add_argument("--epochs", type=int, default=5, help="epochs timed per variant (median reported)")
    parser.add_argument("--loop-epochs", type=int, default=1, help="epochs timed for the per-sample Python loop")
    parser.add_argument("--world", type=int, default=8, help="ranks for the shard timing")
    args = parser.parse_args()
    n = args.num_samples
    rng = np.random.default_rng(0)
    labels = np.minimum(rng.zipf(1.3, n) - 1, 999)  # a long tail over 1,000 classes

    start = time.perf_counter()
    factors = fs.repeat_factors(labels, threshold=0.001)
    t_factors = time.perf_counter() - start
    difficulty = rng.random(n)
    start = time.perf_counter()
    order = fs.difficulty_order(difficulty, seed=0)
    t_order = time.perf_counter() - start
    length = fs.epoch_length(factors)
    batch = 256
    per_rank = fs.shard_size(length, args.world)
    clock = fs.StepClock(global_batch_size=batch * args.world, batches_per_epoch=-(-per_rank // batch), total_steps=1e9)

    def plan(repeat: bool, curriculum: bool, num_samples: int = n) -> SamplingPlan:
        p = SamplingPlan(num_samples=num_samples, seed=0)
        if repeat:
            p.add_repeat_factors(factors, seed=0)
        if curriculum:
            # Never reaches all the data in the timed epochs: every position draws from a pool (10% to 55%).
            steps = clock.steps_per_epoch
            p.add_curriculum(order, fs.Pacing("linear", start=0.1, full_at=10.0), seed=0)
            p.clock = fs.StepClock(clock.global_batch_size, clock.batches_per_epoch, total_steps=steps)
        return p

    total = per_rank * args.world
    rows = []
    for name, p in [
        ("repeat-factor sampling", plan(True, False)),
        ("curriculum, paced epoch", plan(False, True)),
        ("repeat factors + curriculum, paced epoch", plan(True, True)),
        ("plain shuffle (no factors, no curriculum)", plan(False, False)),
    ]:
        epochs = iter(range(10**6))
        t_epoch = timed(lambda p=p, e=epochs: p.epoch_indices(next(e), total), args.epochs)
        t_shard = timed(
            lambda p=p, e=epochs: p.epoch_indices(next(e), total, rank=1, num_replicas=args.world), args.epochs
        )
        rows.append((name, len(p.epoch_indices(0, total)), t_epoch, t_shard))

    generator = torch.Generator().manual_seed(0)
    factors_t = torch.from_numpy(factors)
    t_loop = timed(lambda: python_loop_epoch(factors_t, generator), args.loop_epochs)

    print(f"N = {n:,} samples, {len(np.unique(labels))} classes, epoch length round(sum r) = {length:,}")
    print(f"one-off: repeat factors from labels {t_factors:.2f} s, difficulty order {t_order:.2f} s\n")
    print(f"| epoch list | entries | s / epoch, whole list | s / epoch, one rank of {args.world} |")
    print("|---|---|---|---|")
    for name, entries, t_epoch, t_shard in rows:
        print(f"| {name} | {entries:,} | {t_epoch:.2f} | {t_shard:.2f} |")
    print(f"| per-sample Python loop (detectron2-style) | {length:,} (about) | {t_loop:.2f} | - |")


if __name__ == "__main__":
    main()
