"""``unitrain export CHECKPOINT --format onnx``: a checkpoint's model as a file for inference."""

from __future__ import annotations

import argparse
from pathlib import Path

from unitrain._errors import ConfigError

__all__ = ["add_export_command"]

#: What ``--format`` accepts: the formats written from the portable description alone.
FORMATS = ("onnx",)


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


def _export(args: argparse.Namespace) -> int:
    from unitrain.onnx_export import export_onnx

    checkpoint = Path(args.checkpoint)
    if not checkpoint.is_dir():
        raise ConfigError(f"{checkpoint}: not a checkpoint directory (one with manifest.json)")
    out = Path(args.out) if args.out else Path(f"{checkpoint.resolve().name}.onnx")
    options = {} if args.opset is None else {"opset": args.opset}
    written = export_onnx(checkpoint, out, input_shape=args.input_shape, **options)
    print(f"export: {written}")
    return 0


def add_export_command(commands: argparse._SubParsersAction) -> None:
    """Add the ``export`` command to the ``unitrain`` parser's ``commands``."""
    export = commands.add_parser("export", help="write a checkpoint's model as an ONNX file")
    export.add_argument("checkpoint", help="a checkpoint directory (with manifest.json)")
    export.add_argument("--format", choices=FORMATS, default="onnx", help="(default: onnx)")
    export.add_argument("--out", help="the file to write (default: ./<checkpoint name>.onnx)")
    export.add_argument(
        "--input-shape",
        type=_shape,
        help="one example's shape, e.g. 8,8,1; needed unless the model starts with a dense layer",
    )
    export.add_argument(
        "--opset", type=int, help="the ONNX opset, 18 to 21 (default: export_onnx's, 18)"
    )
    export.set_defaults(handler=_export)
