"""The kit on a researcher's own layer: ``unitrain conformance --layer pkg.module:Layer``.

A layer written in :mod:`unitrain.ops` runs on every backend; this proves it computes the same
there. The target names the cases to check, each ``(id, layer, input shape with the batch
axis)`` (or ``(layer, shape)``):

- a layer class with a ``conformance_cases()`` class method or static method, or
- a function (or any callable) returning the cases, or a list of them.

Each case gets two checks, through the public protocol only, in every dtype the backend
declares: ``layers::user-<id>`` (the output in eval mode, the input and parameter gradients
and the state after one train-mode update, against the float64 reference: the same check as
the built-in layers') and ``handoff::user-<id>`` (a checkpoint moves to and from the numpy
reference and every other installed backend and carries on alike).

Before anything runs, each layer class's ``forward`` is read: one that calls a framework
(torch, JAX, TensorFlow, ...) directly is refused with the call and its line, since it could
run on one backend only. numpy is allowed there, for constants computed from shapes (a table
of positions); arrays flowing through the layer must go through :mod:`unitrain.ops`.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import os
import sys
import textwrap
from collections.abc import Iterable
from typing import Any

import numpy as np

from unitrain import ConfigError
from unitrain.conformance._context import Context
from unitrain.conformance._registry import Check
from unitrain.models import AbstractLayer

__all__ = ["framework_calls", "layer_cases", "user_layer_checks"]

#: Top-level packages a portable forward may not call.
FRAMEWORKS = ("torch", "jax", "jaxlib", "tensorflow", "keras", "flax", "mlx", "cupy")

Case = tuple[str, AbstractLayer, tuple[int, ...]]


def _load(target: Any) -> Any:
    if not isinstance(target, str):
        return target
    module_name, _, qualname = target.partition(":")
    if not qualname:
        raise ConfigError(f"--layer takes 'package.module:Name', got {target!r}")
    if "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # as `python -m` and pytest find a module here
    try:
        value: Any = importlib.import_module(module_name)
    except ImportError as error:
        raise ConfigError(f"--layer {target!r}: cannot import {module_name!r} ({error})") from None
    for part in qualname.split("."):
        if not hasattr(value, part):
            raise ConfigError(f"--layer {target!r}: {module_name} has no {qualname!r}")
        value = getattr(value, part)
    return value


def layer_cases(target: Any) -> list[Case]:
    """The cases ``target`` (an object or ``"package.module:Name"``) names; ConfigError with
    what to write when it names none."""
    found = _load(target)
    if hasattr(found, "conformance_cases"):
        cases = found.conformance_cases()
    elif isinstance(found, (list, tuple)):
        cases = found
    elif callable(found) and not isinstance(found, type):
        cases = found()
    else:
        raise ConfigError(
            f"{target!r} names no layer cases: give the layer class a `conformance_cases()` "
            "class method returning [(id, layer, input_shape_with_batch), ...], or name a "
            "function that returns that list"
        )
    return [_case(found, index, case) for index, case in enumerate(cases)]


def _case(owner: Any, index: int, case: Any) -> Case:
    parts = tuple(case) if isinstance(case, (list, tuple)) else ()
    if len(parts) == 2:
        parts = (f"{type(parts[0]).__name__.lower()}-{index}", *parts)
    if (
        len(parts) != 3
        or not isinstance(parts[1], AbstractLayer)
        or not isinstance(parts[2], (tuple, list))
    ):
        raise ConfigError(
            f"case {index} of {owner!r} must be (id, layer, input_shape_with_batch), got {case!r}"
        )
    name, layer, shape = parts
    return str(name), layer, tuple(int(n) for n in shape)


def framework_calls(layer_class: type) -> list[str]:
    """The framework calls in ``layer_class``'s ``forward`` (and its parents' up to the
    core), each as ``"torch.tanh (line 12 of mylayer.py)"``."""
    found = []
    for cls in layer_class.__mro__:
        forward = cls.__dict__.get("forward")
        if forward is None or cls.__module__.startswith("unitrain.models"):
            continue
        found.extend(_calls_in(forward))
    return found


def _calls_in(function: Any) -> list[str]:
    try:
        lines, first = inspect.getsourcelines(function)
        path = inspect.getsourcefile(function) or "?"
    except (OSError, TypeError):
        return []  # no source (built in C, made at run time): nothing to read
    tree = ast.parse(textwrap.dedent("".join(lines)))
    modules, objects = _framework_names(inspect.getmodule(function))
    inner = {id(node.value) for node in ast.walk(tree) if isinstance(node, ast.Attribute)}
    calls = []
    for node in ast.walk(tree):
        where = f"(line {first + getattr(node, 'lineno', 1) - 1} of {path})"
        if isinstance(node, ast.Attribute) and id(node) not in inner:
            root: ast.expr = node
            while isinstance(root, ast.Attribute):
                root = root.value
            if isinstance(root, ast.Name) and root.id in modules:
                calls.append(f"{ast.unparse(node)} {where}")
        elif isinstance(node, ast.Name) and node.id in objects:
            calls.append(f"{node.id} ({objects[node.id]}) {where}")
    return list(dict.fromkeys(calls))


def _framework_names(module: Any) -> tuple[set[str], dict[str, str]]:
    """The global names of ``module`` bound to a framework's modules, and those bound to
    something from one (``from torch import tanh``) with where it comes from."""
    modules, objects = set(), {}
    for name, value in vars(module or object()).items():
        if inspect.ismodule(value):
            if value.__name__.split(".")[0] in FRAMEWORKS:
                modules.add(name)
            continue
        origin = getattr(value, "__module__", None) or ""
        if isinstance(origin, str) and origin.split(".")[0] in FRAMEWORKS:
            objects[name] = f"{origin}.{getattr(value, '__name__', name)}"
    return modules, objects


def refuse_framework_calls(cases: Iterable[Case]) -> None:
    """ConfigError naming every framework call in the cases' layer classes' forwards."""
    seen: set[type] = set()
    problems: list[str] = []
    for _, layer, _ in cases:
        for _, part in layer.named_layers():
            cls = type(part)
            if cls in seen:
                continue
            seen.add(cls)
            problems.extend(f"{cls.__name__}.forward calls {c}" for c in framework_calls(cls))
    if problems:
        raise ConfigError(
            "a portable layer must compute with unitrain.ops only, so that it runs on every "
            "backend; " + "; ".join(problems) + ". Write these with unitrain.ops "
            "(ops.tanh, ops.matmul, ...); numpy is fine for constants made from shapes"
        )


def user_layer_checks(target: Any) -> list[Check]:
    """The checks of every case ``target`` names (see the module's docstring)."""
    from unitrain.conformance.checks import handoff
    from unitrain.conformance.checks.layers import check_layer, probed

    cases = layer_cases(target)
    refuse_framework_calls(cases)
    checks = []
    for name, layer, shape in cases:

        def output_and_gradients(
            ctx: Context, layer: AbstractLayer = layer, shape: tuple[int, ...] = shape
        ) -> None:
            check_layer(ctx, layer, shape)

        def handed_off(
            ctx: Context, layer: AbstractLayer = layer, shape: tuple[int, ...] = shape
        ) -> None:
            model = probed(layer, shape)
            handoff.run_model(
                ctx, model, _batches(model, shape), handoff.numpy_and_installed, loss="mse"
            )

        what = layer.describe()
        checks.append(
            Check(
                "layers",
                f"user-{name}",
                output_and_gradients,
                requires=("portable_layers",),
                description=f"{what}: output, input and parameter gradients, state",
                guards=f"{what} computed otherwise on this backend than in the reference",
            )
        )
        checks.append(
            Check(
                "handoff",
                f"user-{name}",
                handed_off,
                requires=("portable_layers",),
                description=f"{what}: a checkpoint moves to and from every installed backend",
                guards=f"{what}'s parameters or state saved in another layout or not at all",
            )
        )
    return checks


def _batches(model: AbstractLayer, shape: tuple[int, ...]) -> Any:
    from unitrain.conformance._layer_cases import layer_input

    def make(ctx: Context) -> list[tuple[Any, Any]]:
        out_shape = (shape[0], *model.output_shape(shape[1:]))
        rng = np.random.default_rng(0x5E11)
        batches = []
        for seed in range(7):
            x = layer_input(model, shape, seed=seed)
            x = x if model.input_kind == "tokens" else ctx.host(x)
            batches.append((x, ctx.host(rng.standard_normal(out_shape))))
        return batches

    return make
