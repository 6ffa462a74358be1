"""``python -m lightning_speedups``: the same as the ``lightning-speedups`` command."""

from lightning_speedups.cli import main

if __name__ == "__main__":  # not when a tool imports the module (a package walk, autodoc)
    raise SystemExit(main())
