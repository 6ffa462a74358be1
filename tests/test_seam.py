"""The batch-transform seam: where, when, in which order and for which batches callbacks act."""

from typing import Any

import pytest
import torch
from torch.utils.data import DistributedSampler

from lightning_speedups import BatchFields, SpeedupCallback
from lightning_speedups.seam import active_transforms
from tests.helpers import ImagesDataModule, RecordingModule, loaders, trainer, unpack


class AddToInput(SpeedupCallback):
    """Adds ``value`` to the input and appends its name to a shared log."""

    def __init__(self, value: float, log: list) -> None:
        super().__init__()
        self.value, self.calls, self.fields = value, log, BatchFields()

    def state_key_fields(self):
        return {"value": self.value}

    def transform_batch(self, trainer, pl_module, batch):
        self.calls.append((self.value, len(active_transforms(trainer))))
        x = self.fields.get_input(batch)
        return self.fields.replace(batch, input=x + self.value)


class MarkingModule(RecordingModule):
    """Defines on_after_batch_transfer: multiplies inputs by 10 (must run before our transforms)."""

    def on_after_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        x, y = unpack(batch)
        return [x * 10, y] if isinstance(batch, list) else batch


@pytest.mark.parametrize("kind", ["list", "tuple", "dict", "namedtuple", "dataclass"])
def test_training_batches_replaced_in_callback_order_validation_untouched(kind):
    log: list = []
    model = RecordingModule()
    train, val = loaders(kind, n=32)
    t = trainer(callbacks=[AddToInput(1.0, log), AddToInput(100.0, log)], num_sanity_val_steps=1)
    strategy = t.strategy
    t.fit(model, train, val)
    # order: trainer.callbacks order, both via one seam
    assert [v for v, _ in log[:2]] == [1.0, 100.0] and all(n == 2 for _, n in log)
    assert len(log) == 2 * len(model.train_batches) == 4
    expected = [unpack(b)[0] + 101.0 for b in train]
    for (seen, _), want in zip(model.train_batches, expected, strict=True):
        assert torch.allclose(seen, want)
    # sanity check + validation epoch: untouched
    val_inputs = [unpack(b)[0] for b in val]
    assert len(model.val_batches) == 1 + len(val_inputs)
    for seen, _ in model.val_batches:
        assert any(torch.equal(seen, v) for v in val_inputs)
    # removed at teardown: the strategy is back to its class method
    assert "batch_to_device" not in vars(strategy)
    assert not hasattr(strategy, "_lightning_speedups_seam")


def test_a_failed_fit_leaves_the_strategy_as_it_was():
    """Lightning does not call `teardown` when fit raises; the seam must still come out."""

    class Crashes(RecordingModule):
        def training_step(self, batch, batch_idx):
            if batch_idx == 1:
                raise ArithmeticError("user bug")
            return super().training_step(batch, batch_idx)

    log: list = []
    t = trainer(callbacks=[AddToInput(1.0, log), AddToInput(2.0, log)], max_epochs=1)
    with pytest.raises(ArithmeticError, match="user bug"):
        t.fit(Crashes(), loaders("list", n=32)[0])
    assert len(log) == 4  # both transforms ran on the two batches the step saw
    assert "batch_to_device" not in vars(t.strategy)
    assert not hasattr(t.strategy, "_lightning_speedups_seam")
    assert active_transforms(t) == []


def test_an_error_in_a_transform_names_the_callback_it_came_from():
    # several callbacks transform each batch; a BatchFieldError said "could not find the input" without whose
    plain = loaders("list", n=16)[0]
    odd = torch.utils.data.DataLoader(
        plain.dataset, batch_size=8, collate_fn=lambda s: {"pixels": torch.stack([x for x, _ in s]), "cls": 0}
    )
    t = trainer(callbacks=[AddToInput(1.0, [])], max_epochs=1)
    with pytest.raises(ValueError, match="Could not find the input") as info:
        t.fit(RecordingModule(), odd)
    assert info.value.__notes__ == ["Raised in the callback AddToInput.transform_batch."]


def test_runs_after_model_and_datamodule_transfer_hooks():
    log: list = []
    model = MarkingModule()
    t = trainer(callbacks=[AddToInput(1.0, log)], max_steps=2)
    train, val = loaders("list", n=32)
    t.fit(model, train, val)
    first = next(iter(train))[0]
    assert torch.allclose(model.train_batches[0][0], first * 10 + 1)  # hook first, then ours

    class DM(ImagesDataModule):
        def on_after_batch_transfer(self, batch, dataloader_idx):
            return [batch[0] - 5, batch[1]]

    model = MarkingModule()  # the DataModule's hook wins over the model's, as Lightning decides
    dm = DM(n=32, shuffle=False)
    t = trainer(callbacks=[AddToInput(1.0, log)], max_steps=1)
    t.fit(model, datamodule=dm)
    dm.setup("fit")
    raw = dm.train_dataset.tensors[0][:16]
    assert torch.allclose(model.train_batches[0][0], raw - 5 + 1)


def test_with_the_mixin_and_validate_test_predict_untouched():
    log: list = []
    model = RecordingModule()
    dm = ImagesDataModule(n=32, kind="dict", seed=0)
    t = trainer(callbacks=[AddToInput(1.0, log)], max_epochs=1)
    t.fit(model, datamodule=dm)
    assert len(log) == 2
    # the mixin's seeded epoch-0 order
    first_indices = list(DistributedSampler(dm.train_dataset, num_replicas=1, rank=0, seed=0))[:16]
    assert torch.allclose(model.train_batches[0][0], dm.train_dataset.tensors[0][first_indices] + 1.0)
    model.val_batches.clear()
    t.validate(model, datamodule=dm, verbose=False)
    t.test(model, dataloaders=dm.val_dataloader(), verbose=False)
    t.predict(model, dataloaders=dm.val_dataloader())
    assert len(log) == 2  # no transform outside training
    raw = [b["image"] for b in dm.val_dataloader()]
    assert len(model.val_batches) == 3 * len(raw)
    for i, (seen, _) in enumerate(model.val_batches):
        assert torch.equal(seen, raw[i % len(raw)])


def test_a_seam_left_by_a_teardown_without_super_leaves_validate_batches_alone():
    class NoSuperTeardown(AddToInput):
        def transform_validation_batch(self, trainer, pl_module, batch):
            self.calls.append("validation")
            return batch

        def teardown(self, trainer, pl_module, stage):  # forgets super(): the seam stays on the strategy
            pass

    log: list = []
    model = RecordingModule()
    train, val = loaders("list", n=32)
    t = trainer(callbacks=[NoSuperTeardown(1.0, log)], max_epochs=1, limit_val_batches=1, num_sanity_val_steps=0)
    t.fit(model, train, val)
    assert log.count("validation") == 1  # validation during fit goes through the callback
    del log[:]
    model.val_batches.clear()
    t.validate(model, val, verbose=False)
    assert log == []  # `validate()` is no fit: its batches come as they are
    assert torch.equal(model.val_batches[0][0], next(iter(val))[0])


def test_refit_installs_again_and_two_trainers_do_not_leak():
    log: list = []
    cb = AddToInput(1.0, log)
    for _ in range(2):
        model = RecordingModule()
        t = trainer(callbacks=[cb], max_steps=1)
        t.fit(model, *loaders("list", n=16))
        assert "batch_to_device" not in vars(t.strategy)
    assert len(log) == 2


def test_dataloader_iter_training_step_is_refused_at_fit_start():
    class IterModule(RecordingModule):
        def training_step(self, dataloader_iter):
            batch = next(dataloader_iter)
            return super().training_step(batch, 0)

    t = trainer(callbacks=[AddToInput(1.0, [])], max_steps=1)
    with pytest.raises(RuntimeError, match="dataloader_iter"):
        t.fit(IterModule(), *loaders("list", n=16))
    assert "batch_to_device" not in vars(t.strategy)


class SizeProbe(AddToInput):
    def transform_batch(self, trainer, pl_module, batch):
        self.sizes.append(len(self.fields.get_input(batch)))
        return super().transform_batch(trainer, pl_module, batch)


class SizedModule(RecordingModule):
    def __init__(self):
        super().__init__(record=False)
        self.batch_size = 2

    def train_dataloader(self):
        return loaders(n=64, batch_size=self.batch_size)[0]

    def val_dataloader(self):  # the finder's trials validate too
        return loaders(n=8)[1]


def test_batch_size_finder_trials_see_untransformed_batches(tmp_path):
    # The finder runs its trials with `trainer.callbacks` swapped out: they must measure the batches as they
    # come (a size found on, say, shrunken images would not fit at full size), and the real run resumes ours.
    from lightning.pytorch.callbacks import BatchSizeFinder

    probe = SizeProbe(1.0, [])
    probe.sizes = []
    finder = BatchSizeFinder(mode="power", init_val=2, steps_per_trial=1, max_trials=3)
    t = trainer(callbacks=[finder, probe], max_steps=2, default_root_dir=tmp_path)  # its temporary checkpoint
    t.fit(SizedModule())
    assert finder.optimal_batch_size == 8
    assert probe.sizes == [8, 8]  # the two real steps only: none of the trials' 2, 4, 8
