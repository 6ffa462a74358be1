"""``python -m lightning_speedups``: the same as the ``lightning-speedups`` command."""

from lightning_speedups.cli import main

raise SystemExit(main())
