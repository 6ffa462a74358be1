"""DropoutRemoval in real `Trainer.fit` runs: inert dropouts after `start`, determinism, resume, logs, warnings."""

import warnings
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from lightning.pytorch import LightningModule, seed_everything
from lightning.pytorch.callbacks import ModelCheckpoint
from torch import Tensor, nn
from torch.utils.data import DataLoader

from lightning_speedups import DropoutRemoval, SpeedupWarning
from lightning_speedups.functional import find_dropout
from tests.helpers import NUM_CLASSES, ImagesDataModule, MemoryLogger, RecordingModule, loaders, trainer, unpack
from tests.test_functional_dropout_batchnorm import BufferRateDropout, EveryDropout

SITES = 24  # the non-zero dropouts of EveryDropout


class DropoutModule(LightningModule):
    """Images (N, 1, 8, 8) as 8 tokens of 6 features through every kind of dropout; checks itself each step."""

    def __init__(self) -> None:
        super().__init__()
        self.body = EveryDropout()
        self.head = nn.Linear(16, NUM_CLASSES)
        self.log_steps: list[tuple[int, bool, bool]] = []

    def forward(self, x: Tensor) -> Tensor:
        return self.head(self.body(x[:, 0, :, :6]).mean(1))

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        x, y = unpack(batch)
        inert = all(site.value == 0 for site in find_dropout(self))
        with torch.no_grad(), torch.random.fork_rng():  # two train-mode passes with different random draws
            torch.manual_seed(100 + batch_idx)
            a = self(x)
            torch.manual_seed(200 + batch_idx)
            deterministic = torch.equal(a, self(x))
        self.log_steps.append((self.trainer.global_step, inert, deterministic))
        return F.cross_entropy(self(x), y)

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.05)


def test_dropout_is_inert_from_start_and_outputs_become_deterministic():
    model = DropoutModule()
    cb = DropoutRemoval(start=0.5)
    trainer(callbacks=[cb], max_epochs=4).fit(model, loaders("list")[0])  # 16 steps
    assert [s for s, _, _ in model.log_steps] == list(range(16))
    assert [inert for _, inert, _ in model.log_steps] == [False] * 8 + [True] * 8
    assert [det for _, _, det in model.log_steps] == [False] * 8 + [True] * 8  # in train mode
    # the model is handed back as it came: dropout on again after fit
    assert sum(site.value > 0 for site in find_dropout(model)) == SITES
    assert cb.removed == SITES  # what the fit switched off (it read 0 once they were back on)


def test_dropout_added_to_the_model_after_start_is_switched_off_from_the_next_epoch():
    class Grows(DropoutModule):
        def on_train_epoch_end(self) -> None:
            if self.current_epoch == 0:
                self.extra = nn.Dropout(0.3)  # a model that grows during training

    model = Grows()
    cb = DropoutRemoval(start=0.0)
    trainer(callbacks=[cb], max_epochs=2).fit(model, loaders("list")[0])  # 4 steps per epoch
    assert [inert for _, inert, _ in model.log_steps] == [True] * 8  # the new dropout included, in epoch 1
    assert cb.removed == SITES + 1 and model.extra.p == 0.3  # handed back, the new dropout too


def test_a_fit_that_raises_hands_the_model_back_with_its_dropout():
    class Crashes(DropoutModule):
        def training_step(self, batch, batch_idx):
            if self.trainer.global_step == 3:
                raise ArithmeticError("user bug")
            return super().training_step(batch, batch_idx)

    model = Crashes()
    cb = DropoutRemoval(start=0.0)
    with pytest.raises(ArithmeticError):
        trainer(callbacks=[cb], max_epochs=2).fit(model, loaders("list")[0])
    assert all(inert for _, inert, _ in model.log_steps) and len(model.log_steps) == 3  # it was off while training
    assert sum(site.value > 0 for site in find_dropout(model)) == SITES
    assert cb.removed == SITES  # what the fit switched off (it read 0 once they were back on)


def test_start_zero_removes_before_the_first_step():
    model = DropoutModule()
    trainer(callbacks=[DropoutRemoval()], max_steps=2).fit(model, loaders("list")[0])
    assert [(inert, det) for _, inert, det in model.log_steps] == [(True, True)] * 2


def test_logs_how_many_it_switched_off():
    logger = MemoryLogger()
    trainer(callbacks=[DropoutRemoval(start=0.5)], max_epochs=2, logger=logger, log_every_n_steps=1).fit(
        DropoutModule(), loaders("list")[0]
    )
    removed = dict(logger.history["dropout_removal/removed"])
    assert removed[0] == removed[3] == 0 and removed[7] == SITES
    assert removed[4] == SITES  # logged at the step it happened, before the step's own cadence


def test_a_model_without_dropout_gets_a_warning_not_an_error():
    model = RecordingModule()
    with pytest.warns(SpeedupWarning, match="no dropout"):
        trainer(callbacks=[DropoutRemoval()], max_steps=2).fit(model, loaders("list")[0])
    assert len(model.train_batches) == 2


def test_a_rate_the_model_sets_back_in_forward_is_warned_about():
    # "switched off 1 dropout(s)" was said, and the dropout stayed on for the whole run
    class SetsItBack(RecordingModule):
        def __init__(self):
            super().__init__(record=False)
            self.drop, self.rate = nn.Dropout(0.5), 0.5

        def forward(self, x):
            self.drop.p = self.rate  # at every call
            return super().forward(self.drop(x))

    with pytest.warns(
        SpeedupWarning, match=r"1 dropout rate\(s\) switched off were set back by the model.*\(drop\.p\)"
    ):
        trainer(callbacks=[DropoutRemoval()], max_steps=2).fit(SetsItBack(), loaders("list")[0])
    with warnings.catch_warnings():  # a model that leaves the rate alone: no such warning
        warnings.filterwarnings("error", message=".*set back", category=SpeedupWarning)
        trainer(callbacks=[DropoutRemoval()], max_steps=2).fit(DropoutModule(), loaders("list")[0])


class Scheduled(RecordingModule):
    """Sets its dropout rate back in its own epoch hooks (a per-epoch schedule), or in a step."""

    def __init__(self, in_step: bool = False):
        super().__init__(record=False)
        self.drop, self.in_step, self.seen = nn.Dropout(0.3), in_step, []

    def on_train_epoch_start(self):
        if not self.in_step:
            self.drop.p = 0.3

    def on_train_epoch_end(self):
        if not self.in_step:
            self.drop.p = 0.3

    def training_step(self, batch, batch_idx):
        loss = super().training_step(batch, batch_idx)
        if self.in_step and batch_idx == 1:  # after this step's forward: on from the next step
            self.drop.p = 0.3
        return loss

    def forward(self, x):
        if self.training:  # the rates training steps ran with
            self.seen.append(self.drop.p)
        return super().forward(self.drop(x))


def test_a_rate_set_back_between_epochs_is_counted_once_and_warned_about_only_if_a_step_saw_it(monkeypatch):
    # each epoch's rescan switched the rate off again, counted it as a dropout "added to the model since", and
    # said nothing of the steps that had trained with it
    import lightning_speedups.callbacks.dropout_removal as dr

    infos: list[str] = []
    monkeypatch.setattr(dr, "rank_zero_info", infos.append)
    # set back in the module's epoch hooks: switched off again before any step, so no step saw it
    cb, model = DropoutRemoval(), Scheduled()
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*set back", category=SpeedupWarning)
        trainer(callbacks=[cb], max_epochs=3).fit(model, loaders("list", n=32)[0])
    assert model.seen == [0.0] * 6 and not any("added to the model since" in m for m in infos)
    assert model.drop.p == 0.3  # given back at the end, the rate it had first
    # set back in a step: its epoch's later steps trained with it, and the next epoch's start says so
    model = Scheduled(in_step=True)
    with pytest.warns(SpeedupWarning, match=r"set back by the model during this epoch \(drop\.p\)"):
        trainer(callbacks=[DropoutRemoval()], max_epochs=2).fit(model, loaders("list", n=48)[0])
    assert model.seen == [0.0, 0.0, 0.3] * 2


def test_a_rate_set_back_is_warned_about_in_epochs_that_end_unannounced():
    # the check after "the epoch's last step" never ran for a loader of unknown length or an epoch stopped early
    from lightning.pytorch.callbacks import Callback

    class Stream(torch.utils.data.IterableDataset):
        def __iter__(self):
            return iter(list(loaders("list", n=48)[0]))

    class StopAtThree(Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            trainer.should_stop = batch_idx == 2

    for train, extra in ((DataLoader(Stream(), batch_size=None), []), (loaders("list", n=96)[0], [StopAtThree()])):
        model = Scheduled(in_step=True)
        with pytest.warns(SpeedupWarning, match=r"set back by the model during this epoch \(drop\.p\)"):
            trainer(callbacks=[DropoutRemoval(), *extra], max_epochs=1).fit(model, train)
        assert model.seen == [0.0, 0.0, 0.3]


def test_a_rate_a_validation_hook_sets_back_is_not_taken_for_one_steps_trained_with(tmp_path):
    # a schedule in `on_validation_epoch_end`: no step trains with it (the next epoch's first step switches it
    # off), yet the epoch-end check ran after validation when the removal came at the epoch's last step, or in
    # an epoch resumed mid-way (which gets no `on_train_epoch_start`, where its last step was worked out)
    class ValSchedule(Scheduled):
        def on_train_epoch_start(self):
            pass

        def on_train_epoch_end(self):
            pass

        def on_validation_epoch_end(self):
            self.drop.p = 0.3

    ckpt = ModelCheckpoint(dirpath=tmp_path, every_n_train_steps=2, save_top_k=-1)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*set back", category=SpeedupWarning)
        model = ValSchedule()  # 4 steps an epoch; removed at step 3 of 8, the first epoch's last
        trainer(callbacks=[DropoutRemoval(start=0.375), ckpt], max_epochs=2, enable_checkpointing=True).fit(
            model, *loaders("list", n=64)
        )
        assert model.seen == [0.3] * 3 + [0.0] * 5
        resumed = ValSchedule()
        trainer(callbacks=[DropoutRemoval()], max_epochs=2).fit(
            resumed, *loaders("list", n=64), ckpt_path=tmp_path / "epoch=0-step=2.ckpt"
        )
        assert resumed.seen == [0.0] * 6


def test_start_one_never_removes_and_says_so(monkeypatch):
    import lightning_speedups.callbacks.dropout_removal as dr

    infos: list[str] = []
    monkeypatch.setattr(dr, "rank_zero_info", infos.append)
    cb, model = DropoutRemoval(start=1.0), DropoutModule()
    trainer(callbacks=[cb], max_steps=4).fit(model, loaders("list")[0])
    assert cb.removed == 0 and any("start=1.0) never removes dropout" in m for m in infos)


@pytest.mark.parametrize("start", [0.95, 1.0])
def test_the_batchnorm_epoch_of_stochastic_weight_averaging_keeps_the_dropout_training_ended_with(start):
    """SWA's extra epoch (forward passes only, at progress 1) re-estimates BatchNorm statistics: a start that
    training never reached (0.95: its last step is at 11/12) does not switch dropout off there."""
    from lightning.pytorch.callbacks import StochasticWeightAveraging

    class BatchNormDropout(RecordingModule):
        def __init__(self) -> None:
            super().__init__(record=False)
            self.net = nn.Sequential(
                nn.Conv2d(1, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten()
            )
            self.drop, self.head = nn.Dropout(0.5), nn.Linear(4, NUM_CLASSES)
            self.rates: list[tuple[bool, float]] = []

        def forward(self, x: Tensor) -> Tensor:
            return self.head(self.drop(self.net(x)))

        def training_step(self, batch: Any, batch_idx: int) -> Tensor:
            self.rates.append((self.trainer.fit_loop._skip_backward, self.drop.p))
            return super().training_step(batch, batch_idx)

    model, cb = BatchNormDropout(), DropoutRemoval(start=start)
    swa = StochasticWeightAveraging(swa_lrs=0.05, swa_epoch_start=2)
    trainer(max_epochs=3, callbacks=[cb, swa]).fit(model, loaders("list")[0])  # 12 steps, then 4 forward-only
    assert [skip for skip, _ in model.rates] == [False] * 12 + [True] * 4  # the BatchNorm epoch ran
    assert all(p == 0.5 for _, p in model.rates) and cb.removed == 0


def test_a_rate_under_an_unknown_name_is_named_in_a_warning():
    class HiddenRate(RecordingModule):
        def __init__(self):
            super().__init__(record=False)
            self.attn_dropout_prob = 0.1  # read by a forward as F.dropout(x, self.attn_dropout_prob)

    with pytest.warns(SpeedupWarning, match=r"no dropout.*\(model\)\.attn_dropout_prob=0\.1"):
        trainer(callbacks=[DropoutRemoval()], max_steps=1).fit(HiddenRate(), loaders("list")[0])


@pytest.mark.parametrize("step", [3, 10], ids=["before-start", "after-start"])
def test_resume_keeps_dropout_where_the_uninterrupted_run_had_it(tmp_path, step):
    seed_everything(3)
    full = DropoutModule()
    cbs = [DropoutRemoval(start=0.5), ModelCheckpoint(dirpath=tmp_path, every_n_train_steps=1, save_top_k=-1)]
    trainer(callbacks=cbs, max_epochs=4, enable_checkpointing=True).fit(full, datamodule=ImagesDataModule(n=64))
    (ckpt,) = tmp_path.glob(f"*step={step}.ckpt")
    seed_everything(3)
    resumed = DropoutModule()
    trainer(callbacks=[DropoutRemoval(start=0.5)], max_epochs=4).fit(
        resumed, datamodule=ImagesDataModule(n=64), ckpt_path=str(ckpt)
    )
    assert resumed.log_steps == full.log_steps[step:]
    assert resumed.log_steps[0][1] is (step >= 8)  # removed from the first resumed step only after `start`
    if step >= 8:  # no random draws left: the resumed run ends with the uninterrupted run's weights
        for a, b in zip(full.state_dict().values(), resumed.state_dict().values(), strict=True):
            torch.testing.assert_close(a, b, rtol=0, atol=1e-6)


def test_a_checkpoint_taken_while_dropout_is_off_keeps_a_buffer_rate(tmp_path):
    # the buffer's 0 went into checkpoints: a resume (or a fine-tune from one) lost the dropout for good
    class BufferRate(RecordingModule):
        def __init__(self):
            super().__init__(record=False)
            self.drop = BufferRateDropout(0.3)

        def forward(self, x):
            return super().forward(self.drop(x))

    saving = ModelCheckpoint(dirpath=tmp_path, every_n_train_steps=2, save_top_k=-1)
    trainer(callbacks=[DropoutRemoval(), saving], max_steps=4, enable_checkpointing=True).fit(
        BufferRate(), loaders("list")[0]
    )
    (ckpt,) = tmp_path.glob("*step=2.ckpt")
    assert float(torch.load(ckpt, weights_only=True)["state_dict"]["drop.p"]) == pytest.approx(0.3)
    resumed, cb = BufferRate(), DropoutRemoval()
    with warnings.catch_warnings():
        warnings.simplefilter("error", SpeedupWarning)  # it warned that the model had no dropout
        trainer(callbacks=[cb], max_steps=4).fit(resumed, loaders("list")[0], ckpt_path=str(ckpt))
    assert float(resumed.drop.p) == pytest.approx(0.3) and cb.removed == 1


@pytest.mark.parametrize("start", [-0.1, 1.5, "half"])
def test_bad_start(start):
    with pytest.raises((ValueError, TypeError), match="`start`"):
        DropoutRemoval(start=start)


def test_modules_built_in_configure_model_are_found():
    class Late(DropoutModule):
        def __init__(self):
            super().__init__()
            self.body = None

        def configure_model(self):
            if self.body is None:
                self.body = EveryDropout()

    model = Late()
    with warnings.catch_warnings():
        warnings.simplefilter("error", SpeedupWarning)  # no "nothing to remove" warning
        trainer(callbacks=[DropoutRemoval()], max_steps=1).fit(model, loaders("list")[0])
    assert model.log_steps[0][1:] == (True, True)


def test_dropout_added_in_the_modules_own_epoch_start_goes_in_that_epoch():
    class GrowsAtEpochStart(DropoutModule):
        def on_train_epoch_start(self) -> None:  # runs after the callbacks' on_train_epoch_start
            if self.current_epoch == 1:
                self.extra = nn.Dropout(0.3)

    model = GrowsAtEpochStart()
    trainer(callbacks=[DropoutRemoval()], max_epochs=2).fit(model, loaders("list")[0])
    assert [inert for _, inert, _ in model.log_steps] == [True] * 8


def test_a_swapped_out_block_gets_its_own_rates_back_and_its_replacement_keeps_its_own():
    class Swaps(DropoutModule):
        def on_train_epoch_end(self) -> None:
            if self.current_epoch == 0:
                self.old = (self.body.drop, self.body.encoder)
                self.body.drop = nn.Dropout(0.0)  # another dropout under the same name
                self.body.encoder = nn.Identity()  # a block without the swapped-out one's dropouts

    model = Swaps()
    drop, encoder = model.body.drop, model.body.encoder
    trainer(callbacks=[DropoutRemoval()], max_epochs=2).fit(model, loaders("list")[0])  # no crash at teardown
    assert model.old == (drop, encoder)
    assert drop.p == 0.3 and encoder.dropout.p == encoder.self_attn.dropout == 0.1  # their own rates, back
    assert model.body.drop.p == 0.0 and not hasattr(model.body.encoder, "p")  # the new modules: untouched


def test_start_zero_works_on_a_run_of_unknown_length():
    model = DropoutModule()
    t = trainer(callbacks=[DropoutRemoval()], max_epochs=-1, max_time={"seconds": 600}, max_steps=-1)
    model.training_step = _stop_after(model, steps=3)
    t.fit(model, loaders("list")[0])
    assert [(inert, det) for _, inert, det in model.log_steps] == [(True, True)] * 3


def _stop_after(model: DropoutModule, steps: int):
    step = model.training_step

    def training_step(batch, batch_idx):
        out = step(batch, batch_idx)
        if len(model.log_steps) == steps:
            model.trainer.should_stop = True
        return out

    return training_step


class HparamDropout(RecordingModule):
    """A dropout rate saved as a hyperparameter, applied with `F.dropout` (or used to build an `nn.Dropout`)."""

    def __init__(self, dropout: float = 0.3, in_module: bool = False) -> None:
        super().__init__(record=False)
        self.save_hyperparameters()
        self.drop = nn.Dropout(dropout if in_module else 0.1)

    def forward(self, x: Tensor) -> Tensor:
        h = self.drop(self.net(x))
        return h if self.hparams.in_module else F.dropout(h, self.hparams.dropout, training=self.training)


def test_a_dropout_rate_kept_in_hparams_and_applied_functionally_is_named():
    with pytest.warns(SpeedupWarning, match=r"not switched off: hparams.dropout=0.3"):
        trainer(callbacks=[DropoutRemoval()], max_epochs=1).fit(HparamDropout(), loaders()[0])
    with warnings.catch_warnings():
        warnings.simplefilter("error", SpeedupWarning)  # nn.Dropout(self.hparams.dropout): handled, no warning
        trainer(callbacks=[DropoutRemoval()], max_epochs=1).fit(HparamDropout(in_module=True), loaders()[0])

        class NotARate(HparamDropout):  # a float32 copy of the handled rate, and a hyperparameter that is no rate
            def __init__(self) -> None:
                super().__init__(dropout=float(torch.tensor(0.1).item()), in_module=True)
                self.drop.p = float(torch.tensor(0.1, dtype=torch.float32))
                self.hparams["lr_drop_factor"] = 0.5
                self.hparams["dropout"] = 0.1

        trainer(callbacks=[DropoutRemoval()], max_epochs=1).fit(NotARate(), loaders()[0])
