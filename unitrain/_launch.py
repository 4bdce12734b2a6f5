"""Start N local workers of a Python program, for engines that ship no launcher of their own.

``python -m unitrain._launch --workers N --environment pkg.mod:function -- -m module args``
runs ``python -m module args`` N times. Each worker's environment comes from
``function(rank, workers, ports)`` (JAX's coordinator address, TensorFlow's ``TF_CONFIG``),
with ``ports`` N free local ports for the engine's rendezvous; only 127.0.0.1 is used.

Like torchrun, it watches every worker: when one ends with an error or is killed, the others
are stopped (SIGTERM, then SIGKILL after a grace period) and the launcher exits with status 1
after naming the worker that failed first. Checkpoints are written atomically by rank 0, so a
job ended this way leaves every checkpoint valid, and the next launch resumes from the newest.
"""

from __future__ import annotations

import argparse
import importlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence

__all__ = ["free_ports", "main"]

#: Seconds a stopped worker gets to exit before it is killed.
GRACE_S = 5.0


def free_ports(count: int) -> list[int]:
    """``count`` different TCP ports on 127.0.0.1 that nothing listens on now."""
    probes = [socket.socket() for _ in range(count)]
    try:
        for probe in probes:  # all held open at once, so the system gives distinct ports
            probe.bind(("127.0.0.1", 0))
        return [int(probe.getsockname()[1]) for probe in probes]
    finally:
        for probe in probes:
            probe.close()


def _describe(code: int) -> str:
    if code < 0:
        return f"killed by {signal.Signals(-code).name}"
    return f"exit status {code}"


def _stop(workers: list[subprocess.Popen[bytes]]) -> None:
    for worker in workers:
        if worker.poll() is None:
            worker.terminate()
    deadline = time.monotonic() + GRACE_S
    for worker in workers:
        try:
            worker.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            worker.kill()
            worker.wait()


def run(program: Sequence[str], workers: int, environment: str) -> int:
    """Run ``program`` (arguments after ``python``) on ``workers`` workers; the exit status."""
    module, _, name = environment.partition(":")
    worker_environment = getattr(importlib.import_module(module), name)
    ports = free_ports(workers)
    started = []
    for rank in range(workers):
        env = {**os.environ, **worker_environment(rank, workers, ports)}
        started.append(subprocess.Popen([sys.executable, *program], env=env))
    try:
        while True:
            codes = [worker.poll() for worker in started]
            failed = [(rank, code) for rank, code in enumerate(codes) if code not in (None, 0)]
            if failed:
                rank, code = failed[0]
                _stop(started)
                print(
                    f"unitrain: worker {rank} of {workers} (pid {started[rank].pid}) failed: "
                    f"{_describe(code)}; the other workers were stopped",
                    file=sys.stderr,
                )
                return 1
            if all(code == 0 for code in codes):
                return 0
            time.sleep(0.05)
    except BaseException:  # an interrupted launcher leaves no worker behind
        _stop(started)
        raise


def main(argv: Sequence[str] | None = None) -> int:
    """Parse ``--workers N --environment pkg.mod:function -- program...`` and run it."""
    parser = argparse.ArgumentParser(prog="python -m unitrain._launch", description=__doc__)
    parser.add_argument("--workers", type=int, required=True)
    parser.add_argument("--environment", required=True, help="pkg.mod:function")
    parser.add_argument("program", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    program = args.program[1:] if args.program[:1] == ["--"] else args.program
    if args.workers < 1 or not program:
        parser.error("need --workers >= 1 and a program after --")
    return run(program, args.workers, args.environment)


if __name__ == "__main__":
    sys.exit(main())
