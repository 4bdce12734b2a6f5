"""A short float32 torch run whose every update is clipped and one of whose batches holds, in
the last worker's slice, an input that overflows the forward (a non-finite loss): run by
test_sharded on one process and, with ``UNITRAIN_SHARD=1``, on two torchrun workers. Rank 0
writes the final state and the skipped update count to ``OUT.npz``.

    python _sharded_clip_run.py OUT [PRECISION [ACCUMULATE]]

``PRECISION`` (``"32"``, ``"16-mixed"``, ``"bf16-mixed"``) and ``ACCUMULATE`` (micro-batches
an update) are the TrainerConfig's; under ``16-mixed`` the loss scaler halves its scale on
the overflowing batch, as it must on every worker alike."""

from __future__ import annotations

import sys

import numpy as np

from unitrain import Trainer, TrainerConfig, optim
from unitrain.models import MLP


def main(out: str, precision: str = "32", accumulate: int = 1) -> None:
    generator = np.random.default_rng(5)
    x, y = generator.normal(size=(48, 6)) * 4.0, generator.integers(0, 3, 48)
    x[20] = 3e38  # batch 2 (rows 16-31), worker 1's half: the sum of six overflows
    config = TrainerConfig(
        epochs=2,
        batch_size=16,
        dtype="float32",
        seed=0,
        deterministic=True,
        grad_clip_norm=0.05,
        nonfinite="skip_batch",
        precision=precision,
        grad_accum_steps=accumulate,
    )
    trainer = Trainer(
        MLP((6, 16, 3)), backend="torch", optimizer=optim.SGD(momentum=0.9), config=config
    )
    trainer.fit((x, y))
    state = trainer.backend.state_dict()  # every worker: the shards are gathered
    if trainer.strategy.is_main:
        np.savez(out, skipped=trainer.skipped_steps, world=trainer.strategy.world_size, **state)


if __name__ == "__main__":
    main(sys.argv[1], *sys.argv[2:3], *[int(n) for n in sys.argv[3:4]])
