"""The JAX backend's device state under the canonical names of a checkpoint, and back."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from unitrain import ConfigError, optim
from unitrain.backends.jax.compiled import (
    APPLIED,
    GOOD_STEPS,
    KEY_STEP,
    SCALE_EXPONENT,
    DeviceState,
)
from unitrain.backends.jax.model import (
    flatten_params,
    shape_template,
    unflatten_params,
)
from unitrain.backends.jax.optimizers import export_slots, import_slots
from unitrain.backends.precision import GOOD_STEPS_KEY, SCALE_KEY, take_scaler_state
from unitrain.backends.protocol import split_state

__all__ = ["StateLayout"]


class StateLayout:
    """The names, order and shapes of one model's parameters and model state.

    Args:
        names: the parameters' names in the model's own order (a JAX dict pytree sorts them).
        state_names: the model state's names, in the same way.
        params: the parameter pytree, as the device holds it.
        model_state: the model-state pytree (BatchNorm statistics, ...), possibly empty.
        scaled: whether a loss scaler's state is part of the optimizer state ("16-mixed").
    """

    def __init__(
        self,
        names: list[str],
        state_names: list[str],
        params: Any,
        model_state: Any,
        scaled: bool,
    ) -> None:
        self.names = names
        self.state_names = state_names
        self.template = shape_template(params)
        self.state_template = shape_template(model_state)
        self.scaled = scaled

    def state_dict(
        self, host: DeviceState, optimizer: optim.Optimizer, read: Callable[..., Any] = np.array
    ) -> dict[str, Any]:
        """``host`` (a :class:`DeviceState` fetched to the host) under canonical names.

        ``read(array, dtype)`` copies each tensor out; the default takes a host array whole,
        :func:`.sharding.local_rows` takes this process's rows of a device array."""
        params = flatten_params(host.params)
        model_state = flatten_params(host.model_state)
        slots = {k: flatten_params(v) for k, v in export_slots(optimizer, host.opt_state).items()}
        counters = np.asarray(host.counters)  # replicated wherever the state is sharded
        state = {f"model.{k}": read(params[k], np.float32) for k in self.names}
        state.update({f"model.{k}": read(model_state[k], None) for k in self.state_names})
        state["optimizer.step"] = np.asarray(int(counters[APPLIED]), np.int64)
        if self.scaled:
            state[f"optimizer.{SCALE_KEY}"] = np.ldexp(
                np.float32(1), counters[SCALE_EXPONENT]
            ).astype(np.float32)
            state[f"optimizer.{GOOD_STEPS_KEY}"] = np.asarray(counters[GOOD_STEPS], np.int64)
        for name in self.names:
            for suffix, values in slots.items():
                state[f"optimizer.{name}.{suffix}"] = read(values[name], np.float32)
        return state

    def device_state(
        self,
        state: Mapping[str, np.ndarray],
        current: DeviceState,
        optimizer: optim.Optimizer,
        init_opt_state: Callable[[Any], Any],
        put: Callable[[Any], Any],
    ) -> DeviceState:
        """The :class:`DeviceState` holding ``state`` (already checked against this layout).

        ``current`` gives what a checkpoint does not hold: the skipped-update counter and the
        loss log go on.
        """
        model, opt = split_state(state)
        step = int(opt.pop("step"))
        scaler = take_scaler_state(opt) if self.scaled else None
        if not 0 <= step < 2**31:
            raise ConfigError(f"optimizer.step must be in [0, 2**31) here, got {step}")
        device_array = lambda a: put(np.array(a, np.float32))  # noqa: E731
        params = unflatten_params(self.template, {k: device_array(model[k]) for k in self.names})
        dtypes = {k: v.dtype for k, v in flatten_params(self.state_template).items()}
        model_state = unflatten_params(
            self.state_template, {k: put(np.array(model[k], dtypes[k])) for k in dtypes}
        )
        slots = {
            slot: unflatten_params(
                self.template,
                {name: device_array(opt[f"{name}.{slot}"]) for name in self.names},
            )
            for slot in optimizer.state_slots
        }
        opt_state = put(import_slots(init_opt_state(params), slots, step))
        counters = np.asarray(current.counters).copy()
        counters[APPLIED] = counters[KEY_STEP] = step
        if scaler is not None:
            counters[SCALE_EXPONENT] = int(np.frexp(scaler[0])[1]) - 1
            counters[GOOD_STEPS] = int(scaler[1])
        return DeviceState(params, model_state, opt_state, put(counters), current.losses)
