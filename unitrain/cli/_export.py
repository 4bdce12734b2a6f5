"""``unitrain export CHECKPOINT --format onnx|torch|keras|jax``: a checkpoint's model as a
file for inference (ONNX, or each framework's own format: see :mod:`unitrain.native_export`)."""

from __future__ import annotations

import argparse
from pathlib import Path

from unitrain._errors import ConfigError

__all__ = ["add_export_command"]

#: What ``--format`` accepts: ONNX (written from the portable description alone) and the
#: native exports, each in its framework's own file format.
FORMATS = ("onnx", "torch", "keras", "jax")
#: Each format's file suffix.
SUFFIXES = {"onnx": ".onnx", "torch": ".pt2", "keras": ".keras", "jax": ".jax"}


def _shape(text: str) -> tuple[int, ...]:
    """``"8,8,1"`` as ``(8, 8, 1)``."""
    try:
        shape = tuple(int(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected positive ints separated by commas, e.g. 28,28,1; got {text!r}"
        ) from None
    if not shape or min(shape) < 1:
        raise argparse.ArgumentTypeError(f"every size must be a positive int, got {text!r}")
    return shape


def _export_native(checkpoint: Path, args: argparse.Namespace, out: Path) -> list[Path]:
    from unitrain.export import portable_weights
    from unitrain.native_export import export_native
    from unitrain.native_export._files import save_native
    from unitrain.onnx_export import example_shape

    if args.opset is not None:
        raise ConfigError(f"--opset is for --format onnx, not {args.format}; leave it out")
    model, _ = portable_weights(checkpoint)
    shape = example_shape(model, args.input_shape, "unitrain export")
    native = export_native(checkpoint, args.format, input_shape=shape)
    return save_native(model, native, args.format, shape, out)


def _export(args: argparse.Namespace) -> int:
    checkpoint = Path(args.checkpoint)
    if not checkpoint.is_dir():
        raise ConfigError(f"{checkpoint}: not a checkpoint directory (one with manifest.json)")
    suffix = SUFFIXES[args.format]
    out = Path(args.out) if args.out else Path(f"{checkpoint.resolve().name}{suffix}")
    if args.format == "onnx":
        from unitrain.onnx_export import export_onnx

        options = {} if args.opset is None else {"opset": args.opset}
        written = [export_onnx(checkpoint, out, input_shape=args.input_shape, **options)]
    else:
        if out.suffix != suffix:
            raise ConfigError(f"--format {args.format} writes a {suffix} file; got --out {out}")
        written = _export_native(checkpoint, args, out)
    for path in written:
        print(f"export: {path}")
    return 0


def add_export_command(commands: argparse._SubParsersAction) -> None:
    """Add the ``export`` command to the ``unitrain`` parser's ``commands``."""
    export = commands.add_parser(
        "export", help="write a checkpoint's model as an ONNX, torch, Keras or JAX file"
    )
    export.add_argument("checkpoint", help="a checkpoint directory (with manifest.json)")
    export.add_argument("--format", choices=FORMATS, default="onnx", help="(default: onnx)")
    export.add_argument(
        "--out",
        help="the file to write (default: ./<checkpoint name> with .onnx, .pt2, .keras or .jax)",
    )
    export.add_argument(
        "--input-shape",
        type=_shape,
        help="one example's shape, e.g. 8,8,1; needed unless the model starts with a dense layer",
    )
    export.add_argument(
        "--opset", type=int, help="the ONNX opset, 18 to 21 (default: export_onnx's, 18)"
    )
    export.set_defaults(handler=_export)
