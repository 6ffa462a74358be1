"""Read and replace the input and the target of a batch, whatever its container.

A training batch reaches our callbacks as whatever the user's ``collate_fn`` and transfer hooks made of it:
a list or tuple (``default_collate`` turns tuple samples into a list), a dict, a namedtuple, a dataclass, or
any custom object. :class:`BatchFields` names where the input and the target live and builds a *new* batch
with either replaced, so a transform never mutates the user's objects (which may alias a dataset's storage).
A dataclass with ``__post_init__`` is built anew with ``dataclasses.replace``, so that its derived fields follow:
its ``__post_init__`` runs again on every field, which a ``__post_init__`` that transforms them (normalises an
image) would do twice; such a batch needs a getter and a setter.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable, Mapping, MutableMapping
from typing import Any

from torch import Tensor

Key = int | str
#: ``getter(batch) -> (input, target)``; the target may be ``None`` when the batch has none.
BatchGetter = Callable[[Any], tuple[Tensor, Tensor | None]]
#: ``setter(batch, input, target) -> new_batch``.
BatchSetter = Callable[[Any, Tensor, Tensor | None], Any]

_INPUT_NAMES = ("input", "inputs", "x", "image", "images", "img", "pixel_values", "data", "features")
_TARGET_NAMES = ("target", "targets", "y", "label", "labels", "class", "classes")


_GETTER_SETTER = "`batch_getter`/`batch_setter` (`getter`/`setter` of `BatchFields`)"


class BatchFieldError(ValueError):
    """The batch does not have the input or target the callback was told to use."""


def _candidates(batch: Any, which: str) -> list[str]:
    """The conventional names of the input (or target) that ``batch`` has, in the order they are looked up."""
    available = _available_keys(batch)
    return [n for n in (_INPUT_NAMES if which == "input" else _TARGET_NAMES) if n in available]


def _is_namedtuple(obj: Any) -> bool:
    return isinstance(obj, tuple) and hasattr(obj, "_fields") and hasattr(obj, "_replace")


class BatchFields:
    """Where a batch keeps its input and its target.

    Args:
        input_key: index (list/tuple/namedtuple), key (dict) or attribute name (dataclass, namedtuple or
            any object) of the input. ``None`` picks ``0`` for lists and tuples, and a conventional name
            (``"input"``, ``"x"``, ``"image"``, ...) for dicts, namedtuples (by field name) and objects.
        target_key: the same for the target; ``None`` picks ``1`` or a conventional name
            (``"target"``, ``"y"``, ``"label"``, ...). Input and target must resolve to different places.
        getter: for batches no key can describe, ``getter(batch) -> (input, target)`` (a callback's
            ``batch_getter``).
        setter: with ``getter``, ``setter(batch, input, target) -> new batch`` (a callback's ``batch_setter``).

    Example::

        >>> import torch
        >>> fields = BatchFields(input_key="image", target_key="label")
        >>> batch = {"image": torch.zeros(2, 3), "label": torch.tensor([0, 1]), "id": [7, 8]}
        >>> new = fields.replace(batch, input=torch.ones(2, 3))
        >>> new["image"].sum().item(), batch["image"].sum().item(), new["id"]
        (6.0, 0.0, [7, 8])
    """

    def __init__(
        self,
        input_key: Key | None = None,
        target_key: Key | None = None,
        getter: BatchGetter | None = None,
        setter: BatchSetter | None = None,
    ) -> None:
        if (getter is None) != (setter is None):
            raise ValueError(
                "`getter` and `setter` go together: pass both (getter(batch) -> (input, target) and "
                "setter(batch, input, target) -> batch) or neither."
            )
        if getter is not None and (input_key is not None or target_key is not None):
            raise ValueError(f"Pass either `input_key`/`target_key` or {_GETTER_SETTER}, not both.")
        for name, key in (("input_key", input_key), ("target_key", target_key)):
            if key is not None and not isinstance(key, int | str):
                raise TypeError(f"`{name}` must be an int index or a str key, got {type(key).__name__}.")
        if getter is not None and not (callable(getter) and callable(setter)):
            raise TypeError("`getter` and `setter` must be callables.")
        if input_key is not None and input_key == target_key:
            raise ValueError(f"`input_key` and `target_key` are both {input_key!r}; they must differ.")
        self.input_key = input_key
        self.target_key = target_key
        # Input and target can land on the same place only with one key given and the other by default (the
        # defaults never collide: 0 and 1, or disjoint conventional names), or two int indices (-1 and 1 of a pair)
        self._may_collide = (input_key is None) != (target_key is None) or (
            isinstance(input_key, int) and isinstance(target_key, int)
        )
        self.getter = getter
        self.setter = setter

    def __repr__(self) -> str:
        if self.getter is not None:
            return f"BatchFields(getter={self.getter!r}, setter={self.setter!r})"
        return f"BatchFields(input_key={self.input_key!r}, target_key={self.target_key!r})"

    # ------------------------------------------------------------------ key resolution
    def _resolve(self, batch: Any, which: str, *, missing_ok: bool = False) -> Key | None:
        """Where ``which`` is read from: the key given, the default index, or the one conventional name present;
        ``None`` if there is none and ``missing_ok`` (a batch may have no target)."""
        key = self.input_key if which == "input" else self.target_key
        if key is not None:
            return key
        if isinstance(batch, list | tuple) and not _is_namedtuple(batch):
            return 0 if which == "input" else 1
        found = _candidates(batch, which)
        if not found:
            if missing_ok:
                return None
            raise BatchFieldError(
                f"Could not find the {which} in a batch of type {type(batch).__name__} with keys "
                f"{sorted(map(str, _available_keys(batch)))}. Pass `{which}_key=` naming it (or {_GETTER_SETTER} for "
                "a custom batch)."
            )
        if len(found) > 1:  # {"x": coordinates, "image": pixels}: taking the first would mix the wrong field
            raise BatchFieldError(
                f"The {type(batch).__name__} batch has several fields that could be the {which}: "
                f"{', '.join(map(repr, found))}. Pass `{which}_key=` naming the one to use."
            )
        return found[0]

    def key_of(self, batch: Any, which: str) -> Key:
        """The key or index ``which`` (``"input"`` or ``"target"``) is read from in ``batch``: the one given, or
        the conventional name found; raises :class:`BatchFieldError` if none. Not for ``getter``/``setter``."""
        if which not in ("input", "target"):
            raise ValueError(f"`which` must be 'input' or 'target', got {which!r}.")
        if self.getter is not None:
            raise ValueError("`key_of` has no answer for `getter`/`setter` batches: they read no key.")
        return self._resolve(batch, which)

    # ------------------------------------------------------------------ access
    def get(self, batch: Any) -> tuple[Any, Any]:
        """Return ``(input, target)``; the target is ``None`` if the batch has none and no key names one."""
        if self.getter is not None:
            out = self.getter(batch)
            if not (isinstance(out, (tuple, list)) and len(out) == 2):  # a collated `[x, y]` is a pair too
                raise BatchFieldError(
                    f"`getter` must return a pair (input, target), a tuple or list of 2; got a {type(out).__name__}"
                    + (f" of {len(out)}." if isinstance(out, (tuple, list)) else ".")
                )
            return tuple(out)
        return self.get_input(batch), self.get_target(batch)

    def _check_distinct(self, batch: Any, target_key: Key) -> None:
        # One key given, the other by default: both can land on the same place (input_key=1 on a list, whose
        # default target is 1), and the target would silently be the input.
        if not self._may_collide:
            return
        try:
            input_key = self._resolve(batch, "input", missing_ok=True)
        except BatchFieldError:  # several conventional input names: a collision only if the target is one of them
            input_key = target_key if target_key in _candidates(batch, "input") else None
        if input_key is None:
            return  # no input found: nothing to collide with (a technique that reads only the target)
        if _same_place(batch, input_key, target_key):
            raise BatchFieldError(
                f"The input and the target of this {type(batch).__name__} batch are both read from "
                f"{input_key!r} (`input_key={self.input_key!r}`, `target_key={self.target_key!r}`; None takes the "
                "default). Pass both `input_key=` and `target_key=`."
            )

    def get_input(self, batch: Any) -> Any:
        """The batch's input (where ``input_key``, or the getter, says it is)."""
        if self.getter is not None:
            return self.get(batch)[0]
        return _read(batch, self._resolve(batch, "input"), "input")

    def get_target(self, batch: Any) -> Any:
        """The batch's target, or ``None`` for a batch without one (no ``target_key`` and no conventional place)."""
        if self.getter is not None:
            return self.get(batch)[1]
        if self.target_key is None and isinstance(batch, list | tuple) and len(batch) < 2:
            return None
        key = self._resolve(batch, "target", missing_ok=True)
        if key is None:  # no `target_key` and no conventional name: a batch without a target
            return None
        self._check_distinct(batch, key)
        return _read(batch, key, "target")

    def replace(self, batch: Any, *, input: Any = None, target: Any = None) -> Any:
        """Return a new batch of the same container type with ``input`` and/or ``target`` replaced."""
        if self.getter is not None:
            old_x, old_y = self.getter(batch)
            new = self.setter(batch, old_x if input is None else input, old_y if target is None else target)
            if new is None:  # Lightning would take it for a batch to skip
                raise TypeError(
                    "`batch_setter` returned None; it must return the new batch (build one: never change the batch "
                    "it is given in place, which may alias the dataset's storage)."
                )
            return new
        updates: dict[Key, Any] = {}
        if input is not None:
            updates[self._resolve(batch, "input")] = input
        if target is not None:
            key = self._resolve(batch, "target")
            self._check_distinct(batch, key)
            updates[key] = target
        return _write(batch, updates) if updates else batch


def _same_place(batch: Any, a: Key, b: Key) -> bool:
    if _is_namedtuple(batch):  # a field by name or by index
        a, b = (batch._fields.index(k) if isinstance(k, str) and k in batch._fields else k for k in (a, b))
    if isinstance(a, int) and isinstance(b, int) and isinstance(batch, list | tuple) and batch:
        return a % len(batch) == b % len(batch)
    return a == b


def _available_keys(batch: Any) -> list[Any]:
    if isinstance(batch, Mapping):
        return list(batch.keys())
    if _is_namedtuple(batch):
        return list(batch._fields)
    if dataclasses.is_dataclass(batch):
        return [f.name for f in dataclasses.fields(batch)]
    if isinstance(batch, list | tuple):
        return list(range(len(batch)))
    return [k for k in getattr(batch, "__dict__", {}) if not k.startswith("_")]


def _read(batch: Any, key: Key, which: str) -> Any:
    try:
        if isinstance(batch, Mapping):
            return batch[key]
        if isinstance(batch, list | tuple) and isinstance(key, int):
            return batch[key]
        if isinstance(key, str):
            return getattr(batch, key)
    except (KeyError, IndexError, AttributeError):
        pass
    raise BatchFieldError(
        f"The batch ({type(batch).__name__}) has no {which} at {key!r}; it has "
        f"{sorted(map(str, _available_keys(batch)))}. Fix `{which}_key=`."
    )


def _write(batch: Any, updates: dict[Key, Any]) -> Any:
    if isinstance(batch, Mapping):
        if isinstance(batch, MutableMapping):
            new = copy.copy(batch)
            for k, v in updates.items():
                new[k] = v
            return new
        return type(batch)({**batch, **updates})
    if _is_namedtuple(batch):
        if all(isinstance(k, str) for k in updates):
            return batch._replace(**updates)
        items = list(batch)
        for k, v in updates.items():
            items[k if isinstance(k, int) else batch._fields.index(k)] = v
        return type(batch)(*items)
    if isinstance(batch, list | tuple) and all(isinstance(k, int) for k in updates):
        items = list(batch)
        for k, v in updates.items():
            items[k] = v
        if type(batch) is list:
            return items
        if isinstance(batch, list):  # a list subclass: a shallow copy keeps its type and attributes
            new_list = copy.copy(batch)
            for k, v in updates.items():
                new_list[k] = v
            return new_list
        return type(batch)(items)
    if dataclasses.is_dataclass(batch) and not isinstance(batch, type):
        if hasattr(type(batch), "__post_init__"):
            # its `__post_init__` may derive fields from the ones replaced (or check them): build it anew
            return _dataclass_replace(batch, updates)
        # a shallow copy, not dataclasses.replace: that would reset `field(init=False)` values and drop
        # attributes set after construction; object.__setattr__ also writes frozen dataclasses
        try:
            new_dc = copy.copy(batch)
            for k, v in updates.items():
                object.__setattr__(new_dc, k, v)
        except (AttributeError, TypeError):
            return _dataclass_replace(batch, updates)
        return new_dc
    try:
        new = copy.copy(batch)
        for k, v in updates.items():
            setattr(new, k, v)
    except (AttributeError, TypeError) as err:
        raise BatchFieldError(
            f"Cannot replace {list(updates)} on a {type(batch).__name__} batch ({err}). Pass "
            f"{_GETTER_SETTER} that build a new batch."
        ) from err
    return new


def _dataclass_replace(batch: Any, updates: dict[Key, Any]) -> Any:
    try:
        return dataclasses.replace(batch, **updates)
    except ValueError as err:
        if "with replace()" not in str(err):  # the batch's own `__post_init__` refusing the new values
            raise
        # an `InitVar` without a default cannot be carried over, a `field(init=False)` cannot be given
        raise BatchFieldError(
            f"Cannot rebuild the {type(batch).__name__} batch with {list(updates)} replaced ({err}). Pass "
            f"{_GETTER_SETTER} that build a new batch."
        ) from err
