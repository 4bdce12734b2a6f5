"""The one registry of checks behind the CLI, the pytest plugin and ``check_backend``.

A check is a function of a :class:`~unitrain.conformance._context.Context` registered with
:func:`check` under a family and a name. Its stable id is ``family::name[device-dtype]``; the
part before the bracket (``family::name``) is its *base id*. Ids never change meaning: a check
whose semantics change gets a new name.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from unitrain.conformance._context import Context

__all__ = [
    "FAMILIES",
    "Check",
    "CheckFunction",
    "all_checks",
    "check",
    "check_id",
    "keyword_matcher",
    "xfail_reason",
]

#: The families, in report order.
FAMILIES = (
    "ops",
    "schedules",
    "optimizers",
    "checkpoints",
    "resume",
    "early_stopping",
    "callbacks",
    "eval_mode",
    "losses",
    "dropout",
    "accumulation",
    "clipping",
    "fused",
    "determinism",
    "devices",
    "mixed_precision",
    "layers",
    "model_state",
    "handoff",
    "data_parallel",
    "sharded",
)

CheckFunction = Callable[["Context"], None]


@dataclasses.dataclass(frozen=True)
class Check:
    """One registered check.

    Attributes:
        family: one of :data:`FAMILIES`.
        name: the check's name within the family.
        function: runs the check; raises ``CheckFailed`` / ``CheckSkipped`` or returns.
        requires: capability names that must be declared (``"portable_layers"``), else skip.
        description: the first docstring line, shown by ``--list``.
        guards: the backend bugs it fails on, shown by ``--list`` (and listed in
            docs/writing-a-backend.md), so that an author knows what to look for.
    """

    family: str
    name: str
    function: CheckFunction
    requires: tuple[str, ...] = ()
    description: str = ""
    guards: str = ""

    @property
    def base_id(self) -> str:
        """``family::name``."""
        return f"{self.family}::{self.name}"

    def id(self, device: str, dtype: str) -> str:
        """The stable id ``family::name[device-dtype]``."""
        return check_id(self.family, self.name, device, dtype)


_CHECKS: dict[str, Check] = {}


def check_id(family: str, name: str, device: str, dtype: str) -> str:
    """Format a stable check id.

    Examples:
        >>> check_id("optimizers", "adam", "cpu", "float32")
        'optimizers::adam[cpu-float32]'
    """
    return f"{family}::{name}[{device}-{dtype}]"


def check(
    family: str, name: str, *, requires: Iterable[str] = (), guards: str
) -> Callable[[CheckFunction], CheckFunction]:
    """Register the decorated function as the check ``family::name``.

    ``guards`` names the backend bugs the check fails on, in a few words.
    """
    if family not in FAMILIES:
        raise ValueError(f"unknown check family {family!r}; known: {FAMILIES}")

    def register(function: CheckFunction) -> CheckFunction:
        add_check(family, name, function, requires=requires, guards=guards)
        return function

    return register


def add_check(
    family: str,
    name: str,
    function: CheckFunction,
    *,
    requires: Iterable[str] = (),
    description: str | None = None,
    guards: str,
) -> Check:
    """Register ``function`` as ``family::name`` (for checks generated from a table)."""
    if not guards:
        raise ValueError(f"check {family}::{name} must say what it guards against")
    base = f"{family}::{name}"
    if base in _CHECKS:
        existing = _CHECKS[base]
        # The same module imported under a second name (a second copy of the package on the
        # path, or a check file run as a script) keeps the first registration; a different
        # check under the same id is an error.
        if _same_source(existing.function, function):
            return existing
        raise ValueError(f"check {base!r} is registered twice")
    doc = description if description is not None else (function.__doc__ or "")
    summary = doc.strip().split("\n")[0]
    registered = Check(family, name, function, tuple(requires), summary, guards)
    _CHECKS[base] = registered
    return registered


def _same_source(first: CheckFunction, second: CheckFunction) -> bool:
    tail = lambda f: (f.__module__.rsplit(".", 2)[-2:], f.__qualname__)  # noqa: E731
    return tail(first) == tail(second)


def all_checks() -> list[Check]:
    """Every registered check, by family order then registration order."""
    import unitrain.conformance.checks  # noqa: F401  (registers the built-in checks)

    order = {family: i for i, family in enumerate(FAMILIES)}
    return sorted(_CHECKS.values(), key=lambda c: order[c.family])


_BOUNDARIES = ("::", "[", "-", "]")


def _key_matches(key: str, identifier: str) -> bool:
    if "*" in key:  # only "*" is special: ids contain brackets, which fnmatch would not keep
        pattern = ".*".join(re.escape(part) for part in key.split("*"))
        return re.fullmatch(pattern, identifier) is not None
    if identifier == key:
        return True
    if not identifier.startswith(key):
        return False
    # A prefix matches only up to a boundary, so "optimizers::adam" does not match
    # "optimizers::adamw[...]".
    return key.endswith(_BOUNDARIES) or identifier[len(key) :].startswith(("[", "::"))


def xfail_reason(xfails: Mapping[str, str], identifier: str) -> tuple[str, str] | None:
    """The ``(key, reason)`` of the first declared xfail that matches ``identifier``.

    A key is a full id, a prefix ending at a boundary (``"optimizers::"``,
    ``"optimizers::adam"``, ``"optimizers::adam[cpu-"``), or a pattern where ``*`` matches
    anything (``"fused::*[gpu-*]"``).

    Examples:
        >>> xfail_reason({"optimizers::adam": "eps"}, "optimizers::adam[cpu-float32]")
        ('optimizers::adam', 'eps')
        >>> xfail_reason({"optimizers::adam": "eps"}, "optimizers::adamw[cpu-float32]") is None
        True
    """
    for key, reason in xfails.items():
        if _key_matches(key, identifier):
            return key, reason
    return None


def key_matches_any(key: str, identifiers: Iterable[str], bases: Iterable[str]) -> bool:
    """Whether an xfail key matches at least one id (or base id) the kit knows."""
    return any(_key_matches(key, i) for i in identifiers) or any(
        _key_matches(key, b) or b.startswith(key) for b in bases
    )


_TOKEN = re.compile(r"\s*(\(|\)|[^\s()]+)")


def keyword_matcher(expression: str | None) -> Callable[[str], bool]:
    """A predicate on check ids from a pytest-style ``-k`` expression.

    Words are matched as case-insensitive substrings of the id and combined with ``and``,
    ``or``, ``not`` and parentheses.

    Examples:
        >>> match = keyword_matcher("optimizers and not adam")
        >>> match("optimizers::sgd_momentum[cpu-float32]"), match("optimizers::adam[cpu-float32]")
        (True, False)
    """
    if not expression or not expression.strip():
        return lambda identifier: True
    tokens = [t for t in _TOKEN.findall(expression) if t]
    words: list[str] = []
    code: list[str] = []
    for token in tokens:
        lowered = token.lower()
        if lowered in ("and", "or", "not", "(", ")"):
            code.append(lowered)
        else:
            code.append(f"_w[{len(words)}]")
            words.append(lowered)
    source = " ".join(code)
    try:
        compiled = compile(source, "<-k>", "eval")
        eval(compiled, {"__builtins__": {}}, {"_w": [True] * len(words)})
    except SyntaxError:
        raise ValueError(f"bad -k expression {expression!r}") from None

    def matches(identifier: str) -> bool:
        lowered = identifier.lower()
        found = [word in lowered for word in words]
        return bool(eval(compiled, {"__builtins__": {}}, {"_w": found}))

    return matches
