"""The op contract itself: every backend's ops module has every function with the contract's
parameters, every function is exercised by a case, and the dispatch picks the right module."""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import threading
from types import ModuleType

import numpy as np
import pytest
from _backends import installed

from unitrain import BackendNotFoundError, ConfigError, ops
from unitrain.conformance._op_cases import OP_CASES, make_inputs

BACKENDS = installed()


def parameters(function):
    return [(p.name, p.kind, p.default) for p in inspect.signature(function).parameters.values()]


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_backend_module_defines_the_whole_contract_with_its_parameters(backend):
    module = importlib.import_module(f"unitrain.backends.{backend}.ops")
    missing = [name for name in ops.CONTRACT if not callable(getattr(module, name, None))]
    assert not missing, f"{backend} ops lacks {missing}"
    differ = [
        name
        for name in ops.CONTRACT
        if parameters(getattr(module, name)) != parameters(getattr(ops, name))
    ]
    assert not differ, f"{backend} ops: parameters differ from the contract for {differ}"
    assert callable(module.to_numpy) and callable(module.vjp)


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_backend_class_names_its_ops_module(backend):
    from unitrain.backends.protocol import PortableOps
    from unitrain.backends.registry import get_backend

    cls = get_backend(backend)
    assert isinstance(cls.ops, ModuleType) and cls.ops.__name__.endswith(f"{backend}.ops")
    assert isinstance(cls, PortableOps)


class Recorder:
    """Stands in for an ops module and records which contract functions a case calls."""

    def __init__(self, module: ModuleType) -> None:
        self.module, self.called = module, set()

    def __getattr__(self, name: str):
        self.called.add(name)
        return getattr(self.module, name)


def test_the_cases_exercise_every_function_of_the_contract():
    from unitrain.backends.numpy import ops as reference

    recorder = Recorder(reference)
    for case in OP_CASES:
        case.call(recorder, *make_inputs(case))
    assert set(ops.CONTRACT) - recorder.called == set()


def test_case_names_are_unique_and_name_their_op():
    names = [case.name for case in OP_CASES]
    assert len(names) == len(set(names))
    assert {case.op for case in OP_CASES} <= {*ops.CONTRACT, "getitem"}


def test_ops_outside_a_backend_say_how_to_choose_one():
    with pytest.raises(ConfigError, match=r"ops\.using\('numpy'\)"):
        ops.exp(np.zeros(2))
    with pytest.raises(ConfigError, match=r"ops\.using\('numpy'\)"):
        ops.active()
    stand_in = ops.current()  # what the contract's functions call: fails on use, not on probes
    assert getattr(stand_in, "__deepcopy__", None) is None


def test_using_takes_a_name_a_module_or_a_backend_class_and_restores_the_previous():
    from unitrain.backends.numpy import ops as reference
    from unitrain.backends.registry import get_backend

    with ops.using("numpy") as chosen:
        assert chosen is reference
        with ops.using(get_backend("numpy")):
            assert ops.active() is reference
        assert ops.active() is reference
    with pytest.raises(ConfigError):
        ops.active()


def test_a_choice_in_one_thread_is_not_seen_by_another():
    seen = []
    with ops.using("numpy"):

        def look() -> None:
            try:
                ops.active()
                seen.append("chosen")
            except ConfigError:
                seen.append("none")

        thread = threading.Thread(target=look)
        thread.start()
        thread.join()
    assert seen == ["none"]


@pytest.mark.parametrize("bad", ["nonexistent", object()])
def test_a_backend_without_ops_is_refused_with_what_to_pass(bad):
    with pytest.raises((ConfigError, BackendNotFoundError), match="backend"), ops.using(bad):
        pass  # pragma: no cover - refused before the block
