"""Small models, data and loggers shared by the tests (module level, so DDP workers can pickle them)."""

from __future__ import annotations

import tempfile
from collections import namedtuple
from dataclasses import dataclass
from typing import Any

import lightning.pytorch as pl
import torch
import torch.nn.functional as F
from lightning.pytorch.loggers import Logger
from torch import Tensor, nn
from torch.utils.data import DataLoader, Dataset, TensorDataset

from lightning_speedups import SpeedupDataModule

NUM_CLASSES = 4
Pair = namedtuple("Pair", ["image", "label"])


@dataclass
class Sample:
    image: Tensor
    label: Tensor


class MemoryLogger(Logger):
    """Keeps every logged metric in memory: ``history[name] == [(step, value), ...]``."""

    def __init__(self) -> None:
        super().__init__()
        self.history: dict[str, list[tuple[int, float]]] = {}

    @property
    def name(self) -> str:
        return "memory"

    @property
    def version(self) -> int:
        return 0

    def log_hyperparams(self, params: Any, *args: Any, **kwargs: Any) -> None:
        pass

    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        for k, v in metrics.items():
            self.history.setdefault(k, []).append((step, float(v)))


def image_tensors(n: int = 64, size: int = 8, seed: int = 0) -> tuple[Tensor, Tensor]:
    """Learnable synthetic images: the class sets which quadrant is bright."""
    g = torch.Generator().manual_seed(seed)
    y = torch.arange(n) % NUM_CLASSES
    x = torch.randn(n, 1, size, size, generator=g) * 0.3
    half = size // 2
    for c in range(NUM_CLASSES):
        r, q = divmod(c, 2)
        x[y == c, :, r * half : (r + 1) * half, q * half : (q + 1) * half] += 1.0
    return x, y


def collate_tuple(samples: list[tuple[Tensor, Tensor]]) -> tuple[Tensor, Tensor]:
    xs, ys = zip(*samples, strict=True)
    return torch.stack(xs), torch.stack(ys)


def collate_dict(samples: list[tuple[Tensor, Tensor]]) -> dict[str, Tensor]:
    x, y = collate_tuple(samples)
    return {"image": x, "label": y, "index": torch.arange(len(samples))}


def collate_namedtuple(samples: list[tuple[Tensor, Tensor]]) -> Pair:
    return Pair(*collate_tuple(samples))


def collate_dataclass(samples: list[tuple[Tensor, Tensor]]) -> Sample:
    return Sample(*collate_tuple(samples))


COLLATES = {
    "list": None,  # default_collate turns tuple samples into a list
    "tuple": collate_tuple,
    "dict": collate_dict,
    "namedtuple": collate_namedtuple,
    "dataclass": collate_dataclass,
}


def unpack(batch: Any) -> tuple[Tensor, Tensor]:
    if isinstance(batch, dict):
        return batch["image"], batch["label"]
    if isinstance(batch, Sample | Pair):
        return batch.image, batch.label
    return batch[0], batch[1]


class TinyNet(nn.Module):
    def __init__(self, size: int = 8) -> None:
        super().__init__()
        self.conv = nn.Conv2d(1, 4, 3, padding=1)
        self.fc = nn.Linear(4 * size * size, NUM_CLASSES)

    def forward(self, x: Tensor) -> Tensor:
        return self.fc(torch.flatten(F.relu(self.conv(x)), 1))


class RecordingModule(pl.LightningModule):
    """Unchanged user code: ``F.cross_entropy(logits, y)``; records the batches each step received."""

    def __init__(
        self,
        size: int = 8,
        lr: float = 0.1,
        use_criterion: bool = False,
        record: bool = True,
        num_classes: int | None = NUM_CLASSES,
    ) -> None:
        super().__init__()
        self.num_classes = num_classes
        self.net = TinyNet(size)
        self.lr = lr
        self.criterion = nn.CrossEntropyLoss() if use_criterion else None
        self.record = record
        self.train_batches: list[tuple[Tensor, Tensor]] = []
        self.val_batches: list[tuple[Tensor, Tensor]] = []
        self.train_losses: list[float] = []

    def forward(self, x: Tensor) -> Tensor:
        return self.net(x)

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        x, y = unpack(batch)
        logits = self(x)
        loss = self.criterion(logits, y) if self.criterion is not None else F.cross_entropy(logits, y)
        if self.record:
            self.train_batches.append((x.detach().clone(), y.detach().clone()))
            self.train_losses.append(float(loss.detach()))
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = unpack(batch)
        if self.record:
            self.val_batches.append((x.detach().clone(), y.detach().clone()))
        self.log("val_loss", F.cross_entropy(self(x), y))

    def test_step(self, batch: Any, batch_idx: int) -> None:
        self.validation_step(batch, batch_idx)

    def predict_step(self, batch: Any, batch_idx: int) -> Tensor:
        x, y = unpack(batch)
        self.val_batches.append((x.detach().clone(), y.detach().clone()))
        return self(x)

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=self.lr)


class IndexedImages(Dataset):
    """Synthetic images that remember their index (so tests can tell which samples a step saw)."""

    def __init__(self, n: int = 64, size: int = 8) -> None:
        self.x, self.y = image_tensors(n, size)

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i: int) -> tuple[Tensor, Tensor]:
        return self.x[i], self.y[i]


def loaders(kind: str = "list", n: int = 64, batch_size: int = 16, size: int = 8) -> tuple[DataLoader, DataLoader]:
    """A training and a validation loader yielding batches of the given container ``kind``."""
    x, y = image_tensors(n, size)
    train = DataLoader(TensorDataset(x, y), batch_size=batch_size, shuffle=False, collate_fn=COLLATES[kind])
    xv, yv = image_tensors(32, size, seed=1)
    val = DataLoader(TensorDataset(xv, yv), batch_size=batch_size, collate_fn=COLLATES[kind])
    return train, val


class ImagesDataModule(SpeedupDataModule):
    """The synthetic images through the SpeedupDataModule mixin."""

    num_classes = NUM_CLASSES

    def __init__(self, n: int = 64, size: int = 8, kind: str = "list", **kwargs: Any) -> None:
        kwargs.setdefault("batch_size", 16)
        kwargs.setdefault("collate_fn", COLLATES[kind])
        super().__init__(**kwargs)
        self.n, self.size = n, size

    def setup(self, stage: str) -> None:
        self.train_dataset = TensorDataset(*image_tensors(self.n, self.size))
        self.val_dataset = TensorDataset(*image_tensors(32, self.size, seed=1))

    def val_dataloader(self) -> DataLoader:
        return self.eval_dataloader(self.val_dataset)


def cosine_over_the_run(module: pl.LightningModule, lr: float = 0.1) -> Any:
    """SGD with a per-step cosine schedule sized by ``trainer.estimated_stepping_batches``: reading it makes
    Lightning build the training loader inside the strategy's setup, before the checkpoint's loops are restored
    and before ``on_fit_start`` (Lightning issue #20550)."""
    optimizer = torch.optim.SGD(module.parameters(), lr=lr)
    total = int(module.trainer.estimated_stepping_batches)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, total)
    return [optimizer], [{"scheduler": scheduler, "interval": "step"}]


#: where trainers write what they write by default (a tuner's temporary checkpoints, a checkpoint without
#: `dirpath`): not the folder the tests run from, where a tuner that failed left its `.scale_batch_size_*.ckpt`
_ROOT_DIR = tempfile.mkdtemp(prefix="lightning-speedups-tests-")


def trainer(**kwargs: Any) -> pl.Trainer:
    """A quiet CPU trainer."""
    defaults: dict[str, Any] = {
        "default_root_dir": _ROOT_DIR,
        "accelerator": "cpu",
        "devices": 1,
        "max_epochs": 1,
        "logger": False,
        "enable_checkpointing": False,
        "enable_progress_bar": False,
        "enable_model_summary": False,
        "num_sanity_val_steps": 0,
    }
    defaults.update(kwargs)
    return pl.Trainer(**defaults)
