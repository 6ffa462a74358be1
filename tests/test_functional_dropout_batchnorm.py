"""Finding and switching off every dropout; re-estimating, restoring and pooling BatchNorm statistics."""

import numpy as np
import pytest
import torch
from torch import Tensor, nn
from torchvision.ops import DropBlock2d, DropBlock3d, StochasticDepth

from lightning_speedups.functional import (
    batchnorm_layers,
    disable_dropout,
    find_dropout,
    pool_batchnorm_statistics,
    recalibrate_batchnorm,
    restore_dropout,
    snapshot_batchnorm,
    unhandled_dropout,
)


class DropPath(nn.Module):
    """timm's DropPath, as far as its interface goes (timm is not installed)."""

    def __init__(self, drop_prob: float = 0.0) -> None:
        super().__init__()
        self.drop_prob = drop_prob

    def forward(self, x: Tensor) -> Tensor:
        if self.drop_prob == 0.0 or not self.training:
            return x
        keep = (torch.rand(x.shape[0], *([1] * (x.ndim - 1))) >= self.drop_prob).to(x)
        return x * keep / (1 - self.drop_prob)


class SharedDropout(nn.Module):
    """A user's own dropout module (the same mask over a sequence), keeping its rate as ``p``."""

    def __init__(self, p: float) -> None:
        super().__init__()
        self.p = p

    def forward(self, x: Tensor) -> Tensor:  # (N, L, C): one mask per sample, shared along L
        return nn.functional.dropout(x.new_ones(x.shape[0], 1, x.shape[2]), self.p, self.training) * x


class EveryDropout(nn.Module):
    """One of each kind of dropout the issue lists, in a model that runs."""

    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(6, 16)
        self.drop = nn.Dropout(0.3)
        self.alpha = nn.AlphaDropout(0.2)
        self.feature_alpha = nn.FeatureAlphaDropout(0.2)
        self.d1 = nn.Dropout1d(0.2)
        self.d2 = nn.Dropout2d(0.2)
        self.d3 = nn.Dropout3d(0.2)
        self.mha = nn.MultiheadAttention(16, 2, dropout=0.25, batch_first=True)
        self.encoder = nn.TransformerEncoderLayer(16, 2, 32, dropout=0.1, batch_first=True)
        self.decoder = nn.TransformerDecoderLayer(16, 2, 32, dropout=0.1, batch_first=True)
        self.lstm = nn.LSTM(16, 16, num_layers=2, dropout=0.2, batch_first=True)
        self.depth = StochasticDepth(0.3, mode="row")
        self.path = DropPath(0.3)
        self.block2d = DropBlock2d(0.3, block_size=1)
        self.block3d = DropBlock3d(0.3, block_size=1)
        self.drop_rate = 0.4  # timm models' head dropout: F.dropout(x, self.drop_rate) in forward
        self.shared = SharedDropout(0.3)
        self.off = nn.Dropout(0.0)  # already off: not counted as removed

    def forward(self, x: Tensor) -> Tensor:  # x: (N, L, 6)
        h = self.feature_alpha(self.alpha(self.drop(self.inp(x))))  # (N, L, 16)
        h = self.d1(h)  # channels = L
        h = self.d2(h.unsqueeze(-1)).squeeze(-1)
        h = self.d3(h.unsqueeze(-1).unsqueeze(-1)).squeeze(-1).squeeze(-1)
        h = h + self.mha(h, h, h, need_weights=False)[0]
        h = self.encoder(h)
        h = self.decoder(h, h)
        h = self.lstm(h)[0]
        h = self.block2d(h.unsqueeze(1)).squeeze(1)
        h = self.block3d(h.unsqueeze(1).unsqueeze(1)).squeeze(1).squeeze(1)
        h = nn.functional.dropout(self.shared(h), self.drop_rate, self.training)
        return self.off(self.path(h) + self.depth(h))


def test_every_kind_is_found_and_switched_off():
    model = EveryDropout()
    sites = find_dropout(model)
    found = {(s.name, s.attribute) for s in sites}
    for expected in [
        ("drop", "p"),
        ("alpha", "p"),
        ("feature_alpha", "p"),
        ("d1", "p"),
        ("d2", "p"),
        ("d3", "p"),
        ("mha", "dropout"),
        ("encoder.self_attn", "dropout"),
        ("encoder.dropout", "p"),
        ("encoder.dropout1", "p"),
        ("encoder.dropout2", "p"),
        ("decoder.self_attn", "dropout"),
        ("decoder.multihead_attn", "dropout"),
        ("decoder.dropout3", "p"),
        ("lstm", "dropout"),
        ("depth", "p"),
        ("path", "drop_prob"),
        ("block2d", "p"),
        ("block3d", "p"),
        ("", "drop_rate"),
        ("shared", "p"),
        ("off", "p"),
    ]:
        assert expected in found, expected
    removed = disable_dropout(model)
    assert len(removed) == len(sites) - 1  # all but the one already at 0
    assert all(s.value > 0 for s in removed) and ("off", "p") not in {(s.name, s.attribute) for s in removed}
    assert all(s.value == 0 for s in find_dropout(model))
    restore_dropout(model, removed)
    assert {(s.name, s.attribute, s.value) for s in find_dropout(model)} == {
        (s.name, s.attribute, s.value) for s in sites
    }


def test_train_mode_outputs_become_deterministic():
    torch.manual_seed(0)
    model = EveryDropout().train()
    x = torch.randn(4, 5, 6)

    def twice() -> tuple[Tensor, Tensor]:
        torch.manual_seed(1)
        a = model(x)
        torch.manual_seed(2)
        return a, model(x)

    a, b = twice()
    assert not torch.allclose(a, b)  # dropout draws differ: the check below can fail
    disable_dropout(model)
    a, b = twice()
    torch.testing.assert_close(a, b, rtol=0, atol=0)
    model.eval()
    torch.testing.assert_close(model(x), a, rtol=1e-5, atol=1e-6)  # and equal to eval mode (no BatchNorm here)


def test_a_timm_model_with_head_dropout_drop_path_and_drop_block():
    timm = pytest.importorskip("timm")
    torch.manual_seed(0)
    model = timm.create_model(
        "resnet10t", pretrained=False, num_classes=4, drop_rate=0.3, drop_path_rate=0.2, drop_block_rate=0.2
    ).train()
    kinds = {(s.kind, s.attribute) for s in find_dropout(model)}
    assert ("ResNet", "drop_rate") in kinds and ("DropPath", "drop_prob") in kinds
    assert any(kind == "DropBlock2d" for kind, _ in kinds)
    x = torch.randn(2, 3, 32, 32)
    torch.manual_seed(1)
    a = model(x)
    torch.manual_seed(2)
    assert not torch.allclose(a, model(x))  # the random draws show in train mode
    removed = disable_dropout(model)
    assert model.drop_rate == 0.0 and all(s.value == 0 for s in find_dropout(model))
    torch.manual_seed(1)
    a = model(x)
    torch.manual_seed(2)
    torch.testing.assert_close(model(x), a, rtol=0, atol=0)  # train mode, yet no draw changes the output
    restore_dropout(model, removed)
    assert model.drop_rate == 0.3


def test_a_compiled_submodule_is_one_site_not_two():
    # `torch.compile`'s wrapper reads its attributes from the module it wraps: both were counted
    net = nn.Sequential(nn.Linear(4, 4), torch.compile(nn.MultiheadAttention(4, 1, dropout=0.5), backend="eager"))
    assert [(s.name, s.attribute) for s in find_dropout(net)] == [("1._orig_mod", "dropout")]
    assert [s.value for s in disable_dropout(net)] == [0.5] and net[1]._orig_mod.dropout == 0.0


def test_a_model_without_dropout_has_no_sites():
    assert find_dropout(nn.Sequential(nn.Linear(2, 2), nn.ReLU())) == []
    assert disable_dropout(nn.Linear(2, 2)) == []


def test_an_augmentation_named_like_a_dropout_keeps_its_chance_of_applying():
    class RandomChannelDropout(nn.Module):  # kornia's augmentations keep `p` (chance of applying) and `p_batch`
        def __init__(self) -> None:
            super().__init__()
            self.p, self.p_batch = 0.5, 1.0

    model = nn.Sequential(RandomChannelDropout(), SharedDropout(0.3))
    assert [(s.name, s.attribute) for s in disable_dropout(model)] == [("1", "p")]
    assert model[0].p == 0.5 and model[1].p == 0.0


# ---------------------------------------------------------------------------------------------- BatchNorm
def bn_net() -> nn.Module:
    return nn.Sequential(nn.Conv2d(1, 3, 3, padding=1), nn.BatchNorm2d(3), nn.Dropout(0.5), nn.BatchNorm2d(3))


def test_recalibration_is_the_average_of_batch_statistics():
    torch.manual_seed(0)
    net = bn_net()
    net.train()
    net[1].momentum = 0.3
    batches = [torch.randn(8, 1, 6, 6) * (i + 1) + i for i in range(3)]
    before = snapshot_batchnorm(net)
    assert recalibrate_batchnorm(net, batches) == 3
    # by hand: the conv output's per-channel batch means and unbiased variances, averaged over batches
    with torch.no_grad():
        feats = [net[0](b) for b in batches]
    means = torch.stack([f.mean((0, 2, 3)) for f in feats]).mean(0)
    variances = torch.stack([f.var((0, 2, 3), unbiased=True) for f in feats]).mean(0)
    torch.testing.assert_close(net[1].running_mean, means, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(net[1].running_var, variances, rtol=1e-4, atol=1e-5)
    assert int(net[1].num_batches_tracked) == 3
    # every module back in its mode; momentum back
    assert all(m.training for m in net.modules()) and net[1].momentum == 0.3
    # dropout stayed in eval mode during calibration: the second BatchNorm saw un-dropped activations
    with torch.no_grad():
        normed = [
            (f - f.mean((0, 2, 3), keepdim=True)) / (f.var((0, 2, 3), keepdim=True, unbiased=False) + 1e-5).sqrt()
            for f in feats
        ]
    assert torch.allclose(net[3].running_var, torch.stack([n.var((0, 2, 3)) for n in normed]).mean(0), atol=1e-3)
    before.restore()
    assert torch.equal(net[1].running_mean, torch.zeros(3)) and int(net[1].num_batches_tracked) == 0


def test_recalibration_restores_eval_mode_and_ignores_empty_input():
    net = bn_net().eval()
    assert recalibrate_batchnorm(net, []) == 0 and torch.equal(net[1].running_var, torch.ones(3))
    recalibrate_batchnorm(net, [torch.randn(4, 1, 5, 5) + 5], forward=lambda m, x: m(x * 2))
    assert not any(m.training for m in net.modules())
    assert net[1].running_mean.abs().sum() > 0
    assert recalibrate_batchnorm(nn.Linear(2, 2), [torch.randn(1, 2)]) == 0  # no BatchNorm: nothing to do
    assert batchnorm_layers(nn.Sequential(nn.BatchNorm1d(2, track_running_stats=False))) == []


def test_recalibration_of_chosen_layers_and_of_layers_the_forward_skips():
    torch.manual_seed(0)
    net = bn_net()
    for bn in (net[1], net[3]):
        bn.running_mean.fill_(0.7)
    skip_last = lambda m, x: m[:3](x)  # noqa: E731  never runs net[3]
    unreached: list = []
    assert recalibrate_batchnorm(net, [torch.randn(8, 1, 6, 6) + 2], skip_last, unreached=unreached) == 1
    assert unreached == [net[3]] and torch.equal(net[3].running_mean, torch.full((3,), 0.7))
    assert not torch.allclose(net[1].running_mean, torch.full((3,), 0.7))
    # only the chosen layers are re-estimated; the others stay in eval mode and keep their statistics
    net[1].running_mean.fill_(0.7)
    recalibrate_batchnorm(net, [torch.randn(8, 1, 6, 6) + 2], layers=[net[3]])
    assert torch.equal(net[1].running_mean, torch.full((3,), 0.7))
    assert not torch.allclose(net[3].running_mean, torch.full((3,), 0.7))


def test_pooling_gives_the_statistics_of_the_union():
    torch.manual_seed(0)
    a, b = torch.randn(50, 3) + 1, torch.randn(50, 3) * 3 - 1
    nets = [nn.BatchNorm1d(3), nn.BatchNorm1d(3)]
    for net, data in zip(nets, (a, b), strict=True):
        net.running_mean.copy_(data.mean(0))
        net.running_var.copy_(data.var(0, unbiased=False))
    # a 2-process mean as an all-reduce would compute it on process 0, process 1's tensors being known: its mean,
    # its variance, and its mean's squared distance to the pooled mean
    pooled_mean = (a.mean(0) + b.mean(0)).double() / 2
    mean_b, var_b = nets[1].running_mean.double(), nets[1].running_var.double()
    other = iter([mean_b, var_b, (mean_b - pooled_mean) ** 2])
    # in place, as Lightning's DDP `reduce` works: the variance lost the spread of the means (it read the pooled
    # mean back as this process's own)
    pool_batchnorm_statistics(nets[0], lambda t: t.copy_((t + next(other)) / 2))
    union = torch.cat([a, b])
    torch.testing.assert_close(nets[0].running_mean, pooled_mean.float())
    torch.testing.assert_close(nets[0].running_var, union.var(0, unbiased=False), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_pooling_keeps_the_variance_of_a_channel_whose_mean_dwarfs_its_spread(dtype):
    """E[x**2] - E[x]**2 in float32 cancelled it: mean 100 and variance 0.01 pooled to 0 (one process, so pooling
    must change nothing), and float64 statistics (`64-true`) came back rounded to float32."""
    bn = nn.BatchNorm1d(2).to(dtype)
    bn.running_mean.copy_(torch.tensor([100.0, 30.0], dtype=dtype) + 1e-9)
    bn.running_var.copy_(torch.tensor([0.01, 0.05], dtype=dtype))
    before = bn.running_mean.clone(), bn.running_var.clone()
    pool_batchnorm_statistics(bn, lambda t: t)
    assert torch.equal(bn.running_mean, before[0]) and torch.equal(bn.running_var, before[1])


@pytest.mark.parametrize("momentum", [None, 0.1])
def test_snapshot_restores_in_place(momentum):
    net = bn_net()
    net[1].momentum = momentum
    buffer = net[1].running_mean
    snap = snapshot_batchnorm(net)
    recalibrate_batchnorm(net, [torch.randn(4, 1, 5, 5) + 3])
    snap.restore()
    assert net[1].running_mean is buffer and torch.equal(buffer, torch.zeros(3)) and net[1].momentum == momentum


class ReadOnlyRate(nn.Module):
    """A dropout rate derived from elsewhere: a property with no setter, which must not be touched."""

    def __init__(self) -> None:
        super().__init__()
        self.drop = nn.Dropout(0.5)
        self.base = 0.2

    @property
    def attention_dropout(self) -> float:
        return self.base / 2


def test_a_read_only_rate_is_left_alone_and_a_failed_switch_changes_nothing():
    model = nn.Sequential(ReadOnlyRate(), nn.Dropout(0.3))
    assert [(s.name, s.attribute) for s in find_dropout(model)] == [("0.drop", "p"), ("1", "p")]
    assert len(disable_dropout(model)) == 2 and model[1].p == 0.0

    class Refuses(nn.Dropout):
        def __setattr__(self, name, value):
            if name == "p" and value == 0.0:
                raise ValueError("frozen")
            super().__setattr__(name, value)

    model = nn.Sequential(nn.Dropout(0.3), Refuses(0.4))
    with pytest.raises(RuntimeError, match=r"'1'\.p to 0.*as they were"):
        disable_dropout(model)
    assert model[0].p == 0.3 and model[1].p == 0.4  # all or nothing


def test_unknown_rate_names_are_listed_not_changed():
    class Custom(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.attn_dropout_prob, self.dropout_rate, self.drop_path = 0.1, 0.2, 0.0

    model = nn.Sequential(Custom(), nn.Dropout(0.5))
    model[0].lr_drop_factor, model[0].attn_drop = 0.5, torch.tensor(0.25)  # no rate (it was listed); a tensor rate
    model[0].drop_connect_rate = 0.2
    # dropout_rate is known; zeros are no dropout
    assert unhandled_dropout(model) == ["0.attn_dropout_prob=0.1", "0.attn_drop=0.25", "0.drop_connect_rate=0.2"]
    assert {s.attribute for s in disable_dropout(model)} == {"dropout_rate", "p"}
    assert model[0].attn_dropout_prob == 0.1


def test_rates_held_as_numpy_floats_or_0d_tensors_are_switched_off_and_given_back():
    # timm-style rates from torch.linspace without .item(), a NumPy float32 from a config: they stayed on, unlisted
    layer = nn.TransformerEncoderLayer(8, 2, 16, dropout=np.float32(0.3), batch_first=True)
    model = nn.Sequential(DropPath(torch.linspace(0, 0.2, 3)[1]), DropPath(np.float32(0.1)), layer).train()
    found = {(s.name, s.attribute) for s in find_dropout(model)}
    assert {("0", "drop_prob"), ("1", "drop_prob"), ("2.self_attn", "dropout")} <= found
    assert unhandled_dropout(model) == []
    x = torch.randn(4, 5, 8)
    sites = disable_dropout(model)
    torch.manual_seed(1)
    a = model(x)
    torch.manual_seed(2)
    torch.testing.assert_close(model(x), a, rtol=0, atol=0)  # every draw gone, the attention dropout's too
    restore_dropout(model, sites)
    assert isinstance(model[1].drop_prob, np.float32) and model[1].drop_prob == np.float32(0.1)
    assert float(model[0].drop_prob) == pytest.approx(0.1) and float(model[2].self_attn.dropout) == pytest.approx(0.3)


def test_a_learnt_rate_is_not_a_dropout_to_switch_off():
    path = DropPath(0.1)
    path.drop_prob = nn.Parameter(torch.tensor(0.1))  # the model trains it: not ours to zero (setting it raised)
    model = nn.Sequential(path, nn.Dropout(0.2))
    assert [(s.name, s.attribute) for s in disable_dropout(model)] == [("1", "p")]
    assert isinstance(model[0].drop_prob, nn.Parameter)


def test_a_copy_of_a_model_taken_while_its_buffer_rate_is_off_saves_what_it_holds():
    import copy

    net = nn.Sequential(nn.Linear(4, 4), BufferRateDropout(0.3))
    sites = disable_dropout(net)
    twin = copy.deepcopy(net)  # the saving hook is copied along, but the copy was never switched off by us
    restore_dropout(net, sites)
    twin[1].p = torch.tensor(0.5)
    assert float(twin.state_dict()["1.p"]) == 0.5 and float(net.state_dict()["1.p"]) == pytest.approx(0.3)


def test_layers_without_running_statistics_are_skipped():
    net = nn.Sequential(nn.BatchNorm1d(4, track_running_stats=False), nn.BatchNorm1d(4))
    net[1].running_mean.fill_(1.0)
    snap = snapshot_batchnorm(net, [net[0], net[1]])
    assert snap.layers == [net[1]]
    net[1].running_mean.zero_()
    snap.restore()
    assert torch.equal(net[1].running_mean, torch.ones(4))
    pool_batchnorm_statistics(net, lambda t: t, [net[0], net[1]])  # the identity: one process
    assert torch.equal(net[1].running_mean, torch.ones(4)) and net[0].running_mean is None


def test_a_lazy_layer_before_its_first_batch_is_skipped():
    net = nn.Sequential(nn.LazyBatchNorm1d(), nn.BatchNorm1d(4))
    assert batchnorm_layers(net) == [net[1]]  # no statistics yet to copy or re-estimate
    recalibrate_batchnorm(net, [torch.randn(8, 4)])  # the forward initialises it: no crash
    assert batchnorm_layers(net) == [net[0], net[1]]


class BufferRateDropout(nn.Dropout):
    """A dropout whose rate is a registered 0-d buffer (saved in checkpoints, moved with the model)."""

    def __init__(self, p: float) -> None:
        super().__init__()
        del self.p
        self.register_buffer("p", torch.tensor(p))


@pytest.mark.parametrize("make", [lambda: BufferRateDropout(0.3), lambda: nn.Dropout(p=torch.tensor(0.3))])
def test_a_tensor_rate_is_switched_off_and_given_back_as_the_same_tensor(make):
    net = nn.Sequential(nn.Linear(4, 4), make())
    rate = net[1].p
    sites = disable_dropout(net)  # a buffer takes no float: a zero tensor instead
    assert [(s.name, s.value) for s in sites] == [("1", pytest.approx(0.3))]
    assert isinstance(net[1].p, torch.Tensor) and float(net[1].p) == 0.0 and float(rate) == pytest.approx(0.3)
    restore_dropout(net, sites)
    assert net[1].p is rate  # the object it came with, not a float
    by_hand = [type(s)(s.name, s.kind, s.attribute, s.value) for s in disable_dropout(net)]  # as from a checkpoint
    restore_dropout(net, by_hand)
    assert isinstance(net[1].p, torch.Tensor) and float(net[1].p) == pytest.approx(0.3)
    sites = disable_dropout(net)
    if isinstance(net[1], BufferRateDropout):  # saved with its own rate while off, as the model was built
        assert float(net.state_dict()["1.p"]) == pytest.approx(0.3) and float(net[1].p) == 0.0
    net.double()  # moved or cast while switched off (Lightning moves the model to the CPU before teardown)
    restore_dropout(net, sites)
    if isinstance(net[1], BufferRateDropout):  # a buffer follows the model: given back as the model holds it now
        assert net[1].p.dtype == torch.float64 and float(net[1].p) == pytest.approx(0.3)
        assert not net[1]._state_dict_hooks  # the saving hook goes with the switch


def test_recalibration_skips_empty_batches_and_undoes_a_failed_forward():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(1, 4, 3), nn.BatchNorm2d(4))
    b = torch.randn(8, 1, 16, 16) + 3.0
    assert recalibrate_batchnorm(net, [b]) == 1
    mean = net[1].running_mean.clone()
    assert recalibrate_batchnorm(net, [torch.randn(0, 1, 16, 16), b]) == 1  # the empty batch counts for nothing
    torch.testing.assert_close(net[1].running_mean, mean)
    assert recalibrate_batchnorm(net, [torch.randn(0, 1, 16, 16)]) == 0  # nothing to average: unchanged
    torch.testing.assert_close(net[1].running_mean, mean)
    # inside a batch of the forward's own form too (it weighed the real batch 1/2 against mean 0, variance 1)
    var = net[1].running_var.clone()
    pairs = [(torch.randn(0, 1, 16, 16), 0), (b, 0)]
    assert recalibrate_batchnorm(net, pairs, lambda m, batch: m(batch[0])) == 1
    torch.testing.assert_close(net[1].running_mean, mean)
    torch.testing.assert_close(net[1].running_var, var)
    assert recalibrate_batchnorm(net, pairs[:1], lambda m, batch: m(batch[0])) == 0
    torch.testing.assert_close(net[1].running_mean, mean)
    assert not net[1]._forward_hooks  # its counting hooks go afterwards

    def failing(model, batch):
        if batch.shape[0] == 3:
            raise RuntimeError("the model's own error")
        return model(batch)

    with pytest.raises(RuntimeError, match="own error"):
        recalibrate_batchnorm(net, [b + 5.0, torch.randn(3, 1, 16, 16)], failing)  # the first batch ran
    torch.testing.assert_close(net[1].running_mean, mean)  # as before the call, not half-updated or reset
    assert net[1].momentum == 0.1 and net.training
