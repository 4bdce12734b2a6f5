"""``unitrain`` on the command line: train the default recipe, list backends, inspect files."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from unitrain._errors import ConfigError, UnitrainError

__all__ = ["main"]


def _train(args: argparse.Namespace) -> int:
    from unitrain.recipes import default_trainer
    from unitrain.registry import default_backend_name, get_backend

    backend = args.backend or default_backend_name()
    strategy = None
    if args.workers < 1:
        raise ConfigError(f"--workers must be at least 1, got {args.workers}")
    if args.workers > 1:
        args.backend = backend
        cls: Any = get_backend(backend)
        if cls.capabilities.data_parallel:
            return _launch(cls.launch_command(args.workers), args)
        strategy = args.workers
        if backend != "numpy":
            raise ConfigError(
                f"--workers {args.workers}: the {backend} backend has no data-parallel engine "
                "yet; use --backend torch, or numpy (which simulates the workers in one process)"
            )
    trainer, train, val = default_trainer(
        backend=backend,
        device=args.device,
        epochs=args.epochs,
        seed=args.seed,
        out=args.out,
        strategy=strategy,
    )
    say = print if trainer.strategy.is_main else lambda *_: None
    where = f"{trainer.backend.device}, {trainer.strategy.world_size} worker(s)"
    say(f"unitrain: training the digits MLP on {backend} ({where})")
    history = trainer.fit(train, val, resume=args.resume)
    final = trainer.validate(val)  # on every worker: its metrics are summed over them
    if not trainer.strategy.is_main:
        return 0
    for row in history:
        shown = ", ".join(
            f"{k}={row[k]:.4f}" for k in ("loss", "val_loss", "val_accuracy") if k in row
        )
        print(f"epoch {row['epoch'] + 1}: {shown}")
    print(f"final val_accuracy={final['val_accuracy']:.4f} val_loss={final['val_loss']:.4f}")
    if args.out:
        print(
            f"metrics: {Path(args.out) / 'metrics.jsonl'}; "
            f"checkpoints: {Path(args.out) / 'checkpoints'}"
        )
    return 0


def _launch(launcher: list[str], args: argparse.Namespace) -> int:
    """Start ``args.workers`` workers of this same command through the engine's launcher."""
    import subprocess

    command = [*launcher, "-m", "unitrain.cli", "train", "--backend", args.backend]
    command += ["--device", args.device, "--epochs", str(args.epochs), "--seed", str(args.seed)]
    command += ["--out", args.out] + (["--resume", args.resume] if args.resume else [])
    done = subprocess.run(command, check=False)
    if done.returncode != 0:
        print(
            f"unitrain: error: a worker failed (exit {done.returncode}; the launcher's report "
            f"above names it); run again with --resume latest to continue from the newest "
            "valid checkpoint",
            file=sys.stderr,
        )
    return done.returncode


def _backends(args: argparse.Namespace) -> int:
    from unitrain.registry import get_backend, list_backends

    def devices_of(name: str) -> str:
        cls: Any = get_backend(name)
        found = cls.available_devices() if hasattr(cls, "available_devices") else None
        return ", ".join(found or cls.capabilities.devices)

    rows = []
    for info in list_backends():
        devices = "-"
        if info.installed:
            try:
                devices = devices_of(info.name)
            except UnitrainError as error:
                devices = f"unavailable: {error}"
        rows.append(
            (
                info.name,
                info.framework_version or "-",
                "yes" if info.installed else "no",
                devices,
                info.target,
            )
        )
    header = ("backend", "version", "installed", "devices", "target")
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    for row in [header, *rows]:
        print("  ".join(str(cell).ljust(width) for cell, width in zip(row, widths)).rstrip())
    return 0


def _inspect(args: argparse.Namespace) -> int:
    from unitrain.checkpoint import load_checkpoint

    checkpoint = load_checkpoint(args.path)
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
    print(json.dumps(summary, indent=2, default=str))
    for title, tensors in (("model", checkpoint.model), ("optimizer", checkpoint.optimizer)):
        print(f"{title}: {len(tensors)} tensors")
        for name, array in tensors.items():
            print(f"  {name:40s} {array.dtype!s:8s} {tuple(array.shape)}")
    history = info.get("history")
    if isinstance(history, list) and history:  # the checkpoint may not come from unitrain
        print(f"history: {len(history)} epochs; last: {json.dumps(history[-1], default=str)}")
    return 0


def _conformance(args: argparse.Namespace) -> int:
    from unitrain.conformance.cli import main as conformance_main

    return conformance_main(args)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="unitrain", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    train = commands.add_parser("train", help="train the default recipe (digits MLP)")
    train.add_argument(
        "--backend",
        help="torch, jax, tensorflow, numpy or pkg.module:Class "
        "(default: $UNITRAIN_BACKEND, else the first installed)",
    )
    train.add_argument("--device", default="auto", choices=("cpu", "gpu", "auto"))
    train.add_argument("--epochs", type=int, default=10)
    train.add_argument("--seed", type=int, default=0)
    train.add_argument("--out", default="runs/digits", help="output directory")
    train.add_argument("--resume", help="'latest' or a checkpoint path")
    train.add_argument(
        "--workers",
        type=int,
        default=1,
        help="data-parallel workers on this machine, started by the engine's own launcher",
    )
    train.set_defaults(run=_train)
    backends = commands.add_parser("backends", help="list backends, versions and devices")
    backends.set_defaults(run=_backends)
    inspect = commands.add_parser("inspect", help="print a checkpoint's contents")
    inspect.add_argument("path")
    inspect.set_defaults(run=_inspect)
    conformance = commands.add_parser("conformance", help="certify a backend with the kit")
    from unitrain.conformance.cli import add_arguments  # argparse only; imports no framework

    add_arguments(conformance)
    conformance.set_defaults(run=_conformance)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``unitrain`` command; returns the exit status."""
    args = _parser().parse_args(argv)
    try:
        return int(args.run(args))
    except UnitrainError as error:
        print(f"unitrain: error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
