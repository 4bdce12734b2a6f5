"""The framework adapters mirror each other: the same modules, holding the same concepts
under the same names, so a reader of one adapter can read the others.

Read from the source with ``ast``: no framework is imported.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

BACKENDS = Path(__file__).resolve().parents[1] / "unitrain" / "backends"
FRAMEWORKS = ("torch", "jax", "tensorflow")

#: The modules every framework adapter has, and what each holds under which name.
SHARED = {
    "backend": (),  # the Backend class
    "core": ("resolve_device",),  # device, dtype and conversion helpers
    "distributed": ("launch_command",),  # the launched workers' strategy and launcher
    "layers": (),  # a portable model as the framework's own module or function
    "model": ("loss_function",),  # losses and native models
    "ops": (),  # the op contract in the framework's arrays
    "_ops_int": ("bitwise_and", "take"),
    "_ops_nn": ("conv", "linear"),
    "optimizers": ("OPTIMIZERS", "in_ops", "optimizer_for"),  # native forms, else ops
    "precision": (),  # matmul precision and the loss scaler
    "prefetch": ("prefetch",),  # batches staged on the device ahead of the step
}
#: The modules only one adapter needs, and why.
OWN = {
    "torch": {
        "kernels": "which fused kernels compute correctly here; the device-side skip",
        "loops": "the multi-step and device-data calls, a part the backend holds",
        "sharding": "sharded training on FSDP2 (TensorFlow has no sharding engine: it refuses)",
    },
    "jax": {
        "compiled": "the jitted functions of an update",
        "losslog": "the losses of fused steps, logged in a device buffer",
        "state": "the device state's canonical checkpoint layout",
        "sharding": "the device state placed with NamedSharding over local devices",
    },
    "tensorflow": {
        "compiled": "the traced graphs of an update and the variables they update",
        "tracing": "the cache of traced functions, batch axes left unknown",
    },
}


def _names(path: Path) -> set[str]:
    """The module's top-level functions, classes and assigned names."""
    names: set[str] = set()
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {t.id for t in targets if isinstance(t, ast.Name)}
        elif isinstance(node, ast.ImportFrom):  # re-exported by the ops modules
            names |= {alias.asname or alias.name for alias in node.names}
    return names


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_each_adapter_has_the_shared_modules_and_only_its_declared_own(framework):
    found = {p.stem for p in (BACKENDS / framework).glob("*.py") if p.stem != "__init__"}
    assert found == set(SHARED) | set(OWN[framework]), (
        f"{framework}: modules not shared and not declared its own: "
        f"{sorted(found - set(SHARED) - set(OWN[framework]))}; missing: "
        f"{sorted(set(SHARED) - found)}"
    )


@pytest.mark.parametrize("framework", FRAMEWORKS)
@pytest.mark.parametrize("module", sorted(SHARED))
def test_each_shared_module_holds_its_concepts_under_the_same_names(framework, module):
    names = _names(BACKENDS / framework / f"{module}.py")
    missing = [name for name in SHARED[module] if name not in names]
    assert not missing, f"unitrain/backends/{framework}/{module}.py lacks {missing}"


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_each_adapter_exports_its_backend_class(framework):
    names = _names(BACKENDS / framework / "__init__.py")
    assert any(name.endswith("Backend") for name in names), names
