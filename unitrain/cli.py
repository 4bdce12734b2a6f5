"""``unitrain`` on the command line: train the default recipe, list backends, inspect files."""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from unitrain._errors import UnitrainError

__all__ = ["main"]


def _train(args: argparse.Namespace) -> int:
    from unitrain.recipes import default_trainer
    from unitrain.registry import default_backend_name

    backend = args.backend or default_backend_name()
    trainer, train, val = default_trainer(
        backend=backend, device=args.device, epochs=args.epochs, seed=args.seed, out=args.out
    )
    print(f"unitrain: training the digits MLP on {backend} ({trainer.backend.device})")
    try:
        history = trainer.fit(train, val, resume=args.resume)
    except KeyboardInterrupt:
        # fit has already waited for the save in flight, so the newest checkpoint is durable.
        print(_interrupted_line(trainer.config.checkpoint_dir, args.argv), file=sys.stderr)
        return 130
    for row in history:
        shown = ", ".join(
            f"{k}={row[k]:.4f}" for k in ("loss", "val_loss", "val_accuracy") if k in row
        )
        print(f"epoch {row['epoch']}: {shown}")
    final = trainer.validate(val)
    print(f"final val_accuracy={final['val_accuracy']:.4f} val_loss={final['val_loss']:.4f}")
    if args.out:
        print(
            f"metrics: {Path(args.out) / 'metrics.jsonl'}; "
            f"checkpoints: {Path(args.out) / 'checkpoints'}"
        )
    return 0


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
    again = [a for a in again if not a.startswith("--resume=")]
    command = shlex.join(["unitrain", *again, "--resume", "latest"])
    return f"unitrain: interrupted; last checkpoint {checkpoints[-1]}; resume with: {command}"


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
    argv = list(sys.argv[1:] if argv is None else argv)
    args = _parser().parse_args(argv)
    args.argv = argv
    try:
        return int(args.run(args))
    except UnitrainError as error:
        print(f"unitrain: error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # outside training (building, evaluating): nothing to resume
        print("unitrain: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
