"""GPU speed of unitrain against hand-written loops at the same precision, in the same run.

For each framework (torch, jax) and workload it times, interleaved:

- ``native`` loops (torch eager + ``torch.optim.SGD``; ``jax.jit`` + optax) and
  ``Trainer.fit`` at ``matmul_precision`` "highest" and "high" (TF32);
- mixed precision: a native bfloat16 loop (torch autocast; jax casts parameters and
  floating inputs inside the loss) and unitrain ``precision="bf16-mixed"`` and
  ``"16-mixed"``, both at "highest".

The workloads (SGD momentum 0.9, cross-entropy; the models are the benchmark suite's own,
``benchmarks/models.py`` and ``benchmarks/paper_models.py``, so unitrain trains the portable
description and the native loops the same network written in the framework):

- W1: MLP 784-256-256-10, batch 128; W3: MLP 1024-4096-4096-10, batch 512;
- LeNet: the portable LeNet-5 widened for 32x32x3 images (conv 3x3 32-64, tanh, average
  pooling, dense 512-256-10), batch 256;
- Transformer: the portable pre-LN character LM on ``pydoc_data.topics``, 4 blocks of dim 256
  with 8 heads, 128 tokens x batch 32;
- W0 (only when asked for, ``ONLY=W0``): MLP 32-32-32-10, batch 32, whose compute is
  negligible, so a step's time is the host's (dispatch, copies, bookkeeping): on a GPU that
  is what the device waits for when the host is the bottleneck, and on the CPU (``DEV=cpu``)
  it is the one figure of this script worth measuring.

Both sides get the same host numpy arrays (``benchmarks.workloads.make_data``), shuffled per
epoch and copied to the device per batch (what ``fit((x, y))`` does); the first epoch is a
warm-up. One JSON line per measurement (median and minimum microseconds per step over the
timed epochs), then one per comparison: unitrain / native at equal precision, and mixed /
float32 "highest".

Usage, with the package importable (``PYTHONPATH`` pointing at an install of it)::

    python benchmarks/gpu_bench.py [torch] [jax]

Environment: ``DEV`` (``gpu``, or ``cpu`` to try it here), ``STEPS`` (steps per epoch, by
default 200 for W1, 100 for W3 and LeNet, 50 for the Transformer), ``EPOCHS`` (4), ``REPS``
(interleaved repetitions, 2), ``ONLY`` (e.g. ``W3,Transformer``), ``NONDETERMINISTIC`` (set:
also unitrain with ``deterministic=False`` at float32 "highest", to see what deterministic
kernels cost), ``DEVICE_DATA`` (set: also unitrain with ``data_on_device=True``, the training
set on the GPU and each batch gathered there, at float32 "highest" and bf16-mixed: what the
host's per-step gather and copy cost).
"""

from __future__ import annotations

import dataclasses
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

if __package__ in (None, ""):  # run as a script: make the repository's benchmarks importable
    # Last, so that ``unitrain`` is the installed package (PYTHONPATH): the checkout's source
    # folder lacks the mapped-in ``unitrain.backends`` and would shadow it.
    sys.path.append(str(Path(__file__).resolve().parents[1]))

from benchmarks import models
from benchmarks.methods.unitrain import build_trainer
from benchmarks.workloads import (
    LEARNING_RATE,
    MOMENTUM,
    Workload,
    make_data,
    torch_inputs,
)

DEVICE = os.environ.get("DEV", "gpu")
EPOCHS = int(os.environ.get("EPOCHS", 4))


def _workload(
    name: str, kind: str, sizes: tuple[int, ...], shape: tuple[int, ...], batch: int, steps: int
) -> Workload:
    """A GPU-sized workload of ``steps`` batches (its timed segments are this script's epochs)."""
    return Workload(name, kind, sizes, shape, batch, steps, EPOCHS, EPOCHS)


WORKLOADS = {
    workload.name: workload
    for workload in (
        _workload("W0", "mlp", (32, 32, 32, 10), (32,), 32, 500),
        _workload("W1", "mlp", (784, 256, 256, 10), (784,), 128, 200),
        _workload("W3", "mlp", (1024, 4096, 4096, 10), (1024,), 512, 100),
        _workload("LeNet", "lenet", (32, 64, 512, 256, 10), (32, 32, 3), 256, 100),
        _workload("Transformer", "transformer", (256, 4, 8), (128,), 32, 50),
    )
}
#: What runs when ``ONLY`` is not set.
DEFAULT = ("W1", "W3", "LeNet", "Transformer")
#: (matmul_precision, precision): what each framework is timed in.
VARIANTS = (
    ("highest", "32"),
    ("high", "32"),
    ("highest", "bf16-mixed"),
    ("highest", "16-mixed"),
)


def _record(
    fw: str, name: str, method: str, variant: tuple[str, str], times: list[float], steps: int
) -> dict[str, Any]:
    per_step = [t / steps for t in times[1:]] or [t / steps for t in times]
    row = {
        "fw": fw,
        "workload": name,
        "method": method,
        "matmul_precision": variant[0],
        "precision": variant[1],
        "us_per_step": round(statistics.median(per_step) * 1e6, 1),
        "min_us": round(min(per_step) * 1e6, 1),
    }
    print(json.dumps(row), flush=True)
    return row


def unitrain_fit(
    fw: str,
    workload: Workload,
    variant: tuple[str, str],
    deterministic: bool = True,
    data_on_device: bool = False,
) -> list[float]:
    """Seconds per epoch of ``Trainer.fit`` (epoch end waits for the device: loss read)."""
    times: list[float] = []

    class Clock:
        def on_epoch_begin(self, trainer: Any, epoch: int) -> None:
            self.started = time.perf_counter()

        def on_epoch_end(self, trainer: Any, epoch: int, logs: dict[str, Any]) -> None:
            float(logs["loss"])
            times.append(time.perf_counter() - self.started)

    trainer = build_trainer(
        workload,
        fw,
        "default",
        EPOCHS,
        [Clock()],
        device=DEVICE,
        matmul_precision=variant[0],
        precision=variant[1],
        deterministic=deterministic,
        data_on_device=data_on_device,
        log_every_n_steps=10**6,
    )
    trainer.fit(make_data(workload))
    return times


def torch_native(workload: Workload, variant: tuple[str, str]) -> list[float] | None:
    """Seconds per epoch of a plain torch loop; None for a precision it does not write."""
    import torch
    import torch.nn.functional as F

    if variant[1] == "16-mixed":
        return None  # a GradScaler loop is another rule; unitrain's fp16 is compared to bf16
    torch.set_float32_matmul_precision(variant[0])
    device = torch.device("cuda" if DEVICE == "gpu" else "cpu")
    x, y = torch_inputs(workload)
    model = models.torch_model(workload).to(device).train()
    optimizer = torch.optim.SGD(model.parameters(), lr=LEARNING_RATE, momentum=MOMENTUM)
    autocast = variant[1] == "bf16-mixed"
    rng, batch, times = np.random.default_rng(0), workload.batch_size, []
    for _ in range(EPOCHS):
        started = time.perf_counter()
        order = rng.permutation(len(x))
        total = torch.zeros((), device=device)
        for i in range(workload.steps_per_epoch):
            index = order[i * batch : (i + 1) * batch]
            xb = torch.from_numpy(x[index]).to(device, non_blocking=True)
            yb = torch.from_numpy(y[index]).to(device, non_blocking=True)
            optimizer.zero_grad(set_to_none=True)
            with torch.autocast(device.type, torch.bfloat16, enabled=autocast):
                # Sequence logits (N, L, V) are averaged over every token, as unitrain does.
                loss = F.cross_entropy(model(xb).flatten(0, -2), yb.flatten())
            loss.backward()
            optimizer.step()
            total += loss.detach()
        float(total)
        times.append(time.perf_counter() - started)
    return times


def jax_native(workload: Workload, variant: tuple[str, str]) -> list[float] | None:
    """Seconds per epoch of a plain ``jax.jit`` + optax loop; None where it has no twin."""
    import jax
    import jax.numpy as jnp
    import optax

    if variant[1] == "16-mixed":
        return None
    algorithm = {"highest": "float32", "high": "tensorfloat32"}[variant[0]]
    compute = jnp.bfloat16 if variant[1] == "bf16-mixed" else jnp.float32
    device = jax.devices("gpu" if DEVICE == "gpu" else "cpu")[0]
    x, y = make_data(workload)
    y = y.astype(np.int32)
    apply, params = models.jax_model(workload)
    params = jax.device_put(params, device)
    optimizer = optax.sgd(LEARNING_RATE, momentum=MOMENTUM)
    state = optimizer.init(params)

    def low(tree: Any) -> Any:  # floating leaves in the compute dtype; token ids stay ints
        floating = lambda a: jnp.issubdtype(a.dtype, jnp.floating)  # noqa: E731
        return jax.tree.map(lambda a: a.astype(compute) if floating(a) else a, tree)

    def loss_fn(p: Any, xb: Any, yb: Any) -> Any:
        logits = apply(low(p), low(xb)).astype(jnp.float32)
        return optax.softmax_cross_entropy_with_integer_labels(logits, yb).mean()

    @jax.jit
    def step(p: Any, s: Any, xb: Any, yb: Any) -> Any:
        # The bfloat16 loop sets no precision: its matmuls have bfloat16 operands, and this
        # keeps it a plain bfloat16 loop whatever the setting does to such operands.
        with jax.default_matmul_precision(None if compute == jnp.bfloat16 else algorithm):
            loss, grads = jax.value_and_grad(loss_fn)(p, xb, yb)
        updates, s = optimizer.update(grads, s, p)
        return optax.apply_updates(p, updates), s, loss

    rng, batch, times = np.random.default_rng(0), workload.batch_size, []
    for _ in range(EPOCHS):
        started = time.perf_counter()
        order = rng.permutation(len(x))
        losses = []
        for i in range(workload.steps_per_epoch):
            index = order[i * batch : (i + 1) * batch]
            params, state, loss = step(params, state, x[index], y[index])
            losses.append(loss)
        float(sum(losses))
        times.append(time.perf_counter() - started)
    return times


NATIVE: dict[str, Callable[[Workload, tuple[str, str]], list[float] | None]] = {
    "torch": torch_native,
    "jax": jax_native,
}


def _comparisons(rows: list[dict[str, Any]]) -> None:
    """Print unitrain / native per variant, and each unitrain variant / its float32 highest."""
    best: dict[tuple[str, ...], float] = {}
    for row in rows:
        key = (row["fw"], row["workload"], row["method"], row["matmul_precision"], row["precision"])
        best[key] = min(best.get(key, float("inf")), row["us_per_step"])
    for (fw, name, method, matmul, precision), us in sorted(best.items()):
        if not method.startswith("unitrain"):
            continue
        native = best.get((fw, name, "native", matmul, precision))
        baseline = best.get((fw, name, "unitrain", "highest", "32"))
        print(
            json.dumps(
                {
                    "fw": fw,
                    "workload": name,
                    "method": method,
                    "matmul_precision": matmul,
                    "precision": precision,
                    "unitrain_over_native": None if native is None else round(us / native, 3),
                    "speedup_over_float32_highest": None
                    if baseline is None
                    else round(baseline / us, 2),
                }
            ),
            flush=True,
        )


def selected() -> list[Workload]:
    """The workloads ``ONLY`` names (default :data:`DEFAULT`), ``STEPS`` applied."""
    names = os.environ.get("ONLY", ",".join(DEFAULT)).split(",")
    unknown = sorted(set(names) - set(WORKLOADS))
    if unknown:
        raise SystemExit(f"ONLY: unknown workloads {unknown}; choose from {sorted(WORKLOADS)}")
    steps = os.environ.get("STEPS")
    return [
        WORKLOADS[name]
        if steps is None
        else dataclasses.replace(WORKLOADS[name], steps_per_epoch=int(steps))
        for name in names
    ]


def main(frameworks: list[str]) -> None:
    """Time every framework, workload and variant; print the rows and the comparisons."""
    reps = int(os.environ.get("REPS", 2))
    rows = []
    for fw in frameworks:
        for workload in selected():
            name, steps = workload.name, workload.steps_per_epoch
            for _ in range(reps):  # interleaved, so drift hits both sides alike
                for variant in VARIANTS:
                    native = NATIVE[fw](workload, variant)
                    if native is not None:
                        rows.append(_record(fw, name, "native", variant, native, steps))
                    times = unitrain_fit(fw, workload, variant)
                    rows.append(_record(fw, name, "unitrain", variant, times, steps))
                    if os.environ.get("NONDETERMINISTIC") and variant == VARIANTS[0]:
                        times = unitrain_fit(fw, workload, variant, deterministic=False)
                        method = "unitrain_nondeterministic"
                        rows.append(_record(fw, name, method, variant, times, steps))
                    if os.environ.get("DEVICE_DATA") and variant[1] in ("32", "bf16-mixed"):
                        times = unitrain_fit(fw, workload, variant, data_on_device=True)
                        method = "unitrain_device_data"
                        rows.append(_record(fw, name, method, variant, times, steps))
    _comparisons(rows)


if __name__ == "__main__":
    main(sys.argv[1:] or ["torch", "jax"])
