"""The optional ``prefetch`` seam: the Trainer feeds its default path through it, and on a CPU
the built-in backends hand the batches back untouched (nothing to overlap, nothing to pay)."""

from __future__ import annotations

import numpy as np
import pytest
from _backends import backends

from unitrain import Trainer, TrainerConfig, models
from unitrain.backends.numpy import NumpyBackend
from unitrain.backends.protocol import BackendOptions, Prefetch
from unitrain.backends.registry import get_backend


class CountingPrefetch(NumpyBackend):
    """The numpy reference with a prefetch that copies each batch, as a device copy would."""

    def __init__(self, model, options=None):
        super().__init__(model, options)
        self.prefetched = 0

    def prefetch(self, batches):
        for x, y in batches:
            self.prefetched += 1
            yield x.copy(), y.copy()


def _data():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(40, 4)).astype(np.float32)
    return x, (x[:, 0] > 0).astype(np.int64)


def test_trainer_feeds_every_batch_through_prefetch_and_trains_the_same():
    model, config = models.MLP((4, 8, 2)), TrainerConfig(epochs=2, batch_size=8, device="cpu")
    fetching = Trainer(model, backend=CountingPrefetch, config=config)
    plain = Trainer(model, backend="numpy", config=config)
    fetching.fit(_data())
    plain.fit(_data())
    assert fetching.backend.prefetched == 2 * 5
    expected = plain.backend.state_dict()
    for key, value in fetching.backend.state_dict().items():
        np.testing.assert_array_equal(value, expected[key], err_msg=key)


@pytest.mark.parametrize("name", [n for n in backends() if n != "numpy"])
def test_builtin_backends_return_cpu_batches_unchanged(name):
    backend = get_backend(name)(models.MLP((4, 8, 2)), BackendOptions(device="cpu"))
    assert isinstance(backend, Prefetch)
    batches = [(np.zeros((2, 4), np.float32), np.zeros(2, np.int64))]
    assert backend.prefetch(batches) is batches


@pytest.mark.parametrize("name", ["jax", "tensorflow"])
def test_staging_ahead_keeps_token_ids_integer_and_the_step_takes_them(name, monkeypatch):
    """The accelerator staging, with the arguments the backend gives it (run here on the CPU
    device), hands a token model its ids as ids: cast to float, they broke the embedding."""
    pytest.importorskip(name)
    import importlib

    staging = importlib.import_module(f"unitrain.backends.{name}.prefetch")
    adapter = importlib.import_module(f"unitrain.backends.{name}.backend")
    monkeypatch.setattr(
        adapter, "prefetch", lambda batches, *args: staging._ahead(iter(batches), *args)
    )
    spec = models.Sequential((models.Embedding(7, 4), models.Linear(4, 7)))  # ids -> logits
    backend = get_backend(name)(spec, BackendOptions(device="cpu"))
    rng = np.random.default_rng(0)
    batches = [(rng.integers(0, 7, (3, 5)), rng.integers(0, 7, (3, 5))) for _ in range(2)]
    staged = list(backend.prefetch(batches))
    assert len(staged) == len(batches)
    for (x, y), (host_x, host_y) in zip(staged, batches):
        assert np.asarray(x).dtype.kind == "i" and np.array_equal(np.asarray(x), host_x)
        assert np.array_equal(np.asarray(y), host_y)
        staged_loss = float(backend.evaluate((x, y))["loss"])
        assert staged_loss == pytest.approx(float(backend.evaluate((host_x, host_y))["loss"]))
