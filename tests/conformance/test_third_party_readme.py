"""The worked example's README holds a verdict its script writes, never one typed by hand.

``examples/third_party_backend/regenerate_readme.py`` runs the kit on keras_native and writes
its table between two markers of the README. Running the kit takes over a minute and is the
job of ``tests/conformance/test_conformance_third_party.py``; here the script's formatting runs on a
report built from a few records, and the README is checked for the markers and a block in
the form the script writes.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from unitrain.backends.protocol import Capabilities
from unitrain.conformance import CheckResult, Report
from unitrain.conformance._context import BackendUnderTest

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "third_party_backend"


def _script():
    spec = importlib.util.spec_from_file_location(
        "regenerate_readme", EXAMPLE / "regenerate_readme.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _record(check: str, status: str, reason: str = "", error: float | None = None) -> CheckResult:
    family = check.split("::")[0]
    return CheckResult(
        id=f"{check}[cpu-float32]",
        family=family,
        check=check.split("::")[1],
        backend="keras_native",
        backend_versions={"keras": "3.0", "tensorflow": "2.16"},
        unitrain_version="0.1.0",
        device="cpu",
        dtype="float32",
        status=status,
        reason=reason,
        max_rel_error=error,
        tolerance=None if error is None else 1e-6,
    )


def _report(root: Path) -> Report:
    backend = BackendUnderTest(
        None,
        "keras_native",
        "keras_native.backend:KerasNativeBackend",
        Capabilities(),
        xfails={"optimizers::sgd_momentum": "Keras SGD keeps the LR inside the buffer"},
    )
    long_reason = "known failure (Keras SGD keeps the LR inside the buffer): " + " ".join(
        f"relative error {i} exceeds the tolerance at {root}/unitrain/optim/_base.py:212"
        for i in range(8)
    )
    results = [
        _record("schedules::constant", "passed", error=6.5e-8),
        _record("optimizers::sgd", "passed", error=3.5e-7),
        _record("optimizers::sgd_momentum", "xfailed", long_reason, error=0.278),
        _record("fused::train_step", "skipped", "the backend offers no train_step(batch, lr)"),
    ]
    return Report(backend, results)


def test_the_block_is_the_kits_table_wrapped_and_free_of_this_machines_paths(tmp_path):
    script = _script()
    block = script.verdict_block(_report(tmp_path), root=tmp_path)
    lines = block.splitlines()
    assert lines[0].startswith("The verdict on the CPU in float32 (keras 3.0, tensorflow 2.16)")
    assert lines[2] == "```text" and lines[-1] == "```"
    assert "family" in lines[4] and "worst float32 / tol" in lines[4]
    (schedules,) = [line for line in lines if line.startswith("schedules")]
    assert schedules.split()[1:6] == ["1", "0", "0", "0", "0"]
    (total,) = [line for line in lines if line.startswith("total")]
    assert total.split()[1:] == ["2", "0", "1", "1", "0"]
    assert lines[-2] == "verdict: conforms, with 1 declared deviation"
    xfailed = lines.index(next(line for line in lines if line.startswith("XFAILED")))
    assert all(len(line) <= script.WIDTH for line in lines[xfailed : xfailed + script.MAX_LINES])
    assert lines[xfailed + script.MAX_LINES - 1].endswith(" ...")
    assert str(tmp_path) not in block and "unitrain/optim/_base.py:212" in block


def test_the_block_replaces_what_lies_between_the_markers_and_nothing_else():
    script = _script()
    readme = f"intro\n{script.BEGIN}\nold verdict\n{script.END}\noutro\n"
    assert (
        script.replace_block(readme, "new") == f"intro\n{script.BEGIN}\nnew\n{script.END}\noutro\n"
    )
    for broken in (
        "no markers",
        f"{script.END}\n{script.BEGIN}",
        f"{script.BEGIN}{script.BEGIN}{script.END}",
    ):
        with pytest.raises(ValueError, match="must"):
            script.replace_block(broken, "new")


def test_the_readme_holds_a_block_the_script_wrote():
    script = _script()
    text = (EXAMPLE / "README.md").read_text(encoding="utf-8")
    assert text.count(script.BEGIN) == 1 and text.count(script.END) == 1
    block = text.split(script.BEGIN)[1].split(script.END)[0].strip()
    assert block.startswith("The verdict on the CPU in float32 (")
    assert "`python examples/third_party_backend/regenerate_readme.py`" in block.splitlines()[0]
    assert "\n```text\nunitrain conformance: backend 'keras_native'" in block
    assert block.splitlines()[-2].startswith("verdict: conforms")
    # Re-formatting the README's own block changes nothing: it is in the script's form.
    assert script.replace_block(text, block) == text
