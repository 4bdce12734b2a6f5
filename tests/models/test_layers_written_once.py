"""The layers added through the seam: each is one core file, and means what its namesake in
torch or the paper means. Computed by the float64 reference's ops through the core's forward
(``unitrain.models.apply``); each backend is held to the reference by the kit's layer family."""

from __future__ import annotations

import numpy as np
import pytest

from unitrain import ConfigError, DataError, ops
from unitrain.checkpoint import _resume
from unitrain.models import (
    Concatenate,
    Conv1d,
    Conv2d,
    ConvTranspose2d,
    GatedMLP,
    GroupNorm,
    Identity,
    Linear,
    MultiHeadAttention,
    Pass,
    Reshape,
    RMSNorm,
    Sequential,
    SinusoidalPositionalEmbedding,
    TransformerBlock,
    Upsample,
    apply,
    model_from_dict,
)
from unitrain.models._sequence import rotate

torch = pytest.importorskip("torch")
F = torch.nn.functional


def forward(layer, x, params=None, *, training=False, draw=None):
    """The layer's output from the numpy reference, in float64."""
    params = layer.init_params(0, np.float64) if params is None else params
    with ops.using("numpy"):
        out, _ = apply(
            layer, x, Pass(params, layer.init_state(np.float64), training=training, draw=draw)
        )
    return np.asarray(out)


def nchw(x):
    return torch.from_numpy(np.ascontiguousarray(np.moveaxis(x, -1, 1)))


def nhwc(t):
    return np.moveaxis(t.numpy(), 1, -1)


rng = np.random.default_rng(0)


def test_group_norm_is_torchs():
    layer = GroupNorm(3, 6)
    x = rng.standard_normal((2, 4, 5, 6)) * 3 + 1
    params = {"weight": rng.standard_normal(6), "bias": rng.standard_normal(6)}
    want = F.group_norm(
        nchw(x), 3, torch.from_numpy(params["weight"]), torch.from_numpy(params["bias"]), eps=1e-5
    )
    np.testing.assert_allclose(forward(layer, x, params), nhwc(want), rtol=0, atol=1e-12)


def test_rms_norm_is_torchs():
    x, weight = rng.standard_normal((2, 3, 8)), rng.standard_normal(8)
    want = F.rms_norm(torch.from_numpy(x), (8,), torch.from_numpy(weight), eps=1e-6)
    got = forward(RMSNorm(8), x, {"weight": weight})
    np.testing.assert_allclose(got, want.numpy(), rtol=0, atol=1e-12)


def test_conv_transpose_is_torchs_in_the_canonical_layout():
    layer = ConvTranspose2d(3, 2, 3, stride=2, padding=1, output_padding=1)
    x = rng.standard_normal((2, 4, 5, 3))
    params = layer.init_params(1, np.float64)
    kernel = torch.from_numpy(params["weight"]).permute(3, 2, 0, 1)  # -> (in, out, kh, kw)
    want = F.conv_transpose2d(
        nchw(x), kernel, torch.from_numpy(params["bias"]), stride=2, padding=1, output_padding=1
    )
    got = forward(layer, x, params)
    assert got.shape == (2, *layer.output_shape((4, 5, 3)))
    np.testing.assert_allclose(got, nhwc(want), rtol=0, atol=1e-12)


def test_conv1d_and_grouped_dilated_conv2d_are_torchs():
    layer = Conv1d(4, 6, 3, stride=2, padding=2, dilation=2, groups=2)
    x = rng.standard_normal((2, 11, 4))
    params = layer.init_params(2, np.float64)
    kernel = torch.from_numpy(params["weight"]).permute(2, 1, 0)  # -> (out, in/groups, k)
    want = F.conv1d(
        torch.from_numpy(np.moveaxis(x, -1, 1).copy()),
        kernel,
        torch.from_numpy(params["bias"]),
        stride=2,
        padding=2,
        dilation=2,
        groups=2,
    )
    got = forward(layer, x, params)
    assert got.shape == (2, *layer.output_shape((11, 4)))
    np.testing.assert_allclose(got, np.moveaxis(want.numpy(), 1, -1), rtol=0, atol=1e-12)


def test_same_padding_at_stride_two_puts_the_odd_one_after():
    layer = Conv2d(1, 1, 3, stride=2, padding="same", bias=False)
    x = rng.standard_normal((1, 6, 6, 1))
    params = layer.init_params(0, np.float64)
    kernel = torch.from_numpy(params["weight"]).permute(3, 2, 0, 1)
    padded = F.pad(nchw(x), (0, 1, 0, 1))  # TensorFlow's rule: nothing before, one after
    want = F.conv2d(padded, kernel, stride=2)
    assert layer.output_shape((6, 6, 1)) == (3, 3, 1)
    np.testing.assert_allclose(forward(layer, x, params), nhwc(want), rtol=0, atol=1e-12)


def test_upsample_repeats_pixels_as_nearest_interpolation_does():
    x = rng.standard_normal((2, 3, 4, 5))
    want = F.interpolate(nchw(x), scale_factor=(2, 3), mode="nearest")
    np.testing.assert_array_equal(forward(Upsample((2, 3)), x), nhwc(want))


def test_sinusoidal_positions_follow_the_paper():
    layer = SinusoidalPositionalEmbedding(4)
    x = np.zeros((1, 3, 4))
    t = np.arange(3)[:, None]
    want = np.concatenate([np.sin(t), np.cos(t), np.sin(t / 100), np.cos(t / 100)], axis=1)[
        :, [0, 1, 2, 3]
    ]
    np.testing.assert_allclose(forward(layer, x)[0], want, rtol=0, atol=1e-12)


def test_rotary_scores_depend_only_on_the_distance_between_positions():
    q = np.tile(rng.standard_normal((1, 1, 1, 8)), (1, 1, 6, 1))
    k = np.tile(rng.standard_normal((1, 1, 1, 8)), (1, 1, 6, 1))
    with ops.using("numpy"):
        scores = np.asarray(rotate(q) @ np.swapaxes(np.asarray(rotate(k)), -1, -2))[0, 0]
    for distance in range(-3, 4):
        band = np.diagonal(scores, offset=distance)
        np.testing.assert_allclose(band, band[0], rtol=0, atol=1e-12)
    assert not np.allclose(np.diagonal(scores, 1)[0], np.diagonal(scores, 2)[0])


def test_gated_mlp_gates_with_silu():
    layer = GatedMLP(4, 6)
    params = layer.init_params(0, np.float64)
    x = rng.standard_normal((3, 4))
    gate, up = x @ params["gate.weight"], x @ params["up.weight"]
    want = (gate / (1 + np.exp(-gate)) * up) @ params["down.weight"]
    np.testing.assert_allclose(forward(layer, x, params), want, rtol=0, atol=1e-12)


def test_concatenate_keeps_the_input_beside_a_branch():
    layer = Concatenate((Identity(), Linear(4, 3, bias=False)))
    params = layer.init_params(0, np.float64)
    x = rng.standard_normal((2, 4))
    got = forward(layer, x, params)
    np.testing.assert_allclose(got, np.concatenate([x, x @ params["1.weight"]], axis=1))
    with pytest.raises(DataError, match="differ on axes other than"):
        Concatenate((Identity(), Reshape((2, 2)))).output_shape((4,))


def test_reshape_infers_one_axis_and_refuses_a_size_that_does_not_fit():
    assert forward(Reshape((2, -1)), np.zeros((3, 12))).shape == (3, 2, 6)
    with pytest.raises(DataError, match="of a size that fills"):
        Reshape((5, -1)).output_shape((12,))
    with pytest.raises(ConfigError, match="at most one entry may be -1"):
        Reshape((-1, -1))


def test_post_ln_block_normalises_after_each_residual_sum():
    block = TransformerBlock(8, 2, mlp_ratio=1.5, norm="post", activation="relu")
    x = rng.standard_normal((2, 4, 8)) * 5 + 3
    out = forward(block, x)
    # LayerNorm last: every position has mean 0 and variance 1 (weight 1, bias 0 at start).
    np.testing.assert_allclose(out.mean(-1), 0, atol=1e-12)
    np.testing.assert_allclose(out.var(-1), 1, atol=1e-4)
    assert block.width == 12 and block.param_shapes()["fc1.weight"] == (8, 12)


def test_attention_dropout_drops_weights_in_train_mode_only():
    layer = MultiHeadAttention(8, 2, dropout=0.5)
    x = rng.standard_normal((2, 5, 8))
    source = np.random.default_rng(1)
    dropped = forward(layer, x, training=True, draw=lambda shape, dtype: source.random(shape))
    plain = forward(MultiHeadAttention(8, 2), x)
    assert not np.allclose(dropped, plain)
    np.testing.assert_allclose(forward(layer, x), plain, rtol=0, atol=1e-12)


def test_every_new_layer_round_trips_and_describes_bad_options():
    for layer in (
        GroupNorm(2, 4),
        RMSNorm(3),
        Conv1d(2, 2, 3, padding="same"),
        Upsample(2),
        ConvTranspose2d(2, 3, 2, stride=2),
        SinusoidalPositionalEmbedding(4),
        GatedMLP(2, 3),
        Concatenate((Identity(), Linear(2, 2))),
        Reshape((2, -1)),
        TransformerBlock(8, 2, norm="post", activation="silu", hidden=10, bias=False),
        MultiHeadAttention(8, 2, rotary=True, bias=False, dropout=0.1),
    ):
        assert model_from_dict(layer.to_dict()) == layer
    for build, message in (
        (lambda: GroupNorm(3, 4), "multiple of groups"),
        (lambda: Conv2d(1, 2, 3, padding="full"), '"same" or "valid"'),
        (lambda: TransformerBlock(8, 2, mlp_ratio=1.3), "whole number"),
        (lambda: TransformerBlock(8, 2, norm="middle"), "'pre' or 'post'"),
        (lambda: TransformerBlock(8, 2, activation="swish"), "unknown activation"),
        (lambda: MultiHeadAttention(6, 2, rotary=True), "even head size"),
        (lambda: Linear(2, 2, bias="no"), "bias must be true or false"),
    ):
        with pytest.raises(ConfigError, match=message):
            build()


def test_a_checkpoint_written_before_the_new_options_still_resumes(tmp_path):
    model = Sequential((Conv2d(1, 2, 3), Linear(2, 2)))
    old = model.to_dict()
    for layer in old["layers"]:  # as the version before the options wrote it
        for key in ("dilation", "groups", "bias"):
            layer.pop(key, None)
    info = {"model": old, "optimizer": {"type": "sgd"}}
    mine = {"model": model.to_dict(), "optimizer": {"type": "sgd"}}
    _resume.check_same_run(tmp_path, info, mine)  # no error
    info["model"]["layers"][0]["out_channels"] = 3
    with pytest.raises(Exception, match="written for model"):
        _resume.check_same_run(tmp_path, info, mine)


def _torch_recurrent(kind, layer, params):
    """torch's own LSTM or GRU holding ``params`` (canonical layout: transposed weights)."""
    module = getattr(torch.nn, kind)(layer.input_size, layer.hidden_size, batch_first=True)
    module = module.double()
    with torch.no_grad():
        module.weight_ih_l0.copy_(torch.from_numpy(params["weight_ih"].T))
        module.weight_hh_l0.copy_(torch.from_numpy(params["weight_hh"].T))
        if kind == "LSTM":  # one canonical bias is torch's two summed
            module.bias_ih_l0.copy_(torch.from_numpy(params["bias"]))
            module.bias_hh_l0.zero_()
        else:
            module.bias_ih_l0.copy_(torch.from_numpy(params["bias_ih"]))
            module.bias_hh_l0.copy_(torch.from_numpy(params["bias_hh"]))
    return module


@pytest.mark.parametrize("kind", ["LSTM", "GRU"])
def test_recurrent_layers_are_torchs(kind):
    from unitrain import models

    layer = getattr(models, kind)(3, 5)
    params = layer.init_params(4, np.float64)
    x = rng.standard_normal((2, 7, 3))
    want, _ = _torch_recurrent(kind, layer, params)(torch.from_numpy(x))
    np.testing.assert_allclose(forward(layer, x, params), want.detach().numpy(), atol=1e-12)
    last = getattr(models, kind)(3, 5, return_sequences=False)
    np.testing.assert_allclose(forward(last, x, params), want[:, -1].detach().numpy(), atol=1e-12)


def test_a_stateful_lstm_carries_its_state_across_train_batches_only():
    from unitrain.models import LSTM

    layer = LSTM(2, 3, batch_size=2)
    params = layer.init_params(0, np.float64)
    first, second = rng.standard_normal((2, 4, 2)), rng.standard_normal((2, 4, 2))
    with ops.using("numpy"):
        state = layer.init_state(np.float64)
        _, moved = apply(layer, first, Pass(params, state, training=True))
        carried, _ = apply(layer, second, Pass(params, moved, training=True))
        fresh, _ = apply(layer, second, Pass(params, state, training=True))
        _, unmoved = apply(layer, second, Pass(params, moved, training=False))
    whole = forward(LSTM(2, 3), np.concatenate([first, second], axis=1), params)
    np.testing.assert_allclose(np.asarray(carried), whole[:, 4:], atol=1e-12)
    assert not np.allclose(np.asarray(carried), np.asarray(fresh))
    assert all(np.array_equal(unmoved[k], moved[k]) for k in moved)  # eval reads, never moves
    with pytest.raises(ConfigError, match="stateful for batches of 2"):
        forward(layer, rng.standard_normal((3, 4, 2)), params)
