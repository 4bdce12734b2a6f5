"""What a check is given: the backend under test, the device and dtype, and ways to compare.

A check builds backends only through the public protocol (``cls(model, BackendOptions)``)
and measures them only through their public methods; the oracle is the numpy reference
backend in float64. Comparisons go through :class:`Context` so that the worst error of each
check and the tolerance it was held to end up in the report.
"""

from __future__ import annotations

import dataclasses
import math
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from unitrain import callbacks as core_callbacks
from unitrain.backends.protocol import BackendOptions, Capabilities, FusedStep
from unitrain.backends.registry import get_backend
from unitrain.conformance._diagnosis import (
    FLOAT32_HINT,
    array_detail,
    describe_key,
    first_differing,
    float32_sized,
    mapping_detail,
)
from unitrain.conformance._tolerances import Tolerance
from unitrain.training.config import TrainerConfig
from unitrain.training.trainer import Trainer

__all__ = [
    "BackendUnderTest",
    "CheckFailed",
    "CheckSkipped",
    "Context",
    "Measurement",
    "normwise_error",
    "representable",
]


class CheckFailed(AssertionError):
    """A check found the backend does not behave like the reference.

    Args:
        message: what differs.
        likely: the likely cause, when the check knows it better than its ``guards`` say
            (a launcher's failure in a check of gradient averaging); else the guards are used.
    """

    def __init__(self, message: str, likely: str | None = None) -> None:
        super().__init__(message)
        self.likely = likely


class CheckSkipped(Exception):
    """A check cannot run here (a missing capability, a single device); the message says why."""


@dataclasses.dataclass(frozen=True)
class BackendUnderTest:
    """A backend as the kit sees it: how to build one and what its class declares.

    Attributes:
        factory: ``factory(model, options) -> backend``; usually the backend class.
        name: the backend's ``name``.
        target: how it was named (``"torch"``, ``"pkg.mod:Class"``).
        capabilities: its declared :class:`~unitrain.Capabilities`.
        xfails: declared known failures, check id (or id prefix) -> reason.
        tolerances: declared tolerance overrides, dtype -> {kind: value}.
        callbacks: the backend package's own implementations of unitrain callbacks,
            class name -> class, certified instead of the core's.
        available_devices: what ``available_devices()`` reports, or None if not offered.
    """

    factory: Callable[[Any, BackendOptions], Any]
    name: str
    target: str
    capabilities: Capabilities
    xfails: Mapping[str, str] = dataclasses.field(default_factory=dict)
    tolerances: Mapping[str, Mapping[str, float]] = dataclasses.field(default_factory=dict)
    callbacks: Mapping[str, type] = dataclasses.field(default_factory=dict)
    available_devices: tuple[str, ...] | None = None


@dataclasses.dataclass(frozen=True)
class Measurement:
    """One comparison: the error found and the bar it was held to."""

    what: str
    kind: str
    max_abs_error: float
    max_rel_error: float
    tolerance: float

    @property
    def ratio(self) -> float:
        """Error over tolerance; above 1 fails."""
        if self.tolerance == 0:
            return 0.0 if self.max_rel_error == 0 else math.inf
        return self.max_rel_error / self.tolerance


def representable(values: Any, dtype: str) -> np.ndarray:
    """``values`` rounded to ``dtype`` and held in the host dtype the kit feeds backends.

    The kit gives the backend and the float64 reference the very same numbers, so inputs
    are first rounded to what the backend can hold (bfloat16 by rounding float32 bits to
    nearest even, since numpy has no bfloat16).

    Examples:
        >>> representable([1.0 + 2**-10], "bfloat16").tolist()
        [1.0]
    """
    array = np.asarray(values, np.float64)
    if dtype == "float64":
        return array
    if dtype == "float16":
        return array.astype(np.float16).astype(np.float32)
    single = array.astype(np.float32)
    if dtype == "bfloat16":
        bits = single.view(np.uint32).astype(np.uint64)
        rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000  # to nearest even
        return np.asarray(rounded, np.uint32).view(np.float32)
    return single


def state_dtype(dtype: str) -> np.dtype:
    """The numpy dtype of floating state-dict arrays for parameter ``dtype``.

    numpy has no bfloat16, so bfloat16 state travels as float32 (exactly representable).
    """
    return np.dtype("float32" if dtype == "bfloat16" else dtype)


def _flat(value: Any, keys: list[str] | None = None) -> np.ndarray:
    if isinstance(value, Mapping):
        names = keys if keys is not None else sorted(value)
        parts = [np.asarray(value[k], np.float64).ravel() for k in names]
        return np.concatenate(parts) if parts else np.zeros(0)
    return np.asarray(value, np.float64).ravel()


def normwise_error(actual: Any, expected: Any) -> tuple[float, float]:
    """``(max abs error, normwise relative error)`` of arrays or dicts of arrays.

    Dicts are compared over the expected keys. The relative error is
    ``||actual - expected|| / ||expected||`` (2-norm over everything), 0 when both are 0.
    """
    keys = sorted(expected) if isinstance(expected, Mapping) else None
    a, e = _flat(actual, keys), _flat(expected, keys)
    if a.shape != e.shape:
        return math.inf, math.inf
    diff = a - e
    if not np.all(np.isfinite(a)):
        return math.inf, math.inf
    max_abs = float(np.max(np.abs(diff))) if diff.size else 0.0
    norm = float(np.linalg.norm(e))
    error = float(np.linalg.norm(diff))
    if norm == 0.0:
        return max_abs, 0.0 if error == 0.0 else math.inf
    return max_abs, error / norm


class Context:
    """Everything a check needs for one backend on one device in one dtype.

    Args:
        backend: the backend under test.
        device: ``"cpu"`` or ``"gpu"``.
        dtype: the parameter dtype.
        tolerance: the row of the tolerance table to hold numbers to.
        hypothesis_profile: ``"ci"`` (derandomized) or ``"dev"``.
    """

    def __init__(
        self,
        backend: BackendUnderTest,
        device: str,
        dtype: str,
        tolerance: Tolerance,
        hypothesis_profile: str = "ci",
    ) -> None:
        self.backend, self.device, self.dtype = backend, device, dtype
        self.tolerance = tolerance
        self.hypothesis_profile = hypothesis_profile
        self.measurements: list[Measurement] = []
        self.notes: list[str] = []
        #: The models this check built backends of: failure messages name a tensor's layer.
        self.models: list[Any] = []
        #: Set by a check whose backend side ran on simulated workers (see CheckResult).
        self.simulated = False
        self._tmp: tempfile.TemporaryDirectory[str] | None = None

    # -- building ---------------------------------------------------------------------------

    def options(self, **fields: Any) -> BackendOptions:
        """BackendOptions for this device and dtype, deterministic, with ``fields`` set."""
        fields.setdefault("device", self.device)
        fields.setdefault("dtype", self.dtype)
        fields.setdefault("deterministic", True)
        return BackendOptions(**fields)

    def make(self, model: Any, **fields: Any) -> Any:
        """A fresh backend under test built as ``cls(model, options)``."""
        self._remember(model)
        return self.backend.factory(model, self.options(**fields))

    def reference(self, model: Any, dtype: str = "float64", **fields: Any) -> Any:
        """A fresh numpy reference backend (float64 unless asked), on the CPU."""
        self._remember(model)
        reference = get_backend("numpy")
        return reference(model, BackendOptions(device="cpu", dtype=dtype, **fields))

    def _remember(self, model: Any) -> None:
        if not any(model is known for known in self.models):
            self.models.append(model)

    def trainer(self, model: Any, backend: Any, **kwargs: Any) -> Trainer:
        """A Trainer around an already built backend; ``config`` fields go in ``config=``."""
        config = kwargs.pop("config", {})
        config.setdefault("device", self.device)
        config.setdefault("dtype", self.dtype)
        return Trainer(model, backend=backend, config=TrainerConfig(**config), **kwargs)

    def callback(self, name: str) -> Any:
        """The class of callback ``name``: the backend's own if it declares one, else core's."""
        declared = self.backend.callbacks.get(name)
        return declared if declared is not None else getattr(core_callbacks, name)

    def host(self, values: Any) -> np.ndarray:
        """Input data rounded to this dtype (see :func:`representable`)."""
        return representable(values, self.dtype)

    @property
    def state_dtype(self) -> np.dtype:
        """The dtype floating state-dict arrays must have."""
        return state_dtype(self.dtype)

    def path(self, name: str) -> Path:
        """A fresh path inside this check's temporary directory."""
        if self._tmp is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="unitrain-conformance-")
        return Path(self._tmp.name) / name

    def close(self) -> None:
        """Remove the temporary directory."""
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    @staticmethod
    def update(backend: Any, batch: Any, lr: float, fused: bool | None = None) -> float:
        """One optimizer update the way the Trainer makes it; returns the loss as a float.

        Uses ``train_step`` when the backend offers it (unless ``fused`` is False), else
        ``forward``, ``backward``, ``step``.
        """
        if fused is None:
            fused = isinstance(backend, FusedStep)
        if fused:
            return float(backend.train_step(batch, lr))
        loss = backend.forward(batch)
        backend.backward()
        backend.step(lr)
        return float(loss)

    # -- comparing --------------------------------------------------------------------------

    def record(
        self, what: str, kind: str, max_abs: float, rel: float, tolerance: float, detail: str = ""
    ) -> None:
        """Keep a measurement; fail the check when it exceeds its tolerance.

        ``detail`` is added to the failure (which tensor, where in it); an error of float32's
        size in a float64 row says so (see :func:`~unitrain.conformance._diagnosis.float32_sized`).
        """
        measurement = Measurement(what, kind, max_abs, rel, tolerance)
        self.measurements.append(measurement)
        if not measurement.ratio <= 1.0:
            if float32_sized(self.dtype, kind, rel):
                detail += f"; {FLOAT32_HINT}"
            raise CheckFailed(
                f"{what}: relative error {rel:.3g} exceeds the {self.dtype} {kind} "
                f"tolerance {tolerance:.3g} (max abs error {max_abs:.3g}){detail}"
            )

    def compare(self, what: str, actual: Any, expected: Any, kind: str) -> float:
        """Compare normwise against the tolerance of ``kind``; returns the relative error.

        A failure names the tensor of a dict comparison that is furthest off (or the first
        holding a NaN or an infinity) with its layer or optimizer slot, and where in it; in
        a sequence, the first position off; and whether the error has float32's size in a
        float64 row.
        """
        max_abs, rel = normwise_error(actual, expected)
        tolerance = getattr(self.tolerance, kind)
        detail = ""
        if not rel <= tolerance:
            if isinstance(expected, Mapping) and isinstance(actual, Mapping):
                detail = mapping_detail(actual, expected, tolerance, self.models)
            else:
                detail = array_detail(actual, expected, tolerance)
            detail = f"; {detail}" if detail else ""
        self.record(what, kind, max_abs, rel, tolerance, detail)
        return rel

    def require(self, condition: bool, message: str, likely: str | None = None) -> None:
        """Fail with ``message`` (and ``likely``, see :class:`CheckFailed`) unless
        ``condition``."""
        if not condition:
            raise CheckFailed(message, likely)

    def require_equal(self, what: str, actual: Any, expected: Any) -> None:
        """A discrete outcome must match exactly (``expected`` is the reference's or the
        first of two runs that must agree)."""
        if actual != expected:
            raise CheckFailed(f"{what}: got {actual!r}, expected {expected!r}")

    def require_identical(
        self,
        what: str,
        actual: Mapping[str, np.ndarray],
        expected: Mapping[str, np.ndarray],
        detail: str = "",
    ) -> None:
        """Two state dicts must be bit-identical: same keys, shapes, dtypes and bytes.

        A failure names the first tensor that differs (in ``expected``'s order) with its layer
        or slot, how many differ, and ``detail`` (where two runs parted, say).
        """
        self.require_equal(f"{what}: keys", sorted(actual), sorted(expected))
        key, count = first_differing(actual, expected)
        if key is None:
            for name in expected:  # same bytes, another dtype (int32 for int64, say)
                if np.asarray(actual[name]).dtype != np.asarray(expected[name]).dtype:
                    key, count = name, 1
                    break
        if key is None:
            self.measurements.append(Measurement(what, "bit-exact", 0.0, 0.0, 0.0))
            return
        a, e = np.asarray(actual[key]), np.asarray(expected[key])
        max_abs, rel = normwise_error(a, e) if a.shape == e.shape else (math.inf,) * 2
        self.measurements.append(Measurement(what, "bit-exact", max_abs, rel, 0.0))
        others = f"; {count} of {len(expected)} tensors differ" if len(expected) > 1 else ""
        raise CheckFailed(
            f"{what}: {describe_key(key, self.models)} is not bit-identical ({a.dtype}{a.shape}"
            f" vs {e.dtype}{e.shape}; max abs difference {max_abs:.3g}){others}"
            f"{f'; {detail}' if detail else ''}"
        )

    def skip(self, reason: str) -> None:
        """Stop the check as skipped with ``reason``."""
        raise CheckSkipped(reason)
