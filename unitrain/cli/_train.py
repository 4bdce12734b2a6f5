"""``unitrain train`` and ``unitrain compare``: run a recipe, or one recipe on several backends."""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from unitrain._errors import ConfigError, MissingFrameworkError
from unitrain.backends.sharded import SHARD_ENV
from unitrain.cli._launch import die_with_parent, forwarding_signals, launched_worker
from unitrain.training._preemption import PREEMPTION_EXIT_STATUS

__all__ = ["compare", "quiet_framework_import", "train"]

#: Metrics the comparison table shows first, when a run logs them.
_FIRST = ("loss", "val_loss", "val_accuracy")
_NOT_COMPARED = ("epoch", "step", "seconds", "skipped_steps", "run_id")
#: Printed under the comparison table, so that its last two columns need no guessing.
_LEGEND = (
    "abs diff: the largest value minus the smallest; rel diff: abs diff / the largest magnitude"
)


def quiet_framework_import(backend: str) -> None:
    """Import TensorFlow with its start-up log lines hidden (shown only if the import fails).

    TensorFlow prints its oneDNN notice from C++ before its logging is set up (so
    ``TF_CPP_MIN_LOG_LEVEL`` cannot hide it) and once per native library, hence twice; only
    redirecting the process's stderr while importing silences it. Set
    ``UNITRAIN_FRAMEWORK_LOGS=1`` to see everything.
    """
    if backend != "tensorflow" or "tensorflow" in sys.modules:
        return
    if os.environ.get("UNITRAIN_FRAMEWORK_LOGS"):
        return
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # the messages after start-up
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as sink:
        os.dup2(sink.fileno(), 2)
        try:
            importlib.import_module("tensorflow")
        except ImportError:
            pass  # the backend registry says what to install; show what TF printed
        else:
            return
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        sink.seek(0)
        sys.stderr.write(sink.read().decode(errors="replace"))


def _recipe(args: argparse.Namespace) -> Any:
    from unitrain.recipes import load_recipe

    assignments = list(args.set or [])
    if args.epochs is not None:
        assignments.insert(0, f"config.epochs={args.epochs}")
    if args.seed is not None:
        assignments.insert(0, f"config.seed={args.seed}")
    return load_recipe(
        args.recipe,
        assignments,
        allow_imports=args.allow_imports,
        allow_absolute_paths=args.allow_absolute_paths,
    )


def train(args: argparse.Namespace) -> int:
    """Train a recipe, streaming one line per epoch; return the exit status."""
    from unitrain import callbacks as cb
    from unitrain.backends.registry import default_backend_name

    recipe = _recipe(args)
    backend = args.backend or default_backend_name()
    if args.shard and args.workers < 2 and not launched_worker():
        raise ConfigError(
            f"--shard splits the model over several workers; add --workers N (N >= 2), got "
            f"--workers {args.workers}"
        )
    if args.workers != 1:
        return _launch_workers(backend, args)
    quiet_framework_import(backend)
    out = Path(args.out or Path("runs") / recipe.name)
    loggers: list[Any] = [cb.ConsoleLogger(), cb.JSONLLogger(out / "metrics.jsonl")]
    with contextlib.suppress(MissingFrameworkError):  # TensorBoard files: a bonus, not a need
        loggers.append(cb.TensorBoardLogger(out / "tensorboard"))
    if not args.quiet:
        loggers.append(cb.ProgressBar(leave=False))  # on a terminal only; epoch lines stay
    loggers.append(cb.ModelCheckpoint(every_n_epochs=1, keep_last=3))
    # A recipe's own logger or checkpointing wins over the command line's of the same kind.
    loggers = [c for c in loggers if not any(type(r) is type(c) for r in recipe.callbacks)]
    settings: dict[str, Any] = {"checkpoint_dir": str(out / "checkpoints")}
    if args.device:
        settings["device"] = args.device
    trainer = recipe.build(backend, callbacks=loggers, run_dir=out, **settings)
    if launched_worker():  # never train on (holding the lock) once the launcher is gone
        die_with_parent()
    train_data, val_data = recipe.load_data()
    say: Any = print if trainer.strategy.is_main else lambda *_, **__: None  # rank 0 speaks
    limit = trainer.config.max_steps
    say(
        f"unitrain: training {recipe.name} on {backend} ({trainer.backend.device}), "
        f"{trainer.config.epochs} epochs{'' if limit is None else f' or {limit} steps'}, "
        f"into {out}",
        flush=True,
    )
    try:
        trainer.fit(
            train_data, val_data, resume=args.resume, archive_existing=args.archive_existing
        )
    except KeyboardInterrupt:
        # fit has already waited for the save in flight, so the newest checkpoint is durable.
        say(_interrupted_line(trainer.config.checkpoint_dir, args.argv), file=sys.stderr)
        return 130
    say(_stop_line(trainer), flush=True)
    if val_data is not None:
        final = trainer.validate(val_data)  # on every worker: its sums are over all of them
        say("final " + " ".join(f"{k}={v:.4f}" for k, v in final.items()), flush=True)
    shown = f"metrics: {out / 'metrics.jsonl'}; checkpoints: {out / 'checkpoints'}"
    if (out / "tensorboard").is_dir():
        shown += f"; tensorboard: {out / 'tensorboard'}"
    say(shown)
    return 0


def _stop_line(trainer: Any) -> str:
    """Why training ended: early stopping, a non-finite loss, max_steps, or all epochs done."""
    done, planned = trainer.state.epoch, trainer.config.epochs
    if trainer.stop_reason is not None:
        return f"stopped after epoch {done} of {planned}: {trainer.stop_reason}"
    if trainer.config.max_steps is not None and trainer.state.step >= trainer.config.max_steps:
        return f"done: max_steps={trainer.config.max_steps} reached in epoch {trainer.epoch_number}"
    if trainer.state.stop_training:
        return f"stopped after epoch {done} of {planned}: the resumed run had stopped there"
    return f"done: {done} of {planned} epochs"


def _interrupted_line(checkpoint_dir: str | None, argv: Sequence[str]) -> str:
    """The one line printed on Ctrl-C: where training stopped and how to go on from there."""
    from unitrain.checkpoint import list_checkpoints

    checkpoints = list_checkpoints(checkpoint_dir) if checkpoint_dir else []
    if not checkpoints:
        return "unitrain: interrupted before the first checkpoint; run the command again to start"
    again = list(argv)
    if "--resume" in again:  # drop the old request: the run goes on from the newest one now
        index = again.index("--resume")
        del again[index : index + 2]
    again = [a for a in again if not a.startswith("--resume=") and a != "--archive-existing"]
    command = shlex.join(["unitrain", *again, "--resume", "auto"])
    return f"unitrain: interrupted; last checkpoint {checkpoints[-1]}; resume with: {command}"


def _launch_workers(backend: str, args: argparse.Namespace) -> int:
    """Run this same command on ``args.workers`` workers through the engine's launcher."""
    from unitrain.backends.registry import get_backend

    cls: Any = get_backend(backend)
    if args.workers < 1 or not cls.capabilities.data_parallel:
        raise ConfigError(
            f"--workers {args.workers}: needs a number >= 1 and a backend with a data-parallel "
            f"engine (torch, jax, tensorflow); {backend} declares none"
        )
    again = list(args.argv)
    for index, part in enumerate(again):
        if part == "--workers":
            del again[index : index + 2]
            break
    again = [a for a in again if not a.startswith("--workers=")]
    command = [*cls.launch_command(args.workers), "-m", "unitrain.cli", *again]
    command += [] if args.backend else ["--backend", backend]
    if args.shard:  # the workers' Trainer asks their backend for its sharded engine
        os.environ[SHARD_ENV] = "1"
    with forwarding_signals() as forward:
        returncode = forward.run(command)
    if forward.received is not None:  # the workers saved and exited, or were stopped
        print(
            f"unitrain: {forward.received}: passed on to the {args.workers} workers, which "
            f"have stopped (launcher exit {returncode}); continue with --resume auto",
            file=sys.stderr,
        )
        return PREEMPTION_EXIT_STATUS
    if returncode != 0:
        print(
            f"unitrain: error: a worker failed (exit {returncode}; the launcher's report "
            "above names it); run again with --resume auto to continue from the newest "
            "valid checkpoint",
            file=sys.stderr,
        )
    return returncode


def compare(args: argparse.Namespace) -> int:
    """Train one recipe on several backends, each in its own process; print and plot."""
    from unitrain.cli.plot import plot_runs, read_metrics

    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    if len(backends) < 2:
        raise ConfigError(f"--backends needs two or more names, got {args.backends!r}")
    recipe = _recipe(args)
    if recipe.config.random == "native" and (dropout := _dropout_in(recipe.model)):
        warnings.warn(
            f"the model drops values ({dropout}) with random='native': each backend draws "
            "its own dropout masks, so the backends' runs differ by more than rounding and "
            "their differences below are expected (the default, random='portable', draws the "
            "same masks on every backend)",
            stacklevel=1,
        )
    out = Path(args.out or Path("runs") / f"compare-{recipe.name}")
    passed = [f"--set={assignment}" for assignment in args.set or []]
    if args.epochs is not None:
        passed.append(f"--set=config.epochs={args.epochs}")
    if args.seed is not None:
        passed.append(f"--set=config.seed={args.seed}")
    # Each child reads the recipe again, so it needs the same permission the parent was given.
    passed += ["--allow-imports"] if args.allow_imports else []
    passed += ["--allow-absolute-paths"] if args.allow_absolute_paths else []
    for backend in backends:
        folder = out / backend
        if (folder / "metrics.jsonl").exists():
            shutil.rmtree(folder)  # an earlier comparison's run: start clean, not resumed
        command = [sys.executable, "-m", "unitrain.cli", "train", args.recipe, "--quiet"]
        command += ["--backend", backend, "--out", str(folder), *passed]
        if args.device:
            command += ["--device", args.device]
        started = time.perf_counter()
        print(f"{backend}: training ...", end=" ", flush=True)
        result = subprocess.run(command, capture_output=True, text=True)
        if result.returncode != 0:
            print("failed")
            sys.stderr.write(result.stdout[-2000:] + result.stderr[-4000:])
            return result.returncode
        print(f"done in {time.perf_counter() - started:.1f}s", flush=True)
    runs = {backend: read_metrics(out / backend) for backend in backends}
    print(_table(runs))
    picture = plot_runs(
        {b: out / b for b in backends}, out / "compare.png", title=f"{recipe.name}: backends"
    )
    print(f"plot: {picture}")
    return 0


def _dropout_in(model: Any) -> str:
    """The model's dropout settings above 0 (``"dropout=0.2"``), or ``""``.

    Read from the model's description, so a native model (one without ``to_dict``) says
    nothing: its layers are the framework's.
    """
    try:
        described = model.to_dict()
    except (AttributeError, ConfigError):
        return ""
    found: list[str] = []

    def visit(item: Any) -> None:
        if isinstance(item, dict):
            if item.get("type") == "dropout" and item.get("p", 0.5):  # the Dropout layer
                found.append(f"dropout p={item.get('p', 0.5)}")
            for key, value in item.items():
                if "dropout" in str(key) and isinstance(value, (int, float)) and value > 0:
                    found.append(f"{key}={value}")
                visit(value)
        elif isinstance(item, (list, tuple)):
            for value in item:
                visit(value)

    visit(described)
    return ", ".join(dict.fromkeys(found))  # each setting once, in the order met


def _table(runs: dict[str, list[dict[str, Any]]]) -> str:
    """Per epoch and metric: each backend's value and the largest difference between them,
    absolute and relative (a perplexity of 1e14 makes any absolute difference look large)."""
    names = list(runs)
    keys: list[str] = []
    for rows in runs.values():
        for row in rows:
            keys += [k for k in row if k not in keys and k not in _NOT_COMPARED]
    keys = [k for k in _FIRST if k in keys] + [k for k in keys if k not in _FIRST]
    header = ["epoch", "metric", *names, "abs diff", "rel diff"]
    lines = [header]
    epochs = max(len(rows) for rows in runs.values())
    for index in range(epochs):
        for key in keys:
            values = [rows[index].get(key) if index < len(rows) else None for rows in runs.values()]
            present = [v for v in values if isinstance(v, (int, float))]
            if not present:
                continue
            if len(present) == len(values):
                spread = max(present) - min(present)
                largest = max(abs(v) for v in present)
                differences = [f"{spread:.2e}", f"{spread / largest if largest else 0.0:.2e}"]
            else:
                differences = ["-", "-"]
            lines.append(
                [
                    str(index + 1) if key == keys[0] else "",
                    key,
                    *("-" if v is None else f"{v:.6g}" for v in values),
                    *differences,
                ]
            )
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    table = [
        "  ".join(cell.ljust(width) for cell, width in zip(line, widths)).rstrip() for line in lines
    ]
    return "\n".join([*table, _LEGEND])
