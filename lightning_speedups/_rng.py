"""Random draws for the callbacks: cheap per-batch generators, and a guard for the global generators."""

from __future__ import annotations

import contextlib
import random
from collections.abc import Iterator

import numpy as np
import torch
from torch import Tensor

_U32 = (1 << 32) - 1
_U64 = (1 << 64) - 1


class BatchRandom:
    """The draws of one training batch, re-seeded for each batch at the cost of a few µs.

    A callback needs a handful of scalars per batch (a coin, a mixing weight, box centres) and perhaps an index
    tensor (a permutation, crop offsets), reproducibly from ``(seed, rank, batch index, callback)`` so that a
    resumed run draws what the uninterrupted one did. Building a NumPy ``Generator`` for that costs a
    ``SeedSequence`` and a bit generator per batch (about 25 µs alone, 100 to 200 µs inside a fit, where the
    caches are cold after the backward pass). Here a Python ``random.Random`` (Mersenne Twister) re-seeded from
    the key gives the scalars, and a CPU ``torch.Generator`` seeded from it gives the tensors.

    The scalar methods follow NumPy's ``Generator`` names (``random``, ``beta``, ``integers``, ``permutation``),
    so the functional ops take either. ``torch.Generator`` on the CPU keeps 32 bits of its seed, so the tensor
    draws of two batches coincide with probability 2**-32; the scalar draws use the whole key.

    Example::

        >>> r = BatchRandom().reseed(12345)
        >>> a = (r.random(), r.beta(0.2, 0.2), r.integers(10), r.permutation(4).tolist())
        >>> a == (BatchRandom().reseed(12345).random(), *a[1:]) and sorted(a[3]) == [0, 1, 2, 3]
        True
    """

    __slots__ = ("_py", "_torch", "_torch_seeded")

    def __init__(self) -> None:
        self._py = random.Random()
        self._torch = torch.Generator()
        self._torch_seeded = False

    def reseed(self, key: int) -> BatchRandom:
        """Restart the draws from ``key`` (a non-negative int of any size); returns ``self``."""
        self._py.seed(key)
        self._torch_seeded = False  # seeded on first use: most batches draw no tensor
        return self

    @property
    def torch(self) -> torch.Generator:
        """A CPU ``torch.Generator`` for tensor draws, seeded from this batch's stream at its first use."""
        if not self._torch_seeded:
            self._torch.manual_seed(self._py.getrandbits(32))
            self._torch_seeded = True
        return self._torch

    def random(self) -> float:
        """A float in [0, 1)."""
        return self._py.random()

    def beta(self, a: float, b: float) -> float:
        """A draw of ``Beta(a, b)``: Python's ``betavariate``, whose draws it keeps, but symmetric also for tiny
        ``a``, where its first gamma draw underflows to 0 and it returned 0 (biased towards 0)."""
        y = self._py.gammavariate(a, 1.0)
        z = self._py.gammavariate(b, 1.0)
        if y + z > 0.0:
            return y / (y + z)
        return float(self._py.random() < a / (a + b))  # both underflowed: 0 or 1, in the ratio of the shapes

    def integers(self, high: int) -> int:
        """An int in ``[0, high)``."""
        return self._py.randrange(high)

    def permutation(self, n: int) -> Tensor:
        """A random permutation of ``range(n)`` as an int64 CPU tensor."""
        return torch.randperm(n, generator=self.torch)

    def numpy(self) -> np.random.Generator:
        """A NumPy ``Generator`` seeded from this batch's stream, for distributions not offered here."""
        return np.random.default_rng(self._py.getrandbits(128))


def batch_key(seed: int, rank: int, batch: int, salt: int) -> int:
    """One int that tells every ``(seed, rank, batch index, salt)`` apart (seed < 2**64, the others < 2**32 or
    2**64), for :meth:`BatchRandom.reseed`: Python's Mersenne Twister mixes every 32-bit word of it."""
    return (((((seed & _U64) << 32) | (salt & _U32)) << 32 | (rank & _U32)) << 64) | (batch & _U64)


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
