"""The framework adapters mirror each other: the same modules, holding the same concepts
under the same names, so a reader of one adapter can read the others.

Read from the source with ``ast``: no framework is imported.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

BACKENDS = Path(__file__).resolve().parents[2] / "unitrain" / "backends"
FRAMEWORKS = ("torch", "jax", "tensorflow")

#: The modules every framework adapter has, and what each holds under which name.
SHARED = {
    "backend": (),  # the Backend class
    "core": ("resolve_device",),  # device, dtype and conversion helpers
    "distributed": ("launch_command",),  # the launched workers' strategy and launcher
    "layers": ("PortableModule",),  # a portable model as the framework's module or function
    "model": ("loss_function",),  # losses and native models
    "ops": (),  # the op contract in the framework's arrays
    "_ops_int": ("bitwise_and", "take"),
    "_ops_nn": ("conv", "linear"),
    "optimizers": ("OPTIMIZERS", "in_ops", "optimizer_for"),  # native forms, else ops
    "precision": ("LossScale", "set_matmul_precision"),  # matmul precision, the loss scaler
    "prefetch": ("prefetch",),  # batches staged on the device ahead of the step
}
#: Where one adapter holds a shared concept in another form, and why.
DIFFERS = {
    ("jax", "precision", "LossScale"): "the scaler's state lives in the donated counters of the "
    "jitted update, where no Python object can hold it between calls",
    ("jax", "precision", "set_matmul_precision"): "the precision is baked into each compiled "
    "function (MATMUL_ALGORITHMS), not set process-wide",
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
    expected = [name for name in SHARED[module] if (framework, module, name) not in DIFFERS]
    missing = [name for name in expected if name not in names]
    assert not missing, f"unitrain/backends/{framework}/{module}.py lacks {missing}"


@pytest.mark.parametrize(("framework", "module", "name"), sorted(DIFFERS))
def test_a_declared_difference_is_still_one(framework, module, name):
    """A stale exemption hides nothing: the name is really absent where it is declared so."""
    assert name not in _names(BACKENDS / framework / f"{module}.py"), (
        f"{framework}/{module}.py now has {name}: remove it from DIFFERS"
    )


def _classes(path: Path) -> dict[str, ast.ClassDef]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return {node.name: node for node in tree.body if isinstance(node, ast.ClassDef)}


@pytest.mark.parametrize("framework", (*FRAMEWORKS, "numpy"))
def test_each_backend_class_is_one_class_composed_of_parts(framework):
    """No backend is split across files by inheritance: its parts are objects it holds."""
    backends = {
        name: node
        for name, node in _classes(BACKENDS / framework / "backend.py").items()
        if name.endswith("Backend")
    }
    assert backends, f"{framework}/backend.py defines no Backend class"
    for name, node in backends.items():
        assert not node.bases, f"{name} inherits {[ast.unparse(b) for b in node.bases]}"


@pytest.mark.parametrize("framework", ("torch", "tensorflow", "numpy"))
def test_each_held_loss_scaler_is_the_shared_one(framework):
    """The adapters that hold the loss scaler in an object name it LossScale and derive it
    from the one state logic in unitrain/backends/common."""
    scaler = _classes(BACKENDS / framework / "precision.py").get("LossScale")
    assert scaler is not None, f"{framework}/precision.py has no LossScale"
    assert [ast.unparse(b) for b in scaler.bases] == ["AbstractLossScale"]


@pytest.mark.parametrize(
    ("framework", "module", "old", "new"),
    [
        ("tensorflow", "layers", "TFPortable", "PortableModule"),
        ("jax", "layers", "layers_apply", "PortableModule"),
        ("torch", "kernels", "build_optimizer", "on_fastest_kernel"),
    ],
)
def test_the_old_names_of_a_renamed_concept_are_declared(framework, module, old, new):
    """Names third parties may import stay importable (the deprecation is tested per backend)."""
    source = (BACKENDS / framework / f"{module}.py").read_text(encoding="utf-8")
    assert f'"{old}": "{new}"' in source and "renamed_getattr" in source


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_each_adapter_exports_its_backend_class(framework):
    names = _names(BACKENDS / framework / "__init__.py")
    assert any(name.endswith("Backend") for name in names), names
