"""Recipes: a whole training setup as one object, read from a Python or a TOML file.

A recipe file is either Python exposing ``recipe()`` that returns a :class:`Recipe`, or
TOML holding what :func:`recipe_to_dict` writes: each part is the part's own ``to_dict``
(models, data, optimizers, schedules, callbacks, metrics) and the config's fields. So a
Python recipe made of built-in parts can be written out as TOML and read back equal.
``unitrain train RECIPE --set config.epochs=3`` changes one value of either kind.

A TOML recipe and ``--set`` are data: they name only registered types and keep logger and
checkpoint paths inside the run folder, unless ``allow_imports`` / ``allow_absolute_paths``
(``--allow-imports`` / ``--allow-absolute-paths``) say otherwise; see
:mod:`unitrain.recipes._trust` for the entry points that register a package's types. A Python
recipe is code: loading it runs it, so load only recipes you trust.

Examples:
    >>> recipe = load_recipe("digits")
    >>> apply_overrides(recipe, ["config.epochs=2", "optimizer.momentum=0.5"]).config.epochs
    2
    >>> recipe_to_dict(recipe_from_dict(recipe_to_dict(recipe))) == recipe_to_dict(recipe)
    True
"""

from __future__ import annotations

import copy
import dataclasses
import importlib
import importlib.util
import inspect
import sys
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from unitrain._errors import ConfigError
from unitrain._fields import did_you_mean
from unitrain.callbacks import callback_from_dict
from unitrain.losses import resolve_loss
from unitrain.metrics import metric_from_dict, resolve_metrics
from unitrain.models import model_from_dict
from unitrain.optim import SGD, Optimizer, optimizer_from_dict
from unitrain.recipes import _toml, _trust
from unitrain.recipes._epochs import schedule_in_updates
from unitrain.schedules import AbstractSchedule, Constant
from unitrain.schedules import from_dict as schedule_from_dict
from unitrain.training.config import TrainerConfig

__all__ = [
    "Recipe",
    "apply_overrides",
    "load_recipe",
    "recipe_from_dict",
    "recipe_to_dict",
    "recipe_to_toml",
]

#: Recipes that ship with unitrain, by the name ``unitrain train NAME`` accepts.
BUILT_IN = {"digits": "unitrain.recipes.digits"}


@dataclasses.dataclass
class Recipe:
    """Everything a run needs besides the backend: what to train, on what, and how.

    Args:
        model: a portable model (:mod:`unitrain.models`) or one native to a backend.
        data: an object whose ``load()`` returns ``(train, val)`` (``val`` may be None), such
            as :class:`unitrain.recipes.Digits`, or that pair itself (Python recipes only).
        optimizer: from :mod:`unitrain.optim`.
        schedule: from :mod:`unitrain.schedules`.
        callbacks: training callbacks (early stopping, checkpoints, ...); ``unitrain train``
            adds its own loggers beside them.
        config: a :class:`~unitrain.training.config.TrainerConfig`.
        loss: a :mod:`unitrain.losses` loss or its type name (``"cross_entropy"``, ``"mse"``);
            a recipe file writes a loss with parameters as a ``[loss]`` table.
        metrics: metrics for ``Trainer(metrics=...)``.
        name: names the run's folder (``runs/<name>``).
    """

    model: Any
    data: Any
    optimizer: Optimizer = dataclasses.field(default_factory=SGD)
    schedule: AbstractSchedule = dataclasses.field(default_factory=lambda: Constant(0.01))
    callbacks: list[Any] = dataclasses.field(default_factory=list)
    config: TrainerConfig = dataclasses.field(default_factory=TrainerConfig)
    loss: Any = "cross_entropy"
    metrics: list[Any] = dataclasses.field(default_factory=list)
    name: str = "recipe"

    def build(
        self,
        backend: Any = None,
        *,
        callbacks: Any = (),
        run_dir: str | Path | None = None,
        **config: Any,
    ) -> Any:
        """A :class:`~unitrain.training.trainer.Trainer` for this recipe on ``backend``.

        Args:
            backend: as ``Trainer(backend=...)``.
            callbacks: added after the recipe's own (loggers a command line adds).
            run_dir: the run's folder; the recipe's callbacks then write their relative
                paths (``path``, ``log_dir``, ``dirpath``) inside it, not in the working
                directory. The recipe's own callbacks are left as they are.
            config: config fields to replace (``device="cpu"``, ``checkpoint_dir=...``).
        """
        from unitrain.training.trainer import (
            Trainer,  # the Trainer imports recipes' parts, not back
        )

        own = (
            self.callbacks
            if run_dir is None
            else [_rooted(c, Path(run_dir)) for c in self.callbacks]
        )
        return Trainer(
            self.model,
            backend=backend,
            optimizer=self.optimizer,
            schedule=self.schedule,
            loss=self.loss,
            callbacks=[*own, *callbacks],
            metrics=self.metrics,
            config=dataclasses.replace(self.config, **config),
        )

    def load_data(self) -> tuple[Any, Any]:
        """``(train, val)`` from :attr:`data`."""
        loaded = self.data.load() if hasattr(self.data, "load") else self.data
        if not (isinstance(loaded, tuple) and len(loaded) == 2):
            raise ConfigError(
                f"recipe {self.name!r}: data must give (train, val), got {type(loaded).__name__}"
            )
        return loaded


def load_recipe(
    spec: str | Path,
    overrides: Sequence[str] = (),
    *,
    allow_imports: bool = False,
    allow_absolute_paths: bool = False,
) -> Recipe:
    """Read a recipe: a ``.py`` file with ``recipe()``, a ``.toml`` file, or a built-in name.

    A ``.py`` recipe is code and runs as it is imported: load only files you trust. A
    ``.toml`` recipe and the ``overrides`` are data, held to what :func:`recipe_from_dict`
    allows.

    Args:
        spec: the file, or the name of a built-in recipe (``"digits"``).
        overrides: ``section.key=value`` assignments, applied as :func:`apply_overrides`
            does. A Python ``recipe(config)`` that takes a config is called with the
            overridden one, so what it derives from the config (a schedule sized to
            ``config.epochs``) follows ``--set config.epochs=3``; so do a TOML schedule's
            lengths written in epochs (``"(config.epochs - 1) epochs"``, see
            :mod:`unitrain.recipes._epochs`).
        allow_imports: let the TOML file and the overrides name any class as
            ``"package.module:Class"``, which imports and runs it (``--allow-imports``).
        allow_absolute_paths: let them point loggers, checkpoints and the run's name
            outside the run folder (``--allow-absolute-paths``).

    Raises:
        ConfigError: the file is missing, has no ``recipe()``, describes something unknown,
            or asks for what is not allowed.
    """
    allowed = {"allow_imports": allow_imports, "allow_absolute_paths": allow_absolute_paths}
    if str(spec) in BUILT_IN:
        module = importlib.import_module(BUILT_IN[str(spec)])
        recipe = _called(module, str(spec), overrides, allowed)
        return apply_overrides(recipe, list(overrides), **allowed)
    path = Path(spec)
    if not path.is_file():
        raise ConfigError(
            f"recipe {str(spec)!r} is neither a file nor a built-in recipe "
            f"({', '.join(BUILT_IN)}); pass a .py file with recipe() or a .toml file"
        )
    if path.suffix == ".toml":
        tables = _toml.loads(path.read_text(encoding="utf-8"), path)
        recipe = recipe_from_dict(tables, **allowed)
        if config_only := [o for o in overrides if o.strip().startswith("config.")]:
            # Read again with the config --set gives, as a Python recipe(config) is called
            # again: schedule lengths written in epochs follow config.epochs=3.
            config = apply_overrides(recipe, config_only, **allowed).config
            recipe = recipe_from_dict({**tables, "config": _config_dict(config)}, **allowed)
    elif path.suffix == ".py":
        module_name = f"unitrain_recipe_{path.stem}"
        loader = importlib.util.spec_from_file_location(module_name, path)
        if loader is None or loader.loader is None:
            raise ConfigError(f"{path}: cannot be imported as a Python file")
        module = importlib.util.module_from_spec(loader)
        sys.modules[module_name] = module  # dataclasses and pickling look modules up here
        loader.loader.exec_module(module)
        recipe = _called(module, str(path), overrides, allowed)
    else:
        raise ConfigError(f"{path}: a recipe file ends in .py or .toml")
    if recipe.name == "recipe":
        recipe.name = path.stem
    return apply_overrides(recipe, list(overrides), **allowed)


def _called(module: Any, label: str, overrides: Sequence[str], allowed: dict[str, bool]) -> Recipe:
    make = getattr(module, "recipe", None)
    if not callable(make):
        raise ConfigError(f"{label}: a Python recipe defines recipe() returning a Recipe")
    recipe = make()
    if "config" in inspect.signature(make).parameters:
        config_only = [o for o in overrides if o.strip().startswith("config.")]
        recipe = make(config=apply_overrides(recipe, config_only, **allowed).config)
    if not isinstance(recipe, Recipe):
        raise ConfigError(
            f"{label}: recipe() must return unitrain.recipes.Recipe, got {type(recipe).__name__}"
        )
    return recipe


def _config_dict(config: TrainerConfig) -> dict[str, Any]:
    """Only the fields that differ from the defaults: short files, defaults stay defaults."""
    default = TrainerConfig()
    return {
        field.name: getattr(config, field.name)
        for field in dataclasses.fields(config)
        if getattr(config, field.name) != getattr(default, field.name)
    }


def recipe_to_dict(recipe: Recipe) -> dict[str, Any]:
    """The recipe as plain data, each part by its own ``to_dict``.

    Raises:
        ConfigError: a part cannot be described as data (a native model, a data pair, a
            callback or metric holding code); such recipes stay Python files.
    """
    parts = {"model": recipe.model, "data": recipe.data}
    if not isinstance(recipe.loss, str):  # a name stays a name; a loss object is a table
        parts["loss"] = recipe.loss
    for label, part in parts.items():
        if not hasattr(part, "to_dict"):
            raise ConfigError(
                f"recipe {recipe.name!r}: its {label} ({type(part).__name__}) has no to_dict, "
                "so the recipe cannot be written as TOML; keep it a Python file"
            )
    return {
        "name": recipe.name,
        "loss": recipe.loss if isinstance(recipe.loss, str) else recipe.loss.to_dict(),
        "metrics": [metric.to_dict() for metric in resolve_metrics(recipe.metrics)],
        "config": _config_dict(recipe.config),
        "model": recipe.model.to_dict(),
        "data": recipe.data.to_dict(),
        "optimizer": recipe.optimizer.to_dict(),
        "schedule": recipe.schedule.to_dict(),
        "callbacks": [callback.to_dict() for callback in recipe.callbacks],
    }


def _data_from_dict(data: dict[str, Any], *, allow_imports: bool) -> Any:
    """Data from its table: ``digits``, an entry point of ``unitrain.data``, or, with
    ``allow_imports``, a class with ``load()`` and ``to_dict()`` as ``package.module:Class``."""
    from unitrain.recipes import Digits

    fields = dict(data)
    kind = fields.pop("type", None)
    if not isinstance(kind, str):
        raise ConfigError(f"[data] needs a 'type' (e.g. 'digits'), got {kind!r}")
    if kind == Digits.kind:
        cls: Any = Digits
    else:
        cls = _trust.imported_type(
            kind, "data", built_in=[Digits.kind], allow_imports=allow_imports
        )
    try:
        return cls(**fields)
    except TypeError as error:
        raise ConfigError(f"bad fields for data {kind!r}: {error}") from None


def recipe_from_dict(
    data: dict[str, Any], *, allow_imports: bool = False, allow_absolute_paths: bool = False
) -> Recipe:
    """Rebuild a recipe from :func:`recipe_to_dict` output (or a TOML file's tables).

    The tables are data, so they cannot run code: each ``type`` is a built-in one or one an
    installed package registers (entry-point groups ``unitrain.callbacks`` and
    ``unitrain.data``), and logger and checkpoint paths stay inside the run folder.

    Args:
        data: the recipe's tables.
        allow_imports: let callbacks and data name any class as ``"package.module:Class"``,
            which imports and runs it.
        allow_absolute_paths: let logger and checkpoint paths (``path``, ``log_dir``,
            ``dirpath``, ``config.checkpoint_dir``) and ``name`` be absolute or hold ``..``.

    Raises:
        ConfigError: a section or type is unknown, or something not allowed is asked for;
            refused before any part is imported or built.
    """
    return _recipe_from_data(data, allow_imports, allow_absolute_paths, before=None)


def _recipe_from_data(
    data: dict[str, Any],
    allow_imports: bool,
    allow_absolute_paths: bool,
    before: dict[str, Any] | None,
) -> Recipe:
    """:func:`recipe_from_dict`; the types and paths ``before`` held need no flag again."""
    known = {field.name for field in dataclasses.fields(Recipe)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise ConfigError(f"recipe: unknown section(s) {unknown}; known: {sorted(known)}")
    for required in ("model", "data"):
        if required not in data:
            raise ConfigError(f"recipe: the [{required}] section is missing")
    _trust.check_recipe_data(
        data,
        allow_imports=allow_imports,
        allow_absolute_paths=allow_absolute_paths,
        before=before,
    )
    # Every type left is registered, allowed, or known from before (already imported).
    imports = allow_imports or before is not None
    fields: dict[str, Any] = {
        "model": model_from_dict(data["model"]),
        "data": _data_from_dict(data["data"], allow_imports=imports),
        "callbacks": [
            callback_from_dict(c, allow_imports=imports) for c in data.get("callbacks", [])
        ],
        "metrics": [metric_from_dict(m) for m in data.get("metrics", [])],
    }
    if "optimizer" in data:
        fields["optimizer"] = optimizer_from_dict(data["optimizer"])
    if "config" in data:
        try:
            fields["config"] = TrainerConfig(**data["config"])
        except TypeError as error:
            raise ConfigError(f"recipe [config]: {error}") from None
    if "schedule" in data:
        config = fields.get("config", TrainerConfig())
        table = schedule_in_updates(data["schedule"], fields["data"], config)
        fields["schedule"] = schedule_from_dict(table)
    if "loss" in data:  # a type name stays one (checked); a table becomes its loss
        loss = resolve_loss(data["loss"])
        fields["loss"] = data["loss"] if isinstance(data["loss"], str) else loss
    if "name" in data:
        fields["name"] = data["name"]
    return Recipe(**fields)


def recipe_to_toml(recipe: Recipe) -> str:
    """The recipe as a TOML file's text (see :func:`recipe_to_dict`)."""
    return _toml.dumps(recipe_to_dict(recipe))


def apply_overrides(
    recipe: Recipe,
    assignments: list[str],
    *,
    allow_imports: bool = False,
    allow_absolute_paths: bool = False,
) -> Recipe:
    """A copy of ``recipe`` with ``section.key=value`` assignments applied, in order.

    ``config.*`` changes a config field; any other section goes through its ``to_dict``, so
    nested keys (``schedule.schedule.base_lr=0.05``) and list items (``callbacks.0.patience=5``)
    work for every part that has one. Values are TOML (``3``, ``0.1``, ``true``, ``[1, 2]``,
    ``"text"``); anything that is not valid TOML is taken as a string (``device=cpu``).

    Setting a table's ``type`` to another type replaces the table, as choosing another option
    does in Hydra: the new type starts from its own defaults, the old type's fields are dropped
    with a warning that names them (an SGD ``weight_decay`` is not AdamW's), and later
    assignments set the new type's fields (``optimizer.type=lion optimizer.beta2=0.98``). The
    recipe is checked once all assignments are in; the warnings come once it is valid.

    Assignments are data, held to what :func:`recipe_from_dict` allows: a type or path they
    bring in needs ``allow_imports`` / ``allow_absolute_paths`` where the file would. What
    the recipe already held needs no flag (a Python recipe's own classes and paths are code).

    Raises:
        ConfigError: an assignment is malformed, names something unknown, or asks for what
            is not allowed (refused before anything is imported).
    """
    current = dataclasses.replace(recipe)
    described: dict[str, Any] | None = None  # the recipe as data, once a part is changed
    before: dict[str, Any] | None = None  # the recipe as data before the assignments
    dropped: list[str] = []  # what each change of type dropped, said once the recipe is valid
    for assignment in assignments:
        key, sep, text = assignment.partition("=")
        path = key.strip().split(".")
        if not sep or len(path) < 2 or not all(path):
            raise ConfigError(
                f"--set {assignment!r}: write section.key=value, e.g. config.epochs=3"
            )
        value = _toml.value(text.strip())
        section = path[0]
        if section == "config":
            if len(path) != 2:
                raise ConfigError(f"--set {assignment!r}: config fields are not nested")
            fields = [f.name for f in dataclasses.fields(TrainerConfig)]  # declaration order
            if path[1] not in fields:
                raise ConfigError(
                    f"--set {assignment!r}: unknown config field{did_you_mean(path[1], fields)}; "
                    f"the fields are: {', '.join(fields)}"
                )
            _trust.check_recipe_data(
                {"config": {path[1]: value}},
                allow_imports=allow_imports,
                allow_absolute_paths=allow_absolute_paths,
            )
            current.config = dataclasses.replace(current.config, **{path[1]: value})
            if described is not None:
                described["config"] = _config_dict(current.config)
            continue
        if described is None:
            described = recipe_to_dict(current)
            before = copy.deepcopy(described)
        if section not in described:
            raise ConfigError(f"--set {assignment!r}: unknown section {section!r}")
        if path[-1] == "type":
            dropped += _retype(described, path, value, assignment)
        else:
            _assign(described, path, value, assignment)
    if described is None:
        return current
    current = _recipe_from_data(described, allow_imports, allow_absolute_paths, before)
    for message in dropped:
        warnings.warn(message, stacklevel=2)
    return current


def _rooted(callback: Any, run_dir: Path) -> Any:
    """``callback``, or a copy of it whose relative paths lie inside ``run_dir``."""
    try:
        described = callback.to_dict()
    except (AttributeError, ConfigError):
        return callback  # not describable as data (it holds code): its paths are its own
    moved = {
        field: str(run_dir / value)
        for field in _trust.PATH_FIELDS
        if isinstance(value := described.get(field), str) and not Path(value).is_absolute()
    }
    if not moved:
        return callback
    # The class is already imported: the recipe holding it made it.
    return callback_from_dict({**described, **moved}, allow_imports=True)


def _retype(tree: Any, path: list[str], value: Any, assignment: str) -> list[str]:
    """Set the ``type`` at ``path``; another type than the table's drops the table's fields.

    Returns:
        A message naming the fields dropped, or nothing.
    """
    for part in path[:-1]:
        tree = _child(tree, part, assignment)
    if not isinstance(tree, dict):
        raise ConfigError(f"--set {assignment!r}: 'type' is inside a value, not a table")
    if tree.get("type") == value:
        return []
    dropped, old = sorted(key for key in tree if key != "type"), tree.get("type")
    tree.clear()
    tree["type"] = value
    if not dropped:
        return []
    return [
        f"--set {assignment}: the new type starts from its own defaults; the fields of {old!r} "
        f"were dropped: {', '.join(dropped)} (set one again with --set "
        f"{'.'.join(path[:-1])}.FIELD=VALUE)"
    ]


def _assign(tree: Any, path: list[str], value: Any, assignment: str) -> None:
    for part in path[:-1]:
        tree = _child(tree, part, assignment)
    last = path[-1]
    if isinstance(tree, list):
        tree[_index(tree, last, assignment)] = value
    elif isinstance(tree, dict):
        tree[last] = value
    else:
        raise ConfigError(f"--set {assignment!r}: {last!r} is inside a value, not a table")


def _child(tree: Any, part: str, assignment: str) -> Any:
    if isinstance(tree, list):
        return tree[_index(tree, part, assignment)]
    if isinstance(tree, dict) and part in tree:
        return tree[part]
    raise ConfigError(f"--set {assignment!r}: no {part!r} there")


def _index(items: list[Any], part: str, assignment: str) -> int:
    if not part.isdigit() or int(part) >= len(items):
        raise ConfigError(f"--set {assignment!r}: {part!r} is not an index below {len(items)}")
    return int(part)
