"""ONNX files written from the portable description and its canonical weights.

No framework is involved: each built-in layer type has a converter (one module per family:
``_dense``, ``_image``, ``_norm``, ``_sequence``, ``_recurrent``) that writes its eval-mode
computation as ONNX nodes with the ``onnx`` package, so a model trained on any backend gives
the same file. A layer type without a converter (a layer of your own written in
:mod:`unitrain.ops`) is exported op by op (``_traced``); an op without an ONNX mapping is
refused, naming the op and the layer.

The graph's input is ``input``, ``(batch, *example shape)`` float32 (int64 token ids for a
model that starts with an Embedding), with a free batch axis; its output is ``output``.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from unitrain._errors import ConfigError, MissingFrameworkError
from unitrain.models import MLP, AbstractLayer, Linear, Shape
from unitrain.onnx_export import _dense, _image, _norm, _recurrent, _sequence
from unitrain.onnx_export._graph import Converter, Graph, Value
from unitrain.onnx_export._traced import convert_by_ops

__all__ = ["CONVERTERS", "OPSET", "OPSETS", "example_shape", "export_onnx", "onnx_model"]

#: The ONNX opset written by default: 18 has every operator used here (LayerNormalization
#: since 17, ReduceMean with axes as an input since 18) and onnxruntime runs it everywhere.
OPSET = 18
#: The opsets a caller may ask for; the graph is the same in each.
OPSETS = (18, 19, 20, 21)

#: How each built-in layer type becomes ONNX nodes.
CONVERTERS: dict[type, Converter] = {
    **_dense.CONVERTERS,
    **_image.CONVERTERS,
    **_norm.CONVERTERS,
    **_sequence.CONVERTERS,
    **_recurrent.CONVERTERS,
}


def example_shape(
    model: AbstractLayer, input_shape: Sequence[int] | None, caller: str = "export_onnx"
) -> Shape:
    """The shape of one input example: given, or read from a model that starts with a
    dense layer (any other model needs it given: an image's size is not in the model).
    The native exports that need a fixed input (a Keras model, a serialized program) ask
    for it the same way."""
    if input_shape is not None:
        shape = tuple(int(n) for n in input_shape)
        model.output_shape(shape)  # DataError naming the layer if the model cannot read it
        return shape
    first = model
    while first.children() and not isinstance(first, MLP):
        first = first.children()[0][1]
    if isinstance(first, MLP):
        return (first.in_features,)
    if isinstance(first, Linear):
        return (first.in_features,)
    raise ConfigError(
        f"{caller}: the input shape of {model.describe()} is not in the model (it starts "
        f"with {type(first).__name__}); pass input_shape= the shape of one example, e.g. "
        "(28, 28, 1) for images or (128,) for sequences of 128 token ids"
    )


def onnx_model(
    model: AbstractLayer,
    weights: dict[str, np.ndarray],
    *,
    input_shape: Sequence[int] | None = None,
    opset: int = OPSET,
) -> Any:
    """The ``onnx.ModelProto`` of ``model`` in eval mode with ``weights`` (canonical names).

    Raises:
        ConfigError: a layer type has no ONNX mapping, the opset is not one of
            :data:`OPSETS`, or the input shape is needed and not given.
        MissingFrameworkError: the ``onnx`` package is not installed.
    """
    if opset not in OPSETS:
        raise ConfigError(f"export_onnx: opset must be one of {OPSETS}, got {opset=}")
    try:
        from onnx import TensorProto, helper, numpy_helper
    except ImportError as error:
        raise MissingFrameworkError(
            "export_onnx needs the onnx package: pip install 'unitrain[onnx]'"
        ) from error
    shape = example_shape(model, input_shape)
    graph = Graph(weights, CONVERTERS, convert_by_ops)
    tokens = model.input_kind == "tokens"
    out = graph.channels_last(graph.layer(model, "", Value("input", shape)), "")
    graph.nodes.append(helper.make_node("Identity", [out.name], ["output"], "output"))
    initializers = [
        numpy_helper.from_array(graph.initializers[name], name)
        for name in sorted(graph.initializers)
    ]
    proto = helper.make_graph(
        graph.nodes,
        "unitrain",
        [
            helper.make_tensor_value_info(
                "input", TensorProto.INT64 if tokens else TensorProto.FLOAT, ["batch", *shape]
            )
        ],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, ["batch", *out.shape])],
        initializers,
    )
    from unitrain import __version__

    onnx_file = helper.make_model(
        proto,
        opset_imports=[helper.make_opsetid("", opset)],
        producer_name="unitrain",
        producer_version=__version__,
        ir_version=helper.find_min_ir_version_for([helper.make_opsetid("", opset)]),
    )
    helper.set_model_props(onnx_file, {"unitrain.model": model.to_json()})
    return onnx_file


def export_onnx(
    source: Any,
    path: str | Path,
    *,
    input_shape: Sequence[int] | None = None,
    opset: int = OPSET,
) -> Path:
    """Write the model of a Trainer or a checkpoint as an ONNX file, in eval mode.

    Built from the portable description and the canonical weights with the ``onnx``
    package alone: no framework is imported, and checkpoints of the same weights written by
    any backend give byte-identical files. Weights are float32; the batch axis is free.
    BatchNorm is a ``BatchNormalization`` node with the running statistics; dropout is gone.

    Args:
        source: a :class:`~unitrain.training.trainer.Trainer` or a checkpoint directory.
        path: the ``.onnx`` file to write.
        input_shape: the shape of one example (no batch axis); needed unless the model
            starts with a dense layer. Sequence models are exported for this length.
        opset: the ONNX opset, one of :data:`OPSETS`.

    Returns:
        ``path``.

    Raises:
        ConfigError: the model is not portable, a layer has no ONNX mapping (its type is
            named), or the input shape is missing or does not fit.
        CheckpointError: the checkpoint is damaged or does not hold exactly its model.
        MissingFrameworkError: the ``onnx`` package is not installed.

    Examples:
        >>> import tempfile, onnx
        >>> from unitrain import Trainer, models
        >>> trainer = Trainer(models.MLP((4, 3, 2)), backend="numpy")
        >>> written = export_onnx(trainer, Path(tempfile.mkdtemp()) / "mlp.onnx")
        >>> [n.op_type for n in onnx.load(written).graph.node]
        ['MatMul', 'Add', 'Relu', 'MatMul', 'Add', 'Identity']
    """
    from unitrain.export import portable_weights

    model, weights = portable_weights(source)
    proto = onnx_model(model, weights, input_shape=input_shape, opset=opset)
    path = Path(path)
    path.write_bytes(proto.SerializeToString(deterministic=True))
    return path
