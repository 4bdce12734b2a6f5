"""unitrain.ops.random: Threefry-2x32 written once in ops, the same bits on every backend,
eagerly and inside jax.jit / tf.function, with the distributions it claims."""

from __future__ import annotations

import numpy as np
import pytest
from _backends import installed

from unitrain import ops
from unitrain.ops.random import _threefry

BACKENDS = installed()

#: Random123's known-answer vectors for threefry2x32_20: (key, counter, output), as words.
KNOWN_ANSWERS = [
    ((0x00000000, 0x00000000), (0x00000000, 0x00000000), (0x6B200159, 0x99BA4EFE)),
    ((0xFFFFFFFF, 0xFFFFFFFF), (0xFFFFFFFF, 0xFFFFFFFF), (0x1CB996FC, 0xBB002BE7)),
    ((0x13198A2E, 0x03707344), (0x243F6A88, 0x85A308D3), (0xC4923A9C, 0x483DF7A0)),
]


def words(*values: int) -> np.ndarray:
    return np.array(values, np.uint32).view(np.int32)


def draws(backend: str) -> dict[str, np.ndarray]:
    with ops.using(backend) as module:
        key = ops.random.key(2**40 + 7)
        made = {
            "key": key,
            "fold_in": ops.random.fold_in(key, 3),
            "split": ops.stack(ops.random.split(key, 3), 0),
            "bits": ops.random.bits(key, (3, 5)),
            "uniform": ops.random.uniform(key, (4, 3), "float32", -2.0, 2.0),
            "uniform64": ops.random.uniform(key, (4, 3), "float64"),
            "bernoulli": ops.random.bernoulli(key, 0.25, (5, 7)),
            "normal": ops.random.normal(key, (11,)),
        }
        return {name: np.asarray(module.to_numpy(value)) for name, value in made.items()}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(("key", "counter", "want"), KNOWN_ANSWERS)
def test_threefry_gives_random123s_known_answers(backend, key, counter, want):
    with ops.using(backend) as module:
        k = module.asarray(words(*key), "int32")
        x0, x1 = (module.asarray(words(c), "int32") for c in counter)
        got = [np.asarray(module.to_numpy(w)) for w in _threefry(module, k, x0, x1)]
    assert [int(w[0]) for w in got] == [int(w) for w in words(*want)]


@pytest.mark.parametrize("backend", [b for b in BACKENDS if b != "numpy"])
def test_every_backend_draws_the_references_numbers(backend):
    got, want = draws(backend), draws("numpy")
    for name in want:
        if name == "normal":  # log, sqrt and cos round differently per framework
            np.testing.assert_allclose(got[name], want[name], rtol=1e-6, atol=1e-6)
        else:
            np.testing.assert_array_equal(got[name], want[name], err_msg=name)


def test_the_keys_and_words_are_jaxs():
    jax = pytest.importorskip("jax")
    from jax.extend.random import threefry_2x32

    with jax.enable_x64(True):  # without it, JAX keeps only a seed's low 32 bits
        seeded = jax.random.PRNGKey(2**40 + 7)
    want_key = np.asarray(jax.random.key_data(seeded)).view(np.int32)
    counters = np.concatenate([np.arange(8, dtype=np.uint32), np.zeros(8, np.uint32)])
    jax_words = np.asarray(threefry_2x32(want_key.view(np.uint32), counters)).view(np.int32)
    with ops.using("numpy"):
        key = ops.random.key(2**40 + 7)
        np.testing.assert_array_equal(key, want_key)
        np.testing.assert_array_equal(ops.random.bits(key, (16,)), jax_words)


def test_a_step_traced_by_jax_jit_folds_in_as_the_number_does():
    jax = pytest.importorskip("jax")
    with ops.using("jax"):
        key = ops.random.key(5)

        @jax.jit
        def mask(step):
            return ops.random.bernoulli(ops.random.fold_in(key, step), 0.5, (64,))

        traced = np.asarray(mask(np.int32(77)))
    with ops.using("numpy"):
        eager = ops.random.bernoulli(ops.random.fold_in(ops.random.key(5), 77), 0.5, (64,))
    np.testing.assert_array_equal(traced, eager)


def test_a_step_traced_by_tf_function_folds_in_as_the_number_does():
    tf = pytest.importorskip("tensorflow")
    with ops.using("tensorflow"):
        key = ops.random.key(5)

        @tf.function
        def uniform(step):
            return ops.random.uniform(ops.random.fold_in(key, step), (64,))

        traced = uniform(tf.constant(77, tf.int64)).numpy()
    with ops.using("numpy"):
        eager = ops.random.uniform(ops.random.fold_in(ops.random.key(5), 77), (64,))
    np.testing.assert_array_equal(traced, eager)


def test_the_distributions_are_what_they_claim():
    with ops.using("numpy"):
        key = ops.random.key(0)
        u = ops.random.uniform(ops.random.fold_in(key, 1), (200_000,), "float64")
        z = ops.random.normal(ops.random.fold_in(key, 2), (200_000,), "float64")
        b = ops.random.bernoulli(ops.random.fold_in(key, 3), 0.1, (200_000,))
        raw = ops.random.bits(ops.random.fold_in(key, 4), (200_000,))
    assert u.min() >= 0.0 and u.max() < 1.0
    assert abs(u.mean() - 0.5) < 0.003 and abs(u.var() - 1 / 12) < 0.001
    assert abs(z.mean()) < 0.01 and abs(z.std() - 1.0) < 0.01
    assert abs(np.mean(z**4) - 3.0) < 0.05  # normal's kurtosis, not a uniform's 1.8
    assert abs(b.mean() - 0.1) < 0.003
    per_bit = (raw.view(np.uint32)[:, None] >> np.arange(32, dtype=np.uint32)) & 1
    assert np.all(np.abs(per_bit.mean(axis=0) - 0.5) < 0.005)  # every bit a fair coin


def test_derived_keys_and_their_draws_all_differ():
    with ops.using("numpy"):
        key = ops.random.key(0)
        keys = [key, *ops.random.split(key, 4), ops.random.fold_in(key, 2**40)]
        assert len({k.tobytes() for k in keys}) == len(keys)
        firsts = {ops.random.bits(k, (4,)).tobytes() for k in keys}
        # no derived key is a draw's output: the counters of keys and of draws never meet
        assert ops.random.bits(key, (8,)).tobytes() not in firsts
        assert len(firsts) == len(keys)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
def test_a_low_precision_uniform_never_rounds_up_to_one(dtype):
    with ops.using("torch" if "torch" in BACKENDS else "numpy") as module:
        if dtype == "bfloat16" and module.__name__.endswith("numpy.ops"):
            pytest.skip("numpy has no bfloat16")
        u = module.to_numpy(ops.random.uniform(ops.random.key(1), (50_000,), dtype))
    assert np.asarray(u, np.float64).max() < 1.0


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: ops.random.key(-1), r"\[0, 2\*\*64\)"),
        (lambda: ops.random.key(1.5), "seed is an int"),
        (lambda: ops.random.bernoulli(ops.random.key(0), 1.5, (2,)), r"in \[0, 1\]"),
        (lambda: ops.random.uniform(ops.random.key(0), (2,), "int32"), "floating dtype"),
        (lambda: ops.random.fold_in(ops.random.key(0), -3), r"\[0, 2\*\*63\)"),
        (lambda: ops.random.bits(ops.random.key(0), (2**16, 2**16)), "fewer than 2\\*\\*31"),
    ],
)
def test_bad_arguments_say_what_is_wrong(call, message):
    with ops.using("numpy"), pytest.raises((TypeError, ValueError), match=message):
        call()
