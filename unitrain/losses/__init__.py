"""Losses as data: frozen, JSON-serialisable descriptions, each written once in ops.

A loss is one value per example (per position of a sequence) and the reduction of those values
to the batch's loss, both in :mod:`unitrain.ops`, so every backend computes it natively and the
numpy backend computes it in float64 as the reference. Each follows torch's definition:

================================  ====================================  ====================
loss                              targets                               torch
================================  ====================================  ====================
``CrossEntropy``                  integer labels, ``(N,)`` or ``(N, L)``  ``CrossEntropyLoss``
``BinaryCrossEntropyWithLogits``  values in [0, 1], the outputs' shape  ``BCEWithLogitsLoss``
``MSE``                           values, the outputs' shape            ``MSELoss``
``Huber``                         values, the outputs' shape            ``HuberLoss``
``KLDivergence``                  probabilities, the outputs' shape     ``kl_div``, batchmean
================================  ====================================  ====================

The names ``"cross_entropy"`` and ``"mse"`` are the type names of ``CrossEntropy()`` and
``MSE()``, so the strings that chose a loss before keep choosing the same one. A loss of your
own is a final frozen dataclass subclassing :class:`AbstractLoss` with a type name and a
``per_example`` in ops: it trains on every backend, is checked by the kit and round-trips
through recipes.

Examples:
    >>> from unitrain import losses
    >>> loss = losses.CrossEntropy(label_smoothing=0.1, ignore_index=-100)
    >>> loss.to_dict()
    {'type': 'cross_entropy', 'label_smoothing': 0.1, 'ignore_index': -100, 'class_weights': None}
    >>> losses.loss_from_dict(loss.to_dict()) == loss
    True
"""

from unitrain.losses._base import (
    AbstractLoss,
    loss_from_dict,
    loss_types,
    mean_per_example,
    resolve_loss,
    spread_weights,
    takes_labels,
    targets_like,
    weighted_mean,
)
from unitrain.losses._classification import (
    BinaryCrossEntropyWithLogits,
    CrossEntropy,
    KLDivergence,
)
from unitrain.losses._objective import BatchView, Fields, Objective, batch_loss
from unitrain.losses._regression import MSE, Huber

__all__ = [
    "MSE",
    "AbstractLoss",
    "BatchView",
    "BinaryCrossEntropyWithLogits",
    "CrossEntropy",
    "Fields",
    "Huber",
    "KLDivergence",
    "Objective",
    "batch_loss",
    "loss_from_dict",
    "loss_types",
    "mean_per_example",
    "resolve_loss",
    "spread_weights",
    "takes_labels",
    "targets_like",
    "weighted_mean",
]
