"""The jitted pure functions of the JAX backend, built once per configuration and shared.

Only what changes the program is static: the model, the loss, the optimizer description, the
matmul precision, the compute dtype and loss-scaling rule of mixed precision, whether
gradients are clipped and how a non-finite update is skipped.
Everything that may change between calls is a traced argument — the learning rate, the
gradient scale, the update counter and micro-batch index of the dropout key, and the
:class:`Settings` (seed, clip norm) — so none of them recompiles, and backends that differ
only in seed or clip bound share one compiled program. :func:`functions` caches the set per
configuration, so a resumed run or the conformance kit's many backends reuse the code.
"""

from __future__ import annotations

import collections
import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from unitrain import losses, ops, optim
from unitrain.backends.jax import ops as jax_ops
from unitrain.backends.jax.layers import PortableModule
from unitrain.backends.jax.model import dropout_key, loss_function, portable_dropout_key
from unitrain.backends.jax.optimizers import guarded_update, optimizer_for
from unitrain.backends.jax.precision import (
    MATMUL_ALGORITHMS,
    advance_scaler,
    cast_floats,
    initial_exponent,
    scale_of,
)
from unitrain.backends.precision import LossScaler
from unitrain.structure import first_leaf

__all__ = [
    "APPLIED",
    "GOOD_STEPS",
    "KEY_STEP",
    "SCALE_EXPONENT",
    "SKIPPED",
    "DeviceState",
    "Functions",
    "Settings",
    "functions",
    "initial_counters",
    "settings",
]


class DeviceState(NamedTuple):
    """Everything an update reads and writes, kept on the device and donated to each update.

    The counters share one array (each leaf of the donated state costs ~0.7 µs per call):
    ``[APPLIED]`` updates applied (the optimizer's step), ``[SKIPPED]`` updates skipped
    for a non-finite loss or gradient, ``[CURSOR]`` the next slot of ``losses`` that
    ``train_step`` writes (see :mod:`.losslog`), under ``"16-mixed"`` the loss scaler's state:
    ``[SCALE_EXPONENT]`` ``log2`` of the scale, ``[GOOD_STEPS]`` consecutive finite updates;
    and ``[KEY_STEP]`` the dropout key's step, which every update advances, skipped or not,
    as the caller's ``step`` does (the backend sets it when the caller's differs: a resume).
    ``model_state`` is the model's non-trainable state (an empty dict for a model without any).
    """

    params: Any
    model_state: Any
    opt_state: Any
    counters: jax.Array  # int32[6]
    losses: jax.Array  # float32[losslog.SIZE]


APPLIED, SKIPPED, CURSOR, SCALE_EXPONENT, GOOD_STEPS, KEY_STEP = 0, 1, 2, 3, 4, 5


def initial_counters(scaler: LossScaler | None = None) -> np.ndarray:
    """The ``counters`` leaf of a new :class:`DeviceState`, on the host."""
    counters = np.zeros(KEY_STEP + 1, np.int32)
    if scaler is not None:
        counters[SCALE_EXPONENT] = initial_exponent(scaler)
    return counters


class Settings(NamedTuple):
    """Per-backend constants passed as traced arguments, so they never cost a compile."""

    seed: Any  # uint32[2]: the seed's low and high words
    clip_norm: Any  # float32 scalar: the global-norm bound (+inf, unused, when not clipping)


def settings(seed: int, clip_norm: float | None) -> Settings:
    """:class:`Settings` as host arrays (the functions of a run without clipping ignore the
    bound; they are built with ``clipping=False``)."""
    words = np.array([seed & 0xFFFFFFFF, (seed >> 32) & 0xFFFFFFFF], np.uint32)
    bound = np.float32(np.inf if clip_norm is None else clip_norm)
    return Settings(words, np.asarray(bound))


class Functions(NamedTuple):
    """The jitted functions of one configuration, and how many times each was traced."""

    init_opt_state: Any  # params -> the optimizer state (moment buffers)
    trace_counts: collections.Counter[str]
    forward: Any
    backward: Any
    accumulate: Any
    step: Any
    train_step: Any
    train_steps: Any
    train_steps_on_device: Any
    evaluate: Any
    predict: Any


def build_functions(
    model: Any,
    loss: Any,
    optimizer_spec: optim.Optimizer,
    precision: str | None = None,
    clipping: bool = True,
    branch: bool = False,
    compute_dtype: str | None = None,
    scaler: LossScaler | None = None,
    random: str = "portable",
) -> Functions:
    """Jit the pure functions for ``model``: a portable description or a native stateful apply.

    Donation: every update donates the :class:`DeviceState` it replaces, and ``accumulate``
    donates the gradient buffers it adds into, so XLA updates them in place.

    ``precision`` (a ``matmul_precision`` name) is the matmul precision of every function,
    None leaving JAX's default. It is applied while tracing, so it is baked into the compiled
    programs: no call pays for entering a config context, and the caller's own setting
    cannot change them.
    ``clipping=False`` leaves gradient clipping out (the bound in :class:`Settings` is then
    unused); ``branch`` picks how a non-finite update is skipped (see
    :func:`~.optimizers.guarded_update`). ``compute_dtype`` (``"bfloat16"``, ``"float16"``)
    computes forward and backward in that dtype over float32 master weights, and ``scaler``
    adds dynamic loss scaling (see :mod:`.precision`). ``random`` is the generator of a
    portable model's dropout (``BackendOptions.random``); a native model gets a JAX key.
    """
    apply = model if callable(model) else PortableModule(model, random)
    pass_key = dropout_key if callable(model) or random == "native" else portable_dropout_key
    loss_fn, classification = loss_function(loss)
    optimizer_at = optimizer_for(optimizer_spec)
    counts: collections.Counter[str] = collections.Counter()

    def jit(fn: Any, **options: Any) -> Any:
        if precision is None:
            return jax.jit(fn, **options)
        algorithm = MATMUL_ALGORITHMS[precision]

        @functools.wraps(fn)
        def traced(*args: Any) -> Any:
            with jax.default_matmul_precision(algorithm):
                return fn(*args)

        return jax.jit(traced, **options)

    portable = not callable(model)

    def run_model(params: Any, model_state: Any, x: Any, train: bool, key: Any) -> Any:
        """``(outputs, new state, terms)``: the loss terms the layers reported (none from a
        native model), all traced into the caller's function."""
        terms: list[Any] = []
        extra = {"terms": terms} if portable else {}
        outputs, new_state = apply(params, model_state, x, train=train, rng=key, **extra)
        return outputs, new_state, terms

    def batch_loss(outputs: Any, y: Any, terms: list[Any]) -> Any:
        """The loss of ``outputs``: the plain loss function on ``(x, y)`` batches, else
        :func:`unitrain.losses.batch_loss` (``y`` a ``BatchView`` of the whole batch)."""
        if type(y) is not losses.BatchView and not terms:
            return loss_fn(outputs, y)
        view = y if type(y) is losses.BatchView else losses.BatchView(None, y)
        with ops.using(jax_ops):
            return losses.batch_loss(
                losses.resolve_loss(loss),
                outputs,
                view.inputs,
                view.targets,
                view.sample_weight,
                terms,
            )

    def train_loss(
        params: Any, model_state: Any, x: Any, y: Any, cfg: Settings, step: Any, micro: Any
    ) -> tuple[Any, Any]:
        """``(loss, new model state)``: the state is the auxiliary output of the gradient."""
        key = pass_key(cfg.seed, step, micro)
        if compute_dtype is None:
            outputs, new_state, terms = run_model(params, model_state, x, True, key)
            return batch_loss(outputs, y, terms), new_state
        params, x = cast_floats((params, x), compute_dtype)
        outputs, new_state, terms = run_model(params, model_state, x, True, key)
        # Model state (BatchNorm statistics) stays in its float32 master dtype, as parameters do.
        new_state = jax.tree.map(lambda new, old: new.astype(old.dtype), new_state, model_state)
        return batch_loss(as_float32(outputs), y, terms), new_state

    def loss_scale(counters: Any) -> Any:
        """What the loss is multiplied by before differentiation: 1 unless scaling."""
        return jnp.float32(1.0) if scaler is None else scale_of(counters[SCALE_EXPONENT])

    def update(
        state: DeviceState, grads: Any, lr: Any, cfg: Settings, loss: Any = None
    ) -> DeviceState:
        """Apply ``grads`` unless they (or ``loss``, when given) are not finite."""
        if scaler is not None:  # unscale (exact: a power of two) before clipping
            inverse = 1.0 / loss_scale(state.counters)
            grads = jax.tree.map(lambda g: g * inverse, grads)
        params, opt_state, finite = guarded_update(
            optimizer_at,
            state.params,
            state.opt_state,
            grads,
            lr,
            cfg.clip_norm if clipping else None,
            branch=branch,
            loss=loss,
        )
        counters = state.counters
        if scaler is not None:
            exponent, good = advance_scaler(
                scaler, counters[SCALE_EXPONENT], counters[GOOD_STEPS], finite
            )
            counters = counters.at[SCALE_EXPONENT].set(exponent).at[GOOD_STEPS].set(good)
        finite = finite.astype(jnp.int32)
        zero = jnp.int32(0)
        counters = counters + jnp.stack([finite, 1 - finite, zero, zero, zero, jnp.int32(1)])
        return DeviceState(params, state.model_state, opt_state, counters, state.losses)

    def fused(state: DeviceState, x: Any, y: Any, lr: Any, cfg: Settings) -> tuple[Any, Any]:
        # micro_batch 0: the fused path only runs with no forward pending.
        step, scale = state.counters[KEY_STEP], loss_scale(state.counters)

        def objective(params: Any) -> tuple[Any, Any]:
            loss, model_state = train_loss(params, state.model_state, x, y, cfg, step, 0)
            return (loss if scaler is None else loss * scale), (loss, model_state)

        (_, (loss, model_state)), grads = jax.value_and_grad(objective, has_aux=True)(state.params)
        return update(state._replace(model_state=model_state), grads, lr, cfg, loss), loss

    def forward(
        params: Any, model_state: Any, x: Any, y: Any, cfg: Settings, counters: Any, micro: Any
    ) -> Any:
        """``(loss, vjp, new model state)``."""
        counts["forward"] += 1
        step = counters[KEY_STEP]
        return jax.vjp(
            lambda p: train_loss(p, model_state, x, y, cfg, step, micro), params, has_aux=True
        )

    def pulled_back(vjp: Any, loss: Any, scale: Any, counters: Any) -> Any:
        """The gradients, NaN where ``loss`` is not finite: ``step`` sees only gradients, and
        a loss can be NaN while they are finite (a label out of range)."""
        grads = vjp(scale * loss_scale(counters))[0]
        poison = jnp.where(jnp.isfinite(loss), 0.0, jnp.nan)
        return jax.tree.map(lambda g: g + poison.astype(g.dtype), grads)

    def backward(vjp: Any, loss: Any, scale: Any, counters: Any) -> Any:
        counts["backward"] += 1
        return pulled_back(vjp, loss, scale, counters)

    def accumulate(vjp: Any, loss: Any, grads: Any, scale: Any, counters: Any) -> Any:
        counts["accumulate"] += 1
        return jax.tree.map(jnp.add, grads, pulled_back(vjp, loss, scale, counters))

    def step(state: DeviceState, grads: Any, lr: Any, cfg: Settings) -> DeviceState:
        counts["step"] += 1
        return update(state, grads, lr, cfg)

    def train_step(state: DeviceState, x: Any, y: Any, lr: Any, cfg: Settings) -> DeviceState:
        counts["train_step"] += 1
        new, loss = fused(state, x, y, lr, cfg)
        cursor = state.counters[CURSOR]
        losses = new.losses.at[cursor].set(loss)
        counters = new.counters.at[CURSOR].set((cursor + 1) % losses.shape[0])
        return new._replace(counters=counters, losses=losses)

    def train_steps(state: DeviceState, xs: Any, ys: Any, lrs: Any, cfg: Settings) -> Any:
        counts["train_steps"] += 1
        return jax.lax.scan(lambda s, xyl: fused(s, *xyl, cfg), state, (xs, ys, lrs))

    def train_steps_on_device(
        state: DeviceState, data: tuple[Any, Any], indices: Any, lrs: Any, cfg: Settings
    ) -> Any:
        counts["train_steps_on_device"] += 1

        def body(s: DeviceState, index_and_lr: tuple[Any, Any]) -> tuple[Any, Any]:
            index, lr = index_and_lr  # the gather runs inside the loop: one batch at a time
            return fused(s, data[0][index], data[1][index], lr, cfg)

        return jax.lax.scan(body, state, (indices, lrs))

    def eval_outputs(params: Any, model_state: Any, x: Any) -> tuple[Any, list[Any]]:
        """Eval-mode outputs (in the compute dtype under mixed precision, read as float32)
        and the loss terms reported."""
        if compute_dtype is not None:
            params, x = cast_floats((params, x), compute_dtype)
        outputs, _, terms = run_model(params, model_state, x, False, None)  # state unchanged
        return as_float32(outputs), terms

    def predict(params: Any, model_state: Any, x: Any) -> Any:
        return eval_outputs(params, model_state, x)[0]

    def evaluate(params: Any, model_state: Any, x: Any, y: Any) -> dict[str, Any]:
        counts["evaluate"] += 1
        outputs, terms = eval_outputs(params, model_state, x)
        metrics = {"loss": batch_loss(outputs, y, terms)}
        if classification:  # the first output against the first target
            first, labels = first_leaf(outputs), first_leaf(_targets(y))
            hits = jnp.argmax(first, axis=-1) == labels
            metrics["accuracy"] = jnp.mean(hits, dtype=jnp.float32)
        return metrics

    return Functions(
        init_opt_state=optimizer_at(np.float32(0)).init,
        trace_counts=counts,
        forward=jit(forward),
        backward=jit(backward),
        accumulate=jit(accumulate, donate_argnums=2),
        step=jit(step, donate_argnums=0),
        train_step=jit(train_step, donate_argnums=0),
        train_steps=jit(train_steps, donate_argnums=0),
        train_steps_on_device=jit(train_steps_on_device, donate_argnums=0),
        evaluate=jit(evaluate),
        predict=jit(predict),
    )


def as_float32(outputs: Any) -> Any:
    """Every output in float32 (the loss's dtype under mixed precision)."""
    return jax.tree.map(lambda out: out.astype(jnp.float32), outputs)


def _targets(y: Any) -> Any:
    """The targets of a jit argument: ``y`` itself, or a ``BatchView``'s."""
    return y.targets if type(y) is losses.BatchView else y


_cached_functions = functools.lru_cache(maxsize=16)(build_functions)


def functions(model: Any, loss: Any, optimizer_spec: optim.Optimizer, **options: Any) -> Functions:
    """:func:`build_functions`, cached per model, loss, optimizer and ``options``."""
    try:
        return _cached_functions(model, loss, optimizer_spec, **options)
    except TypeError:  # an unhashable native model or loss: compile for this backend alone
        return build_functions(model, loss, optimizer_spec, **options)
