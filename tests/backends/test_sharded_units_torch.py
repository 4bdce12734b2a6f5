"""Sharded torch gathers one unit at a time: each block's (each chain layer's) parameters are
whole only while it runs, each unit an FSDP module of its own, and the run still equals an
unsharded one. In process, over a process group of one worker (``one_worker_group``): FSDP2
gathers and frees a unit's parameters there as on N workers."""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import pytest

from unitrain import ConfigError, Trainer, TrainerConfig, ops
from unitrain.backends.protocol import BackendOptions
from unitrain.backends.sharded import Sharded
from unitrain.backends.strategy import strategy_for
from unitrain.models import (
    AbstractLayer,
    Embedding,
    LayerNorm,
    Linear,
    Scope,
    Sequential,
    TransformerBlock,
)

torch = pytest.importorskip("torch")

VOCAB, DIM = 11, 8


def _language_model(dropout: float = 0.0) -> Sequential:
    blocks = [TransformerBlock(DIM, 2, causal=True, dropout=dropout) for _ in range(2)]
    return Sequential([Embedding(VOCAB, DIM), *blocks, LayerNorm(DIM), Linear(DIM, VOCAB)])


def _tokens(n: int = 8, length: int = 6) -> tuple[np.ndarray, np.ndarray]:
    tokens = np.random.default_rng(0).integers(0, VOCAB, (n, length))
    return tokens, np.roll(tokens, -1, axis=1)


def test_a_unit_s_parameters_are_whole_only_while_it_runs(one_worker_group):
    from torch.distributed.fsdp import FSDPModule
    from torch.distributed.tensor import DTensor

    from unitrain.backends.torch import TorchBackend

    backend = TorchBackend(_language_model(), BackendOptions())
    strategy_for(backend, Sharded())
    module = backend.module
    units = {path: module.get_submodule(path) for path in ("0", "1", "2", "3", "4")}
    assert all(isinstance(unit, FSDPModule) for unit in units.values())
    seen: dict[str, dict[str, bool]] = {}

    def whole_while(path: str) -> Any:
        def record(container: Any, inputs: Any) -> None:  # after FSDP's own pre-forward hook
            seen[path] = {
                other: not any(isinstance(p, DTensor) for p in unit.parameters())
                for other, unit in units.items()
            }

        return record

    for path, unit in units.items():
        unit.register_forward_pre_hook(whole_while(path))
    backend.forward(_tokens())
    for path in units:  # while a unit runs, its parameters are whole, every other's sharded
        assert seen[path] == {other: other == path for other in units}, path
    assert all(isinstance(p, DTensor) for p in module.parameters())  # all freed after
    backend.backward()  # each unit's gradients reduced into its shards
    assert all(isinstance(p.grad, DTensor) for p in backend.params.values())


def test_a_language_model_sharded_block_by_block_equals_unsharded(tmp_path, one_worker_group):
    """Dropout in the blocks and clipping: the keys, the global norm and the updates are one
    worker's, in float64 to rounding."""

    def fit(strategy: Any) -> Trainer:
        config = TrainerConfig(epochs=2, batch_size=4, dtype="float64", seed=0, grad_clip_norm=0.5)
        trainer = Trainer(
            _language_model(dropout=0.1), backend="torch", config=config, strategy=strategy
        )
        trainer.fit(_tokens())
        return trainer

    sharded = fit(Sharded(1)).backend.state_dict()
    os.environ.pop("WORLD_SIZE")  # the unsharded run is not launched
    plain = fit(None).backend.state_dict()
    assert sorted(sharded) == sorted(plain)
    for key, value in plain.items():
        np.testing.assert_allclose(sharded[key], value, rtol=1e-12, atol=1e-14, err_msg=key)


class TiedLM(AbstractLayer):
    """A language model whose head reads its token embedding's weight (nanoGPT's tying)."""

    def children(self) -> tuple[tuple[str, AbstractLayer], ...]:
        blocks = tuple(TransformerBlock(DIM, 2, causal=True) for _ in range(2))
        return (("wte", Embedding(VOCAB, DIM)), ("blocks", Sequential(blocks)))

    def forward(self, scope: Scope, x: Any) -> Any:
        tied = scope.child("wte").param("weight")
        return ops.matmul(scope.call("blocks", scope.call("wte", x)), ops.transpose(tied, (1, 0)))

    def _output_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        return (*shape, VOCAB)


class ReadsIntoAUnit(TiedLM):
    """A head that reads the weight of a layer in a chain, which is a unit of its own."""

    def children(self) -> tuple[tuple[str, AbstractLayer], ...]:
        return (("body", Sequential([Embedding(VOCAB, DIM), Linear(DIM, DIM)])),)

    def forward(self, scope: Scope, x: Any) -> Any:
        tied = scope.child("body").child("0").param("weight")
        return ops.matmul(scope.call("body", x), ops.transpose(tied, (1, 0)))


def test_a_tied_weight_trains_sharded_where_it_may_and_is_refused_where_it_may_not(
    one_worker_group,
):
    """A head tied to the model's own child (nanoGPT's) keeps that child in the model's unit
    and trains; one tied to a layer inside a chain, a unit of its own, is refused with a
    message that says why (unsharded, both train)."""
    from unitrain.backends.torch import TorchBackend

    assert TiedLM().sharding_units() == ("blocks.0", "blocks.1")
    assert ReadsIntoAUnit().sharding_units() == ("body.0", "body.1")
    tied = TorchBackend(TiedLM(), BackendOptions())
    strategy_for(tied, Sharded())
    tied.forward(_tokens())
    tied.backward()
    grads = {name: p.grad for name, p in tied.params.items()}
    assert all(grad is not None for grad in grads.values())
    assert float(grads["wte.weight"].full_tensor().abs().sum()) > 0.0
    tied.step(0.1)
    wrong = TorchBackend(ReadsIntoAUnit(), BackendOptions())
    strategy_for(wrong, Sharded())
    with pytest.raises(ConfigError, match=r"'body\.0\.weight' was read outside its sharding unit"):
        wrong.forward(_tokens())
    os.environ.pop("WORLD_SIZE")
    TorchBackend(ReadsIntoAUnit(), BackendOptions()).forward(_tokens())
