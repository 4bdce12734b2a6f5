"""A long run: 20,000 updates of W2 per backend, with the process's memory sampled.

W2 is an MLP 32-64-10 (ReLU) trained with softmax cross-entropy, batch 32 and SGD with
momentum 0.9, here on 3,200 random examples (100 updates per epoch, 200 epochs), with the
machinery a real run has switched on: a JSONL metrics file, a checkpoint every 10 epochs
(the last two kept) and validation every 10 epochs. Each backend runs in a fresh subprocess
that reads its resident set size (``VmRSS`` in ``/proc/self/status``) 40 times (every 500 updates).
After a warm-up (the first 10% of the run: compilation, allocator pools, caches) memory must
not grow beyond noise: the median of the last fifth of the samples may exceed the median of
those between 10% and 30% of the run by at most ``MAX_GROWTH_MB``. Marked ``slow``; run it
with ``pytest -m slow tests/training/test_long_run.py`` (``UNITRAIN_HARDENING_REPORT=<dir>``
writes the figures). A tenth of it (2,000 updates, numpy backend) runs by default.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from _backends import backends

STEPS = 20_000
MAX_GROWTH_MB = 8.0

SCRIPT = textwrap.dedent(
    """
    import json, sys, time
    from pathlib import Path
    import numpy as np
    from unitrain import Trainer, TrainerConfig, callbacks, models, optim, schedules

    backend, out, steps = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3])
    every = max(1, steps // 40)  # 40 memory samples whatever the length

    def rss_kb():
        for line in open("/proc/self/status"):
            if line.startswith("VmRSS:"):
                return int(line.split()[1])

    class SampleMemory(callbacks.Callback):
        def __init__(self):
            self.samples = []

        def on_batch_end(self, trainer, batch, logs):
            if trainer.state.step % every == 0:
                self.samples.append((trainer.state.step, rss_kb()))

    rng = np.random.default_rng(0)
    x = rng.normal(size=(3200, 32)).astype(np.float32)
    y = (np.abs(x[:, :10]).argmax(axis=1)).astype(np.int64)
    memory = SampleMemory()
    trainer = Trainer(
        models.MLP((32, 64, 10)),
        backend=backend,
        optimizer=optim.SGD(momentum=0.9),
        schedule=schedules.Constant(0.05),
        callbacks=[
            memory,
            callbacks.JSONLLogger(out / "metrics.jsonl"),
            callbacks.ModelCheckpoint(out / "ckpt", every_n_epochs=10, keep_last=2),
        ],
        config=TrainerConfig(
            epochs=steps // 100, batch_size=32, device="cpu", val_every_n_epochs=10,
            checkpoint_dir=str(out / "ckpt"),
        ),
    )
    started = time.perf_counter()
    history = trainer.fit((x, y), (x[:320], y[:320]))
    print(json.dumps({
        "seconds": time.perf_counter() - started,
        "steps": trainer.state.step,
        "samples": memory.samples,
        "final_loss": history[-1]["loss"],
        "first_loss": history[0]["loss"],
    }))
    """
)


def memory_figures(samples: list[tuple[int, int]], steps: int) -> dict[str, float]:
    """Baseline (10-30% of the run), end (last fifth) and growth, in MB."""
    rss = np.array([kb for _, kb in samples], dtype=np.float64) / 1024
    at = np.array([step for step, _ in samples]) / steps
    baseline = float(np.median(rss[(at > 0.1) & (at <= 0.3)]))
    end = float(np.median(rss[at > 0.8]))
    second_half = at > 0.5
    slope = float(np.polyfit(at[second_half] * steps / 1000, rss[second_half], 1)[0])
    return {
        "baseline_mb": round(baseline, 2),
        "end_mb": round(end, 2),
        "growth_mb": round(end - baseline, 2),
        "slope_mb_per_1000_steps": round(slope, 4),
        "min_mb": round(float(rss.min()), 2),
        "max_mb": round(float(rss.max()), 2),
    }


def long_run(backend: str, tmp_path: Path, steps: int) -> dict[str, float]:
    """Train ``steps`` updates in a fresh process; check the run and return its figures."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TF_CPP_MIN_LOG_LEVEL": "2"}
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, backend, str(tmp_path), str(steps)],
        capture_output=True,
        text=True,
        timeout=1800,
        env=env,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["steps"] == steps
    assert result["final_loss"] < result["first_loss"]
    figures = {"backend": backend, "steps": steps, "seconds": round(result["seconds"], 1)}
    figures.update(memory_figures(result["samples"], steps))
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert len(lines) == steps // 100  # one flushed line per epoch
    checkpoints = sorted(p.name for p in (tmp_path / "ckpt").iterdir() if p.name[0] != ".")
    assert len(checkpoints) == 2, checkpoints  # every 10 epochs, the last two kept
    return figures


@pytest.mark.slow
@pytest.mark.parametrize("backend", backends())
def test_twenty_thousand_steps_without_memory_growth(backend, tmp_path):
    figures = long_run(backend, tmp_path, STEPS)
    directory = os.environ.get("UNITRAIN_HARDENING_REPORT")
    if directory:
        Path(directory).mkdir(parents=True, exist_ok=True)
        (Path(directory) / f"longrun-{backend}.json").write_text(json.dumps(figures, indent=2))
    assert figures["growth_mb"] <= MAX_GROWTH_MB, figures


def test_two_thousand_steps_on_the_reference_backend(tmp_path):
    """The reduced form that runs by default: the same harness, a tenth of the length, on
    the numpy backend (seconds), so a change that breaks the long run fails CI too."""
    figures = long_run("numpy", tmp_path, STEPS // 10)
    assert figures["growth_mb"] <= MAX_GROWTH_MB, figures
