"""The callback base class and the dispatcher that calls only the hooks a callback defines."""

from __future__ import annotations

import functools
import inspect
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from unitrain._errors import CheckpointError, ConfigError
from unitrain.recipes._trust import imported_type

if TYPE_CHECKING:
    from unitrain.training.trainer import Trainer

__all__ = ["HOOKS", "Callback", "CallbackList", "callback_from_dict", "restored"]

#: Built-in callbacks by ``type`` name; others are registered through entry points or named
#: ``"package.module:Class"`` (see :func:`callback_from_dict`).
_REGISTRY: dict[str, type[Callback]] = {}

HOOKS = (
    "on_train_begin",
    "on_train_end",
    "on_epoch_begin",
    "on_epoch_end",
    "on_batch_begin",
    "on_batch_end",
    "on_validation_begin",
    "on_validation_end",
    "on_step_validation_end",
)


class Callback:
    """Base class of no-op hooks; override the ones you need.

    Epochs are numbered from 0. A *batch* hook fires once per optimizer update, so with
    gradient accumulation one ``on_batch_end`` covers ``grad_accum_steps`` micro-batches.
    ``logs`` of ``on_batch_end`` always hold ``step`` and ``lr``; they hold ``loss`` only at
    logging points (every ``log_every_n_steps``), where reading it back costs nothing extra.

    A callback that must survive a resume returns its state from :meth:`state_dict` (JSON
    data) and takes it back in :meth:`load_state_dict`. On resume the Trainer calls
    ``on_train_begin`` first and ``load_state_dict`` after it, so ``on_train_begin`` may reset
    freely.
    """

    #: Callbacks with ``runs_last`` run after all others in each hook (checkpointing does, so
    #: that the state it saves includes every other callback's decision for that epoch).
    runs_last = False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """Record each instance's constructor arguments, so :meth:`to_dict` needs no code."""
        super().__init_subclass__(**kwargs)
        if cls.__module__.startswith("unitrain.") and not cls.__name__.startswith("_"):
            _REGISTRY[cls.__name__] = cls
        if "__init__" not in cls.__dict__:
            return
        original = cls.__init__
        signature = inspect.signature(original)

        @functools.wraps(original)
        def __init__(self: Callback, *args: Any, **kwargs: Any) -> None:
            if "_arguments" not in self.__dict__:  # the outermost constructor's own arguments
                bound = signature.bind(self, *args, **kwargs)
                self.__dict__["_arguments"] = dict(list(bound.arguments.items())[1:])
            original(self, *args, **kwargs)

        cls.__init__ = __init__  # type: ignore[method-assign,assignment]

    def to_dict(self) -> dict[str, Any]:
        """The constructor arguments given, as data; :func:`callback_from_dict` inverts it.

        A recipe file holds callbacks this way. Only arguments that were passed are kept, so
        defaults stay defaults; paths become strings and tuples lists.

        Raises:
            ConfigError: an argument is not plain data (a number, string, bool, list, dict).

        Examples:
            >>> from unitrain.callbacks import EarlyStopping
            >>> EarlyStopping("val_loss", patience=3).to_dict()
            {'type': 'EarlyStopping', 'monitor': 'val_loss', 'patience': 3}
        """
        cls = type(self)
        name = cls.__name__ if _REGISTRY.get(cls.__name__) is cls else _import_name(cls)
        arguments = self.__dict__.get("_arguments", {})
        return {"type": name, **{k: _plain(f"{name}.{k}", v) for k, v in arguments.items()}}

    @property
    def writes_to(self) -> tuple[Path, ...]:
        """The checkpoint directories this callback writes into; none by default.

        For the length of ``fit`` the Trainer holds the run lock of each one (besides
        ``TrainerConfig.checkpoint_dir``), so that no other run prunes or resumes from them,
        and clears the unfinished saves a killed run left there. Loggers declare nothing:
        their files are per run, and two runs logging into one folder is no conflict.
        """
        return ()

    @property
    def state_key(self) -> str:
        """Key of this callback's state in a checkpoint; unique among the Trainer's callbacks."""
        return type(self).__name__

    def on_train_begin(self, trainer: Trainer) -> None:
        """Called once before the first epoch (also when resuming)."""

    def on_train_end(self, trainer: Trainer) -> None:
        """Called once after the last epoch or an early stop."""

    def on_epoch_begin(self, trainer: Trainer, epoch: int) -> None:
        """Called before the first batch of ``epoch``."""

    def on_epoch_end(self, trainer: Trainer, epoch: int, logs: dict[str, Any]) -> None:
        """Called after ``epoch`` with its metrics (train and, when validated, ``val_*``)."""

    def on_batch_begin(self, trainer: Trainer, batch: int) -> None:
        """Called before the optimizer update that starts at batch index ``batch``."""

    def on_batch_end(self, trainer: Trainer, batch: int, logs: dict[str, Any]) -> None:
        """Called after an optimizer update; ``batch`` counts batches done in the epoch."""

    def on_validation_begin(self, trainer: Trainer) -> None:
        """Called before a validation pass."""

    def on_validation_end(self, trainer: Trainer, logs: dict[str, Any]) -> None:
        """Called after a validation pass with its metrics."""

    def on_step_validation_end(self, trainer: Trainer, logs: dict[str, Any]) -> None:
        """Called after a validation by steps (``val_every_n_steps``) with its history row:
        ``epoch`` (counting from 1), ``step``, ``lr``, the epoch's ``loss`` so far, the
        ``val_*`` metrics and ``seconds``, as an epoch's row has them."""

    def state_dict(self) -> dict[str, Any]:
        """JSON-serialisable state to store in checkpoints."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned."""


class CallbackList:
    """Calls each hook on the callbacks that override it, skipping no-op hooks entirely.

    Any object with a method of a hook's name takes part, whether or not it subclasses
    :class:`Callback`; that keeps the hot loop free of calls that do nothing.
    """

    def __init__(self, callbacks: Iterable[Any]) -> None:
        self.callbacks = sorted(callbacks, key=lambda c: bool(getattr(c, "runs_last", False)))
        keys = [self.key(c) for c in self.callbacks]
        duplicates = {k for k in keys if keys.count(k) > 1}
        if duplicates:
            raise ConfigError(
                f"two callbacks share the state key(s) {sorted(duplicates)}; give them "
                "different state_key properties so their states do not overwrite each other"
            )
        self.hooks = {
            hook: [getattr(c, hook) for c in self.callbacks if self._overrides(c, hook)]
            for hook in HOOKS
        }

    @staticmethod
    def key(callback: Any) -> str:
        return str(getattr(callback, "state_key", type(callback).__name__))

    @staticmethod
    def _overrides(callback: Any, hook: str) -> bool:
        method = getattr(type(callback), hook, None)
        return method is not None and method is not getattr(Callback, hook)

    def call(self, hook: str, *args: Any) -> None:
        for method in self.hooks[hook]:
            method(*args)

    def state_dict(self) -> dict[str, Any]:
        return {self.key(c): c.state_dict() for c in self.callbacks if hasattr(c, "state_dict")}

    def load_state_dict(self, states: dict[str, Any]) -> None:
        """Give each callback its saved state; a state that cannot be loaded is a
        :class:`CheckpointError` naming the callback, whatever the callback raised."""
        for callback in self.callbacks:
            key = self.key(callback)
            if key not in states or not hasattr(callback, "load_state_dict"):
                continue
            if not isinstance(states[key], dict):
                raise CheckpointError(
                    f"the state of callback {key!r} must be an object, got {states[key]!r:.80}"
                )
            try:
                callback.load_state_dict(states[key])
            except Exception as error:  # a checkpoint may be hostile; say which part is bad
                detail = str(error) if isinstance(error, CheckpointError) else repr(error)
                raise CheckpointError(
                    f"the saved state of callback {key!r} cannot be loaded: {detail:.300}"
                ) from error


def callback_from_dict(data: Mapping[str, Any], *, allow_imports: bool = False) -> Any:
    """Build a callback from :meth:`Callback.to_dict` output (``type`` plus arguments).

    ``type`` is a built-in callback's class name, a name an installed package registers in
    the ``unitrain.callbacks`` entry-point group, or, only with ``allow_imports``, any class
    as ``"package.module:Class"`` (importing it runs code, which data must not do unasked).

    Args:
        data: ``{"type": name, **arguments}``.
        allow_imports: import an unregistered ``"package.module:Class"``.

    Raises:
        ConfigError: the type is unknown or may not be imported (refused before importing),
            or the arguments do not fit it.

    Examples:
        >>> callback_from_dict({"type": "EarlyStopping", "patience": 2}).patience
        2
    """
    arguments = dict(data)
    name = arguments.pop("type", None)
    if not isinstance(name, str):
        raise ConfigError(f"a callback needs a 'type' (a class name), got {dict(data)!r:.200}")
    if name in _REGISTRY:
        cls: Any = _REGISTRY[name]
    else:
        cls = imported_type(name, "callback", built_in=_REGISTRY, allow_imports=allow_imports)
    try:
        return cls(**arguments)
    except TypeError as error:
        raise ConfigError(f"bad arguments for callback {name!r}: {error}") from None


def _import_name(cls: type) -> str:
    if "<locals>" in cls.__qualname__ or cls.__module__ == "__main__":
        raise ConfigError(
            f"callback class {cls.__qualname__} cannot be named in a recipe file; define it "
            "at the top level of an importable module"
        )
    return f"{cls.__module__}:{cls.__qualname__}"


def _plain(where: str, value: Any) -> Any:
    """``value`` as JSON/TOML data, or a ConfigError naming the argument."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    if isinstance(value, (list, tuple)):
        return [_plain(where, item) for item in value]
    if isinstance(value, dict) and all(isinstance(k, str) for k in value):
        return {k: _plain(f"{where}.{k}", v) for k, v in value.items()}
    raise ConfigError(
        f"{where}={value!r:.80} is not plain data (number, string, bool, list, dict), so it "
        "cannot be written to a recipe file; use a Python recipe for such callbacks"
    )


_REQUIRED: Any = object()


def restored(
    state: dict[str, Any], key: str, kinds: tuple[type, ...], default: Any = _REQUIRED
) -> Any:
    """``state[key]`` for a callback's ``load_state_dict``, refused unless one of ``kinds``.

    Checkpoints may come from anyone; a value of the wrong type would otherwise fail much
    later, mid-training. ``bool`` counts as ``int`` only when ``bool`` is listed, and ints
    count as floats. Integers must be >= 0 (every count a callback keeps is).

    Raises:
        CheckpointError: the key is missing (and has no default) or has a value of another type.

    Examples:
        >>> restored({"wait": 2}, "wait", (int,))
        2
        >>> restored({}, "best", (float,), default=1.5)
        1.5
    """
    if key not in state:
        if default is _REQUIRED:
            raise CheckpointError(f"{key!r} is missing")
        return default
    value = state[key]
    kind = type(value)
    ok = kind in kinds or (kind is int and float in kinds)
    if ok and kind is int and int in kinds and value < 0:
        ok = False
    if not ok:
        names = " or ".join("None" if k is type(None) else k.__name__ for k in kinds)
        raise CheckpointError(f"{key!r} must be {names} (ints >= 0), got {value!r:.80}")
    return float(value) if kind is int and float in kinds and int not in kinds else value
