"""A datamodule whose samples carry their index, with long-tailed labels, difficulty and tasks, and a model that
records which indices each training step saw (module level, so DDP workers can use them)."""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl
import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.data import TensorDataset

from lightning_speedups import SpeedupDataModule

NUM_CLASSES = 4


def long_tail(n: int) -> np.ndarray:
    """Labels 0..3 with shares of about 80%, 15%, 4%, 1% (at least one sample each), in a fixed shuffle."""
    counts = np.maximum(1, (np.array([0.80, 0.15, 0.04, 0.01]) * n).astype(int))
    counts[0] += n - counts.sum()
    return np.random.default_rng(0).permutation(np.repeat(np.arange(NUM_CLASSES), counts))


class IndexDM(SpeedupDataModule):
    """Sample ``i`` is ``x = i`` with a long-tailed label; difficulty is a fixed random permutation of 0..n-1."""

    def __init__(self, n: int = 80, tasks: bool = False, **kwargs: Any) -> None:
        kwargs.setdefault("batch_size", 8)
        super().__init__(**kwargs)
        self.n, self.with_tasks = n, tasks

    def setup(self, stage: str) -> None:
        y = torch.from_numpy(long_tail(self.n))
        self.train_dataset = TensorDataset(torch.arange(self.n).float().unsqueeze(1), y)
        self.train_difficulty = np.random.default_rng(1).permutation(self.n).astype(float)
        if self.with_tasks:
            self.train_tasks = np.arange(self.n) % 3


class IndexModel(pl.LightningModule):
    """Records ``(global_step, indices)`` per training batch; learns a little so scores and weights move."""

    def __init__(self, n: int = 80, lr: float = 0.5) -> None:
        super().__init__()
        self.n, self.lr = n, lr
        self.net = nn.Linear(1, NUM_CLASSES)
        self.seen: list[list[int]] = []
        self.steps: list[int] = []

    def forward(self, x: Tensor) -> Tensor:
        return self.net(x / self.n)

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        x, y = batch
        self.seen.append(x[:, 0].long().tolist())
        self.steps.append(self.global_step)
        return F.cross_entropy(self(x), y)

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=self.lr)
