"""Device, determinism, seeding and tensor-spec helpers of the TensorFlow adapter."""

from __future__ import annotations

import os
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # must precede the first TF import

import tensorflow as tf  # absolute: the framework, not this package

from unitrain import ConfigError

__all__ = [
    "make_deterministic",
    "matrix",
    "resolve_device",
    "scalar",
    "seed_global_rngs",
    "spec",
    "vector",
    "zeros_variable",
]


def resolve_device(device: str) -> str:
    if device not in ("cpu", "gpu", "auto"):
        raise ConfigError(f"unknown device {device!r}; choose 'cpu', 'gpu' or 'auto'")
    has_gpu = bool(tf.config.list_physical_devices("GPU"))
    if device == "gpu" and not has_gpu:
        raise ConfigError(
            "device='gpu' but TensorFlow sees no GPU (is tensorflow-cpu installed, or CUDA "
            "missing?); use 'cpu' or 'auto'"
        )
    return "/GPU:0" if device != "cpu" and has_gpu else "/CPU:0"


def make_deterministic() -> None:
    # Process-wide switches, as torch.use_deterministic_algorithms is.
    # Kernel choice only: TF32 is matmul_precision's to decide (tensorflow/precision.py).
    tf.config.experimental.enable_op_determinism()


def seed_global_rngs(seed: int) -> None:
    # unitrain draws nothing from these; they are seeded (like torch.manual_seed) and saved
    # in checkpoints for user code that does.
    tf.random.set_seed(seed)
    try:
        tf.random.get_global_generator().reset_from_seed(seed)
    except RuntimeError:  # op determinism on and no global generator set yet
        tf.random.set_global_generator(tf.random.Generator.from_seed(seed))


def zeros_variable(like: tf.Variable) -> tf.Variable:
    return tf.Variable(tf.zeros(like.shape, like.dtype), trainable=False)


def spec(tensor: Any, leading: int = 1, full: bool = False) -> tf.TensorSpec:
    """A spec with the first ``leading`` axes unknown (all known with ``full``)."""
    shape = list(tensor.shape)
    if not full:
        shape[:leading] = [None] * min(leading, len(shape))
    return tf.TensorSpec(shape, tensor.dtype)


def scalar(dtype: tf.DType) -> tf.TensorSpec:
    return tf.TensorSpec([], dtype)


def vector(dtype: tf.DType) -> tf.TensorSpec:
    return tf.TensorSpec([None], dtype)


def matrix(dtype: tf.DType) -> tf.TensorSpec:
    return tf.TensorSpec([None, None], dtype)
