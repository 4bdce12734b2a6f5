"""Any portable model as one ``tf.Module``: canonical variables, the core's forward on TF ops.

Every layer's computation is written once, in :mod:`unitrain.ops`
(``AbstractLayer.forward``), so the adapter needs no code per layer type: a
:class:`PortableModule` holds a model's parameters (trainable ``tf.Variable``) and state
(non-trainable, e.g. BatchNorm statistics) under their canonical names, in the canonical
layouts, which are TensorFlow's own (images NHWC, conv filters HWIO, dense weights
``(in, out)``), and runs :func:`unitrain.models.apply` on this backend's ops. A layer the
adapter has never heard of, a user's own included, trains like a built-in one. Calling it in
training mode assigns the moved state, as torch's forward does; eval mode changes nothing.

``PortableModule`` is the name of this concept in every adapter's ``layers`` module, so a
reader of one adapter finds it in the others (torch's is an ``nn.Module``, JAX's the pure
apply function). It was ``TFPortable``, which still works, with a deprecation warning.
"""

from __future__ import annotations

import itertools
from typing import Any

import tensorflow as tf

from unitrain import ops
from unitrain.backends.common.renamed import renamed_getattr
from unitrain.backends.tensorflow import ops as tensorflow_ops
from unitrain.models import MLP, AbstractLayer, Draw, Pass, apply

__all__ = ["PortableModule"]

#: The names this module used to give its classes (``PortableModule`` was ``TFPortable``).
RENAMED = {"TFPortable": "PortableModule"}

#: Philox on every device, so a mask does not depend on where it was drawn.
_RNG_ALGORITHM = "philox"


class PortableModule(tf.Module):
    """A portable model (:mod:`unitrain.models`) as a ``tf.Module`` with canonical variables.

    Args:
        spec: the model; its ``forward`` computes the output (in :mod:`unitrain.ops`).
        params: initial parameters under canonical names (``spec.init_params(seed)``).
        state: initial state under canonical names (``spec.init_state()``).
        dtype: the variables' dtype.
        compute_dtype: under mixed precision, the dtype the parameters are read in (the caller
            casts the inputs); None computes in ``dtype``.
        random: the generator of the dropout masks (``BackendOptions.random``): under
            ``"portable"`` a call's ``key`` is the pass's portable key and each dropout site
            derives its own from it (the masks of every other backend); under ``"native"``
            it is a stateless-RNG key and the masks are TensorFlow's Philox draws.

    Examples:
        >>> import tensorflow as tf
        >>> from unitrain.models import MLP
        >>> spec = MLP((4, 8, 3))
        >>> module = PortableModule(spec, spec.init_params(0), spec.init_state(), tf.float32)
        >>> list(module.named_variables())
        ['layers.0.weight', 'layers.0.bias', 'layers.1.weight', 'layers.1.bias']
        >>> module(tf.zeros([2, 4])).shape
        TensorShape([2, 3])
    """

    def __init__(
        self,
        spec: AbstractLayer,
        params: dict[str, Any],
        state: dict[str, Any],
        dtype: tf.DType,
        compute_dtype: tf.DType | None = None,
        random: str = "native",
    ) -> None:
        super().__init__(name="portable")
        self.spec, self.compute_dtype, self.random = spec, compute_dtype, random
        self.params = {k: tf.Variable(v, dtype=dtype, name=k) for k, v in params.items()}
        self.state = {
            k: tf.Variable(v, dtype=dtype, trainable=False, name=k) for k, v in state.items()
        }
        # The k-th mask of a pass is keyed by k + first_mask - 1. The MLP was a module of its
        # own that numbered its masks by hidden layer from 0; other models counted from 1.
        # Kept, so that seeded runs draw the masks they always drew.
        self._first_mask = 0 if isinstance(spec, MLP) else 1

    def named_variables(self) -> dict[str, tf.Variable]:
        """Parameters under canonical names, in ``spec.param_shapes()`` order."""
        return dict(self.params)

    def named_state(self) -> dict[str, tf.Variable]:
        """Model state (non-trainable) under canonical names."""
        return dict(self.state)

    def __call__(self, x: tf.Tensor, training: bool = False, key: tf.Tensor | None = None) -> Any:
        """Outputs of ``x``; training mode moves the state and, with a ``key`` (shape ``[2]``,
        see :func:`.model.dropout_key`), drops values out. A train pass with no key has no
        random stream: a layer that drops values then raises."""
        params: dict[str, Any] = self.params
        if self.compute_dtype is not None:
            # The float32 master variables read in the compute dtype; their gradients come
            # back in float32 through the cast. The state stays float32 (the core's norm
            # layers take their statistics in float32).
            params = {k: tf.cast(v, self.compute_dtype) for k, v in params.items()}
        portable = key is not None and self.random == "portable"
        draw = None if key is None or portable else _stateless_draw(key, self._first_mask)
        run = Pass(
            params,
            self.state,
            training=training,
            draw=draw,
            key=key if portable else None,
            kept=_fused_keep_mask if portable else None,
        )
        with ops.using(tensorflow_ops):
            out, _ = apply(self.spec, x, run)
        for name, value in run.new_state.items():  # gradient-stopped by Scope.set_state
            self.state[name].assign(value)
        # The loss terms the layers reported in this pass (``scope.add_loss``), read by the
        # backend in the same trace; set in __dict__, which tf.Module would otherwise track.
        self.__dict__["reported_losses"] = run.losses
        return out


@tf.function(jit_compile=True, autograph=False)
def _fused_keep_mask(key: tf.Tensor, keep: float, like: tf.Tensor) -> tf.Tensor:
    """``ops.random.bernoulli(key, keep, shape of like)`` compiled by XLA into one kernel: the
    same bits, without the ~135 separate integer ops of Threefry-2x32-20 that TensorFlow's
    graph executor would otherwise run one by one (2.4x the step time of a small Transformer
    with dropout on a CPU)."""
    with ops.using(tensorflow_ops):
        return ops.random.bernoulli(key, keep, ops.shape(like))


def _stateless_draw(key: tf.Tensor, first: int) -> Draw:
    """A pass's uniform numbers: the k-th call folds ``first + k - 1`` into ``key``.

    Stateless, so the masks need no random state of their own and a resumed run draws the same
    ones; in the array's own dtype, as the masks always were drawn.
    """
    index = itertools.count(first)

    def draw(shape: Any, dtype: str) -> tf.Tensor:
        seed = tf.random.experimental.stateless_fold_in(key, next(index), alg=_RNG_ALGORITHM)
        return tf.random.stateless_uniform(shape, seed=seed, dtype=dtype, alg=_RNG_ALGORITHM)

    return draw


__getattr__ = renamed_getattr(__name__, RENAMED, globals())
