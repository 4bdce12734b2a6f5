"""The methods under test, one module per way of training, and the table that lists them.

Every method module has one function, ``train(workload, backend, variant, gate)``: it trains
``workload`` for ``gate.epochs`` epochs its own way and calls ``gate.epoch_end(loss)`` after
every epoch. The gate times the epochs between its calls and, in a benchmark, pauses the
process there until the parent lets it run the next timed segment, which is how methods in
different processes are interleaved without timing any process start, import or compile.
"""

from __future__ import annotations

import dataclasses
import importlib
from typing import Protocol

from benchmarks.workloads import Workload

__all__ = ["METHODS", "Gate", "Method", "train"]


class Gate(Protocol):
    """Where a method reports the end of each epoch."""

    #: Epochs to train in total (warm-up included).
    epochs: int

    def epoch_end(self, loss: float | None) -> None:
        """Called after every epoch with its mean training loss (None if not at hand)."""
        ...


@dataclasses.dataclass(frozen=True)
class Method:
    """One way of training, run in a process of its own.

    Attributes:
        name: ``backend/method`` label, e.g. ``"torch/unitrain"``.
        backend: the framework it runs on: ``"torch"``, ``"jax"`` or ``"tensorflow"``.
        module: module under :mod:`benchmarks.methods` holding its ``train``.
        variant: what the module varies (host- or device-fed, default or multi-step, ...).
        baseline: the method its ratio is taken against (None for a baseline itself).
        description: what it is, for the table.
    """

    name: str
    backend: str
    module: str
    variant: str
    baseline: str | None
    description: str


_HOST = "native loop, host numpy batches shuffled per epoch"
_DEVICE = "native loop, data on device, one step per call"

METHODS: dict[str, Method] = {
    m.name: m
    for m in (
        Method("torch/native", "torch", "torch_native", "host", None, f"torch eager {_HOST}"),
        Method("torch/native_device", "torch", "torch_native", "device", None, f"torch {_DEVICE}"),
        Method("torch/unitrain", "torch", "unitrain", "default", "torch/native", "unitrain"),
        Method(
            "torch/unitrain_multistep",
            "torch",
            "unitrain",
            "multistep",
            "torch/native_device",
            "unitrain steps_per_call + data_on_device",
        ),
        Method("torch/keras_fit", "torch", "keras_fit", "", "torch/native", "Keras 3 fit"),
        Method("torch/lightning", "torch", "lightning", "", "torch/native", "Lightning fit"),
        Method("jax/native", "jax", "jax_native", "host", None, f"jax.jit + optax {_HOST}"),
        Method("jax/native_device", "jax", "jax_native", "device", None, f"jax.jit {_DEVICE}"),
        Method("jax/unitrain", "jax", "unitrain", "default", "jax/native", "unitrain"),
        Method(
            "jax/unitrain_multistep",
            "jax",
            "unitrain",
            "multistep",
            "jax/native_device",
            "unitrain steps_per_call + data_on_device",
        ),
        Method("jax/keras_fit", "jax", "keras_fit", "", "jax/native", "Keras 3 fit"),
        Method(
            "tensorflow/native", "tensorflow", "tf_native", "host", None, f"tf.function {_HOST}"
        ),
        Method(
            "tensorflow/native_device",
            "tensorflow",
            "tf_native",
            "device",
            None,
            f"tf.function {_DEVICE}",
        ),
        Method(
            "tensorflow/unitrain",
            "tensorflow",
            "unitrain",
            "default",
            "tensorflow/native",
            "unitrain",
        ),
        Method(
            "tensorflow/unitrain_multistep",
            "tensorflow",
            "unitrain",
            "multistep",
            "tensorflow/native_device",
            "unitrain steps_per_call + data_on_device",
        ),
        Method(
            "tensorflow/keras_fit",
            "tensorflow",
            "keras_fit",
            "",
            "tensorflow/native",
            "Keras 3 fit",
        ),
    )
}


def train(method: Method, workload: Workload, gate: Gate) -> None:
    """Run ``method`` on ``workload`` (imports its module, and so its framework, now)."""
    module = importlib.import_module(f"benchmarks.methods.{method.module}")
    module.train(workload, method.backend, method.variant, gate)
