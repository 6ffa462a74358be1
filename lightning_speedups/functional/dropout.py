"""Find every dropout of a model, switch it off, switch it back on.

What counts as dropout (each is switched off by setting its probability to 0, which every one of them
treats as "return the input unchanged"; no module is replaced, so the model's structure, its ``state_dict``
and any reference to its modules stay as they were):

* ``nn.Dropout``, ``nn.Dropout1d/2d/3d``, ``nn.AlphaDropout``, ``nn.FeatureAlphaDropout``: attribute ``p``;
* ``torchvision.ops.StochasticDepth``, ``DropBlock2d`` and ``DropBlock3d``: attribute ``p``;
* timm-style ``DropPath`` and ``DropBlock2d`` (a module with a float or 0-d tensor ``drop_prob``): ``drop_prob``;
* timm's ``PatchDropout`` and your own dropout modules (a module whose class name contains ``Drop``, with a float
  ``prob`` or ``p``): ``prob``, ``p``;
* the attention dropout of ``nn.MultiheadAttention`` (hence of ``nn.Transformer*Layer``, whose other dropouts
  are ``nn.Dropout`` modules), the inter-layer dropout of ``nn.RNN/LSTM/GRU``, and any module with a float
  attribute named in :data:`FLOAT_ATTRIBUTES`: ``dropout``, ``attention_dropout``, ``dropout_p`` (attention
  code), ``drop_rate`` (timm models' head dropout, applied with ``F.dropout(x, self.drop_rate)``),
  ``dropout_rate``, ``dropout_prob``, ``activation_dropout``, ``hidden_dropout`` and ``layerdrop`` (Hugging
  Face-style layers), when the module holds it as a plain, settable attribute.

Dropout applied with a literal probability inside a ``forward`` (``F.dropout(x, 0.1)``) is invisible from
outside the code and is not found; a probability under another name, or read from a config object, is not
changed either, but :func:`unhandled_dropout` lists the float attributes that look like one, so a caller can
warn.
"""

from __future__ import annotations

import functools
import inspect
import re
import sys
import weakref
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn
from torch.nn.modules.dropout import _DropoutNd
from torch.utils.hooks import RemovableHandle

#: float attributes that hold a dropout probability in attention and recurrent modules.
FLOAT_ATTRIBUTES = (
    "dropout",
    "attention_dropout",
    "dropout_p",
    "drop_rate",
    "dropout_rate",
    "dropout_prob",
    "activation_dropout",
    "hidden_dropout",
    "layerdrop",
)


#: attribute names (lower case) of drop rates: ``dropout`` anywhere, ``drop_path``, ``drop_rate``, ``drop_prob``,
#: ``drop_ratio``, ``drop_connect``, ``drop_block``, ``drop_..._rate``/``_prob``/``_p``, a trailing ``drop`` (timm's
#: ``attn_drop``), a ``p_drop``; not ``lr_drop_factor`` or ``drop_last``
DROP_RATE_NAME = re.compile(
    r"dropout|drop_?(path|rate|prob|ratio|connect|block)|drop_(\w*_)?(rate|prob|p)$|(^|_)p_drop|drop$"
)


@dataclass(frozen=True)
class DropoutSite:
    """One dropout of a model: the module's qualified ``name``, its class, the attribute, its value.

    ``module`` is the module object itself when the site was found in a model: :func:`restore_dropout` gives
    the value back to that object, wherever it is now (a block swapped out of the model, or another module
    now under the same name, is not confused with it).
    """

    name: str
    kind: str
    attribute: str
    value: float
    module: nn.Module | None = field(default=None, compare=False, repr=False)
    #: the attribute's own object when it is a tensor (a 0-d ``p`` buffer): what restoring puts back
    original: Tensor | None = field(default=None, compare=False, repr=False)


def _rate(value: object) -> float | None:
    """``value`` as a float if it can be a drop rate held as a float: a Python or NumPy float, or a 0-d floating
    tensor (``torch.linspace(0, rate, depth)[i]``, a buffer); ``None`` otherwise (ints and bools are flags)."""
    if isinstance(value, float | np.floating):
        return float(value)
    if isinstance(value, Tensor) and value.ndim == 0 and value.is_floating_point() and not value.requires_grad:
        return float(value)  # a learnt rate (a Parameter) is the model's to train, not ours to zero
    return None


def _is_probability(value: object) -> bool:
    rate = _rate(value)
    return rate is not None and 0.0 <= rate <= 1.0


def _p_types() -> tuple[type, ...]:
    """Module classes whose attribute ``p`` is a drop probability."""
    try:
        from torchvision.ops import DropBlock2d, DropBlock3d, StochasticDepth
    except ImportError:  # pragma: no cover - torchvision is a dependency, but keep this usable without it
        return (_DropoutNd,)
    return (_DropoutNd, StochasticDepth, DropBlock2d, DropBlock3d)


def _settable(module: nn.Module, name: str) -> bool:
    """Whether ``module.name = 0.0`` sets a plain value (not a read-only property computed from elsewhere)."""
    static = inspect.getattr_static(type(module), name, None)
    return not (isinstance(static, property) and static.fset is None)


def _is_augmentation(module: nn.Module) -> bool:
    """A data augmentation module (kornia's ``RandomChannelDropout``), whose ``p`` is the chance of applying it."""
    return type(module).__module__.startswith("kornia.") or hasattr(module, "p_batch")


def _is_compile_wrapper(module: nn.Module) -> bool:
    eval_frame = sys.modules.get("torch._dynamo.eval_frame")  # not imported: nothing was compiled
    wrapper = getattr(eval_frame, "OptimizedModule", None)
    return wrapper is not None and isinstance(module, wrapper)


def _attribute(module: nn.Module, p_types: tuple[type, ...]) -> list[str]:
    if isinstance(module, p_types):
        return ["p"]
    if _is_compile_wrapper(module):
        return []  # `torch.compile`'s wrapper reads its attributes from `_orig_mod`, a child found on its own
    found = []
    if _rate(getattr(module, "drop_prob", None)) is not None and _settable(module, "drop_prob"):
        found.append("drop_prob")
    if "drop" in type(module).__name__.lower() and not _is_augmentation(module):
        # timm's PatchDropout (a ViT's patch_drop_rate) keeps `prob`; a user's own `SharedDropout` often `p`, for
        # `F.dropout(x, self.p, self.training)`
        found.extend(n for n in ("p", "prob") if _is_probability(getattr(module, n, None)) and _settable(module, n))
    for name in FLOAT_ATTRIBUTES:
        if _is_probability(getattr(module, name, None)) and _settable(module, name):
            found.append(name)
    return found


def find_dropout(model: nn.Module) -> list[DropoutSite]:
    """Every dropout of ``model`` (see the module docstring), with its current probability, zeros included.

    Example::

        >>> layer = nn.TransformerEncoderLayer(d_model=8, nhead=2, dim_feedforward=16, dropout=0.1)
        >>> [(s.name, s.attribute) for s in find_dropout(layer)]
        [('self_attn', 'dropout'), ('dropout', 'p'), ('dropout1', 'p'), ('dropout2', 'p')]
    """
    p_types = _p_types()
    sites = []
    for name, module in model.named_modules():
        for attribute in _attribute(module, p_types):
            current = getattr(module, attribute)
            original = current if isinstance(current, Tensor) else None
            sites.append(DropoutSite(name, type(module).__name__, attribute, float(current), module, original))
    return sites


def disable_dropout(model: nn.Module) -> list[DropoutSite]:
    """Set every non-zero dropout probability of ``model`` to 0; return the sites changed (old values).

    In training mode the model then computes what it computes in eval mode as far as dropout goes: its
    outputs no longer depend on random draws (BatchNorm still uses batch statistics). Undo with
    :func:`restore_dropout`.

    Example::

        >>> net = nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.5), nn.LSTM(4, 4, num_layers=2, dropout=0.2))
        >>> [(s.name, s.value) for s in disable_dropout(net)]
        [('1', 0.5), ('2', 0.2)]
        >>> net[1].p, net[2].dropout
        (0.0, 0.0)
    """
    changed = [site for site in find_dropout(model) if site.value > 0]
    done: list[DropoutSite] = []
    try:
        for site in changed:
            module = _site_module(model, site)
            assert module is not None  # found in `model` just above
            # a tensor rate (a registered buffer takes tensors only) gets a new zero tensor, never changed in place
            setattr(module, site.attribute, _value_like(getattr(module, site.attribute, None), 0.0))
            if site.attribute in module._buffers:  # saved in checkpoints: with its own rate, not the 0
                _stop_saving_rate(module, site.attribute)
                hook = module.register_state_dict_post_hook(functools.partial(_saved_rate, site.attribute, site.value))
                _SAVED_RATE_HOOKS.setdefault(module, {})[site.attribute] = hook
            done.append(site)
    except Exception as err:  # all or nothing: never leave a model partly stripped
        restore_dropout(model, done)
        raise RuntimeError(
            f"Could not set {site.kind} {site.name or '(the model)'!r}.{site.attribute} to 0: {err}. The model's "
            "dropouts are as they were."
        ) from err
    return changed


#: per module, per buffer switched off: the hook that saves the buffer's own rate (removed when it is given back)
_SAVED_RATE_HOOKS: weakref.WeakKeyDictionary[nn.Module, dict[str, RemovableHandle]] = weakref.WeakKeyDictionary()


def _stop_saving_rate(module: nn.Module, attribute: str) -> None:
    hook = _SAVED_RATE_HOOKS.get(module, {}).pop(attribute, None)
    if hook is not None:
        hook.remove()


def _saved_rate(attribute: str, value: float, module: nn.Module, state: dict[str, Any], prefix: str, _: Any) -> None:
    """A ``state_dict`` post-hook: the switched-off buffer ``attribute`` is saved with its own rate, ``value``, so
    a checkpoint taken while dropout is off holds the model as it was built (a resume, a fine-tune from it)."""
    key = prefix + attribute
    if key in state and attribute in _SAVED_RATE_HOOKS.get(module, {}):  # not a stale copy's (a deepcopied model)
        state[key] = _value_like(state[key], value)


def unhandled_dropout(model: nn.Module) -> list[str]:
    """``"<module>.<attribute>=<value>"`` for each non-zero float attribute that looks like a dropout rate (named
    like one, :data:`DROP_RATE_NAME`: ``attn_dropout``, ``attn_drop``, ``drop_path_rate``, not ``lr_drop_factor``;
    or a ``p``/``prob``/``rate``-like name in a module whose class name contains ``drop``) and that
    :func:`find_dropout` does not cover: dropout that a ``forward`` may apply under a name we do not know."""
    p_types = _p_types()
    out = []
    for name, module in model.named_modules():
        handled = set(_attribute(module, p_types))
        dropout_class = "drop" in type(module).__name__.lower()
        for attribute, value in vars(module).items():
            rate = _rate(value)
            if (
                (DROP_RATE_NAME.search(attribute.lower()) or (dropout_class and _rate_name(attribute)))
                and attribute not in handled
                and rate is not None
                and 0.0 < rate <= 1.0
            ):
                out.append(f"{name or '(model)'}.{attribute}={rate:g}")
    return out


def _rate_name(attribute: str) -> bool:
    lowered = attribute.lower().lstrip("_")
    return lowered == "p" or "prob" in lowered or "rate" in lowered


def restore_dropout(model: nn.Module, sites: list[DropoutSite]) -> None:
    """Give each site back the probability it had when :func:`disable_dropout` returned it.

    A site found in a model goes back to its own module object, even one no longer in ``model``; a site built
    by hand (no ``module``) goes to the module under its ``name``, skipped if there is none of its class now.
    """
    for site in sites:
        module = _site_module(model, site)
        if module is not None:
            _stop_saving_rate(module, site.attribute)
            current = getattr(module, site.attribute, None)
            value = site.original
            if value is None or not _same_place(value, current):
                # a float, a site read back from a checkpoint, or a model moved (or cast) since: the value, held
                # as the attribute now holds it
                value = _value_like(current, site.value)
            setattr(module, site.attribute, value)


def rates_set_back(model: nn.Module, sites: list[DropoutSite]) -> list[DropoutSite]:
    """The sites :func:`disable_dropout` switched off whose rate is no longer 0 (a ``forward`` that sets
    ``self.drop.p = self.rate`` at each call): their dropout is on again."""
    back = []
    for site in sites:
        module = _site_module(model, site)
        rate = _rate(getattr(module, site.attribute, None)) if module is not None else None
        if rate is not None and rate > 0:
            back.append(site)
    return back


def _same_place(original: Tensor, current: object) -> bool:
    return not isinstance(current, Tensor) or (original.device == current.device and original.dtype == current.dtype)


def _value_like(current: object, value: float) -> object:
    """``value`` as the attribute holds its rate: a tensor like ``current`` if it is one, else the float."""
    if isinstance(current, Tensor):
        with torch.no_grad():
            return torch.full_like(current, value)
    if isinstance(current, np.floating):  # e.g. np.float32: kept as its own type
        return type(current)(value)
    return value


def _site_module(model: nn.Module, site: DropoutSite) -> nn.Module | None:
    if site.module is not None:
        return site.module
    try:
        module = model.get_submodule(site.name)
    except AttributeError:
        return None
    return module if type(module).__name__ == site.kind else None
