"""Which layers sharded training gathers one at a time (``AbstractLayer.sharding_units``)."""

from __future__ import annotations

from unitrain.models import (
    MLP,
    Embedding,
    Initialized,
    LayerNorm,
    Linear,
    ReLU,
    Residual,
    Sequential,
    TransformerBlock,
)
from unitrain.models.init import Normal


def test_each_layer_of_a_chain_and_each_block_is_a_unit():
    model = Sequential(
        [
            Embedding(11, 8),
            Residual([Linear(8, 8), ReLU()]),  # a chain in a chain: looked into
            Sequential([TransformerBlock(8, 2), TransformerBlock(8, 2)]),
            ReLU(),  # no parameters: no unit
            Initialized(MLP((8, 4, 8)), {"*": Normal(0.02)}),  # a wrapper: one unit
            LayerNorm(8),
            Linear(8, 11),
        ]
    )
    assert model.sharding_units() == ("0", "1.0", "2.0", "2.1", "4", "5", "6")
    assert MLP((4, 8, 8, 3)).sharding_units() == ("layers.0", "layers.1", "layers.2")


def test_a_block_or_a_layer_alone_is_the_model_s_own_unit():
    assert TransformerBlock(8, 2).sharding_units() == ()  # its parts run in its own unit
    assert Linear(4, 2).sharding_units() == ()
