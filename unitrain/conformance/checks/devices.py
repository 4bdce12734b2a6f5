"""devices: the backend runs where it says, reports itself, and moves between devices.

Conformance mode is on for every check: backends are built with ``deterministic=True`` and
the environment disables TF32 and picks deterministic GPU kernels before any framework is
imported (see ``CONFORMANCE_ENVIRONMENT``).
"""

from __future__ import annotations

import json

from unitrain import Backend, Capabilities, FusedStep, optim
from unitrain.backends.protocol import MultiStep
from unitrain.conformance._context import Context
from unitrain.conformance._registry import check
from unitrain.conformance._training import classifier, classifier_data

_DEVICES = ("cpu", "gpu")
_DTYPES = ("float64", "float32", "float16", "bfloat16")


@check(
    "devices",
    "reports_device",
    guards="backend.device not the canonical name of the device asked for",
)
def reports_device(ctx: Context) -> None:
    """backend.device is the device asked for."""
    backend = ctx.make(classifier(), optimizer=optim.SGD())
    ctx.require_equal("backend.device", backend.device, ctx.device)


@check(
    "devices",
    "versions",
    guards="versions() empty or not a name -> version map",
)
def versions(ctx: Context) -> None:
    """versions() is a non-empty JSON map of package name to version string."""
    found = ctx.make(classifier(), optimizer=optim.SGD()).versions()
    ctx.require(isinstance(found, dict) and bool(found), f"versions() returned {found!r}")
    ctx.require(
        all(isinstance(k, str) and isinstance(v, str) for k, v in found.items()),
        f"versions() must map str to str, got {found!r}",
    )
    json.dumps(found)


@check(
    "devices",
    "protocol",
    guards="a missing protocol method, or train_steps offered without train_step",
)
def protocol(ctx: Context) -> None:
    """The instance satisfies the Backend protocol; a multi-step call comes with train_step."""
    backend = ctx.make(classifier(), optimizer=optim.SGD())
    ctx.require(isinstance(backend, Backend), "the instance lacks Backend protocol members")
    ctx.require(isinstance(backend.name, str) and bool(backend.name), "name must be a string")
    ctx.require(isinstance(backend.capabilities, Capabilities), "capabilities is not Capabilities")
    # Optional methods are declared by having them (the protocols of unitrain.backends.protocol); a
    # multi-step call is defined as k fused steps, so it cannot come without one.
    ctx.require(
        isinstance(backend, FusedStep) or not isinstance(backend, MultiStep),
        "the backend offers train_steps (MultiStep) without train_step (FusedStep)",
    )
    ctx.require_equal("skipped_steps of a fresh backend", int(backend.skipped_steps), 0)


@check(
    "devices",
    "capabilities",
    guards="unknown devices or dtypes declared",
)
def capabilities(ctx: Context) -> None:
    """Declared devices and dtypes are known names; available devices are declared ones."""
    caps = ctx.backend.capabilities
    ctx.require(set(caps.devices) <= set(_DEVICES), f"unknown devices in {caps.devices}")
    ctx.require(set(caps.dtypes) <= set(_DTYPES), f"unknown dtypes in {caps.dtypes}")
    available = ctx.backend.available_devices
    if available is not None:
        ctx.require(
            set(available) <= set(caps.devices),
            f"available_devices() {available} includes undeclared devices",
        )


@check(
    "devices",
    "cross_device_state",
    guards="state that changes when moved between devices",
)
def cross_device_state(ctx: Context) -> None:
    """State moved between this device and another evaluates within ``evaluate``."""
    available = ctx.backend.available_devices or ctx.backend.capabilities.devices
    others = [d for d in available if d != ctx.device and d in ctx.backend.capabilities.devices]
    if not others:
        ctx.skip("only one device is available")
    here = ctx.make(classifier(), optimizer=optim.Adam())
    batch = classifier_data(ctx, 2, 16)
    there = ctx.make(classifier(), optimizer=optim.Adam(), device=others[0])
    there.load_state_dict(here.state_dict())
    ctx.compare(
        f"evaluate loss on {others[0]} vs {ctx.device}",
        float(there.evaluate(batch)["loss"]),
        float(here.evaluate(batch)["loss"]),
        "evaluate",
    )
