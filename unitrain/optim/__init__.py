"""Optimizers as data: frozen, JSON-serialisable descriptions with one numpy reference each.

The reference follows PyTorch's published formulas, because they are the ones most papers
state. Keras and optax differ in places (Keras keeps the LR inside the SGD momentum buffer and
puts Adam's epsilon outside the bias correction; optax evaluates bias corrections in
float32), so each backend implements *this* math, natively where the framework already
agrees and by hand where it does not. The learning rate is never part of an optimizer: it
comes from the schedule, one float per update.

Each optimizer declares its per-parameter state (:attr:`AbstractOptimizer.state_slots`),
stored as ``<param>.<slot>`` beside an int64 ``step`` counting the updates applied:

==========  ==========================================================
optimizer    state slots
==========  ==========================================================
SGD          ``momentum`` (only when ``momentum > 0``)
Adam/AdamW   ``exp_avg``, ``exp_avg_sq``
RMSprop      ``square_avg``; ``momentum`` (when ``momentum > 0``); ``grad_avg`` (centered)
Lion         ``exp_avg``
Adadelta     ``square_avg``, ``acc_delta``
Adagrad      ``sum``
==========  ==========================================================

Every slot starts at zero, which gives exactly PyTorch's "buffer = gradient on the first
step", so there is no special first-step state to carry.

Options may differ per group of parameters, chosen by name pattern or layer type
(:class:`Group`): the first group that selects a parameter gives its options, with a
learning-rate multiplier; the state layout is the same for every group.

Examples:
    >>> from unitrain import optim
    >>> spec = optim.AdamW(weight_decay=0.05)
    >>> spec.to_dict()
    {'type': 'adamw', 'beta1': 0.9, 'beta2': 0.999, 'eps': 1e-08, 'weight_decay': 0.05}
    >>> optim.optimizer_from_dict(spec.to_dict()) == spec
    True
"""

from unitrain.optim._adadelta import Adadelta
from unitrain.optim._adagrad import Adagrad
from unitrain.optim._adam import AbstractAdam, Adam, AdamW
from unitrain.optim._base import (
    CLIP_EPSILON,
    AbstractOptimizer,
    apply_update,
    bias_correction,
    clip_by_global_norm,
    global_norm,
    implementation,
    init_state,
    optimizer_from_dict,
    optimizer_types,
    written_in_ops,
)
from unitrain.optim._groups import (
    Group,
    ParameterGroup,
    bind_options,
    each_parameter_rule,
    for_model,
    parameter_groups,
)
from unitrain.optim._lion import Lion
from unitrain.optim._rmsprop import RMSprop
from unitrain.optim._sgd import SGD

#: Any optimizer description (kept as a name for annotations written before the base class).
Optimizer = AbstractOptimizer

__all__ = [
    "CLIP_EPSILON",
    "SGD",
    "AbstractAdam",
    "AbstractOptimizer",
    "Adadelta",
    "Adagrad",
    "Adam",
    "AdamW",
    "Group",
    "Lion",
    "Optimizer",
    "ParameterGroup",
    "RMSprop",
    "apply_update",
    "bias_correction",
    "bind_options",
    "clip_by_global_norm",
    "for_model",
    "global_norm",
    "implementation",
    "init_state",
    "optimizer_from_dict",
    "optimizer_types",
    "each_parameter_rule",
    "parameter_groups",
    "written_in_ops",
]
