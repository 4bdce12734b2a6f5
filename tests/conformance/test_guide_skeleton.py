"""The backend guide's minimal backend, pasted into a file as written, conforms.

docs/writing-a-backend.md promises a complete backend a third party can start from. This test
copies the ``python`` block that follows ``<!-- skeleton -->`` there into a module in
``tmp_path``, character for character, and runs the kit on it as ``"guide_skeleton:MyBackend"``.

What runs (about 45 s on a 2-core CPU): every check in float32, except the ``ops`` family,
which would hold the torch backend's ops module the skeleton borrows to the reference (the
torch backend's own tests and kit run do that), and the ``*_installed`` hand-offs, which
import every other installed framework. That is every family the skeleton declares: the
protocol's (schedules, optimizers, checkpoints, resume, early stopping, callbacks, evaluation,
dropout with the caller's step and micro-batch, accumulation, clipping, determinism, devices)
and the portable layers' (layers, model state, the hand-off to the numpy reference). The
float64 row runs the same code in another dtype and is left to a full kit run.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

from unitrain.conformance import run
from unitrain.conformance._registry import FAMILIES

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "writing-a-backend.md"
MODULE = "guide_skeleton"
#: The families the skeleton must run and pass: every one but what it leaves out (a fused
#: step, mixed precision, data-parallel and sharded training) and ``ops``, left out here
#: because it borrows torch's ops module, which the kit certifies with the torch backend.
LEFT_OUT = {"fused", "mixed_precision", "data_parallel", "sharded"}
DECLARED = set(FAMILIES) - {"ops"} - LEFT_OUT


def skeleton() -> str:
    """The guide's skeleton block, exactly as written."""
    text = GUIDE.read_text(encoding="utf-8")
    (block,) = re.findall(r"^<!-- skeleton -->\n```python\n(.*?)^```$", text, re.S | re.M)
    return block


@pytest.fixture
def skeleton_module(tmp_path, monkeypatch):
    (tmp_path / f"{MODULE}.py").write_text(skeleton(), encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield f"{MODULE}:MyBackend"
    sys.modules.pop(MODULE, None)


def test_the_skeleton_is_one_marked_block_that_takes_the_update_numbers():
    code = skeleton()
    assert "class MyBackend" in code
    assert "step: int | None = None, micro_batch: int | None = None" in code
    assert "dropout_index(" in code
    # The dtype comes from options.dtype: "float32" is named once, in the declaration.
    assert code.count('"float32"') == 1 and 'dtypes=("float32", "float64")' in code


@pytest.mark.harness  # the whole kit on the guide's skeleton: over a minute on a 2-core CPU
def test_the_guides_skeleton_conforms(skeleton_module):
    report = run(
        skeleton_module,
        device="cpu",
        dtypes=["float32"],
        keyword="not ops:: and not _installed",
    )
    ran = {r.family for r in report.results if r.status != "skipped"}
    assert ran == DECLARED, sorted(ran ^ DECLARED)
    assert report.verdict_line() == "conforms", report.table()
    assert all(r.status == "passed" for r in report.results if r.family == "dropout")
    skipped = {r.family for r in report.results if r.status == "skipped"}
    # What it does not offer is skipped with a reason, never passed untested.
    assert skipped >= LEFT_OUT
