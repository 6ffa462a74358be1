"""BatchNorm running statistics: snapshot, restore, re-estimate on given inputs, pool across processes.

A network trained at one input size keeps BatchNorm running statistics of the activations *at that size*.
Evaluated at another size, its activations have other statistics and the stored ones normalise them wrongly:
accuracy can collapse although the weights are good. Re-estimating the statistics on a few batches at the
evaluation size (as "precise BN" does) fixes that without touching the weights.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn
from torch.nn.modules.batchnorm import _BatchNorm
from torch.nn.parameter import UninitializedBuffer

#: ``forward(model, inputs)``: how to run the model on one calibration input.
Forward = Callable[[nn.Module, Any], Any]


def _has_statistics(bn: _BatchNorm) -> bool:
    """Whether ``bn`` keeps running statistics that exist (a lazy layer before its first batch has none yet)."""
    return (
        bn.track_running_stats
        and bn.running_mean is not None
        and bn.running_var is not None
        and not isinstance(bn.running_mean, UninitializedBuffer)
    )


def batchnorm_layers(model: nn.Module, *, lazy: bool = False) -> list[_BatchNorm]:
    """The BatchNorm layers of ``model`` that keep running statistics (``SyncBatchNorm`` included); with
    ``lazy``, also the lazy ones whose statistics the first batch has yet to create."""
    return [
        m
        for m in model.modules()
        if isinstance(m, _BatchNorm) and (_has_statistics(m) or (lazy and m.track_running_stats))
    ]


@dataclass
class BatchNormSnapshot:
    """Copies of the running statistics and momentum of BatchNorm layers; :meth:`restore` puts them back."""

    layers: list[_BatchNorm]
    means: list[Tensor] = field(default_factory=list)
    variances: list[Tensor] = field(default_factory=list)
    counts: list[Tensor | None] = field(default_factory=list)
    momenta: list[float | None] = field(default_factory=list)

    def restore(self, only: Iterable[int] | None = None) -> None:
        """Write the saved values back into the layers' own buffers (in place, so references stay valid);
        ``only``: the positions in :attr:`layers` to restore (default: all)."""
        with torch.no_grad():
            for i in range(len(self.layers)) if only is None else only:
                bn = self.layers[i]
                bn.running_mean.copy_(self.means[i])
                bn.running_var.copy_(self.variances[i])
                if bn.num_batches_tracked is not None and self.counts[i] is not None:
                    bn.num_batches_tracked.copy_(self.counts[i])
                bn.momentum = self.momenta[i]

    def state_dict_entries(self, model: nn.Module) -> dict[str, Tensor]:
        """The saved buffers under their ``model.state_dict()`` keys (for a checkpoint taken meanwhile)."""
        names = {id(m): name for name, m in model.named_modules()}
        entries: dict[str, Tensor] = {}
        for i, bn in enumerate(self.layers):
            name = names.get(id(bn))
            if name is None:
                continue
            prefix = f"{name}." if name else ""
            entries[prefix + "running_mean"] = self.means[i].clone()
            entries[prefix + "running_var"] = self.variances[i].clone()
            if self.counts[i] is not None:
                entries[prefix + "num_batches_tracked"] = self.counts[i].clone()  # type: ignore[union-attr]
        return entries


def snapshot_batchnorm(model: nn.Module, layers: Sequence[_BatchNorm] | None = None) -> BatchNormSnapshot:
    """Save the running statistics of every BatchNorm layer of ``model`` (or of the given ``layers``).

    Given ``layers`` without running statistics (``track_running_stats=False``) are left out: nothing to save.
    """
    layers = batchnorm_layers(model) if layers is None else [bn for bn in layers if _has_statistics(bn)]
    with torch.no_grad():
        return BatchNormSnapshot(
            layers,
            [bn.running_mean.clone() for bn in layers],
            [bn.running_var.clone() for bn in layers],
            [bn.num_batches_tracked.clone() if bn.num_batches_tracked is not None else None for bn in layers],
            [bn.momentum for bn in layers],
        )


@contextlib.contextmanager
def train_modes_kept(model: nn.Module) -> Iterator[None]:
    """Put every submodule's train/eval flag back as it was on exit (``model.train()`` would set them all)."""
    modes = [(m, m.training) for m in model.modules()]
    try:
        yield
    finally:
        for module, training in modes:
            module.training = training


def _call(model: nn.Module, inputs: Any) -> Any:
    return model(inputs)


def recalibrate_batchnorm(
    model: nn.Module,
    inputs: Iterable[Any],
    forward: Forward | None = None,
    *,
    layers: Sequence[_BatchNorm] | None = None,
    unreached: list[_BatchNorm] | None = None,
) -> int:
    """Re-estimate the BatchNorm running statistics of ``model`` on ``inputs``; returns the batches used.

    The statistics become the plain average over the given batches (``momentum=None``); empty batches are
    skipped, and a forward that raises leaves the statistics as they were. Only the BatchNorm
    layers being recalibrated run in training mode: dropout and every other module (frozen BatchNorm layers
    left out of ``layers`` included) stay in eval mode, so the statistics are those of the activations that
    evaluation will see. No gradients are computed and no weight changes. A layer the forward never reaches
    (e.g. a head applied outside ``forward``) keeps its statistics. Afterwards every module's train/eval mode
    and each layer's momentum are as they were; take a :func:`snapshot_batchnorm` first to be able to undo the
    new statistics. With no inputs nothing changes.

    Args:
        model: the network (a ``LightningModule`` works: its ``forward`` is called).
        inputs: the batches to run, each passed to ``forward``.
        forward: ``forward(model, batch)``; defaults to ``model(batch)``.
        layers: the layers to recalibrate; default: every BatchNorm layer of ``model`` that keeps running
            statistics. Leave out layers frozen in eval mode during training.
        unreached: a list to which the layers that the forward never ran are appended.

    Example::

        >>> net = nn.Sequential(nn.Conv2d(1, 4, 3), nn.BatchNorm2d(4))
        >>> recalibrate_batchnorm(net, [torch.randn(8, 1, 16, 16) + 3.0 for _ in range(4)])
        4
        >>> bool(net[1].running_mean.abs().sum() > 0), net[1].momentum, net.training
        (True, 0.1, True)
    """
    tracked = batchnorm_layers(model)
    if layers is not None:
        chosen = {id(bn) for bn in layers}
        tracked = [bn for bn in tracked if id(bn) in chosen]
    if not tracked:
        return 0
    batches = iter(inputs)
    first = next(batches, None)
    if first is None:
        return 0
    forward = forward or _call
    before = snapshot_batchnorm(model, tracked)
    used = 0
    saw_samples = saw_empty = False

    def uncount_empty(bn: nn.Module, args: tuple[Any, ...], output: Any) -> None:
        # BatchNorm counts an input without samples as a batch (its statistics untouched): under the cumulative
        # average that weighs the next batches against the reset mean 0 and variance 1
        nonlocal saw_samples, saw_empty
        if args and isinstance(args[0], Tensor) and args[0].numel() == 0:
            saw_empty = True
            # a SyncBatchNorm of several processes takes the other processes' statistics even here: a batch
            synced = isinstance(bn, nn.SyncBatchNorm) and _distributed()
            if bn.num_batches_tracked is not None and not synced:
                bn.num_batches_tracked.sub_(1)
        else:
            saw_samples = True

    hooks = [bn.register_forward_hook(uncount_empty) for bn in tracked]
    try:
        with train_modes_kept(model), torch.no_grad():
            model.eval()
            for bn in tracked:
                bn.reset_running_stats()
                bn.momentum = None  # cumulative average over the calibration batches
                bn.training = True  # the flag only: a `train()` override that pins eval mode is not called
            for batch in (first, *batches):
                if isinstance(batch, Tensor) and not batch.shape[0]:
                    continue  # no samples: nothing to run
                saw_samples = saw_empty = False
                forward(model, batch)
                used += saw_samples or not saw_empty  # a batch (or dict, tuple) whose input held no samples is not one
    except BaseException:
        before.restore()  # all or nothing: not reset or half-updated statistics
        raise
    finally:
        for hook in hooks:
            hook.remove()
        for bn, momentum in zip(tracked, before.momenta, strict=True):
            bn.momentum = momentum
    missed = [i for i, bn in enumerate(tracked) if bn.num_batches_tracked is not None and not bn.num_batches_tracked]
    before.restore(missed)  # never run by the forward: reset statistics would be mean 0, variance 1
    if unreached is not None:
        unreached.extend(tracked[i] for i in missed)
    return used


def _distributed() -> bool:
    return (
        torch.distributed.is_available()
        and torch.distributed.is_initialized()
        and torch.distributed.get_world_size() > 1
    )


def pool_batchnorm_statistics(
    model: nn.Module, mean_across: Callable[[Tensor], Tensor], layers: Sequence[_BatchNorm] | None = None
) -> None:
    """Replace each layer's statistics by those of the union of all processes' calibration samples.

    ``mean_across(t)`` must return the mean of ``t`` over the processes (e.g. a DDP strategy's ``reduce``); it
    may overwrite ``t`` with it, as Lightning's does.
    With equally many samples per process the pooled mean is the mean of the means, and the pooled
    variance is the mean of the variances plus the mean squared distance of each process's mean to the pooled one
    (in float64: ``E[x**2] - E[x]**2`` in float32 cancels the variance of a channel whose mean is large next to its
    spread). ``layers``: those to pool (default: all); every process must pass the same ones. Layers without
    running statistics are skipped.
    """
    with torch.no_grad():
        for bn in batchnorm_layers(model) if layers is None else [bn for bn in layers if _has_statistics(bn)]:
            wide = torch.float32 if bn.running_mean.device.type == "mps" else torch.float64  # MPS has no float64
            mean = bn.running_mean.detach().to(wide, copy=True)
            pooled_mean = mean_across(mean.clone())  # a reduce may work in place (Lightning's DDP `reduce` does)
            spread = (mean - pooled_mean) ** 2
            pooled_var = mean_across(bn.running_var.detach().to(wide, copy=True)) + mean_across(spread)
            bn.running_mean.copy_(pooled_mean.to(bn.running_mean.dtype))
            bn.running_var.copy_(pooled_var.to(bn.running_var.dtype))
