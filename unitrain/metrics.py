"""Metrics beyond the loss: built-ins (accuracy, top-k, MSE, perplexity) and your own.

A metric turns a batch of model outputs and targets into a *sum* and a *count*; the Trainer adds
those up over a validation or test pass and calls :meth:`Metric.result` once at the end, so a metric
of a whole pass is exact whatever the batch sizes. Built-in metrics are written against a
numpy-style array namespace ``xp`` (numpy, ``jax.numpy``, TensorFlow's numpy, a thin torch adapter)
that a backend offers with its ``outputs`` (see :class:`unitrain.backends.protocol.DeviceOutputs`):
they run on the backend's device, their sums stay there, and each is read back once per pass. They
run at validation and test time only: training steps never pay for them. Targets are checked on the
host, where they come from.

Pass them as ``Trainer(..., metrics=[...])``: a :class:`Metric`, a built-in's name
(``"accuracy"``, ``"top5_accuracy"``, ``"mse"``, ``"perplexity"``), or any function
``fn(outputs, targets) -> float`` (a batch mean) wrapped as ``Metric.from_function(name, fn)``.
They are logged as ``val_<name>`` and ``test_<name>``.
"""

from __future__ import annotations

import abc
import dataclasses
import math
import re
from collections.abc import Callable
from typing import Any, ClassVar

import numpy as np

from unitrain._errors import ConfigError, DataError

__all__ = [
    "Accuracy",
    "FunctionMetric",
    "MeanSquaredError",
    "Metric",
    "MetricTotals",
    "Perplexity",
    "TopKAccuracy",
    "metric_from_dict",
    "resolve_metrics",
]


class Metric(abc.ABC):
    """A quantity computed from outputs and targets, added up over batches."""

    #: The name logged (with ``val_`` or ``test_`` in front).
    name: str

    #: Whether ``batch`` needs numpy arrays (user functions) rather than any ``xp``'s arrays.
    host = False

    @abc.abstractmethod
    def batch(self, outputs: Any, targets: Any, xp: Any = np) -> tuple[Any, int]:
        """Return ``(sum, count)`` for one batch, computed with the array namespace ``xp``.

        The pass's value is ``result(sums, counts)``; ``sum`` may stay a device scalar.
        """

    def check(self, shape: tuple[int, ...], targets: np.ndarray) -> None:  # noqa: B027
        """Refuse outputs of ``shape`` and host ``targets`` this metric cannot score.

        Called on the host before :meth:`batch`; a user metric may leave it as it is.
        """

    def result(self, total: float, count: int) -> float:
        """The metric of a whole pass from its summed ``batch`` results (a mean by default)."""
        return total / count

    def to_dict(self) -> dict[str, Any]:
        """JSON/TOML description; :func:`metric_from_dict` inverts it."""
        raise ConfigError(
            f"metric {self.name!r} ({type(self).__name__}) cannot be written to a recipe file; "
            "use a Python recipe for it"
        )

    @staticmethod
    def from_function(name: str, fn: Callable[[np.ndarray, np.ndarray], float]) -> Metric:
        """Wrap ``fn(outputs, targets) -> batch mean`` as a metric weighted by batch size."""
        return FunctionMetric(name, fn)


@dataclasses.dataclass(frozen=True)
class FunctionMetric(Metric):
    """A user function's batch means, averaged over the pass weighted by batch size."""

    name: str
    fn: Callable[[np.ndarray, np.ndarray], float]
    host = True

    def batch(self, outputs: Any, targets: Any, xp: Any = np) -> tuple[Any, int]:
        return float(self.fn(outputs, targets)) * len(outputs), len(outputs)


@dataclasses.dataclass(frozen=True)
class TopKAccuracy(Metric):
    """Share of examples whose target is among the ``k`` highest outputs (logits ``(N, C)``).

    Examples:
        >>> outputs = np.array([[3.0, 2.0, 1.0], [3.0, 2.0, 1.0]])
        >>> hits, count = TopKAccuracy(2).batch(outputs, np.array([1, 2]))
        >>> int(hits), count
        (1, 2)
        >>> int(TopKAccuracy(1).batch(np.array([[1.0, 1.0]]), np.array([0]))[0])  # a tie: a miss
        0
    """

    k: int = 5
    kind: ClassVar[str] = "top_k_accuracy"

    def __post_init__(self) -> None:
        if isinstance(self.k, bool) or not isinstance(self.k, int) or self.k < 1:
            raise ConfigError(f"TopKAccuracy: k must be an int >= 1, got k={self.k!r}")

    @property
    def name(self) -> str:  # type: ignore[override]
        return "accuracy" if self.k == 1 else f"top{self.k}_accuracy"

    def check(self, shape: tuple[int, ...], targets: np.ndarray) -> None:
        _check_classes(self.name, shape, targets)

    def batch(self, outputs: Any, targets: Any, xp: Any = np) -> tuple[Any, int]:
        k = min(self.k, outputs.shape[1])
        target_score = xp.take_along_axis(outputs, targets[:, None], axis=1)
        # Ties count against the target, so a constant output never scores 100%.
        rank = xp.sum(outputs >= target_score, axis=1) - 1
        return xp.sum(rank < k), outputs.shape[0]

    def to_dict(self) -> dict[str, Any]:
        return {"type": self.kind, "k": self.k}


@dataclasses.dataclass(frozen=True)
class Accuracy(TopKAccuracy):
    """Share of examples whose highest output is the target class."""

    k: int = 1
    kind: ClassVar[str] = "accuracy"

    def to_dict(self) -> dict[str, Any]:
        return {"type": self.kind}


@dataclasses.dataclass(frozen=True)
class MeanSquaredError(Metric):
    """Mean of ``(output - target)**2`` over every element."""

    name: str = dataclasses.field(default="mse", init=False)
    kind: ClassVar[str] = "mse"

    def check(self, shape: tuple[int, ...], targets: np.ndarray) -> None:
        if math.prod(shape) != targets.size:
            raise DataError(f"metric 'mse': outputs {shape} and targets {targets.shape} differ")

    def batch(self, outputs: Any, targets: Any, xp: Any = np) -> tuple[Any, int]:
        diff = outputs - xp.reshape(targets, outputs.shape)
        return xp.sum(diff * diff), math.prod(outputs.shape)

    def to_dict(self) -> dict[str, Any]:
        return {"type": self.kind}


@dataclasses.dataclass(frozen=True)
class Perplexity(Metric):
    """``exp`` of the mean token cross-entropy, for sequence models: logits ``(N, T, V)``.

    Targets are token ids ``(N, T)``; classification outputs ``(N, C)`` count as ``T = 1``.

    Examples:
        >>> uniform = np.zeros((1, 3, 4))  # every token equally likely among 4
        >>> p = Perplexity()
        >>> round(p.result(*p.batch(uniform, np.array([[0, 1, 2]]))), 6)
        4.0
    """

    name: str = dataclasses.field(default="perplexity", init=False)
    kind: ClassVar[str] = "perplexity"

    def check(self, shape: tuple[int, ...], targets: np.ndarray) -> None:
        _check_classes(self.name, (math.prod(shape[:-1]), shape[-1]), targets.reshape(-1))

    def batch(self, outputs: Any, targets: Any, xp: Any = np) -> tuple[Any, int]:
        logits = xp.reshape(outputs, (-1, outputs.shape[-1]))
        tokens = xp.reshape(targets, (-1,))
        shifted = logits - xp.max(logits, axis=1, keepdims=True)
        log_z = xp.log(xp.sum(xp.exp(shifted), axis=1))
        picked = xp.take_along_axis(shifted, tokens[:, None], axis=1)[:, 0]
        return xp.sum(log_z - picked), logits.shape[0]

    def result(self, total: float, count: int) -> float:
        return math.exp(total / count)

    def to_dict(self) -> dict[str, Any]:
        return {"type": self.kind}


def _check_classes(name: str, shape: tuple[int, ...], targets: np.ndarray) -> None:
    if len(shape) != 2 or targets.shape != tuple(shape[:1]):
        raise DataError(
            f"metric {name!r} needs outputs (N, classes) and integer targets (N,), got "
            f"outputs {tuple(shape)} and targets {targets.shape}"
        )
    if not np.issubdtype(targets.dtype, np.integer):
        raise DataError(f"metric {name!r} needs integer class targets, got {targets.dtype}")
    if targets.size and (targets.min() < 0 or targets.max() >= shape[1]):
        raise DataError(f"metric {name!r}: a target is outside 0..{shape[1] - 1}")


_TYPES: dict[str, type[Metric]] = {
    "accuracy": Accuracy,
    "top_k_accuracy": TopKAccuracy,
    "mse": MeanSquaredError,
    "perplexity": Perplexity,
}


def metric_from_dict(data: dict[str, Any]) -> Metric:
    """Rebuild a built-in metric from :meth:`Metric.to_dict` output.

    Examples:
        >>> metric_from_dict({"type": "top_k_accuracy", "k": 3}).name
        'top3_accuracy'
    """
    fields = dict(data)
    kind = fields.pop("type", None)
    if kind not in _TYPES:
        raise ConfigError(f"unknown metric type {kind!r}; known: {sorted(_TYPES)}")
    try:
        return _TYPES[kind](**fields)
    except TypeError as error:
        raise ConfigError(f"bad fields for metric {kind!r}: {error}") from None


class MetricTotals:
    """Adds up metrics' batch results over one pass; :meth:`results` gives their values."""

    def __init__(self, metrics: list[Metric]) -> None:
        self.metrics = metrics
        self.totals: dict[str, tuple[Any, int]] = {}

    def add(self, outputs: Any, targets: Any, host_targets: Any, xp: Any = np) -> None:
        """Count one batch: model ``outputs`` and ``targets`` as arrays of ``xp`` (on the
        device), ``host_targets`` the same targets on the host (checked there, no sync)."""
        host_targets = np.asarray(host_targets)
        for metric in self.metrics:
            metric.check(tuple(outputs.shape), host_targets)
            if metric.host:
                total, count = metric.batch(np.asarray(outputs), host_targets)
            else:
                total, count = metric.batch(outputs, targets, xp)
            before = self.totals.get(metric.name)
            self.totals[metric.name] = (
                (total, count) if before is None else (before[0] + total, before[1] + count)
            )

    def results(self) -> dict[str, float]:
        """Each metric's value over the batches added: the one read back from the device."""
        return {
            m.name: m.result(float(self.totals[m.name][0]), self.totals[m.name][1])
            for m in self.metrics
            if m.name in self.totals
        }


def resolve_metrics(specs: Any) -> list[Metric]:
    """Turn ``Trainer(metrics=...)`` entries into metrics: objects, names or dicts.

    Examples:
        >>> [m.name for m in resolve_metrics(["accuracy", "top3_accuracy", "mse"])]
        ['accuracy', 'top3_accuracy', 'mse']
    """
    metrics: list[Metric] = []
    for spec in specs:
        if isinstance(spec, Metric):
            metrics.append(spec)
        elif isinstance(spec, dict):
            metrics.append(metric_from_dict(spec))
        elif isinstance(spec, str) and (top := re.fullmatch(r"top(\d+)_accuracy", spec)):
            metrics.append(TopKAccuracy(int(top[1])))
        elif isinstance(spec, str) and spec in _TYPES and spec != "top_k_accuracy":
            metrics.append(_TYPES[spec]())
        else:
            raise ConfigError(
                f"unknown metric {spec!r}; pass a unitrain.metrics.Metric, one of 'accuracy', "
                "'topK_accuracy' (e.g. 'top5_accuracy'), 'mse', 'perplexity', or "
                "Metric.from_function(name, fn) for your own"
            )
    names = [m.name for m in metrics]
    if len(set(names)) != len(names):
        raise ConfigError(f"two metrics share a name: {names}")
    return metrics
