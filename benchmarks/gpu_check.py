"""The GPU check: the conformance kit and resume exactness on a GPU, with a verdict table.

Run by ``benchmarks/gpu_check.sh`` (which installs the package first) on a machine with one
CUDA GPU and no network. For each backend given (default: torch and jax):

1. ``unitrain conformance --backend B --device gpu`` in every dtype B declares, with a JSON
   report ``kit-B-gpu.json``;
2. resume exactness: the default recipe for 4 epochs straight, and the same run killed by
   SIGKILL after its second epoch then resumed with ``--resume latest``: the two final
   checkpoints must be bit-identical; the GPU checkpoint is then evaluated on the CPU by the
   numpy reference backend, which must find the GPU run's validation loss;
3. the native BatchNorm CNN tests (tests/models/test_native_model_state.py) on the GPU: running
   statistics checkpointed, SIGKILL + resume bit-identical, loaded back into the native model;
4. speed (``benchmarks/gpu_bench.py``, unless ``--no-bench``): unitrain against native loops
   at equal precision, and mixed precision against float32, for the torch and jax backends
   given, on the MLPs W1 and W3, the portable LeNet and the portable Transformer;
   ``bench.jsonl`` holds every line, the table the comparisons with issue 14's targets
   (unitrain / native <= 1.03; bf16-mixed on W3 at least 2x float32 "highest"). The bench
   reads its own environment variables: ``DEVICE_DATA=1`` adds unitrain with the training
   set on the GPU, ``REPS``, ``ONLY`` and the rest are in its module doc.

5. precision agreement: the default recipe for 4 epochs per backend at "highest", "high"
   (TF32) and bf16-mixed on the GPU, the final parameters against the numpy backend's float64
   run on the CPU and the backends against each other: how far whole runs drift under each
   setting (a measurement, with no bar).

``--only kit,bench`` runs some of them (``--only agreement --device cpu`` tries one here).
Writes ``summary.json`` and ``summary.md`` to the output directory and prints the table.
Exits non-zero if anything failed.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
CLI = [sys.executable, "-c", "import sys; from unitrain.cli import main; sys.exit(main())"]


#: The checks, in the order they run (``--only`` picks some).
CHECKS = ("kit", "resume", "native", "agreement", "bench")


def kit(backend: str, out: Path, device: str) -> dict:
    """Run the kit on the GPU; the verdict and the counts per dtype from the JSON report."""
    report = out / f"kit-{backend}-{device}.json"
    started = time.perf_counter()
    done = subprocess.run(
        [*CLI, "conformance", "--backend", backend, "--device", device, "--report", str(report)],
        capture_output=True,
        text=True,
    )
    (out / f"kit-{backend}-{device}.txt").write_text(done.stdout + done.stderr)
    counts: dict[str, dict[str, int]] = {}
    failures: list[str] = []
    if report.exists():
        for record in json.loads(report.read_text())["checks"]:
            per_dtype = counts.setdefault(record["dtype"], {})
            per_dtype[record["status"]] = per_dtype.get(record["status"], 0) + 1
            if record["status"] == "failed":
                failures.append(f"{record['id']}: {record['reason']}")
    verdict = [line for line in done.stdout.splitlines() if line.startswith("verdict:")]
    return {
        "check": f"kit {backend} {device}",
        "ok": done.returncode == 0,
        "verdict": verdict[-1] if verdict else done.stderr.strip()[-500:],
        "counts": counts,
        "failures": failures[:20],
        "seconds": round(time.perf_counter() - started, 1),
    }


def _train(args: list[str]) -> None:
    done = subprocess.run([*CLI, "train", *args], capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"unitrain train {' '.join(args)} failed:\n{done.stderr[-3000:]}")


def _train_then_kill(args: list[str], out: Path, after_epochs: int) -> None:
    """Start a run and SIGKILL it once its metrics file holds ``after_epochs`` lines."""
    process = subprocess.Popen(
        [*CLI, "train", *args], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    metrics = out / "metrics.jsonl"
    while process.poll() is None:
        if metrics.exists() and len(metrics.read_text().splitlines()) >= after_epochs:
            break
        time.sleep(0.005)
    process.send_signal(signal.SIGKILL)
    process.wait()


def _last_checkpoint(out: Path) -> Any:
    """The last checkpoint a ``unitrain train --out out`` run wrote, loaded."""
    from unitrain.checkpoint import list_checkpoints, load_checkpoint

    return load_checkpoint(list_checkpoints(out / "checkpoints")[-1])


def resume(backend: str, device: str) -> dict:
    """Straight vs SIGKILL + resume on the GPU, then the GPU checkpoint on the numpy backend."""
    from unitrain import Trainer, TrainerConfig, models, optim
    from unitrain.recipes import load_digits

    straight, killed = Path(tempfile.mkdtemp()), Path(tempfile.mkdtemp())
    common = ["--backend", backend, "--device", device, "--epochs", "4"]
    _train([*common, "--out", str(straight)])
    _train_then_kill([*common, "--out", str(killed)], killed, after_epochs=2)
    _train([*common, "--out", str(killed), "--resume", "latest"])
    a, b = _last_checkpoint(straight), _last_checkpoint(killed)
    tensors_a = {**a.model, **{f"optimizer.{k}": v for k, v in a.optimizer.items()}}
    tensors_b = {**b.model, **{f"optimizer.{k}": v for k, v in b.optimizer.items()}}
    identical = tensors_a.keys() == tensors_b.keys() and all(
        np.array_equal(tensors_a[k], tensors_b[k]) for k in tensors_a
    )
    gpu_rows = [json.loads(line) for line in (straight / "metrics.jsonl").read_text().splitlines()]
    data = load_digits()
    reference = Trainer(
        models.MLP((64, 128, 10)),
        backend="numpy",
        optimizer=optim.SGD(momentum=0.9),
        config=TrainerConfig(epochs=1),
    )
    state = {f"model.{k}": v for k, v in a.model.items()}
    state.update({f"optimizer.{k}": v for k, v in a.optimizer.items()})
    reference.backend.load_state_dict(state)
    on_cpu = reference.validate((data.x_val, data.y_val))
    gpu_val_loss = gpu_rows[-1]["val_loss"]
    agrees = abs(on_cpu["val_loss"] - gpu_val_loss) <= 1e-5 * abs(gpu_val_loss)
    return {
        "check": f"resume {backend} {device}",
        "ok": identical and agrees,
        "verdict": (
            f"SIGKILL + resume bit-identical: {identical}; {device} val_loss {gpu_val_loss:.6f}, "
            f"numpy CPU on its checkpoint {on_cpu['val_loss']:.6f}"
        ),
    }


#: (matmul_precision, precision) of the agreement runs: the kit's setting, TF32, bfloat16.
AGREEMENT_VARIANTS = (("highest", "32"), ("high", "32"), ("highest", "bf16-mixed"))


def _relative(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> float:
    """``||a - b|| / ||b||`` over every tensor of two models, in float64."""
    a_flat = np.concatenate([np.ravel(a[k]).astype(np.float64) for k in sorted(b)])
    b_flat = np.concatenate([np.ravel(b[k]).astype(np.float64) for k in sorted(b)])
    return float(np.linalg.norm(a_flat - b_flat) / np.linalg.norm(b_flat))


def agreement(backends: list[str], device: str, epochs: int = 4) -> dict:
    """How far whole runs drift under each precision setting.

    The default recipe trains for ``epochs`` epochs on ``device``, per backend and setting;
    its final parameters are compared with the numpy backend's float64 run on the CPU, and
    the first two backends with each other (``||a - b|| / ||b||`` over every tensor).
    """

    def run(backend: str, dev: str, *settings: str) -> dict[str, np.ndarray]:
        out = Path(tempfile.mkdtemp())
        common = ["--backend", backend, "--device", dev, "--epochs", str(epochs), "--quiet"]
        _train([*common, *(f"--set={setting}" for setting in settings), "--out", str(out)])
        return _last_checkpoint(out).model

    reference = run("numpy", "cpu", "config.dtype=float64")
    rows = []
    for matmul, precision in AGREEMENT_VARIANTS:
        settings = (f"config.matmul_precision={matmul}", f"config.precision={precision}")
        finals = {backend: run(backend, device, *settings) for backend in backends}
        row: dict[str, Any] = {"matmul_precision": matmul, "precision": precision}
        for backend, model in finals.items():
            row[f"{backend} vs float64"] = _relative(model, reference)
        if len(backends) > 1:
            first, second = backends[:2]
            row[f"{first} vs {second}"] = _relative(finals[first], finals[second])
        rows.append(row)
    verdicts = [
        f"{row['matmul_precision']}/{row['precision']}: "
        + ", ".join(f"{name} {value:.1e}" for name, value in row.items() if " vs " in name)
        for row in rows
    ]
    return {
        "check": f"precision agreement {device}, {epochs} epochs",
        "ok": True,  # a measurement; a run that fails raises
        "verdict": "; ".join(verdicts),
        "rows": rows,
    }


def native_state(backends: list[str], device: str) -> dict:
    """The native BatchNorm CNN tests of tests/models/test_native_model_state.py on the GPU."""
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-o",
            "addopts=",
            str(ROOT / "tests" / "test_native_model_state.py"),
            "-k",
            " or ".join(backends),
        ],
        capture_output=True,
        text=True,
        env={**os.environ, "UNITRAIN_TEST_DEVICE": device},
    )
    summary = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else done.stderr[-500:]
    return {
        "check": f"native BatchNorm CNN {device}",
        "ok": done.returncode == 0,
        "verdict": summary,
        "log": done.stdout[-4000:],
    }


def bench(backends: list[str], out: Path, device: str) -> dict:
    """Run gpu_bench.py; the comparisons against issue 14's targets as the verdict."""
    frameworks = [b for b in backends if b in ("torch", "jax")]
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "gpu_bench.py"), *frameworks],
        capture_output=True,
        text=True,
        env={**os.environ, "DEV": device},
    )
    lines = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    (out / "bench.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    verdicts = []
    for row in (line for line in lines if "unitrain_over_native" in line):
        ratio, speedup = row["unitrain_over_native"], row["speedup_over_float32_highest"]
        label = f"{row['fw']} {row['workload']} {row['method']} "
        label += f"{row['matmul_precision']}/{row['precision']}"
        parts = (
            []
            if ratio is None
            else [f"unitrain/native {ratio} ({'ok' if ratio <= 1.03 else 'over 1.03'})"]
        )
        if row["precision"] != "32" and speedup is not None:
            target = row["precision"] == "bf16-mixed" and row["workload"] == "W3"
            verdict = f" ({'ok' if speedup >= 2 else 'under 2x'})" if target else ""
            parts.append(f"x{speedup} of float32{verdict}")
        verdicts.append(f"{label}: {', '.join(parts) or f'x{speedup} of float32'}")
    return {
        "check": f"speed {device}",
        "ok": done.returncode == 0,  # the targets are read from the verdict, not enforced
        "verdict": "; ".join(verdicts) if verdicts else done.stderr.strip()[-500:],
        "seconds": round(time.perf_counter() - started, 1),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("backends", nargs="*", default=["torch", "jax"])
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "gpu-check")))
    parser.add_argument("--device", default="gpu", help="gpu; cpu tries the script here")
    parser.add_argument("--no-bench", action="store_true", help="leave out the speed runs")
    parser.add_argument(
        "--only",
        type=lambda text: set(text.split(",")),
        default=set(CHECKS),
        help=f"run only these checks, comma-separated from {', '.join(CHECKS)}",
    )
    args = parser.parse_args()
    unknown = sorted(args.only - set(CHECKS))
    if unknown:
        parser.error(f"--only: unknown checks {unknown}; choose from {', '.join(CHECKS)}")
    if args.no_bench:
        args.only.discard("bench")
    args.out = args.out.resolve()
    args.out.mkdir(parents=True, exist_ok=True)
    # Run from elsewhere: in the checkout, the source folder unitrain/ would shadow the
    # installed package (whose unitrain.conformance and unitrain.backends are mapped in).
    os.chdir(tempfile.mkdtemp())
    rows = []
    for backend in args.backends:
        if "kit" in args.only:
            rows.append(kit(backend, args.out, args.device))
        if "resume" in args.only:
            try:
                rows.append(resume(backend, args.device))
            except RuntimeError as error:
                rows.append({"check": f"resume {backend}", "ok": False, "verdict": str(error)})
    if "native" in args.only:
        rows.append(native_state(args.backends, args.device))
    if "agreement" in args.only:
        try:
            rows.append(agreement(args.backends, args.device))
        except RuntimeError as error:
            rows.append({"check": "precision agreement", "ok": False, "verdict": str(error)})
    if "bench" in args.only:
        rows.append(bench(args.backends, args.out, args.device))
    (args.out / "summary.json").write_text(json.dumps(rows, indent=1))
    lines = ["| check | ok | verdict |", "|---|---|---|"]
    for row in rows:
        counts = "; ".join(
            f"{dtype}: " + ", ".join(f"{n} {status}" for status, n in sorted(c.items()))
            for dtype, c in row.get("counts", {}).items()
        )
        lines.append(f"| {row['check']} | {row['ok']} | {row['verdict']} {counts} |")
    table = "\n".join(lines)
    (args.out / "summary.md").write_text(table + "\n")
    print(table)
    for row in rows:
        for failure in row.get("failures", []):
            print("FAILED", failure)
    return 0 if all(row["ok"] for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
