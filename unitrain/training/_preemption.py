"""Stopping cleanly when a scheduler asks: a signal becomes "checkpoint now, then exit 143".

Slurm and Kubernetes send SIGTERM some time before SIGKILL (Kubernetes' default grace period
is 30 s, Slurm's ``KillWait`` 30 s), and Slurm can send SIGUSR1 earlier still
(``--signal=USR1@120``). While ``Trainer.fit`` runs, :class:`SignalWatch` turns the first of
these signals into a request that the loop reads after the update in progress (one attribute
test per update; with several workers, at the next logging point, where all of them agree on
the step). The Trainer then writes a checkpoint of that exact step, durable before it goes
on, releases the run lock, prints one line naming the checkpoint, and raises
:class:`Preempted`, a ``SystemExit`` with status 143 (128 + SIGTERM, what a shell reports for
a process that SIGTERM ended): a script that does not catch it exits 143 without a traceback.
A second signal while the first is being handled aborts at once (the last durable checkpoint
stays; a save in flight is lost and its staging directory is cleared by the next run).

What the save costs is the grace period's budget: the update (or, if the signal lands there,
the validation pass) in progress, then one synchronous checkpoint. For the default recipe that
is well under a second; a model whose checkpoint takes longer than the grace period to write
needs a longer grace period (``terminationGracePeriodSeconds``, Slurm's ``KillWait``) or an
earlier signal (``--signal=USR1@SECONDS``).
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from types import FrameType, TracebackType
from typing import Any

from unitrain._errors import ConfigError

__all__ = [
    "DEFAULT_SIGNALS",
    "PREEMPTION_EXIT_STATUS",
    "Preempted",
    "SignalWatch",
    "check_signal_names",
    "handling",
    "restart_resume",
    "stopping_at_once",
]

#: The signals ``TrainerConfig.preemption_signals`` names by default.
DEFAULT_SIGNALS = ("SIGTERM", "SIGUSR1")
#: The exit status of a preempted run: 128 + SIGTERM, as a shell shows a SIGTERM'd process.
PREEMPTION_EXIT_STATUS = 143


class Preempted(SystemExit):
    """``fit`` stopped on a signal after writing a checkpoint (exits 143 when not caught).

    Attributes:
        signal_name: the signal that asked, such as ``"SIGTERM"``.
        checkpoint: the checkpoint to continue from (None: the run has no checkpoint folder,
            or a second signal aborted before the save).
        message: the line printed for the user.
    """

    def __init__(self, signal_name: str, checkpoint: Path | None, message: str) -> None:
        super().__init__(PREEMPTION_EXIT_STATUS)
        self.signal_name, self.checkpoint, self.message = signal_name, checkpoint, message

    def __str__(self) -> str:
        return self.message

    @classmethod
    def aborted(cls, signal_name: str) -> Preempted:
        """What a second signal raises (after printing it): stop now, without saving."""
        message = (
            f"unitrain: {signal_name} again: aborted without saving; the newest durable "
            "checkpoint is the one to continue from (resume='auto')"
        )
        print(message, file=sys.stderr, flush=True)
        return cls(signal_name, None, message)


def check_signal_names(names: Any) -> tuple[str, ...]:
    """``names`` as a tuple of signal names this platform has, or a ConfigError.

    Examples:
        >>> check_signal_names(["SIGTERM", "SIGUSR1"])
        ('SIGTERM', 'SIGUSR1')
    """
    if isinstance(names, str) or not isinstance(names, (list, tuple)):
        raise ConfigError(
            "TrainerConfig: preemption_signals must be a list of signal names such as "
            f"['SIGTERM', 'SIGUSR1'] (empty: none), got preemption_signals={names!r}"
        )
    for name in names:
        if name in ("SIGINT", "SIGKILL", "SIGSTOP") or not isinstance(
            getattr(signal, str(name), None), signal.Signals
        ):
            raise ConfigError(
                f"TrainerConfig: preemption_signals: {name!r} is not a signal this can "
                "handle; use names such as 'SIGTERM', 'SIGUSR1' or 'SIGUSR2' (Ctrl-C, SIGINT, "
                "has its own handling)"
            )
    return tuple(names)


class SignalWatch:
    """Records the first of ``signals`` received while active; a second one aborts.

    Used as a context manager around training, on the main thread (where Python runs signal
    handlers; elsewhere it watches nothing). The handlers it replaces are put back on exit.

    Args:
        signals: the signal names to watch.
        on_signal: called (on the main thread, from the handler) when the first one arrives,
            so the loop can notice it with an attribute test.
    """

    def __init__(self, signals: Sequence[str], on_signal: Callable[[], None]) -> None:
        self.signals = tuple(signals)
        self.received: str | None = None
        self._on_signal = on_signal
        self._stack = contextlib.ExitStack()

    def __enter__(self) -> SignalWatch:
        self.received = None
        self._stack.enter_context(handling(self.signals, self._handle))
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self._stack.close()

    def _handle(self, number: int, frame: FrameType | None) -> None:
        name = signal.Signals(number).name
        if self.received is not None:
            raise Preempted.aborted(name)
        self.received = name
        self._on_signal()


def restart_resume(resume: str | Path | None) -> str | Path | None:
    """``resume``, or ``"auto"`` when it is None and this process is a restart of a job.

    A torchrun worker restarted by ``--max-restarts`` and a requeued Slurm job get the same
    command line as the first attempt, which must then continue, not start over."""
    if resume is not None:
        return resume
    for variable in ("TORCHELASTIC_RESTART_COUNT", "SLURM_RESTART_COUNT"):
        if os.environ.get(variable, "0").strip() not in ("", "0"):
            return "auto"
    return None


@contextlib.contextmanager
def stopping_at_once(
    signals: Sequence[str] = DEFAULT_SIGNALS, *, then_ignore: bool = False
) -> Iterator[None]:
    """Outside ``fit`` (start-up, building, a final evaluation) a signal ends the command at
    once with one line and status 143: there is no update to finish and nothing unsaved.

    ``fit`` installs its own handlers for its duration and puts these back when it ends.
    ``then_ignore=True`` ignores the signals after the block instead of putting the old
    handlers back, for a program that ends then: Python resets its handlers to the default
    while the interpreter shuts down (measured: a SIGTERM up to 80 ms after the last line of
    a script that imports scikit-learn killed it, status -15), and by then every checkpoint
    is durable, so a late signal has nothing left to stop.
    """

    def stop(number: int, frame: FrameType | None) -> None:
        name = signal.Signals(number).name
        message = f"unitrain: {name} outside training: stopped; every checkpoint is durable"
        print(message, file=sys.stderr, flush=True)
        raise Preempted(name, None, message)

    with handling(signals, stop, then=signal.SIG_IGN if then_ignore else None):
        yield


@contextlib.contextmanager
def handling(
    signals: Sequence[str], handler: Callable[[int, FrameType | None], Any], *, then: Any = None
) -> Iterator[None]:
    """``handler`` handles ``signals`` for the ``with`` block, on the main thread only (where
    Python runs handlers; elsewhere nothing changes); afterwards the old handlers are put
    back, or ``then`` (such as ``signal.SIG_IGN``) is installed instead."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    numbers = [signal.Signals[name] for name in signals]
    previous = {number: signal.signal(number, handler) for number in numbers}
    try:
        yield
    finally:
        for number, old in previous.items():
            signal.signal(number, old if then is None else then)
