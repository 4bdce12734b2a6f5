"""Start N local workers of a Python program, for engines that ship no launcher of their own.

``python -m unitrain.cli._launch --workers N --environment pkg.mod:function -- -m module args``
runs ``python -m module args`` N times. Each worker's environment comes from
``function(rank, workers, ports)`` (JAX's coordinator address, TensorFlow's ``TF_CONFIG``),
with ``ports`` N free local ports for the engine's rendezvous; only 127.0.0.1 is used.

Like torchrun, it watches every worker: when one ends with an error or is killed, the others
are stopped (SIGTERM, then SIGKILL after a grace period) and the launcher exits with status 1
after naming the worker that failed first. Checkpoints are written atomically by rank 0, so a
job ended this way leaves every checkpoint valid, and the next launch resumes from the newest.

Preemption: SIGTERM, SIGUSR1 or SIGUSR2 sent to the launcher (what Slurm and Kubernetes
send) is passed on to every worker (:class:`SignalForwarder`); the workers agree on a step,
rank 0 checkpoints it, all exit 143, and so does the launcher. A launcher killed outright
(SIGKILL) takes its workers with it: each is started with ``PR_SET_PDEATHSIG`` (Linux), so no
worker trains on holding the run's lock. ``unitrain train --workers N`` forwards the same way
to torchrun, whose workers set the same parent-death signal themselves (:func:`die_with_parent`).
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import importlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from types import FrameType

from unitrain.cli._help import plain_text
from unitrain.training._preemption import PREEMPTION_EXIT_STATUS, handling

__all__ = [
    "SignalForwarder",
    "die_with_parent",
    "forwarding_signals",
    "free_ports",
    "launched_worker",
    "main",
]

#: Seconds a stopped worker gets to exit before it is killed.
GRACE_S = 5.0
#: The signals a launcher passes on to its workers (Ctrl-C reaches them from the terminal).
FORWARDED = ("SIGTERM", "SIGUSR1", "SIGUSR2")
#: Set in the environment of the workers this launcher starts.
LAUNCHED_ENV = "UNITRAIN_LAUNCHED"
#: ``prctl`` option: the signal this process gets when its parent dies (linux/prctl.h).
_PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """Have the kernel SIGKILL this process when its parent (the launcher) dies (Linux only).

    Without it a worker whose launcher was killed outright trains on, holding the run's
    lock. A parent that died before the call is caught by the parent-pid check.
    """
    if not sys.platform.startswith("linux"):
        return
    parent = os.getppid()
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if parent == 1 or os.getppid() != parent:
        os.kill(os.getpid(), signal.SIGKILL)


def launched_worker() -> bool:
    """Whether this process is a worker started by torchrun or by this launcher."""
    return "LOCAL_RANK" in os.environ or LAUNCHED_ENV in os.environ


class SignalForwarder:
    """Passes the :data:`FORWARDED` signals this process gets on to the processes it started.

    Attributes:
        received: the first forwarded signal's name, or None.
    """

    def __init__(self) -> None:
        self.received: str | None = None
        self.children: list[subprocess.Popen[bytes]] = []

    def start(
        self, command: Sequence[str], env: dict[str, str] | None = None
    ) -> subprocess.Popen[bytes]:
        """Start ``command`` as a child that dies with this process and gets its signals."""
        child = subprocess.Popen(command, env=env, preexec_fn=die_with_parent)
        self.children.append(child)
        return child

    def run(self, command: Sequence[str]) -> int:
        """Run ``command`` to its end (see :meth:`start`); its exit status."""
        return self.start(command).wait()

    def handle(self, number: int, frame: FrameType | None) -> None:
        """The signal handler: remember the signal, pass it on to every running child."""
        self.received = self.received or signal.Signals(number).name
        for child in self.children:
            if child.poll() is None:
                with contextlib.suppress(OSError):
                    child.send_signal(number)


@contextlib.contextmanager
def forwarding_signals() -> Iterator[SignalForwarder]:
    """A :class:`SignalForwarder` whose handlers are installed for the ``with`` block."""
    forwarder = SignalForwarder()
    with handling(FORWARDED, forwarder.handle):
        yield forwarder


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
    with forwarding_signals() as forward:
        for rank in range(workers):
            env = {**os.environ, **worker_environment(rank, workers, ports), LAUNCHED_ENV: "1"}
            forward.start([sys.executable, *program], env=env)
        return _watch(forward.children, forward)


def _watch(started: list[subprocess.Popen[bytes]], forward: SignalForwarder) -> int:
    """Wait for the workers; stop them all when one fails; the launcher's exit status."""
    workers = len(started)
    try:
        while True:
            codes = [worker.poll() for worker in started]
            if forward.received is not None:  # they were told to save and stop: let them
                if all(code is not None for code in codes):
                    return PREEMPTION_EXIT_STATUS
                time.sleep(0.05)
                continue
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
    parser = argparse.ArgumentParser(
        prog="python -m unitrain.cli._launch",
        description=plain_text(__doc__),
        formatter_class=argparse.RawDescriptionHelpFormatter,  # keep the paragraphs apart
    )
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
