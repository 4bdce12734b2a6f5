"""Property-based exploration with hypothesis, bounded and reproducible.

Checks that explore (optimizer hyperparameters and gradients, scripted metric sequences) run
a few *explicit* examples first, chosen to expose known traps, then examples drawn by
hypothesis. Two profiles:

- ``ci`` (the default): derandomized, so the same examples run every time and a verdict is
  reproducible; few examples, to keep the kit fast.
- ``dev``: random and more examples, for a backend author hunting bugs.

No shrinking (a failing 100-step trajectory is already small, and shrinking would rerun it
hundreds of times) and no example database (the kit writes nothing into the user's tree).
hypothesis is a test dependency, not a runtime one: without it only the explicit examples
run, and the report says so.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from unitrain.conformance._context import CheckFailed, Context

__all__ = ["PROFILES", "explore", "hypothesis_available"]

#: Profile name -> (derandomize, max_examples).
PROFILES = {"ci": (True, 3), "dev": (False, 25)}


def hypothesis_available() -> bool:
    """Whether hypothesis can be imported."""
    try:
        import hypothesis  # noqa: F401
    except ImportError:
        return False
    return True


def explore(
    ctx: Context,
    run_example: Callable[[Any], None],
    *,
    strategy: Callable[[], Any] | None,
    explicit: Sequence[Any] = (),
) -> None:
    """Run ``explicit`` examples, then hypothesis-drawn ones, until one fails.

    Args:
        ctx: the check's context (its ``hypothesis_profile`` is used).
        run_example: raises :class:`CheckFailed` when an example fails.
        strategy: a function returning the hypothesis strategy (called only when hypothesis
            is installed), or None for explicit examples only.
        explicit: examples that always run first.

    Raises:
        CheckFailed: naming the failing example.
    """
    for example in explicit:
        _run(run_example, example)
    if strategy is None:
        return
    if not hypothesis_available():
        ctx.notes.append("hypothesis is not installed: explicit examples only")
        return
    from hypothesis import HealthCheck, Phase, given, settings

    derandomize, examples = PROFILES[ctx.hypothesis_profile]
    config = settings(
        derandomize=derandomize,
        max_examples=examples,
        deadline=None,
        database=None,
        phases=(Phase.explicit, Phase.generate),
        suppress_health_check=list(HealthCheck),
        print_blob=False,
        report_multiple_bugs=False,
    )

    @config
    @given(strategy())
    def search(example: Any) -> None:
        _run(run_example, example)

    search()


def _run(run_example: Callable[[Any], None], example: Any) -> None:
    try:
        run_example(example)
    except CheckFailed as failure:
        raise CheckFailed(f"{failure} [example: {_describe(example)}]") from None


def _describe(example: Any) -> str:
    text = repr(example)
    return text if len(text) <= 400 else text[:397] + "..."
