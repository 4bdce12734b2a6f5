"""Run in a fresh process with two local CPU devices (test_sharded sets ``XLA_FLAGS``): the
kit's experiment on ``Sharded(2)`` over the devices and on one device; prints a JSON line of
what test_sharded asserts."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import jax
import numpy as np

from unitrain.backends.sharded import Sharded
from unitrain.checkpoint import list_checkpoints
from unitrain.conformance import _workers


def _worst(state: dict, reference: dict, prefix: str) -> float:
    """The largest ``max|a - b| / max|b|`` over the arrays named ``prefix...``."""
    return max(
        float(np.max(np.abs(state[k] - reference[k])) / max(np.max(np.abs(reference[k])), 1e-30))
        for k in reference
        if k.startswith(prefix) and np.size(reference[k])
    )


def main(out: Path) -> None:
    batch = _workers.LOCAL_BATCH
    sharded = _workers.train("jax", "float32", out / "sharded", Sharded(2), batch=batch)
    leaves = jax.tree.leaves(sharded.backend._state.params)
    one = _workers.train("jax", "float32", out / "one", 1, batch=batch)
    resumed = _workers.train(
        "jax",
        "float32",
        out / "resumed",
        1,
        resume=_workers.resume_point(out / "sharded"),
        batch=batch,
    )
    state, reference = sharded.backend.state_dict(), one.backend.state_dict()
    report = {
        "shards": [[list(s.data.shape) for s in leaf.addressable_shards] for leaf in leaves],
        "shapes": [list(leaf.shape) for leaf in leaves],
        "model": _worst(state, reference, "model."),
        "optimizer": _worst(state, reference, "optimizer."),
        "resumed_on_one": _worst(resumed.backend.state_dict(), reference, "model."),
        "epochs": [sharded.state.epoch, one.state.epoch],
        "lrs": [[r["lr"] for r in run.history] for run in (sharded, one)],
        "checkpoints": len(list_checkpoints(out / "sharded" / "checkpoints")),
    }
    print(json.dumps(report))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
