"""Keep the global random generators as they were around code that draws from them as a side effect."""

from __future__ import annotations

import contextlib
import random
from collections.abc import Iterator

import numpy as np
import torch


@contextlib.contextmanager
def global_rng_kept() -> Iterator[None]:
    """Run a block without moving Python's, NumPy's or torch's (CPU and CUDA) global random generators."""
    py_state, np_state = random.getstate(), np.random.get_state()
    try:
        with torch.random.fork_rng(devices=range(torch.cuda.device_count()) if torch.cuda.is_initialized() else []):
            yield
    finally:
        random.setstate(py_state)
        np.random.set_state(np_state)
