"""`SpeedupCLI`: LightningCLI with ``--preset NAME``.

Callbacks by short name need no special CLI: importing ``lightning_speedups`` makes every callback known to
LightningCLI (``--trainer.callbacks+=MixUp --trainer.callbacks.alpha=0.4``). ``SpeedupCLI`` adds a preset by
name: its callbacks come before the others the command line, a config or the script's ``trainer_defaults`` give,
and one of those of a class the preset has already replaces the preset's (logged on rank zero; one of the command
line or a config takes its place in the list), which is also how to change a preset callback's arguments from the
command line. The replacement is built as given, its other arguments at their class defaults, not the preset's:
a warning lists those that differ, so give the ones to keep too (``lightning-speedups presets NAME`` shows them)::

    # train.py
    from lightning_speedups.lightning_cli import SpeedupCLI
    from my_project import MyModel, MyData

    if __name__ == "__main__":
        SpeedupCLI(MyModel, MyData)

and from the shell::

    python train.py fit --preset vision-mild --trainer.max_epochs 30

The preset also brings its recommended precision (``bf16-mixed`` on GPUs with native bf16) and strategy (DDP on
several devices), and its own Trainer settings, as defaults: whatever the command line, a config or the script's
``LightningCLI(trainer_defaults=...)`` gives wins (``--trainer.precision 32-true``,
``--trainer.accumulate_grad_batches 1``).

The shipped YAML configs (``lightning-speedups presets NAME --config``) give a plain LightningCLI the preset's
callbacks (and its own Trainer settings) only, not the precision and strategy recommended for the hardware:
``python train.py fit --config vision-mild.yaml``. A later ``--config`` or ``--trainer.callbacks=[...]`` replaces
the whole callback list; add your own with ``--trainer.callbacks+=``.
"""

from __future__ import annotations

import inspect
import sys
from typing import Any

from jsonargparse import Namespace
from lightning.pytorch import Trainer
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI

import lightning_speedups  # noqa: F401  (registers the callbacks' short names)
from lightning_speedups import presets


class SpeedupCLI(LightningCLI):
    """LightningCLI with a ``--preset NAME`` option; see the module docstring."""

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        parser.add_argument(
            "--preset",
            type=str | None,
            default=None,
            help=(
                "a lightning-speedups preset: its callbacks, before your others, and its Trainer settings as "
                f"defaults ({', '.join(presets.names())})"
            ),
        )

    def parse_arguments(self, parser: LightningArgumentParser, args: Any) -> None:
        # A first pass reads the preset's name. It leaves out `--print_config` (which prints and exits inside the
        # parse, before the preset's defaults are set) and validation (so that `--print_config` still prints a
        # config that misses required values); the second pass, below, does both.
        if isinstance(args, dict | Namespace):
            first = _parse_without_validation(parser.parse_object, args)
        else:
            raw = sys.argv[1:] if args is None else list(args)
            first = _parse_without_validation(parser.parse_args, [a for a in raw if not _is_print_config(a)])
        subcommand = first.get("subcommand")  # `self.subcommand` is set only after parsing
        config = first[subcommand] if subcommand else first
        name = config.get("preset")
        try:
            preset = None if name is None else presets.lookup(name)
        except presets.UnknownPresetError as err:  # now: `--print_config` would print the misspelt name and exit 0
            self._parser(subcommand).error(str(err))
        if preset is None:
            super().parse_arguments(parser, args)
            return
        # The preset's Trainer settings, and its recommended precision and strategy for the accelerator and
        # devices asked for, become the parser's defaults, and the command line is read again: anything the
        # command line or a config gives, the Trainer's default value included, then wins over the preset. The
        # script's own `trainer_defaults` (already the parser's defaults) are kept: they win over the preset too.
        trainer_cfg = config.get("trainer") or {}
        accelerator, devices = str(trainer_cfg.get("accelerator", "auto")), trainer_cfg.get("devices", 1)
        try:
            recipe = presets.get(name, accelerator=accelerator, devices=devices)
            presets._check_batch_size_finder(
                name,
                recipe.callbacks,
                devices=devices,
                accelerator=accelerator,
                strategy=trainer_cfg.get("strategy", "auto"),
                num_nodes=trainer_cfg.get("num_nodes", 1),
            )
        except ValueError as err:  # e.g. a BatchSizeFinder on several devices: a usage error, said before training
            message = str(err)
            if "BatchSizeFinder" in message:  # the fix it gives is Python's; here it is the command line's
                message += (
                    " On the command line: drop `--preset`, set the batch found on your datamodule, and add "
                    "`--trainer.callbacks+=LinearScalingWarmup --trainer.callbacks.reference_batch_size=B`."
                )
            self._parser(subcommand).error(message)
        self._built = (name, accelerator, devices, recipe)  # reused for the Trainer: a function preset runs once
        settings = {"precision": recipe.trainer_kwargs["precision"], "strategy": recipe.trainer_kwargs["strategy"]}
        settings.update(preset.trainer)
        defaults = {f"trainer.{k}": v for k, v in settings.items() if k not in self.trainer_defaults}
        self._parser(subcommand).set_defaults(defaults)
        super().parse_arguments(parser, args)

    def before_instantiate_classes(self) -> None:
        name = self._get(self.config, "preset")
        if name is not None:
            try:
                presets.lookup(name)
            except presets.UnknownPresetError as err:
                self._parser(self.subcommand).error(str(err))

    def instantiate_trainer(self, **kwargs: Any) -> Trainer:
        name = self._get(self.config, "preset")
        if name is not None:
            trainer_cfg = self._get(self.config_init, "trainer", default={}) or {}
            accelerator, devices = str(trainer_cfg.get("accelerator", "auto")), trainer_cfg.get("devices", 1)
            built = self.__dict__.pop("_built", None)
            if built is not None and built[:3] == (name, accelerator, devices):
                recipe = built[3]
            else:
                recipe = presets.get(name, accelerator=accelerator, devices=devices)
            existing = trainer_cfg.get("callbacks") or []
            existing = existing if isinstance(existing, list) else [existing]
            # Lightning adds these after: the parser's callback arguments and the script's `trainer_defaults`
            extra = [self._get(self.config_init, key) for key in self._parser(self.subcommand).callback_keys]
            default = self.trainer_defaults.get("callbacks") or []
            later = [*extra, *(default if isinstance(default, list) else [default])]
            # One that Lightning adds after (`later`) of a preset's class drops the preset's; then one of the command
            # line or a config takes the slot of the preset's callback of its class (batch transforms run in
            # callback order), and the others come after the preset's, as in `Recipe.trainer`. (A class given both
            # ways is two callbacks, as without a preset: Lightning refuses them when their state keys are equal.)
            kept = presets._replace_by_users(name, recipe.callbacks, [c for c in later if c is not None])
            merged, placed = presets._put_users_in_place(name, kept, existing)
            kwargs["callbacks"] = [*merged, *(c for c in existing if not any(c is p for p in placed))]
        return super().instantiate_trainer(**kwargs)


def _is_print_config(arg: str) -> bool:
    """``--print_config`` or ``--print_config=flags``."""
    return arg == "--print_config" or arg.startswith("--print_config=")


def _parse_without_validation(parse: Any, args: Any) -> Any:
    """``parse(args)`` without jsonargparse's validation, whose private flag changed name across versions."""
    parameters = inspect.signature(parse).parameters
    for flag in ("_skip_validation", "_skip_check"):
        if flag in parameters:
            return parse(args, **{flag: True})
    return parse(args)
