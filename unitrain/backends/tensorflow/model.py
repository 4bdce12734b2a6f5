"""Losses, dropout keys and native models' variable names of the TensorFlow adapter.

Everything here runs inside ``tf.function`` bodies built by
:class:`unitrain.backends.tensorflow.TensorFlowBackend`.
"""

from __future__ import annotations

import os
import sys
import warnings
from collections.abc import Callable
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # before TF's C++ logging starts

import tensorflow as tf  # absolute: the framework, not this package

from unitrain import ConfigError, losses, ops
from unitrain.backends.tensorflow import ops as tf_ops
from unitrain.backends.tensorflow.layers import PortableModule
from unitrain.models import MLP
from unitrain.structure import leaves, map_leaves, split_batch

__all__ = [
    "TFMLP",
    "batch_loss_in_ops",
    "dropout_key",
    "loss_function",
    "named_variables",
    "structure_key",
    "structured_tensors",
]

#: Philox on every device, so a mask does not depend on where it was drawn.
_RNG_ALGORITHM = "philox"


class TFMLP(PortableModule):
    """Deprecated: :class:`unitrain.models.MLP` as a ``tf.Module``; use :class:`PortableModule`.

    Every portable model, the MLP included, is a :class:`PortableModule` now, with the same
    variable names (``layers.{i}.weight``/``.bias``) and the same dropout masks. Unlike the old
    class, the parameters are not cast to a low-precision input's dtype: pass
    ``compute_dtype`` to :class:`PortableModule` for that.
    """

    def __init__(self, spec: MLP, params: dict[str, Any], dtype: tf.DType) -> None:
        warnings.warn(
            "TFMLP is deprecated: use unitrain.backends.tensorflow.layers.PortableModule("
            "spec, params, {}, dtype), which runs every portable model",
            DeprecationWarning,
            stacklevel=2,
        )
        super().__init__(spec, params, {}, dtype)


def dropout_key(
    seed: int, step: tf.Tensor, micro_batch: tf.Tensor, random: str = "native"
) -> tf.Tensor:
    """A pass's dropout key, a pure function of its arguments: under ``random="native"`` a
    stateless-RNG key (shape ``[2]``, int64), under ``"portable"`` the portable key
    ``ops.random.stream_key(seed, step, micro_batch)`` (an int32 pair, the key every other
    backend derives from the same numbers).

    ``step`` and ``micro_batch`` are tensors, so a new step or micro-batch changes the key
    without retracing the compiled function that draws the masks.
    """
    if random == "portable":
        with ops.using(tf_ops):
            return ops.random.stream_key(seed, step, micro_batch)
    key = tf.constant([0, seed], tf.int64)
    key = tf.random.experimental.stateless_fold_in(key, step, alg=_RNG_ALGORITHM)
    return tf.random.experimental.stateless_fold_in(key, micro_batch, alg=_RNG_ALGORITHM)


def named_variables(model: Any) -> dict[str, Any]:
    """Name the variables of a native model by where they sit in it.

    A Keras model's variables are named by their ``path`` with ``/`` written as ``.``
    (``sequential/dense/kernel`` -> ``sequential.dense.kernel``). Keras makes layer names
    unique per process (``dense``, ``dense_1``, ...), so a checkpoint loads into a model built
    the same way in a fresh process, or into one whose layers were given explicit names. A plain
    ``tf.Module``'s variables are named by the attribute path that ``tf.Module`` itself walks
    to collect ``variables`` (``self.layers[0].w`` -> ``layers.0.w``). Non-trainable variables
    (normalisation statistics, Keras seed-generator states) are part of the model state too.
    """
    keras = sys.modules.get("keras")
    if keras is not None and isinstance(model, keras.layers.Layer):
        if not model.variables:
            raise ConfigError(
                "the Keras model has no variables yet; build it first (call it on one batch "
                "or give it an Input) so unitrain can name its weights"
            )
        # The tf.Variable under each Keras variable: one kind of variable for the whole backend.
        found = [(v.path.replace("/", "."), v.value) for v in model.variables]
    elif isinstance(model, tf.Module):
        walk = model._flatten(  # the walk tf.Module.variables uses, with the attribute path
            predicate=lambda v: isinstance(v, tf.Variable), with_path=True
        )
        found = [(".".join(str(part) for part in path), v) for path, v in walk]
        if not found:
            raise ConfigError(f"the tf.Module {type(model).__name__} has no tf.Variables")
    else:
        raise ConfigError(
            "the tensorflow backend trains a unitrain.models model, a Keras model or a tf.Module "
            f"with __call__(x, training=...), got {type(model).__name__}"
        )
    variables = dict(found)
    if len(variables) < len(found):
        names = [name for name, _ in found]
        repeated = sorted({name for name in names if names.count(name) > 1})
        raise ConfigError(f"two model variables share the name(s) {repeated}; rename the layers")
    return variables


def loss_function(loss: Any) -> tuple[Callable[[Any, Any], tf.Tensor], bool]:
    """Return ``(loss(outputs, targets) -> batch loss, takes class labels)`` for a
    :mod:`unitrain.losses` loss, its type name, or a native callable.

    A loss runs its own code in ops, traced by these ops into the ``tf.function`` s, except
    plain :class:`~unitrain.losses.CrossEntropy`, which keeps TensorFlow's fused kernel
    (held to the loss's code by the kit).
    """
    loss = losses.resolve_loss(loss)
    if not isinstance(loss, losses.AbstractLoss):
        return loss, False  # a native callable
    if loss == losses.CrossEntropy():
        return _cross_entropy, True
    written = loss

    def generic(outputs: Any, targets: Any) -> tf.Tensor:
        with ops.using(tf_ops):  # while tracing: the graph holds TensorFlow's ops alone
            result: tf.Tensor = written(outputs, targets)
        return result

    return generic, loss.takes_labels


def _cross_entropy(logits: tf.Tensor, labels: tf.Tensor) -> tf.Tensor:
    """The mean over every position of TensorFlow's fused softmax cross-entropy."""
    per_position = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits)
    return tf.reduce_mean(per_position)


def structured_tensors(batch: Any, dtype: tf.DType) -> tuple[Any, tuple[Any, ...]]:
    """A structured batch (tuples or dicts of arrays, sample weights) as tensors: integer
    leaves as int64 (token ids, labels, masks), booleans as they are, the others in
    ``dtype``. Returns the inputs and the whole batch as a tuple (``(x, y)`` or ``(x, y, w)``:
    no None, which a traced signature cannot hold), which :func:`batch_loss_in_ops` reads."""

    def tensor(leaf: Any) -> tf.Tensor:
        value = tf.convert_to_tensor(leaf)
        if value.dtype.is_floating and value.dtype != dtype:
            return tf.cast(value, dtype)
        if value.dtype.is_integer and value.dtype != tf.int64:
            return tf.cast(value, tf.int64)
        return value

    inputs, targets, weight = split_batch(batch)
    x = map_leaves(tensor, inputs)
    whole = (x, map_leaves(tensor, targets))
    return x, whole if weight is None else (*whole, tensor(weight))


def batch_loss_in_ops(loss: Any, out: Any, whole: Any, terms: Any) -> tf.Tensor:
    """:func:`unitrain.losses.batch_loss` under TensorFlow's ops; ``whole`` is the batch as
    :func:`structured_tensors` gives it, or the plain targets."""
    inputs, targets, weight = (
        split_batch(whole) if isinstance(whole, tuple) else (None, whole, None)
    )
    with ops.using(tf_ops):
        result: tf.Tensor = losses.batch_loss(loss, out, inputs, targets, weight, terms)
    return result


def structure_key(tree: Any, unknown: int) -> tuple[Any, ...]:
    """What a traced function of a structured batch is keyed by: every leaf's path, dtype
    and shape past its first ``unknown`` axes."""
    return tuple((path, leaf.dtype, tuple(leaf.shape[unknown:])) for path, leaf in leaves(tree))
