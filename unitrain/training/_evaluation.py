"""Evaluation passes: example-weighted mean metrics of a data source, in eval mode.

The Trainer's validation, ``test`` and the loop's per-epoch validation all come here. With
several workers and only the loss, each worker evaluates its slices and the sums are added
up over workers; with metrics beyond the loss every worker evaluates every example (metric
states are not reduced across workers).
"""

from __future__ import annotations

from itertools import islice
from typing import Any

from unitrain._errors import DataError
from unitrain.backends.protocol import DeviceOutputs
from unitrain.backends.strategy import Strategy, evaluate_over_workers
from unitrain.data import BatchSource
from unitrain.metrics import Metric, MetricTotals
from unitrain.structure import first_leaf, num_examples

__all__ = ["evaluate"]


def evaluate(
    backend: Any,
    strategy: Strategy,
    metrics: list[Metric],
    source: BatchSource,
    label: str,
    max_batches: int | None = None,
) -> dict[str, float]:
    """The mean of the backend's ``evaluate`` metrics and of ``metrics`` over ``source``.

    Args:
        backend: the backend, in eval mode for the call (``evaluate`` leaves model state be).
        strategy: the workers the run is spread over.
        metrics: metrics beyond the loss; they need a backend with ``predict`` (checked
            when the Trainer is built).
        source: the data, read from its first epoch's order.
        label: what messages call the data (``"val_data"``).
        max_batches: read at most this many batches, the first ones (None: all).

    Raises:
        DataError: ``source`` yielded no example.
    """
    batches = islice(source.batches(0), max_batches)
    if strategy.world_size > 1 and not metrics:
        return evaluate_over_workers(backend, strategy, batches, label)
    sums: dict[str, Any] = {}
    count = 0
    totals = MetricTotals(metrics)
    for batch in batches:
        n = num_examples(batch)
        for key, value in backend.evaluate(batch).items():
            sums[key] = sums.get(key, 0.0) + value * n
        count += n
        # Metrics compare the first output with the first target (see unitrain.losses.Objective).
        if metrics and isinstance(backend, DeviceOutputs):
            outputs, targets = backend.outputs(batch)  # stay on the device
            host = first_leaf(batch[1])
            totals.add(first_leaf(outputs), first_leaf(targets), host, backend.array_ops)
        elif metrics:
            host = first_leaf(batch[1])
            totals.add(first_leaf(backend.predict(batch[0])), host, host)
    if count == 0:
        raise DataError(f"{label} yielded no batches; pass at least one example")
    return {**{key: float(value) / count for key, value in sums.items()}, **totals.results()}
