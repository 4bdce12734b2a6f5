"""LSTM and GRU as ONNX's own ``LSTM`` and ``GRU`` operators.

unitrain keeps torch's gate orders in ``(in, out)`` weights (LSTM i, f, g, o; GRU r, z, n);
ONNX wants ``(out, in)`` matrices with LSTM's gates as i, o, f, c and GRU's as z, r, h, and
two biases. The GRU's reset-after form is ONNX's ``linear_before_reset=1``. A stateful layer
starts from its saved state, which fixes the batch to the layer's ``batch_size``.
"""

from __future__ import annotations

import numpy as np

from unitrain.models import GRU, LSTM
from unitrain.onnx_export._graph import Converter, Graph, Value

__all__ = ["CONVERTERS"]

#: ONNX's gate order as indices into unitrain's.
_GATES = {LSTM: (0, 3, 1, 2), GRU: (1, 0, 2)}


def _onnx_gates(weight: np.ndarray, order: tuple[int, ...]) -> np.ndarray:
    """``(in, gates * hidden)`` columns -> ``(1, gates * hidden, in)`` rows in ONNX's order."""
    blocks = np.split(np.asarray(weight).T, len(order), axis=0)
    return np.concatenate([blocks[i] for i in order], axis=0)[None]


def _recurrent(graph: Graph, layer: LSTM | GRU, prefix: str, x: Value) -> Value:
    order = _GATES[type(layer)]
    if isinstance(layer, LSTM):  # one bias; ONNX adds a second one, here zeros
        bias = np.asarray(graph.array(prefix, "bias"))
        biases = np.concatenate([_onnx_gates(bias[None], order)[0, :, 0], np.zeros_like(bias)])
    else:
        biases = np.concatenate(
            [_onnx_gates(graph.array(prefix, n)[None], order)[0, :, 0] for n in layer._bias_names()]
        )
    inputs = [
        graph.op("Transpose", [graph.channels_last(x, prefix).name], prefix, perm=[1, 0, 2]),
        graph.weight(
            prefix, "weight_ih", "onnx", _onnx_gates(graph.array(prefix, "weight_ih"), order)
        ),
        graph.weight(
            prefix, "weight_hh", "onnx", _onnx_gates(graph.array(prefix, "weight_hh"), order)
        ),
        graph.weight(prefix, "bias", "onnx", biases[None]),
        "",  # sequence_lens: every sequence is whole
    ]
    if layer.batch_size is not None:
        inputs += [
            graph.weight(prefix, n, "onnx", graph.array(prefix, n)[None]) for n in layer.carried
        ]
    attributes = {"hidden_size": layer.hidden_size}
    if isinstance(layer, GRU):
        attributes["linear_before_reset"] = 1
    op_type = type(layer).__name__
    sequences, last = graph.op_outputs(op_type, inputs, prefix, 2, **attributes)
    if not layer.return_sequences:  # (1, N, H) -> (N, H)
        last = graph.op("Squeeze", [last, graph.ints((0,), prefix)], prefix)
        return Value(last, (layer.hidden_size,))
    # (L, 1, N, H) -> (N, L, H)
    squeezed = graph.op("Squeeze", [sequences, graph.ints((1,), prefix)], prefix)
    y = graph.op("Transpose", [squeezed], prefix, perm=[1, 0, 2])
    return Value(y, (x.shape[0], layer.hidden_size))


CONVERTERS: dict[type, Converter] = {LSTM: _recurrent, GRU: _recurrent}
