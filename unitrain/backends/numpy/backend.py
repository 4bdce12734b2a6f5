"""The numpy reference backend: small, obviously correct, and the oracle of parity checks.

It trains any :mod:`unitrain.models` architecture, a user's own layers included, by running
the core's forward (:func:`unitrain.models.apply`) under the reference's own ops
(:mod:`unitrain.backends.numpy.ops`), in float32 or float64: a train pass tracks the
parameters, so the outputs carry a graph of the ops that made them, each with a hand-written
vector-Jacobian product checked against finite differences, and backward sweeps it. The update
is the reference optimizer rule of :mod:`unitrain.optim`. Nothing here is fast; every line is
meant to be checked by reading it. Unlike the other adapters it keeps no faster optimizer forms:
each optimizer's own update, run by these ops (``reference_update``), *is* the rule, so every
optimizer, a third party's included, has its oracle here.

Mixed precision is emulated the way mixed-precision kernels compute, for every layer alike: the
parameters a pass reads, its input and every layer's output (and, backwards, every gradient flowing
between layers and each parameter gradient of a pass) are rounded to the compute dtype, products are
accumulated in float32, the loss is computed in float32, and the gradients land in float32 master
buffers. ``"16-mixed"`` runs the loss scaler of :mod:`unitrain.backends.precision`; a scaled
gradient past float16's range rounds to inf there, as on the frameworks, and the update is skipped.
"""

from __future__ import annotations

import functools
import importlib.metadata
from collections.abc import Mapping
from typing import Any

import numpy as np

from unitrain import ConfigError, losses, ops, optim
from unitrain.backends.numpy import _tape
from unitrain.backends.numpy import ops as numpy_ops
from unitrain.backends.numpy.ops import Tracked, value_of
from unitrain.backends.numpy.precision import LossScale, round_between_layers, rounding
from unitrain.backends.precision import compute_dtype, require_precision
from unitrain.backends.protocol import (
    BackendOptions,
    Batch,
    Capabilities,
    UpdateNumbers,
    check_state,
    split_state,
)
from unitrain.models import AbstractLayer, Draw, InputCheck, Pass, apply
from unitrain.structure import first_leaf, is_structured, map_leaves

__all__ = ["NumpyBackend"]


class NumpyBackend:
    """Reference implementation of the :class:`unitrain.backends.protocol.Backend` protocol."""

    name = "numpy"
    #: This backend's module of the unitrain.ops contract (the PortableOps protocol).
    ops = numpy_ops
    capabilities = Capabilities(
        devices=("cpu",),
        dtypes=("float32", "float64"),
        portable_layers=True,
        precisions={"cpu": ("32", "bf16-mixed", "16-mixed")},
    )

    @staticmethod
    def available_devices() -> tuple[str, ...]:
        """Always the CPU."""
        return ("cpu",)

    def __init__(self, model: AbstractLayer, options: BackendOptions | None = None) -> None:
        if not isinstance(model, AbstractLayer):
            raise ConfigError(
                "the numpy backend trains unitrain.models architectures only, "
                f"got {type(model).__name__}"
            )
        self.options = options = optim.bind_options(options or BackendOptions(), model)
        if options.device not in ("cpu", "auto"):
            raise ConfigError(
                f"the numpy backend runs on 'cpu' only, got device={options.device!r}"
            )
        if options.dtype not in self.capabilities.dtypes:
            raise ConfigError(
                f"the numpy backend trains in {self.capabilities.dtypes}, "
                f"got dtype={options.dtype!r}"
            )
        #: The loss, written in ops (:mod:`unitrain.losses`): these ops run it in float64.
        self.loss = losses.resolve_loss(options.loss)
        if not isinstance(self.loss, losses.AbstractLoss):
            raise ConfigError(
                "the numpy backend computes losses written in unitrain.ops (a unitrain.losses "
                f"loss or its type name), got the native callable {self.loss!r}"
            )
        require_precision(self.name, self.capabilities.precisions["cpu"], options.precision, "cpu")
        if options.precision != "32" and options.dtype != "float32":
            raise ConfigError(f"precision={options.precision!r} needs dtype='float32'")
        #: Rounds to the compute dtype under mixed precision; None in "32".
        self._rounding = rounding(compute_dtype(options.precision))
        #: The loss scaler (active under "16-mixed").
        self.loss_scale = LossScale(options)
        self.model, self.dtype = model, np.dtype(options.dtype)
        self.params = model.init_params(options.seed, self.dtype)
        self.model_state = model.init_state(self.dtype)
        self.opt_state = optim.init_state(options.optimizer, self.params)
        self.grads = {k: np.zeros_like(v) for k, v in self.params.items()}
        self._input_check = InputCheck(model)
        #: The last train forward's loss and its tracked parameters by name, for backward.
        self._graph: tuple[Any, dict[str, Tracked]] | None = None
        self._tracked: dict[str, Tracked] = {}
        self._numbers = UpdateNumbers()  # the dropout key's (step, micro_batch)
        self._skipped = 0
        #: Whether every loss since the last step was finite (a step with one that is not is
        #: skipped, as one with a non-finite gradient is).
        self._losses_finite = True
        #: Whether the loss reads the whole batch (an objective), and the loss terms the
        #: layers reported in the last pass.
        self._reads_batch = bool(getattr(self.loss, "reads_batch", False))
        self._terms: list[Any] = []

    @property
    def device(self) -> str:
        """Always ``"cpu"``."""
        return "cpu"

    @property
    def skipped_steps(self) -> int:
        """Updates skipped because a loss or gradient was not finite."""
        return self._skipped

    # -- computation ---------------------------------------------------------------------

    def _run(self, x: Any, train: bool, key: tuple[int, int] = (0, 0)) -> Any:
        """The model's outputs for ``x``; a train pass returns them tracked, keeps its
        parameters for :meth:`backward` and moves the model state, its dropout keyed by
        ``key``: ``(step, micro_batch)``.

        Under mixed precision the pass reads the parameters and the input rounded to the
        compute dtype (the float32 master copies stay untouched) and rounds every layer's
        output, the model's own included.
        """
        self._input_check(x)
        low = self._rounding
        if is_structured(x):
            x = map_leaves(functools.partial(self._leaf, low), x)
        elif self._input_check.tokens:
            x = np.asarray(x)
        else:
            x = np.asarray(x, self.dtype) if low is None else low(np.asarray(x, self.dtype))
        params: dict[str, Any] = self.params
        if low is not None:
            params = {k: low(v) for k, v in params.items()}
        after = None if low is None else functools.partial(round_between_layers, low)
        if train:  # the parameters become the leaves of the graph backward sweeps
            params = {name: Tracked(value) for name, value in params.items()}
        draw, stream = self._random(*key) if train else (None, None)
        run = Pass(
            params, self.model_state, training=train, draw=draw, key=stream, after_layer=after
        )
        out, state = self._apply(x, run)
        if after is not None:
            out = map_leaves(after, out)
        self._terms = run.losses
        if not train:
            return map_leaves(value_of, out)
        self.model_state, self._tracked = state, params
        return out

    def _leaf(self, low: Any, leaf: Any) -> np.ndarray:
        """A leaf of a structured batch as the model reads it: integers stay integers (token
        ids, masks), anything else in the parameters' dtype (rounded under mixed precision)."""
        array = np.asarray(leaf)
        if array.dtype.kind in "iub":
            return array
        array = array.astype(self.dtype)
        return array if low is None else low(array)

    def _apply(self, x: Any, run: Pass) -> tuple[Any, dict[str, Any]]:
        """The core's forward of the model under the reference's ops: ``(outputs, state)``.

        The class's ``ops`` module: a subclass that swaps one op for another runs it."""
        with ops.using(self.ops):
            return apply(self.model, x, run)

    def _dropout_seed(self, step: int, micro_batch: int) -> list[int]:
        """What a pass's dropout masks are drawn from: ``(seed, step, micro_batch)``."""
        return [self.options.seed, step, micro_batch]

    def _random(self, step: int, micro_batch: int) -> tuple[Draw | None, Any]:
        """A train pass's ``(draw, key)``: the portable key ``ops.random.stream_key(
        *_dropout_seed(...))`` (a host array: the reference's site keys and draws are
        numpy's), or under ``random="native"`` the native :meth:`_draw`."""
        if self.options.random == "native":
            return self._draw(step, micro_batch), None
        return None, ops.random.host_stream_key(*self._dropout_seed(step, micro_batch))

    def _draw(self, step: int, micro_batch: int) -> Draw:
        """The native uniform numbers: one generator seeded by :meth:`_dropout_seed`, drawn
        by the layers in the order they run, made at the first draw (a pass that drops
        nothing makes none).

        The numbers are float64 whatever the dtype, as the reference has always drawn them,
        so a seeded run keeps its masks.
        """
        seed, generator = self._dropout_seed(step, micro_batch), None

        def draw(shape: Any, dtype: str) -> np.ndarray:
            nonlocal generator
            if generator is None:
                generator = np.random.default_rng(seed)
            return generator.random(tuple(shape))

        return draw

    def _loss(self, out: Any, y: Any, batch: Batch | None = None) -> Any:
        """The batch's loss of ``out`` (tracked in a train pass, so backward differentiates
        it), computed by the loss's own code under these ops, plus the terms layers reported.

        Every batch's targets are checked first (a DataError): the Trainer checks a native
        loader's first batch only, and indexing would read label ``-1`` as the last class.
        A structured batch, sample weights, an objective or reported terms go through
        :func:`unitrain.losses.batch_loss`, whose targets are leaves as they come.
        """
        if batch is not None and (
            len(batch) == 3
            or self._terms
            or is_structured(out)
            or is_structured(y)
            or self._reads_batch
        ):
            inputs = map_leaves(functools.partial(self._leaf, None), batch[0])
            targets = map_leaves(functools.partial(self._leaf, None), y)
            weight = None if len(batch) < 3 or batch[2] is None else self._leaf(None, batch[2])
            if not self._reads_batch and not is_structured(out) and not is_structured(y):
                self.loss.check_targets(np.asarray(y), value_of(out).shape[1:], "a batch")
            with ops.using(self.ops):
                return losses.batch_loss(self.loss, out, inputs, targets, weight, self._terms)
        targets = np.asarray(y)
        self.loss.check_targets(targets, value_of(out).shape[1:], "a batch")
        if targets.dtype.kind == "f":
            targets = targets.astype(self.dtype)
        with ops.using(self.ops):
            return self.loss(out, targets)

    # NaN and Inf are the Trainer's to handle (step skips the update, the policy decides), so
    # numpy's floating-point warnings about them are silenced: they would only be noise, or
    # errors under ``-W error``. The other backends' frameworks do not warn either.

    def forward(
        self, batch: Batch, *, step: int | None = None, micro_batch: int | None = None
    ) -> Any:
        """Run in train mode and keep the graph for backward; return the mean loss."""
        x, y = batch[0], batch[1]
        key = self._numbers.forward(step, micro_batch)
        with np.errstate(all="ignore"):
            loss = self._loss(self._run(x, train=True, key=key), y, batch)
        self._graph = (loss, self._tracked)  # backward starts from the loss
        value = value_of(loss)[()]
        self._losses_finite &= bool(np.isfinite(value))
        return value

    def backward(self, scale: float = 1.0) -> None:
        """Backpropagate the last loss and add ``scale`` times its gradients to the buffers."""
        with np.errstate(all="ignore"):
            self._backward(scale)

    def _backward(self, scale: float) -> None:
        if self._graph is None:
            raise ConfigError("backward() needs a forward() in train mode first")
        if self.loss_scale.active:
            scale = scale * float(self.loss_scale.scale)  # a power of two: exact
        loss, tracked = self._graph
        grads = _tape.backpropagate([loss], [np.asarray(scale, self.dtype)])
        low = self._rounding
        for name, leaf in tracked.items():
            grad = grads.get(id(leaf))
            if grad is not None:
                # Under mixed precision this pass's parameter gradient is rounded to the
                # compute dtype, as a low-precision kernel writes it, before it is added to
                # the float32 buffer.
                self.grads[name] += grad if low is None else low(grad)

    def step(self, lr: float) -> None:
        """Clip, check for a non-finite loss or gradient, apply the reference update, zero
        the grads."""
        if self.loss_scale.active:
            for g in self.grads.values():
                g *= np.float32(1.0) / self.loss_scale.scale  # unscale; exact, the scale is 2**k
        with np.errstate(all="ignore"):
            norm = optim.global_norm(self.grads)
        # A loss can overflow where its gradient does not (a huge mse target).
        finite = bool(np.isfinite(norm)) and self._losses_finite
        self.loss_scale.advance(np.bool_(finite))
        if not finite:
            self._skipped += 1
        else:
            if self.options.grad_clip_norm is not None:
                optim.clip_by_global_norm(self.grads, self.options.grad_clip_norm)
            optim.apply_update(self.options.optimizer, self.params, self.grads, self.opt_state, lr)
        for g in self.grads.values():
            g.fill(0)
        self._numbers.updated()
        self._losses_finite, self._graph = True, None

    def evaluate(self, batch: Batch) -> dict[str, Any]:
        """Mean loss (and accuracy for classification) in eval mode: no dropout, the running
        statistics used and left unchanged."""
        x, y = batch[0], batch[1]
        with np.errstate(all="ignore"):
            out = self._run(x, train=False)
            loss = value_of(self._loss(out, y, batch))[()]
        metrics = {"loss": loss}
        if self.loss.takes_labels:  # the first output against the first target
            out, y = first_leaf(out), first_leaf(y)
            labels = np.asarray(y).reshape(out.shape[:-1])
            metrics["accuracy"] = np.mean(out.argmax(axis=-1) == labels)
        return metrics

    def predict(self, inputs: Any) -> np.ndarray:
        """The model's outputs for ``inputs`` in eval mode."""
        with np.errstate(all="ignore"):
            out = self._run(inputs, train=False)
        return out

    #: The array functions metrics use (see :meth:`outputs`).
    array_ops = np

    def outputs(self, batch: Batch) -> tuple[Any, Any]:
        """Eval-mode outputs and the targets, for metrics (structures as they come)."""
        return self.predict(batch[0]), map_leaves(np.asarray, batch[1])

    # -- state -----------------------------------------------------------------------------

    def state_dict(self) -> dict[str, np.ndarray]:
        """Copies of the parameters, model state and optimizer state under canonical names."""
        state = {f"model.{k}": v.copy() for k, v in (self.params | self.model_state).items()}
        state.update({f"optimizer.{k}": np.array(v) for k, v in self.opt_state.items()})
        state.update({f"optimizer.{k}": v for k, v in self.loss_scale.state().items()})
        return state

    def load_state_dict(self, state: Mapping[str, np.ndarray]) -> None:
        """Replace parameters, model state, optimizer state and the loss scaler's state;
        names and shapes must match."""
        check_state(self.state_dict(), state)
        model, opt = split_state(state)
        self.loss_scale.load(opt)
        self.params = {k: np.array(model[k], self.dtype) for k in self.params}
        self.model_state = {k: np.array(model[k], self.dtype) for k in self.model_state}
        self.opt_state = {
            k: np.array(v, np.int64 if k == "step" else self.dtype) for k, v in opt.items()
        }
        self._numbers.loaded(int(self.opt_state["step"]))
        self._losses_finite = True

    def rng_state(self) -> dict[str, Any]:
        """Nothing: dropout masks come from ``(seed, step, micro_batch)``."""
        return {}

    def set_rng_state(self, state: Mapping[str, Any]) -> None:
        """Nothing to restore."""

    def versions(self) -> dict[str, str]:
        """numpy's version."""
        return {"numpy": importlib.metadata.version("numpy")}
