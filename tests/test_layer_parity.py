"""Each framework's native layers against the float64 numpy reference, layer by layer.

The bar is the issue's: 1e-6 relative in float32 for the output, the input gradient and the
parameter gradients (measured worst cases are 1e-7 to 4e-7; ``python tests/_layer_parity.py``
prints the table).
"""

from __future__ import annotations

import pytest
from _layer_parity import FRAMEWORKS, errors

from unitrain.conformance._layer_cases import LAYER_CASES

CASES = [
    pytest.param(framework, layer, shape, id=f"{framework}-{name}")
    for framework in FRAMEWORKS
    for name, layer, shape in LAYER_CASES
]


@pytest.mark.parametrize(("framework", "layer", "shape"), CASES)
def test_native_layer_matches_the_reference(framework, layer, shape):
    pytest.importorskip(framework)
    found = errors(framework, layer, shape)
    assert max(found.values()) < 1e-6, found
