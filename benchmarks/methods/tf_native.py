"""The hand-written TensorFlow loop: a ``tf.function`` step with a fixed input signature.

The MLP is plain ``tf.Variable`` matrices; the CNN is a Keras model called inside the
``tf.function`` (TF2's idiom). The update is SGD with momentum written in the step in torch's
form (``buf = 0.9 * buf + g; w -= lr * buf``), the rule every method here uses. Two variants:

- ``host``: batches cut from host numpy arrays with a fresh permutation per epoch (as
  :class:`unitrain.ArrayLoader` does), converted to tensors by the call;
- ``device``: the training set is a device tensor; each call gets one batch's host indices
  and gathers it inside the step (one update per call).

The epoch's loss is summed into a variable inside the step and read once per epoch.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import tensorflow as tf

from benchmarks.methods import Gate
from benchmarks.models import keras_model
from benchmarks.workloads import LEARNING_RATE, MOMENTUM, SEED, Workload, make_data

__all__ = ["train"]


def _mlp(workload: Workload) -> tuple[Any, list[tf.Variable]]:
    rng = np.random.default_rng(SEED)
    variables: list[tf.Variable] = []
    for fan_in, fan_out in zip(workload.sizes, workload.sizes[1:]):
        bound = 1.0 / np.sqrt(fan_in)
        for shape in ((fan_in, fan_out), (fan_out,)):
            variables.append(tf.Variable(rng.uniform(-bound, bound, shape).astype(np.float32)))

    def forward(inputs: tf.Tensor) -> tf.Tensor:
        h = inputs
        for i in range(0, len(variables), 2):
            h = tf.matmul(h, variables[i]) + variables[i + 1]
            if i + 2 < len(variables):
                h = tf.nn.relu(h)
        return h

    return forward, variables


def train(workload: Workload, backend: str, variant: str, gate: Gate) -> None:
    """Train with a ``tf.function`` step fed from the host or gathering on the device."""
    x, y = make_data(workload)
    if workload.kind == "mlp":
        forward, params = _mlp(workload)
    else:
        model = keras_model(workload)
        params = [v.value for v in model.trainable_variables]

        def forward(inputs: tf.Tensor) -> tf.Tensor:
            return model(inputs, training=True)

    buffers = [tf.Variable(tf.zeros_like(p)) for p in params]
    loss_sum = tf.Variable(0.0)

    def update(inputs: tf.Tensor, targets: tf.Tensor) -> None:
        with tf.GradientTape() as tape:
            logits = forward(inputs)
            loss = tf.reduce_mean(
                tf.nn.sparse_softmax_cross_entropy_with_logits(labels=targets, logits=logits)
            )
        grads = tape.gradient(loss, params)
        for p, g, buffer in zip(params, grads, buffers):
            buffer.assign(MOMENTUM * buffer + g)
            p.assign_sub(LEARNING_RATE * buffer)
        loss_sum.assign_add(loss)

    example = tf.TensorSpec([None, *x.shape[1:]], tf.as_dtype(x.dtype))
    labels = tf.TensorSpec([None, *y.shape[1:]], tf.int64)

    @tf.function(input_signature=[example, labels])
    def host_step(inputs: tf.Tensor, targets: tf.Tensor) -> None:
        update(inputs, targets)

    data_x, data_y = (tf.constant(x), tf.constant(y)) if variant == "device" else (None, None)

    @tf.function(input_signature=[tf.TensorSpec([None], tf.int64)])
    def device_step(index: tf.Tensor) -> None:
        update(tf.gather(data_x, index), tf.gather(data_y, index))

    size, steps = workload.batch_size, workload.steps_per_epoch
    for epoch in range(gate.epochs):
        order = np.random.default_rng([SEED, epoch]).permutation(len(x))
        if variant == "device":
            rows = order.reshape(steps, size)
            for i in range(steps):
                device_step(rows[i])
        else:
            for i in range(steps):
                chosen = order[i * size : (i + 1) * size]
                host_step(x[chosen], y[chosen])
        total = float(loss_sum.numpy())
        loss_sum.assign(0.0)
        gate.epoch_end(total / steps)
