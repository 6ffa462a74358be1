"""The extension example of docs/extending.md works as documented."""

import gc
import re
from pathlib import Path

import pytest
import torch

import lightning_speedups
from lightning_speedups import BatchFields, SpeedupCallback
from tests.helpers import MemoryLogger, RecordingModule, loaders, trainer


def _documented_class():
    """The example of docs/extending.md itself, run from the page (a copy here drifted from it)."""
    text = (Path(__file__).parent.parent / "docs" / "extending.md").read_text()
    code = re.search(r"```python\n(.*?)```", text, re.S).group(1)
    namespace: dict = {}
    exec(compile(code, "docs/extending.md", "exec"), namespace)
    return namespace["InputNoise"]


InputNoise = _documented_class()


def test_documented_extension_acts_in_its_window_and_logs():
    model, logger = RecordingModule(), MemoryLogger()
    train, _ = loaders("dict")
    trainer(
        callbacks=[InputNoise(std=0.5, input_key="image", seed=0)], max_epochs=2, logger=logger, log_every_n_steps=1
    ).fit(model, train)
    raw = [b["image"] for b in train] * 2
    changed = [not torch.equal(seen, r) for (seen, _), r in zip(model.train_batches, raw, strict=True)]
    assert changed == [True] * 4 + [False] * 4
    noise = model.train_batches[0][0] - raw[0]
    assert noise.std().item() == pytest.approx(0.5, rel=0.15)
    assert [v for _, v in logger.history["input_noise/std"]] == [0.5] * 4 + [0.0] * 4  # what was applied
    with pytest.raises(ValueError, match="`std` must be >= 0"):
        InputNoise(std=-1)


def test_a_setup_override_without_super_is_a_clear_error_not_a_silent_no_op():
    class NoSuperSetup(InputNoise):
        def setup(self, trainer, pl_module, stage):
            self.ready = True  # forgot super().setup(...)

    model = RecordingModule()
    with pytest.raises(RuntimeError, match=r"NoSuperSetup overrides `transform_batch`.*Call `super\(\)\.setup"):
        trainer(callbacks=[NoSuperSetup(std=0.5)], max_epochs=1).fit(model, loaders("list")[0])
    assert not model.train_batches  # before any step


def test_an_init_without_super_is_a_clear_error():
    class NoSuperInit(SpeedupCallback):
        def __init__(self, factor=2.0):
            self.factor = factor  # forgot super().__init__()

    with pytest.raises(RuntimeError, match=r"NoSuperInit.__init__ did not call `super\(\).__init__\(\)`"):
        trainer(callbacks=[NoSuperInit()], max_epochs=1).fit(RecordingModule(), loaders("list")[0])


def test_a_transform_that_returns_none_is_an_error_not_a_run_of_skipped_steps():
    class ForgetsReturn(InputNoise):
        def transform_batch(self, trainer, pl_module, batch):
            super().transform_batch(trainer, pl_module, batch)  # the result dropped: Lightning skips the step

    model = RecordingModule()
    with pytest.raises(TypeError, match=r"ForgetsReturn.transform_batch returned None.*A missing `return`\?"):
        trainer(callbacks=[ForgetsReturn(std=0.5)], max_epochs=1).fit(model, loaders("list")[0])
    assert not model.train_batches


def test_a_batch_setter_that_returns_none_is_named():
    def setter(batch, x, y):
        batch[0], batch[1] = x, y  # in place, and no return

    cb = InputNoise(std=0.5)
    cb.fields = BatchFields(getter=lambda b: (b[0], b[1]), setter=setter)
    with pytest.raises(TypeError, match="`batch_setter` returned None; it must return the new batch"):
        trainer(callbacks=[cb], max_epochs=1).fit(RecordingModule(), loaders("list")[0])


def test_a_callback_with_only_a_validation_transform_gets_the_validation_batches():
    class ValidationOnly(SpeedupCallback):
        def transform_validation_batch(self, trainer, pl_module, batch):
            x, y = batch
            return [x * 0, y]

    model = RecordingModule()
    trainer(callbacks=[ValidationOnly()], max_epochs=1).fit(model, *loaders("list"))
    assert model.val_batches and all(not x.any() for x, _ in model.val_batches)  # it was never called
    assert all(x.any() for x, _ in model.train_batches)  # training batches as they came

    class NoValidationTransform(SpeedupCallback):  # an attribute that is not a hook: no seam
        transform_validation_batch = None

    assert not NoValidationTransform().transforms_batches


def test_an_on_train_start_override_without_super_still_sees_progress():
    class NoSuperTrainStart(InputNoise):
        def on_train_start(self, trainer, pl_module):
            self.started = True  # forgot super().on_train_start(...)

    model = RecordingModule()
    train = loaders("list")[0]
    trainer(callbacks=[NoSuperTrainStart(std=0.5, until=0.5, seed=0)], max_epochs=2).fit(model, train)
    raw = [x for x, _ in train] * 2
    changed = [not torch.equal(seen, r) for (seen, _), r in zip(model.train_batches, raw, strict=True)]
    assert changed == [True] * 4 + [False] * 4  # the window ends at half the run, as with super()


def test_technique_random_is_not_the_coin_that_decided_p():
    from types import SimpleNamespace

    from lightning.pytorch.trainer.states import RunningStage, TrainerFn

    from lightning_speedups.targets import TargetTransformCallback

    cb = TargetTransformCallback(p=0.5, seed=1)
    draws = []
    for batch in range(400):
        progress = SimpleNamespace(total=SimpleNamespace(started=batch, completed=batch))
        fake = SimpleNamespace(
            global_rank=0,
            fit_loop=SimpleNamespace(epoch_loop=SimpleNamespace(batch_progress=progress)),
            state=SimpleNamespace(stage=RunningStage.TRAINING, fn=TrainerFn.FITTING),
        )
        if cb.batch_random(fake).random() < cb.p:  # the batches the technique acts on
            draws.append(cb.technique_random(fake).random())
    assert 150 < len(draws) < 250
    assert max(draws) > 0.9 and 0.4 < sum(draws) / len(draws) < 0.6  # uniform, not below p like the coin


def _fake_trainer(batch: int):
    from types import SimpleNamespace

    from lightning.pytorch.trainer.states import RunningStage, TrainerFn

    progress = SimpleNamespace(total=SimpleNamespace(started=batch, completed=batch))
    return SimpleNamespace(
        global_rank=0,
        fit_loop=SimpleNamespace(epoch_loop=SimpleNamespace(batch_progress=progress)),
        state=SimpleNamespace(stage=RunningStage.TRAINING, fn=TrainerFn.FITTING),
    )


def test_a_users_class_named_like_a_shipped_one_draws_its_own_stream():
    # a user's own `MixUp` (built here and dropped after: LightningCLI finds callbacks by subclass name)
    MixUp = type("MixUp", (lightning_speedups.MixUp,), {"__module__": "user_package", "__qualname__": "MixUp"})
    ours, users = lightning_speedups.MixUp(seed=1), MixUp(seed=1)
    draws = [
        (ours.batch_random(_fake_trainer(b)).random(), users.batch_random(_fake_trainer(b)).random()) for b in range(8)
    ]
    assert all(a != b for a, b in draws)  # the same seed, not the same coins: the class's module tells them apart
    del MixUp, users
    gc.collect()


def test_a_subclass_that_keeps_its_parents_log_name_logs_beside_it():
    class MyMixUp(lightning_speedups.MixUp):
        pass

    logger = MemoryLogger()
    callbacks = [MyMixUp(end=0.5, seed=0), lightning_speedups.MixUp(start=0.5, seed=0)]
    trainer(callbacks=callbacks, max_epochs=2, logger=logger, log_every_n_steps=1).fit(
        RecordingModule(record=False), loaders("list")[0]
    )
    for name in ("mixup/applied", "mixup_2/applied"):
        steps = [step for step, _ in logger.history[name]]
        assert len(steps) == len(set(steps)) == 8  # one value per step and name: neither overwrites the other


def test_an_on_fit_start_override_without_super_is_a_clear_error():
    class NoSuperFitStart(lightning_speedups.MixUp):
        def on_fit_start(self, trainer, pl_module):
            self.ready = True  # forgot super().on_fit_start(...)

    model = RecordingModule()
    with pytest.raises(RuntimeError, match=r"NoSuperFitStart overrides `on_fit_start` without calling `super"):
        trainer(callbacks=[NoSuperFitStart()], max_epochs=1).fit(model, loaders("list")[0])
    assert not model.train_batches


def test_callbacks_show_their_settings_when_printed():
    from lightning_speedups import LinearScalingWarmup, MixUp, RepeatFactorSampling

    assert repr(MixUp(alpha=0.4, p=0.5, seed=3)) == "MixUp(alpha=0.4, p=0.5, seed=3)"  # **kwargs of the base too
    assert repr(LinearScalingWarmup(reference_batch_size=64)) == "LinearScalingWarmup(reference_batch_size=64)"
    assert (
        repr(RepeatFactorSampling(0.01, labels=list(range(500))))
        == "RepeatFactorSampling(threshold=0.01, labels=<list>)"
    )
    assert repr(InputNoise(std=0.5)) == "InputNoise(std=0.5)"  # a user's: `input_key` is kept inside `fields`
    assert repr(InputNoise(input_key="img")) == "InputNoise(input_key='img')"
    assert repr(MixUp(input_key="x", target_key=2)) == "MixUp(input_key='x', target_key=2)"
    ramp = lightning_speedups.ProgressiveResizing(min_res=8, max_res=16, start_ramp=1, end_ramp=3, res_increment=4)
    assert repr(ramp) == "ProgressiveResizing(min_res=8, max_res=16, start_ramp=1.0, end_ramp=3.0, res_increment=4)"

    class Odd:
        def __eq__(self, other):
            raise AttributeError("no comparing")

        def __repr__(self):
            raise RuntimeError("no repr")

    class Linked(SpeedupCallback):
        def __init__(self, partner=None, odd=None):
            super().__init__()
            self.partner, self.odd = partner, odd

    a = Linked(odd=Odd())
    a.partner = Linked(partner=a)
    assert repr(a) == "Linked(partner=Linked(partner=...), odd=<Odd>)"  # never raises, never recurses
