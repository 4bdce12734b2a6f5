"""The numbers a forward's dropout masks are keyed by: ``(seed, step, micro_batch)``.

The caller knows them: ``step`` is how many updates it made before this one (skipped ones
included: the Trainer's ``state.step``) and ``micro_batch`` how many forwards the backend has
already run for this update. So it passes them to ``forward``, ``train_step``,
``train_steps`` and ``train_steps_on_device``, and no backend needs a counter whose value
depends on whether the last update was skipped, which on an accelerator means reading a
device flag back to the host every step. Two pieces serve the two sides:

- :class:`UpdateNumbers`, for a backend: the numbers a call was given, or the backend's own
  count of its ``step`` calls when a direct caller passes None;
- :class:`NumberedCalls`, for a caller (the Trainer, the kit): the backend's calls, always
  taking the numbers. A backend written before they were passed (its methods take no
  ``step``) is still driven, without them, for a deprecation period, with a
  ``DeprecationWarning`` that names it; that old form goes in unitrain 0.4.
"""

from __future__ import annotations

import inspect
import warnings
from collections.abc import Callable
from typing import Any

__all__ = ["NumberedCalls", "UpdateNumbers", "takes_keywords"]


class UpdateNumbers:
    """A backend's ``(step, micro_batch)``: the caller's when given, else its own count.

    The own count follows the caller: a call given ``step`` moves it there, every ``step()``
    call (a skipped update too) adds one and every forward one micro-batch, so a caller that
    passes numbers only sometimes still gets consecutive keys. After ``load_state_dict`` it
    starts from the loaded optimizer step.

    >>> numbers = UpdateNumbers()
    >>> numbers.forward(None, None), numbers.forward(None, None)
    ((0, 0), (0, 1))
    >>> numbers.updated()
    >>> numbers.forward(7, 0), numbers.forward(None, None)
    ((7, 0), (7, 1))
    >>> numbers.fused(None, 3)
    7
    >>> numbers.forward(None, None)
    (10, 0)
    """

    def __init__(self) -> None:
        self.step = 0
        self.micro_batch = 0

    def forward(self, step: int | None, micro_batch: int | None) -> tuple[int, int]:
        """The numbers of a train-mode forward: ``(step, micro_batch)``."""
        if step is not None:
            self.step = int(step)
        if micro_batch is not None:
            self.micro_batch = int(micro_batch)
        numbers = self.step, self.micro_batch
        self.micro_batch += 1
        return numbers

    def updated(self) -> None:
        """A ``step()`` call ended the update, applied or skipped."""
        self.step += 1
        self.micro_batch = 0

    def at(self, step: int | None) -> int:
        """The step a call given ``step`` is numbered by: ``step``, or the own count."""
        return self.step if step is None else int(step)

    def fused(self, step: int | None, updates: int = 1) -> int:
        """The first update's step of a fused call of ``updates`` updates (each micro-batch
        0); the count moves past them."""
        first = self.at(step)
        self.step, self.micro_batch = first + updates, 0
        return first

    def jumped(self, step: int | None) -> bool:
        """Whether the caller's ``step`` differs from the own count (a resume, a direct
        caller's jump); the count moves there. A backend that keeps the step on its device
        writes it there only then.

        >>> numbers = UpdateNumbers()
        >>> numbers.jumped(0), numbers.jumped(None), numbers.jumped(5), numbers.step
        (False, False, True, 5)
        """
        if step is None or step == self.step:
            return False
        self.loaded(step)
        return True

    def loaded(self, step: int) -> None:
        """State was loaded whose optimizer had made ``step`` updates."""
        self.step, self.micro_batch = int(step), 0


def takes_keywords(method: Callable[..., Any], *names: str) -> bool:
    """Whether ``method`` accepts every keyword in ``names`` (or any keyword at all)."""
    try:
        parameters = inspect.signature(method).parameters.values()
    except (TypeError, ValueError):  # a builtin or C method without a signature
        return False
    kinds = {p.name: p.kind for p in parameters}
    if inspect.Parameter.VAR_KEYWORD in kinds.values():
        return True
    keyword = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return all(kinds.get(name) in keyword for name in names)


class NumberedCalls:
    """``backend``'s update calls, each taking the update's numbers.

    ``forward(batch, step, micro_batch)``, ``train_step(batch, lr, step)``,
    ``train_steps(batches, lrs, step)`` and ``train_steps_on_device(indices, lrs, step)``
    pass them on as keywords. An optional method the backend lacks is None here. For a
    method of the old form, which takes no ``step``, the call drops the numbers and the
    backend keys dropout by its own count: the same masks as long as no update is skipped
    and no run resumes.
    """

    def __init__(self, backend: Any) -> None:
        old: list[str] = []

        def numbered(name: str, *keywords: str) -> Any:
            method = getattr(backend, name, None)
            if method is None or takes_keywords(method, *keywords):
                return method
            old.append(name)
            return lambda *args, **_: method(*args)

        self.forward = numbered("forward", "step", "micro_batch")
        self.train_step = numbered("train_step", "step")
        self.train_steps = numbered("train_steps", "step")
        self.train_steps_on_device = numbered("train_steps_on_device", "step")
        #: The methods of the old form, for the warning and the kit's report.
        self.old_form = tuple(old)
        if old:
            warnings.warn(
                f"backend {type(backend).__name__!r}: {', '.join(f'{n}()' for n in old)} take "
                "no step (and forward no micro_batch) keyword. unitrain passes the update's "
                "numbers so that dropout keys need no counter in the backend (see "
                "docs/writing-a-backend.md, 'Dropout keys'); the old form is driven without "
                "them until unitrain 0.4. Add `*, step=None` (and `micro_batch=None` to "
                "forward) and key dropout by them.",
                DeprecationWarning,
                stacklevel=3,
            )
