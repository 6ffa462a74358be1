"""The preset registry: names, lookup errors, overrides, the decorator, entry points, Trainer settings."""

import sys
import textwrap

import pytest
import torch

from lightning_speedups import LabelSmoothing, MixUp, presets
from lightning_speedups.presets import Preset, UnknownPresetError, declarative, register_preset


@pytest.fixture
def registry():
    """Undo registrations made by a test."""
    saved = dict(presets._REGISTRY)
    loaded = presets._entry_points_loaded
    yield presets._REGISTRY
    presets._REGISTRY.clear()
    presets._REGISTRY.update(saved)
    presets._entry_points_loaded = loaded


def test_unknown_name_lists_known_names_and_the_closest(registry):
    presets.register(declarative("mixing-demo", "demo", "demo", [("MixUp", {})]))
    with pytest.raises(UnknownPresetError) as info:
        presets.get("mixing-dmo")
    message = str(info.value)
    assert "Did you mean 'mixing-demo'?" in message and "baseline" in message
    with pytest.raises(UnknownPresetError, match="Known presets:"):
        presets.describe("zzzzzz")


def test_declarative_overrides_change_and_drop_callbacks(registry):
    presets.register(
        declarative("mix-and-smooth", "s", "d", [("MixUp", {"alpha": 0.2}), ("LabelSmoothing", {"smoothing": 0.1})])
    )
    cbs = presets.get("mix-and-smooth", accelerator="cpu").callbacks
    assert [type(c) for c in cbs] == [MixUp, LabelSmoothing] and cbs[0].alpha == 0.2
    cbs = presets.get("mix-and-smooth", accelerator="cpu", MixUp={"alpha": 0.7}, LabelSmoothing=None).callbacks
    assert len(cbs) == 1 and cbs[0].alpha == 0.7
    with pytest.raises(TypeError, match="has no callback CutMix to override; it has MixUp, LabelSmoothing"):
        presets.get("mix-and-smooth", CutMix={})
    with pytest.raises(ValueError, match="`alpha` must be > 0"):
        presets.get("mix-and-smooth", MixUp={"alpha": 0})
    # a misspelt argument is named with the class and the closest match (MixUp takes most through **kwargs)
    with pytest.raises(TypeError, match=r"MixUp has no argument 'alhpa' \('alhpa': did you mean 'alpha'\?\)"):
        presets.get("mix-and-smooth", MixUp={"alhpa": 0.4})
    with pytest.raises(TypeError, match=r"MixUp has no argument 'pp'.*did you mean 'p'"):
        presets.get("mix-and-smooth", MixUp={"pp": 0.4})
    with pytest.raises(TypeError, match=r"the override of MixUp must be a dict of its arguments"):
        presets.get("mix-and-smooth", MixUp=0.4)
    # fresh instances each time: a recipe can be used by two trainers
    assert presets.get("mix-and-smooth").callbacks[0] is not presets.get("mix-and-smooth").callbacks[0]
    assert "MixUp(alpha=0.2)" in presets.describe("mix-and-smooth")


def test_decorator_registers_a_function_preset(registry):
    @register_preset("team-recipe", requires="nothing special")
    def team_recipe(alpha: float = 0.3):
        """MixUp as our team tunes it.

        Longer explanation."""
        return [MixUp(alpha=alpha)]

    assert "team-recipe" in presets.names()
    assert presets.get("team-recipe", alpha=0.5).callbacks[0].alpha == 0.5
    text = presets.describe("team-recipe")
    assert text.startswith("team-recipe: MixUp as our team tunes it.") and "requires: nothing special" in text
    with pytest.raises(ValueError, match="exists already"):
        register_preset("team-recipe")(team_recipe)
    with pytest.raises(ValueError, match="only declarative presets export to YAML"):
        presets.to_yaml("team-recipe")


def test_entry_point_group_registers_third_party_presets(registry, tmp_path, monkeypatch):
    (tmp_path / "acme_presets.py").write_text(
        textwrap.dedent(
            """
            from lightning_speedups.presets import declarative
            ACME = declarative("acme-fast", "Acme's recipe.", "Acme.", [("LabelSmoothing", {"smoothing": 0.2})])
            """
        )
    )
    dist = tmp_path / "acme_presets-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: acme-presets\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text("[lightning_speedups.presets]\nacme = acme_presets:ACME\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    presets._entry_points_loaded = False
    assert "acme-fast" in presets.names()
    assert presets.get("acme-fast").callbacks[0].smoothing == 0.2
    sys.modules.pop("acme_presets", None)


def test_broken_entry_point_warns_and_keeps_the_built_ins(registry, tmp_path, monkeypatch):
    dist = tmp_path / "broken-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: broken\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text("[lightning_speedups.presets]\nbad = no_such_module:X\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    presets._entry_points_loaded = False
    with pytest.warns(UserWarning, match="Could not load preset entry point 'bad'"):
        assert "baseline" in presets.names()


def test_recommended_trainer_settings(monkeypatch):
    assert presets.recommended_precision("cpu") == "32-true"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    # torch's default counts emulated bf16 (pre-Ampere) as supported; only native bf16 should pick bf16-mixed
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: True)
    assert presets.recommended_precision("gpu") == "bf16-mixed"
    assert presets.recommended_precision("auto") == "bf16-mixed"
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: including_emulation)
    assert presets.recommended_precision("cuda") == "16-mixed"
    assert presets.recommended_precision("cpu") == "32-true"
    assert presets.recommended_strategy(1) == "auto"
    assert presets.recommended_strategy(4) == "ddp"
    assert presets.recommended_strategy([0, 1]) == "ddp"
    assert presets.recommended_strategy("0,1") == "ddp"  # the Trainer's string forms
    assert presets.recommended_strategy("1,") == "auto"
    assert presets.recommended_strategy("2") == "ddp"
    assert presets.recommended_strategy("1") == "auto"
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert presets.recommended_strategy("auto") == "auto"  # no CUDA: "auto" is one CPU process
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert presets.recommended_strategy("auto") == presets.recommended_strategy(-1) == "ddp"
    assert presets.recommended_strategy("auto", "gpu") == "ddp"
    assert presets.recommended_strategy("auto", "cpu") == presets.recommended_strategy(-1, "cpu") == "auto"
    assert presets.get("baseline", accelerator="cpu", devices="auto").trainer_kwargs["strategy"] == "auto"
    with pytest.raises(ValueError, match="`devices` must be a count"):
        presets.recommended_strategy("two")
    recipe = presets.get("baseline", accelerator="cpu", devices=2)
    assert recipe.trainer_kwargs == {"accelerator": "cpu", "devices": 2, "precision": "32-true", "strategy": "ddp"}


def test_recipe_builds_a_trainer(registry):
    presets.register(declarative("smooth", "s", "d", [("LabelSmoothing", {})], trainer={"gradient_clip_val": 1.0}))
    recipe = presets.get("smooth", accelerator="cpu")
    trainer = recipe.trainer(max_steps=1, callbacks=[MixUp()], logger=False)
    names = [type(c).__name__ for c in trainer.callbacks]
    assert names.index("LabelSmoothing") < names.index("MixUp")
    assert trainer.gradient_clip_val == 1.0 and trainer.max_steps == 1


def test_invalid_registrations(registry):
    with pytest.raises(ValueError, match="non-empty str name"):
        presets.register(Preset("", "s", "d", lambda: []))
    with pytest.raises(TypeError, match="no callbacks to override"):
        presets.get("baseline", MixUp={})


def test_plugins_that_are_invalid_or_clash_are_each_warned_about_and_the_others_still_load(
    registry, tmp_path, monkeypatch
):
    (tmp_path / "mixed_presets.py").write_text(
        textwrap.dedent(
            """
            from lightning_speedups.presets import Preset, declarative
            NAMELESS = Preset("", "s", "d", lambda: [])
            CLASH = declarative("vision-mild", "Not ours.", "d", [("LabelSmoothing", {})])
            NOT_A_PRESET = 42
            GOOD = declarative("acme-good", "Fine.", "d", [("LabelSmoothing", {"smoothing": 0.2})])
            """
        )
    )
    dist = tmp_path / "mixed_presets-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: mixed-presets\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text(
        "[lightning_speedups.presets]\na = mixed_presets:NAMELESS\nb = mixed_presets:CLASH\n"
        "c = mixed_presets:NOT_A_PRESET\nd = mixed_presets:GOOD\ne = mixed_presets\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    presets._entry_points_loaded = False
    with pytest.warns(UserWarning) as record:
        known = presets.names()
    text = "\n".join(str(w.message) for w in record)
    assert "'a'" in text and "non-empty str name" in text
    assert "'b'" in text and "'vision-mild' exists already" in text
    assert "'c'" in text and "it is a int; name a `lightning_speedups.presets.Preset`" in text
    assert "acme-good" in known and presets.lookup("vision-mild").summary != "Not ours."
    assert "'e'" not in text and len(record) == 3  # a module (its import registers presets) is fine
    sys.modules.pop("mixed_presets", None)


def test_the_decorator_used_bare_registers_under_the_functions_name(registry):
    @register_preset
    def bare_recipe():
        """Label smoothing only."""
        return [LabelSmoothing(0.1)]

    assert callable(bare_recipe) and bare_recipe.__name__ == "bare_recipe"
    assert presets.describe("bare-recipe").startswith("bare-recipe: Label smoothing only.")


def test_yaml_export_keeps_sequences_strings_and_trainer_settings(registry):
    presets.register(
        declarative(
            "yaml-check",
            "s",
            "d",
            [("LinearScalingWarmup", {"exclude_groups": (1,), "warmup_unit": 'st"eps'})],
            trainer={"accumulate_grad_batches": 4, "gradient_clip_val": float("inf")},
        )
    )
    text = presets.to_yaml("yaml-check")
    assert "  accumulate_grad_batches: 4\n" in text and "  gradient_clip_val: .inf\n" in text
    assert "exclude_groups: [1]" in text and 'warmup_unit: "st\\"eps"' in text
    presets.register(declarative("yaml-bad", "s", "d", [("MixUp", {"alpha": object()})]))
    with pytest.raises(TypeError, match=r"Cannot write MixUp\(alpha=...\)"):
        presets.to_yaml("yaml-bad")


def test_a_recipe_trainer_on_another_accelerator_gets_that_accelerators_settings(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: True)
    recipe = presets.get("vision-mild", accelerator="gpu", devices=2)
    assert recipe.trainer_kwargs["precision"] == "bf16-mixed" and recipe.trainer_kwargs["strategy"] == "ddp"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    trainer = recipe.trainer(accelerator="cpu", devices=1, logger=False)
    assert trainer.precision == "32-true" and type(trainer.strategy).__name__ == "SingleDeviceStrategy"


@pytest.mark.parametrize("callbacks", [None, MixUp(), [MixUp()], (MixUp(),)])
def test_recipe_trainer_takes_callbacks_as_pl_trainer_does(callbacks):
    # pl.Trainer takes None, one callback or a list: so does Recipe.trainer, appending them to the recipe's
    recipe = presets.get("vision-mild", accelerator="cpu")
    trainer = recipe.trainer(callbacks=callbacks, logger=False, enable_checkpointing=False)
    ours = [type(cb).__name__ for cb in trainer.callbacks if type(cb).__module__.startswith("lightning_speedups")]
    expected = ["ProgressiveResizing", "LabelSmoothing", "LinearScalingWarmup"]
    assert ours == expected + ([] if callbacks is None else ["MixUp"])
