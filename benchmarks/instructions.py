"""Instructions per training step, counted by callgrind: a speed measure no other job disturbs.

Wall-clock and CPU time on a shared 2-core machine spread 1.2-2x between segments, too much to
tell a 3 % change; the number of instructions a step executes does not depend on the load.
Each method runs in one process under ``valgrind --tool=callgrind --instr-atstart=no``, so
imports, tracing and compilation run uninstrumented (faster, and not counted).
For every workload the child trains ``WARMUP`` epochs, then turns instrumentation on and
trains three counted segments of ``K``, ``2K`` and ``K`` epochs, dumping the counts at the end
of each (callgrind client requests, from a tiny C library compiled here and called through
ctypes). Instructions per step are ``(count(2K) - count(K)) / (K * steps_per_epoch)``, so what
a segment costs once (turning the counter on, the dump, the first call after warm-up) cancels;
the last segment repeats the first, and ``--repeat 2`` runs every process twice, which checks
that the count is repeatable before it is trusted.

The command behind the table in ``benchmarks/README.md`` (one valgrind at a time, threads
pinned as in ``_worker.py``, ``PYTHONHASHSEED=0``), comparing unitrain at two commits, each
exported with ``git archive COMMIT unitrain | tar -x -C DIR``::

    python benchmarks/instructions.py --backends torch --workloads W1,LeNet,Transformer \\
        --tree new=/tmp/new --tree old=/tmp/old --no-native --steps 8

Epochs are cut to ``--steps`` steps (8 by default) so a count takes minutes, not hours:
callgrind runs the instrumented steps some 50-100x slower, and importing a framework and
compiling under valgrind takes minutes even uninstrumented. Without ``--tree`` the installed
unitrain is counted; without ``--no-native`` each backend's native loop is counted too. A
tree is put first on the child's ``sys.path`` (ahead of the repository, which ``python -m``
puts first, and of an editable install), and a child that imported unitrain from anywhere
else fails; each reports the file it imported. Needs
``valgrind`` with its headers (``valgrind/callgrind.h``) and a C compiler.
"""

from __future__ import annotations

import argparse
import ctypes
import dataclasses
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make ``benchmarks`` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._harness import ROOT, child_env
from benchmarks.workloads import WORKLOADS, Workload

__all__ = ["Counts", "main", "per_step", "read_dump"]

#: Uncounted epochs before the first counted segment (compilation and tracing happen there).
WARMUP = 2
#: Counted segments, in units of ``K`` epochs: the first and last are equal, as a check.
SEGMENTS = (1, 2, 1)

#: Where a child imports unitrain from (a ``--tree`` directory), set by the parent.
TREE_VARIABLE = "INSTRUCTIONS_UNITRAIN_TREE"

_CLIENT_SOURCE = r"""
#include <valgrind/callgrind.h>
void counter_start(void) { CALLGRIND_START_INSTRUMENTATION; CALLGRIND_ZERO_STATS; }
void counter_stop(void) { CALLGRIND_STOP_INSTRUMENTATION; }
void counter_dump(const char *label) { CALLGRIND_DUMP_STATS_AT(label); }
"""


def build_client(directory: Path) -> Path:
    """Compile the client-request library (a no-op outside valgrind) into ``directory``."""
    source, library = directory / "counter.c", directory / "libcounter.so"
    source.write_text(_CLIENT_SOURCE)
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        raise SystemExit("instructions.py needs a C compiler (cc or gcc) for the counter library")
    result = subprocess.run(
        [compiler, "-shared", "-fPIC", "-O1", "-o", str(library), str(source)],
        capture_output=True,
        text=True,
    )
    if result.returncode != 0:
        raise SystemExit(
            "could not compile the callgrind client library; install valgrind's headers "
            f"(valgrind/callgrind.h, e.g. the valgrind package):\n{result.stderr}"
        )
    return library


class CountingGate:
    """Turns the counter on after the warm-up and dumps it at the end of each segment."""

    def __init__(self, library: Any, workload: str, epochs_per_unit: int) -> None:
        self.library, self.workload = library, workload
        self.ends: dict[int, str] = {}
        done = WARMUP
        for index, units in enumerate(SEGMENTS):
            done += units * epochs_per_unit
            self.ends[done] = f"{workload}/{index}"
        self.epochs = done
        self.done = 0
        self.losses: list[float | None] = []

    def epoch_end(self, loss: float | None) -> None:
        """Count the epoch; start, dump or stop the counter at the segment boundaries."""
        self.done += 1
        self.losses.append(loss)
        if self.done in self.ends:
            self.library.counter_dump(self.ends[self.done].encode())
        if self.done == WARMUP:
            self.library.counter_start()
        elif self.done == self.epochs:
            self.library.counter_stop()


def shortened(name: str, steps: int) -> Workload:
    """The workload with ``steps`` steps per epoch (0: as defined), so a counted segment is
    short enough for callgrind; the epoch's own work (a permutation, one loss read) is then
    shared by fewer steps."""
    workload = WORKLOADS[name]
    return dataclasses.replace(workload, steps_per_epoch=steps) if steps else workload


def run_child(
    method_name: str, workloads: list[str], epochs_per_unit: int, steps: int, library: str
) -> None:
    """Train ``workloads`` one after another in this process (run under callgrind)."""
    tree = os.environ.get(TREE_VARIABLE)
    if tree:  # ahead of the working directory, which ``python -m`` puts first
        sys.path.insert(0, tree)
    from benchmarks._worker import pin_threads
    from benchmarks.methods import METHODS, train

    method = METHODS[method_name]
    pin_threads(method.backend)
    client = ctypes.CDLL(library)
    client.counter_dump.argtypes = [ctypes.c_char_p]
    report: dict[str, Any] = {"losses": {}}
    for name in workloads:
        gate = CountingGate(client, name, epochs_per_unit)
        train(method, shortened(name, steps), gate)
        report["losses"][name] = gate.losses
    report["unitrain"] = getattr(sys.modules.get("unitrain"), "__file__", None)
    if tree and not str(report["unitrain"]).startswith(tree):
        raise SystemExit(f"imported unitrain from {report['unitrain']}, not from {tree}")
    print(json.dumps(report), flush=True)


_DESC = re.compile(r"^desc: Trigger: Client Request: (\S+)$", re.M)
_TOTALS = re.compile(r"^(?:totals|summary): (\d+)", re.M)


def read_dump(text: str) -> tuple[str, int] | None:
    """``(label, instructions)`` of one callgrind dump made by a client request, else None.

    Examples:
        >>> read_dump("desc: Trigger: Client Request: W1/0\\nevents: Ir\\ntotals: 1234\\n")
        ('W1/0', 1234)
        >>> read_dump("desc: Trigger: Program termination\\ntotals: 99\\n") is None
        True
    """
    label, totals = _DESC.search(text), _TOTALS.search(text)
    if label is None or totals is None:
        return None
    return label.group(1), int(totals.group(1))


@dataclasses.dataclass(frozen=True)
class Counts:
    """One process's counted segments of one workload (instructions, as in SEGMENTS)."""

    segments: tuple[int, ...]
    steps_per_unit: int

    def per_step(self) -> float:
        """Instructions per step: the ``2K`` segment less the first ``K`` one, per step."""
        return per_step(self.segments, self.steps_per_unit)

    def drift(self) -> float:
        """Relative difference of the two equal segments (first and last)."""
        return abs(self.segments[2] - self.segments[0]) / self.segments[0]


def per_step(segments: tuple[int, ...], steps_per_unit: int) -> float:
    """``(count(2K) - count(K)) / (K steps)``: what a segment costs once cancels.

    Examples:
        >>> per_step((1_000 + 10 * 50, 1_000 + 20 * 50, 1_000 + 10 * 50), 10)
        50.0
    """
    return (segments[1] - segments[0]) / steps_per_unit


def count_method(
    method_name: str,
    backend: str,
    tree: Path | None,
    workloads: list[str],
    epochs_per_unit: int,
    steps: int,
    library: Path,
    out: Path,
) -> tuple[dict[str, Counts], dict[str, Any]]:
    """Run one method under callgrind; its counts per workload and the child's report."""
    out.mkdir(parents=True)
    env = child_env(backend)
    if tree is not None:
        env[TREE_VARIABLE] = str(tree)
    command = [
        "valgrind",
        "--tool=callgrind",
        "--instr-atstart=no",
        f"--callgrind-out-file={out}/callgrind.out",
        sys.executable,
        "-m",
        "benchmarks.instructions",
        "--child",
        method_name,
        ",".join(workloads),
        str(epochs_per_unit),
        str(steps),
        str(library),
    ]
    with open(out / "stderr.log", "wb") as log:
        result = subprocess.run(command, stdout=subprocess.PIPE, stderr=log, cwd=ROOT, env=env)
    if result.returncode != 0:
        tail = (out / "stderr.log").read_text(errors="replace")[-3000:]
        raise RuntimeError(f"{method_name} failed (exit {result.returncode}):\n{tail}")
    report = json.loads(result.stdout.decode().strip().splitlines()[-1])
    found: dict[str, int] = {}
    for path in out.glob("callgrind.out*"):
        dump = read_dump(path.read_text(errors="replace"))
        if dump is not None:
            found[dump[0]] = dump[1]
    counts = {}
    for name in workloads:
        segments = tuple(found[f"{name}/{i}"] for i in range(len(SEGMENTS)))
        per_unit = epochs_per_unit * shortened(name, steps).steps_per_epoch
        counts[name] = Counts(segments, per_unit)
    return counts, report


def table(rows: list[dict[str, Any]], trees: list[str]) -> str:
    """Markdown: instructions per step (mean over repeats), each tree's ratio to native (where
    native was counted), the spread between repeats, and the first tree over the second."""
    cells: dict[tuple[str, str, str], list[float]] = {}
    for row in rows:
        cells.setdefault((row["backend"], row["workload"], row["method"]), []).append(
            row["per_step"]
        )
    native = any(method == "native" for _, _, method in cells)
    methods = ["native", *trees] if native else trees
    head = ["backend", "workload", *methods]
    head += [f"{t}/native" for t in trees] if native else []
    head.append("repeat spread")
    if len(trees) >= 2:
        head.append(f"{trees[0]} vs {trees[1]}")
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for backend, workload in dict.fromkeys((b, w) for b, w, _ in cells):
        means, spread = {}, 0.0
        for method in methods:
            values = cells[(backend, workload, method)]
            means[method] = sum(values) / len(values)
            spread = max(spread, (max(values) - min(values)) / min(values))
        line = [backend, workload] + [f"{means[m]:,.0f}" for m in methods]
        line += [f"{means[t] / means['native']:.4f}" for t in trees] if native else []
        line.append(f"{spread:.1e}")
        if len(trees) >= 2:
            line.append(f"{means[trees[0]] / means[trees[1]] - 1:+.2%}")
        lines.append("| " + " | ".join(line) + " |")
    return "\n".join(lines)


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--backends", default="torch,jax,tensorflow")
    parser.add_argument("--workloads", default="W1,LeNet,Transformer")
    parser.add_argument(
        "--tree",
        action="append",
        default=[],
        metavar="NAME=DIR",
        help="count unitrain imported from DIR (holding unitrain/) under NAME; repeatable",
    )
    parser.add_argument("--epochs", type=int, default=1, help="K: epochs per counted unit")
    parser.add_argument(
        "--steps", type=int, default=8, help="steps per epoch (0: the workload's own)"
    )
    parser.add_argument(
        "--no-native", action="store_true", help="count only unitrain (the trees' ratio)"
    )
    parser.add_argument("--repeat", type=int, default=1, help="processes per method")
    parser.add_argument("--json", type=Path, help="write every count here")
    return parser.parse_args(argv)


def _trees(specs: list[str]) -> dict[str, Path | None]:
    if not specs:
        return {"unitrain": None}
    trees: dict[str, Path | None] = {}
    for spec in specs:
        name, _, directory = spec.partition("=")
        if not name or not (Path(directory) / "unitrain" / "__init__.py").is_file():
            raise SystemExit(f"--tree wants NAME=DIR with DIR/unitrain/__init__.py; got {spec!r}")
        trees[name] = Path(directory).resolve()
    return trees


def main(argv: list[str]) -> None:
    """Count every backend's native loop and unitrain (per tree); print the table."""
    if argv[:1] == ["--child"]:
        run_child(argv[1], argv[2].split(","), int(argv[3]), int(argv[4]), argv[5])
        return
    args = _parse(argv)
    if shutil.which("valgrind") is None:
        raise SystemExit("instructions.py needs valgrind on PATH (e.g. apt install valgrind)")
    trees, workloads = _trees(args.tree), args.workloads.split(",")
    unknown = sorted(set(workloads) - set(WORKLOADS))
    if unknown:
        raise SystemExit(f"unknown workloads {unknown}; choose from {sorted(WORKLOADS)}")
    scratch = Path(tempfile.mkdtemp(prefix="instructions-"))
    library = build_client(scratch)
    results: dict[str, Any] = {"epochs_per_unit": args.epochs, "warmup": WARMUP, "rows": []}
    for backend in args.backends.split(","):
        native = [] if args.no_native else [(f"{backend}/native", "native", None)]
        runs = native + [(f"{backend}/unitrain", name, tree) for name, tree in trees.items()]
        for method_name, label, tree in runs:
            for repeat in range(args.repeat):
                started = time.perf_counter()
                counts, report = count_method(
                    method_name,
                    backend,
                    tree,
                    workloads,
                    args.epochs,
                    args.steps,
                    library,
                    scratch / f"{backend}.{label}.{repeat}",
                )
                seconds = time.perf_counter() - started
                for name, c in counts.items():
                    row = {
                        "backend": backend,
                        "method": label,
                        "workload": name,
                        "repeat": repeat,
                        "segments": c.segments,
                        "steps_per_unit": c.steps_per_unit,
                        "per_step": c.per_step(),
                        "drift": c.drift(),
                        "losses": report["losses"][name],
                        "unitrain": report["unitrain"],
                    }
                    results["rows"].append(row)
                    print(
                        f"{backend:10s} {label:8s} {name:12s} #{repeat} "
                        f"{c.per_step():14,.0f} instr/step  first-vs-last {c.drift():.2e}  "
                        f"({seconds:.0f} s, {report['unitrain']})",
                        flush=True,
                    )
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    print(table(results["rows"], list(trees)))


if __name__ == "__main__":
    main(sys.argv[1:])
