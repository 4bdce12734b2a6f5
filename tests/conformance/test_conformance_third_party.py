"""The third-party example (examples/third_party_backend) gets its expected verdict.

Nothing is installed: the kit is pointed at ``keras_native.backend:KerasNativeBackend`` with
the example's folder on ``sys.path``, as its README shows.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytest.importorskip("keras")
pytest.importorskip("tensorflow")

from unitrain.conformance import run

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "third_party_backend"


@pytest.fixture
def on_path(monkeypatch):
    monkeypatch.syspath_prepend(str(EXAMPLE))
    yield
    for name in [m for m in sys.modules if m.startswith("keras_native")]:
        del sys.modules[name]


@pytest.mark.harness  # the whole kit on Keras: ~1.5 min in CI
def test_keras_native_conforms_with_its_declared_known_failures(on_path):
    report = run("keras_native.backend:KerasNativeBackend", device="cpu")
    counts = report.counts()
    assert report.verdict() == "conforms", report.table()
    assert counts["failed"] == 0 and counts["xpassed"] == 0
    # The last line never reads as full agreement: it counts the declared deviations.
    last = report.table().splitlines()[-1]
    assert last == f"verdict: conforms, with {counts['xfailed']} declared deviations"
    assert counts["passed"] >= 60
    xfailed = {r.id for r in report.results if r.status == "xfailed"}
    assert "optimizers::sgd_momentum[cpu-float32]" in xfailed
    assert "optimizers::adam_small_gradients[cpu-float32]" in xfailed
    assert report.warnings == []  # no stale declarations
    assert all(r.status == "passed" for r in report.results if r.family == "schedules")


def test_the_example_declares_its_entry_point():
    text = (EXAMPLE / "pyproject.toml").read_text()
    assert '[project.entry-points."unitrain.backends"]' in text
    assert 'keras_native = "keras_native.backend:KerasNativeBackend"' in text
