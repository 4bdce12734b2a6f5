"""Each framework's native layers against the float64 numpy reference, layer by layer.

The bar is the issue's: 1e-6 relative in float32 for the output, the input gradient and the
parameter gradients (measured worst cases are 1e-7 to 4e-7; ``python tests/models/_layer_parity.py``
prints the table).
"""

from __future__ import annotations

import pytest
from _layer_parity import FRAMEWORKS, errors

from unitrain.conformance._layer_cases import LAYER_CASES

# torch runs by default (4 s); JAX's and TensorFlow's eager ops take 20 s and 5 s for the
# table, so they run with the slow tests. The conformance kit's layers family holds every
# backend to the reference through the protocol in the default run as well.
CASES = [
    pytest.param(
        framework,
        layer,
        shape,
        id=f"{framework}-{name}",
        marks=[pytest.mark.slow] if framework != "torch" else [],
    )
    for framework in FRAMEWORKS
    for name, layer, shape in LAYER_CASES
]


@pytest.mark.parametrize(("framework", "layer", "shape"), CASES)
def test_native_layer_matches_the_reference(framework, layer, shape):
    pytest.importorskip(framework)
    found = errors(framework, layer, shape)
    assert max(found.values()) < 1e-6, found
