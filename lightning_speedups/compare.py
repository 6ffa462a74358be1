"""``lightning-speedups compare``: train a baseline and a recipe side by side, and show what the recipe buys.

Three arms, run in turn for each repeat (repeats interleave, and the first two swap places every other repeat,
so machine noise hits every arm alike; the recipe goes first in the first repeat, so a recipe that cannot run
on the user's model fails before the baseline has spent minutes training):

1. **baseline**: the model as configured, no callbacks;
2. **the recipe**: a preset (or a list of callbacks);
3. **baseline at the recipe's budget**: the baseline with its schedule shortened (``max_steps``) to the recipe's
   counted training FLOPs, and validated at its last step. A speedup that a shorter schedule alone gives is no
   speedup; this arm shows it.

Every arm records, at each validation, wall time, CPU time (with DataLoader workers'), counted training FLOPs,
steps and the validation metric (:class:`~lightning_speedups.meter.TrainingMeter`). The target defaults to the
baseline's final metric (the lower median over repeats, so that a majority of baseline runs reach it); the time,
CPU time and FLOPs to reach it are medians over every repeat, a run that missed the target counting as never
reaching it.
"""

from __future__ import annotations

import ast
import contextlib
import importlib
import importlib.util
import json
import logging
import math
import os
import re
import signal
import statistics
import sys
import traceback
import warnings
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, TextIO

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities import rank_zero_only
from lightning.pytorch.utilities.exceptions import MisconfigurationException, SIGTERMException

from lightning_speedups import presets
from lightning_speedups.meter import Checkpoint, MissingMetricError, TrainingMeter

BASELINE, BUDGET = "baseline", "baseline @ recipe FLOPs"
REPORT_FILES = ("report.md", "results.json", "accuracy.png")
DEFAULT_PRESET = "vision-mild"


class CompareError(Exception):
    """A problem with the user's request: printed as a message, not a traceback."""


@dataclass
class CompareConfig:
    """What to compare; the CLI flags of ``lightning-speedups compare`` map one to one onto these fields."""

    preset: str | None = None  # None: DEFAULT_PRESET, unless callbacks are given
    callbacks: list[str] = field(default_factory=list)
    without: list[str] = field(default_factory=list)  # class names of the preset's callbacks to leave out
    model: str | None = None
    datamodule: str | None = None
    model_args: dict[str, Any] = field(default_factory=dict)
    datamodule_args: dict[str, Any] = field(default_factory=dict)
    accelerator: str = "auto"
    devices: int = 1
    precision: str | None = None  # None: the recommended one for the accelerator (bf16-mixed on recent CUDA)
    max_epochs: int = 12
    target: float | None = None
    metric: str = "val_acc"
    seed: int = 0
    repeats: int = 3
    output: Path | None = Path("compare-output")
    budget_baseline: bool = True
    progress: bool = True


@dataclass
class RunResult:
    arm: str
    repeat: int
    history: list[Checkpoint]
    flops: float
    steps: int
    batch_size: int | None = None  # the datamodule's at the end (a BatchSizeFinder may have changed it)
    uncounted: dict[str, str] = field(default_factory=dict)  # modules the FLOP counter counted nothing for
    flops_vary: bool = False  # some batch shape's steps differed in FLOPs: counted every 8th step, an estimate

    @property
    def final(self) -> float:
        return self.history[-1].metric if self.history else float("nan")

    @property
    def wall(self) -> float:
        return self.history[-1].wall if self.history else float("nan")

    @property
    def cpu(self) -> float:
        return self.history[-1].cpu if self.history else float("nan")

    def to_target(self, target: float) -> Checkpoint | None:
        """The first validation at or above ``target`` (MLPerf's "first reached").

        Compared in float32, the precision metrics are logged in: 9 of 10 correct is logged as 0.89999998, which
        must reach a ``--target 0.9``."""
        goal = _float32(target)
        return next((c for c in self.history if _float32(c.metric) >= goal), None)


@dataclass
class ArmSummary:
    arm: str
    runs: int
    final: float
    wall: float
    cpu: float
    flops: float
    steps: float
    reached: int
    wall_to_target: float | None
    cpu_to_target: float | None
    flops_to_target: float | None
    steps_to_target: float | None = None
    speedup_wall: float | None = None
    speedup_cpu: float | None = None
    speedup_flops: float | None = None


@dataclass
class Report:
    config: dict[str, Any]
    recipe: str
    target: float
    summaries: list[ArmSummary]
    runs: list[RunResult]

    def summary(self, arm: str) -> ArmSummary | None:
        return next((s for s in self.summaries if s.arm == arm), None)


# ------------------------------------------------------------------------------------------ loading
def _current_folder_on_path() -> None:
    """Modules of the current folder importable: the console script, unlike `python -m`, does not put it on the
    path (``--model``, ``--datamodule`` and ``--callback`` import paths are looked for there)."""
    if "" not in sys.path and str(Path.cwd()) not in sys.path:
        sys.path.insert(0, str(Path.cwd()))


def load_object(path: str, what: str) -> Any:
    """``package.module:Name`` or ``package.module.Name`` -> the object, with a clear error otherwise."""
    module_name, sep, attr = path.partition(":")
    if not sep and path.endswith(".py"):  # `my_module.py` would split into module `my_module`, attribute `py`
        module_name = path
    elif not sep:
        module_name, _, attr = path.rpartition(".")
    if module_name.endswith(".py") or "/" in module_name or "\\" in module_name:
        raise CompareError(
            f"--{what} {path!r} is a file path; give the module's import path instead, e.g. 'my_module:MyClass' "
            "for my_module.py in the current folder."
        )
    if not module_name or not attr:
        raise CompareError(f"--{what} {path!r} is not an import path like 'my_package.my_module:MyClass'.")
    _current_folder_on_path()
    try:
        module = importlib.import_module(module_name)
    except (ImportError, TypeError, ValueError) as err:  # TypeError/ValueError: relative or empty names
        where = (
            " It is looked for in the current folder and on PYTHONPATH: run from the folder that holds it, or "
            "add that folder to PYTHONPATH."
            if isinstance(err, ModuleNotFoundError)
            else ""
        )
        raise CompareError(f"--{what} {path!r}: cannot import module {module_name!r} ({err}).{where}") from err
    except Exception as err:  # the module itself fails at import: a SyntaxError, NameError, RuntimeError...
        raise CompareError(
            f"--{what} {path!r}: importing module {module_name!r} failed with {type(err).__name__}: {err}; "
            f"fix the module (`python -c 'import {module_name}'` shows the traceback)."
        ) from err
    except SystemExit as err:  # a training script's top level run on import: its argparse or sys.exit
        raise CompareError(_exits_on_import(f"--{what} {path!r}", module_name, err)) from err
    try:
        return getattr(module, attr)
    except AttributeError as err:
        raise CompareError(f"--{what} {path!r}: module {module_name!r} has no attribute {attr!r}.") from err


def _exits_on_import(flag: str, module_name: str, err: SystemExit) -> str:
    """The message for a module that calls ``sys.exit`` (or parses the command line) as it is imported."""
    return (
        f"{flag}: importing module {module_name!r} called sys.exit({err.code!r}): its top level runs a script "
        '(parses the command line, trains, exits). Put that under `if __name__ == "__main__":` so that '
        "importing it only defines the classes."
    )


def _split_args(spec: str, text: str) -> list[str]:
    """``"a=[0, 1],b='x,y'"`` -> ``["a=[0, 1]", "b='x,y'"]``: split on commas outside brackets and quotes, so a
    value can be a list, tuple, dict or quoted string. A bracket or quote only opens one at the start of a value
    (or inside one already open): a plain string such as ``name=it's`` or ``tag=a(b`` stays a plain string."""
    items, depth, quote, start = [], 0, "", 0
    at_value_start = False
    for i, char in enumerate(text):
        if quote:
            quote = "" if char == quote else quote
        elif char in "'\"" and (at_value_start or depth > 0):
            quote = char
        elif char in "([{" and (at_value_start or depth > 0):
            depth += 1
        elif char in ")]}" and depth > 0:
            depth -= 1
        elif char == "," and depth == 0:
            items.append(text[start:i])
            start = i + 1
        if not char.isspace():
            at_value_start = char == "=" and depth == 0 and not quote
    if depth != 0 or quote:
        raise CompareError(f"--callback {spec!r}: unbalanced brackets or quotes in the arguments {text!r}.")
    items.append(text[start:])
    return [item.strip() for item in items if item.strip()]


def parse_callback(spec: str) -> Callback:
    """``"MixUp"`` or ``"MixUp:alpha=0.4,p=0.5"`` -> a callback instance; values are Python literals (lists and
    tuples included) or, failing that, plain strings."""
    cls, kwargs = _parse_spec(spec)
    try:
        return cls(**kwargs)
    except (TypeError, ValueError) as err:
        raise CompareError(f"--callback {spec!r}: {err}") from err
    except Exception as err:  # the user's own class refusing in its way (a RuntimeError, a KeyError)
        raise CompareError(f"--callback {spec!r}: {cls.__name__}(...) raised {type(err).__name__}: {err}") from err


def _parse_spec(spec: str) -> tuple[type[Callback], dict[str, Any]]:
    """``"MixUp:alpha=0.4"`` -> ``(MixUp, {"alpha": 0.4})``, the arguments checked against the class's."""
    name, _, arg_text = spec.partition(":")
    head, _, rest = arg_text.partition(":")
    _current_folder_on_path()
    try:
        try:
            cls = presets.resolve_callback_class(name.strip())
        except ValueError:
            if not head.strip().isidentifier():
                raise
            # `package.module:Class[:args]`, as --model takes it
            cls = presets.resolve_callback_class(f"{name.strip()}.{head.strip()}")
            arg_text = rest
    except ValueError as err:
        where = (
            " Modules are looked for in the current folder and on PYTHONPATH."
            if isinstance(err.__cause__, ModuleNotFoundError)
            else ""
        )
        raise CompareError(_sentence(f"--callback {spec!r}: {err}") + where) from err
    except Exception as err:  # the callback's module failed as it was imported (a SyntaxError, say)
        raise CompareError(f"--callback {spec!r}: importing it raised {type(err).__name__}: {err}") from err
    except SystemExit as err:
        raise CompareError(_exits_on_import(f"--callback {spec!r}", name.strip(), err)) from err
    kwargs: dict[str, Any] = {}
    for item in _split_args(spec, arg_text):
        key, eq, raw = item.partition("=")
        if not eq:
            raise CompareError(f"--callback {spec!r}: arguments look like 'name=value', got {item!r}.")
        raw = raw.strip()
        if raw.lower() in ("true", "false"):  # YAML's and the shell's spelling of Python's True and False
            kwargs[key.strip()] = raw.lower() == "true"
            continue
        try:
            kwargs[key.strip()] = ast.literal_eval(raw)
        except (ValueError, SyntaxError):
            kwargs[key.strip()] = raw
    problem = presets.unknown_arguments(cls, kwargs)
    if problem:  # named after the class asked for, not the base class whose __init__ would refuse it
        raise CompareError(f"--callback {spec!r}: {problem}")
    return cls, kwargs


def _factories(cfg: CompareConfig) -> tuple[Callable[[], pl.LightningModule], Callable[[], pl.LightningDataModule]]:
    if (cfg.model is None) != (cfg.datamodule is None):
        raise CompareError("Give both --model and --datamodule (or neither, for the embedded digits task).")
    if cfg.model is None:
        from lightning_speedups.demo import DigitsDataModule, ImageClassifier

        model_cls: Any = ImageClassifier
        dm_cls: Any = DigitsDataModule
    else:
        model_cls = load_object(cfg.model, "model")
        dm_cls = load_object(cfg.datamodule, "datamodule")
        if not (isinstance(model_cls, type) and issubclass(model_cls, pl.LightningModule)):
            raise CompareError(f"--model {cfg.model!r} is not a LightningModule class.")
        if not (isinstance(dm_cls, type) and issubclass(dm_cls, pl.LightningDataModule)):
            raise CompareError(f"--datamodule {cfg.datamodule!r} is not a LightningDataModule class.")

    def make(cls: Any, args: dict[str, Any], what: str) -> Any:
        try:
            return cls(**args)
        except TypeError as err:
            where = _raised_at(err)  # a TypeError inside the user's __init__, not a wrong keyword
            hint = (
                f" Pass its arguments with --{what}-args '{{\"name\": value}}' (JSON)."
                if not where and ("argument" in str(err))
                else ""
            )
            raise CompareError(
                _sentence(f"Could not build the {what} {cls.__name__}({_fmt(args)}): {err}{where}") + hint
            ) from err

    return (lambda: make(model_cls, cfg.model_args, "model")), (lambda: make(dm_cls, cfg.datamodule_args, "datamodule"))


def _fmt(args: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v!r}" for k, v in args.items())


def _recipe(cfg: CompareConfig) -> tuple[str, Callable[[], list[Callback]], dict[str, Any]]:
    """(label, callbacks factory, extra trainer settings) of the arm under test."""
    if cfg.preset is not None and not cfg.preset.strip():
        raise CompareError(
            f"--preset needs a preset's name, got {cfg.preset!r}; `lightning-speedups presets` lists them."
        )
    for spec in cfg.callbacks:  # fail on bad specs now, not after the baseline trained
        parse_callback(spec)
    if cfg.callbacks and cfg.preset in (None, BASELINE):  # the baseline plus callbacks: those callbacks
        if cfg.without:
            raise CompareError("--without leaves callbacks out of a preset; without one, list the callbacks you want.")
        return "callbacks: " + ", ".join(cfg.callbacks), lambda: [parse_callback(s) for s in cfg.callbacks], {}
    name = cfg.preset or DEFAULT_PRESET
    if name == BASELINE:
        raise CompareError("--preset baseline would compare the baseline with itself; pick another preset.")
    try:
        overrides, added = _preset_overrides(name, cfg.callbacks)
        recipe = presets.get(name, accelerator=cfg.accelerator, devices=cfg.devices, **overrides)
    except presets.UnknownPresetError as err:
        raise CompareError(str(err)) from err
    except TypeError as err:  # a function preset whose factory refused (e.g. a missing argument)
        raise CompareError(f"preset {name!r} could not build its callbacks: {type(err).__name__}: {err}") from err
    except ValueError as err:  # a bad argument, or a recipe these devices cannot run: its own message says which
        hint = ""
        if "BatchSizeFinder" in str(err):  # its fix is Python's (`presets.get(...)`); compare's is another
            hint = " With compare: run it with --devices 1 (the finder searches in one process only)."
        raise CompareError(f"preset {name!r}: {err}{hint}") from err
    # The recommended accelerator, devices, precision and strategy are every arm's (one setting for all, so the
    # comparison is fair); a precision or strategy the preset itself fixes is part of the recipe, and stays.
    own = presets.lookup(name).trainer
    shared = {"accelerator", "devices"} | ({"precision", "strategy"} - set(own))
    extra = {k: v for k, v in recipe.trainer_kwargs.items() if k not in shared}

    def callbacks() -> list[Callback]:  # a fresh set per run
        built = presets.get(name, accelerator=cfg.accelerator, devices=cfg.devices, **overrides)
        kept = [cb for cb in built.callbacks if type(cb).__name__ not in cfg.without]
        return replace(built, callbacks=kept).with_callbacks([parse_callback(s) for s in added])

    has = {type(cb).__name__ for cb in recipe.callbacks}
    unknown = [n for n in cfg.without if n not in has]
    if unknown:  # a typo would leave the callback in, unsaid
        raise CompareError(
            f"--without {', '.join(unknown)}: preset {name!r} has no such callback; its callbacks: "
            f"{', '.join(sorted(has)) or 'none'}."
        )
    label = name + "".join(f" - {n}" for n in cfg.without) + (f" + {', '.join(cfg.callbacks)}" if cfg.callbacks else "")
    return label, callbacks, extra


def _preset_overrides(name: str, specs: Sequence[str]) -> tuple[dict[str, dict[str, Any]], list[str]]:
    """``--callback`` specs for preset ``name``: those of a class the (declarative) preset has become overrides of
    that callback's arguments, ``{spec name: {arg: value}}`` as :func:`presets.get` takes them, so the preset's
    other arguments stay (``LinearScalingWarmup:warmup=0.1`` keeps ``reference_batch_size='initial'``); the
    others are added as callbacks."""
    preset_specs = [spec_name for spec_name, _ in presets.lookup(name).callbacks]
    classes = {}
    for spec_name in preset_specs:
        try:
            classes[spec_name] = presets.resolve_callback_class(spec_name)
        except ValueError:  # checked when the preset was registered: a class that moved since, say
            continue
    overrides: dict[str, dict[str, Any]] = {}
    added: list[str] = []
    for spec in specs:
        cls, kwargs = _parse_spec(spec)
        slot = next((n for n, c in classes.items() if c is cls), None)
        if slot is None:
            added.append(spec)
        elif slot in overrides:
            raise CompareError(
                f"--callback {spec!r}: the preset's {slot} was changed by an earlier --callback already; give its "
                "arguments in one --callback."
            )
        else:
            overrides[slot] = kwargs
    return overrides, added


def _measure_at_full_size(callbacks: list[Callback]) -> list[Callback]:
    """Validate every arm at full size: ProgressiveResizing's default validation at the training scale reads
    the accuracy of the small-image model, which would flatter the time to target."""
    from lightning_speedups import ProgressiveResizing

    for cb in callbacks:
        if isinstance(cb, ProgressiveResizing):
            cb.validation = cb.val_remedy = "full"
    return callbacks


#: Trainer settings compare sets for every arm, which a preset's own settings do not change
_COMPARES_OWN = frozenset(
    {
        "max_epochs",
        "max_steps",
        "callbacks",
        "logger",
        "enable_checkpointing",
        "enable_progress_bar",
        "enable_model_summary",
        "num_sanity_val_steps",
    }
)


def _precisions() -> dict[str, str]:
    """What ``Trainer(precision=...)`` takes, each with its canonical name: Lightning's own list and its short
    names ("32" is "32-true", "bf16" is "bf16-mixed")."""
    try:
        from typing import get_args

        from lightning.fabric.plugins.precision import precision as lp

        names = {name: name for name in get_args(lp._PRECISION_INPUT_STR)}
        return {**names, **lp._PRECISION_INPUT_STR_ALIAS_CONVERSION}
    except (ImportError, AttributeError):  # another Lightning: its own check, at the first run, says
        return {}


#: how far outside [0, 1] a logged accuracy may be (float32 rounding of a mean) before it is taken for another scale
_METRIC_SLACK = 1e-4

#: the largest seed `seed_everything` takes (NumPy's)
_MAX_SEED = 2**32 - 1


def _check(cfg: CompareConfig) -> None:
    if cfg.target is not None and not 0.0 < cfg.target <= 1.0:
        hint = f" (a percentage? --target {cfg.target / 100!r})" if 10.0 <= cfg.target <= 100.0 else ""
        raise CompareError(f"--target must be in (0, 1] (an accuracy, as a fraction), got {cfg.target!r}{hint}.")
    if cfg.repeats < 1:
        raise CompareError(f"--repeats must be >= 1, got {cfg.repeats}.")
    if not 0 <= cfg.seed <= _MAX_SEED - (cfg.repeats - 1):  # repeat r runs with seed + r
        raise CompareError(
            f"--seed must be in [0, {_MAX_SEED - (cfg.repeats - 1)}] with --repeats {cfg.repeats} (repeat r uses "
            f"seed + r, and seeds go up to {_MAX_SEED}), got {cfg.seed}."
        )
    if cfg.max_epochs < 1:
        raise CompareError(f"--max-epochs must be >= 1, got {cfg.max_epochs}.")
    if cfg.devices < 1:
        raise CompareError(f"--devices must be >= 1, got {cfg.devices}.")
    known = _precisions()
    if cfg.precision is not None and known and cfg.precision not in known:
        canonical = sorted(set(known.values()))
        raise CompareError(f"--precision must be one of {', '.join(canonical)}, got {cfg.precision!r}.")
    if _lower_is_better(cfg.metric):
        raise CompareError(
            f"--metric {cfg.metric!r} looks like a lower-is-better metric; compare reads the metric as higher "
            "is better (an accuracy: the target is reached at or above it). Log an accuracy and name it."
        )


#: words of metric names that are lower-is-better: whole words (``val_err``, ``val/mse``) or inside a name
_LOWER_IS_BETTER_WORDS = frozenset({"err", "mse", "mae", "rmse", "nll", "ppl", "wer", "cer", "bpd", "bpc", "ce"})
_LOWER_IS_BETTER_PARTS = ("loss", "error", "perplexity", "distance", "regret")


def _lower_is_better(metric: str) -> bool:
    name = metric.lower()
    return any(part in name for part in _LOWER_IS_BETTER_PARTS) or bool(
        _LOWER_IS_BETTER_WORDS & set(re.split(r"[^a-z0-9]+", name))
    )


def _make_folders(output: Path) -> list[Path]:
    """Make ``output`` and its missing parents, outermost first, one level at a time; those made, innermost
    first. By the path as given, not as it resolves: ``new/../pre`` needs ``new`` (made, and listed), while
    ``pre``, there before, is not listed (``Path.exists`` says False of a path through a missing folder)."""
    made: list[Path] = []
    try:
        for folder in reversed((output, *output.parents)):
            if not folder.exists():
                try:
                    folder.mkdir()
                except FileExistsError:  # made meanwhile by someone else: not ours to remove
                    continue
                made.insert(0, folder)
    except BaseException:  # a level it cannot make (a file in the way, a name too long): none left behind
        _remove_folders(made)
        raise
    return made


def _remove_folders(folders: list[Path]) -> None:
    """Remove ``folders`` (innermost first) where they are still empty."""
    for folder in folders:
        with contextlib.suppress(OSError):  # not empty (something else wrote there), or gone already
            folder.rmdir()


def _check_output(output: Path) -> list[Path]:
    """Make ``output`` and write a probe file there now, not after the training: a folder that cannot hold the
    report must not cost the runs. Returns the folders it made (innermost first), for a failed run to remove."""
    probe = output / f".lightning-speedups-probe-{os.getpid()}"
    made: list[Path] = []
    try:
        made = _make_folders(output)
        probe.write_bytes(b"")
        probe.unlink()
        for name in REPORT_FILES:
            if (output / name).exists() and not (output / name).is_file():
                raise IsADirectoryError(f"{str(output / name)!r} is in the way of the report's {name}")
    except (OSError, ValueError) as err:  # ValueError: a NUL in the path
        _remove_folders(made)
        raise CompareError(
            f"--output {str(output)!r} cannot be a folder for the report ({err}); give a writable folder."
        ) from err
    return made


# ------------------------------------------------------------------------------------------ running
class _Progress(Callback):
    """One progress bar over every epoch of every run: each run moves it by one per validation, ``max_epochs`` at
    most, and :meth:`finish` tops it up to ``max_epochs`` (a shortened run validates fewer times, a model may
    validate more often or skip some epochs)."""

    def __init__(self, bar: Any, epochs: int) -> None:
        self.bar, self.epochs, self.done = bar, epochs, 0

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not trainer.sanity_checking and self.bar is not None and self.done < self.epochs:
            self.bar.update(1)
            self.done += 1

    def finish(self) -> None:
        if self.bar is not None and self.done < self.epochs:
            self.bar.update(self.epochs - self.done)
            self.done = self.epochs


class _ValidateAtBudget(Callback):
    """End a ``max_steps`` run through ``should_stop``, so Lightning validates at the last step even mid-epoch
    (a plain ``max_steps`` stop skips that validation, and the run's last figures would be a part-epoch old)."""

    def __init__(self, max_steps: int) -> None:
        self.max_steps = max_steps

    def on_train_batch_end(self, trainer: pl.Trainer, *args: Any) -> None:
        if trainer.global_step >= self.max_steps:
            trainer.should_stop = True


def _run(
    arm: str,
    repeat: int,
    cfg: CompareConfig,
    make_model: Callable[[], pl.LightningModule],
    make_dm: Callable[[], pl.LightningDataModule],
    callbacks: list[Callback],
    extra: dict[str, Any],
    bar: Any,
    max_steps: int = -1,
    warmup: bool = False,
) -> RunResult:
    pl.seed_everything(cfg.seed + repeat, verbose=False)
    # the untimed warm-up's 2 steps validate once: a model that logs the metric in some epochs only may not there
    meter = TrainingMeter(cfg.metric, require_metric=not warmup)
    if bar is not None:
        bar.set_description(f"repeat {repeat + 1}/{cfg.repeats} · {arm}")
    budget = [_ValidateAtBudget(max_steps)] if max_steps > 0 else []
    progress = _Progress(bar, 0 if warmup else cfg.max_epochs)
    try:
        # compare's own settings (the run's length, its callbacks, no logger or checkpoints) are every arm's; the
        # recommended precision and strategy give way to those a preset fixes, with its other settings
        settings: dict[str, Any] = {
            "accelerator": cfg.accelerator,
            "devices": cfg.devices,
            "strategy": presets.recommended_strategy(cfg.devices, cfg.accelerator),
            "precision": cfg.precision or presets.recommended_precision(cfg.accelerator),
            **{k: v for k, v in extra.items() if k not in _COMPARES_OWN},
        }
        trainer = pl.Trainer(
            max_epochs=cfg.max_epochs,
            max_steps=max_steps,
            callbacks=[*callbacks, *budget, meter, progress],
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            num_sanity_val_steps=0,
            **settings,
        )
        sigint = signal.getsignal(signal.SIGINT)
        try:
            datamodule = make_dm()
            trainer.fit(make_model(), datamodule=datamodule)
        except SystemExit as err:
            # Lightning turns Ctrl-C inside `fit` into `sys.exit(1)` (raised while it handles the
            # KeyboardInterrupt), its notice silenced here, and leaves Ctrl-C ignored: say it was interrupted (the
            # command's status 130), with Ctrl-C as it was. Any other exit is the user's code calling sys.exit.
            if trainer.interrupted and (
                isinstance(err.__context__, KeyboardInterrupt) or isinstance(err, SIGTERMException)
            ):  # Ctrl-C, or a SIGTERM (a `timeout`, a scheduler), which Lightning raises as a SystemExit too
                with contextlib.suppress(ValueError, TypeError):  # not the main thread; a handler set from C
                    signal.signal(signal.SIGINT, sigint)
                raise KeyboardInterrupt from None
            raise CompareError(
                _sentence(f"the {arm!r} run stopped: the code it ran called sys.exit({err.code!r}){_raised_at(err)}")
            ) from err
    except MissingMetricError as err:
        # e.g. the shortened baseline, ended before the first epoch in which the model logs the metric
        raise CompareError(
            f"the {arm!r} run ({trainer.global_step} steps, to epoch {trainer.current_epoch}): {err} compare needs "
            "it at every validation (a model that logs it in some epochs only may miss it in a short run); "
            "`--metric NAME` compares another."
        ) from err
    except (ValueError, TypeError, ImportError, RuntimeError, MisconfigurationException) as err:
        # a setting that does not fit the user's model, data or machine (our callbacks and Lightning raise these
        # up front, at construction or fit start), or a recipe the model cannot take (a fixed input size under
        # resizing): say which run it stopped and where, without a traceback
        notes = "".join(f" {note}" for note in getattr(err, "__notes__", []))  # e.g. which callback is behind it
        if (not cfg.callbacks or cfg.preset not in (None, BASELINE)) and arm not in (BASELINE, BUDGET):  # a preset's
            notes += (
                " If a callback of the preset does not suit your model, change its arguments with "
                "`--callback Name:arg=value` (those given change, a declarative preset's others stay), leave it out "
                "with `--without Name`, or list your own with --callback alone "
                f"(`lightning-speedups presets {cfg.preset or DEFAULT_PRESET}` shows the preset's)."
            )
        raise CompareError(
            _sentence(f"the {arm!r} run could not start or stopped: {_error_text(err)}{_raised_at(err)}") + notes
        ) from err
    except CompareError:
        raise  # ours, already a message (the model or datamodule could not be built)
    except Exception as err:  # anything else the user's model or data raised (a KeyError in a step, say)
        notes = "".join(f" {note}" for note in getattr(err, "__notes__", []))
        line = getattr(_user_frame(err), "line", None) or ""
        # the hint only where the failed attribute is read from a logger on the user's line (`self.logger.x`)
        # (an AttributeError rebuilt from a DataLoader worker's has no name: no hint, whatever its line reads)
        name = str(getattr(err, "name", "") or "")
        used = rf"\bloggers?\s*(\[[^\]]*\])?\s*\.\s*{re.escape(name)}\b"
        if isinstance(err, AttributeError) and name and "'NoneType'" in str(err) and re.search(used, line):
            notes += (
                " compare trains without a logger, so `self.logger` is None there: guard its use with "
                "`if self.logger is not None`."
            )
        raise CompareError(_sentence(f"the {arm!r} run stopped: {_error_text(err)}{_raised_at(err)}") + notes) from err
    if not meter.history and not (warmup and meter.validations):
        # no metric to compare: the table would be all NaN, and results.json invalid JSON
        raise CompareError(
            f"the {arm!r} run never validated: does the datamodule give validation data (a `val_dataloader` "
            "with batches) and the model a `validation_step` that logs the metric?"
        )
    # NaN: a run that diverged, not a scale; an infinite value is no accuracy (a loss, a perplexity): refused
    metrics = [c.metric for c in meter.history if not math.isnan(c.metric)]
    outside = next((m for m in metrics if not -_METRIC_SLACK <= m <= 1.0 + _METRIC_SLACK), None)
    if outside is not None:
        # a percentage: a target given as a fraction (all --target takes) would be met at the first validation
        raise CompareError(
            f"the {arm!r} run logged {cfg.metric}={outside:g}, outside [0, 1]: compare reads the metric as an "
            "accuracy, a fraction (the --target it takes is one too). Log the fraction (`acc`, not `acc * 100`), "
            "or name another metric with `--metric NAME`."
        )
    if warmup and not meter.history and meter.missing and rank_zero_only.rank == 0:
        # a misnamed metric would stop the first timed run only at its end: say it before the timed runs start
        print(
            f"compare, in its untimed warm-up run: {meter.missing} If your model never logs it, stop now (Ctrl-C) "
            "and pass `--metric NAME`; one that logs it in later epochs only can go on.",
            file=sys.stderr,
            flush=True,
        )
    progress.finish()
    batch_size = getattr(datamodule, "batch_size", None)
    return RunResult(
        arm=arm,
        repeat=repeat,
        history=list(meter.history),
        flops=meter.flops,
        steps=trainer.global_step,
        batch_size=batch_size if isinstance(batch_size, int) and not isinstance(batch_size, bool) else None,
        uncounted=dict(meter.uncounted),
        flops_vary=bool(meter.varying),
    )


def _module_dir(name: str) -> str | None:
    spec = importlib.util.find_spec(name)
    return str(Path(spec.origin).resolve().parent) if spec is not None and spec.origin else None


#: Where the frames of an error are not the user's: this package (wherever it is installed from), the frameworks
#: it runs, and the standard library.
_NOT_USERS = tuple(
    d + os.sep
    for d in [
        str(Path(__file__).resolve().parent),
        *(
            _module_dir(m)
            for m in (
                "torch",
                "lightning",
                "lightning_fabric",
                "lightning_utilities",
                "pytorch_lightning",
                "torchmetrics",
                "torchvision",
            )
        ),
    ]
    if d
)
_STDLIB = str(Path(os.__file__).resolve().parent) + os.sep
_INSTALLED = ("site-packages", "dist-packages")


def _sentence(text: str) -> str:
    """``text`` ending with one full stop (an error's own message may end with one already)."""
    text = text.rstrip()
    return text if text.endswith((".", "!", "?")) else text + "."


def _user_frame(err: BaseException) -> traceback.FrameSummary | None:
    """The innermost frame of the user's code in ``err``'s traceback (for an error in a DataLoader worker, the
    worker's traceback that torch puts in the message): outside this package, the frameworks and the standard
    library, preferring one outside installed packages (a model installed as a package is the user's too, when
    nothing else is); None where there is none (our callbacks' and Lightning's own errors say what is wrong in
    their message)."""
    worker = _worker_error(err)
    frames = []
    for f in traceback.extract_tb(err.__traceback__) if worker is None else worker[1]:
        path = str(Path(f.filename).resolve())
        installed = any(part in path for part in _INSTALLED)
        if path.startswith(_NOT_USERS) or (path.startswith(_STDLIB) and not installed) or f.filename[:1] == "<":
            continue
        frames.append((installed, f))
    local = [f for installed, f in frames if not installed]
    return (local or [f for _, f in frames] or [None])[-1]


_WORKER_HEADER = re.compile(r"Caught (\w+) in (DataLoader worker process \d+)\.\s*\nOriginal Traceback")
_FRAME_LINE = re.compile(r'^  File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<name>.+)$')


def _worker_error(err: BaseException) -> tuple[str, list[traceback.FrameSummary]] | None:
    """For an error raised in a DataLoader worker (torch re-raises it in the main process with the worker's whole
    traceback as its message): ``(its last line plus which worker, the worker's frames)``; None for any other."""
    text = str(err.args[0]) if len(err.args) == 1 else ""
    header = _WORKER_HEADER.match(text)
    if header is None:
        return None
    lines = text.splitlines()
    frames, last = [], 0
    for i, line in enumerate(lines):
        match = _FRAME_LINE.match(line)
        if match:
            code = lines[i + 1].strip() if i + 1 < len(lines) and lines[i + 1].startswith("    ") else None
            frames.append(traceback.FrameSummary(match["file"], int(match["line"]), match["name"], line=code))
            last = i
    # the exception's own lines: the first unindented line after the last frame, and the rest
    rest = lines[last + 1 :]
    start = next((i for i, line in enumerate(rest) if line and not line[0].isspace()), len(rest))
    message = " ".join(line.strip() for line in rest[start:] if line.strip()) or header[1]
    return f"{message} (in {header[2]})", frames


def _error_text(err: BaseException) -> str:
    """``"Type: message"``, the message of an error in a DataLoader worker cut to its last line, not torch's
    multi-line traceback (whose frame in the user's code :func:`_raised_at` names)."""
    worker = _worker_error(err)
    return f"{type(err).__name__}: {err}" if worker is None else worker[0]


def _raised_at(err: BaseException) -> str:
    """`` (raised at file:line, in function)`` for :func:`_user_frame`; empty without one."""
    frame = _user_frame(err)
    return "" if frame is None else f" (raised at {frame.filename}:{frame.lineno}, in {frame.name})"


@contextlib.contextmanager
def _quiet_lightning() -> Any:
    """Keep Lightning's per-run banners and data-loader hints out of the comparison's output."""
    loggers = [logging.getLogger(n) for n in ("lightning.pytorch", "lightning.fabric")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.WARNING)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*does not have many workers.*")
            warnings.filterwarnings("ignore", message=".*isinstance\\(treespec, LeafSpec\\).*")
            yield
    finally:
        for lg, level in zip(loggers, levels, strict=True):
            lg.setLevel(level)


def _median_to_target(reached: list[Checkpoint | None], field_name: str) -> float | None:
    """Median over every run, a run that missed counting as infinitely slow: ``None`` unless most runs reached
    (a median over the runs that reached alone would flatter an arm that often misses)."""
    values = [math.inf if c is None else getattr(c, field_name) for c in reached]
    value = statistics.median(values) if values else math.inf
    return None if math.isinf(value) else value


def _median_nan_lowest(values: list[float]) -> float:
    """The median, a NaN (a diverged run) counting as the lowest value rather than landing anywhere in the order."""
    ordered = sorted(values, key=lambda v: -math.inf if math.isnan(v) else v)
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2


def _summarise(arm: str, runs: list[RunResult], target: float) -> ArmSummary:
    reached = [r.to_target(target) for r in runs]
    return ArmSummary(
        arm=arm,
        runs=len(runs),
        final=_median_nan_lowest([r.final for r in runs]),
        wall=statistics.median(r.wall for r in runs),
        cpu=statistics.median(r.cpu for r in runs),
        flops=statistics.median(r.flops for r in runs),
        steps=statistics.median(r.steps for r in runs),
        reached=sum(c is not None for c in reached),
        wall_to_target=_median_to_target(reached, "wall"),
        cpu_to_target=_median_to_target(reached, "cpu"),
        flops_to_target=_median_to_target(reached, "flops"),
        steps_to_target=_median_to_target(reached, "step"),
    )


def _ratio(base: float | None, other: float | None) -> float | None:
    return base / other if base and other else None


def run_comparison(cfg: CompareConfig, out: TextIO | None = None) -> Report:
    """Run every arm ``cfg.repeats`` times, interleaved; print (to ``out``, default stdout) and save the report."""
    out = out or sys.stdout
    _check(cfg)
    # the precision every arm trains in, by its canonical name (the report and results.json record it)
    given = cfg.precision or presets.recommended_precision(cfg.accelerator)
    cfg = replace(cfg, precision=_precisions().get(given, given))
    make_model, make_dm = _factories(cfg)
    label, make_callbacks, extra = _recipe(cfg)
    # after the other checks: a typo in a preset or path leaves no folder behind
    made = [] if cfg.output is None else _check_output(cfg.output)
    try:
        runs = _run_arms(cfg, label, make_model, make_dm, make_callbacks, extra)
        if cfg.target is None:
            _default_target(runs, cfg.metric)  # every baseline run diverged: the error, before any report
    except BaseException:  # a run that failed (or Ctrl-C): no empty report folder (nor its new parents) left
        _remove_folders(made)
        raise
    own = extra.get("precision")  # a preset that fixes its own precision trains its arm in it
    recipe_precision = None if own is None else _precisions().get(str(own), str(own))
    return _finish(cfg, runs, label, out, recipe_precision=recipe_precision)


def _run_arms(
    cfg: CompareConfig,
    label: str,
    make_model: Callable[[], pl.LightningModule],
    make_dm: Callable[[], pl.LightningDataModule],
    make_callbacks: Callable[[], list[Callback]],
    extra: dict[str, Any],
) -> list[RunResult]:
    """Every arm ``cfg.repeats`` times, interleaved (which of the two goes first alternates), under one bar."""
    epochs_per_repeat = cfg.max_epochs * (3 if cfg.budget_baseline else 2)
    bar = None
    if cfg.progress and rank_zero_only.rank == 0:
        from tqdm.auto import tqdm

        bar = tqdm(total=epochs_per_repeat * cfg.repeats, unit="epoch", file=sys.stderr, dynamic_ncols=True)
    runs: list[RunResult] = []
    try:
        with _quiet_lightning():
            # Two untimed steps of the plain model first: the first fit in a process pays imports and first
            # calls, which would otherwise land on whichever arm runs first (the recipe, in repeat 1). The plain
            # model's: a recipe's callbacks would judge themselves against a 2-step run and warn, and a batch-size
            # search would run in full.
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                _run(BASELINE, 0, cfg, make_model, make_dm, [], {}, None, max_steps=2, warmup=True)
            for repeat in range(cfg.repeats):
                # alternate which of the two goes first, so a slow spell does not always hit the same arm
                pair: dict[str, RunResult] = {}
                for arm in (label, BASELINE) if repeat % 2 == 0 else (BASELINE, label):
                    callbacks = [] if arm == BASELINE else _measure_at_full_size(make_callbacks())
                    settings = {} if arm == BASELINE else extra
                    pair[arm] = _run(arm, repeat, cfg, make_model, make_dm, callbacks, settings, bar)
                base, rec = pair[BASELINE], pair[label]
                runs += list(pair.values())  # in the order they ran
                if not cfg.budget_baseline:
                    continue
                per_step = base.flops / max(1, base.steps)
                # the nearest whole number of the baseline's mean steps (a partial last batch per epoch makes the
                # mean step cheaper than a full one, so the control's FLOPs match the recipe's only to a step)
                budget_steps = max(1, round(rec.flops / per_step)) if per_step else base.steps
                if budget_steps < base.steps:
                    control = _run(BUDGET, repeat, cfg, make_model, make_dm, [], {}, bar, max_steps=budget_steps)
                    runs.append(control)
                elif bar is not None:
                    bar.update(cfg.max_epochs)  # the recipe saved no FLOPs: nothing to control for
    finally:
        if bar is not None:
            bar.close()
    return runs


def _default_target(runs: list[RunResult], metric: str = "the metric") -> float:
    """The baseline's final metric, lower median over its repeats; a repeat that ended at NaN (diverged) is left
    out, since NaN has no place in an order (the target would depend on which repeat diverged)."""
    finals = [r.final for r in runs if r.arm == BASELINE and not math.isnan(r.final)]
    if not finals:
        raise CompareError(
            f"Every baseline run ended with {metric} = NaN (diverged, or the metric was never logged), so there is "
            "no final accuracy to aim for. Check the model and its learning rate, or set --target."
        )
    # the lower median: with an even number of repeats the plain median could sit above half the baseline runs
    return statistics.median_low(finals)


def _flop_unit(report: Report) -> tuple[str, float]:
    """``("GFLOP", 1e9)``, or a smaller unit where the largest arm's FLOPs would print as 0.00 GFLOP."""
    largest = max((s.flops for s in report.summaries), default=0.0)
    for name, scale in (("GFLOP", 1e9), ("MFLOP", 1e6), ("kFLOP", 1e3)):
        if largest >= scale:
            return name, scale
    return "FLOP", 1.0


def _finish(
    cfg: CompareConfig, runs: list[RunResult], label: str, out: TextIO, recipe_precision: str | None = None
) -> Report:
    """Summarise ``runs``, print the report and save it."""
    target = cfg.target if cfg.target is not None else _default_target(runs, cfg.metric)
    arms = [BASELINE, label] + ([BUDGET] if any(r.arm == BUDGET for r in runs) else [])
    summaries = [_summarise(a, [r for r in runs if r.arm == a], target) for a in arms]
    base_summary = summaries[0]
    for s in summaries:
        s.speedup_wall = _ratio(base_summary.wall_to_target, s.wall_to_target)
        s.speedup_cpu = _ratio(base_summary.cpu_to_target, s.cpu_to_target)
        s.speedup_flops = _ratio(base_summary.flops_to_target, s.flops_to_target)
    config = {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(cfg).items()}
    config["recipe_precision"] = recipe_precision or config["precision"]
    report = Report(config=config, recipe=label, target=target, summaries=summaries, runs=runs)
    text = format_report(report)
    if rank_zero_only.rank != 0:  # under DDP every rank runs the comparison; one reports it
        return report
    saved_note = ""
    if cfg.output is not None:  # saved before anything is printed: a reader that stops early (`| head`) loses nothing
        try:
            plotted = save_report(report, cfg.output, text)
        except OSError as err:  # the folder changed under the runs (the up-front check passed): print, then say so
            print_report(text, out)
            raise CompareError(f"--output {str(cfg.output)!r}: could not save the report ({err}).") from err
        saved = f"{cfg.output / 'report.md'}, {cfg.output / 'results.json'}"
        if plotted:
            saved_note = f"\nSaved {saved} and {cfg.output / 'accuracy.png'}."
        else:
            saved_note = f"\nSaved {saved} (no plot: matplotlib is not installed; `pip install matplotlib`)."
    print_report(text + ("\n" + saved_note if saved_note else ""), out)
    return report


def print_report(text: str, out: TextIO) -> None:
    """Print ``text`` to ``out``; a reader that stopped early (``| head``) ends it quietly, with no traceback."""
    try:
        print(text, file=out, flush=True)
    except BrokenPipeError:
        if out is sys.stdout:  # what is left in its buffer goes nowhere, not into a second error at exit
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


# ------------------------------------------------------------------------------------------ output
def _num(value: float | None, fmt: str) -> str:
    return "not reached" if value is None else format(value, fmt)


def _speed(value: float | None) -> str:
    return "–" if value is None else f"{value:.2f}×"


def _relative(ratio: float | None, better: str, worse: str) -> str:
    """``1.50× faster`` for a ratio of 1.5, ``2.00× slower`` for 0.5: a ratio below 1 is never called faster."""
    if ratio is None:
        return "–"
    if ratio >= 1.0:
        return f"{ratio:.2f}× {better}"
    return f"{1.0 / ratio:.2f}× {worse}" if ratio > 0 else f"infinitely {worse}"


def _float32(value: float) -> float:
    return float(torch.tensor(value, dtype=torch.float32))


def _baseline_fell(runs: list[RunResult]) -> bool:
    """Whether every baseline run ended at or below its first validation's metric (validating more than once)."""
    base = [r for r in runs if r.arm == BASELINE and len(r.history) > 1]
    return bool(base) and all(r.history[-1].metric <= r.history[0].metric for r in base)


def _precision_words(cfg: dict[str, Any]) -> str:
    """``precision 32-true``, or each side's where the recipe trains in its own."""
    # a report of an older results.json, which recorded none: the recommendation it ran with
    every = cfg.get("precision") or presets.recommended_precision(cfg.get("accelerator", "auto"))
    recipe = cfg.get("recipe_precision")
    if recipe in (None, every):
        return f"precision {every}"
    return f"precision {every} (baseline), {recipe} (recipe)"


def format_report(report: Report) -> str:
    """The side-by-side table as Markdown, with a verdict on the equal-budget control."""
    cfg = report.config
    source = "given" if cfg["target"] is not None else "the baseline final, lower median over repeats"
    unit, scale = _flop_unit(report)
    task = "embedded digits task" if cfg["model"] is None else f"{cfg['model']} on {cfg['datamodule']}"
    lines = [
        f"## {report.recipe} vs baseline — {task}",
        "",
        f"{cfg['max_epochs']} epochs, {cfg['repeats']} repeat(s) interleaved, medians; {_precision_words(cfg)}; "
        f"target {cfg['metric']} >= {report.target:.4f} ({source}).",
        "",
        f"| run | final {cfg['metric']} | wall s | CPU s | train {unit} | steps | reached | wall s to target "
        f"| CPU s to target | {unit} to target | speedup wall | speedup CPU | speedup FLOPs |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for s in report.summaries:
        flops_t = None if s.flops_to_target is None else s.flops_to_target / scale
        lines.append(
            f"| {s.arm} | {s.final:.4f} | {s.wall:.1f} | {s.cpu:.1f} | {s.flops / scale:.2f} | {s.steps:.0f} | "
            f"{s.reached}/{s.runs} | {_num(s.wall_to_target, '.1f')} | {_num(s.cpu_to_target, '.1f')} | "
            f"{_num(flops_t, '.2f')} | {_speed(s.speedup_wall)} | {_speed(s.speedup_cpu)} | "
            f"{_speed(s.speedup_flops)} |"
        )
    if report.runs and all(r.history and r.to_target(report.target) is r.history[0] for r in report.runs):
        lines += [
            "",
            f"**Every run reached the target ({report.target:.4f}) at its first validation**, so this table cannot "
            "tell the runs' speeds apart: the ratios compare times to the first validation. Train longer "
            "(--max-epochs) so that the baseline ends well above where it starts, or set --target.",
        ]
    elif cfg.get("target") is None and _baseline_fell(report.runs):
        lines += [
            "",
            "**The baseline ended no better than its first validation** (it did not learn, or it diverged): a "
            "target set by its final metric says little about speed. Check the model and its learning rate, "
            "train longer (--max-epochs), or set --target.",
        ]
    diverged = [r for r in report.runs if math.isnan(r.final)]
    if diverged:
        which = ", ".join(f"{r.arm} (repeat {r.repeat})" for r in diverged)
        baseline_diverged = any(r.arm == BASELINE for r in diverged)
        left_out = "; the baseline's left out of the target" if cfg.get("target") is None and baseline_diverged else ""
        lines += [
            "",
            f"**Diverged**: {len(diverged)} run(s) ended with {cfg['metric']} = NaN ({which}): counted as the "
            f"lowest in the medians{left_out}.",
        ]
    stale = [r for r in report.runs if r.history and r.history[-1].step < r.steps]
    if stale:
        where = "; ".join(f"{r.arm} (repeat {r.repeat}): step {r.history[-1].step} of {r.steps}" for r in stale)
        lines += [
            "",
            f"**Not measured at the end**: {len(stale)} run(s) have no {cfg['metric']} at their last step (no "
            "validation there, as with `check_val_every_n_epoch` > 1, or one that did not log it), so their final "
            f"metric, wall and CPU time are read at their last measurement ({where}); their FLOPs and steps are "
            "the whole run's. Validate at the end of training and log the metric at every validation.",
        ]
    sizes = {
        arm: sorted({r.batch_size for r in report.runs if r.arm == arm} - {None}) for arm in (BASELINE, report.recipe)
    }
    if sizes[BASELINE] and sizes[report.recipe] and sizes[BASELINE] != sizes[report.recipe]:
        lines += [
            "",
            f"Batch size (per device): baseline {', '.join(map(str, sizes[BASELINE]))}, {report.recipe} "
            f"{', '.join(map(str, sizes[report.recipe]))} (set by the recipe, e.g. its batch-size search).",
        ]
    recipe, budget = report.summary(report.recipe), report.summary(BUDGET)
    uncounted = report.summaries[0].flops <= 0
    if uncounted:
        lines += [
            "",
            "**No FLOPs counted**: `torch.utils.flop_counter` counted none in the baseline's training steps (the "
            "model's operations are not ones it counts), so the FLOPs columns and the baseline shortened to the "
            "recipe's FLOPs are not available; wall-clock and CPU time still compare.",
        ]
    uncounted_modules = {name: kind for r in report.runs for name, kind in r.uncounted.items()}
    if uncounted_modules and not uncounted:
        named = ", ".join(f"`{n}` ({k})" for n, k in sorted(uncounted_modules.items())[:5])
        more = f" and {len(uncounted_modules) - 5} more" if len(uncounted_modules) > 5 else ""
        lines += [
            "",
            f"**FLOPs undercounted**: `torch.utils.flop_counter` counts nothing for {named}{more} (operations it "
            "does not know, e.g. `nn.LSTM` on CPU), so the FLOPs columns and the FLOPs budget of the shortened "
            "baseline leave them out; wall-clock and CPU time are whole.",
        ]
    if any(r.flops_vary for r in report.runs):
        lines += [
            "",
            "FLOPs per step varied within one batch shape (the model's compute depends on the data, e.g. trimming "
            "padding): for such shapes every 8th step was counted and the steps between took the latest count, so "
            "the FLOPs are estimates there; a counted step runs slower (a third or more), within the times shown.",
        ]
    if recipe is not None and budget is None and cfg.get("budget_baseline", True) and not uncounted:
        lines += [
            "",
            "No baseline shortened to the recipe's FLOPs: the recipe's training FLOPs are not below the baseline's, "
            "so there is no shorter schedule to compare it with.",
        ]
    if recipe is not None and budget is not None:
        lines += ["", f"Against the baseline shortened to the recipe's FLOPs ({budget.steps:.0f} steps):"]
        if budget.wall_to_target is None and recipe.wall_to_target is not None:
            lines.append("the shortened baseline does not reach the target; the recipe does.")
        elif recipe.wall_to_target is None:
            lines.append("the recipe does not reach the target.")
        else:
            wall = _ratio(budget.wall_to_target, recipe.wall_to_target)
            flops = _ratio(budget.flops_to_target, recipe.flops_to_target)
            lines.append(
                f"to the target, the recipe is {_relative(wall, 'faster', 'slower')} in wall time and needs "
                f"{_relative(flops, 'fewer', 'more')} FLOPs."
            )
    lines += [
        "",
        "Wall and CPU time include validation; FLOPs are training FLOPs counted with torch.utils.flop_counter. "
        "Every arm validates at full size (a ProgressiveResizing's default validation at the training scale is "
        "switched off here, so the time to target is what a full-size model reaches).",
    ]
    devices = report.config.get("devices", 1)
    if isinstance(devices, int) and devices > 1:
        lines.append(
            f"On {devices} devices, CPU time is rank 0's process and its workers; FLOPs are summed over the ranks."
        )
    return "\n".join(lines)


def _finite_or_null(value: Any) -> Any:
    """``value`` with every NaN or infinite float, however deep in dicts and lists, replaced by None."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite_or_null(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite_or_null(v) for v in value]
    return value


def save_report(report: Report, output: Path, text: str) -> bool:
    """``report.md``, ``results.json`` and ``accuracy.png`` (if matplotlib is installed) under ``output``; whether
    the plot was written."""
    output.mkdir(parents=True, exist_ok=True)
    (output / "report.md").write_text(text + "\n")
    data = {
        "config": report.config,
        "recipe": report.recipe,
        "target": report.target,
        "summaries": [asdict(s) for s in report.summaries],
        "runs": [
            {
                "arm": r.arm,
                "repeat": r.repeat,
                "flops": r.flops,
                "steps": r.steps,
                "batch_size": r.batch_size,
                "uncounted_modules": r.uncounted,
                "flops_vary": r.flops_vary,
                "history": [asdict(c) for c in r.history],
            }
            for r in report.runs
        ],
    }
    # strict JSON: a diverged run's NaN is written as null (a bare NaN token is refused by most parsers)
    (output / "results.json").write_text(json.dumps(_finite_or_null(data), indent=2, allow_nan=False))
    written = plot_report(report, output / "accuracy.png")
    if not written:  # no plot this time: an older run's must not sit beside this report
        (output / "accuracy.png").unlink(missing_ok=True)
    return written


def accuracy_ylim(metrics: list[float], target: float, zoom: float = 0.1, pad: float = 0.005) -> tuple[float, float]:
    """Y-limits of the accuracy plot: from the curves' lowest point (but at most ``zoom`` below the target, where
    the curves cross it is what matters) to their highest, always with the target inside and lower < upper."""
    finite = [m for m in metrics if math.isfinite(m)]
    lowest, highest = min(finite, default=target), max(finite, default=target)
    lower = min(max(lowest, target - zoom), target) - pad
    upper = max(highest, min(1.0, target + 0.02)) + pad
    return lower, upper


def plot_report(report: Report, path: Path) -> bool:
    """Metric against wall time and against FLOPs, one line per run; ``False`` without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
    colours = dict(zip([s.arm for s in report.summaries], ["tab:gray", "tab:blue", "tab:orange"], strict=False))
    low, high = accuracy_ylim([c.metric for r in report.runs for c in r.history], report.target)
    best: dict[str, float] = {}
    for r in report.runs:
        best[r.arm] = max([best.get(r.arm, -math.inf), *(c.metric for c in r.history)])
    unit, scale = _flop_unit(report)
    labelled: set[str] = set()  # each arm once, by its first run (an arm need not run in every repeat)
    for run in report.runs:
        xs_wall = [c.wall for c in run.history]
        xs_flops = [c.flops / scale for c in run.history]
        ys = [c.metric for c in run.history]
        # the y-range zooms on the target: an arm that never comes near it is said to be below, not left unseen
        below = f" (below the plotted range; best {best[run.arm]:.4f})" if best[run.arm] < low else ""
        label = None if run.arm in labelled else run.arm + below
        labelled.add(run.arm)
        axes[0].plot(xs_wall, ys, marker=".", color=colours.get(run.arm), label=label, alpha=0.8)
        axes[1].plot(xs_flops, ys, marker=".", color=colours.get(run.arm), label=label, alpha=0.8)
    for ax, xlabel in zip(axes, ["wall time (s)", f"training {unit}"], strict=True):
        ax.axhline(report.target, color="black", linestyle="--", linewidth=0.8)
        ax.set_xlabel(xlabel)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel(report.config["metric"])
    axes[0].set_ylim(low, high)
    axes[0].legend(loc="lower right")
    fig.suptitle(f"{report.recipe} vs baseline (dashed: target {report.target:.4f})")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True
