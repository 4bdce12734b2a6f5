"""The schedule base class, the type-name registry, argument checks and JSON round-tripping."""

from __future__ import annotations

import abc
import dataclasses
import itertools
import json
import math
import numbers
from collections.abc import Mapping
from typing import Any, ClassVar

from unitrain._errors import ConfigError
from unitrain._fields import TypeRegistry

__all__ = [
    "AbstractSchedule",
    "check_float",
    "check_gamma",
    "check_int",
    "check_lr",
    "check_milestones",
    "check_schedule",
    "from_dict",
    "from_json",
    "set_checked",
    "to_json",
]

_REGISTRY: TypeRegistry[AbstractSchedule] = TypeRegistry("schedule")


class AbstractSchedule(abc.ABC):
    """A learning rate as a pure function of the number of optimizer updates already applied.

    Subclasses are frozen dataclasses that name themselves in the class statement,
    ``class CosineDecay(AbstractSchedule, type_name="cosine_decay")``, which registers them
    for :func:`from_dict`. They implement :meth:`_value`; :meth:`__call__` checks the step.
    """

    type_name: ClassVar[str]

    def __init_subclass__(cls, *, type_name: str | None = None, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if type_name is not None:
            _REGISTRY.register(cls, type_name)

    def __call__(self, step: int) -> float:
        """Return the learning rate for update ``step`` (0 for the first update)."""
        if type(step) is not int:
            step = _coerce_step(self, step)
        if step < 0:
            raise ConfigError(
                f"{type(self).__name__}: step must be a non-negative int, got step={step!r}"
            )
        return self._value(step)

    @abc.abstractmethod
    def _value(self, step: int) -> float:
        """Return the learning rate at an already checked, non-negative int step."""

    def to_dict(self) -> dict[str, Any]:
        """Return ``{"type": type_name, **args}`` with JSON types only; children nest."""
        out: dict[str, Any] = {"type": self.type_name}
        for field in dataclasses.fields(self):  # type: ignore[arg-type]
            if field.init:
                out[field.name] = _to_plain(getattr(self, field.name))
        return out

    def to_json(self) -> str:
        """Return :meth:`to_dict` as a JSON string."""
        return json.dumps(self.to_dict(), allow_nan=False)


def _coerce_step(schedule: AbstractSchedule, step: object) -> int:
    # numpy integers are accepted so that a step counter kept in numpy works; bools are not.
    if isinstance(step, numbers.Integral) and not isinstance(step, bool):
        return int(step)
    raise ConfigError(
        f"{type(schedule).__name__}: step must be a non-negative int, got step={step!r}"
    )


def _to_plain(value: object) -> object:
    if isinstance(value, AbstractSchedule):
        return value.to_dict()
    if isinstance(value, tuple):
        return [_to_plain(item) for item in value]
    return value


def _from_plain(value: object) -> object:
    if isinstance(value, Mapping):
        return from_dict(value)
    if isinstance(value, list):
        return tuple(_from_plain(item) for item in value)
    return value


def from_dict(data: Mapping[str, Any]) -> AbstractSchedule:
    """Rebuild a schedule from :meth:`AbstractSchedule.to_dict` output.

    Args:
        data: ``{"type": name, **args}``; nested schedule arguments are dicts themselves.

    Returns:
        A schedule equal to the one that produced ``data``.

    Raises:
        ConfigError: the type is unknown, a field is missing or unknown, or a value is bad.

    Examples:
        >>> from unitrain.schedules import from_dict
        >>> from_dict({"type": "constant", "lr": 0.1})
        Constant(lr=0.1)
    """
    cls, fields = _REGISTRY.lookup(data, "from_dict")
    return cls(**{key: _from_plain(value) for key, value in fields.items()})


def to_json(schedule: AbstractSchedule) -> str:
    """Return ``schedule`` as a JSON string that :func:`from_json` reads back."""
    return schedule.to_json()


def from_json(text: str) -> AbstractSchedule:
    """Rebuild a schedule from :func:`to_json` output; bad JSON raises ConfigError."""
    try:
        data = json.loads(text)
    except (TypeError, ValueError) as error:
        raise ConfigError(f"from_json: not valid JSON ({error}), got text={text!r}") from error
    return from_dict(data)


# Argument checks. Each returns the value normalised to a plain Python type, so that
# to_dict emits JSON types and equality does not depend on how a value was spelled.


def set_checked(obj: object, name: str, value: object) -> None:
    """Store a checked value on a frozen dataclass (only ever from ``__post_init__``)."""
    object.__setattr__(obj, name, value)


def check_int(owner: str, name: str, value: object, *, minimum: int) -> int:
    """Return ``value`` as an int, or raise ConfigError if it is not an int >= ``minimum``."""
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        number = int(value)
        if number >= minimum:
            return number
    kind = {0: "a non-negative int", 1: "a positive int"}.get(minimum, f"an int >= {minimum}")
    raise ConfigError(f"{owner}: {name} must be {kind}, got {name}={value!r}")


def check_float(
    owner: str,
    name: str,
    value: object,
    *,
    low: float,
    high: float = math.inf,
    low_open: bool = False,
    high_open: bool = False,
    requirement: str,
) -> float:
    """Return ``value`` as a finite float in the range, else raise with ``requirement``."""
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        number = float(value)
        above = number > low if low_open else number >= low
        below = number < high if high_open else number <= high
        if math.isfinite(number) and above and below:
            return number
    raise ConfigError(f"{owner}: {name} must be {requirement}, got {name}={value!r}")


def check_gamma(owner: str, value: object) -> float:
    """Return a decay factor ``gamma`` as a float in (0, 1], else raise ConfigError."""
    requirement = "a float with 0 < gamma <= 1"
    return check_float(
        owner, "gamma", value, low=0.0, high=1.0, low_open=True, requirement=requirement
    )


def check_lr(owner: str, name: str, value: object) -> float:
    """Return a learning rate as a float; NaN, infinite and negative values raise."""
    return check_float(owner, name, value, low=0.0, requirement="a finite float >= 0")


def check_milestones(owner: str, name: str, value: object) -> tuple[int, ...]:
    """Return a non-empty, strictly increasing tuple of positive ints, else raise."""
    if isinstance(value, (list, tuple)) and value:
        try:
            items = tuple(check_int(owner, name, item, minimum=1) for item in value)
        except ConfigError:
            items = ()
        if items and all(a < b for a, b in itertools.pairwise(items)):
            return items
    raise ConfigError(
        f"{owner}: {name} must be a non-empty, strictly increasing sequence of positive ints, "
        f"got {name}={value!r}"
    )


def check_schedule(owner: str, name: str, value: object) -> AbstractSchedule:
    """Return ``value`` if it is a schedule, else raise ConfigError."""
    if isinstance(value, AbstractSchedule):
        return value
    raise ConfigError(f"{owner}: {name} must be a schedule, got {name}={value!r}")
