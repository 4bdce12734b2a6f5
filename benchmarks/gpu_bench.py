"""GPU speed of unitrain against hand-written loops at the same precision, in the same run.

For each framework (torch, jax) and workload (W1: MLP 784-256-256-10, batch 128; W3: MLP
1024-4096-4096-10, batch 512; SGD momentum 0.9, cross-entropy), it times, interleaved:

- ``native`` loops (torch eager + ``torch.optim.SGD``; ``jax.jit`` + optax) and
  ``Trainer.fit`` at ``matmul_precision`` "highest" and "high" (TF32);
- mixed precision: a native bfloat16 loop (torch autocast; jax casts inside the loss) and
  unitrain ``precision="bf16-mixed"`` and ``"16-mixed"``, both at "highest".

Both sides get the same host numpy arrays, shuffled per epoch and copied to the device per
batch (what ``fit((x, y))`` does); the first epoch is a warm-up. One JSON line per
measurement (median and minimum microseconds per step over the timed epochs), then one per
comparison: unitrain / native at equal precision, and mixed / float32 "highest".

Usage, with the package importable (``PYTHONPATH`` pointing at an install of it)::

    python benchmarks/gpu_bench.py [torch] [jax]

Environment: ``DEV`` (``gpu``, or ``cpu`` to try it here), ``STEPS`` (steps per epoch, by
default 200 for W1 and 100 for W3), ``EPOCHS`` (4), ``REPS`` (interleaved repetitions, 2),
``ONLY`` (e.g. ``W3``), ``NONDETERMINISTIC`` (set: also unitrain with ``deterministic=False``
at float32 "highest", to see what deterministic kernels cost), ``DEVICE_DATA`` (set: also
unitrain with ``data_on_device=True``, the training set on the GPU and each batch gathered
there, at float32 "highest" and bf16-mixed: what the host's per-step gather and copy cost).
"""

from __future__ import annotations

import itertools
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np

DEVICE = os.environ.get("DEV", "gpu")
EPOCHS = int(os.environ.get("EPOCHS", 4))
WORKLOADS = {
    # W0: compute too small to matter, so a step's time is the host's (dispatch, copies,
    # bookkeeping): on a GPU that is what the device waits for when the host is the bottleneck,
    # and on the CPU (DEV=cpu) it is the one figure of this script worth measuring.
    "W0": {"sizes": (32, 32, 32, 10), "batch": 32, "steps": 500},
    "W1": {"sizes": (784, 256, 256, 10), "batch": 128, "steps": 200},
    "W3": {"sizes": (1024, 4096, 4096, 10), "batch": 512, "steps": 100},
}
LR, MOMENTUM = 0.01, 0.9
#: (method, matmul_precision, precision): what each framework is timed in.
VARIANTS = (
    ("highest", "32"),
    ("high", "32"),
    ("highest", "bf16-mixed"),
    ("highest", "16-mixed"),
)


def _data(workload: dict[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    n = workload["batch"] * workload["steps"]
    x = rng.standard_normal((n, workload["sizes"][0])).astype(np.float32)
    return x, rng.integers(0, workload["sizes"][-1], n).astype(np.int64)


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
    workload: dict[str, Any],
    variant: tuple[str, str],
    deterministic: bool = True,
    data_on_device: bool = False,
) -> list[float]:
    """Seconds per epoch of ``Trainer.fit`` (epoch end waits for the device: loss read)."""
    from unitrain import Trainer, TrainerConfig, models, optim, schedules

    times: list[float] = []

    class Clock:
        def on_epoch_begin(self, trainer: Any, epoch: int) -> None:
            self.started = time.perf_counter()

        def on_epoch_end(self, trainer: Any, epoch: int, logs: dict[str, Any]) -> None:
            float(logs["loss"])
            times.append(time.perf_counter() - self.started)

    config = TrainerConfig(
        epochs=EPOCHS,
        batch_size=workload["batch"],
        device=DEVICE,
        matmul_precision=variant[0],
        precision=variant[1],
        deterministic=deterministic,
        data_on_device=data_on_device,
        log_every_n_steps=10**6,
    )
    trainer = Trainer(
        models.MLP(workload["sizes"]),
        backend=fw,
        optimizer=optim.SGD(momentum=MOMENTUM),
        schedule=schedules.Constant(LR),
        callbacks=[Clock()],
        config=config,
    )
    trainer.fit(_data(workload))
    return times


def torch_native(workload: dict[str, Any], variant: tuple[str, str]) -> list[float] | None:
    """Seconds per epoch of a plain torch loop; None for a precision it does not write."""
    import torch
    import torch.nn.functional as F

    if variant[1] == "16-mixed":
        return None  # a GradScaler loop is another rule; unitrain's fp16 is compared to bf16
    torch.set_float32_matmul_precision(variant[0])
    device = torch.device("cuda" if DEVICE == "gpu" else "cpu")
    x, y = _data(workload)
    sizes, layers = workload["sizes"], []
    for fan_in, fan_out in itertools.pairwise(sizes):
        layers += [torch.nn.Linear(fan_in, fan_out), torch.nn.ReLU()]
    model = torch.nn.Sequential(*layers[:-1]).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    autocast = variant[1] == "bf16-mixed"
    rng, batch, times = np.random.default_rng(0), workload["batch"], []
    for _ in range(EPOCHS):
        started = time.perf_counter()
        order = rng.permutation(len(x))
        total = torch.zeros((), device=device)
        for i in range(workload["steps"]):
            index = order[i * batch : (i + 1) * batch]
            xb = torch.from_numpy(x[index]).to(device, non_blocking=True)
            yb = torch.from_numpy(y[index]).to(device, non_blocking=True)
            optimizer.zero_grad(set_to_none=True)
            with torch.autocast(device.type, torch.bfloat16, enabled=autocast):
                loss = F.cross_entropy(model(xb), yb)
            loss.backward()
            optimizer.step()
            total += loss.detach()
        float(total)
        times.append(time.perf_counter() - started)
    return times


def jax_native(workload: dict[str, Any], variant: tuple[str, str]) -> list[float] | None:
    """Seconds per epoch of a plain ``jax.jit`` + optax loop; None where it has no twin."""
    import jax
    import jax.numpy as jnp
    import optax

    if variant[1] == "16-mixed":
        return None
    algorithm = {"highest": "float32", "high": "tensorfloat32"}[variant[0]]
    compute = jnp.bfloat16 if variant[1] == "bf16-mixed" else jnp.float32
    device = jax.devices("gpu" if DEVICE == "gpu" else "cpu")[0]
    x, y = _data(workload)
    sizes, rng = workload["sizes"], np.random.default_rng(0)
    params = [
        (
            rng.uniform(-(a**-0.5), a**-0.5, (a, c)).astype(np.float32),
            np.zeros((c,), np.float32),
        )
        for a, c in itertools.pairwise(sizes)
    ]
    params = jax.device_put(params, device)
    optimizer = optax.sgd(LR, momentum=MOMENTUM)
    state = optimizer.init(params)

    def loss_fn(p: Any, xb: Any, yb: Any) -> Any:
        h = xb.astype(compute)
        for i, (weight, bias) in enumerate(p):
            h = h @ weight.astype(compute) + bias.astype(compute)
            if i < len(p) - 1:
                h = jax.nn.relu(h)
        return optax.softmax_cross_entropy_with_integer_labels(h.astype(jnp.float32), yb).mean()

    @jax.jit
    def step(p: Any, s: Any, xb: Any, yb: Any) -> Any:
        # The bfloat16 loop sets no precision: its matmuls have bfloat16 operands, and this
        # keeps it a plain bfloat16 loop whatever the setting does to such operands.
        with jax.default_matmul_precision(None if compute == jnp.bfloat16 else algorithm):
            loss, grads = jax.value_and_grad(loss_fn)(p, xb, yb)
        updates, s = optimizer.update(grads, s, p)
        return optax.apply_updates(p, updates), s, loss

    batch, times = workload["batch"], []
    for _ in range(EPOCHS):
        started = time.perf_counter()
        order = rng.permutation(len(x))
        losses = []
        for i in range(workload["steps"]):
            index = order[i * batch : (i + 1) * batch]
            params, state, loss = step(params, state, x[index], y[index].astype(np.int32))
            losses.append(loss)
        float(sum(losses))
        times.append(time.perf_counter() - started)
    return times


NATIVE: dict[str, Callable[[dict[str, Any], tuple[str, str]], list[float] | None]] = {
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


def main(frameworks: list[str]) -> None:
    """Time every framework, workload and variant; print the rows and the comparisons."""
    only = os.environ.get("ONLY")
    reps = int(os.environ.get("REPS", 2))
    rows = []
    for fw in frameworks:
        for name, workload in WORKLOADS.items():
            if only and name not in only.split(","):
                continue
            workload = dict(workload, steps=int(os.environ.get("STEPS", workload["steps"])))
            for _ in range(reps):  # interleaved, so drift hits both sides alike
                for variant in VARIANTS:
                    native = NATIVE[fw](workload, variant)
                    if native is not None:
                        rows.append(_record(fw, name, "native", variant, native, workload["steps"]))
                    times = unitrain_fit(fw, workload, variant)
                    rows.append(_record(fw, name, "unitrain", variant, times, workload["steps"]))
                    if os.environ.get("NONDETERMINISTIC") and variant == VARIANTS[0]:
                        times = unitrain_fit(fw, workload, variant, deterministic=False)
                        method = "unitrain_nondeterministic"
                        rows.append(_record(fw, name, method, variant, times, workload["steps"]))
                    if os.environ.get("DEVICE_DATA") and variant[1] in ("32", "bf16-mixed"):
                        times = unitrain_fit(fw, workload, variant, data_on_device=True)
                        method = "unitrain_device_data"
                        rows.append(_record(fw, name, method, variant, times, workload["steps"]))
    _comparisons(rows)


if __name__ == "__main__":
    main(sys.argv[1:] or ["torch", "jax"])
