"""The child process that runs one method: pins threads, imports its framework, trains.

``python -m benchmarks._worker METHOD`` serves the parent (:mod:`benchmarks._harness`) over
JSON lines: commands on stdin, events on the original stdout (fd 1 is pointed at stderr, so a
framework's prints cannot corrupt the protocol). For each ``run`` command it trains a
workload for ``warmup + segments * segment_epochs`` epochs and pauses at the end of the
warm-up and of every segment, reporting the segment's wall and CPU seconds (the process's own
CPU time, which other jobs on a shared machine disturb far less), until the parent says ``go``.

``python -m benchmarks._worker METHOD --free WORKLOAD EPOCHS`` trains without pausing and
prints one JSON object with the peak resident memory (used for the memory comparison).
"""

from __future__ import annotations

import json
import os
import resource
import sys
import time
import traceback
from typing import Any, TextIO

#: The same pinning for every method: one thread per framework, set before any import.
THREAD_ENV = {
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
    "OPENBLAS_NUM_THREADS": "1",
    "TF_NUM_INTRAOP_THREADS": "1",
    "TF_NUM_INTEROP_THREADS": "1",
    "XLA_FLAGS": "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1",
    "JAX_PLATFORMS": "cpu",
    "TF_CPP_MIN_LOG_LEVEL": "2",
}


def pin_threads(backend: str) -> None:
    """Set the environment above, then each framework's own thread settings."""
    os.environ.update(THREAD_ENV)
    os.environ["KERAS_BACKEND"] = backend
    if backend == "torch":
        import torch

        torch.set_num_threads(1)
        torch.set_num_interop_threads(1)
    elif backend == "tensorflow":
        import tensorflow as tf

        tf.config.threading.set_intra_op_parallelism_threads(1)
        tf.config.threading.set_inter_op_parallelism_threads(1)
    elif backend == "jax":
        import jax  # noqa: F401  (the XLA flags above are read when its CPU client starts)
    else:
        raise ValueError(f"unknown backend {backend!r}")


class Channel:
    """JSON lines: commands in from the parent, events out to it."""

    def __init__(self, commands: TextIO, events: TextIO) -> None:
        self.commands, self.events = commands, events

    def send(self, **event: Any) -> None:
        self.events.write(json.dumps(event) + "\n")
        self.events.flush()

    def receive(self) -> dict[str, Any]:
        line = self.commands.readline()
        if not line:
            raise SystemExit(0)  # the parent went away
        return json.loads(line)


class PausingGate:
    """Times segments of epochs and waits for the parent between them (see the module doc)."""

    def __init__(self, channel: Channel, warmup: int, segment_epochs: int, segments: int) -> None:
        self.channel = channel
        self.warmup, self.segment_epochs = warmup, segment_epochs
        self.epochs = warmup + segment_epochs * segments
        self.done = 0
        self.started = self.cpu_started = 0.0

    def epoch_end(self, loss: float | None) -> None:
        now, cpu_now = time.perf_counter(), time.process_time()
        self.done += 1
        if self.done == self.warmup:
            self.channel.send(event="warm", loss=loss)
        elif self.done > self.warmup and (self.done - self.warmup) % self.segment_epochs == 0:
            self.channel.send(
                event="segment",
                seconds=now - self.started,
                cpu_seconds=cpu_now - self.cpu_started,
                loss=loss,
            )
        else:
            return
        command = self.channel.receive()
        if command["cmd"] not in ("go", "finish"):
            raise RuntimeError(f"unexpected command {command!r} inside a run")
        self.started, self.cpu_started = time.perf_counter(), time.process_time()


class FreeGate:
    """Trains ``epochs`` epochs without pausing, keeping the losses."""

    def __init__(self, epochs: int) -> None:
        self.epochs = epochs
        self.losses: list[float | None] = []

    def epoch_end(self, loss: float | None) -> None:
        self.losses.append(loss)


def _rss_mib() -> float:
    with open("/proc/self/statm") as handle:
        pages = int(handle.read().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


def _peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def serve(method_name: str) -> None:
    """Answer the parent's commands until it says ``exit`` or goes away."""
    events = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    channel = Channel(sys.stdin, events)
    started = time.perf_counter()
    try:
        from benchmarks.methods import METHODS, train
        from benchmarks.workloads import WORKLOADS

        method = METHODS[method_name]
        pin_threads(method.backend)
    except Exception:
        channel.send(event="error", message=traceback.format_exc(limit=4))
        return
    channel.send(event="ready", seconds=time.perf_counter() - started)
    while True:
        command = channel.receive()
        if command["cmd"] == "exit":
            return
        gate = PausingGate(
            channel, command["warmup"], command["segment_epochs"], command["segments"]
        )
        try:
            train(method, WORKLOADS[command["workload"]], gate)
        except Exception:
            channel.send(event="error", message=traceback.format_exc(limit=6))
            continue
        channel.send(event="done")


def run_free(method_name: str, workload_name: str, epochs: int) -> None:
    """Train without pausing; print peak and post-import resident memory as JSON."""
    events = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    from benchmarks.methods import METHODS, train
    from benchmarks.workloads import WORKLOADS

    method = METHODS[method_name]
    pin_threads(method.backend)
    after_import = _rss_mib()
    gate = FreeGate(epochs)
    started = time.perf_counter()
    train(method, WORKLOADS[workload_name], gate)
    result = {
        "method": method_name,
        "workload": workload_name,
        "epochs": epochs,
        "seconds": time.perf_counter() - started,
        "peak_rss_mib": _peak_rss_mib(),
        "framework_rss_mib": after_import,
        "losses": gate.losses,
    }
    events.write(json.dumps(result) + "\n")
    events.flush()


def main(argv: list[str]) -> None:
    if len(argv) == 4 and argv[1] == "--free":
        run_free(argv[0], argv[2], int(argv[3]))
    elif len(argv) == 1:
        serve(argv[0])
    else:
        raise SystemExit("usage: python -m benchmarks._worker METHOD [--free WORKLOAD EPOCHS]")


if __name__ == "__main__":
    main(sys.argv[1:])
