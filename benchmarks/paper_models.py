"""The paper workloads (LeNet-5, a pre-LN Transformer LM): portable and written natively.

unitrain trains the :mod:`unitrain.models` description from :func:`portable_model`; the
native loops train the same architecture written the way a user of each framework would
write it (``nn.Sequential`` and ``nn.TransformerEncoderLayer``, Keras layers, plain
``jax.numpy`` functions), with the same shapes and the same computation: tanh and
average pooling in LeNet; pre-LN blocks with exact-erf GELU, LayerNorm eps 1e-5, causal
softmax attention with ``dim // heads`` features per head, a learned positional table.
Each builder imports its framework when called.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from benchmarks.workloads import SEED, Workload

__all__ = ["KINDS", "jax_model", "keras_model", "portable_model", "torch_model"]

#: The workload kinds this module builds.
KINDS = ("lenet", "transformer")
#: LayerNorm's epsilon in every framework (torch's default; Keras' is 1e-3).
EPS = 1e-5


def _lenet_sizes(workload: Workload) -> tuple[int, int, int, int, int, int]:
    c1, c2, h1, h2, classes = workload.sizes
    side = workload.input_shape[0] // 4  # two 2x2 poolings, "same" 3x3 convolutions
    return c1, c2, side * side * c2, h1, h2, classes


def _transformer_sizes(workload: Workload) -> tuple[int, int, int, int, int]:
    dim, depth, heads = workload.sizes
    return workload.classes, dim, depth, heads, workload.input_shape[0]


def portable_model(workload: Workload) -> Any:
    """The workload as a :mod:`unitrain.models` description."""
    from unitrain import models as m

    if workload.kind == "lenet":
        c1, c2, flat, h1, h2, classes = _lenet_sizes(workload)
        channels = workload.input_shape[-1]
        return m.Sequential(
            [
                *(m.Conv2d(channels, c1, 3, padding=1), m.Tanh(), m.AvgPool2d(2)),
                *(m.Conv2d(c1, c2, 3, padding=1), m.Tanh(), m.AvgPool2d(2)),
                *(m.Flatten(), m.Linear(flat, h1), m.Tanh(), m.Linear(h1, h2), m.Tanh()),
                m.Linear(h2, classes),
            ]
        )
    vocabulary, dim, depth, heads, length = _transformer_sizes(workload)
    return m.Sequential(
        [
            m.Embedding(vocabulary, dim),
            m.PositionalEmbedding(length, dim),
            *(m.TransformerBlock(dim, heads, causal=True) for _ in range(depth)),
            m.LayerNorm(dim),
            m.Linear(dim, vocabulary),
        ]
    )


def torch_model(workload: Workload) -> Any:
    """An ``nn.Module`` (LeNet channels-first) with torch's default initialisation."""
    import torch
    from torch import nn

    torch.manual_seed(SEED)
    if workload.kind == "lenet":
        c1, c2, flat, h1, h2, classes = _lenet_sizes(workload)
        return nn.Sequential(
            *(nn.Conv2d(workload.input_shape[-1], c1, 3, padding=1), nn.Tanh(), nn.AvgPool2d(2)),
            *(nn.Conv2d(c1, c2, 3, padding=1), nn.Tanh(), nn.AvgPool2d(2)),
            *(nn.Flatten(), nn.Linear(flat, h1), nn.Tanh(), nn.Linear(h1, h2), nn.Tanh()),
            nn.Linear(h2, classes),
        )
    vocabulary, dim, depth, heads, length = _transformer_sizes(workload)

    class Decoder(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Embedding(vocabulary, dim)
            self.position = nn.Parameter(torch.randn(length, dim))
            layer = nn.TransformerEncoderLayer(
                dim, heads, 4 * dim, dropout=0.0, activation="gelu", layer_norm_eps=EPS,
                batch_first=True, norm_first=True,
            )  # fmt: skip
            self.blocks = nn.TransformerEncoder(layer, depth, enable_nested_tensor=False)
            self.norm = nn.LayerNorm(dim, eps=EPS)
            self.head = nn.Linear(dim, vocabulary)
            self.register_buffer("mask", nn.Transformer.generate_square_subsequent_mask(length))

        def forward(self, tokens: torch.Tensor) -> torch.Tensor:
            x = self.embed(tokens) + self.position[: tokens.shape[1]]
            x = self.blocks(x, mask=self.mask, is_causal=True)
            return self.head(self.norm(x))

    return Decoder()


def keras_model(workload: Workload) -> Any:
    """A built Keras model (channels-last) on whichever Keras backend is active."""
    import keras

    keras.utils.set_random_seed(SEED)
    if workload.kind == "lenet":
        _, _, _, h1, h2, classes = _lenet_sizes(workload)
        c1, c2 = workload.sizes[:2]
        conv = lambda c: keras.layers.Conv2D(c, 3, padding="same", activation="tanh")  # noqa: E731
        return keras.Sequential(
            [
                keras.Input(workload.input_shape),
                *(conv(c1), keras.layers.AveragePooling2D(2)),
                *(conv(c2), keras.layers.AveragePooling2D(2), keras.layers.Flatten()),
                keras.layers.Dense(h1, activation="tanh"),
                keras.layers.Dense(h2, activation="tanh"),
                keras.layers.Dense(classes),
            ]
        )
    vocabulary, dim, depth, heads, length = _transformer_sizes(workload)

    class Position(keras.layers.Layer):
        def build(self, shape: Any) -> None:
            self.table = self.add_weight(shape=(length, dim), initializer="random_normal")

        def call(self, x: Any) -> Any:
            return x + self.table[: keras.ops.shape(x)[1]]

    tokens = keras.Input((length,), dtype="int64")
    x = Position()(keras.layers.Embedding(vocabulary, dim)(tokens))
    for _ in range(depth):
        h = keras.layers.LayerNormalization(epsilon=EPS)(x)
        h = keras.layers.MultiHeadAttention(heads, dim // heads)(h, h, use_causal_mask=True)
        x = x + h
        h = keras.layers.LayerNormalization(epsilon=EPS)(x)
        h = keras.layers.Dense(4 * dim, activation=lambda v: keras.activations.gelu(v, False))(h)
        x = x + keras.layers.Dense(dim)(h)
    x = keras.layers.LayerNormalization(epsilon=EPS)(x)
    return keras.Model(tokens, keras.layers.Dense(vocabulary)(x))


def jax_model(workload: Workload) -> tuple[Any, dict[str, Any]]:
    """``(apply(params, x), params)``: pure functions and numpy parameters (torch-style init)."""
    import jax
    import jax.numpy as jnp

    rng = np.random.default_rng(SEED)

    def uniform(shape: tuple[int, ...], fan_in: int) -> np.ndarray:
        bound = 1.0 / math.sqrt(fan_in)
        return rng.uniform(-bound, bound, size=shape).astype(np.float32)

    def dense(name: str, fan_in: int, fan_out: int) -> None:
        params[f"{name}.w"] = uniform((fan_in, fan_out), fan_in)
        params[f"{name}.b"] = uniform((fan_out,), fan_in)

    params: dict[str, Any] = {}
    if workload.kind == "lenet":
        c1, c2, flat, h1, h2, classes = _lenet_sizes(workload)
        for i, (cin, cout) in enumerate(((workload.input_shape[-1], c1), (c1, c2))):
            params[f"conv{i}.w"] = uniform((3, 3, cin, cout), 9 * cin)
            params[f"conv{i}.b"] = uniform((cout,), 9 * cin)
        for name, fan_in, fan_out in (("fc0", flat, h1), ("fc1", h1, h2), ("fc2", h2, classes)):
            dense(name, fan_in, fan_out)
        numbers = ("NHWC", "HWIO", "NHWC")

        def pool(x: Any) -> Any:
            window = (1, 2, 2, 1)
            return jax.lax.reduce_window(x, 0.0, jax.lax.add, window, window, "VALID") / 4.0

        def apply_lenet(p: Any, x: Any) -> Any:
            for i in range(2):
                kernel = p[f"conv{i}.w"]
                x = jax.lax.conv_general_dilated(
                    x, kernel, (1, 1), ((1, 1), (1, 1)), None, None, numbers
                )
                x = pool(jnp.tanh(x + p[f"conv{i}.b"]))
            x = x.reshape(x.shape[0], -1)
            x = jnp.tanh(x @ p["fc0.w"] + p["fc0.b"])
            x = jnp.tanh(x @ p["fc1.w"] + p["fc1.b"])
            return x @ p["fc2.w"] + p["fc2.b"]

        return apply_lenet, params

    vocabulary, dim, depth, heads, length = _transformer_sizes(workload)
    params["embed"] = rng.standard_normal((vocabulary, dim)).astype(np.float32)
    params["position"] = rng.standard_normal((length, dim)).astype(np.float32)
    for i in range(depth):
        for part in ("q", "k", "v", "o"):
            dense(f"{i}.{part}", dim, dim)
        dense(f"{i}.fc1", dim, 4 * dim)
        dense(f"{i}.fc2", 4 * dim, dim)
        for norm in ("norm1", "norm2"):
            params[f"{i}.{norm}.g"] = np.ones(dim, np.float32)
            params[f"{i}.{norm}.b"] = np.zeros(dim, np.float32)
    params["norm.g"], params["norm.b"] = np.ones(dim, np.float32), np.zeros(dim, np.float32)
    dense("head", dim, vocabulary)
    causal = np.tril(np.ones((length, length), bool))

    def norm(p: Any, name: str, x: Any) -> Any:
        mean = x.mean(-1, keepdims=True)
        var = jnp.square(x - mean).mean(-1, keepdims=True)
        return (x - mean) * jax.lax.rsqrt(var + EPS) * p[f"{name}.g"] + p[f"{name}.b"]

    def attention(p: Any, i: int, x: Any) -> Any:
        n, steps, _ = x.shape
        q, k, v = (
            (x @ p[f"{i}.{part}.w"] + p[f"{i}.{part}.b"]).reshape(n, steps, heads, -1)
            for part in "qkv"
        )
        scores = jnp.einsum("nqhd,nkhd->nhqk", q, k) / math.sqrt(dim // heads)
        scores = jnp.where(causal[:steps, :steps], scores, -jnp.inf)
        mixed = jnp.einsum("nhqk,nkhd->nqhd", jax.nn.softmax(scores, -1), v)
        return mixed.reshape(n, steps, dim) @ p[f"{i}.o.w"] + p[f"{i}.o.b"]

    def apply_transformer(p: Any, tokens: Any) -> Any:
        x = jnp.take(p["embed"], tokens, axis=0) + p["position"][: tokens.shape[1]]
        for i in range(depth):
            x = x + attention(p, i, norm(p, f"{i}.norm1", x))
            h = jax.nn.gelu(norm(p, f"{i}.norm2", x) @ p[f"{i}.fc1.w"] + p[f"{i}.fc1.b"], False)
            x = x + h @ p[f"{i}.fc2.w"] + p[f"{i}.fc2.b"]
        return norm(p, "norm", x) @ p["head.w"] + p["head.b"]

    return apply_transformer, params
