"""Parameter groups: optimizer options per group of parameters, chosen by name or layer type.

A :class:`Group` is data, like the optimizer that holds it: the parameters it selects
(``match``: globs on canonical parameter names such as ``"*.bias"``, or layer types such as
``"LayerNorm"``), a learning-rate multiplier and any of the optimizer's hyperparameters.
Parameters take the first group that selects them, and the optimizer's own options otherwise,
as ``torch.optim`` param groups and ``optax.multi_transform`` labels do.

Layer types are resolved against the model once, when a backend is built
(:func:`for_model`); from then on a group names parameters only, so an adapter needs nothing
but the names (:func:`parameter_groups`).
"""

from __future__ import annotations

import dataclasses
import difflib
import fnmatch
import functools
import math
import numbers
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple, TypeVar

from unitrain._errors import ConfigError

if TYPE_CHECKING:
    from unitrain.optim._base import AbstractOptimizer

__all__ = ["Group", "ParameterGroup", "bind_options", "for_model", "parameter_groups"]

_Options = TypeVar("_Options")


@dataclasses.dataclass(frozen=True, init=False, repr=False)
class Group:
    """Options for the parameters that ``match`` selects.

    Args:
        match: one entry or several. An entry that is a bare capitalised name (``"LayerNorm"``,
            ``"Embedding"``) selects every parameter of a layer of that type (or of a subclass);
            any other entry is a glob on canonical parameter names (``"*.bias"``,
            ``"blocks.*.attention.*"``, ``"head.weight"``).
        lr_scale: multiplies the schedule's learning rate for these parameters (0 freezes them).
        **overrides: any hyperparameter of the optimizer (``weight_decay=0.0``,
            ``beta2=0.95``); checked when the group is given to one.

    Examples:
        >>> Group(match=("*.bias", "LayerNorm"), weight_decay=0.0).to_dict()
        {'match': ['*.bias', 'LayerNorm'], 'lr_scale': 1.0, 'weight_decay': 0.0}
    """

    match: tuple[str, ...]
    lr_scale: float
    #: ``(field, value)`` pairs, sorted by field name.
    overrides: tuple[tuple[str, Any], ...]

    def __init__(self, match: str | Sequence[str], lr_scale: float = 1.0, **overrides: Any):
        entries = (match,) if isinstance(match, str) else tuple(match)
        if not entries or not all(isinstance(e, str) and e for e in entries):
            raise ConfigError(
                f"Group: match must be a non-empty name pattern or layer type, or a list of "
                f"them, got match={match!r}"
            )
        if not isinstance(lr_scale, numbers.Real) or isinstance(lr_scale, bool):
            raise ConfigError(f"Group: lr_scale must be a number, got lr_scale={lr_scale!r}")
        if not 0.0 <= float(lr_scale) < math.inf:
            raise ConfigError(f"Group: lr_scale must be finite and >= 0, got {lr_scale=}")
        if "lr" in overrides:
            raise ConfigError(
                "Group: the learning rate comes from the schedule; give the group "
                f"lr_scale=<multiplier> instead of lr={overrides['lr']!r}"
            )
        object.__setattr__(self, "match", entries)
        object.__setattr__(self, "lr_scale", float(lr_scale))
        object.__setattr__(self, "overrides", tuple(sorted(overrides.items())))

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Group:
        """A group from :meth:`to_dict` output (a recipe's ``[[optimizer.groups]]`` table)."""
        if not isinstance(data, Mapping) or "match" not in data:
            raise ConfigError(
                f"an optimizer group needs a 'match' entry (name patterns or layer types), "
                f"got {data!r}"
            )
        return cls(**dict(data))

    def __repr__(self) -> str:
        scale = f", lr_scale={self.lr_scale!r}" if self.lr_scale != 1.0 else ""
        options = "".join(f", {name}={value!r}" for name, value in self.overrides)
        return f"Group(match={self.match!r}{scale}{options})"

    def to_dict(self) -> dict[str, Any]:
        """``{"match": [...], "lr_scale": x, **overrides}`` with JSON types only."""
        return {"match": list(self.match), "lr_scale": self.lr_scale, **dict(self.overrides)}


class ParameterGroup(NamedTuple):
    """The parameters that share one set of options, as an adapter runs them."""

    #: The optimizer with the group's overrides (and no groups of its own).
    optimizer: AbstractOptimizer
    #: Multiplies the learning rate of each update.
    lr_scale: float
    #: Canonical names, in the order they were given.
    names: tuple[str, ...]


def checked_groups(optimizer: AbstractOptimizer, groups: Any) -> tuple[Group, ...]:
    """``groups`` as a tuple of :class:`Group` whose overrides ``optimizer`` accepts (its
    ``__post_init__`` calls this), with the values its own checks normalise them to.

    Raises:
        ConfigError: a group is malformed, overrides a field the optimizer does not have, gives
            it a bad value, or would change the state it keeps (its slots).
    """
    owner = type(optimizer).__name__
    if isinstance(groups, Group | Mapping) or not isinstance(groups, Iterable):
        raise ConfigError(f"{owner}: groups must be a list of optim.Group, got {groups!r}")
    fields = {f.name for f in dataclasses.fields(optimizer) if f.init} - {"groups"}  # type: ignore[arg-type]
    checked = []
    for group in groups:
        if isinstance(group, Mapping):
            group = Group.from_dict(group)
        if not isinstance(group, Group):
            raise ConfigError(f"{owner}: groups must be optim.Group entries, got {group!r}")
        overrides = dict(group.overrides)
        unknown = sorted(set(overrides) - fields)
        if unknown:
            raise ConfigError(
                f"{owner} has no hyperparameter {unknown[0]!r} for a group to set; its "
                f"hyperparameters are {', '.join(sorted(fields))}, and lr_scale scales the "
                "learning rate"
            )
        options = dataclasses.replace(optimizer, groups=(), **overrides)  # type: ignore[type-var]
        if options.state_slots != optimizer.state_slots:
            raise ConfigError(
                f"{owner}: a group cannot change the state the optimizer keeps (with "
                f"{group.to_dict()} its slots would be {options.state_slots}, not "
                f"{optimizer.state_slots}); set that option on the optimizer itself"
            )
        normalised = {name: getattr(options, name) for name in overrides}
        checked.append(Group(group.match, group.lr_scale, **normalised))
    return tuple(checked)


def is_layer_type(entry: str) -> bool:
    """Whether a ``match`` entry names a layer type (a bare capitalised name) rather than
    being a glob on parameter names.

    Examples:
        >>> is_layer_type("LayerNorm"), is_layer_type("*.bias"), is_layer_type("head")
        (True, False, False)
    """
    return entry.isidentifier() and entry[0].isupper()


def _exact(name: str) -> str:
    """A glob that matches ``name`` alone and never reads as a layer type."""
    escaped = "".join(f"[{c}]" if c in "*?[" else c for c in name)
    return f"[{escaped[0]}]{escaped[1:]}" if is_layer_type(escaped) else escaped


def _layer_types(model: Any) -> dict[str, set[str]]:
    """Canonical parameter name -> the class names of its layer (and the layer's bases)."""
    from unitrain.models import AbstractLayer

    types: dict[str, set[str]] = {}
    for prefix, layer in model.named_layers():
        mro = type(layer).__mro__
        bases = {c.__name__ for c in mro if issubclass(c, AbstractLayer) and c is not AbstractLayer}
        for local in layer.own_param_shapes():
            types[f"{prefix}.{local}" if prefix else local] = bases
    return types


def _matching(names: Sequence[str], entry: str) -> list[str]:
    return [name for name in names if fnmatch.fnmatchcase(name, entry)]


def _no_match(entry: str, names: Sequence[str], known_types: Sequence[str] = ()) -> str:
    """The message for an entry that selects no parameter: the model's parameters (a few) and,
    for a layer type, the model's types and the closest one."""
    shown = ", ".join(repr(n) for n in list(names)[:6])
    more = f" (and {len(names) - 6} more)" if len(names) > 6 else ""
    if not is_layer_type(entry):
        return (
            f"optimizer group pattern {entry!r} (a glob on parameter names) matches no "
            f"parameter; the model's parameters are {shown}{more}"
        )
    close = difflib.get_close_matches(entry, list(known_types), n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return (
        f"optimizer group pattern {entry!r} (a layer type) matches no parameter{hint}; the "
        f"model's layer types are {', '.join(known_types)}; its parameters are {shown}{more}"
    )


def for_model(optimizer: AbstractOptimizer, model: Any) -> AbstractOptimizer:
    """``optimizer`` with each group's layer types replaced by the names of the parameters of
    ``model`` they select, after checking that every entry selects at least one parameter.

    Backends call this once, when they are built (:func:`bind_options`); an optimizer without
    groups comes back as it is.

    Raises:
        ConfigError: an entry selects no parameter (the message names it and lists some of
            the model's parameters), or names a layer type of a model that has none (a native
            model: match its parameters by name).

    Examples:
        >>> from unitrain.models import LayerNorm, Linear, Sequential
        >>> from unitrain.optim import AdamW
        >>> spec = AdamW(groups=[Group(match="LayerNorm", weight_decay=0.0)])
        >>> for_model(spec, Sequential([Linear(2, 2), LayerNorm(2)])).groups[0].match
        ('1.weight', '1.bias')
    """
    if not optimizer.groups:
        return optimizer
    from unitrain.models import AbstractLayer

    portable = isinstance(model, AbstractLayer)
    types = _layer_types(model) if portable else {}
    names = list(types)
    known_types = sorted(set().union(*types.values())) if types else []
    groups = []
    for group in optimizer.groups:
        entries: list[str] = []
        for entry in group.match:
            if not is_layer_type(entry):
                if portable and not _matching(names, entry):
                    raise ConfigError(_no_match(entry, names))
                entries.append(entry)
                continue
            if not portable:
                raise ConfigError(
                    f"optimizer group entry {entry!r} names a layer type, which only a "
                    f"unitrain.models model has; this model is a native "
                    f"{type(model).__name__}: match its parameters by name instead (e.g. "
                    f"'*.bias', 'ln_f.*')"
                )
            selected = [name for name in names if entry in types[name]]
            if not selected:
                raise ConfigError(_no_match(entry, names, known_types))
            entries.extend(_exact(name) for name in selected)
        groups.append(Group(tuple(dict.fromkeys(entries)), group.lr_scale, **dict(group.overrides)))
    return dataclasses.replace(optimizer, groups=tuple(groups))  # type: ignore[type-var]


def bind_options(options: _Options, model: Any) -> _Options:
    """``options`` (a :class:`~unitrain.backends.protocol.BackendOptions`) with its optimizer
    resolved for ``model`` by :func:`for_model`; the same object when nothing changes."""
    optimizer = options.optimizer  # type: ignore[attr-defined]
    bound = for_model(optimizer, model)
    return options if bound is optimizer else dataclasses.replace(options, optimizer=bound)  # type: ignore[type-var]


def parameter_groups(optimizer: AbstractOptimizer, names: Iterable[str]) -> list[ParameterGroup]:
    """``names`` split into the optimizer's groups: each name goes to the first group that
    matches it, and the names no group matches to the optimizer's own options (last).

    Groups that end up with no parameter (every one taken by an earlier group) are left out.

    Raises:
        ConfigError: an entry matches none of ``names``, or is a layer type that
            :func:`for_model` has not resolved.

    Examples:
        >>> from unitrain.optim import SGD
        >>> spec = SGD(weight_decay=0.1, groups=[Group("*.bias", weight_decay=0.0)])
        >>> [(g.optimizer.weight_decay, g.names) for g in parameter_groups(spec, ["w", "b.bias"])]
        [(0.0, ('b.bias',)), (0.1, ('w',))]
    """
    names = tuple(names)
    try:
        return list(_cached_groups(optimizer, names))
    except TypeError:  # an optimizer of the user's with an unhashable field
        return _split(optimizer, names)


def each_parameter_rule(
    optimizer: AbstractOptimizer, names: Sequence[str], lr: Any
) -> Iterator[tuple[AbstractOptimizer, Any, int]]:
    """``(options, learning rate, index)`` for each parameter, by its position in ``names``
    (the canonical names in the order the caller holds the parameters): its group's options
    and ``lr`` times its group's ``lr_scale``. What an adapter's generic update runs
    ``options.update`` over, parameter by parameter.

    Examples:
        >>> from unitrain.optim import SGD
        >>> spec = SGD(groups=[Group("*.bias", lr_scale=0.5)])
        >>> [(index, lr) for _, lr, index in each_parameter_rule(spec, ["w", "b.bias"], 0.1)]
        [(1, 0.05), (0, 0.1)]
    """
    position = {name: index for index, name in enumerate(names)}
    for group in parameter_groups(optimizer, position):
        group_lr = lr if group.lr_scale == 1.0 else lr * group.lr_scale
        for name in group.names:
            yield group.optimizer, group_lr, position[name]


def _split(optimizer: AbstractOptimizer, names: tuple[str, ...]) -> list[ParameterGroup]:
    if not optimizer.groups:
        return [ParameterGroup(optimizer, 1.0, names)]
    members: list[list[str]] = [[] for _ in optimizer.groups]
    for group in optimizer.groups:
        for entry in group.match:
            if is_layer_type(entry):
                raise ConfigError(
                    f"optimizer group entry {entry!r} is a layer type, which a backend resolves "
                    "against its model: build the optimizer with "
                    "unitrain.optim.for_model(optimizer, model) first"
                )
            if not _matching(names, entry):
                raise ConfigError(_no_match(entry, names))
    rest: list[str] = []
    for name in names:
        for index, group in enumerate(optimizer.groups):
            if any(fnmatch.fnmatchcase(name, entry) for entry in group.match):
                members[index].append(name)
                break
        else:
            rest.append(name)
    base: Any = dataclasses.replace(optimizer, groups=())  # type: ignore[type-var]
    found = [
        ParameterGroup(
            dataclasses.replace(base, **dict(group.overrides)), group.lr_scale, tuple(chosen)
        )
        for group, chosen in zip(optimizer.groups, members, strict=True)
        if chosen
    ]
    return found + ([ParameterGroup(base, 1.0, tuple(rest))] if rest else [])


_cached_groups = functools.lru_cache(maxsize=64)(_split)
