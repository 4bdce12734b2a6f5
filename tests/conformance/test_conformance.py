"""The conformance kit on the built-in backends, and its report, CLI and pytest plugin.

Every built-in backend is checked in every dtype it declares (numpy and TensorFlow float32
and float64, torch also bfloat16, JAX float32): each dtype must run >= 60 checks with no
failure.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import ClassVar

import _faulty_backends
import numpy as np
import pytest
from _backends import backends

from unitrain import get_backend
from unitrain.backends.numpy import NumpyBackend
from unitrain.cli import main
from unitrain.conformance import REPORT_SCHEMA, all_checks, check_backend, run
from unitrain.conformance._registry import FAMILIES, keyword_matcher, xfail_reason
from unitrain.conformance._runner import plan, resolve_backend

ROOT = Path(__file__).resolve().parents[2]


def _assert_conforms(results: list, minimum: int = 60) -> None:
    failed = [f"{r.id}: {r.reason}" for r in results if r.status == "failed"]
    assert not failed, "\n".join(failed)
    ran = [r for r in results if r.status in ("passed", "xfailed", "xpassed")]
    assert len(ran) >= minimum, f"only {len(ran)} checks ran"


@pytest.mark.harness  # CI: the TensorFlow kit's largest family takes ~2 min on 2 workers
@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("backend", backends())
def test_backend_conforms_in_every_declared_dtype(backend, family):
    """The whole kit, one family per item, in every dtype the backend declares (read from its
    capabilities, so a newly declared dtype is held to the kit at once), on the CPU.

    One item per backend and family (not per backend) lets pytest-xdist's workers share a
    backend's kit: with one item per backend, one worker ran TensorFlow's whole kit alone.
    Every check of the family runs exactly once per dtype; the families are the registry's
    (see test_the_harness_items_run_every_check_once).
    """
    declared = get_backend(backend).capabilities.dtypes
    results = check_backend(backend, device="cpu", dtypes=list(declared), keyword=f"{family}::")
    assert sorted(r.id for r in results) == sorted(_family_ids(family, declared))
    for dtype in declared:
        # A family the backend does not declare (numpy's fused, data_parallel, ...) runs no
        # check at all: nothing may fail, and the whole kit's size is held below.
        _assert_conforms([r for r in results if r.dtype == dtype], minimum=0)
    # The whole kit's size, which no single item sees run: >= 60 checks planned per dtype.
    planned, _ = plan(resolve_backend(backend), device="cpu")
    for dtype in declared:
        runnable = [p for p in planned if p.dtype == dtype and p.skip_reason is None]
        assert len(runnable) >= 60, f"only {len(runnable)} {dtype} checks are planned to run"


def _family_ids(family: str, dtypes) -> list[str]:
    return [c.id("cpu", d) for d in dtypes for c in all_checks() if c.family == family]


def test_the_harness_items_run_every_check_once():
    """The harness's items (one per family, selected by ``family::``) together plan the whole
    kit, each check exactly once (no family's word selects another's checks)."""
    assert {c.family for c in all_checks()} == set(FAMILIES)  # the items' parameter
    backend = resolve_backend("numpy")
    whole, _ = plan(backend, device="cpu")
    split = [p for f in FAMILIES for p in plan(backend, device="cpu", keyword=f"{f}::")[0]]
    assert sorted(p.id for p in split) == sorted(p.id for p in whole)
    assert len(split) == len({p.id for p in split})


def test_registry_has_stable_unique_ids_in_every_family():
    checks = all_checks()
    ids = [c.base_id for c in checks]
    assert len(ids) == len(set(ids))
    assert {c.family for c in checks} == set(FAMILIES)
    assert len(checks) >= 60
    assert all(c.description for c in checks)
    assert all(c.guards for c in checks)  # what each fails on, for a backend's author


def test_keyword_expressions_and_xfail_keys():
    match = keyword_matcher("(schedules or optimizers) and not adam and float32")
    assert match("optimizers::sgd[cpu-float32]")
    assert not match("optimizers::adamw[cpu-float32]")
    assert not match("schedules::constant[cpu-float64]")
    xfails = {"optimizers::adam": "eps", "checkpoints::": "all", "fused::*[gpu-*]": "gpu"}
    assert xfail_reason(xfails, "optimizers::adam[cpu-float32]") == ("optimizers::adam", "eps")
    assert xfail_reason(xfails, "optimizers::adamw[cpu-float32]") is None
    assert xfail_reason(xfails, "checkpoints::metadata[cpu-float32]")[1] == "all"
    assert xfail_reason(xfails, "fused::steps_per_call[gpu-float32]")[1] == "gpu"


class _Declaring(NumpyBackend):
    """The numpy backend with declarations: one real known failure (none: it conforms, so
    the xfail is stale), one xfail matching nothing, and a float32-only dtype list."""

    conformance_xfails: ClassVar[dict[str, str]] = {
        "schedules::constant": "pretend this were broken",
        "nonsense::check": "matches nothing",
    }
    conformance_tolerances: ClassVar[dict[str, dict[str, float]]] = {"float32": {"lr": 1e-6}}


def test_report_json_matches_its_schema_and_records_declarations(tmp_path):
    jsonschema = pytest.importorskip("jsonschema")
    report = run(_Declaring, device="cpu", keyword="schedules::constant or schedules::cosine_decay")
    document = json.loads(report.write(tmp_path / "report.json").read_text())
    jsonschema.validate(document, REPORT_SCHEMA)
    summary = document["summary"]
    assert summary["counts"]["xpassed"] == 2  # constant, in float32 and float64
    assert summary["counts"]["passed"] == 2
    assert summary["verdict"] == "conforms"
    assert summary["overrides"]["tolerances"] == {"float32": {"lr": 1e-6}}
    warnings = " ".join(summary["warnings"])
    assert "'nonsense::check': it matches no check id" in warnings
    assert "stale xfail 'schedules::constant'" in warnings
    cosine = next(
        c for c in document["checks"] if c["id"] == "schedules::cosine_decay[cpu-float32]"
    )
    assert cosine["tolerance"] == 1e-6 and cosine["tolerance_override"] is True
    assert cosine["tolerance_kind"] == "lr" and 0 < cosine["max_rel_error"] < 1e-6
    assert cosine["backend_versions"]["numpy"] and cosine["unitrain_version"]


def test_undeclared_device_and_dtype_are_skipped_with_reasons():
    results = check_backend("numpy", device="gpu", keyword="schedules::constant")
    assert {r.status for r in results} == {"skipped"}
    assert "does not declare device 'gpu'" in results[0].reason
    results = check_backend(
        "numpy", device="cpu", dtypes=["bfloat16"], keyword="schedules::constant"
    )
    assert [r.reason for r in results] == ["the backend does not declare dtype 'bfloat16'"]


def test_cli_prints_the_table_writes_the_report_and_sets_the_exit_status(tmp_path, capsys):
    path = tmp_path / "numpy.json"
    code = main(
        ["conformance", "--backend", "numpy", "-k", "schedules and float32", "--report", str(path)]
    )
    out = capsys.readouterr().out
    assert code == 0
    assert "schedules" in out and "verdict: conforms" in out
    assert json.loads(path.read_text())["summary"]["counts"]["passed"] == 13
    faulty = "test_conformance_faults:LrOneStepLate"
    assert main(["conformance", "--backend", faulty, "-k", "cosine_decay and float32"]) == 1
    assert "FAILED   schedules::cosine_decay[cpu-float32]" in capsys.readouterr().out
    assert main(["conformance", "--list"]) == 0
    listed = capsys.readouterr().out
    assert "optimizers::adam_small_gradients" in listed
    assert "fails on: epsilon added to sqrt(v) before the bias correction" in listed


def _pytest(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    # The faulty backends (this folder) and the backend table (tests/) import from here.
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent), str(ROOT / "tests")]),
    }
    command = [
        sys.executable,
        "-m",
        "pytest",
        "--pyargs",
        "unitrain.conformance",
        "-p",
        "no:cacheprovider",
        "-p",
        "no:benchmark",
        "-o",
        "addopts=",
        *args,
    ]
    return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


def test_pytest_plugin_runs_the_same_checks_under_xdist(tmp_path):
    report = tmp_path / "kit.json"
    done = _pytest(
        "--unitrain-backend",
        "numpy",
        "--unitrain-dtype",
        "float32",
        "-n",
        "2",
        "-k",
        "schedules",
        "--unitrain-report",
        str(report),
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "13 passed" in done.stdout and "verdict: conforms" in done.stdout
    records = json.loads(report.read_text())["checks"]
    assert sorted(r["id"] for r in records) == sorted(
        f"schedules::{c.name}[cpu-float32]" for c in all_checks() if c.family == "schedules"
    )


def test_pytest_plugin_does_nothing_unless_asked(tmp_path):
    env_free = _pytest("-rs", cwd=tmp_path)
    # No backend asked for: no check is parametrized, the one placeholder item is skipped,
    # and the run succeeds.
    assert env_free.returncode == 0, env_free.stdout + env_free.stderr
    assert "1 skipped" in env_free.stdout and "passed" not in env_free.stdout
    assert "empty parameter set" in env_free.stdout.split("short test summary")[1]


def test_plugin_fails_a_faulty_backend(tmp_path):
    done = _pytest(
        "--unitrain-backend",
        "test_conformance_faults:KerasMomentum",
        "--unitrain-dtype",
        "float32",
        "-k",
        "sgd_momentum and not decay",
        cwd=tmp_path,
    )
    assert done.returncode == 1
    assert "FAILED" in done.stdout and "optimizers::sgd_momentum[cpu-float32]" in done.stdout


def test_the_backend_guide_lists_every_check_and_what_it_fails_on():
    guide = (ROOT / "docs" / "writing-a-backend.md").read_text(encoding="utf-8")
    rows = {line for line in guide.splitlines() if line.startswith("| `") and "::" in line}
    expected = {f"| `{c.base_id}` | {c.description} | {c.guards} |" for c in all_checks()}
    assert rows == expected, sorted(rows ^ expected)[:4]


@pytest.mark.harness  # launches two torch workers twice: about a minute on a 2-core CPU
def test_a_backend_class_reaches_the_workers_as_the_same_backend_its_import_name_does():
    TorchBackend = pytest.importorskip("unitrain.backends.torch").TorchBackend  # launches workers

    by_class = check_backend(TorchBackend, dtypes=["float32"], keyword="workers_match_global")
    by_name = check_backend(
        "unitrain.backends.torch:TorchBackend", dtypes=["float32"], keyword="workers_match_global"
    )
    assert [(r.id, r.status) for r in by_class] == [(r.id, r.status) for r in by_name]
    assert [r.status for r in by_class] == ["passed"], by_class[0].reason


def test_the_cli_gives_a_registered_name_and_its_import_path_the_same_verdict(capsys):
    pytest.importorskip("unitrain.backends.torch")
    from unitrain.cli import main

    def verdict(backend: str) -> list[str]:
        args = ["conformance", "--backend", backend, "--dtype", "float32", "-k", "keyed_by"]
        code = main(args)
        lines = capsys.readouterr().out.splitlines()
        return [str(code), *(line for line in lines if line.startswith(("dropout ", "verdict")))]

    by_name = verdict("torch")
    assert by_name[0] == "0" and by_name[-1] == "verdict: conforms", by_name
    assert verdict("unitrain.backends.torch:TorchBackend") == by_name


def test_a_backend_defined_in_main_is_told_what_to_pass_instead_of_unknown_backend():
    TorchBackend = pytest.importorskip("unitrain.backends.torch").TorchBackend
    script_class = type("ScriptBackend", (TorchBackend,), {"__module__": "__main__"})
    (result,) = check_backend(script_class, dtypes=["float32"], keyword="workers_match_global")
    assert result.status == "failed"
    assert "defined in the script being run" in result.reason
    assert "'package.module:Class'" in result.reason


def test_a_failure_names_the_tensor_the_float32_sized_error_and_the_likely_cause():
    from unitrain.conformance._context import CheckFailed, Context
    from unitrain.conformance._runner import resolve_backend
    from unitrain.conformance._tolerances import tolerance_for

    ctx = Context(resolve_backend("numpy"), "cpu", "float64", tolerance_for("float64"))
    expected = {"model.a": np.ones(4), "model.b": np.ones(4)}
    off = {"model.a": np.ones(4), "model.b": np.ones(4) * (1 + 3e-7)}  # float32-sized
    with pytest.raises(CheckFailed, match=r"furthest off: 'model\.b'.*a float32 computation"):
        ctx.compare("state after one update", off, expected, "step")
    broken = {"model.a": np.array([1.0, np.nan, 1.0, np.inf]), "model.b": np.ones(4)}
    with pytest.raises(CheckFailed, match=r"first non-finite: 'model\.a' holds 2 .* at \[1\]"):
        ctx.compare("state after one update", broken, expected, "step")
    with pytest.raises(CheckFailed, match=r"first off at \[2\] of 4 \(3\.5, expected 3\)"):
        ctx.compare("loss per epoch", [0.0, 1.0, 3.5, 4.0], [0.0, 1.0, 3.0, 4.0], "training")

    results = check_backend(
        _faulty_backends.DropoutNotInverted,
        dtypes=["float32"],
        keyword="dropout::inverted_scaling",
    )
    (failed,) = results
    assert failed.status == "failed"
    assert failed.reason.endswith(f"(likely: {_guards('dropout::inverted_scaling')})")
    assert failed.likely_cause == _guards("dropout::inverted_scaling")


def _guards(base_id):
    return next(c.guards for c in all_checks() if c.base_id == base_id)


def test_data_parallel_is_skipped_unless_declared_and_simulated_workers_are_named():
    skipped = check_backend("numpy", dtypes=["float64"], keyword="data_parallel")
    assert {r.status for r in skipped} == {"skipped"}
    assert {r.reason for r in skipped} == {
        "the backend does not declare capability 'data_parallel'"
    }

    report = run(
        _faulty_backends.SimulatesItsWorkers, dtypes=["float64"], keyword="data_parallel::workers_"
    )
    assert [(r.status, r.simulated) for r in report.results] == [("passed", True)] * 2
    assert report.summary()["simulated"] == [r.id for r in report.results]
    table = report.table()
    assert "SIMULATED data_parallel::workers_match_global_batch[cpu-float64] (passed)" in table
    assert "SimulatedWorkers in one process" in table

    (declared,) = check_backend(
        _faulty_backends.DeclaresDataParallelOnly,
        dtypes=["float64"],
        keyword="data_parallel::workers_match",
    )
    assert declared.status == "failed"
    assert "offers neither launch_command(workers) nor launched_strategy()" in declared.reason
    assert declared.likely_cause == "a capability declared without the methods it stands for"


def test_the_report_gives_each_family_its_worst_error_per_dtype():
    report = run("numpy", keyword="schedules::cosine_decay")
    (row,) = report.family_rows()
    assert sorted(row["worst"]) == ["float32", "float64"]
    assert row["worst"]["float64"]["tolerance"] == 1e-13
    assert row["worst"]["float32"]["tolerance"] == 5e-7
    assert row["worst"]["float64"]["id"] == "schedules::cosine_decay[cpu-float64]"
    header = report.table().splitlines()[1]
    assert "worst float32 / tol" in header and "worst float64 / tol" in header
