"""Argument checks shared by the callbacks: each error names the argument, the value and the fix."""

from __future__ import annotations

import difflib
import inspect
import math
from collections.abc import Iterable
from numbers import Integral, Real
from typing import Any

import numpy as np


def is_real(value: Any) -> bool:
    """Whether ``value`` is a real number (Python or NumPy scalar), ``bool`` excluded."""
    return isinstance(value, Real) and not isinstance(value, bool)


def is_integral(value: Any) -> bool:
    """Whether ``value`` is an integer (Python or NumPy scalar), ``bool`` excluded."""
    return isinstance(value, Integral) and not isinstance(value, bool)


def real(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, Real) or not math.isfinite(float(value)):
        raise TypeError(f"`{name}` must be a finite number, got {value!r}.")
    return float(value)


def positive(name: str, value: Any, hint: str = "") -> float:
    v = real(name, value)
    if v <= 0:
        raise ValueError(f"`{name}` must be > 0, got {value!r}.{' ' + hint if hint else ''}")
    return v


def in_range(
    name: str,
    value: Any,
    low: float,
    high: float,
    *,
    low_open: bool = False,
    high_open: bool = False,
    hint: str = "",
) -> float:
    v = real(name, value)
    too_low = v <= low if low_open else v < low
    too_high = v >= high if high_open else v > high
    if too_low or too_high:
        interval = f"{'(' if low_open else '['}{low:g}, {high:g}{')' if high_open else ']'}"
        raise ValueError(f"`{name}` must be in {interval}, got {value!r}.{' ' + hint if hint else ''}")
    return v


def probability(name: str, value: Any) -> float:
    return in_range(name, value, 0.0, 1.0, hint="It is the chance of applying the technique to a batch.")


def window(start: Any, end: Any) -> tuple[float, float]:
    """A ``[start, end)`` window in training progress (fractions of the run)."""
    s = in_range("start", start, 0.0, 1.0, hint="It is a fraction of training progress, 0 = first step.")
    e = in_range("end", end, 0.0, 1.0, hint="It is a fraction of training progress, 1 = last step.")
    if e <= s:
        raise ValueError(f"`end` ({end!r}) must be greater than `start` ({start!r}).")
    return s, e


def flag(name: str, value: Any, hint: str = "", *, optional: bool = False) -> bool | None:
    """``value`` as a bool; a string such as ``"False"`` (from a config) is refused, not read as True."""
    if optional and value is None:
        return None
    if not isinstance(value, bool | np.bool_):
        allowed = "True, False or None" if optional else "True or False"
        raise TypeError(f"`{name}` must be {allowed}, got {value!r}.{' ' + hint if hint else ''}")
    return bool(value)


def optional_int(name: str, value: Any, *, minimum: int) -> int | None:
    if value is None:
        return None
    if not is_integral(value):
        raise TypeError(f"`{name}` must be an int or None, got {value!r}.")
    if value < minimum:
        raise ValueError(f"`{name}` must be >= {minimum}, got {value!r}.")
    return int(value)  # a NumPy integer (from a config) becomes a Python int


def init_arguments(cls: type) -> list[str] | None:
    """The keyword arguments ``cls(...)`` takes, following ``**kwargs`` up the base classes; ``None`` if unknown."""
    names: list[str] = []
    for klass in cls.__mro__:
        if "__init__" not in vars(klass):
            continue
        try:
            params = list(inspect.signature(vars(klass)["__init__"]).parameters.values())[1:]
        except (TypeError, ValueError):
            return None
        names += [p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and p.name not in names]
        if not any(p.kind is p.VAR_KEYWORD for p in params):
            return names
    return None


def unknown_arguments(cls: type, given: Iterable[str]) -> str | None:
    """A message naming the arguments in ``given`` that ``cls(...)`` does not take (with the closest names and
    the ones it takes); ``None`` when it takes them all, or when its arguments cannot be read."""
    accepted = init_arguments(cls)
    if accepted is None:  # cannot be read: let the call itself decide
        return None
    wrong = sorted(set(given) - set(accepted))
    if not wrong:
        return None
    close = {w: difflib.get_close_matches(w, accepted, n=1) for w in wrong}
    hints = "".join(f" ({w!r}: did you mean {c[0]!r}?)" for w, c in close.items() if c)
    takes = ", ".join(accepted) if accepted else "no arguments"
    return f"{cls.__name__} has no argument {', '.join(map(repr, wrong))}{hints}; it takes {takes}."


def no_unknown_arguments(cls: type, given: Iterable[str]) -> None:
    """Raise a ``TypeError`` naming the arguments ``cls(...)`` does not take, with the closest names: for classes
    that pass ``**kwargs`` on, whose own error would name the base class and suggest nothing."""
    message = unknown_arguments(cls, given)
    if message is not None:
        raise TypeError(message)
