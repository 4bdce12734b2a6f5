"""Any portable model as one pure JAX function: the core's forward, traced on JAX's ops.

Every layer's computation is written once, in :mod:`unitrain.ops` (``AbstractLayer.forward``),
so this adapter keeps no function per layer type: a :class:`PortableModule` runs
:func:`unitrain.models.apply` inside ``ops.using(unitrain.backends.jax.ops)``. That happens
while ``jax.jit`` traces, so the Python walk through the layers costs nothing per step, and
a layer the adapter has never heard of, a user's own included, trains like a built-in one.

Parameters and state are flat dicts under the canonical names, in JAX's own layouts (images
NHWC, conv kernels HWIO, dense weights ``(in, out)``): nothing is renamed or transposed.

Matmul precision: :mod:`.ops` computes products at the precision the caller chose with
``jax.default_matmul_precision`` (the backend's compiled functions choose the run's
``matmul_precision``, for dense layers, attention and convolutions alike, as torch's option
covers cuDNN's convolutions too) and at ``HIGHEST`` when none is chosen.

``PortableModule`` is the name of this concept in every adapter's ``layers`` module (torch's
``nn.Module``, TensorFlow's ``tf.Module``); JAX has no module object, so here it is the pure
apply function itself, called with the parameters and state it does not hold. It was
``layers_apply(model, random)``, which still works, with a deprecation warning.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp

from unitrain import ops
from unitrain.backends.common.renamed import renamed_getattr
from unitrain.backends.jax import ops as jax_ops
from unitrain.models import MLP, AbstractLayer, Pass, apply

__all__ = ["PortableModule"]

#: The names this module used to give its builder (``PortableModule`` was ``layers_apply``).
RENAMED = {"layers_apply": "PortableModule"}


class PortableModule:
    """``apply(params, state, x, *, train, rng) -> (outputs, new_state)`` of ``model``.

    ``params`` and ``state`` are flat dicts under canonical names; ``rng`` is the pass's
    dropout key (None in eval mode, or when nothing drops). ``new_state`` holds every state
    tensor: moved by the batch in train mode, unchanged in eval mode. A list passed as
    ``terms`` receives the loss terms the layers reported (``scope.add_loss``), traced.

    ``random="portable"`` (what the backend uses by default): ``rng`` is the portable key of
    the pass (:func:`.model.portable_dropout_key`), from which each dropout site derives its
    own key (see :mod:`unitrain.models`' scope): the masks of every other backend.

    ``random="native"`` (this class's default, as its ``rng`` was always a JAX key):
    ``rng`` is a JAX key and the ``k``-th draw of a pass, in the order the layers run, is
    ``jax.random.uniform(jax.random.fold_in(rng, k), shape, dtype)`` in the dropped value's
    dtype. ``k`` counts from 1, except in a bare :class:`~unitrain.models.MLP`, whose masks
    were always keyed by the hidden layer's index from 0: both kept, so seeded runs and
    their checkpoints reproduce.

    Examples:
        >>> import jax.numpy as jnp
        >>> from unitrain.models import MLP
        >>> spec = MLP((4, 8, 3))
        >>> out, state = PortableModule(spec)(
        ...     spec.init_params(0), {}, jnp.zeros((2, 4)), train=False, rng=None
        ... )
        >>> out.shape, state
        ((2, 3), {})
    """

    def __init__(self, model: AbstractLayer, random: str = "native") -> None:
        self.model, self.random = model, random
        self._first = 0 if isinstance(model, MLP) else 1

    def __call__(
        self,
        params: Mapping[str, jax.Array],
        state: Mapping[str, jax.Array],
        x: jax.Array,
        *,
        train: bool,
        rng: Any,
        terms: list[Any] | None = None,
    ) -> tuple[jax.Array, dict[str, jax.Array]]:
        portable = rng is not None and self.random == "portable"
        draw = None if rng is None or portable else _uniform_stream(rng, self._first)
        run = Pass(params, state, training=train, draw=draw, key=rng if portable else None)
        with ops.using(jax_ops):
            result = apply(self.model, x, run)
        if terms is not None:  # the loss terms the layers reported (scope.add_loss)
            terms.extend(run.losses)
        return result


def _uniform_stream(rng: jax.Array, first: int) -> Callable[[Sequence[int], str], jax.Array]:
    """``draw(shape, dtype)``: the pass's uniform numbers, a new key folded in per call."""
    counter = itertools.count(first)

    def draw(shape: Sequence[int], dtype: str) -> jax.Array:
        key = jax.random.fold_in(rng, next(counter))
        return jax.random.uniform(key, tuple(shape), jnp.dtype(dtype))

    return draw


__getattr__ = renamed_getattr(__name__, RENAMED, globals())
