"""Presets: named recipes of callbacks and Trainer settings, so users pick a name instead of tuning seven knobs.

>>> from lightning_speedups import presets
>>> "vision-mild" in presets.names()
True
>>> recipe = presets.get("vision-mild", accelerator="cpu")
>>> recipe.trainer_kwargs["precision"]
'32-true'

``get`` returns a :class:`Recipe`: the callbacks and the recommended Trainer settings (precision for the
hardware, Lightning's DDP strategy when several devices are asked for). ``recipe.trainer(max_epochs=...)``
builds the Trainer. Overrides are keyed by callback class name: ``get("vision-medium", MixUp={"alpha": 0.4})``
changes an argument, ``get("vision-aggressive", CutMix=None)`` drops a callback.

Third-party presets register with the :func:`register_preset` decorator, or from another package through the
``lightning_speedups.presets`` entry-point group (an entry point names a module or object whose import
registers its presets).
"""

from __future__ import annotations

import difflib
import importlib
import inspect
import json
import math
import sys
import types
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import BatchSizeFinder, Callback
from lightning.pytorch.strategies import ParallelStrategy
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn

from lightning_speedups import _checks
from lightning_speedups.base import _same_setting

ENTRY_POINT_GROUP = "lightning_speedups.presets"
CONFIG_DIR = Path(__file__).parent / "configs"

__all__ = [
    "Preset",
    "Recipe",
    "UnknownPresetError",
    "config_path",
    "declarative",
    "describe",
    "get",
    "lookup",
    "names",
    "recommended_precision",
    "recommended_strategy",
    "register",
    "register_preset",
    "resolve_callback_class",
    "to_yaml",
    "unknown_arguments",
]

CallbackSpec = tuple[str, Mapping[str, Any]]


class UnknownPresetError(ValueError):
    """No preset has this name; the message lists the known names and the closest match."""


@dataclass(frozen=True)
class Preset:
    """A registered recipe.

    Args:
        name: the name users pick it by.
        summary: one line saying what it is for.
        description: what it contains and why.
        factory: ``factory(**overrides) -> list[Callback]``.
        trainer: Trainer settings the recipe needs beyond precision and strategy (it may fix those too); not
            ``accelerator``, ``devices`` or ``callbacks``, which are the user's and the preset's callbacks.
        requires: what the user's code must provide (e.g. a ``SpeedupDataModule``).
        callbacks: the ``(class name, arguments)`` specs of a declarative preset (empty for a function).
    """

    name: str
    summary: str
    description: str
    factory: Callable[..., list[Callback]]
    trainer: Mapping[str, Any] = field(default_factory=dict)
    requires: str = ""
    callbacks: tuple[CallbackSpec, ...] = ()


@dataclass
class Recipe:
    """What :func:`get` returns: callbacks plus recommended Trainer settings."""

    name: str
    callbacks: list[Callback]
    trainer_kwargs: dict[str, Any]
    #: the precision and strategy :func:`get` recommended for its accelerator and devices; ``trainer()`` with
    #: other ones recommends again where ``trainer_kwargs`` still hold these (not where you changed them)
    recommended: dict[str, Any] = field(default_factory=dict, repr=False)

    def trainer(self, **kwargs: Any) -> pl.Trainer:
        """A Trainer with this recipe; ``kwargs`` win over the recipe's settings, callbacks are appended.

        A callback of yours of a class the recipe has already replaces the recipe's (two would stack the technique,
        or trip Lightning's unique ``state_key`` check). Another ``accelerator`` or ``devices`` here also gets the
        precision and strategy :func:`get` recommends for them (unless ``kwargs`` give those too, or the preset
        itself fixes them).
        """
        settings = {**self.trainer_kwargs, **kwargs}
        if "accelerator" in kwargs or "devices" in kwargs:
            # re-recommended only where the recipe still holds what `get` recommended: a value the preset fixes,
            # or one set on `trainer_kwargs` since, is kept
            fixed = _REGISTRY[self.name].trainer if self.name in _REGISTRY else {}
            accelerator, devices = str(settings.get("accelerator", "auto")), settings.get("devices", 1)
            recommend = {
                "precision": lambda: recommended_precision(accelerator),
                "strategy": lambda: recommended_strategy(devices, accelerator),
            }
            for key, now in recommend.items():
                mine = self.trainer_kwargs.get(key)
                if key not in kwargs and key not in fixed and self.recommended.get(key, mine) == mine:
                    settings[key] = now()
        _check_batch_size_finder(
            self.name,
            self.callbacks,
            devices=settings.get("devices", 1),
            accelerator=str(settings.get("accelerator", "auto")),
            strategy=settings.get("strategy", "auto"),
            num_nodes=settings.get("num_nodes", 1),
        )
        settings["callbacks"] = self.with_callbacks(_as_callback_list(kwargs.get("callbacks")))
        return pl.Trainer(**settings)

    def with_callbacks(self, users: Sequence[Callback]) -> list[Callback]:
        """The recipe's callbacks with ``users``: one of a class the recipe has takes that callback's place (its
        slot in the order), the others come after."""
        merged, placed = _put_users_in_place(self.name, self.callbacks, users)
        return [*merged, *(u for u in users if not any(u is p for p in placed))]


def _put_users_in_place(
    name: str, preset_callbacks: Sequence[Callback], users: Sequence[Callback]
) -> tuple[list[Callback], list[Callback]]:
    """The preset's callbacks with each one of a class that ``users`` has too replaced, in its slot, by the user's
    (batch transforms run in callback order, so the replacement keeps the preset's order); and the user callbacks
    so placed. Each replacement is logged on rank zero."""
    merged: list[Callback] = []
    placed: list[Callback] = []
    for callback in preset_callbacks:
        mine = next((u for u in users if isinstance(u, type(callback)) and not any(u is p for p in placed)), None)
        if mine is None:
            merged.append(callback)
            continue
        if mine is not callback:
            _say_replaced(name, callback, mine)
        merged.append(mine)
        placed.append(mine)
    return merged, placed


def _say_replaced(name: str, preset_callback: Callback, mine: Callback) -> None:
    """Log on rank zero that ``mine`` replaces the preset's callback; warn, naming them, where their arguments
    differ: a replacement is used as given, so an argument left out of it is its class's default, not the preset's
    (``--trainer.callbacks+=LinearScalingWarmup --trainer.callbacks.warmup=0.1`` has reference 256, not
    ``'initial'``)."""
    from lightning_speedups.base import SpeedupCallback, SpeedupWarning, _short_repr

    what = f"Preset {name!r}: your {type(mine).__name__} replaces the preset's {type(preset_callback).__name__}"
    differ = {}
    if isinstance(preset_callback, SpeedupCallback) and isinstance(mine, type(preset_callback)):
        differ = preset_callback._differing_settings(mine)  # over the preset's class's arguments (a subclass too)
    if not differ:
        rank_zero_info(f"{what}.")
        return
    listed = ", ".join(f"{k}={_short_repr(b)} (the preset's: {_short_repr(a)})" for k, (a, b) in differ.items())
    rank_zero_warn(
        f"{what}, with other arguments: {listed}. A replacement is used as given, every argument it leaves out at "
        f"its class's default: give those you meant to keep as the preset has them ({_lister(name)} lists them)"
        f"{_python_override_hint(name, type(preset_callback))}.",
        category=SpeedupWarning,
    )


def _lister(name: str) -> str:
    """What shows preset ``name``'s callbacks: the command for a built-in or a plug-in's preset, which it finds;
    ``describe`` for one a script registered (the command, in a process of its own, does not know it)."""
    if _BUILT_IN.get(name) is _REGISTRY.get(name) or name in _FROM_ENTRY_POINTS:
        return f"`lightning-speedups presets {name}`"
    return f"`lightning_speedups.presets.describe({name!r})`"


def _python_override_hint(name: str, cls: type) -> str:
    """How to change only some arguments of preset ``name``'s callback of class ``cls`` in Python, where its
    preset is declarative (a function preset takes its function's own arguments instead)."""
    preset = _REGISTRY.get(name)
    for spec_name, _ in preset.callbacks if preset is not None else ():
        try:
            if resolve_callback_class(spec_name) is not cls:
                continue
        except ValueError:
            continue
        key = f"{spec_name}={{...}}" if spec_name.isidentifier() else f"**{{{spec_name!r}: {{...}}}}"
        return f", or change only some in Python: presets.get({name!r}, {key})"
    return ""


def _replace_by_users(name: str, preset_callbacks: Sequence[Callback], users: Sequence[Callback]) -> list[Callback]:
    """The callbacks of preset ``name`` less those of a class that ``users`` (the user's callbacks, which go
    elsewhere in the list) has too; each replacement logged on rank zero, as by :func:`_put_users_in_place`."""
    merged, placed = _put_users_in_place(name, preset_callbacks, users)
    return [c for c in merged if not any(c is p for p in placed)]


def _as_callback_list(callbacks: Callback | Sequence[Callback] | None) -> list[Callback]:
    """``callbacks`` as ``pl.Trainer`` takes them (None, one callback, or a list of them) -> a list."""
    if callbacks is None:
        return []
    if isinstance(callbacks, Callback):
        return [callbacks]
    return list(callbacks)


_REGISTRY: dict[str, Preset] = {}
#: the modules on the call stack when each preset was registered (the module importing it, and those importing
#: that one): a plug-in whose import fails is rolled back by them, without taking the presets of another plug-in
#: it imported first (whether that one registers them itself or through a helper module)
_ORIGIN: dict[str, frozenset[str]] = {}
_entry_points_loaded = False
_entry_points_loading = False
#: the names the plug-ins' entry points registered: those `lightning-speedups presets` knows, beside the built-in
_FROM_ENTRY_POINTS: set[str] = set()


def register(preset: Preset, *, overwrite: bool = False) -> Preset:
    """Add ``preset`` to the registry; a name already taken raises unless ``overwrite``, or unless it is the same
    preset registered again (a module reloaded, a notebook cell run twice), which replaces it."""
    if not isinstance(preset.name, str) or not preset.name:
        raise ValueError(f"A preset needs a non-empty str name, got {preset.name!r}.")
    taken = _REGISTRY.get(preset.name)
    if taken is not None and not overwrite and not _registered_again(taken, preset):
        raise ValueError(
            f"A preset named {preset.name!r} exists already (from {_where(taken)}); pass overwrite=True to replace "
            "it, or pick another name."
        )
    _check_trainer_settings(preset.name, preset.trainer)
    _REGISTRY[preset.name] = preset
    _ORIGIN[preset.name] = _calling_modules()
    return preset


def _calling_modules() -> frozenset[str]:
    """The names of the modules on the call stack, this one left out."""
    names, frame = set(), sys._getframe(1)
    while frame is not None:
        names.add(str(frame.f_globals.get("__name__", "")))
        frame = frame.f_back  # type: ignore[assignment]
    names.discard(__name__)
    return frozenset(names)


def _check_trainer_settings(name: str, settings: Mapping[str, Any]) -> None:
    """A preset's ``trainer`` settings must be ``pl.Trainer`` arguments: a typo fails at registration, with the
    closest name, not as a bare TypeError (or a command-line parser's traceback) at the first run."""
    known = [p for p in inspect.signature(pl.Trainer.__init__).parameters if p != "self"]
    for key in settings:
        if key not in known:
            close = difflib.get_close_matches(str(key), known, n=1)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            raise TypeError(f"Preset {name!r}: `trainer` has {key!r}, which is not a `pl.Trainer` argument.{hint}")
        if key in _NOT_A_PRESETS:
            raise TypeError(f"Preset {name!r}: `trainer` has {key!r}; {_NOT_A_PRESETS[key]}")


#: Trainer settings a preset cannot fix: the user's hardware (from which `get` recommends precision and strategy,
#: and which a preset's own value would override against its recommendation) and its callbacks
_NOT_A_PRESETS = {
    "accelerator": "the accelerator is the user's (`get(name, accelerator=...)`), and sets the recommended precision.",
    "devices": "the devices are the user's (`get(name, devices=...)`), and set the recommended strategy.",
    "callbacks": "list the preset's callbacks as its callbacks (a declaration or its function), not as a Trainer "
    "setting.",
}


def _registered_again(old: Preset, new: Preset) -> bool:
    """Whether ``new`` is ``old`` registered again: the same declaration, or a function preset from the same
    function of the same module (a reload makes a new function object)."""
    if old.callbacks or new.callbacks:  # declarative: the same declaration, setting for setting
        return _same_setting(  # by value: array settings, NaN, instances that compare by identity (by their repr)
            (old.callbacks, old.summary, old.description, dict(old.trainer), old.requires),
            (new.callbacks, new.summary, new.description, dict(new.trainer), new.requires),
        )
    where = _where(old)
    return (
        inspect.isfunction(old.factory)
        and inspect.isfunction(new.factory)
        and where == _where(new)
        and not where.startswith(f"{__name__}.")
        and "<" not in where  # not a lambda or a closure, which many presets may share
    )


def _where(preset: Preset) -> str:
    factory = preset.factory
    return f"{getattr(factory, '__module__', '?')}.{getattr(factory, '__qualname__', type(factory).__name__)}"


def register_preset(
    name: str | None = None,
    *,
    summary: str | None = None,
    description: str | None = None,
    trainer: Mapping[str, Any] | None = None,
    requires: str = "",
    overwrite: bool = False,
) -> Callable[[Callable[..., list[Callback]]], Callable[..., list[Callback]]]:
    """Decorator: register a function returning a list of callbacks as a preset.

    The name defaults to the function's name with ``_`` as ``-``; the summary and description to its
    docstring. Keyword arguments of ``get(name, ...)`` other than ``accelerator``/``devices`` go to the function.

    Example::

        from lightning_speedups import LabelSmoothing, MixUp
        from lightning_speedups.presets import register_preset

        @register_preset("my-team-recipe")
        def my_team_recipe(alpha: float = 0.3):
            \"\"\"MixUp and label smoothing as our team tunes them.\"\"\"
            return [MixUp(alpha=alpha), LabelSmoothing(0.05)]
    """

    if callable(name):  # used bare, `@register_preset` without parentheses: the name comes from the function
        return register_preset()(name)  # type: ignore[return-value]
    if name is not None and not isinstance(name, str):
        raise TypeError(f"`register_preset` takes the preset's name as a str, got {name!r}.")

    def decorate(fn: Callable[..., list[Callback]]) -> Callable[..., list[Callback]]:
        doc = inspect.getdoc(fn) or ""
        register(
            Preset(
                name=name or fn.__name__.replace("_", "-"),
                summary=summary or (doc.splitlines()[0] if doc else fn.__name__),
                description=description or doc,
                factory=fn,
                trainer=dict(trainer or {}),
                requires=requires,
            ),
            overwrite=overwrite,
        )
        return fn

    return decorate


def _load_entry_points() -> None:
    """Register the plug-ins' presets, once per process.

    A broken plug-in must break neither the built-in presets nor the other plug-ins: every entry point is loaded
    and the loading marked done before the problems are warned about, so that warnings turned into errors
    (``-W error``) cannot stop the loop half-way and leave the good plug-ins out for the rest of the process.
    """
    global _entry_points_loaded, _entry_points_loading
    if _entry_points_loaded or _entry_points_loading:
        return  # a plug-in that calls `lookup` or `names` as it is imported sees what is registered so far
    _entry_points_loading = True
    before = set(_REGISTRY)
    try:
        problems = _load_each_entry_point()
    finally:
        _entry_points_loading = False
        _FROM_ENTRY_POINTS.update(set(_REGISTRY) - before)
    _entry_points_loaded = True
    for problem in problems:
        warnings.warn(problem, stacklevel=2)


def _load_each_entry_point() -> list[str]:
    problems: list[str] = []
    found = list(entry_points(group=ENTRY_POINT_GROUP))
    # the module of each entry point, read from its value: `EntryPoint.module` raises on a malformed value
    # (`my-plugin.presets`), which `ep.load()` reports as that entry point's problem
    modules = [ep.value.partition(":")[0].partition("[")[0].strip() for ep in found]  # `mod:obj [extra]`, `mod [x]`
    for ep, module in zip(found, modules, strict=True):
        where = f"preset entry point {ep.name!r} ({ep.value})"
        before = dict(_REGISTRY)
        try:
            obj = ep.load()
        except (Exception, SystemExit) as err:  # a script registered by mistake may exit as it is imported
            # a plug-in that failed half-way registers nothing (another plug-in it imported keeps its own)
            _roll_back(before, {m for m in modules if m != module})
            # importlib's own words for a malformed value are cryptic (an AttributeError on None)
            malformed = getattr(ep, "pattern", None) is not None and ep.pattern.fullmatch(ep.value) is None
            why = "its value is no `module` or `module:object` path" if malformed else f"{type(err).__name__}: {err}"
            problems.append(f"Could not load {where}: {why}")
            continue
        for name, preset in before.items():  # a plug-in's import may add presets, never replace one
            if _REGISTRY.get(name) is not preset:
                _REGISTRY[name] = preset
                problems.append(f"Ignored the preset {name!r} that {where} registered: that name exists already.")
        if isinstance(obj, types.ModuleType):
            continue  # a module whose import registered its presets (`@register_preset`, `register`)
        if callable(obj) and any(preset.factory is obj for preset in _REGISTRY.values()):
            continue  # a function that `@register_preset` registered as the module was imported
        if not isinstance(obj, Preset):
            problems.append(
                f"Ignored {where}: it is a {type(obj).__name__}; name a `lightning_speedups.presets.Preset`, or a "
                "module that registers its presets when imported."
            )
            continue
        if isinstance(obj.name, str) and obj.name in _REGISTRY:
            if _REGISTRY[obj.name] is not obj:
                problems.append(f"Ignored {where}: a preset named {obj.name!r} exists already.")
            continue
        try:
            register(obj)
        except Exception as err:
            problems.append(f"Could not register {where}: {err}")
    return problems


def _roll_back(before: Mapping[str, Preset], others: set[str]) -> None:
    """Undo what a failed plug-in import registered (the presets added since ``before``, through any helper module
    of its own, and any it replaced), except those that the module of another entry point (``others``, or a
    submodule of one) registered as the failed one imported it: that entry point finds its module imported and
    would not register them again."""
    for name in [n for n in _REGISTRY if n not in before]:
        owners = [
            module
            for module in _ORIGIN.get(name, frozenset())
            if module in sys.modules and any(module == m or module.startswith(m + ".") for m in others)
        ]
        if not owners:
            del _REGISTRY[name]
    _REGISTRY.update(before)


def names() -> list[str]:
    """Names of all registered presets, built-in and third-party."""
    _load_entry_points()
    return sorted(_REGISTRY)


def lookup(name: str) -> Preset:
    """The :class:`Preset` called ``name``; :class:`UnknownPresetError` lists the known names otherwise."""
    _load_entry_points()
    if name in _REGISTRY:
        return _REGISTRY[name]
    known = sorted(_REGISTRY)
    lowered = {k.lower(): k for k in known}  # `VISION-MILD` is close to `vision-mild`, whatever the case
    close = difflib.get_close_matches(str(name).lower(), list(lowered), n=1, cutoff=0.5)
    hint = f" Did you mean {lowered[close[0]]!r}?" if close else ""
    raise UnknownPresetError(
        f"Unknown preset {name!r}.{hint} Known presets: {', '.join(known)}. A preset registered with "
        "`@register_preset` exists where its module has been imported (import it from your --model or "
        "--datamodule module), or everywhere through the `lightning_speedups.presets` entry point (docs/presets.md)."
    )


def describe(name: str) -> str:
    """What the preset contains and why, as text."""
    preset = lookup(name)
    lines = [f"{preset.name}: {preset.summary}"]
    if preset.callbacks:
        lines.append("callbacks:")
        lines += [f"  - {cls}({_format_args(args)})" for cls, args in preset.callbacks]
    elif preset.factory is not _no_callbacks:
        lines.append(f"callbacks: built by {_where(preset)}")
    else:
        lines.append("callbacks: none")
    lines.append(f"trainer: {_trainer_text(preset)}")
    if preset.requires:
        lines.append(f"requires: {preset.requires}")
    if preset.description and preset.description != preset.summary:
        lines += ["", preset.description]
    return "\n".join(lines)


def _format_args(args: Mapping[str, Any]) -> str:
    return ", ".join(f"{k}={v!r}" for k, v in args.items())


def _trainer_text(preset: Preset) -> str:
    """The Trainer settings :func:`get` gives ``preset``, as rules: they depend on the machine and devices."""
    parts = []
    if "precision" not in preset.trainer:
        parts.append("precision for the hardware (bf16-mixed or 16-mixed on CUDA, else 32-true)")
    if "strategy" not in preset.trainer:
        parts.append(
            "one device only (BatchSizeFinder)"
            if _has_finder(preset)
            else "Lightning's DDP on several devices ('ddp', or 'ddp_fork' in a notebook)"
        )
    if preset.trainer:
        parts.append(_format_args(preset.trainer))
    return ", ".join(parts)


def _has_finder(preset: Preset) -> bool:
    """Whether declarative ``preset`` has a ``BatchSizeFinder`` (a function preset's are known only once built)."""
    for cls_name, _ in preset.callbacks:
        try:
            if issubclass(resolve_callback_class(cls_name), BatchSizeFinder):
                return True
        except ValueError:  # an unknown class name: `get` reports it
            continue
    return False


def recommended_precision(accelerator: str = "auto") -> str:
    """``bf16-mixed`` on CUDA devices with native bf16 (compute capability 8.0 and up), ``16-mixed`` on older
    CUDA devices (where bf16 would be emulated, slowly), else ``32-true``."""
    on_cuda = accelerator in ("cuda", "gpu") or (accelerator == "auto" and torch.cuda.is_available())
    if not on_cuda or not torch.cuda.is_available():
        return "32-true"
    try:
        native = torch.cuda.is_bf16_supported(including_emulation=False)
    except TypeError:  # torch before 2.4 has no `including_emulation`: native bf16 is compute capability 8.0 and up
        native = torch.cuda.get_device_capability()[0] >= 8
    return "bf16-mixed" if native else "16-mixed"


def _visible_devices(accelerator: str) -> int:
    """What ``devices="auto"`` (or -1) gives on ``accelerator``: every CUDA GPU, else one device (Lightning runs
    one process on a CPU or MPS for ``"auto"``)."""
    if str(accelerator).lower() in ("auto", "gpu", "cuda") and torch.cuda.is_available():
        return torch.cuda.device_count()
    return 1


def recommended_strategy(devices: int | str | Sequence[int], accelerator: str = "auto") -> str:
    """Lightning's DDP when several devices are asked for, else Lightning's default.

    ``devices`` takes the Trainer's forms: a count (``2``, ``"2"``), ``-1``/``"auto"`` (every visible GPU; one
    device on a CPU), a list of device ids (``[0, 1]``) or a comma-separated string of ids (``"0,1"``, ``"1,"``).
    """
    if isinstance(devices, str):
        text = devices.strip()
        if "," in text:
            several = len([d for d in text.split(",") if d.strip()]) > 1
        elif text in ("-1", "auto"):
            several = _visible_devices(accelerator) > 1
        else:
            try:
                several = int(text) > 1
            except ValueError:
                raise ValueError(
                    f"`devices` must be a count, -1, 'auto', a list of ids or a string like '0,1'; got {devices!r}."
                ) from None
    elif isinstance(devices, Sequence):
        several = len(devices) > 1
    elif devices == -1:
        several = _visible_devices(accelerator) > 1
    else:
        several = int(devices) > 1
    if not several:
        return "auto"
    # as Lightning's own choice for several devices: in a notebook or `python -i`, where Lightning refuses
    # `ddp` (its processes are started by running the script again), DDP with forked processes
    return "ddp_fork" if _is_interactive() else "ddp"


def _is_interactive() -> bool:
    """Lightning's test for an interactive session (a notebook, ``python -i``), made at call time."""
    return hasattr(sys, "ps1") or bool(sys.flags.interactive)


def get(name: str, *, accelerator: str = "auto", devices: int | str | Sequence[int] = 1, **overrides: Any) -> Recipe:
    """The callbacks and recommended Trainer settings of preset ``name``.

    Args:
        name: a name from :func:`names`.
        accelerator: the accelerator the Trainer will use; sets the recommended precision.
        devices: the devices the Trainer will use; more than one selects Lightning's DDP strategy.
        **overrides: for declarative presets, ``ClassName={"arg": value}`` changes arguments of that callback
            and ``ClassName=None`` drops it; for function presets, keyword arguments of the function.
    """
    preset = lookup(name)
    if overrides and not preset.callbacks and preset.factory is not _no_callbacks:
        _check_function_arguments(preset, overrides)
    callbacks = _factory_callbacks(preset, overrides)
    trainer_kwargs: dict[str, Any] = {
        "accelerator": accelerator,
        "devices": devices,
        "precision": recommended_precision(accelerator),
        "strategy": recommended_strategy(devices, accelerator),
        **preset.trainer,
    }
    _check_batch_size_finder(
        preset.name,
        callbacks,
        devices=trainer_kwargs["devices"],
        accelerator=str(trainer_kwargs["accelerator"]),
        strategy=trainer_kwargs["strategy"],
    )
    recommended = {k: trainer_kwargs[k] for k in ("precision", "strategy") if k not in preset.trainer}
    return Recipe(name=preset.name, callbacks=callbacks, trainer_kwargs=trainer_kwargs, recommended=recommended)


def _factory_callbacks(preset: Preset, overrides: Mapping[str, Any]) -> list[Callback]:
    """What the preset's factory gives (a list, any iterable such as a generator, or one callback), as a list of
    callbacks; anything else is refused by the preset's name."""
    made = preset.factory(**overrides)
    try:
        if made is None:  # a function that forgot its `return`: not an empty recipe
            raise TypeError
        callbacks = _as_callback_list(made)
    except TypeError:
        raise TypeError(
            f"Preset {preset.name!r} gave a {type(made).__name__}; its function must return a list of Lightning "
            "callbacks (or yield them)."
        ) from None
    for item in callbacks:
        if not isinstance(item, Callback):
            raise TypeError(
                f"Preset {preset.name!r} gave {item!r} among its callbacks, which is not a Lightning `Callback`; "
                "its function must return (or yield) callbacks only."
            )
    return callbacks


def _check_function_arguments(preset: Preset, overrides: Mapping[str, Any]) -> None:
    """A function preset takes its function's arguments, not ``ClassName={...}`` overrides: say so, by name."""
    try:
        inspect.signature(preset.factory).bind(**overrides)
    except TypeError:
        takes = [p for p in inspect.signature(preset.factory).parameters if p not in ("args", "kwargs")]
        raise TypeError(
            f"Preset {preset.name!r} is built by a function, which takes "
            f"{', '.join(takes) if takes else 'no arguments'}; got {', '.join(sorted(overrides))}. Overrides by "
            "callback class (`MixUp={...}`, `CutMix=None`) are for declarative presets; here pass the function's "
            "own arguments, or add your callback beside the preset's (one of the same class replaces it)."
        ) from None


def _is_distributed(strategy: Any) -> bool:
    """Whether a Trainer ``strategy`` (a name or a Strategy) runs several processes, as DDP, FSDP or DeepSpeed."""
    if isinstance(strategy, str):
        return strategy.lower().startswith(("ddp", "fsdp", "deepspeed", "xla"))
    return isinstance(strategy, ParallelStrategy)


def _check_batch_size_finder(
    name: str, callbacks: Sequence[Callback], *, devices: Any, accelerator: str, strategy: Any, num_nodes: Any = 1
) -> None:
    """Refuse several devices or nodes, or a distributed strategy, for a recipe with a ``BatchSizeFinder``.

    Lightning's BatchSizeFinder refuses distributed runs, and would say so only once every process has started.
    """
    if not any(isinstance(cb, BatchSizeFinder) for cb in callbacks):
        return
    several_nodes = isinstance(num_nodes, int) and num_nodes > 1
    if recommended_strategy(devices, accelerator) == "auto" and not _is_distributed(strategy) and not several_nodes:
        return
    nodes = f", num_nodes={num_nodes!r}" if several_nodes else ""
    raise ValueError(
        f"Preset {name!r} has a BatchSizeFinder, which runs on one device only (Lightning refuses it with "
        f"distributed strategies), but the run asks for devices={devices!r}{nodes}, strategy={strategy!r}. Find "
        "the batch "
        "size on one device (devices=1); then set it on your datamodule for the multi-device run, with the finder "
        "dropped and the learning rate scaled from the batch B you tuned it for: "
        f"presets.get({name!r}, devices=2, BatchSizeFinder=None, LinearScalingWarmup={{'reference_batch_size': B}})."
    )


# ------------------------------------------------------------------------------------- declarative presets
_NO_ATTRIBUTE = object()


def resolve_callback_class(name: str) -> type[Callback]:
    """A callback class by short name (ours first, then Lightning's), or any by its import path
    (``"my_package.callbacks.InputNoise"``)."""
    import lightning_speedups

    if "." in name:
        module_name, _, attr = name.rpartition(".")
        try:
            module = importlib.import_module(module_name)
        except ImportError as err:
            raise ValueError(f"Cannot import the callback class {name!r}: {err}") from err
        cls = getattr(module, attr, _NO_ATTRIBUTE)
        if isinstance(cls, type) and issubclass(cls, Callback):
            return cls
        if cls is _NO_ATTRIBUTE:  # a misspelt class: the module's callback classes nearest to it
            known = [n for n, v in vars(module).items() if isinstance(v, type) and issubclass(v, Callback)]
            close = difflib.get_close_matches(attr, known, n=1)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            raise ValueError(f"Module {module_name!r} has no attribute {attr!r}.{hint}")
        raise ValueError(f"{name!r} is not a Lightning Callback class.")
    modules = (lightning_speedups, importlib.import_module("lightning.pytorch.callbacks"))
    for module in modules:
        cls = getattr(module, name, None)
        if isinstance(cls, type) and issubclass(cls, Callback):
            return cls
    known = [n for m in modules for n, v in vars(m).items() if isinstance(v, type) and issubclass(v, Callback)]
    close = difflib.get_close_matches(name, known, n=1)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    raise ValueError(
        f"No callback class named {name!r} in lightning_speedups or lightning.pytorch.callbacks.{hint} Name another "
        "package's by its import path ('my_package.callbacks.MyCallback')."
    )


def _no_callbacks(**overrides: Any) -> list[Callback]:
    if overrides:
        raise TypeError(f"The baseline preset has no callbacks to override ({', '.join(overrides)}).")
    return []


def unknown_arguments(cls: type, given: Iterable[str]) -> str | None:
    """A message naming the arguments in ``given`` that ``cls(...)`` does not take (with the closest names and
    the ones it takes); ``None`` when it takes them all, or when its arguments cannot be read."""
    return _checks.unknown_arguments(cls, given)


def declarative(
    name: str,
    summary: str,
    description: str,
    callbacks: Sequence[CallbackSpec],
    *,
    trainer: Mapping[str, Any] | None = None,
    requires: str = "",
) -> Preset:
    """A preset built from ``(class name, arguments)`` specs; overrides are keyed by class name."""
    specs = tuple((cls, dict(args)) for cls, args in callbacks)
    known = [cls for cls, _ in specs]
    for cls_name, args in specs:  # a misspelt short name or argument fails here, not at the first `get`
        if "." not in cls_name:  # (import paths are resolved at `get`)
            problem = unknown_arguments(resolve_callback_class(cls_name), args)
            if problem:
                raise TypeError(f"Preset {name!r}: {problem}")

    def factory(**overrides: Any) -> list[Callback]:
        unknown = sorted(set(overrides) - set(known))
        if unknown:
            lowered = {k.lower(): k for k in known}  # a wrong case or a typo, not another class (CutMix / MixUp)
            close = {u: difflib.get_close_matches(u.lower(), list(lowered), n=1, cutoff=0.8) for u in unknown}
            hints = "".join(f" ({u!r}: did you mean {lowered[c[0]]!r}?)" for u, c in close.items() if c)
            raise TypeError(
                f"Preset {name!r} has no callback {', '.join(unknown)} to override{hints}; it has {', '.join(known)}."
            )
        out = []
        for cls_name, args in specs:
            change = overrides.get(cls_name, {})
            if change is None:
                continue
            if not isinstance(change, Mapping):
                raise TypeError(
                    f"Preset {name!r}: the override of {cls_name} must be a dict of its arguments (or None to drop "
                    f"it), e.g. {cls_name}={{...}}; got {change!r}."
                )
            cls = resolve_callback_class(cls_name)
            problem = unknown_arguments(cls, {**args, **change})
            if problem:
                raise TypeError(f"Preset {name!r}: {problem}")
            try:
                out.append(cls(**{**args, **change}))
            except Exception as err:  # named: MixUp and CutMix both have an `alpha` and a `p`
                if hasattr(err, "add_note"):  # a note keeps the error's type and attributes
                    err.add_note(f"In preset {name!r}, building its {cls_name}.")
                raise
        return out

    return Preset(name, summary, description, factory, dict(trainer or {}), requires, specs)


def to_yaml(name: str) -> str:
    """A LightningCLI config fragment for a declarative preset: its Trainer settings and ``trainer.callbacks``."""
    preset = lookup(name)
    if preset.factory is not _no_callbacks and not preset.callbacks:
        raise ValueError(f"Preset {name!r} is built by a function; only declarative presets export to YAML.")
    lines = [
        f"# lightning-speedups preset {name!r}: {preset.summary}",
        "# Use with LightningCLI: --config this.yaml (after `import lightning_speedups`), or SpeedupCLI --preset.",
        "trainer:",
    ]
    lines += [f"  {k}: {_yaml_value(v, f'trainer setting {k!r}')}" for k, v in preset.trainer.items()]
    if not preset.callbacks:
        lines.append("  callbacks: []")
    else:
        lines.append("  callbacks:")
    for cls_name, args in preset.callbacks:
        cls = resolve_callback_class(cls_name)
        if "." in cls_name:
            class_path = cls_name
        elif cls.__module__.startswith("lightning_speedups"):
            class_path = f"lightning_speedups.{cls.__name__}"
        else:
            class_path = f"lightning.pytorch.callbacks.{cls.__name__}"
        lines.append(f"    - class_path: {class_path}")
        if args:
            lines.append("      init_args:")
            lines += [f"        {k}: {_yaml_value(v, f'{cls_name}({k}=...)')}" for k, v in args.items()]
    return "\n".join(lines) + "\n"


def _as_python_scalar(value: Any) -> Any:
    """A 0-d NumPy or torch value (``np.int64(3)``, ``torch.tensor(0.4)``) as the Python number it holds; anything
    else unchanged."""
    is_array = isinstance(value, torch.Tensor) or type(value).__module__ == "numpy"
    return value.item() if is_array and getattr(value, "ndim", None) == 0 else value


def _json_default(value: Any) -> Any:
    """``json.dumps``'s fallback: 0-d NumPy and torch values inside lists and dicts, as Python numbers."""
    scalar = _as_python_scalar(value)
    if scalar is value:
        raise TypeError(f"{type(value).__name__} is not JSON serialisable")
    return scalar


def _yaml_value(value: Any, what: str) -> str:
    """``value`` as YAML (JSON is YAML): sequences stay sequences, strings are quoted and escaped, 0-d NumPy and
    torch values (which the callbacks accept) are written as the number they hold."""
    value = _as_python_scalar(value)
    if isinstance(value, float) and not math.isfinite(value):
        return "null" if math.isnan(value) else (".inf" if value > 0 else "-.inf")
    if isinstance(value, float):
        return repr(float(value))  # a float subclass (np.float64) has its own repr: np.float64(0.4)
    try:
        return json.dumps(value, default=_json_default)
    except TypeError:
        raise TypeError(
            f"Cannot write {what} = {value!r} to YAML: give it as a number, string, bool, None, list or dict."
        ) from None


def config_path(name: str) -> Path:
    """Path of the YAML config the package ships for built-in preset ``name``.

    Only a built-in preset still registered as shipped has one: for a preset registered over it
    (``overwrite=True``) the file would describe another recipe. :func:`to_yaml` writes any declarative preset's.
    """
    preset = lookup(name)
    path = CONFIG_DIR / f"{name}.yaml"
    if _BUILT_IN.get(name) is preset and path.exists():
        return path
    why = (
        "it replaced the built-in one, whose shipped file is another recipe"
        if name in _BUILT_IN
        else "only the built-in presets ship one"
    )
    if preset.callbacks or preset.factory is _no_callbacks:
        how = f"write its config with presets.to_yaml({name!r}) (or `lightning-speedups presets {name} --config`)"
    else:
        how = f"it is built by a function, which has no YAML form: use SpeedupCLI --preset {name} or presets.get()"
    raise FileNotFoundError(f"No shipped config for preset {name!r} ({why}); {how}.")


# ------------------------------------------------------------------------------------- built-in presets
register(
    Preset(
        name="baseline",
        summary="No speedup callbacks: the plain Lightning run to compare against.",
        description="Nothing added; only the recommended precision and strategy for the hardware.",
        factory=_no_callbacks,
    )
)

_WARMUP = ("LinearScalingWarmup", {"reference_batch_size": "initial", "warmup": 0.05, "warmup_unit": "fraction"})
_RESIZING = ("ProgressiveResizing", {"initial_scale": 0.5, "delay_fraction": 0.5, "finetune_fraction": 0.2})
_VISION_NOTE = (
    "Image classifiers with a `training_step` that calls cross entropy on (N, C, H, W) inputs and class-index "
    "targets; the model must accept smaller images (global pooling before the classifier)."
)

register(
    declarative(
        "vision-mild",
        "Cheaper early steps and softer targets: progressive resizing, label smoothing 0.1, LR scaling with warmup.",
        "Modelled on Composer's 'Mild' ResNet recipe, from which it takes the two methods that change what a step "
        "trains on: progressive resizing 0.5 -> 1.0 (Composer's default schedule, delay 0.5 and finetune 0.2; the "
        "recipe itself delays to 0.4) and label smoothing (0.1, the recipe 0.08); the recipe's BlurPool, EMA, "
        "channels-last, BCE loss and FixRes are left to your model. Progressive resizing trains the first half at "
        "half size, so about half the model "
        "compute is saved; label smoothing adds a small fixed cost per batch and saves no FLOPs. "
        "LinearScalingWarmup scales the learning rate "
        "with the global batch relative to the batch your script asks for on one device, so on one device it "
        "changes nothing and with N devices it ramps to N x over the first 5% of updates (Goyal et al.). "
        "Helps: convolutional classifiers whose accuracy survives low-resolution training. Hurts: models with "
        "fixed input sizes (flatten before the classifier, ViT without position interpolation), dense tasks "
        "unless `resize_targets=True`.",
        [_RESIZING, ("LabelSmoothing", {"smoothing": 0.1}), _WARMUP],
        requires=_VISION_NOTE,
    )
)
register(
    declarative(
        "vision-medium",
        "vision-mild plus MixUp (alpha 0.2): more regularisation, for longer schedules.",
        "Modelled on Composer's 'Medium' ResNet recipe, which adds MixUp (alpha 0.2, as here) and SAM to the mild "
        "one; SAM, an optimizer-side method, is not part of this pack. MixUp regularises: it pays off on schedules "
        "long enough to overfit and can lower accuracy on short ones.",
        [_RESIZING, ("LabelSmoothing", {"smoothing": 0.1}), ("MixUp", {"alpha": 0.2}), _WARMUP],
        requires=_VISION_NOTE,
    )
)
register(
    declarative(
        "vision-aggressive",
        "vision-medium plus CutMix, with dropout removed: the strongest data regularisation, for long schedules.",
        "Adds CutMix (alpha 1.0) to the medium recipe; MixUp and CutMix each act on half the batches (a batch "
        "may get both; its targets stay exact mixtures). DropoutRemoval switches off every dropout from the "
        "start (convolutional recipes in Composer, FFCV and airbench use none), which also makes steps cheaper. "
        "Helps: long schedules on models that overfit. Hurts: short schedules, where the extra regularisation "
        "costs accuracy.",
        [
            _RESIZING,
            ("LabelSmoothing", {"smoothing": 0.1}),
            ("MixUp", {"alpha": 0.2, "p": 0.5}),
            ("CutMix", {"alpha": 1.0, "p": 0.5}),
            ("DropoutRemoval", {"start": 0.0}),
            _WARMUP,
        ],
        requires=_VISION_NOTE,
    )
)
register(
    declarative(
        "long-tail",
        "Oversample rare classes: LVIS repeat-factor sampling (threshold 0.001).",
        "Each sample is repeated max(1, sqrt(t / f)) times per epoch in expectation, f being the frequency of its "
        "rarest class (Gupta et al., LVIS). On a balanced dataset every factor is 1 and nothing changes. Helps: "
        "long-tailed classification and detection (rare-class accuracy). Hurts: epochs get longer by the mean "
        "repeat factor, shown at fit start.",
        [("RepeatFactorSampling", {"threshold": 0.001})],
        requires="A SpeedupDataModule with `train_labels` (or `sample_labels()`): one class id or list per sample.",
    )
)
register(
    declarative(
        "curriculum",
        "Easiest samples first: a linear pacing from 20% of the data to all of it at half the run.",
        "CurriculumOrdering with Wu et al.'s linear pacing (start_fraction 0.2, full_at 0.5), difficulty from the "
        "datamodule. Wu et al. (ICLR 2021) found curricula help mainly on noisy labels and short budgets; "
        "on clean data with a full schedule expect no gain.",
        [("CurriculumOrdering", {"pacing": "linear", "start_fraction": 0.2, "full_at": 0.5})],
        requires="A SpeedupDataModule with `train_difficulty` (or `sample_difficulty()`): one score per sample.",
    )
)
register(
    declarative(
        "large-batch",
        "The largest batch that fits (Lightning's BatchSizeFinder), with the LR scaled linearly and warmed up.",
        "BatchSizeFinder doubles the batch from 2 until memory runs out or the batch exceeds the dataset; "
        "LinearScalingWarmup then multiplies the learning rate by found batch / the batch your script asked for, "
        "reached over the first 5% of updates (Goyal et al.: ResNet-50 at batch 8k matched batch 256). Helps: "
        "throughput on accelerators with memory to spare. Hurts: beyond the batch sizes where the linear rule "
        "holds, and small datasets (few updates per epoch). Runs on one device: Lightning's BatchSizeFinder refuses "
        "distributed strategies; find the batch here, then give it to a multi-device run with LinearScalingWarmup. "
        "To resume from a checkpoint, drop the finder (`BatchSizeFinder=None`) and set the batch it found: Lightning's "
        "finder would discard the checkpoint's training state (LinearScalingWarmup refuses that combination). "
        "Lightning builds the schedulers before the search: a schedule sized from `estimated_stepping_batches` keeps "
        "the length it had at the batch asked for; for one, find the batch first, then train without the finder.",
        [("BatchSizeFinder", {"mode": "power", "steps_per_trial": 3}), _WARMUP],
        requires="A `batch_size` attribute on the LightningModule or the DataModule (SpeedupDataModule has one); "
        "one device (Lightning's BatchSizeFinder refuses distributed runs).",
    )
)

# config_path: a shipped YAML describes these objects; a preset registered over one of them has none
_BUILT_IN: dict[str, Preset] = dict(_REGISTRY)
