"""MixUp: train on convex combinations of pairs of samples and of their labels (Zhang et al., 2018)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from torch import Tensor

from lightning_speedups import _checks
from lightning_speedups.functional.mixing import mix, sample_lambda, sample_permutation
from lightning_speedups.targets import TargetTransformCallback

if TYPE_CHECKING:
    import lightning.pytorch as pl


class MixUp(TargetTransformCallback):
    """Replace each training batch by ``lam * batch + (1 - lam) * shuffled batch``, targets alike.

    ``lam ~ Beta(alpha, alpha)`` is drawn once per batch and the partners are a random permutation of the
    batch. Targets become class probabilities ``(N, C)``, which ``nn.CrossEntropyLoss`` and
    ``F.cross_entropy`` accept, so ``training_step`` needs no change. Validation batches are untouched.

    When it helps: regularises long schedules (Zhang et al.: CIFAR-10 DenseNet-BC-190 error 3.7 -> 2.7; on
    ImageNet it gains more at 200 epochs than at 90). When it hurts: short schedules (a gain of only about 0.2
    points at 90 ImageNet epochs), where it slows early
    progress; so presets use it in longer recipes only.

    Args:
        alpha: concentration of the Beta distribution; small values (0.2) keep most samples near one of the
            pair, 1.0 mixes uniformly. Must be > 0.
        **kwargs: ``p``, ``start``, ``end``, ``num_classes``, ``input_key``, ``target_key``,
            ``batch_getter``/``batch_setter``, ``hard_target_key``, ``check_loss``, ``seed``, ``log_knobs``:
            see :class:`~lightning_speedups.targets.TargetTransformCallback`.

    Example::

        import lightning.pytorch as pl
        from lightning_speedups import MixUp

        trainer = pl.Trainer(max_epochs=10, callbacks=[MixUp(alpha=0.2, num_classes=10)])
        # trainer.fit(model, datamodule)  # training_step: F.cross_entropy(model(x), y) works as before
    """

    log_name = "mixup"

    def __init__(self, alpha: float = 0.2, **kwargs: Any) -> None:
        _checks.no_unknown_arguments(MixUp, kwargs)  # what reaches MixUp's own __init__, closest names
        super().__init__(**kwargs)
        self.alpha = _checks.positive("alpha", alpha, hint="Typical values: 0.2 (ImageNet) to 1.0 (CIFAR).")
        self._lam = 1.0

    def apply(self, x: Tensor, target: Tensor, num_classes: int, trainer: pl.Trainer) -> tuple[Tensor, Tensor]:
        rng = self.technique_random(trainer)  # past the draw that decided `p`
        self._lam = sample_lambda(self.alpha, rng)
        perm = sample_permutation(x.shape[0], x.device, rng)
        return mix(x, target, self._lam, perm, num_classes)

    def knobs(self) -> dict[str, float]:
        # a batch left as it was (`applied` 0) has its own weight 1, not the last mixed batch's
        return {**super().knobs(), "lam": self._lam if self._applied else 1.0}
