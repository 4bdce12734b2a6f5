"""Measure how far mixed precision moves gradients and training from the float64 reference.

The conformance kit's ``mixed_precision`` bars (``AGREEMENT`` in
``unitrain/conformance/checks/mixed_precision.py``) come from this script's output. For each backend
and each of ``bf16-mixed`` and ``16-mixed`` it prints one JSON line: the normwise relative
error of one update's gradients (an SGD step at lr 1 on each of 6 batches of the kit's
classifier; min and max over the batches) and of the losses and weights after 20 SGD-momentum
updates, against the float64 numpy reference, and the same figures for ``"32"`` (the floor a
backend that ignored the precision would show).

Usage: ``python benchmarks/precision_agreement.py [--backends numpy torch jax tensorflow]``
"""

from __future__ import annotations

import argparse
import json

import numpy as np

from unitrain import optim
from unitrain.backends.protocol import BackendOptions
from unitrain.backends.registry import get_backend
from unitrain.models import MLP


def _relative(actual: np.ndarray, expected: np.ndarray) -> float:
    return float(np.linalg.norm(actual - expected) / np.linalg.norm(expected))


def _data() -> tuple[np.ndarray, np.ndarray]:
    # The kit's classifier data (unitrain/conformance/_probes.py: blobs): 48 examples, 6 features.
    rng = np.random.default_rng([0, 0xB10B])
    centers = rng.normal(0.0, 2.0, (3, 6))
    y = rng.integers(0, 3, 48)
    x = centers[y] + rng.normal(0.0, 0.7, (48, 6))
    return x.astype(np.float32), y.astype(np.int64)


def _weights(state: dict[str, np.ndarray]) -> np.ndarray:
    return np.concatenate([np.ravel(v) for k, v in state.items() if k.startswith("model.")])


def _update(backend: object, batch: tuple[np.ndarray, np.ndarray], lr: float) -> float:
    step = getattr(backend, "train_step", None)
    if step is not None:
        return float(step(batch, lr))
    loss = backend.forward(batch)  # type: ignore[attr-defined]
    backend.backward()  # type: ignore[attr-defined]
    backend.step(lr)  # type: ignore[attr-defined]
    return float(loss)


def measure(name: str, precision: str) -> dict[str, object]:
    """The error figures of one backend at one precision."""
    model, (x, y) = MLP((6, 16, 3), activation="tanh"), _data()
    cls, reference_cls = get_backend(name), get_backend("numpy")
    options = BackendOptions(device="cpu", deterministic=True, precision=precision)
    gradient_errors = []
    for i in range(6):
        batch = (x[8 * i : 8 * i + 8], y[8 * i : 8 * i + 8])
        backend = cls(model, options)
        reference = reference_cls(model, BackendOptions(device="cpu", dtype="float64"))
        w0, r0 = _weights(backend.state_dict()), _weights(reference.state_dict())
        _update(backend, batch, 1.0)
        _update(reference, batch, 1.0)
        gradient = w0 - _weights(backend.state_dict())
        gradient_errors.append(_relative(gradient, r0 - _weights(reference.state_dict())))
    spec = optim.SGD(momentum=0.9)
    backend = cls(
        model, BackendOptions(device="cpu", deterministic=True, precision=precision, optimizer=spec)
    )
    reference = reference_cls(model, BackendOptions(device="cpu", dtype="float64", optimizer=spec))
    losses, expected = [], []
    for step in range(20):
        i, lr = step % 6, 0.05 + 0.01 * (step % 4)
        batch = (x[8 * i : 8 * i + 8], y[8 * i : 8 * i + 8])
        losses.append(_update(backend, batch, lr))
        expected.append(_update(reference, batch, lr))
    return {
        "backend": name,
        "precision": precision,
        "gradients_min": min(gradient_errors),
        "gradients_max": max(gradient_errors),
        "losses_20": _relative(np.array(losses), np.array(expected)),
        "weights_20": _relative(_weights(backend.state_dict()), _weights(reference.state_dict())),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--backends", nargs="+", default=["numpy", "torch", "jax", "tensorflow"])
    args = parser.parse_args()
    for name in args.backends:
        for precision in ("32", "bf16-mixed", "16-mixed"):
            print(json.dumps(measure(name, precision)), flush=True)


if __name__ == "__main__":
    main()
