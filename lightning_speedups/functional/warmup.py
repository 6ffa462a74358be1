"""Pure math of the linear scaling rule with gradual warmup (Goyal et al., 2017, arXiv:1706.02677).

The rule: when the global batch is ``k`` times the batch a learning rate was tuned for, multiply the learning
rate by ``k`` (ImageNet ResNet-50: ``lr = 0.1 * global_batch / 256``). Large ``k`` makes the first updates
unstable, so the factor is reached by a linear ramp over the first steps (5 epochs in the paper), starting
from the unscaled learning rate.

Conventions, shared by every function here:

* ``step`` is the 0-based index of an optimizer update; the warmup lasts ``warmup_steps`` updates: updates
  ``0 .. warmup_steps - 1`` ramp and every later one uses the full factor;
* a *factor* multiplies whatever learning rate the user's scheduler gives for that step, so the warmup
  composes with any schedule;
* nothing here knows about Lightning: the callback reads batch sizes and counters off the trainer and calls
  these functions.
"""

from __future__ import annotations

import math
from numbers import Real
from typing import Literal

from lightning_speedups._checks import is_integral

ScalingRule = Literal["linear", "sqrt"]
WarmupStart = Literal["unscaled", "zero"]
WarmupUnit = Literal["steps", "epochs", "fraction"]

SCALING_RULES: tuple[str, ...] = ("linear", "sqrt")
WARMUP_STARTS: tuple[str, ...] = ("unscaled", "zero")
WARMUP_UNITS: tuple[str, ...] = ("steps", "epochs", "fraction")


def _positive_int(name: str, value: int) -> int:
    if not is_integral(value) or value < 1:
        raise ValueError(f"`{name}` must be a positive int, got {value!r}.")
    return int(value)


def global_batch_size(batch_size: int, accumulate_grad_batches: int = 1, world_size: int = 1) -> int:
    """Samples behind one optimizer update: per-device batch x accumulated batches x devices.

    Example::

        >>> global_batch_size(64, accumulate_grad_batches=2, world_size=4)
        512
    """
    return (
        _positive_int("batch_size", batch_size)
        * _positive_int("accumulate_grad_batches", accumulate_grad_batches)
        * _positive_int("world_size", world_size)
    )


def batch_scale(global_batch: int, reference_batch_size: int, rule: ScalingRule = "linear") -> float:
    """The learning-rate multiplier for ``global_batch`` samples per update, relative to ``reference_batch_size``.

    ``rule="linear"`` gives ``k = global_batch / reference_batch_size`` (Goyal et al., for SGD);
    ``rule="sqrt"`` gives ``sqrt(k)``, the rule often preferred for Adam-family optimizers.

    Example::

        >>> batch_scale(1024, 256), batch_scale(1024, 256, rule="sqrt")
        (4.0, 2.0)
    """
    global_batch = _positive_int("global_batch", global_batch)
    reference_batch_size = _positive_int("reference_batch_size", reference_batch_size)
    if rule not in SCALING_RULES:
        raise ValueError(f"`rule` must be one of {SCALING_RULES}, got {rule!r}.")
    k = global_batch / reference_batch_size
    return k if rule == "linear" else math.sqrt(k)


def steps_per_epoch(num_batches: int, accumulate_grad_batches: int = 1) -> int:
    """Optimizer updates in an epoch of ``num_batches`` batches.

    Lightning also steps on the last, incomplete accumulation window of an epoch, hence the ceiling.

    Example::

        >>> steps_per_epoch(5, accumulate_grad_batches=2)
        3
    """
    accumulate = _positive_int("accumulate_grad_batches", accumulate_grad_batches)
    if not is_integral(num_batches) or num_batches < 0:
        raise ValueError(f"`num_batches` must be an int >= 0, got {num_batches!r}.")
    return math.ceil(int(num_batches) / accumulate)


def warmup_length(
    warmup: float,
    unit: WarmupUnit,
    *,
    steps_per_epoch: int | None = None,
    total_steps: float | None = None,
) -> int:
    """The warmup length in optimizer updates.

    Args:
        warmup: the length in ``unit``; 0 turns the warmup off.
        unit: ``"steps"`` (an integer number of updates), ``"epochs"`` (needs ``steps_per_epoch``) or
            ``"fraction"`` of the run (in [0, 1], needs ``total_steps``).
        steps_per_epoch: optimizer updates per epoch (see :func:`steps_per_epoch`).
        total_steps: optimizer updates in the whole run.

    Any positive warmup lasts at least one update.

    Example::

        >>> warmup_length(5, "epochs", steps_per_epoch=5005), warmup_length(0.1, "fraction", total_steps=50)
        (25025, 5)
    """
    if isinstance(warmup, bool) or not isinstance(warmup, Real) or not math.isfinite(warmup):
        raise TypeError(f"`warmup` must be a finite number, got {warmup!r}.")
    if warmup < 0:
        raise ValueError(f"`warmup` must be >= 0 (0 turns the warmup off), got {warmup!r}.")
    if unit == "steps":
        if warmup != int(warmup):
            raise ValueError(f"A warmup in steps must be a whole number of updates, got {warmup!r}.")
        return int(warmup)
    if unit == "epochs":
        if steps_per_epoch is None or steps_per_epoch < 1:
            raise ValueError(f"A warmup in epochs needs `steps_per_epoch` >= 1, got {steps_per_epoch!r}.")
        length = warmup * steps_per_epoch
    elif unit == "fraction":
        if warmup > 1:
            raise ValueError(f"A warmup given as a fraction of the run must be in [0, 1], got {warmup!r}.")
        if total_steps is None or not math.isfinite(total_steps) or total_steps < 0:
            raise ValueError(
                f"A warmup given as a fraction of the run needs a finite `total_steps` >= 0, got {total_steps!r}."
            )
        length = warmup * total_steps
    else:
        raise ValueError(f"`unit` must be one of {WARMUP_UNITS}, got {unit!r}.")
    # to the nearest update, halves up (Python's `round` sends 2.5 to 2 and 3.5 to 4)
    return max(1, math.floor(length + 0.5)) if warmup > 0 else 0


def warmup_factor(step: float, warmup_steps: int, scale: float, start: WarmupStart = "unscaled") -> float:
    """The multiplier of the scheduled learning rate at update ``step`` (0-based).

    It ramps linearly and reaches ``scale`` at update ``warmup_steps``, then stays there. ``step`` may be
    fractional: a warmup in epochs whose updates per epoch changed midway is at ``share done x warmup_steps``.

    * ``start="unscaled"`` (the paper's gradual warmup): ``1 + (scale - 1) * step / warmup_steps``, so update 0
      uses the unscaled learning rate. When ``scale <= 1`` there is nothing to warm up to and the factor is
      ``scale`` from the first update.
    * ``start="zero"``: ``scale * (step + 1) / (warmup_steps + 1)``, a ramp from zero that spends no update at a
      learning rate of zero.

    Example::

        >>> [warmup_factor(t, 4, scale=3.0) for t in range(6)]
        [1.0, 1.5, 2.0, 2.5, 3.0, 3.0]
        >>> [round(warmup_factor(t, 4, scale=3.0, start="zero"), 2) for t in range(6)]
        [0.6, 1.2, 1.8, 2.4, 3.0, 3.0]
    """
    if not step >= 0:  # NaN fails this too: it would become a NaN learning rate
        raise ValueError(f"`step` must be >= 0, got {step!r}.")
    if not warmup_steps >= 0:
        raise ValueError(f"`warmup_steps` must be >= 0, got {warmup_steps!r}.")
    if not (scale > 0 and math.isfinite(scale)):
        raise ValueError(f"`scale` must be finite and > 0, got {scale!r}.")
    if start not in WARMUP_STARTS:  # checked before the ramp's end too: a typo fails at once, not at update 1
        raise ValueError(f"`start` must be one of {WARMUP_STARTS}, got {start!r}.")
    if step >= warmup_steps:
        return scale
    if start == "unscaled":
        begin = min(1.0, scale)
        return begin + (scale - begin) * step / warmup_steps
    return scale * (step + 1) / (warmup_steps + 1)
