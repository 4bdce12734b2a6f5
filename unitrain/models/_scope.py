"""What a layer's forward reads and writes: its parameters, its state, the mode, randomness.

Every layer computes its forward once, in :mod:`unitrain.ops`, as
``forward(self, scope, x)``. The :class:`Scope` is the layer's window on one pass through the
model: ``scope.param("weight")`` is its own parameter, ``scope.state("running_mean")`` and
``scope.set_state(...)`` its own state, ``scope.call("norm1", x)`` runs a child,
``scope.dropout(x, p)`` drops values in train mode. Names are local: the scope adds the
layer's place in the tree, so the canonical name of ``weight`` in child ``"2"`` is
``"2.weight"``.

A backend runs a whole model with :func:`apply`: it hands in the parameters and state as flat
dicts of its own arrays under canonical names, the mode, and the pass's random stream, and
gets back the outputs and the new state. That is the whole of what an adapter does with a
portable model, so a layer nobody wrote an adapter for runs on every backend.

Randomness: a train pass carries a ``key``, ``ops.random.stream_key(seed, step,
micro_batch)``, and each random site (a ``scope.dropout`` call, a ``scope.random_key()``)
gets its own key folded in from it: the number of the site is the CRC-32 of the layer's
canonical path (``"blocks.1.attention"``) times ``2**31``, plus how many draws that path has
already made in this pass. So a site's numbers depend on where the layer sits in the model,
not on how many other layers drew before it, and they are the same bits on every backend
(:mod:`unitrain.ops.random`). A backend whose generator is the framework's own passes
``draw`` instead (see :data:`Draw`): its masks are its own.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from unitrain import ops
from unitrain._errors import ConfigError

if TYPE_CHECKING:
    from unitrain.models._base import AbstractLayer

__all__ = ["Draw", "Pass", "Scope", "apply", "site_number"]

#: ``draw(shape, dtype)``: uniform numbers in [0, 1) from a framework's own generator, as a
#: backend array (the ``"native"`` generator). Each call continues the stream, in the order
#: the layers run.
Draw = Callable[[Sequence[int], str], Any]


class Pass:
    """One forward pass through a model: what every layer's scope reads and writes.

    Args:
        params: parameters under canonical names, as the backend's arrays.
        state: model state under canonical names.
        training: train mode (dropout drops, BatchNorm uses and moves batch statistics).
        draw: the native generator's uniform numbers (see :data:`Draw`); None when the
            pass has a ``key`` or nothing drops.
        key: the pass's portable key (``ops.random.stream_key(seed, step, micro_batch)``):
            a numpy int32 array when the numbers are known on the host (the site keys are
            then derived there, and only the draws run on the backend), or the backend's own
            array (inside a compiled step). None: no portable stream.
        kept: how the backend computes a portable dropout mask, ``kept(site_key, keep, x)``
            -> ``ops.random.bernoulli(site_key, keep, shape of x)``, the same bits (a fused
            kernel, say); None: ``ops.random.bernoulli`` itself.
        after_layer: applied to every child's output (the numpy reference rounds there under
            mixed precision, as a low-precision kernel writes its output); None for none.
        units: how the backend runs a sharding unit (:meth:`AbstractLayer.sharding_units`),
            by its canonical path: ``units[path](compute, *inputs)`` returns
            ``compute(*inputs)``, the layer's forward, run between gathering the unit's
            parameters into ``params`` and freeing them (torch runs it inside the unit's
            FSDP module); None: the parameters are all in ``params`` for the whole pass.
    """

    __slots__ = (
        "after_layer",
        "draw",
        "draws",
        "keep_mask",
        "key",
        "losses",
        "new_state",
        "params",
        "state",
        "training",
        "units",
    )

    def __init__(
        self,
        params: Mapping[str, Any],
        state: Mapping[str, Any],
        *,
        training: bool,
        draw: Draw | None = None,
        key: Any = None,
        kept: Callable[[Any, float, Any], Any] | None = None,
        after_layer: Callable[[Any], Any] | None = None,
        units: Mapping[str, Callable[..., Any]] | None = None,
    ) -> None:
        self.params, self.state, self.training = params, state, training
        self.draw, self.key, self.after_layer = draw, key, after_layer
        self.units = units
        self.keep_mask = kept
        #: How many site keys each canonical path took in this pass.
        self.draws: dict[str, int] = {}
        #: The state moved in this pass, by canonical name (train mode only).
        self.new_state: dict[str, Any] = {}
        #: The loss terms layers reported in this pass (:meth:`Scope.add_loss`), in order.
        self.losses: list[Any] = []

    def site_key(self, path: str) -> Any:
        """The key of the next random site of the layer at ``path`` (see the module's
        docstring), as an array of the active backend."""
        occurrence = self.draws.get(path, 0)
        self.draws[path] = occurrence + 1
        number = site_number(path, occurrence)
        if isinstance(self.key, np.ndarray):  # known on the host: derive it there, cheaply
            with ops.using("numpy"):
                derived = ops.random.fold_in(self.key, number)
            return ops.asarray(derived, "int32")
        return ops.random.fold_in(self.key, number)


class Scope:
    """A layer's view of a pass: its own parameters and state by local name, its children.

    Created by :func:`apply` and by :meth:`call`; a layer never builds one.
    """

    __slots__ = ("_pass", "_prefix", "layer")

    def __init__(self, layer: AbstractLayer, run: Pass, prefix: str = "") -> None:
        self.layer, self._pass, self._prefix = layer, run, prefix

    @property
    def training(self) -> bool:
        """Whether this is a train-mode pass."""
        return self._pass.training

    def name(self, local: str) -> str:
        """The canonical name of this layer's own parameter or state ``local``."""
        return f"{self._prefix}.{local}" if self._prefix else local

    def param(self, local: str) -> Any:
        """This layer's own parameter ``local`` (as declared in ``own_param_shapes``)."""
        prefix = self._prefix  # name() inlined: this runs for every parameter of every pass
        try:
            return self._pass.params[f"{prefix}.{local}" if prefix else local]
        except KeyError:
            raise self._unknown("parameter", local, self.layer.own_param_shapes()) from None

    def state(self, local: str) -> Any:
        """This layer's own state ``local``: its value moved earlier in this pass, if it was,
        else its value before the pass."""
        name = self.name(local)
        moved = self._pass.new_state.get(name)
        if moved is not None:
            return moved
        try:
            return self._pass.state[name]
        except KeyError:
            raise self._unknown("state", local, self.layer.own_state_shapes()) from None

    def set_state(self, local: str, value: Any) -> None:
        """Move this layer's own state ``local`` to ``value`` (train mode only; no gradient
        flows through state)."""
        if not self._pass.training:
            raise ConfigError(
                f"{self.layer.describe()} set its state {local!r} in eval mode; evaluation "
                "never changes the state: move it only when scope.training is true"
            )
        self.state(local)  # an unknown name is an error here, not at the next checkpoint
        self._pass.new_state[self.name(local)] = ops.stop_gradient(value)

    def child(self, name: str) -> Scope:
        """The scope of child ``name`` (as :meth:`AbstractLayer.children` names it)."""
        layer = self.layer.child(name)
        if layer is not None:  # a child named "" is transparent: it shares this prefix
            return type(self)(layer, self._pass, self.name(name) if name else self._prefix)
        names = [local for local, _ in self.layer.children()]
        raise ConfigError(f"{self.layer.describe()} has no child {name!r}; its children: {names}")

    def call(self, name: str, *inputs: Any) -> Any:
        """Run child ``name`` on ``inputs`` and return its output."""
        layer = self.layer.child(name)
        if layer is None:
            return self.child(name)  # raises: no such child
        run, prefix = self._pass, self._prefix  # child() inlined: a call per layer per pass
        joined = (f"{prefix}.{name}" if prefix else name) if name else prefix
        child = type(self)(layer, run, joined)  # the caller's kind: a Scope subclass stays one
        units = run.units
        if units is not None and name and joined in units:  # "": a transparent child
            out = units[joined](lambda *xs: layer.forward(child, *xs), *inputs)
        else:
            out = layer.forward(child, *inputs)
        after = run.after_layer
        return out if after is None else after(out)

    def add_loss(self, term: Any) -> None:
        """Report a scalar ``term`` (a KL divergence, an activity penalty) that the batch's
        loss adds to the objective's value, in train and eval mode alike (as Keras adds a
        layer's ``add_loss``). Under data parallelism each worker's term is weighted like its
        loss, so a term that is a mean over the batch's examples stays one."""
        if len(ops.shape(term)) != 0:
            raise ConfigError(
                f"{self.layer.describe()} reported a loss term of shape {ops.shape(term)}; "
                "scope.add_loss takes a scalar: reduce the term (ops.mean, ops.sum) first"
            )
        self._pass.losses.append(term)

    def dropout(self, x: Any, p: float) -> Any:
        """``x`` with each value zeroed with probability ``p`` in train mode and the
        survivors scaled by ``1 / (1 - p)``; ``x`` itself in eval mode or when ``p`` is 0.

        With the portable generator a value survives where
        ``ops.random.bernoulli(site_key, 1 - p, shape)`` is true: an integer comparison of
        the top 24 bits, so the mask is the same whatever the compute dtype (bfloat16,
        float16, float64) and on every backend. With a native ``draw``, where its uniform
        number is below ``1 - p``.
        """
        if not (self._pass.training and p):
            return x
        keep = 1.0 - p
        dtype = ops.dtype(x)
        if self._pass.key is not None:
            site_key, fused = self._pass.site_key(self._prefix), self._pass.keep_mask
            if fused is None:
                kept = ops.random.bernoulli(site_key, keep, ops.shape(x))
            else:
                kept = fused(site_key, keep, x)
        elif self._pass.draw is not None:
            kept = ops.less(self._pass.draw(ops.shape(x), dtype), keep)
        else:
            raise self._no_stream("drops values")
        return x * ops.cast(kept, dtype) / ops.asarray(keep, dtype)

    def random_key(self) -> Any:
        """A fresh key for this layer's own draws in this train pass (``ops.random.normal(
        scope.random_key(), shape)`` for a VAE's noise): each call gives the next key of the
        layer's site, the same bits on every backend."""
        if self._pass.key is None:
            raise self._no_stream("asked for a random key")
        return self._pass.site_key(self._prefix)

    def _no_stream(self, what: str) -> ConfigError:
        return ConfigError(
            f"{self.layer.describe()} {what} but the backend gave this pass no random stream; "
            "a backend passes `key` (or a native `draw`) to unitrain.models.Pass in train "
            "mode (see docs/writing-a-backend.md, 'Dropout keys')"
        )

    def _unknown(self, kind: str, local: str, declared: Mapping[str, Any]) -> ConfigError:
        return ConfigError(
            f"{self.layer.describe()} read {kind} {local!r}, which it does not declare; "
            f"declared: {list(declared)}"
        )


def apply(
    model: AbstractLayer,
    x: Any,
    run: Pass,
) -> tuple[Any, dict[str, Any]]:
    """Run ``model`` forward on ``x`` within ``run``; return ``(outputs, new_state)``.

    ``new_state`` holds every state tensor under its canonical name: moved by this pass where
    a layer moved it, else as it was. The caller runs this inside ``ops.using(its ops)``.
    """
    out = model.forward(Scope(model, run), x)
    return out, {**run.state, **run.new_state}


def site_number(path: str, occurrence: int) -> int:
    """The number folded into a pass's key for draw ``occurrence`` (from 0) of the layer at
    canonical ``path``: ``crc32(path) * 2**31 + occurrence``.

    >>> site_number("", 0), site_number("blocks.0.attention", 1)
    (0, 1337300709707612161)
    """
    return (zlib.crc32(path.encode()) << 31) | occurrence
