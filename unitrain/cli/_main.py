"""``unitrain`` on the command line: train and compare recipes, plot runs, inspect checkpoints.

Output is made for terminals and log files alike: one line per epoch as it ends (a progress
bar only on a terminal), warnings on one line, framework start-up noise hidden, no traceback
for a closed pipe (``unitrain inspect DIR | head``), Ctrl-C or a bad input.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from unitrain._errors import CheckpointError, UnitrainError
from unitrain.cli._export import add_export_command
from unitrain.cli._help import plain_text
from unitrain.cli._launch import launched_worker
from unitrain.cli._predict import add_predict_command
from unitrain.cli._train import quiet_framework_import
from unitrain.training._preemption import PREEMPTION_EXIT_STATUS, Preempted, stopping_at_once

__all__ = ["main"]


def _backends(args: argparse.Namespace) -> int:
    """List the backends, one line each, printed as soon as that backend's devices are known.

    Finding the devices imports the framework (seconds each, a minute for all four), so the
    lines are not held back for a table sized to the slowest: the cheap columns are aligned
    first and the devices and versions, found last, end each line. The versions are what the
    backend's ``versions()`` reports (see :func:`_versions_of`).
    """
    from unitrain.backends.protocol import AvailableDevices
    from unitrain.backends.registry import get_backend, list_backends

    found = list_backends()  # names and targets from package metadata: no imports
    rows = [(i.name, "yes" if i.installed else "no", i.target) for i in found]
    header = ("backend", "installed", "target")
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    registered = _registered_versions()

    def line(cells: Sequence[str], devices: str, versions: str) -> str:
        cheap = "  ".join(cell.ljust(width) for cell, width in zip(cells, widths))
        return f"{cheap}  {devices.ljust(len('cpu, gpu'))}  {versions}".rstrip()

    print(line(header, "devices", "versions"), flush=True)
    for info, row in zip(found, rows):
        devices = versions = "-"
        if info.installed:
            try:
                quiet_framework_import(info.name)
                cls: Any = get_backend(info.name)
                listed = cls.available_devices() if isinstance(cls, AvailableDevices) else None
                devices = ", ".join(listed or cls.capabilities.devices)
                fallback = registered.get(info.name, {})
                if info.framework_version is not None:  # a built-in: its framework's version
                    fallback = {info.name: info.framework_version}
                versions = _versions_of(cls, fallback)
            except UnitrainError as error:
                devices = f"unavailable: {error}"
        print(line(row, devices, versions), flush=True)
    return 0


def _versions_of(cls: Any, fallback: dict[str, str]) -> str:
    """What ``versions()`` reports for backend class ``cls``, as ``package version, ...``.

    ``versions()`` is an instance method, and building an instance needs a model and may
    claim a device, so it is called on an instance made without ``__init__``: a backend
    whose ``versions()`` reads only modules (numpy's, JAX's, most third parties') is listed
    as it reports itself. One that reads state its constructor sets (torch's and
    TensorFlow's ask which device they run on) raises there, and ``fallback`` is shown
    instead: the framework's version, or the version of the distribution that registered
    the backend, from package metadata.
    """
    try:
        reported = cls.__new__(cls).versions()
        versions = {str(k): str(v) for k, v in dict(reported).items()}
    except Exception:  # any error of a method run without its constructor: use the fallback
        versions = fallback
    return ", ".join(f"{package} {version}" for package, version in versions.items()) or "-"


def _registered_versions() -> dict[str, dict[str, str]]:
    """``{backend name: {distribution: version}}`` for every backend an installed
    distribution registers in the ``unitrain.backends`` entry-point group."""
    import importlib.metadata

    from unitrain.backends.registry import ENTRY_POINT_GROUP

    found = {}
    for entry in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        if entry.dist is not None:
            found[entry.name] = {entry.dist.name: entry.dist.version}
    return found


def _inspect(args: argparse.Namespace) -> int:
    from unitrain.checkpoint import load_checkpoint

    path = Path(args.path)
    if path.is_dir() and not (path / "manifest.json").exists():
        return _inspect_folder(path)
    try:
        checkpoint = load_checkpoint(path)
    except CheckpointError as error:  # main prints it; names in it come from the checkpoint
        raise CheckpointError(_printable(str(error))) from None
    info = checkpoint.trainer
    summary = {
        key: info.get(key)
        for key in (
            "epoch",
            "step",
            "batch",
            "stop_training",
            "backend",
            "model",
            "optimizer",
            "schedule",
        )
    }
    for line in json.dumps(summary, indent=2, default=str).splitlines():
        print(_printable(line))
    split = _shards(path)
    for title, tensors in (("model", checkpoint.model), ("optimizer", checkpoint.optimizer)):
        print(f"{title}: {len(tensors)} tensors")
        for name, array in tensors.items():
            rows = split.get(title, {}).get(name, "")
            line = f"  {_printable(name):40s} {array.dtype!s:8s} {tuple(array.shape)!s:14s} {rows}"
            print(line.rstrip())
    history = info.get("history")
    if isinstance(history, list) and history:  # the checkpoint may not come from unitrain
        last = _printable(json.dumps(history[-1], default=str))
        print(f"history: {len(history)} epochs; last: {last}")
    return 0


def _shards(path: Path) -> dict[str, dict[str, str]]:
    """For a sharded checkpoint (already verified): prints its workers' files and returns,
    per kind and tensor, how many rows each worker's file holds ("rows 3|3|3|1")."""
    from unitrain.checkpoint._shards import ShardLayout

    if not (path / "shards.json").is_file():
        return {}
    layout = ShardLayout.parse((path / "shards.json").read_bytes(), path / "shards.json")
    print(f"shards: written by {layout.workers} workers, each to its own files")
    for name in layout.files:
        print(f"  {name:40s} {(path / name).stat().st_size:>12,d} bytes")
    return {
        kind: {
            name: "rows " + "|".join(str(stop - start) for start, stop in entry["rows"])
            for name, entry in entries.items()
        }
        for kind, entries in layout.tensors.items()
    }


def _inspect_folder(folder: Path) -> int:
    """List the checkpoints of a folder (or of a run's ``checkpoints``), verifying each."""
    from unitrain.checkpoint import list_checkpoints, load_checkpoint

    if (folder / "checkpoints").is_dir() and not list_checkpoints(folder):
        folder = folder / "checkpoints"
    found = list_checkpoints(folder)
    if not found:
        raise CheckpointError(
            f"{_printable(folder)}: neither a checkpoint nor a folder of checkpoints; pass a "
            "checkpoint directory (with manifest.json) or the folder holding them"
        )
    rows = [("checkpoint", "epoch", "step", "val_loss", "status")]
    for path in found:
        name = _printable(path.name)
        try:
            info = load_checkpoint(path).trainer
        except Exception as error:  # any failure (MemoryError too) marks this one, not the list
            reason = error if isinstance(error, CheckpointError) else repr(error)
            rows.append((name, "-", "-", "-", _printable(f"damaged: {reason}")))
            continue
        history = info.get("history")
        last = history[-1] if isinstance(history, list) and history else {}
        val_loss = last.get("val_loss") if isinstance(last, dict) else None
        shown = f"{val_loss:.4f}" if isinstance(val_loss, float) else "-"
        rows.append((name, str(info["epoch"]), str(info["step"]), shown, "ok"))
    print(f"{_printable(folder)}: {len(found)} checkpoints, oldest first")
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    for row in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths)) + "  " + row[4])
    return 0


def _printable(text: object) -> str:
    r"""``text`` with each non-printable character escaped as Python writes it (``\x1b``).

    What inspect prints comes from the checkpoint, and a hostile one could otherwise move the
    cursor, retitle or clear the terminal with escape sequences in a name.

    Examples:
        >>> print(_printable("w\x1b[2J\u202e"))
        w\x1b[2J\u202e
    """
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in str(text))


def _plot(args: argparse.Namespace) -> int:
    from unitrain.cli.plot import plot_runs

    run = Path(args.run)
    out = Path(args.out) if args.out else (run if run.is_dir() else run.parent) / "curves.png"
    print(f"plot: {plot_runs({run.name: run}, out, title=str(run))}")
    return 0


def _conformance(args: argparse.Namespace) -> int:
    from unitrain.backends.registry import default_backend_name
    from unitrain.conformance.cli import main as conformance_main

    if not args.list:
        quiet_framework_import(args.backend or default_backend_name())

    return conformance_main(args)


def _add_recipe_arguments(command: argparse.ArgumentParser, *, one_backend: bool) -> None:
    command.add_argument(
        "recipe",
        nargs="?" if one_backend else None,
        default="digits",
        help="a .py file with recipe(), a .toml recipe, or a built-in name (default: digits)",
    )
    if one_backend:
        command.add_argument(
            "--backend",
            help="torch, jax, tensorflow, numpy or pkg.module:Class "
            "(default: $UNITRAIN_BACKEND, else the first installed)",
        )
    command.add_argument("--device", choices=("cpu", "gpu", "auto"))
    command.add_argument(
        "--set",
        action="append",
        metavar="KEY=VALUE",
        help="change the recipe, e.g. config.epochs=3 or optimizer.momentum=0.8 (repeatable)",
    )
    command.add_argument("--epochs", type=int, help="the same as --set config.epochs=N")
    command.add_argument("--seed", type=int, help="the same as --set config.seed=N")
    command.add_argument("--out", help="output folder (default: runs/<recipe name>)")
    # A TOML recipe and --set are data; these two let such data run code or write elsewhere.
    command.add_argument(
        "--allow-imports",
        action="store_true",
        help="let a TOML recipe or --set name any class as pkg.module:Class, which imports and "
        "runs it (only for recipes you trust; a .py recipe is code and needs no flag)",
    )
    command.add_argument(
        "--allow-absolute-paths",
        action="store_true",
        help="let a TOML recipe or --set point loggers and checkpoints outside the run folder "
        "(absolute paths or '..')",
    )


def _parser() -> argparse.ArgumentParser:
    from unitrain.cli._train import compare, train

    parser = argparse.ArgumentParser(
        prog="unitrain", description=plain_text(__doc__).splitlines()[0]
    )
    commands = parser.add_subparsers(dest="command", required=True)
    training = commands.add_parser("train", help="train a recipe (default: the digits MLP)")
    _add_recipe_arguments(training, one_backend=True)
    training.add_argument(
        "--resume",
        help="'auto' (the newest checkpoint of --out if there is one, else start), 'latest' or "
        "a checkpoint path",
    )
    training.add_argument(
        "--archive-existing",
        action="store_true",
        help="start a new run even if --out holds an earlier run's checkpoints, moving them "
        "into its checkpoints/archive/",
    )
    training.add_argument("--quiet", action="store_true", help="no progress bar")
    training.add_argument(
        "--workers",
        type=int,
        default=1,
        help="data-parallel workers on this machine, started by the engine's own launcher",
    )
    training.add_argument(
        "--shard",
        action="store_true",
        help="split parameters, gradients and optimizer state over the --workers (torch: "
        "FSDP2) instead of giving each worker the whole model",
    )
    training.set_defaults(handler=train)
    comparing = commands.add_parser(
        "compare", help="train a recipe on several backends and show the differences"
    )
    _add_recipe_arguments(comparing, one_backend=False)
    comparing.add_argument(
        "--backends", default="numpy,torch,jax,tensorflow", help="comma-separated names"
    )
    comparing.set_defaults(handler=compare)
    plot = commands.add_parser("plot", help="draw a run's loss, metrics and LR into a PNG")
    plot.add_argument("run", help="a folder written by 'unitrain train' (or its metrics.jsonl)")
    plot.add_argument("--out", help="the PNG to write (default: RUN/curves.png)")
    plot.set_defaults(handler=_plot)
    backends = commands.add_parser("backends", help="list backends, versions and devices")
    backends.set_defaults(handler=_backends)
    inspect = commands.add_parser("inspect", help="print a checkpoint, or list a folder's")
    inspect.add_argument("path")
    inspect.set_defaults(handler=_inspect)
    add_export_command(commands)
    add_predict_command(commands)
    conformance = commands.add_parser("conformance", help="certify a backend with the kit")
    from unitrain.conformance.cli import add_arguments  # argparse only; imports no framework

    add_arguments(conformance)
    conformance.set_defaults(handler=_conformance)
    return parser


def _one_line_warning(message: Any, category: type[Warning], *_: Any, **__: Any) -> str:
    return f"unitrain: warning: {message}\n"


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``unitrain`` command; returns the exit status."""
    # As the program itself, a signal after the command's work is ignored (see
    # stopping_at_once); called in-process (tests), the old handlers are put back.
    as_program, argv = argv is None, list(sys.argv[1:] if argv is None else argv)
    args = _parser().parse_args(argv)
    args.argv = argv
    previous = warnings.formatwarning
    warnings.formatwarning = _one_line_warning  # no source line echoed under the message
    # A launched worker keeps the default action outside fit: one that waits for a peer in
    # the engine's rendezvous (a blocking C call, where no Python handler runs) must still
    # end at once on SIGTERM; its launcher says what happened. The harness saw a worker
    # wait there for the launcher's 30 s kill.
    training = args.command == "train" and not launched_worker()
    try:
        with stopping_at_once(then_ignore=as_program) if training else contextlib.nullcontext():
            return int(args.handler(args))
    except Preempted:  # a line saying what was saved is printed already
        return PREEMPTION_EXIT_STATUS
    except UnitrainError as error:
        print(f"unitrain: error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # outside training (building, evaluating): nothing to resume
        print("unitrain: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # the reader left (| head): stop quietly, as cat does
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # so the flush at exit cannot fail again
        return 141
    finally:
        warnings.formatwarning = previous
