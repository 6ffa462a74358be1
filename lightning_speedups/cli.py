"""The ``lightning-speedups`` command: ``compare`` (the main job) and ``presets``."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from lightning_speedups import presets
from lightning_speedups.compare import DEFAULT_PRESET, print_report


def _json_dict(text: str) -> dict:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as err:
        raise argparse.ArgumentTypeError(f"not valid JSON ({err}): {text!r}") from err
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"expected a JSON object like '{{\"lr\": 0.1}}', got {text!r}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="lightning-speedups",
        description="PyTorch Lightning callbacks that make training faster without compromising results.",
    )
    sub = parser.add_subparsers(dest="command", required=True)

    cmp = sub.add_parser(
        "compare",
        help="train a baseline and a preset side by side and show the speedup and the accuracy",
        description=(
            "Train the baseline, a preset (or a list of callbacks), and the baseline shortened to the preset's "
            "training FLOPs; print a side-by-side table of accuracy, time, CPU time and FLOPs to a target, and "
            "save a plot. Default task: scikit-learn's bundled digits, upscaled to 32 px, with a small ResNet."
        ),
    )
    cmp.add_argument(
        "--preset",
        default=None,
        help=f"preset name (see `lightning-speedups presets`; default: {DEFAULT_PRESET}, unless --callback is given)",
    )
    cmp.add_argument(
        "--callback",
        dest="callbacks",
        action="append",
        default=[],
        metavar="NAME[:k=v,...]",
        help=(
            "a callback, e.g. MixUp:alpha=0.4, or your own as package.module:Class[:k=v,...] (repeatable): alone, "
            "the recipe instead of a preset; with --preset, added to it (one of a class the preset has changes the "
            "arguments it gives of that one; of a function preset, replaces it)"
        ),
    )
    cmp.add_argument(
        "--without",
        action="append",
        default=[],
        metavar="NAME",
        help="leave a callback of the preset out, by class name, e.g. ProgressiveResizing for non-image inputs "
        "(repeatable)",
    )
    cmp.add_argument("--model", help="your LightningModule class, as package.module:Class")
    cmp.add_argument("--datamodule", help="your LightningDataModule class, as package.module:Class")
    cmp.add_argument("--model-args", type=_json_dict, default={}, help="JSON keyword arguments of --model")
    cmp.add_argument("--datamodule-args", type=_json_dict, default={}, help="JSON keyword arguments of --datamodule")
    cmp.add_argument("--accelerator", default="auto", help="Lightning accelerator (default: auto)")
    cmp.add_argument("--devices", type=int, default=1, help="devices per run (default: 1)")
    cmp.add_argument(
        "--precision",
        default=None,
        help="every run's Trainer precision, e.g. bf16-mixed (default: bf16-mixed on CUDA with bf16, 16-mixed on "
        "older CUDA, 32-true on CPU; a preset that fixes its own keeps it)",
    )
    cmp.add_argument("--max-epochs", type=int, default=12, help="epochs of the baseline and the preset (default: 12)")
    cmp.add_argument("--target", type=float, default=None, help="target metric in (0, 1] (default: baseline's final)")
    cmp.add_argument("--metric", default="val_acc", help="validation metric logged by the model (default: val_acc)")
    cmp.add_argument("--seed", type=int, default=0, help="seed of the first repeat (default: 0)")
    cmp.add_argument("--repeats", type=int, default=3, help="interleaved repeats; medians reported (default: 3)")
    cmp.add_argument(
        "--output",
        type=Path,
        default=Path("compare-output"),
        help="directory for report and plot (default: compare-output)",
    )
    cmp.add_argument("--no-budget-baseline", action="store_true", help="skip the equal-FLOPs baseline")
    cmp.add_argument("--no-progress", action="store_true", help="no progress bar")

    pre = sub.add_parser("presets", help="list the presets, or describe one")
    pre.add_argument("name", nargs="?", help="describe this preset")
    pre.add_argument(
        "--config",
        action="store_true",
        help="print the named preset's LightningCLI YAML config: its callbacks (needs NAME)",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "presets":
        return _presets(args)
    return _compare(args)


def _presets(args: argparse.Namespace) -> int:
    if args.config and args.name is None:
        print(
            "error: --config prints one preset's YAML config: name it, e.g. `presets vision-mild --config`.",
            file=sys.stderr,
        )
        return 2
    try:
        if args.name is None:
            text = "\n".join(f"{name:20s} {presets.lookup(name).summary}" for name in presets.names())
        elif args.config:
            text = presets.to_yaml(args.name).removesuffix("\n")
        else:
            text = presets.describe(args.name)
        print_report(text, sys.stdout)  # a reader that stops early (`| head`) gets no traceback
    except (presets.UnknownPresetError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except TypeError as err:
        if not args.config:  # only `to_yaml` raises it on purpose: a value YAML cannot hold, named with the fix
            raise
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


def _compare(args: argparse.Namespace) -> int:
    from lightning_speedups.compare import CompareConfig, CompareError, run_comparison

    cfg = CompareConfig(
        preset=args.preset,
        callbacks=args.callbacks,
        without=args.without,
        model=args.model,
        datamodule=args.datamodule,
        model_args=args.model_args,
        datamodule_args=args.datamodule_args,
        accelerator=args.accelerator,
        devices=args.devices,
        precision=args.precision,
        max_epochs=args.max_epochs,
        target=args.target,
        metric=args.metric,
        seed=args.seed,
        repeats=args.repeats,
        output=args.output,
        budget_baseline=not args.no_budget_baseline,
        progress=not args.no_progress,
    )
    try:
        run_comparison(cfg)
    except CompareError as err:
        from lightning.pytorch.utilities import rank_zero_only

        # under DDP every rank runs compare; another rank's error is marked as its own (often the same one)
        rank = rank_zero_only.rank
        print(f"error{f' (rank {rank})' if rank else ''}: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # Lightning's own notice is among the messages compare keeps quiet
        print("interrupted: no report written.", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
