"""``unitrain predict CHECKPOINT --input X.npy``: a trained model's outputs for new inputs.

The model is the checkpoint's portable description with its weights, built on any installed
backend (by default the one that wrote it, when installed), so a model trained on one
framework predicts on another. The inputs are read with ``numpy.load(allow_pickle=False)``:
a pickled array would run code, and data must not.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import numpy as np

from unitrain._errors import ConfigError, DataError

__all__ = ["add_predict_command"]


def _inputs(path: Path) -> np.ndarray:
    if path.suffix != ".npy":
        raise ConfigError(f"--input {path}: give a .npy file (numpy.save writes one)")
    try:
        return np.load(path, allow_pickle=False)
    except FileNotFoundError:
        raise ConfigError(f"--input {path}: no such file") from None
    except ValueError as error:  # a pickled array, or not a .npy file at all
        raise DataError(
            f"--input {path}: not a plain numpy array file ({error}); save the inputs with "
            "numpy.save from a numeric array"
        ) from None


def _backend_of(checkpoint: Any, asked: str | None) -> str:
    """The backend asked for; else the one that wrote the checkpoint, when installed; else
    the default one."""
    from unitrain.backends.registry import default_backend_name, list_backends

    if asked:
        return asked
    wrote = checkpoint.trainer.get("backend")
    name = wrote.get("name") if isinstance(wrote, dict) else None
    installed = {info.name for info in list_backends() if info.installed}
    return name if isinstance(name, str) and name in installed else default_backend_name()


def _predict(args: argparse.Namespace) -> int:
    from unitrain import Trainer, TrainerConfig
    from unitrain.checkpoint import load_checkpoint
    from unitrain.cli._train import quiet_framework_import
    from unitrain.export import portable_weights

    path = Path(args.checkpoint)
    model, _ = portable_weights(path)  # checks the model is portable and its tensors fit
    checkpoint = load_checkpoint(path)
    inputs = _inputs(Path(args.input))
    if args.batch_size < 1:
        raise ConfigError(f"--batch-size must be a positive int, got {args.batch_size}")
    config = checkpoint.trainer.get("config")
    dtype = config.get("dtype", "float32") if isinstance(config, dict) else "float32"
    backend = _backend_of(checkpoint, args.backend)
    quiet_framework_import(backend)
    settings: dict[str, Any] = {"dtype": dtype, "batch_size": args.batch_size}
    if args.device:
        settings["device"] = args.device
    trainer = Trainer(model, backend=backend, config=TrainerConfig(**settings))
    trainer.load_weights(path)
    outputs = trainer.predict(inputs)
    source = Path(args.input)
    out = Path(args.output) if args.output else source.with_name(f"{source.stem}.out.npy")
    np.save(out, outputs, allow_pickle=False)
    print(
        f"predict: {len(outputs)} outputs of shape {outputs.shape[1:]} on {backend} "
        f"({trainer.backend.device}) -> {out}"
    )
    return 0


def add_predict_command(commands: argparse._SubParsersAction) -> None:
    """Add the ``predict`` command to the ``unitrain`` parser's ``commands``."""
    predict = commands.add_parser("predict", help="a checkpoint's model's outputs for inputs")
    predict.add_argument("checkpoint", help="a checkpoint directory (with manifest.json)")
    predict.add_argument("--input", required=True, help="the inputs, a .npy file")
    predict.add_argument("--output", help="the .npy file to write (default: INPUT.out.npy)")
    predict.add_argument("--backend", help="the backend (default: the one that trained it)")
    predict.add_argument("--device", choices=("cpu", "gpu", "auto"))
    predict.add_argument("--batch-size", type=int, default=256, help="(default: 256)")
    predict.set_defaults(handler=_predict)
