"""The preset registry: names, lookup errors, overrides, the decorator, entry points, Trainer settings."""

import copy
import functools
import sys
import textwrap
import warnings

import numpy as np
import pytest
import torch

from lightning_speedups import (
    LabelSmoothing,
    LinearScalingWarmup,
    LossScore,
    MixUp,
    ProgressiveResizing,
    SpeedupWarning,
    cli,
    presets,
)
from lightning_speedups.presets import Preset, UnknownPresetError, declarative, register_preset


@pytest.fixture
def registry():
    """Undo registrations made by a test."""
    saved = dict(presets._REGISTRY)
    loaded, plugged = presets._entry_points_loaded, set(presets._FROM_ENTRY_POINTS)
    yield presets._REGISTRY
    presets._REGISTRY.clear()
    presets._REGISTRY.update(saved)
    presets._entry_points_loaded = loaded
    presets._FROM_ENTRY_POINTS.clear()
    presets._FROM_ENTRY_POINTS.update(plugged)


def _install_plugin(tmp_path, monkeypatch, dist: str, entry_points: str) -> None:
    """A distribution ``dist`` installed in ``tmp_path`` whose ``lightning_speedups.presets`` entry points are the
    lines of ``entry_points``; the plug-ins are loaded again at the next ``names()``."""
    info = tmp_path / f"{dist}-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist.replace('_', '-')}\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[lightning_speedups.presets]\n" + entry_points)
    monkeypatch.syspath_prepend(str(tmp_path))
    presets._entry_points_loaded = False


def test_unknown_name_lists_known_names_and_the_closest(registry):
    presets.register(declarative("mixing-demo", "demo", "demo", [("MixUp", {})]))
    with pytest.raises(UnknownPresetError) as info:
        presets.get("mixing-dmo")
    message = str(info.value)
    assert "Did you mean 'mixing-demo'?" in message and "baseline" in message
    with pytest.raises(UnknownPresetError, match=r"Known presets:.*`@register_preset` exists where its module has"):
        presets.describe("zzzzzz")
    with pytest.raises(UnknownPresetError, match=r"Unknown preset 'MIXING-DEMO'\. Did you mean 'mixing-demo'\?"):
        presets.get("MIXING-DEMO")  # the closest name whatever the case


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

    def another(alpha: float = 0.3):
        return [MixUp(alpha=alpha)]

    with pytest.raises(ValueError, match=r"'team-recipe' exists already \(from tests\.test_presets_registry\..*"):
        register_preset("team-recipe")(another)
    with pytest.raises(ValueError, match="exists already"):  # a function of a function: maybe not the same one
        register_preset("team-recipe")(team_recipe)
    import functools

    presets.register(presets.Preset("shared", "a", "d", functools.partial(another, alpha=0.1)))
    with pytest.raises(ValueError, match="'shared' exists already"):  # a partial (or closure) is no one's own
        presets.register(presets.Preset("shared", "b", "d", functools.partial(another, alpha=0.2)))
    same = declarative("mix-smooth", "s", "d", [("MixUp", {"alpha": 0.2})])
    presets.register(same)
    presets.register(declarative("mix-smooth", "s", "d", [("MixUp", {"alpha": 0.2})]))  # declared again: fine
    with pytest.raises(ValueError, match="'mix-smooth' exists already"):
        presets.register(declarative("mix-smooth", "s", "d", [("MixUp", {"alpha": 0.4})]))
    # a declaration with an array argument, declared again (a notebook cell run twice): raised "the truth value of
    # an array is ambiguous"; one with other values is still another preset
    # NaN settings (one object or two): the same declaration (the same NaN object was, until arrays were compared
    # element-wise)
    for i, nan in enumerate(
        [np.array([0.0, np.nan]), np.array([0.0, np.nan], dtype=object), [np.float32(0), np.float32("nan")]]
    ):
        presets.register(declarative(f"with-nan-{i}", "s", "d", [("CurriculumOrdering", {"difficulty": nan})]))
        again = copy.deepcopy(nan)  # other NaN objects
        presets.register(declarative(f"with-nan-{i}", "s", "d", [("CurriculumOrdering", {"difficulty": again})]))
    for make in (np.arange, torch.arange):
        scores = [("CurriculumOrdering", {"difficulty": make(5) / 5})]
        presets.register(declarative(f"paced-{make.__module__}", "s", "d", scores), overwrite=True)
        presets.register(
            declarative(f"paced-{make.__module__}", "s", "d", [("CurriculumOrdering", {"difficulty": make(5) / 5})])
        )
        with pytest.raises(ValueError, match="exists already"):
            presets.register(
                declarative(f"paced-{make.__module__}", "s", "d", [("CurriculumOrdering", {"difficulty": make(6) / 6})])
            )
    with pytest.raises(ValueError, match="only declarative presets export to YAML"):
        presets.to_yaml("team-recipe")


def test_a_module_reloaded_registers_its_presets_again(registry, tmp_path, monkeypatch):
    # a notebook cell run twice, `importlib.reload`: the same function of the same module, a new object
    import importlib

    source = """
        from lightning_speedups import MixUp
        from lightning_speedups.presets import register_preset

        @register_preset("reloaded-recipe")
        def reloaded_recipe(alpha: float = {alpha}):
            return [MixUp(alpha=alpha)]
    """
    module = tmp_path / "team_presets.py"
    module.write_text(textwrap.dedent(source.format(alpha=0.3)))
    monkeypatch.syspath_prepend(str(tmp_path))
    team = importlib.import_module("team_presets")
    module.write_text(textwrap.dedent(source.format(alpha=0.2)))
    importlib.invalidate_caches()
    monkeypatch.setattr(sys, "dont_write_bytecode", True)
    importlib.reload(team)  # raised "exists already"
    assert presets.get("reloaded-recipe").callbacks[0].alpha == 0.2


def test_entry_point_group_registers_third_party_presets(registry, tmp_path, monkeypatch):
    (tmp_path / "acme_presets.py").write_text(
        textwrap.dedent(
            """
            from lightning_speedups.presets import declarative
            ACME = declarative("acme-fast", "Acme's recipe.", "Acme.", [("LabelSmoothing", {"smoothing": 0.2})])
            """
        )
    )
    _install_plugin(tmp_path, monkeypatch, "acme_presets", "acme = acme_presets:ACME\n")
    assert "acme-fast" in presets.names()
    recipe = presets.get("acme-fast")
    assert recipe.callbacks[0].smoothing == 0.2
    # a plug-in's preset is found by the command in a process of its own: the replacement warning names it
    with pytest.warns(UserWarning, match=r"\(`lightning-speedups presets acme-fast` lists them\)"):
        recipe.with_callbacks([LabelSmoothing(smoothing=0.3)])
    sys.modules.pop("acme_presets", None)


def test_broken_entry_point_warns_and_keeps_the_built_ins(registry, tmp_path, monkeypatch):
    _install_plugin(tmp_path, monkeypatch, "broken", "bad = no_such_module:X\n")
    with pytest.warns(UserWarning, match="Could not load preset entry point 'bad'"):
        assert "baseline" in presets.names()


def test_an_entry_point_that_exits_as_it_is_imported_is_warned_about(registry, tmp_path, monkeypatch):
    """A script registered by mistake (argparse on import) exits: the built-in presets still answer."""
    (tmp_path / "script_not_plugin.py").write_text("raise SystemExit(2)\n")
    monkeypatch.delitem(sys.modules, "script_not_plugin", raising=False)
    _install_plugin(tmp_path, monkeypatch, "script", "oops = script_not_plugin\n")
    with pytest.warns(UserWarning, match=r"Could not load preset entry point 'oops'.*SystemExit: 2"):
        assert "vision-mild" in presets.names()


def test_a_malformed_entry_point_value_is_warned_about_and_the_other_plugins_still_load(
    registry, tmp_path, monkeypatch
):
    # `my-plugin.presets` (a hyphen) is no module path: `EntryPoint.module` raises on it, which broke every `names()`
    (tmp_path / "typo_neighbour_presets.py").write_text(
        "from lightning_speedups.presets import declarative\n"
        "GOOD = declarative('good-one', 's', 'd', [('MixUp', {})])\n"
    )
    monkeypatch.delitem(sys.modules, "typo_neighbour_presets", raising=False)  # imported afresh, dropped after
    _install_plugin(
        tmp_path,
        monkeypatch,
        "typo",
        "bad = typo-plugin.presets\nworse = typo_neighbour_presets:my-preset\nfine = typo_neighbour_presets:GOOD\n",
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        known = presets.names()
    said = " ".join(str(w.message) for w in caught)
    for name, value in (("bad", "typo-plugin.presets"), ("worse", "typo_neighbour_presets:my-preset")):
        assert f"Could not load preset entry point {name!r} ({value}): its value is no `module`" in said
    assert "good-one" in known and "vision-mild" in known
    assert presets.get("good-one").callbacks[0].alpha == 0.2


def test_recommended_trainer_settings(monkeypatch):
    assert presets.recommended_precision("cpu") == "32-true"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    # torch's default counts emulated bf16 (pre-Ampere) as supported; only native bf16 should pick bf16-mixed
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: True)
    assert presets.recommended_precision("gpu") == "bf16-mixed"
    assert presets.recommended_precision("auto") == "bf16-mixed"
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: including_emulation)
    assert presets.recommended_precision("cuda") == "16-mixed"
    # torch before 2.4 has no `including_emulation`: the compute capability decides (bf16 natively from 8.0)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))
    assert presets.recommended_precision("gpu") == "bf16-mixed"
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (7, 5))
    assert presets.recommended_precision("gpu") == "16-mixed"
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
    _install_plugin(
        tmp_path,
        monkeypatch,
        "mixed_presets",
        "a = mixed_presets:NAMELESS\nb = mixed_presets:CLASH\n"
        "c = mixed_presets:NOT_A_PRESET\nd = mixed_presets:GOOD\ne = mixed_presets\n",
    )
    with pytest.warns(UserWarning) as record:
        known = presets.names()
    text = "\n".join(str(w.message) for w in record)
    assert "'a'" in text and "non-empty str name" in text
    assert "'b'" in text and "'vision-mild' exists already" in text
    assert "'c'" in text and "it is a int; name a `lightning_speedups.presets.Preset`" in text
    assert "acme-good" in known and presets.lookup("vision-mild").summary != "Not ours."
    assert "'e'" not in text and len(record) == 3  # a module (its import registers presets) is fine
    sys.modules.pop("mixed_presets", None)


def test_a_plugins_import_adds_presets_but_never_replaces_one_and_a_failed_import_adds_none(
    registry, tmp_path, monkeypatch
):
    (tmp_path / "hijack_presets.py").write_text(
        textwrap.dedent(
            """
            from lightning_speedups import LabelSmoothing
            from lightning_speedups.presets import register_preset

            @register_preset("vision-mild", overwrite=True)
            def hijack():
                \"\"\"Not the built-in.\"\"\"
                return []

            @register_preset("hijack-own")
            def own_recipe():
                \"\"\"A plug-in's own recipe.\"\"\"
                return [LabelSmoothing(0.2)]

            @register_preset("hijack-second")
            def second_recipe():
                \"\"\"Another, named by a second entry point of the same (already imported) module.\"\"\"
                return []
            """
        )
    )
    (tmp_path / "half_presets.py").write_text(
        textwrap.dedent(
            """
            from lightning_speedups.presets import register_preset

            @register_preset("half-first")
            def first():
                return []

            raise ImportError("broken after its first preset")
            """
        )
    )
    _install_plugin(
        tmp_path,
        monkeypatch,
        "hijack_presets",
        "fn = hijack_presets:own_recipe\nfn2 = hijack_presets:second_recipe\nhalf = half_presets\n",
    )
    built_in = presets._REGISTRY["vision-mild"]
    with pytest.warns(UserWarning) as record:
        known = presets.names()
    text = "\n".join(str(w.message) for w in record)
    assert presets.lookup("vision-mild") is built_in  # not hijacked, and said so
    assert "Ignored the preset 'vision-mild' that preset entry point 'fn'" in text
    # naming the decorated function is fine: no "Ignored ... it is a function"
    assert "hijack-own" in known and "it is a function" not in text
    assert "half-first" not in known and "Could not load preset entry point 'half'" in text  # nothing half-loaded
    assert len(record) == 2
    sys.modules.pop("hijack_presets", None)


def test_declarative_presets_take_classes_by_import_path_and_refuse_a_misspelt_name_at_once(registry):
    with pytest.raises(ValueError, match=r"No callback class named 'MixUpp'.*Did you mean 'MixUp'\?"):
        declarative("typo", "s", "d", [("MixUpp", {})])  # at definition, not at the first `get`
    with pytest.raises(TypeError, match=r"Preset 'typo': MixUp has no argument 'alpah'.*did you mean 'alpha'"):
        declarative("typo", "s", "d", [("MixUp", {"alpah": 0.4})])  # its arguments too: no broken YAML later
    preset = declarative(
        "by-path", "s", "d", [("lightning.pytorch.callbacks.LearningRateMonitor", {"logging_interval": "step"})]
    )
    presets.register(preset)
    (monitor,) = presets.get("by-path").callbacks
    assert type(monitor).__name__ == "LearningRateMonitor" and monitor.logging_interval == "step"
    assert "class_path: lightning.pytorch.callbacks.LearningRateMonitor" in presets.to_yaml("by-path")
    with pytest.raises(ValueError, match="is not a Lightning Callback class"):
        presets.resolve_callback_class("torch.nn.Linear")


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


@pytest.fixture
def infos(monkeypatch):
    """The rank-zero info lines the presets log."""
    lines: list[str] = []
    monkeypatch.setattr(presets, "rank_zero_info", lambda message, *a, **k: lines.append(message), raising=False)
    return lines


def test_a_users_callback_of_a_presets_class_replaces_the_presets(infos):
    # two MixUps would mix every batch twice (different p), or trip Lightning's unique state_key check
    recipe = presets.get("vision-medium", accelerator="cpu")
    mine = MixUp(alpha=0.4, p=0.9)
    with pytest.warns(SpeedupWarning, match=r"alpha=0\.4 \(the preset's: 0\.2\), p=0\.9 \(the preset's: 1\.0\)\."):
        trainer = recipe.trainer(callbacks=[mine], logger=False, enable_checkpointing=False)
    ours = [cb for cb in trainer.callbacks if type(cb).__module__.startswith("lightning_speedups")]
    assert [type(cb).__name__ for cb in ours] == [  # in the preset's slot: batch transforms run in this order
        "ProgressiveResizing",
        "LabelSmoothing",
        "MixUp",
        "LinearScalingWarmup",
    ]
    assert [cb for cb in ours if isinstance(cb, MixUp)] == [mine]
    # same arguments as the preset's: Lightning refused the pair ("more than one stateful callback"); an info line
    trainer = recipe.trainer(callbacks=LabelSmoothing(0.1), logger=False, enable_checkpointing=False)
    assert len([cb for cb in trainer.callbacks if isinstance(cb, LabelSmoothing)]) == 1
    assert infos == ["Preset 'vision-medium': your LabelSmoothing replaces the preset's LabelSmoothing."]


def test_replacement_warnings_compare_by_value_cover_subclasses_and_give_a_fix_that_works(registry, infos):
    from lightning_speedups import CurriculumOrdering, LossScore

    @register_preset("by-function")
    def by_function(difficulty=None):
        values = np.arange(5.0) if difficulty is None else difficulty
        return [CurriculumOrdering("linear", difficulty=values), MixUp(alpha=0.3, p=0.5)]

    recipe = presets.get("by-function", accelerator="cpu")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # equal arrays, and a scorer object that cannot be compared: no warning
        recipe.with_callbacks([CurriculumOrdering("linear", difficulty=np.arange(5.0))])
        with_scorer = presets.get("by-function", difficulty=LossScore())
        with_scorer.with_callbacks([CurriculumOrdering("linear", difficulty=LossScore())])
    assert len(infos) == 2

    # a subclass is compared over the preset's class's arguments (p left at 1.0 ran every batch, unsaid); a function
    # preset takes no `MixUp={...}`: no such fix offered
    class MyMixUp(MixUp):
        pass

    with pytest.warns(SpeedupWarning) as record:
        recipe.with_callbacks([MyMixUp(alpha=0.3)])
    (message,) = [str(w.message) for w in record]
    assert "with other arguments: p=1.0 (the preset's: 0.5)." in message and "presets.get(" not in message
    # registered by this script: the command (another process) would not know it, `describe` does
    assert "(`lightning_speedups.presets.describe('by-function')` lists them)" in message
    # a declarative preset's spec by import path: the override's key is that path
    presets.register(declarative("by-path", "s", "d", [("lightning_speedups.MixUp", {"p": 0.5})]))
    with pytest.warns(
        SpeedupWarning, match=r"presets\.get\('by-path', \*\*\{'lightning_speedups\.MixUp': \{\.\.\.\}\}\)"
    ):
        presets.get("by-path").with_callbacks([MixUp()])


@pytest.mark.parametrize(
    ("a", "b", "same"),
    [
        (np.mean, np.median, False),  # numpy's array-function dispatchers compare by identity
        (functools.partial(max, 1), functools.partial(max, 2), False),
        (np.add, np.multiply, False),
        (torch.float16, torch.bfloat16, False),
        (torch.ones(3, dtype=torch.bfloat16), torch.ones(3, dtype=torch.bfloat16), True),  # no numpy bf16
        ([np.arange(3)], [np.arange(3)], True),
        ({"a": np.arange(3)}, {"a": np.arange(3)}, True),
        (np.array([np.nan, 1.0]), np.array([np.nan, 1.0]), True),
        (np.arange(3), np.arange(4), False),
        (torch.tensor([1.0, 2.0]), np.array([1.0, 2.5]), False),
        (np.mean, np.mean, True),
        (LossScore(), LossScore(), True),  # identity-only objects by their reprs, which show their settings
        (LossScore(), LossScore(torch.nn.functional.nll_loss, input_key="image"), False),
        (lambda x: x, lambda x: x, False),  # two functions: by identity, not by their (equal) reprs
        (functools.partial(max, *range(50)), functools.partial(max, *range(51)), False),  # long reprs
        (functools.partial(max, *range(50)), functools.partial(max, *range(50)), True),
        (np.array(["a", "b"]), np.array(["a", "b"]), True),  # no tensor of strings
        (np.arange(3).astype(">i4"), np.arange(3).astype(">i4"), True),
    ],
)
def test_settings_compare_by_value_where_they_can(a, b, same):
    from lightning_speedups.base import _same_setting

    assert _same_setting(a, b) is same


def test_a_misspelt_class_of_a_module_gets_the_closest_one():
    # it was "'lightning_speedups.MixUpp' is not a Lightning Callback class.", as if the class existed
    with pytest.raises(
        ValueError, match=r"Module 'lightning_speedups' has no attribute 'MixUpp'\. Did you mean 'MixUp'"
    ):
        presets.resolve_callback_class("lightning_speedups.MixUpp")
    with pytest.raises(ValueError, match=r"'lightning_speedups\.presets' is not a Lightning Callback class"):
        presets.resolve_callback_class("lightning_speedups.presets")


def test_a_replacement_that_leaves_out_the_presets_arguments_says_which(infos):
    # from the command line a replacement is built from its class's defaults: a LinearScalingWarmup given only a
    # new length had reference 256 (a quarter of the user's learning rate at batch 64), with an info line only
    recipe = presets.get("vision-mild", accelerator="cpu")
    with pytest.warns(SpeedupWarning) as record:
        recipe.with_callbacks([LinearScalingWarmup(warmup=0.1)])
    (message,) = [str(w.message) for w in record]
    assert message.startswith("Preset 'vision-mild': your LinearScalingWarmup replaces the preset's")
    for part in (
        "reference_batch_size=256 (the preset's: 'initial')",
        "warmup=0.1 (the preset's: 0.05)",
        "warmup_unit='epochs' (the preset's: 'fraction')",
        "presets.get('vision-mild', LinearScalingWarmup={...})",
        "(`lightning-speedups presets vision-mild` lists them)",  # a built-in preset: the command knows it
    ):
        assert part in message
    assert infos == []


def test_a_replacing_crop_keeps_the_presets_place_before_cutmix(infos):
    recipe = presets.get("vision-aggressive", accelerator="cpu")
    crop = ProgressiveResizing(0.5, mode="crop")
    trainer = recipe.trainer(callbacks=[crop], logger=False, enable_checkpointing=False)
    names = [type(cb).__name__ for cb in trainer.callbacks]
    assert names.index("ProgressiveResizing") < names.index("CutMix") and crop in trainer.callbacks
    crop._check_order(trainer)  # the crop-after-CutMix check passes: nothing to reorder for the user


def test_several_devices_with_a_batch_size_finder_is_refused_up_front():
    # Lightning's BatchSizeFinder refuses distributed runs, which `get` recommended DDP for
    with pytest.raises(ValueError, match=r"Preset 'large-batch' has a BatchSizeFinder, which runs on one device only"):
        presets.get("large-batch", accelerator="cpu", devices=2)
    with pytest.raises(ValueError, match=r"BatchSizeFinder=None, LinearScalingWarmup=\{'reference_batch_size': B\}"):
        presets.get("large-batch", accelerator="cpu", devices=[0, 1])
    recipe = presets.get("large-batch", accelerator="cpu")
    with pytest.raises(ValueError, match="one device only"):
        recipe.trainer(devices=2, logger=False)
    with pytest.raises(ValueError, match="one device only"):
        recipe.trainer(strategy="ddp_spawn", logger=False)
    # the way the message gives: no finder, the learning rate scaled from the batch it was tuned for
    multi = presets.get(
        "large-batch",
        accelerator="cpu",
        devices=2,
        BatchSizeFinder=None,
        LinearScalingWarmup={"reference_batch_size": 32},
    )
    assert multi.trainer_kwargs["strategy"] == "ddp" and multi.callbacks[0].reference_batch_size == 32
    text = presets.describe("large-batch")
    assert (
        "one device only (BatchSizeFinder)" in text
        and "requires: " in text
        and "one device" in text.split("requires: ")[1]
    )


def test_describe_gives_the_trainer_settings_get_adds(registry):
    assert (
        "trainer: precision for the hardware (bf16-mixed or 16-mixed on CUDA, else 32-true), Lightning's DDP on "
        "several devices ('ddp', or 'ddp_fork' in a notebook)" in presets.describe("vision-mild")
    )
    presets.register(declarative("fixed", "s", "d", [("LabelSmoothing", {})], trainer={"precision": "bf16-mixed"}))
    assert "notebook), precision='bf16-mixed'" in presets.describe("fixed")


def test_describe_names_a_factory_that_is_not_a_plain_function(registry):
    def mixing(alpha: float = 0.2):
        return [MixUp(alpha=alpha)]

    presets.register(presets.Preset("partial-mix", "s", "d", factory=functools.partial(mixing, alpha=0.4)))
    assert presets.get("partial-mix").callbacks[0].alpha == 0.4
    assert "callbacks: built by functools.partial" in presets.describe("partial-mix")


def test_a_broken_plugin_under_warnings_as_errors_keeps_the_good_plugins(registry, tmp_path, monkeypatch):
    # `-W error` turned the first warning into an exception in the middle of the loop: the good plug-in after it
    # stayed out of the registry for the rest of the process
    (tmp_path / "good_presets.py").write_text(
        "from lightning_speedups.presets import declarative\n"
        "GOOD = declarative('acme-good', 'Fine.', 'd', [('LabelSmoothing', {'smoothing': 0.2})])\n"
    )
    _install_plugin(
        tmp_path, monkeypatch, "good_presets", "a_broken = no_such_module_xyz:X\nb_good = good_presets:GOOD\n"
    )
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(UserWarning, match="Could not load preset entry point 'a_broken'"):
            presets.names()
        assert "acme-good" in presets.names()
    sys.modules.pop("good_presets", None)


def test_config_path_is_the_shipped_file_only_for_the_built_in_preset_itself(registry):
    assert presets.config_path("vision-mild").name == "vision-mild.yaml"

    @register_preset("vision-mild", overwrite=True)
    def mine():
        """Only label smoothing."""
        return [LabelSmoothing(0.05)]

    # the shipped file describes the built-in recipe, not this one
    with pytest.raises(FileNotFoundError, match=r"'vision-mild' \(it replaced the built-in one.*built by a function"):
        presets.config_path("vision-mild")
    presets.register(declarative("vision-medium", "s", "d", [("LabelSmoothing", {})]), overwrite=True)
    with pytest.raises(FileNotFoundError, match=r"presets\.to_yaml\('vision-medium'\)"):
        presets.config_path("vision-medium")
    presets.register(declarative("acme-decl", "Acme.", "d", [("LabelSmoothing", {"smoothing": 0.2})]))
    with pytest.raises(FileNotFoundError, match=r"only the built-in presets ship one\); write its config with "):
        presets.config_path("acme-decl")


def test_yaml_export_writes_numpy_and_torch_scalars_and_the_cli_explains_what_it_cannot(registry, capsys):
    presets.register(
        declarative(
            "scalars",
            "s",
            "d",
            [("MixUp", {"alpha": np.float64(0.4), "seed": np.int64(3)}), ("LinearScalingWarmup", {"warmup": 0.05})],
            trainer={"gradient_clip_val": torch.tensor(1.5), "accumulate_grad_batches": np.array(2)},
        )
    )
    presets.register(declarative("nested", "s", "d", [("LinearScalingWarmup", {"exclude_groups": [np.int64(1)]})]))
    text = presets.to_yaml("scalars")
    assert "  gradient_clip_val: 1.5\n  accumulate_grad_batches: 2\n" in text
    assert "        alpha: 0.4\n        seed: 3\n" in text
    assert "exclude_groups: [1]" in presets.to_yaml("nested")
    presets.register(declarative("yaml-bad", "s", "d", [("MixUp", {"alpha": object()})]))
    assert cli.main(["presets", "yaml-bad", "--config"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: Cannot write MixUp(alpha=...)") and "give it as a number" in err


def test_override_mistakes_are_named(registry):
    with pytest.raises(TypeError, match=r"no callback mixup to override \('mixup': did you mean 'MixUp'\?\)"):
        presets.get("vision-medium", mixup={"alpha": 0.4})
    with pytest.raises(TypeError, match=r"no callback CutMix to override; it has"):  # another class: no guess
        presets.get("vision-medium", CutMix=None)
    # a value the callback refuses: which of the preset's callbacks (MixUp and CutMix both take an `alpha`)
    with pytest.raises(ValueError, match=r"`alpha` must be > 0") as info:
        presets.get("vision-aggressive", CutMix={"alpha": -1})
    assert info.value.__notes__ == ["In preset 'vision-aggressive', building its CutMix."]

    @register_preset("fn-recipe")
    def fn_recipe(smoothing: float = 0.1):
        """Label smoothing only."""
        return [LabelSmoothing(smoothing)]

    with pytest.raises(TypeError, match=r"'fn-recipe' is built by a function, which takes smoothing; got MixUp"):
        presets.get("fn-recipe", MixUp={"alpha": 0.4})
    assert presets.get("fn-recipe", smoothing=0.2).callbacks[0].smoothing == 0.2


@pytest.mark.parametrize("b_value", ["plug_b", "plug_b [extra]"])  # extras: valid entry-point syntax
def test_a_failed_plugin_keeps_the_presets_of_another_plugin_it_imported(registry, tmp_path, monkeypatch, b_value):
    # `plug_a` imports `plug_b` (which registers its preset) and then fails: the rollback took `plug_b`'s preset,
    # and `plug_b`'s own entry point, finding it imported, registered nothing again
    (tmp_path / "plug_b.py").write_text(
        "from lightning_speedups.presets import declarative, register\n"
        "register(declarative('b-recipe', 's', 'd', [('LabelSmoothing', {})]))\n"
    )
    (tmp_path / "plug_a.py").write_text(
        "import plug_b\n"
        "from lightning_speedups.presets import declarative, register\n"
        "register(declarative('a-recipe', 's', 'd', [('MixUp', {})]))\n"
        "import no_such_dependency\n"
    )
    _install_plugin(tmp_path, monkeypatch, "two_plugins", f"a = plug_a\nb = {b_value}\n")
    with pytest.warns(UserWarning, match="Could not load preset entry point 'a'") as record:
        known = presets.names()
    assert "b-recipe" in known and "a-recipe" not in known and len(record) == 1
    assert type(presets.get("b-recipe").callbacks[0]).__name__ == "LabelSmoothing"
    sys.modules.pop("plug_b", None)


#: a plug-in's helper module that registers presets for it (the caller on the stack is then not the plug-in)
HELPER_MODULE = (
    "from lightning_speedups.presets import declarative, register\n"
    "def add(name):\n    register(declarative(name, 's', 'd', [('MixUp', {})]))\n"
)


def test_a_failed_plugin_keeps_another_plugins_presets_registered_through_its_helper(registry, tmp_path, monkeypatch):
    (tmp_path / "b_helper.py").write_text(HELPER_MODULE)
    (tmp_path / "plug_b2.py").write_text("import b_helper\nb_helper.add('b2-recipe')\n")
    (tmp_path / "plug_a2.py").write_text("import plug_b2\nimport no_such_dependency\n")
    _install_plugin(tmp_path, monkeypatch, "two_plugins2", "a = plug_a2\nb = plug_b2\n")
    with pytest.warns(UserWarning, match="Could not load preset entry point 'a'"):
        assert "b2-recipe" in presets.names()
    for module in ("plug_b2", "b_helper"):
        sys.modules.pop(module, None)


def test_a_failed_plugin_registering_through_a_helper_module_keeps_nothing(registry, tmp_path, monkeypatch):
    (tmp_path / "helper_reg.py").write_text(HELPER_MODULE)
    (tmp_path / "bad_plugin.py").write_text(
        "import helper_reg\nhelper_reg.add('half-registered')\nraise ImportError('x')\n"
    )
    _install_plugin(tmp_path, monkeypatch, "helper_plugin", "bad = bad_plugin\n")
    with pytest.warns(UserWarning, match="Could not load preset entry point 'bad'"):
        assert "half-registered" not in presets.names()
    sys.modules.pop("helper_reg", None)


def test_a_plugin_that_looks_presets_up_as_it_is_imported_loads_once_without_a_false_warning(
    registry, tmp_path, monkeypatch
):
    (tmp_path / "derived_presets.py").write_text(
        textwrap.dedent(
            """
            from lightning_speedups import presets
            base = presets.lookup("vision-mild")  # loads the entry points again, from inside the first load
            MILD_PLUS = presets.declarative("mild-plus", "s", "d", [*base.callbacks, ("MixUp", {})])
            """
        )
    )
    _install_plugin(tmp_path, monkeypatch, "derived_presets", "mild-plus = derived_presets:MILD_PLUS\n")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the false "partially initialized module" warning, as an error here
        assert "mild-plus" in presets.names()
    assert [type(c).__name__ for c in presets.get("mild-plus", accelerator="cpu").callbacks][-1] == "MixUp"
    sys.modules.pop("derived_presets", None)


def test_a_function_preset_may_yield_its_callbacks_or_return_one_and_nothing_else(registry):
    from lightning.pytorch.callbacks import BatchSizeFinder

    @register_preset("yielding-recipe")
    def yielding_recipe():
        yield BatchSizeFinder()
        yield LabelSmoothing(0.2)

    names = [type(c).__name__ for c in presets.get("yielding-recipe", accelerator="cpu").callbacks]
    assert names == ["BatchSizeFinder", "LabelSmoothing"]  # the finder check used to consume the generator

    @register_preset("single-recipe")
    def single_recipe():
        return MixUp()

    assert [type(c) for c in presets.get("single-recipe").callbacks] == [MixUp]

    @register_preset("bad-recipe")
    def bad_recipe():
        return [MixUp(), "LabelSmoothing"]

    with pytest.raises(TypeError, match=r"Preset 'bad-recipe' gave 'LabelSmoothing' among its callbacks"):
        presets.get("bad-recipe")

    @register_preset("int-recipe")
    def int_recipe():
        return 3

    with pytest.raises(TypeError, match="Preset 'int-recipe' gave a int; its function must return a list"):
        presets.get("int-recipe")

    @register_preset("forgot-return")
    def forgot_return():
        MixUp()  # built, not returned: an empty recipe would train without a word

    with pytest.raises(TypeError, match="Preset 'forgot-return' gave a NoneType; its function must return a list"):
        presets.get("forgot-return")


def test_several_devices_in_an_interactive_session_get_ddp_fork_as_lightning_chooses(monkeypatch):
    monkeypatch.setattr(sys, "ps1", ">>> ", raising=False)  # a notebook, `python -i`: Lightning refuses "ddp"
    assert presets.recommended_strategy(2) == "ddp_fork"
    trainer = presets.get("vision-mild", accelerator="cpu", devices=2).trainer(logger=False)
    assert type(trainer.strategy).__name__ == "DDPStrategy" and trainer.strategy._start_method == "fork"
    monkeypatch.delattr(sys, "ps1")
    assert presets.recommended_strategy(2) == "ddp"


def test_recipe_trainer_keeps_precision_and_strategy_set_on_the_recipe_for_other_devices():
    recipe = presets.get("vision-mild", accelerator="cpu")
    recipe.trainer_kwargs["precision"] = "bf16-mixed"
    recipe.trainer_kwargs["strategy"] = "ddp_find_unused_parameters_true"
    trainer = recipe.trainer(devices=2, logger=False)
    assert trainer.precision == "bf16-mixed" and trainer.strategy._ddp_kwargs == {"find_unused_parameters": True}
    # untouched, they are recommended again for the devices asked for
    trainer = presets.get("vision-mild", accelerator="cpu").trainer(devices=2, logger=False)
    assert trainer.precision == "32-true" and type(trainer.strategy).__name__ == "DDPStrategy"
    assert trainer.strategy._ddp_kwargs == {}


def test_a_batch_size_finder_recipe_refuses_several_nodes_up_front():
    with pytest.raises(ValueError, match=r"runs on one device only .*num_nodes=2"):
        presets.get("large-batch", accelerator="cpu").trainer(num_nodes=2, logger=False)


def test_a_presets_trainer_settings_must_be_trainer_arguments(registry):
    with pytest.raises(TypeError, match=r"Preset 'typo-trainer': `trainer` has 'max_epoch'.*Did you mean 'max_epochs'"):
        presets.register(declarative("typo-trainer", "s", "d", [("MixUp", {})], trainer={"max_epoch": 3}))
    assert "typo-trainer" not in presets._REGISTRY
    # the user's hardware and the preset's callbacks: the preset's value overrode `get(accelerator=..., devices=...)`
    # while precision and strategy followed the user's (1 GPU with `ddp` and a CPU precision)
    for key, value in [("accelerator", "gpu"), ("devices", 1), ("callbacks", [])]:
        with pytest.raises(TypeError, match=rf"Preset 'fixed': `trainer` has '{key}'; "):
            presets.register(declarative("fixed", "s", "d", [("MixUp", {})], trainer={key: value}))


def test_presets_is_reachable_as_an_attribute_of_the_package():
    import subprocess

    code = "import lightning_speedups as ls; print(ls.presets.names()[0]); ls.no_such_name"
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert run.stdout.strip() == "baseline"
    assert "module 'lightning_speedups' has no attribute 'no_such_name'" in run.stderr
