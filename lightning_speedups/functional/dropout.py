"""Find every dropout of a model, switch it off, switch it back on.

What counts as dropout (each is switched off by setting its probability to 0, which every one of them
treats as "return the input unchanged"; no module is replaced, so the model's structure, its ``state_dict``
and any reference to its modules stay as they were):

* ``nn.Dropout``, ``nn.Dropout1d/2d/3d``, ``nn.AlphaDropout``, ``nn.FeatureAlphaDropout``: attribute ``p``;
* ``torchvision.ops.StochasticDepth``, ``DropBlock2d`` and ``DropBlock3d``: attribute ``p``;
* timm-style ``DropPath`` and ``DropBlock2d`` (any module with a float ``drop_prob``): ``drop_prob``;
* the attention dropout of ``nn.MultiheadAttention`` (hence of ``nn.Transformer*Layer``, whose other dropouts
  are ``nn.Dropout`` modules), the inter-layer dropout of ``nn.RNN/LSTM/GRU``, and any module with a float
  attribute named in :data:`FLOAT_ATTRIBUTES`: ``dropout``, ``attention_dropout``, ``dropout_p`` (attention
  code), ``drop_rate`` (timm models' head dropout, applied with ``F.dropout(x, self.drop_rate)``),
  ``activation_dropout``, ``hidden_dropout`` and ``layerdrop`` (Hugging Face-style layers).

Dropout applied with a literal probability inside a ``forward`` (``F.dropout(x, 0.1)``) is invisible from
outside the code and is not found.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn
from torch.nn.modules.dropout import _DropoutNd

#: float attributes that hold a dropout probability in attention and recurrent modules.
FLOAT_ATTRIBUTES = (
    "dropout",
    "attention_dropout",
    "dropout_p",
    "drop_rate",
    "activation_dropout",
    "hidden_dropout",
    "layerdrop",
)


@dataclass(frozen=True)
class DropoutSite:
    """One dropout of a model: the module's qualified ``name``, its class, the attribute, its value."""

    name: str
    kind: str
    attribute: str
    value: float


def _is_probability(value: object) -> bool:
    return isinstance(value, float | int) and not isinstance(value, bool) and 0.0 <= float(value) <= 1.0


def _p_types() -> tuple[type, ...]:
    """Module classes whose attribute ``p`` is a drop probability."""
    try:
        from torchvision.ops import DropBlock2d, DropBlock3d, StochasticDepth
    except ImportError:  # pragma: no cover - torchvision is a dependency, but keep this usable without it
        return (_DropoutNd,)
    return (_DropoutNd, StochasticDepth, DropBlock2d, DropBlock3d)


def _attribute(module: nn.Module, p_types: tuple[type, ...]) -> list[str]:
    if isinstance(module, p_types):
        return ["p"]
    found = []
    if isinstance(getattr(module, "drop_prob", None), float):
        found.append("drop_prob")
    for name in FLOAT_ATTRIBUTES:
        value = getattr(module, name, None)
        if isinstance(value, float) and _is_probability(value):
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
            sites.append(DropoutSite(name, type(module).__name__, attribute, float(getattr(module, attribute))))
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
    for site in changed:
        setattr(model.get_submodule(site.name), site.attribute, 0.0)
    return changed


def restore_dropout(model: nn.Module, sites: list[DropoutSite]) -> None:
    """Give each site back the probability it had when :func:`disable_dropout` returned it."""
    for site in sites:
        setattr(model.get_submodule(site.name), site.attribute, site.value)
