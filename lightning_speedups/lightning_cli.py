"""`SpeedupCLI`: LightningCLI with ``--preset NAME``.

Callbacks by short name need no special CLI: importing ``lightning_speedups`` makes every callback known to
LightningCLI (``--trainer.callbacks+=MixUp --trainer.callbacks.alpha=0.4``). ``SpeedupCLI`` adds a preset by
name, appended to whatever callbacks the command line or config gives::

    # train.py
    from lightning_speedups.lightning_cli import SpeedupCLI
    from my_project import MyModel, MyData

    if __name__ == "__main__":
        SpeedupCLI(MyModel, MyData)

    # shell
    python train.py fit --preset vision-mild --trainer.max_epochs 30

The preset also brings its recommended precision (``bf16-mixed`` on GPUs with native bf16) and strategy (DDP on
several devices), and its own Trainer settings, unless the command line or config chooses otherwise (a value
other than the Trainer's default): ``--trainer.precision 32-true`` or ``--trainer.accumulate_grad_batches 2``
wins over the preset.

The shipped YAML configs (``lightning-speedups presets NAME --config``) do the same for a plain LightningCLI:
``python train.py fit --config vision-mild.yaml``.
"""

from __future__ import annotations

import inspect
from typing import Any

from lightning.pytorch import Trainer
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI

import lightning_speedups  # noqa: F401  (registers the callbacks' short names)
from lightning_speedups import presets


def _trainer_defaults() -> dict[str, Any]:
    return {k: p.default for k, p in inspect.signature(Trainer.__init__).parameters.items()}


def _same(value: Any, default: Any) -> bool:
    try:
        return bool(value == default)
    except Exception:  # e.g. a tensor-like value: certainly chosen
        return False


class SpeedupCLI(LightningCLI):
    """LightningCLI with a ``--preset NAME`` option; see the module docstring."""

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        parser.add_argument(
            "--preset",
            type=str | None,
            default=None,
            help=f"a lightning-speedups preset, appended to the trainer's callbacks ({', '.join(presets.names())})",
        )

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
            recipe = presets.get(
                name,
                accelerator=str(trainer_cfg.get("accelerator", "auto")),
                devices=trainer_cfg.get("devices", 1),
            )
            existing = trainer_cfg.get("callbacks") or []
            existing = existing if isinstance(existing, list) else [existing]
            kwargs["callbacks"] = [*existing, *recipe.callbacks]
            defaults = _trainer_defaults()
            for key, value in presets.lookup(name).trainer.items():
                # the preset's setting unless the command line or config chose one (a value other than the
                # Trainer's default): `--trainer.accumulate_grad_batches 2` wins, as `Recipe.trainer(...)` lets it
                if key not in trainer_cfg or _same(trainer_cfg[key], defaults.get(key, inspect.Parameter.empty)):
                    kwargs.setdefault(key, value)
            # the recommended precision and strategy, as `presets.get(name).trainer()` gives them, unless the
            # command line or config chose one (the Trainer's defaults, None and "auto", mean "not chosen")
            if trainer_cfg.get("precision") is None:
                kwargs.setdefault("precision", recipe.trainer_kwargs["precision"])
            if trainer_cfg.get("strategy", "auto") == "auto":
                kwargs.setdefault("strategy", recipe.trainer_kwargs["strategy"])
        return super().instantiate_trainer(**kwargs)
