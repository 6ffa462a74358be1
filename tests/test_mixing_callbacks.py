"""MixUp, CutMix and LabelSmoothing in real `Trainer.fit` runs on CPU, and their errors."""

import copy
import pickle
import re
import warnings
from typing import Any

import lightning.pytorch as pl
import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from lightning_speedups import CutMix, LabelSmoothing, MixUp, SpeedupWarning, TargetTransformCallback, hard_labels
from lightning_speedups.functional import as_probabilities
from tests.helpers import (
    NUM_CLASSES,
    ImagesDataModule,
    MemoryLogger,
    RecordingModule,
    image_tensors,
    loaders,
    trainer,
    unpack,
)

C = NUM_CLASSES


def originals(kind: str) -> list[tuple[torch.Tensor, torch.Tensor]]:
    train, _ = loaders(kind)
    return [unpack(b) for b in train]


def recover_mix(x0, y0, x, y):
    """Find the batch's lam and each sample's partner from the targets; assert the inputs agree."""
    onehot = F.one_hot(y0, C).float()
    own = y[torch.arange(len(y0)), y0]
    weights = own[own < 1 - 1e-6]
    assert weights.numel(), "no sample was mixed with a partner of another class"
    lam = weights[0].item()
    assert torch.allclose(weights, torch.full_like(weights, lam), atol=1e-5), "one lam per batch"
    partners = []
    for j in range(len(y0)):
        matches = [
            k
            for k in range(len(y0))
            if torch.allclose(y[j], lam * onehot[j] + (1 - lam) * onehot[k], atol=1e-5)
            and torch.allclose(x[j], lam * x0[j] + (1 - lam) * x0[k], atol=1e-5)
        ]
        assert matches, f"sample {j} is not lam*x + (1-lam)*x[k] for any partner k"
        partners.append(matches)
    # the partners can be chosen as a permutation (each sample is someone's partner once)
    assert len({m[0] for m in partners if len(m) == 1}) == sum(len(m) == 1 for m in partners)
    return lam


@pytest.mark.parametrize("kind", ["list", "tuple", "dict"])
def test_mixup_fit_mixes_inputs_and_targets_alike(kind):
    model = RecordingModule()
    t = trainer(callbacks=[MixUp(alpha=1.0, seed=0)], max_epochs=1)
    t.fit(model, *loaders(kind))
    assert len(model.train_batches) == 4
    lams = []
    for (x, y), (x0, y0) in zip(model.train_batches, originals(kind), strict=True):
        assert y.dtype == torch.float32 and y.shape == (16, C)
        assert torch.allclose(y.sum(1), torch.ones(16))
        lams.append(recover_mix(x0, y0, x, y))
    assert len(set(round(v, 6) for v in lams)) > 1  # a new lam per batch
    for _xv, yv in model.val_batches:
        assert not yv.is_floating_point()  # validation keeps its labels


@pytest.mark.parametrize("kind", ["list", "tuple", "dict"])
def test_cutmix_fit_pastes_boxes_and_weights_targets_by_area(kind):
    model = RecordingModule(size=8)
    t = trainer(callbacks=[CutMix(alpha=1.0, seed=1)], max_epochs=1)
    t.fit(model, *loaders(kind))
    checked = 0
    for (x, y), (x0, y0) in zip(model.train_batches, originals(kind), strict=True):
        changed = (x != x0).any(dim=0).any(dim=0)  # (H, W): pixels changed in some sample
        rows, cols = torch.nonzero(changed, as_tuple=True)
        if rows.numel() == 0:
            continue  # an empty box or identical partners
        checked += 1
        box_area = (rows.max() - rows.min() + 1) * (cols.max() - cols.min() + 1)
        assert box_area.item() == changed.sum().item()  # the changed pixels form one rectangle
        lam = 1 - box_area.item() / 64
        onehot = F.one_hot(y0, C).float()
        for j in range(16):
            if y0[j] == y[j].argmax() and y[j].max() == 1.0:
                continue  # partner of the same class
            assert y[j, y0[j]].item() == pytest.approx(lam, abs=1e-6)
            assert torch.allclose(y[j].sum(), torch.tensor(1.0))
        assert not torch.equal(y, onehot)
    assert checked >= 2


@pytest.mark.parametrize("kind", ["list", "tuple", "dict"])
def test_label_smoothing_target_mode(kind):
    model = RecordingModule()
    trainer(callbacks=[LabelSmoothing(0.2)], max_epochs=1).fit(model, *loaders(kind))
    for (x, y), (x0, y0) in zip(model.train_batches, originals(kind), strict=True):
        assert torch.equal(x, x0)
        assert torch.allclose(y, 0.8 * F.one_hot(y0, C) + 0.2 / C)


class CriterionProbe(RecordingModule):
    """Records the criterion's label_smoothing inside training and validation steps."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(use_criterion=True, **kwargs)
        self.train_eps: list[float] = []
        self.val_eps: list[float] = []
        self.loss_check: list[tuple[float, float]] = []

    def training_step(self, batch, batch_idx):
        self.train_eps.append(self.criterion.label_smoothing)
        loss = super().training_step(batch, batch_idx)
        x, y = unpack(batch)
        with torch.no_grad():
            logits = self(x)
            eps = self.criterion.label_smoothing
            soft = y if y.is_floating_point() else F.one_hot(y, C).float()
            by_hand = -(((1 - eps) * soft + eps / C) * F.log_softmax(logits, 1)).sum(1).mean()
            self.loss_check.append((float(self.criterion(logits, y)), float(by_hand)))
        return loss

    def validation_step(self, batch, batch_idx):
        self.val_eps.append(self.criterion.label_smoothing)
        return super().validation_step(batch, batch_idx)


def test_label_smoothing_loss_mode_sets_and_restores_the_criterion():
    model = CriterionProbe()
    t = trainer(callbacks=[LabelSmoothing(0.1, method="loss")], max_epochs=2, num_sanity_val_steps=1)
    t.fit(model, *loaders("list"))
    assert model.train_eps == [0.1] * 8
    assert model.val_eps and set(model.val_eps) == {0.0}
    assert model.criterion.label_smoothing == 0.0
    assert all(not y.is_floating_point() for _, y in model.train_batches)  # hard labels kept
    for got, by_hand in model.loss_check:
        assert got == pytest.approx(by_hand, rel=1e-5)


def test_mixup_with_label_smoothing_smooths_once_in_either_order_and_mode():
    for callbacks in (
        [MixUp(alpha=1.0, seed=3), LabelSmoothing(0.1)],
        [LabelSmoothing(0.1), MixUp(alpha=1.0, seed=3)],
    ):
        model = RecordingModule()
        trainer(callbacks=callbacks, max_epochs=1).fit(model, *loaders("list"))
        for (x, y), (x0, y0) in zip(model.train_batches, originals("list"), strict=True):
            unsmoothed = (y - 0.1 / C) / 0.9  # undo one smoothing: must be a valid mixed target
            assert torch.allclose(unsmoothed.sum(1), torch.ones(16), atol=1e-5)
            assert unsmoothed.min() > -1e-5
            recover_mix(x0, y0, x, unsmoothed)
    # loss mode: the criterion smooths the mixed targets, once, as the hand computation says
    model = CriterionProbe()
    trainer(callbacks=[MixUp(alpha=1.0), LabelSmoothing(0.1, method="loss")], max_epochs=1).fit(model, *loaders("list"))
    assert model.train_eps == [0.1] * 4
    for _, y in model.train_batches:
        assert y.is_floating_point() and y.min() >= 0 and torch.allclose(y.sum(1), torch.ones(16))
    for got, by_hand in model.loss_check:
        assert got == pytest.approx(by_hand, rel=1e-5)


def test_probability_and_window():
    model = RecordingModule()
    trainer(callbacks=[MixUp(p=0.0)], max_epochs=1).fit(model, *loaders("list"))
    assert all(not y.is_floating_point() for _, y in model.train_batches)

    model = RecordingModule()
    trainer(callbacks=[MixUp(start=0.5)], max_epochs=2).fit(model, *loaders("list"))
    mixed = [y.is_floating_point() for _, y in model.train_batches]
    assert mixed == [False] * 4 + [True] * 4

    model = RecordingModule()
    trainer(callbacks=[LabelSmoothing(p=0.5, seed=0)], max_epochs=4).fit(model, *loaders("list"))
    smoothed = [y.is_floating_point() for _, y in model.train_batches]
    assert 0 < sum(smoothed) < len(smoothed)


def test_a_window_in_a_run_bounded_by_time_alone_is_refused_before_the_first_batch():
    from lightning.pytorch.callbacks import LambdaCallback

    epochs = []
    started = LambdaCallback(on_train_epoch_start=lambda *_: epochs.append(1))
    model = RecordingModule()
    with pytest.raises(RuntimeError, match="MixUp follows training progress, which needs a finite run length"):
        trainer(callbacks=[MixUp(start=0.5), started], max_epochs=-1, max_time={"minutes": 5}).fit(
            model, *loaders("list")
        )
    assert epochs == [] and model.train_batches == []  # at fit start, not at the first batch


def test_a_callback_that_drew_in_a_fit_pickles_without_its_torch_generator():
    # ddp_spawn pickles the callbacks into its processes; a torch.Generator kept from an earlier fit's draws
    # made them die while unpickling ("unable to resize file")
    cb = CutMix()
    trainer(callbacks=[cb], max_steps=2).fit(RecordingModule(), *loaders("list"))
    assert "_batch_random" in cb.__dict__
    copy_ = pickle.loads(pickle.dumps(cb))
    assert "_batch_random" not in copy_.__dict__ and copy_.alpha == cb.alpha
    model = RecordingModule()
    trainer(callbacks=[copy_], max_steps=1).fit(model, *loaders("list"))  # draws again
    assert model.train_batches[0][1].is_floating_point()


def test_hard_labels_for_training_metrics():
    model = RecordingModule()
    train, val = loaders("dict")
    trainer(callbacks=[MixUp(alpha=0.2, hard_target_key="label_hard")], max_steps=1).fit(model, train, val)
    batch = next(iter(train))
    y = model.train_batches[0][1]
    assert hard_labels(batch["label"]) is batch["label"]
    assert hard_labels(y).shape == (16,)
    float_indices = torch.tensor([1.0, 2.0, 0.0])  # (N,) class indices as floats: indices, not one row
    assert hard_labels(float_indices) is float_indices


def test_a_torchmetrics_metric_fed_the_soft_targets_is_warned_about():
    # torchmetrics takes (N, C) float targets without a word, and an accuracy of them reads 0
    import torchmetrics

    class WithAccuracy(RecordingModule):
        def __init__(self, hard):
            super().__init__(record=False)
            self.hard, self.train_acc = hard, torchmetrics.Accuracy("multiclass", num_classes=C)

        def training_step(self, batch, batch_idx):
            x, y = unpack(batch)
            self.train_acc(self(x), hard_labels(y) if self.hard else y)
            return super().training_step(batch, batch_idx)

    with pytest.warns(SpeedupWarning, match=r"MixUp: the module's MulticlassAccuracy got class probabilities"):
        trainer(callbacks=[MixUp()], max_steps=2).fit(WithAccuracy(hard=False), loaders("list")[0])
    # two target callbacks, one metric call: one warning, naming both (it came once per callback)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer(callbacks=[MixUp(), LabelSmoothing()], max_steps=2).fit(WithAccuracy(hard=False), loaders("list")[0])
    said = [str(w.message) for w in caught if "got class probabilities" in str(w.message)]
    assert len(said) == 1 and "(made by MixUp, LabelSmoothing)" in said[0]
    copies = []

    class AlsoDivergence(WithAccuracy):  # a divergence takes probabilities on purpose: no warning for it
        def __init__(self):
            super().__init__(hard=True)
            self.kl = torchmetrics.KLDivergence()

        def training_step(self, batch, batch_idx):
            copies.append(copy.deepcopy(self))  # an EMA or teacher copy taken mid-fit
            x, y = unpack(batch)
            self.kl(F.softmax(self(x), -1).detach(), y)
            return super().training_step(batch, batch_idx)

    model = AlsoDivergence()
    with warnings.catch_warnings():
        warnings.simplefilter("error", SpeedupWarning)
        trainer(callbacks=[MixUp()], max_steps=2).fit(model, loaders("list")[0])
    assert not model.train_acc._forward_pre_hooks and not model.kl._forward_pre_hooks  # off at the end of the fit
    (watch,) = copies[0].train_acc._forward_pre_hooks.values()  # the copy's is inert: no callback, no trainer in it
    assert type(watch).__name__ == "_InertWatch" and len(pickle.dumps(watch)) < 100


def test_hard_target_key_keeps_the_original_labels():
    seen = []

    class KeepsHard(RecordingModule):
        def training_step(self, batch, batch_idx):
            seen.append(batch["label_hard"].clone())
            return super().training_step(batch, batch_idx)

    train, val = loaders("dict")
    trainer(callbacks=[MixUp(hard_target_key="label_hard")], max_epochs=1).fit(KeepsHard(), train, val)
    assert [s.tolist() for s in seen] == [b["label"].tolist() for b in train]


@pytest.mark.parametrize("passes_through", ["weight_averaging", "lr_finder", "batch_size_finder"])
def test_hard_target_key_is_filled_on_batches_the_seam_leaves_as_they_came(passes_through, tmp_path):
    """StochasticWeightAveraging's BatchNorm epoch and a finder's trial steps skip the transforms: their batches
    still carry the original labels under `hard_target_key`, which `training_step` reads (it raised KeyError)."""
    from lightning.pytorch.callbacks import BatchSizeFinder, LearningRateFinder, StochasticWeightAveraging

    seen = []

    class KeepsHard(RecordingModule):
        def __init__(self):
            super().__init__(record=False)
            self.norm = nn.BatchNorm2d(1)  # gives SWA its BatchNorm epoch

        def forward(self, x):
            return self.net(self.norm(x))

        def training_step(self, batch, batch_idx):
            seen.append((batch["label"].is_floating_point(), torch.equal(batch["label_hard"], batch["label"])))
            return super().training_step(batch, batch_idx)

    extra = {
        "weight_averaging": StochasticWeightAveraging(swa_lrs=0.05, swa_epoch_start=1),
        "lr_finder": LearningRateFinder(num_training_steps=3),
        "batch_size_finder": BatchSizeFinder(max_trials=1, steps_per_trial=1),
    }[passes_through]
    mixup = MixUp(alpha=1.0, hard_target_key="label_hard")
    data = ImagesDataModule(kind="dict", num_workers=0)
    trainer(callbacks=[mixup, extra], max_epochs=2, default_root_dir=tmp_path).fit(KeepsHard(), datamodule=data)
    as_they_came = [same for mixed, same in seen if not mixed]  # labels as they came: the kept ones are them
    assert as_they_came and all(as_they_came)
    assert sum(mixed for mixed, _ in seen) == 2 * -(-64 // data.batch_size)  # every batch of the 2 epochs, mixed
    if passes_through == "weight_averaging":
        assert len(as_they_came) == 4 and mixup.knobs()["applied"] == 0.0  # the last batch was not mixed


# ---------------------------------------------------------------------------------------------- errors
@pytest.mark.parametrize(
    ("factory", "message"),
    [
        (lambda: MixUp(alpha=0), "`alpha` must be > 0"),
        (lambda: MixUp(alpha=-1.0), "`alpha` must be > 0"),
        (lambda: CutMix(alpha=0.0), "`alpha` must be > 0"),
        (lambda: LabelSmoothing(smoothing=1.0), r"`smoothing` must be in \[0, 1\)"),
        (lambda: LabelSmoothing(smoothing=-0.1), r"`smoothing` must be in \[0, 1\)"),
        (lambda: MixUp(p=1.5), r"`p` must be in \[0, 1\]"),
        (lambda: CutMix(p=-0.1), r"`p` must be in \[0, 1\]"),
        (lambda: MixUp(start=0.6, end=0.4), "`end`"),
        (lambda: MixUp(num_classes=1), "`num_classes` must be >= 2"),
        (lambda: LabelSmoothing(method="logits"), "`method` must be one of"),
        (lambda: MixUp(alpha="big"), "`alpha` must be a finite number"),
        # a misspelt keyword names the class used (not the base that takes **kwargs) and the closest argument
        (lambda: MixUp(alpah=0.2), r"MixUp has no argument 'alpah' \('alpah': did you mean 'alpha'\?\)"),
        (lambda: CutMix(num_clases=3), r"CutMix has no argument 'num_clases'.*did you mean 'num_classes'"),
        (lambda: LabelSmoothing(smothing=0.1), r"LabelSmoothing has no argument 'smothing'.*'smoothing'"),
    ],
)
def test_bad_arguments_fail_at_construction(factory, message):
    with pytest.raises((ValueError, TypeError), match=message):
        factory()


def fit_expecting(callbacks, message, model=None, train=None, error=(ValueError, TypeError)):
    model = model or RecordingModule()
    before = [p.detach().clone() for p in model.parameters()]
    train = train or loaders("list")[0]
    with pytest.raises(error, match=message):
        trainer(callbacks=callbacks, max_epochs=1).fit(model, train)
    # raised before any optimizer step: nothing was lost
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))


def test_integer_inputs_to_mix():
    x, y = image_tensors(32)
    train = DataLoader(TensorDataset((x * 50).to(torch.uint8), y), batch_size=16)
    for cb in (MixUp(), CutMix()):
        fit_expecting([cb], "must be floating point; got dtype torch.uint8", train=train)


def test_label_smoothing_of_zero_leaves_the_labels_alone():
    # smoothing=0 (a sweep's value, a config turning it off) handed the step one-hot float targets, and refused
    # losses it would not otherwise touch: not the run without the callback
    model = WithLoss(nn.CrossEntropyLoss(ignore_index=255))
    trainer(callbacks=[LabelSmoothing(smoothing=0.0)], max_steps=1).fit(model, loaders()[0])
    assert model.train_batches[0][1].dtype == torch.int64 and model.train_batches[0][1].ndim == 1


def test_a_callback_turned_off_with_p_0_does_not_check_batches_it_never_changes():
    # p=0 (a config or sweep turning the technique off) still ran the first batch's checks, and stopped the run
    x, _ = image_tensors(32)
    logits = DataLoader(TensorDataset(x, torch.randn(32, C) * 5), batch_size=16)  # not probabilities
    model = RecordingModule()
    trainer(callbacks=[MixUp(p=0.0), LabelSmoothing(p=0.0)], max_epochs=1).fit(model, logits)
    assert model.global_step == 2 and torch.equal(model.train_batches[0][1], logits.dataset.tensors[1][:16])
    fit_expecting([MixUp(p=0.01)], r"must lie in \[0, 1\]", train=logits)  # any chance to act: checked
    # nor the loss at fit start (a model whose loss needs integer labels; one without any nn.CrossEntropyLoss)
    nll = WithLoss(nn.NLLLoss())
    trainer(callbacks=[MixUp(p=0.0), LabelSmoothing(p=0.0, method="loss")], max_epochs=1).fit(nll, loaders()[0])
    assert nll.global_step > 0


def test_targets_neither_indices_nor_probabilities():
    x, _ = image_tensors(32)
    regression = DataLoader(TensorDataset(x, torch.randn(32)), batch_size=16)
    fit_expecting([MixUp()], r"class probabilities of shape \(N, C\), got shape \(16,\)", train=regression)
    logits = DataLoader(TensorDataset(x, torch.randn(32, C) * 5), batch_size=16)
    fit_expecting([LabelSmoothing()], r"must lie in \[0, 1\]", train=logits)
    ignored = DataLoader(TensorDataset(x, torch.full((32,), -100)), batch_size=16)
    fit_expecting([MixUp()], "ignore_index", train=ignored)
    fit_expecting([LabelSmoothing()], r"ignore_index.*LabelSmoothing\(method='loss'\)", train=ignored)
    as_floats = DataLoader(TensorDataset(x, torch.arange(32.0) % C), batch_size=16)
    fit_expecting(
        [LabelSmoothing()], r"Class indices stored as floats\? Make them integers: `y.long\(\)`", train=as_floats
    )


def test_a_loss_over_another_number_of_classes_is_told_where_the_targets_width_came_from():
    # torch's own error speaks of the target's shape only; the note names the class count and the fix
    with pytest.raises(RuntimeError) as caught:
        model = RecordingModule(num_classes=None)  # nothing to check the count against before the step
        trainer(callbacks=[MixUp(num_classes=C + 3)], max_steps=1).fit(model, loaders("list")[0])
    assert f"MixUp gave this training step class probabilities of shape (N, {C + 3})" in "\n".join(
        getattr(caught.value, "__notes__", [])
    )
    # a model that says another count: warned at fit start (only the crash above, at the first step, said so);
    # not refused, since the model's attribute may count something else than its logits (background, say)
    said = rf"num_classes={C + 3} was given, but the model or DataModule says {C} classes"
    with pytest.warns(SpeedupWarning, match=said), pytest.raises(RuntimeError):
        trainer(callbacks=[MixUp(num_classes=C + 3)], max_steps=1).fit(RecordingModule(), loaders("list")[0])
    with warnings.catch_warnings():  # turned off (p=0): nothing to say
        warnings.filterwarnings("error", message=".*was given, but the model", category=SpeedupWarning)
        trainer(callbacks=[MixUp(p=0.0, num_classes=C + 3)], max_steps=1).fit(RecordingModule(), loaders("list")[0])

    # sources that disagree among themselves: the count given chooses between them, as the error of
    # `infer_num_classes` advises
    class TenClasses(ImagesDataModule):
        num_classes = 10

    model = RecordingModule()
    trainer(callbacks=[MixUp(num_classes=C)], max_steps=1).fit(model, datamodule=TenClasses())
    assert model.train_batches[0][1].shape[1] == C

    class TrainingAccuracy(RecordingModule):  # the usual metric, on the soft targets: a broadcast error
        def training_step(self, batch, batch_idx):
            x, y = unpack(batch)
            self.log("train_acc", (self(x).argmax(1) == y).float().mean())
            return super().training_step(batch, batch_idx)

    with pytest.raises(RuntimeError, match="must match the size") as caught:
        trainer(callbacks=[LabelSmoothing()], max_steps=1).fit(TrainingAccuracy(), loaders("list")[0])
    assert "needs the labels back: `lightning_speedups.hard_labels(y)`" in "\n".join(caught.value.__notes__)

    class FailsInValidation(RecordingModule):  # after a mixed training batch: not the targets' doing
        def validation_step(self, batch, batch_idx):
            x, y = unpack(batch)
            return F.cross_entropy(self(x), y[:-1])

    with pytest.raises(ValueError, match="to match target batch_size") as caught:
        trainer(callbacks=[MixUp()], max_steps=1, val_check_interval=1).fit(FailsInValidation(), *loaders("list"))
    assert not getattr(caught.value, "__notes__", [])


class Batches(torch.utils.data.Dataset):
    """Prebuilt training batches, one per index (use with `batch_size=None`)."""

    def __init__(self, batches):
        self.batches = batches

    def __len__(self):
        return len(self.batches)

    def __getitem__(self, i):
        return self.batches[i]


@pytest.mark.parametrize(
    ("later", "match"),
    [
        (lambda x, y: (x, torch.randn(16, C) * 5), r"must lie in \[0, 1\]"),  # logits from the third batch on
        (lambda x, y: (x[:12], y), r"do not share a batch dimension"),
        (lambda x, y: (x, y[:, None]), r"shape \(16, 1\)"),
    ],
    ids=["logits", "sizes", "column"],
)
def test_a_later_batch_of_another_kind_gets_the_first_batch_checks(later, match):
    x, y = image_tensors(48)
    good = [(x[i : i + 16], y[i : i + 16]) for i in (0, 16)]
    train = DataLoader(Batches([*good, later(x[32:], y[32:])]), batch_size=None)
    for cb in (MixUp(), LabelSmoothing()) if match != "do not share a batch dimension" else (MixUp(), CutMix()):
        model = RecordingModule()
        with pytest.raises((ValueError, TypeError), match=match):
            trainer(callbacks=[cb], max_epochs=1).fit(model, train)
        assert len(model.train_batches) == 2  # the two good batches trained; the bad one stopped before its step


def test_after_a_mixup_the_full_check_runs_once_per_kind_of_target(monkeypatch):
    """MixUp(p=0.5) before CutMix hands it integer labels on some batches and probabilities on others."""
    cutmix = CutMix()
    full_checks = []
    check = cutmix._check_batch
    monkeypatch.setattr(cutmix, "_check_batch", lambda batch: (full_checks.append(1), check(batch)))
    trainer(callbacks=[MixUp(p=0.5, seed=0), cutmix], max_epochs=4).fit(RecordingModule(record=False), loaders()[0])
    assert len(full_checks) == 2  # the first batch, and the first batch of the other kind: not one per switch


def test_float_targets_whose_rows_do_not_sum_to_one_are_flagged():
    x, y = image_tensors(32)
    multi_hot = F.one_hot(y, C).float()
    multi_hot[:, 0] = 1.0  # a second active class in most rows: multi-label, not a distribution
    with pytest.warns(SpeedupWarning, match=r"rows sum to 1\.\.2, not 1"):
        trainer(callbacks=[MixUp()], max_epochs=1).fit(
            RecordingModule(), DataLoader(TensorDataset(x, multi_hot), batch_size=16)
        )
    with warnings.catch_warnings():
        warnings.simplefilter("error", SpeedupWarning)  # probabilities: no warning
        trainer(callbacks=[MixUp()], max_epochs=1).fit(
            RecordingModule(), DataLoader(TensorDataset(x, F.one_hot(y, C).float()), batch_size=16)
        )
        # under bf16-true Lightning casts the probabilities to bf16 and MixUp mixes them there: rows that sum to
        # 1 up to bf16's rounding are still distributions for LabelSmoothing's check after it
        soft = torch.softmax(torch.randn(32, C, generator=torch.Generator().manual_seed(0)), 1)
        assert (soft.bfloat16().float().sum(1) - 1).abs().max() > 1e-3  # the old tolerance would have warned
        trainer(callbacks=[MixUp(), LabelSmoothing(0.1)], max_epochs=1, precision="bf16-true").fit(
            RecordingModule(), DataLoader(TensorDataset(x, soft), batch_size=16)
        )


def test_batch_without_the_named_key():
    fit_expecting([MixUp(input_key="pixels")], r"no input at 'pixels'.*input_key", train=loaders("dict")[0])
    fit_expecting([CutMix(target_key="y")], r"no target at 'y'", train=loaders("dict")[0])


def test_label_smoothing_reads_only_the_target():
    """A batch whose input no default name finds (here 'pixels') is fine for LabelSmoothing, which leaves the
    input alone; MixUp, which mixes it, asks for `input_key`."""
    x, y = image_tensors(32)

    def collate(samples):
        return {"pixels": torch.stack([s[0] for s in samples]), "label": torch.stack([s[1] for s in samples])}

    train = DataLoader(TensorDataset(x, y), batch_size=16, collate_fn=collate)

    class Pixels(RecordingModule):
        def training_step(self, batch, batch_idx):
            return super().training_step((batch["pixels"], batch["label"]), batch_idx)

    model = Pixels()
    trainer(callbacks=[LabelSmoothing(0.2)], max_epochs=1).fit(model, train)
    assert len(model.train_batches) == 2
    for (_, target), y0 in zip(model.train_batches, y.split(16), strict=True):
        assert torch.allclose(target, 0.8 * F.one_hot(y0, C) + 0.2 / C)
    fit_expecting([MixUp()], r"Could not find the input.*input_key", model=Pixels(), train=train)


def test_flat_features_for_cutmix():
    train = DataLoader(TensorDataset(torch.randn(32, 10), torch.arange(32) % C), batch_size=16)

    class Flat(RecordingModule):
        def __init__(self):
            super().__init__()
            self.net = nn.Linear(10, C)

    fit_expecting([CutMix()], r"\(N, C, \*spatial\)", model=Flat(), train=train)


def test_unknown_number_of_classes():
    fit_expecting([MixUp()], "could not infer the number of classes", model=RecordingModule(num_classes=None))


@pytest.mark.parametrize("seed", range(4))
def test_a_count_given_to_one_callback_serves_the_others(seed):
    # without it, LabelSmoothing read the count off the first batch's probabilities: there when MixUp (p=0.5)
    # mixed that batch, an error when not, so the same set-up trained or failed by the seed
    smoothing = LabelSmoothing(0.1, seed=seed)
    callbacks = [MixUp(p=0.5, num_classes=C, seed=seed), smoothing]
    trainer(callbacks=callbacks, max_steps=2).fit(RecordingModule(num_classes=None), loaders("list")[0])
    assert smoothing._classes == C
    fit_expecting(
        [MixUp(num_classes=C), CutMix(num_classes=C + 1), LabelSmoothing(0.1)],
        r"given different numbers of classes \(MixUp\(num_classes=4\), CutMix\(num_classes=5\)\)",
        model=RecordingModule(num_classes=None),
    )
    # a count the model says and another given to a sibling: refused before any step, whatever p draws (the
    # callback given it warns first, where it comes first)
    refused = (
        r"LabelSmoothing counts 4 classes \(from the model or DataModule\), another callback was given num_classes=5"
    )
    with pytest.warns(SpeedupWarning, match="num_classes=5 was given"):
        fit_expecting([MixUp(p=0.5, num_classes=C + 1, seed=seed), LabelSmoothing(0.1)], refused)
    fit_expecting([LabelSmoothing(0.1), MixUp(p=0.5, num_classes=C + 1, seed=seed)], refused)


class WithLoss(RecordingModule):
    def __init__(self, loss: nn.Module):
        super().__init__()
        self.criterion = loss


@pytest.mark.parametrize(
    ("callback", "loss", "message"),
    [
        (MixUp(), nn.NLLLoss(), "NLLLoss"),
        (CutMix(), nn.CrossEntropyLoss(ignore_index=0), "ignore_index=0"),
        (LabelSmoothing(), nn.CrossEntropyLoss(ignore_index=255), "method='loss'"),
        (LabelSmoothing(), nn.CrossEntropyLoss(label_smoothing=0.1), "smoothed twice"),
        (LabelSmoothing(method="loss"), nn.CrossEntropyLoss(label_smoothing=0.1), "not both"),
    ],
)
def test_losses_that_cannot_take_the_targets_fail_at_fit_start(callback, loss, message):
    fit_expecting([callback], message, model=WithLoss(loss))


def test_loss_mode_needs_a_criterion_and_check_loss_opt_out():
    fit_expecting([LabelSmoothing(method="loss")], "found no `nn.CrossEntropyLoss`")
    # an NLLLoss used only for validation: the user opts out of the check and training works
    model = WithLoss(nn.NLLLoss())
    model.criterion = None
    model.val_criterion = nn.NLLLoss()
    trainer(callbacks=[MixUp(check_loss=False)], max_steps=1).fit(model, loaders()[0])
    assert model.train_batches[0][1].is_floating_point()


def test_double_smoothing_is_named_first_and_still_warned_under_check_loss_opt_out():
    # an unused loss the checks refuse, and the training loss that smooths too: the smoothing is named first,
    # since `check_loss=False` (the fix the other error offers) does not waive it
    model = WithLoss(nn.CrossEntropyLoss(label_smoothing=0.1))
    model.aux = nn.CrossEntropyLoss(ignore_index=0)
    with pytest.raises(ValueError, match="smoothed twice") as raised:
        trainer(callbacks=[LabelSmoothing()], max_steps=1).fit(model, loaders()[0])
    assert "ignore_index" not in str(raised.value)
    # opted out: the run goes ahead, but the double smoothing is said
    with pytest.warns(SpeedupWarning, match=r"smoothed twice.*check_loss=False"):
        trainer(callbacks=[LabelSmoothing(check_loss=False)], max_steps=1).fit(model, loaders()[0])
    # a MixUp smooths nothing: the loss's smoothing is the only one, nothing to say
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*smoothed twice", category=SpeedupWarning)
        trainer(callbacks=[MixUp(check_loss=False)], max_steps=1).fit(model, loaders()[0])


class Relaxation(TargetTransformCallback):
    """A user's target-only smoothing technique (as docs/extending.md describes)."""

    smooths_targets = True

    def apply(self, x, target, num_classes, trainer):
        return x, 0.9 * as_probabilities(target, num_classes) + 0.1 / num_classes


def test_a_users_target_technique_says_what_it_touches_through_class_attributes():
    # a smoothing technique of the user's own beside a loss with `label_smoothing` smoothed twice, unnoticed
    fit_expecting([Relaxation()], "smoothed twice", model=WithLoss(nn.CrossEntropyLoss(label_smoothing=0.1)))
    # its fix names no built-in class: taking LabelSmoothing out of a preset would not take this one out
    with pytest.raises(ValueError, match="let the loss smooth, or set") as raised:
        trainer(callbacks=[Relaxation()], max_steps=1).fit(
            WithLoss(nn.CrossEntropyLoss(label_smoothing=0.1)), loaders()[0]
        )
    assert "LabelSmoothing=None" not in str(raised.value)
    # beside LabelSmoothing (either method: in the loss, the smoothing is set only as each step runs)
    for method in ("target", "loss"):
        both = [LabelSmoothing(method=method), Relaxation()]
        fit_expecting(both, "LabelSmoothing and Relaxation, which both smooth the targets, act in the same part")
    trainer(callbacks=[LabelSmoothing(end=0.5), Relaxation(start=0.5)], max_steps=2).fit(WithLoss(None), loaders()[0])
    # one turned off (p=0 or smoothing=0, how compare and sweeps switch a preset's LabelSmoothing off) is no second
    for off in (LabelSmoothing(p=0.0), LabelSmoothing(smoothing=0.0), Relaxation(p=0.0)):
        trainer(
            callbacks=[off, Relaxation() if isinstance(off, LabelSmoothing) else LabelSmoothing()], max_steps=1
        ).fit(WithLoss(None), loaders()[0])
    # one that changes only the targets was refused integer inputs (token ids), with no hint at the way out
    x, y = image_tensors(16)
    tokens = DataLoader(TensorDataset((x * 10).long(), y), batch_size=8)
    fit_expecting([Relaxation()], r"dtype torch\.int64.*set its class attribute `mixes_inputs = False`", train=tokens)

    class MyMixUp(MixUp):  # it does mix the inputs: no such hint
        pass

    with pytest.raises(TypeError, match=r"must be floating point; got dtype torch\.int64\. Convert them") as info:
        trainer(callbacks=[MyMixUp()], max_steps=1).fit(RecordingModule(), tokens)
    assert "mixes_inputs" not in str(info.value)

    class TargetsOnly(Relaxation):
        mixes_inputs = False

    class TokenModel(RecordingModule):
        def training_step(self, batch, batch_idx):
            return super().training_step([batch[0].float(), batch[1]], batch_idx)

    model = TokenModel()
    trainer(callbacks=[TargetsOnly(num_classes=C)], max_steps=1).fit(model, tokens)
    torch.testing.assert_close(model.train_batches[0][1].sum(1), torch.ones(8))


def test_user_smoothing_in_the_loss_with_mixup_is_fine():
    model = CriterionProbe()
    model.criterion = nn.CrossEntropyLoss(label_smoothing=0.1)
    trainer(callbacks=[MixUp()], max_steps=2).fit(model, loaders()[0])
    assert model.train_eps == [0.1, 0.1]


# ---------------------------------------------------------------------------------------------- edge cases
def test_loss_mode_restores_when_the_module_skips_the_rest_of_an_epoch():
    # a module's on_train_batch_start returning -1 makes Lightning skip on_train_batch_end
    class SkipsLate(CriterionProbe):
        def on_train_batch_start(self, batch, batch_idx):
            return -1 if batch_idx == 2 else None

    model = SkipsLate()
    trainer(callbacks=[LabelSmoothing(0.3, method="loss")], max_epochs=2).fit(model, *loaders("list"))
    assert model.train_eps == [0.3] * 4
    assert model.criterion.label_smoothing == 0.0  # was left at 0.3 for validation and after fit


class NewLossEachEpoch(CriterionProbe):
    """Builds its loss again at each epoch's start (class weights estimated again), in the module's own hook,
    which Lightning calls after the callbacks' epoch-start hooks."""

    def __init__(self, smoothing_of_its_own: float = 0.0, drop_at: int | None = None) -> None:
        super().__init__()
        self.own, self.drop_at = smoothing_of_its_own, drop_at

    def on_train_epoch_start(self) -> None:
        if self.current_epoch == 0:
            return
        if self.current_epoch == self.drop_at:
            self.criterion = nn.Identity()  # the loss is gone: training_step must no longer read it
            self.train_eps.append(None)
            return
        self.criterion = nn.CrossEntropyLoss(weight=torch.ones(C), label_smoothing=self.own)

    def training_step(self, batch, batch_idx):
        if isinstance(self.criterion, nn.Identity):
            x, y = unpack(batch)
            return F.cross_entropy(self(x), y)
        return super().training_step(batch, batch_idx)

    def validation_step(self, batch, batch_idx):
        if not isinstance(self.criterion, nn.Identity):
            super().validation_step(batch, batch_idx)


def test_loss_mode_smooths_a_loss_the_module_builds_again_at_an_epoch_start():
    # the losses were found once, at fit start: the new loss trained unsmoothed, without a word
    model = NewLossEachEpoch()
    with warnings.catch_warnings():
        warnings.simplefilter("error", SpeedupWarning)
        trainer(callbacks=[LabelSmoothing(0.1, method="loss")], max_epochs=3).fit(model, *loaders("list"))
    assert model.train_eps == [0.1] * 12
    assert model.criterion.label_smoothing == 0.0  # and put back after the fit
    for got, by_hand in model.loss_check:
        assert got == pytest.approx(by_hand, rel=1e-5)
    model = NewLossEachEpoch(smoothing_of_its_own=0.05)
    with pytest.warns(SpeedupWarning) as caught:
        trainer(callbacks=[LabelSmoothing(0.1, method="loss")], max_epochs=2).fit(model, *loaders("list"))
    assert model.train_eps == [0.1] * 4 + [0.05] * 4
    messages = [str(w.message) for w in caught if issubclass(w.category, SpeedupWarning)]
    assert len(messages) == 1 and re.search(r"has `label_smoothing=0.05`.*not smoothed again", messages[0])
    model = NewLossEachEpoch(drop_at=1)
    with pytest.warns(SpeedupWarning, match=r"no `nn.CrossEntropyLoss` to smooth any more"):
        trainer(callbacks=[LabelSmoothing(0.1, method="loss")], max_epochs=2).fit(model, *loaders("list"))


@pytest.mark.parametrize("first", ["early", "late"])
def test_two_loss_mode_windows_smooth_a_loss_the_module_builds_again_in_either_order(first):
    # the later callback read the value the earlier one had just set as the new loss's own smoothing, and left
    # the loss out: the second window trained unsmoothed, with two false warnings
    early, late = LabelSmoothing(0.1, method="loss", end=0.5), LabelSmoothing(0.2, method="loss", start=0.5)
    model = NewLossEachEpoch()
    with warnings.catch_warnings():
        warnings.simplefilter("error", SpeedupWarning)
        callbacks = [early, late] if first == "early" else [late, early]
        trainer(callbacks=callbacks, max_epochs=3).fit(model, *loaders("list"))
    assert model.train_eps == [0.1] * 6 + [0.2] * 6


def test_a_second_fit_infers_its_own_classes_and_seed():
    from lightning.pytorch import seed_everything

    mixup = MixUp(alpha=1.0)
    seed_everything(1)
    wider = RecordingModule(num_classes=C + 2)
    wider.net.fc = nn.Linear(wider.net.fc.in_features, C + 2)
    trainer(callbacks=[mixup], max_steps=1).fit(wider, loaders()[0])
    assert wider.train_batches[0][1].shape == (16, C + 2)
    first_seed = mixup.seed
    seed_everything(2)
    model = RecordingModule()  # NUM_CLASSES classes now
    trainer(callbacks=[mixup], max_steps=1).fit(model, loaders()[0])
    assert model.train_batches[0][1].shape == (16, C)
    assert mixup.num_classes is None and mixup.seed != first_seed


def test_num_classes_inferred_from_a_numpy_integer():
    import numpy as np

    model = RecordingModule(num_classes=None)
    model.num_classes = np.int64(C)
    trainer(callbacks=[MixUp()], max_steps=1).fit(model, loaders()[0])
    assert model.train_batches[0][1].shape == (16, C)


def test_num_classes_from_a_yaml_float_and_sources_that_disagree():
    model = RecordingModule(num_classes=None)
    model.hparams["num_classes"] = float(C)  # 4.0, as a YAML config may give it
    trainer(callbacks=[MixUp()], max_steps=1).fit(model, loaders()[0])
    assert model.train_batches[0][1].shape == (16, C)

    class TenClasses(ImagesDataModule):
        num_classes = 10

    with pytest.raises(ValueError, match=r"differs between its sources \(the DataModule 10, the LightningModule 4"):
        trainer(callbacks=[MixUp()], max_steps=1).fit(RecordingModule(), datamodule=TenClasses())
    model = RecordingModule()  # its own attribute (4, as the data) over an hparams default of another task
    model.hparams["num_classes"] = 1000
    trainer(callbacks=[MixUp()], max_steps=1).fit(model, loaders()[0])
    assert model.train_batches[0][1].shape == (16, C)


@pytest.mark.parametrize("dtype", [torch.uint16, torch.uint32])
def test_unsigned_labels_without_torch_min_max_are_checked(dtype):
    x, y = image_tensors(32)
    model = RecordingModule()
    trainer(callbacks=[LabelSmoothing(0.1)], max_steps=1).fit(model, DataLoader(TensorDataset(x, y.to(dtype)), 16))
    assert torch.allclose(model.train_batches[0][1].sum(1), torch.ones(16))


def test_int32_labels_warn_at_the_first_batch_where_some_batches_pass_through_unchanged():
    # MixUp(end=0.9) trained 18 of 20 steps on its float targets, then the first batch it left alone reached
    # F.cross_entropy as int32 and crashed, with no word earlier
    x, y = image_tensors(32)
    said = r"class indices of dtype torch.int32.*outside start/end.*`y.long\(\)`"
    for callback in (MixUp(end=0.5), CutMix(p=0.5), LabelSmoothing(0.1, start=0.2)):
        with pytest.warns(SpeedupWarning, match=said):
            try:
                trainer(callbacks=[callback], max_steps=1).fit(
                    RecordingModule(), DataLoader(TensorDataset(x, y.to(torch.int32)), 16)
                )
            except RuntimeError as err:  # a first batch left alone: the crash the warning foretold
                assert "expected target dtype" in str(err)
    for callback, dtype in ((MixUp(), torch.int32), (MixUp(end=0.5), torch.int64), (MixUp(p=0.5), torch.uint8)):
        with warnings.catch_warnings():  # every batch changed, or labels the loss takes: nothing to say
            warnings.filterwarnings("error", message=".*class indices of dtype", category=SpeedupWarning)
            trainer(callbacks=[callback], max_steps=1).fit(
                RecordingModule(), DataLoader(TensorDataset(x, y.to(dtype)), 16)
            )


def test_two_label_smoothings_acting_together_are_refused_and_apart_allowed():
    fit_expecting([LabelSmoothing(0.1), LabelSmoothing(0.1, p=0.99)], "Two LabelSmoothing callbacks act in the same")
    model = WithLoss(nn.CrossEntropyLoss())
    callbacks = [LabelSmoothing(0.1, method="loss"), LabelSmoothing(0.2, method="loss", p=0.999)]
    fit_expecting(callbacks, "smoothed twice", model=model)
    assert model.criterion.label_smoothing == 0.0  # left as it was
    apart = [LabelSmoothing(0.1, end=0.5), LabelSmoothing(0.05, start=0.5)]
    trainer(callbacks=apart, max_epochs=2).fit(RecordingModule(), loaders("list")[0])


@pytest.mark.parametrize("reverse", [False, True], ids=["first-window-first", "second-window-first"])
def test_two_loss_mode_label_smoothings_in_separate_windows_each_smooth_their_own(reverse):
    # The inactive one saved the loss's value and wrote 0 over the active one's: a window trained unsmoothed,
    # validation ran smoothed, and the smoothing outlived the fit.
    callbacks = [LabelSmoothing(0.1, method="loss", end=0.5), LabelSmoothing(0.2, method="loss", start=0.5)]
    model = CriterionProbe()
    t = trainer(callbacks=callbacks[::-1] if reverse else callbacks, max_epochs=2, val_check_interval=2)
    t.fit(model, *loaders("list"))
    assert model.train_eps == [0.1] * 4 + [0.2] * 4
    assert model.val_eps and set(model.val_eps) == {0.0}
    assert model.criterion.label_smoothing == 0.0


def test_a_batch_the_users_hook_drops_passes_the_seam_untouched():
    # Lightning skips a training batch that `on_after_batch_transfer` turns into None; our callbacks crashed on it
    class DropsTheSecond(RecordingModule):
        def on_after_batch_transfer(self, batch, dataloader_idx):
            if self.trainer.training and self.trainer.fit_loop.epoch_loop.batch_progress.current.ready == 2:
                return None
            return batch

    for callbacks in ([MixUp()], [LabelSmoothing()], [CutMix(), LabelSmoothing(method="loss")]):
        model = DropsTheSecond(use_criterion=True)
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", "train_dataloader yielded None")
            trainer(callbacks=callbacks, max_epochs=1).fit(model, loaders("list")[0])
        assert len(model.train_batches) == 3  # 4 batches, the second skipped


def test_loss_mode_label_smoothing_needs_no_class_count():
    # it keeps the integer labels: class-count sources that disagree (a stale hparams default) must not stop it
    class Data(pl.LightningDataModule):
        num_classes = C

        def train_dataloader(self):
            return loaders("list")[0]

    model = CriterionProbe(num_classes=1000)
    model.save_hyperparameters({"num_classes": 1000})
    trainer(callbacks=[LabelSmoothing(0.1, method="loss")], max_steps=2).fit(model, datamodule=Data())
    assert model.train_eps == [0.1, 0.1]
    with pytest.raises(ValueError, match="number of classes differs between its sources"):
        trainer(callbacks=[LabelSmoothing(0.1)], max_steps=2).fit(CriterionProbe(num_classes=1000), datamodule=Data())


@pytest.mark.parametrize("dtype", [torch.int64, torch.uint16])  # no torch min/max for uint16: they raised that
def test_a_label_out_of_range_in_a_later_batch_gets_the_clear_message(dtype):
    x, y = image_tensors(32)
    y[20] = C  # second batch
    y = y.to(dtype)
    for cb in (MixUp(), LabelSmoothing()):
        with pytest.raises(ValueError, match=rf"class indices must lie in \[0, {C}\), found values in \[0, {C}\]"):
            trainer(callbacks=[cb], max_epochs=1).fit(RecordingModule(), DataLoader(TensorDataset(x, y), batch_size=16))


class KeepsHard(RecordingModule):
    """Records the batch's type and its kept labels, then trains on it as a plain dict."""

    def __init__(self):
        super().__init__()
        self.kept = []

    def training_step(self, batch, batch_idx):
        self.kept.append((type(batch), batch["hard"]))
        return super().training_step(dict(batch), batch_idx)


def collate_as(mapping_type):
    def collate(samples):
        x, y = (torch.stack(column) for column in zip(*samples, strict=True))
        return mapping_type(image=x, label=y)

    return collate


def test_hard_target_key_keeps_the_mapping_type_and_must_come_first():
    from collections import OrderedDict, UserDict

    x, y = image_tensors(32)
    for mapping_type in (OrderedDict, UserDict):
        model = KeepsHard()
        train = DataLoader(TensorDataset(x, y), batch_size=16, collate_fn=collate_as(mapping_type))
        trainer(callbacks=[MixUp(hard_target_key="hard")], max_epochs=1).fit(model, train)
        assert [t for t, _ in model.kept] == [mapping_type, mapping_type]
        assert torch.equal(model.kept[0][1], y[:16])
    # a callback that changes the targets before the one that keeps them: refused at fit start
    fit_expecting(
        [MixUp(), LabelSmoothing(hard_target_key="hard")],
        r"runs after MixUp, which changes the targets first.*Pass `hard_target_key='hard'` to MixUp",
        train=loaders("dict")[0],
    )


def test_timm_label_smoothing_loss():
    timm_loss = pytest.importorskip("timm.loss")
    fit_expecting(
        [MixUp()],
        "LabelSmoothingCrossEntropy`, which needs class indices",
        model=WithLoss(timm_loss.LabelSmoothingCrossEntropy(0.1)),
    )
    fit_expecting(
        [LabelSmoothing(method="loss")],
        r"the loss `criterion` \(LabelSmoothingCrossEntropy\) already has `smoothing=0.1`",  # its own attribute
        model=WithLoss(timm_loss.LabelSmoothingCrossEntropy(0.1)),
    )
    model = WithLoss(timm_loss.LabelSmoothingCrossEntropy(0.0))
    trainer(callbacks=[LabelSmoothing(0.2, method="loss")], max_steps=1).fit(model, loaders()[0])
    assert model.criterion.smoothing == 0.0  # restored after the step


# ---------------------------------------------------------------------------------------------- review fixes
class NLLSubclass(nn.NLLLoss):
    """A user's subclass of an index-only loss."""


@pytest.mark.parametrize(
    "loss",
    [
        nn.MultiMarginLoss(),
        nn.MultiLabelMarginLoss(),
        nn.CTCLoss(),
        nn.AdaptiveLogSoftmaxWithLoss(8, C, cutoffs=[2]),
        NLLSubclass(),
    ],
    ids=lambda m: type(m).__name__,
)
def test_losses_that_need_class_indices_fail_at_fit_start(loss):
    for cb in (MixUp(), LabelSmoothing()):
        fit_expecting([cb], rf"`criterion` is a `{type(loss).__name__}`, which needs class indices", WithLoss(loss))


def test_class_weighted_cross_entropy_is_refused_for_probability_targets():
    def weighted(reduction="mean"):
        return WithLoss(nn.CrossEntropyLoss(weight=torch.tensor([5.0, 1.0, 1.0, 1.0]), reduction=reduction))

    for cb in (MixUp(), CutMix()):
        fit_expecting([cb], r"has class weights \(`weight=`\).*batch size.*check_loss=False", weighted())
    fit_expecting([LabelSmoothing()], r"class weights.*use `LabelSmoothing\(method='loss'\)`", weighted())
    # the loss keeps its weighting with integer labels, and with reduction='sum' probabilities weight alike
    trainer(callbacks=[LabelSmoothing(method="loss")], max_steps=1).fit(weighted(), loaders()[0])
    trainer(callbacks=[MixUp()], max_steps=1).fit(weighted("sum"), loaders()[0])
    trainer(callbacks=[MixUp(check_loss=False)], max_steps=1).fit(weighted(), loaders()[0])  # explicit opt-out


def test_loss_mode_refuses_hard_target_key():
    with pytest.raises(ValueError, match=r"method='loss'.*`hard_target_key='hard'` would never be filled"):
        LabelSmoothing(method="loss", hard_target_key="hard")


def test_hard_target_key_must_not_be_where_the_target_is_read():
    with pytest.raises(ValueError, match="`hard_target_key` and `target_key` are both 'label'"):
        MixUp(target_key="label", hard_target_key="label")
    with pytest.raises(ValueError, match="`hard_target_key` and `input_key` are both 'image'"):
        CutMix(input_key="image", hard_target_key="image")
    train = loaders("dict")[0]  # {"image", "label", "index"}: the target is found by name
    fit_expecting([MixUp(hard_target_key="label")], "the batch's target is read from that key", train=train)
    # "target" and "labels" are names a target is found by: once kept there the batch would have two targets
    for cb in (LabelSmoothing(hard_target_key="target"), MixUp(hard_target_key="labels")):
        fit_expecting(
            [cb], rf"'{cb.hard_target_key}' is one of the names a target is found by.*two targets", train=train
        )
    fit_expecting([MixUp(hard_target_key="input")], "'input' is one of the names an input is found by", train=train)


class FirstOfTwo(RecordingModule):
    """Trains on the first loader's part of a two-loader batch."""

    def training_step(self, batch, batch_idx):
        return super().training_step(batch[0], batch_idx)


def test_several_training_dataloaders_are_refused_unless_a_getter_reads_them():
    from lightning.pytorch.utilities import CombinedLoader

    train = loaders()[0]
    for cb in (MixUp(), LabelSmoothing()):
        fit_expecting([cb], r"2 dataloader\(s\) given as a list.*batch_getter", FirstOfTwo(), train=[train, train])
    with pytest.raises(ValueError, match=r"given as a dict.*does not support this"):
        trainer(callbacks=[MixUp()], max_steps=1).fit(RecordingModule(), CombinedLoader({"a": train, "b": train}))
    model = FirstOfTwo()
    mixup = MixUp(batch_getter=lambda b: tuple(b[0]), batch_setter=lambda b, x, y: [[x, y], b[1]])
    trainer(callbacks=[mixup], max_steps=1).fit(model, [train, train])
    assert model.train_batches[0][1].shape == (16, C)


def test_first_batch_check_of_a_0d_or_non_tensor_target():
    x, y = image_tensors(4)
    unbatched = DataLoader(TensorDataset(x, y), batch_size=None)  # samples as they are: 0-d labels
    for cb in (MixUp(), LabelSmoothing()):
        fit_expecting([cb], r"got a 0-d tensor \(one label\).*batch_size", train=unbatched)
    as_list = DataLoader(TensorDataset(x, y), batch_size=4, collate_fn=lambda s: [x, [int(t) for _, t in s]])
    fit_expecting([MixUp()], r"needs a tensor target, got list.*torch\.as_tensor", train=as_list)


def _dict_batches(x, y, build):
    """Batches of 4 that `build(inputs, labels)` turns into a dict of the caller's shape."""
    return DataLoader(
        TensorDataset(x, y),
        batch_size=4,
        collate_fn=lambda s: build(torch.stack([a for a, _ in s]), torch.stack([b for _, b in s])),
    )


def test_a_nested_input_or_target_points_to_a_getter_not_to_a_key():
    # {"inputs": {"image": x}, ...}: no `input_key` reaches the image, so the message must not stop at one
    x, y = image_tensors(8)
    nested = _dict_batches(x, y, lambda xs, ys: {"inputs": {"image": xs}, "label": ys})
    fit_expecting([MixUp()], r"tensor input, got dict.*nested dict: pass `batch_getter`/`batch_setter`", train=nested)
    as_tuple = _dict_batches(x, y, lambda xs, ys: {"x": xs, "y": (ys,)})
    fit_expecting([LabelSmoothing()], r"tensor target, got tuple.*nested tuple", train=as_tuple)


def test_a_dict_with_two_conventional_input_names_is_refused_not_guessed():
    # {"x": coordinates, "image": pixels}: the first name in the list ("x") was mixed and the images were not
    x, y = image_tensors(8)
    both = _dict_batches(x, y, lambda xs, ys: {"x": torch.zeros(len(xs), 2), "image": xs, "label": ys})
    fit_expecting([MixUp()], r"several fields that could be the input: 'x', 'image'.*input_key=", train=both)


# ---------------------------------------------------------------------------------------------- losses built late
class LateLoss(RecordingModule):
    """Builds its loss in `configure_model`, which Lightning calls after the callbacks' `setup`."""

    def __init__(self, loss: nn.Module) -> None:
        super().__init__()
        self._late = [loss]  # in a list: not a submodule until configure_model

    def configure_model(self) -> None:
        if self.criterion is None:
            self.criterion = self._late[0]


def test_loss_mode_finds_a_loss_built_in_configure_model():
    model = LateLoss(nn.CrossEntropyLoss())
    seen = []
    model._late[0].register_forward_pre_hook(lambda m, args: seen.append(m.label_smoothing))
    trainer(callbacks=[LabelSmoothing(0.2, method="loss")], max_steps=2).fit(model, loaders()[0])
    assert seen == [0.2, 0.2] and model.criterion.label_smoothing == 0.0


@pytest.mark.parametrize(
    ("callback", "loss", "message"),
    [
        (LabelSmoothing(), nn.CrossEntropyLoss(label_smoothing=0.1), "smoothed twice"),
        (MixUp(), nn.NLLLoss(), "NLLLoss"),
        (LabelSmoothing(method="loss"), nn.CrossEntropyLoss(label_smoothing=0.1), "not both"),
    ],
)
def test_a_loss_built_in_configure_model_is_checked_at_fit_start(callback, loss, message):
    fit_expecting([callback], message, model=LateLoss(loss))


def test_loss_mode_warns_when_training_never_calls_the_loss_module():
    model = RecordingModule()  # F.cross_entropy in training_step
    model.val_criterion = nn.CrossEntropyLoss()  # a loss module, but not the one training uses
    with pytest.warns(SpeedupWarning, match="called none of them, so training is not smoothed"):
        trainer(callbacks=[LabelSmoothing(0.1, method="loss")], max_steps=3).fit(model, loaders()[0])
    assert not model.val_criterion._forward_pre_hooks  # its watch hook is gone


def test_loss_mode_does_not_warn_when_training_calls_the_loss():
    model = CriterionProbe()
    with warnings.catch_warnings():
        warnings.simplefilter("error", SpeedupWarning)
        trainer(callbacks=[LabelSmoothing(0.1, method="loss", start=0.5)], max_epochs=2).fit(model, loaders()[0])
    assert model.train_eps == [0.0] * 4 + [0.1] * 4 and not model.criterion._forward_pre_hooks


def test_loss_mode_watches_past_a_first_step_that_skips_its_batch():
    class SkipsFirst(CriterionProbe):
        def training_step(self, batch, batch_idx):
            if self.trainer.fit_loop.epoch_loop.batch_progress.total.processed == 0:
                return None  # Lightning skips this batch: it tells nothing about the loss used
            return super().training_step(batch, batch_idx)

    model = SkipsFirst()
    with warnings.catch_warnings():
        warnings.simplefilter("error", SpeedupWarning)
        trainer(callbacks=[LabelSmoothing(0.1, method="loss")], max_steps=3).fit(model, loaders()[0])
    assert model.train_eps == [0.1, 0.1] and not model.criterion._forward_pre_hooks  # the skipped step recorded none


def test_num_classes_set_in_the_modules_own_setup_is_found():
    class SetsClassesInSetup(RecordingModule):
        def __init__(self):
            super().__init__(num_classes=None)

        def setup(self, stage):  # runs after the callbacks' setup
            self.num_classes = C

    model = SetsClassesInSetup()
    trainer(callbacks=[MixUp(alpha=1.0)], max_steps=1).fit(model, loaders()[0])
    assert model.train_batches[0][1].shape == (16, C)


def test_attributes_named_smoothing_and_confidence_are_not_taken_for_a_timm_loss():
    class Named(RecordingModule):
        def __init__(self):
            super().__init__()
            self.smoothing, self.confidence = 0.9, 0.5  # the user's own settings, not a loss

    model = Named()
    trainer(callbacks=[MixUp()], max_steps=1).fit(model, loaders()[0])  # not refused as an index-only loss
    assert model.train_batches[0][1].is_floating_point()
    fit_expecting([LabelSmoothing(method="loss")], "found no `nn.CrossEntropyLoss`", model=Named())
    assert (model.smoothing, model.confidence) == (0.9, 0.5)


def test_one_column_float_targets_are_refused():
    x, y = image_tensors(32)
    train = DataLoader(TensorDataset(x, (y % 2).float().unsqueeze(1)), batch_size=16)
    fit_expecting(
        [LabelSmoothing()],
        r"one column \(a binary label for BCE\?\)",
        model=RecordingModule(num_classes=None),
        train=train,
    )


@pytest.mark.parametrize(
    ("make_target", "message"),
    [(lambda y: y.unsqueeze(1), r"y\.squeeze\(1\)"), (lambda y: F.one_hot(y, C), r"y\.float\(\)")],
    ids=["column", "one-hot-int"],
)
def test_integer_targets_of_two_dims_get_the_fix_in_the_message(make_target, message):
    x, y = image_tensors(32)
    train = DataLoader(TensorDataset(x, make_target(y)), batch_size=16)
    fit_expecting([MixUp()], message, train=train)


def test_messages_name_batch_getter_for_getter_users():
    def getter(batch):
        return batch[0], None

    def setter(batch, x, y):
        return [x, y]

    fit_expecting([MixUp(batch_getter=getter, batch_setter=setter)], r"found no target.*Check `batch_getter`")


@pytest.mark.parametrize("make", [lambda: MixUp(p=0.5, seed=1), lambda: CutMix(p=0.5, seed=1)], ids=["mixup", "cutmix"])
def test_the_logged_weight_is_one_on_batches_left_as_they_were(make):
    callback, logger = make(), MemoryLogger()
    trainer(callbacks=[callback], max_epochs=4, logger=logger, log_every_n_steps=1).fit(
        RecordingModule(record=False), *loaders("list")
    )
    name = callback.log_name
    applied, lam = dict(logger.history[f"{name}/applied"]), dict(logger.history[f"{name}/lam"])
    assert set(applied.values()) == {0.0, 1.0}  # both kinds of batch were logged
    assert all(lam[step] == 1.0 for step, a in applied.items() if not a)  # not the last mixed batch's weight
    assert any(lam[step] < 1.0 for step, a in applied.items() if a)  # (a CutMix box may be clipped to nothing)


def test_a_subclass_with_its_own_signature_passes_base_arguments_on():
    def make():  # defined here: a module-level MixUp subclass would shadow the short name in LightningCLI tests
        class FixedSeedMixUp(MixUp):
            def __init__(self, alpha: float = 0.4) -> None:
                super().__init__(alpha=alpha, seed=0, log_knobs=False)

        return FixedSeedMixUp()

    cb = make()
    assert cb.alpha == 0.4 and cb.log_knobs is False
