"""The hand-written JAX loop: one ``jax.jit`` step with optax, its state donated.

Two variants:

- ``host``: batches cut from host numpy arrays with a fresh permutation per epoch (as
  :class:`unitrain.ArrayLoader` does) and passed to the jitted step, which copies them in;
- ``device``: the whole training set is put on the device once; each call gets the host
  indices of one batch and gathers it inside the jitted step (one update per call).

The epoch's loss is summed inside the jitted step (no extra dispatch) and read once per epoch.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from benchmarks.methods import Gate
from benchmarks.models import jax_model
from benchmarks.workloads import LEARNING_RATE, MOMENTUM, SEED, Workload, make_data

__all__ = ["train"]


def train(workload: Workload, backend: str, variant: str, gate: Gate) -> None:
    """Train with a jitted, donated one-step function, fed from the host or the device."""
    x, y = make_data(workload)
    y = y.astype(np.int32)
    apply, params = jax_model(workload)
    optimizer = optax.sgd(LEARNING_RATE, momentum=MOMENTUM)

    def loss_fn(p: Any, inputs: Any, targets: Any) -> Any:
        log_probs = jax.nn.log_softmax(apply(p, inputs))
        # Sequence logits (N, L, V) are averaged over every token, as unitrain does.
        return -jnp.mean(jnp.take_along_axis(log_probs, targets[..., None], axis=-1))

    def update(state: Any, inputs: Any, targets: Any) -> Any:
        p, opt_state, loss_sum = state
        loss, grads = jax.value_and_grad(loss_fn)(p, inputs, targets)
        updates, opt_state = optimizer.update(grads, opt_state, p)
        return optax.apply_updates(p, updates), opt_state, loss_sum + loss

    @functools.partial(jax.jit, donate_argnums=0)
    def host_step(state: Any, inputs: Any, targets: Any) -> Any:
        return update(state, inputs, targets)

    @functools.partial(jax.jit, donate_argnums=0)
    def device_step(state: Any, data: Any, index: Any) -> Any:
        return update(state, data[0][index], data[1][index])

    params = jax.device_put(params)
    state = (params, optimizer.init(params), jnp.zeros((), jnp.float32))
    data = jax.device_put((x, y)) if variant == "device" else None
    size, steps = workload.batch_size, workload.steps_per_epoch
    for epoch in range(gate.epochs):
        order = np.random.default_rng([SEED, epoch]).permutation(len(x))
        if variant == "device":
            rows = order.astype(np.int32).reshape(steps, size)
            for i in range(steps):
                state = device_step(state, data, rows[i])
        else:
            for i in range(steps):
                chosen = order[i * size : (i + 1) * size]
                state = host_step(state, x[chosen], y[chosen])
        loss_sum = float(state[2])  # the one sync of the epoch
        state = (state[0], state[1], jnp.zeros((), jnp.float32))
        gate.epoch_end(loss_sum / steps)
