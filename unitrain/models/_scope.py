"""What a layer's forward reads and writes: its parameters, its state, the mode, randomness.

Every layer computes its forward once, in :mod:`unitrain.ops`, as
``forward(self, scope, x)``. The :class:`Scope` is the layer's window on one pass through the
model: ``scope.param("weight")`` is its own parameter, ``scope.state("running_mean")`` and
``scope.set_state(...)`` its own state, ``scope.call("norm1", x)`` runs a child,
``scope.dropout(x, p)`` drops values in train mode. Names are local: the scope adds the
layer's place in the tree, so the canonical name of ``weight`` in child ``"2"`` is
``"2.weight"``.

A backend runs a whole model with :func:`apply`: it hands in the parameters and state as flat
dicts of its own arrays under canonical names, the mode, and how it draws uniform numbers, and
gets back the outputs and the new state. That is the whole of what an adapter does with a
portable model, so a layer nobody wrote an adapter for runs on every backend.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from unitrain import ops
from unitrain._errors import ConfigError

if TYPE_CHECKING:
    from unitrain.models._base import AbstractLayer

__all__ = ["Draw", "Pass", "Scope", "apply"]

#: ``draw(shape, dtype)``: uniform numbers in [0, 1) from the pass's random stream, as a
#: backend array. Each call continues the stream, in the order the layers run.
Draw = Callable[[Sequence[int], str], Any]


class Pass:
    """One forward pass through a model: what every layer's scope reads and writes.

    Args:
        params: parameters under canonical names, as the backend's arrays.
        state: model state under canonical names.
        training: train mode (dropout drops, BatchNorm uses and moves batch statistics).
        draw: the pass's uniform random numbers (see :data:`Draw`); None when nothing drops.
        after_layer: applied to every child's output (the numpy reference rounds there under
            mixed precision, as a low-precision kernel writes its output); None for none.
    """

    __slots__ = ("after_layer", "draw", "losses", "new_state", "params", "state", "training")

    def __init__(
        self,
        params: Mapping[str, Any],
        state: Mapping[str, Any],
        *,
        training: bool,
        draw: Draw | None = None,
        after_layer: Callable[[Any], Any] | None = None,
    ) -> None:
        self.params, self.state, self.training = params, state, training
        self.draw, self.after_layer = draw, after_layer
        #: The state moved in this pass, by canonical name (train mode only).
        self.new_state: dict[str, Any] = {}
        #: The loss terms layers reported in this pass (:meth:`Scope.add_loss`), in order.
        self.losses: list[Any] = []


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

        A value survives where the pass's next uniform draw is below ``1 - p``.
        """
        if not (self._pass.training and p):
            return x
        draw = self._pass.draw
        if draw is None:
            raise ConfigError(
                f"{self.layer.describe()} drops values but the backend gave this pass no "
                "random stream; a backend passes `draw` to unitrain.models.apply in train mode"
            )
        keep = 1.0 - p
        dtype = ops.dtype(x)
        mask = ops.cast(ops.less(draw(ops.shape(x), dtype), keep), dtype)
        return x * mask / ops.asarray(keep, dtype)

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
