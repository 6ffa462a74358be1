"""The embedded demo task: scikit-learn's bundled handwritten digits, upscaled, and small image classifiers.

Nothing is downloaded: ``sklearn.datasets.load_digits`` ships 1,797 8x8 greyscale digits inside the
scikit-learn wheel. They are upscaled (bilinear) to ``size`` pixels so that resolution-dependent techniques
have room to act. Used by the examples, the tests and ``lightning-speedups compare``.
"""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.data import TensorDataset

from lightning_speedups import _checks
from lightning_speedups.data import SpeedupDataModule


def load_digits_tensors(
    size: int = 32, val_fraction: float = 0.2, split_seed: int = 0
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """``(x_train, y_train, x_val, y_val)``: digits as ``(N, 1, size, size)`` floats, normalised, split per class.

    The split is stratified and fixed by ``split_seed``; the normalisation uses training statistics only.
    """
    try:
        from sklearn.datasets import load_digits
    except ImportError as err:  # pragma: no cover - depends on the environment
        raise ImportError("The digits demo needs scikit-learn: pip install 'lightning-speedups[demo]'") from err
    _checks.optional_int("size", size, minimum=8)
    _checks.in_range("val_fraction", val_fraction, 0.0, 1.0, low_open=True, high_open=True)
    bunch = load_digits()
    x = torch.tensor(bunch.images, dtype=torch.float32).unsqueeze(1) / 16.0
    y = torch.tensor(bunch.target, dtype=torch.long)
    if size != 8:
        x = F.interpolate(x, size=(size, size), mode="bilinear", align_corners=False)
    g = torch.Generator().manual_seed(split_seed)
    val_idx = []
    for c in range(10):
        idx = torch.nonzero(y == c).flatten()
        idx = idx[torch.randperm(len(idx), generator=g)]
        val_idx.append(idx[: round(len(idx) * val_fraction)])
    val_mask = torch.zeros(len(y), dtype=torch.bool)
    val_mask[torch.cat(val_idx)] = True
    x_train, y_train, x_val, y_val = x[~val_mask], y[~val_mask], x[val_mask], y[val_mask]
    mean, std = x_train.mean(), x_train.std()
    return (x_train - mean) / std, y_train, (x_val - mean) / std, y_val


def prototype_distance(x: Tensor, y: Tensor) -> Tensor:
    """Difficulty per sample: distance to its class's mean image, over the class's mean distance.

    A typical, clean digit sits near its class mean; an odd or sloppy one far away. Dividing by the class's
    mean distance keeps classes with more varied shapes from all landing at the end of a curriculum.

    >>> x = torch.tensor([[0.0], [2.0], [1.0], [1.0]]); y = torch.tensor([0, 0, 1, 1])
    >>> prototype_distance(x, y).tolist()
    [1.0, 1.0, 0.0, 0.0]
    """
    flat = x.reshape(len(x), -1).double()
    out = torch.zeros(len(x), dtype=torch.float64)
    for c in y.unique():
        idx = (y == c).nonzero().squeeze(1)
        d = (flat[idx] - flat[idx].mean(0)).norm(dim=1)
        out[idx] = d / d.mean() if d.mean() > 0 else d
    return out


class DigitsDataModule(SpeedupDataModule):
    """Digits at ``size`` x ``size`` pixels (10 classes, 1,438 train / 359 validation samples).

    Sets ``train_labels`` (for repeat-factor sampling) and ``train_difficulty`` (distance to the class's mean
    image, :func:`prototype_distance`, for curricula).

    Args:
        size: image side in pixels (the originals are 8x8).
        val_fraction: share of each class held out for validation.
        split_seed: seed of the train/validation split.
        **kwargs: loader options of :class:`~lightning_speedups.SpeedupDataModule` (``batch_size``, ...).
    """

    num_classes = 10

    def __init__(self, size: int = 32, val_fraction: float = 0.2, split_seed: int = 0, **kwargs: Any) -> None:
        kwargs.setdefault("batch_size", 64)
        super().__init__(**kwargs)
        self.size = size
        self.val_fraction = val_fraction
        self.split_seed = split_seed
        self.val_dataset: TensorDataset | None = None

    def setup(self, stage: str) -> None:
        if self.train_dataset is None:
            x_train, y_train, x_val, y_val = load_digits_tensors(self.size, self.val_fraction, self.split_seed)
            self.train_dataset = TensorDataset(x_train, y_train)
            self.val_dataset = TensorDataset(x_val, y_val)
            self.train_labels = y_train.numpy()
            self.train_difficulty = prototype_distance(x_train, y_train).numpy()

    def val_dataloader(self) -> Any:
        assert self.val_dataset is not None
        return self.eval_dataloader(self.val_dataset, batch_size=256)


class BasicBlock(nn.Module):
    """A ResNet basic block (two 3x3 convolutions with BatchNorm and a shortcut)."""

    def __init__(self, c_in: int, c_out: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(c_in, c_out, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(c_out)
        self.conv2 = nn.Conv2d(c_out, c_out, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(c_out)
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or c_in != c_out:
            self.shortcut = nn.Sequential(nn.Conv2d(c_in, c_out, 1, stride, bias=False), nn.BatchNorm2d(c_out))

    def forward(self, x: Tensor) -> Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        return F.relu(self.bn2(self.conv2(out)) + self.shortcut(x))


class SmallResNet(nn.Module):
    """A small ResNet for low-resolution images; any input size works (global average pooling).

    Args:
        num_classes: output classes.
        in_channels: input channels.
        widths: channels of each stage; every stage after the first halves the resolution.
        dropout: dropout before the classifier (0 disables it).
    """

    def __init__(
        self,
        num_classes: int = 10,
        in_channels: int = 1,
        widths: tuple[int, ...] = (16, 32, 64),
        dropout: float = 0.0,
    ) -> None:
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(in_channels, widths[0], 3, 1, 1, bias=False), nn.BatchNorm2d(widths[0]), nn.ReLU()
        )
        blocks = []
        c_in = widths[0]
        for i, c_out in enumerate(widths):
            blocks.append(BasicBlock(c_in, c_out, stride=1 if i == 0 else 2))
            c_in = c_out
        self.blocks = nn.Sequential(*blocks)
        self.dropout = nn.Dropout(dropout)
        self.fc = nn.Linear(c_in, num_classes)

    def forward(self, x: Tensor) -> Tensor:
        x = self.blocks(self.stem(x))
        return self.fc(self.dropout(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1)))


class PlainClassifier(pl.LightningModule):
    """A plain classifier around ``self.model``: ``F.cross_entropy`` in ``training_step``, accuracy in
    ``validation_step``, SGD or AdamW with a per-step cosine schedule.

    Its ``training_step`` is what users write without our callbacks, on purpose: the callbacks must work
    with it unchanged. Subclasses set ``self.model`` and call ``self.save_hyperparameters()`` (which must
    hold ``lr``, ``optimizer``, ``weight_decay`` and ``schedule``).
    """

    def __init__(self, num_classes: int, optimizer: str, schedule: str) -> None:
        super().__init__()
        if optimizer not in ("sgd", "adamw"):
            raise ValueError(f"`optimizer` must be 'sgd' or 'adamw', got {optimizer!r}.")
        if schedule not in ("cosine", "constant"):
            raise ValueError(f"`schedule` must be 'cosine' or 'constant', got {schedule!r}.")
        self.num_classes = num_classes

    def forward(self, x: Tensor) -> Tensor:
        return self.model(x)

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        x, y = batch
        loss = F.cross_entropy(self(x), y)
        self.log("train_loss", loss, prog_bar=True)
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        logits = self(x)
        # synced: under DDP each rank validates a shard, and every rank must read the same accuracy
        self.log("val_loss", F.cross_entropy(logits, y), sync_dist=True)
        self.log("val_acc", (logits.argmax(1) == y).float().mean(), prog_bar=True, sync_dist=True)

    def configure_optimizers(self) -> Any:
        hp = self.hparams
        if hp.optimizer == "sgd":
            opt: torch.optim.Optimizer = torch.optim.SGD(
                self.parameters(), lr=hp.lr, momentum=0.9, nesterov=True, weight_decay=hp.weight_decay
            )
        else:
            opt = torch.optim.AdamW(self.parameters(), lr=hp.lr, weight_decay=hp.weight_decay)
        if hp.schedule == "constant":
            return opt
        total = max(1, int(self.trainer.estimated_stepping_batches))
        sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=total)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


class ImageClassifier(PlainClassifier):
    """:class:`PlainClassifier` around a :class:`SmallResNet`.

    Args:
        num_classes: output classes.
        lr: peak learning rate.
        optimizer: ``"sgd"`` (Nesterov momentum 0.9) or ``"adamw"``.
        weight_decay: weight decay.
        schedule: ``"cosine"`` (per step, to zero over the run) or ``"constant"``.
        widths: channels of the :class:`SmallResNet` stages.
        dropout: dropout before the classifier.
        in_channels: input channels.
    """

    def __init__(
        self,
        num_classes: int = 10,
        lr: float = 0.05,
        optimizer: str = "sgd",
        weight_decay: float = 5e-4,
        schedule: str = "cosine",
        widths: tuple[int, ...] = (16, 32, 64),
        dropout: float = 0.0,
        in_channels: int = 1,
    ) -> None:
        super().__init__(num_classes, optimizer, schedule)
        self.save_hyperparameters()
        self.model = SmallResNet(num_classes, in_channels, tuple(widths), dropout)
