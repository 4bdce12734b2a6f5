"""The workloads' architectures written natively in each framework, as a user would write them.

Each builder imports its framework when called (this module imports none), so a child
process imports only the framework of its method, after pinning threads.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from benchmarks import paper_models
from benchmarks.workloads import SEED, Workload

__all__ = ["jax_model", "keras_model", "torch_model"]


def torch_model(workload: Workload) -> Any:
    """An ``nn.Sequential`` (channels-first for the CNN) with torch's default initialisation."""
    if workload.kind in paper_models.KINDS:
        return paper_models.torch_model(workload)
    import torch
    from torch import nn

    torch.manual_seed(SEED)
    if workload.kind == "mlp":
        layers: list[Any] = []
        for fan_in, fan_out in zip(workload.sizes, workload.sizes[1:]):
            layers += [nn.Linear(fan_in, fan_out), nn.ReLU()]
        return nn.Sequential(*layers[:-1])
    c1, c2, classes = workload.sizes
    height, _, channels = workload.input_shape
    side = ((height - 2) // 2 - 2) // 2
    return nn.Sequential(
        nn.Conv2d(channels, c1, 3),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(c1, c2, 3),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(c2 * side * side, classes),
    )


def keras_model(workload: Workload) -> Any:
    """A built ``keras.Sequential`` (channels-last) on whichever Keras backend is active."""
    if workload.kind in paper_models.KINDS:
        return paper_models.keras_model(workload)
    import keras

    keras.utils.set_random_seed(SEED)
    layers: list[Any] = [keras.Input(workload.input_shape)]
    if workload.kind == "mlp":
        layers += [keras.layers.Dense(n, activation="relu") for n in workload.sizes[1:-1]]
    else:
        c1, c2, _ = workload.sizes
        layers += [
            keras.layers.Conv2D(c1, 3, activation="relu"),
            keras.layers.MaxPooling2D(2),
            keras.layers.Conv2D(c2, 3, activation="relu"),
            keras.layers.MaxPooling2D(2),
            keras.layers.Flatten(),
        ]
    layers.append(keras.layers.Dense(workload.classes))
    return keras.Sequential(layers)


def jax_model(workload: Workload) -> tuple[Any, dict[str, Any]]:
    """``(apply(params, x), params)``: a pure function and numpy parameters (torch-style init)."""
    if workload.kind in paper_models.KINDS:
        return paper_models.jax_model(workload)
    import jax
    import jax.numpy as jnp

    rng = np.random.default_rng(SEED)

    def uniform(shape: tuple[int, ...], fan_in: int) -> np.ndarray:
        bound = 1.0 / np.sqrt(fan_in)
        return rng.uniform(-bound, bound, size=shape).astype(np.float32)

    params: dict[str, Any] = {}
    if workload.kind == "mlp":
        for i, (fan_in, fan_out) in enumerate(zip(workload.sizes, workload.sizes[1:])):
            params[f"w{i}"] = uniform((fan_in, fan_out), fan_in)
            params[f"b{i}"] = uniform((fan_out,), fan_in)
        last = len(workload.sizes) - 2

        def apply_mlp(p: Any, x: Any) -> Any:
            for i in range(last):
                x = jax.nn.relu(x @ p[f"w{i}"] + p[f"b{i}"])
            return x @ p[f"w{last}"] + p[f"b{last}"]

        return apply_mlp, params

    c1, c2, classes = workload.sizes
    height, _, channels = workload.input_shape
    side = ((height - 2) // 2 - 2) // 2
    params["conv0"] = uniform((3, 3, channels, c1), 9 * channels)
    params["cb0"] = uniform((c1,), 9 * channels)
    params["conv1"] = uniform((3, 3, c1, c2), 9 * c1)
    params["cb1"] = uniform((c2,), 9 * c1)
    params["w"] = uniform((side * side * c2, classes), side * side * c2)
    params["b"] = uniform((classes,), side * side * c2)
    numbers = ("NHWC", "HWIO", "NHWC")

    def pool(x: Any) -> Any:
        return jax.lax.reduce_window(x, -jnp.inf, jax.lax.max, (1, 2, 2, 1), (1, 2, 2, 1), "VALID")

    def apply_cnn(p: Any, x: Any) -> Any:
        for i in range(2):
            x = jax.lax.conv_general_dilated(x, p[f"conv{i}"], (1, 1), "VALID", None, None, numbers)
            x = pool(jax.nn.relu(x + p[f"cb{i}"]))
        return x.reshape(x.shape[0], -1) @ p["w"] + p["b"]

    return apply_cnn, params
