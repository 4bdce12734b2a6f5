"""``unitrain.ops.random``: random numbers from explicit keys, the same bits on every backend.

A key is a pair of 32-bit words; every draw is a pure function of its key, so the same key
gives the same numbers on numpy, torch, JAX and TensorFlow, on any device, eagerly or inside
``jax.jit`` and ``tf.function``. The generator is Threefry-2x32 with 20 rounds (Salmon et al.,
"Parallel random numbers: as easy as 1, 2, 3", SC 2011), the counter-based hash JAX's own
``jax.random`` is built on, written here once in the contract's integer ops: the words are
``int32`` arrays, whose addition wraps modulo 2**32 on every backend, so no framework needs an
unsigned type (torch has no unsigned arithmetic).

- :func:`key` makes a key from a seed, with JAX's word order: ``key(s)``'s words are those of
  ``jax.random.key_data(jax.random.PRNGKey(s))``.
- :func:`fold_in` derives a new key from a key and a number (a step, a layer's index), and
  :func:`split` ``n`` keys; a key is used for one draw, and a new draw takes a derived key.
- :func:`stream_key` is the key of one forward pass's random stream (dropout, a layer's
  noise): ``key(seed)`` with the update's step and micro-batch folded in.
- :func:`bits`, :func:`uniform`, :func:`normal` and :func:`bernoulli` draw. ``bits`` and
  ``uniform`` agree bit for bit across backends; ``normal`` goes through ``log``, ``sqrt``
  and ``cos``, so it agrees to the float rounding of those functions.

Draws never carry a gradient. Counters: the ``i``-th pair of words of a draw is the hash of
the counter ``(i, 0)`` under the key, and a derived key the hash of ``(lo, hi + 1)`` for the
number ``hi * 2**32 + lo``, so no derived key is ever a draw's output. (The functions call the
active backend's ops module directly, ``ops = active()``, as :mod:`unitrain.ops` imports this
module.)

Examples:
    >>> from unitrain import ops
    >>> with ops.using("numpy"):
    ...     print(ops.random.bits(ops.random.key(0), (2,)))
    [ 1797259609 -1715843330]
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from types import ModuleType
from typing import Any

import numpy as np

from unitrain._errors import ConfigError
from unitrain.ops._dispatch import active, using
from unitrain.ops._types import Array

__all__ = [
    "GENERATORS",
    "Key",
    "bernoulli",
    "bits",
    "check_generator",
    "fold_in",
    "host_stream_key",
    "key",
    "normal",
    "split",
    "stream_key",
    "uniform",
]

Key = Array  #: an int32 array of shape ``(2,)``: the key's two words, high word first.

_MASK = 0xFFFFFFFF
_PARITY = 0x1BD11BDA  # Threefry's key-schedule constant
_ROTATIONS = ((13, 15, 26, 6), (17, 29, 16, 24))
#: Bits of precision a uniform draw keeps, by dtype: every value ``k * 2**-p`` is exact in the
#: dtype, so none rounds up to 1; float64 keeps float32's 24 so that a float64 reference and a
#: float32 backend draw the same numbers.
_PRECISION = {"float64": 24, "float32": 24, "float16": 11, "bfloat16": 8}
#: Where a forward pass's dropout masks come from: ``"portable"`` (this module's generator,
#: the same masks on every backend; the default) or ``"native"`` (the framework's own,
#: faster generator: masks differ from backend to backend).
GENERATORS = ("portable", "native")


def key(seed: int) -> Key:
    """The key of an integer seed in ``[0, 2**64)``, on the active backend."""
    ops = active()
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
        raise TypeError(f"a random key's seed is an int, got {type(seed).__name__} {seed!r}")
    seed = int(seed)
    if not 0 <= seed < 2**64:
        raise ValueError(f"a random key's seed is in [0, 2**64), got {seed}")
    return ops.asarray(np.array([_signed(seed >> 32), _signed(seed & _MASK)], np.int32), "int32")


def fold_in(key: Key, data: int | Array) -> Key:
    """A new key from ``key`` and ``data``: a Python int in ``[0, 2**63)`` or an integer
    array scalar in ``[0, 2**31)`` (a step counter inside a compiled function); equal numbers
    give equal keys either way."""
    ops = active()
    if isinstance(data, (int, np.integer)) and not isinstance(data, bool):
        data = int(data)
        if not 0 <= data < 2**63:
            raise ValueError(f"fold_in takes a number in [0, 2**63), got {data}")
        low = ops.asarray(np.array([_signed(data & _MASK)], np.int32), "int32")
        high = ops.asarray(np.array([(data >> 32) + 1], np.int32), "int32")
    else:
        low = ops.reshape(ops.cast(data, "int32"), (1,))
        high = ops.ones((1,), "int32")
    return ops.concat(_threefry(ops, key, low, high), 0)


def stream_key(seed: int | Key, *numbers: int | Array) -> Key:
    """The key of one forward pass's random stream: ``key(seed)`` (or ``seed`` itself when it
    is already a key) with each of ``numbers`` folded in, in order. Backends key a train
    pass by ``stream_key(options.seed, step, micro_batch)``; each number may be a Python int
    or an integer array scalar, so a compiled step keeps its step on the device.

    Examples:
        >>> from unitrain import ops
        >>> with ops.using("numpy"):
        ...     a = ops.random.stream_key(7, 3, 0)
        ...     b = ops.random.fold_in(ops.random.fold_in(ops.random.key(7), 3), 0)
        >>> bool((a == b).all())
        True
    """
    derived = key(int(seed)) if isinstance(seed, (int, np.integer)) else seed
    for number in numbers:
        derived = fold_in(derived, number)
    return derived


def host_stream_key(seed: int, *numbers: int) -> np.ndarray:
    """:func:`stream_key` computed on the host, as a numpy int32 array, whatever backend is
    active: what a backend that knows a pass's numbers on the host hands the pass, which then
    derives its site keys on the host too and runs only the draws on the device."""
    with using("numpy"):
        return np.asarray(stream_key(seed, *numbers))


def check_generator(value: object) -> str:
    """``value`` if it names a generator in :data:`GENERATORS`, else a ConfigError."""
    if value not in GENERATORS:
        raise ConfigError(
            f"random must be one of {GENERATORS}, got {value!r}: 'portable' draws the same "
            "dropout masks on every backend, 'native' the framework's own (faster) ones"
        )
    return str(value)


def split(key: Key, n: int = 2) -> list[Key]:
    """``n`` new keys from ``key`` (``fold_in(key, i)`` for ``i`` in ``range(n)``)."""
    return [fold_in(key, i) for i in range(n)]


def bits(key: Key, shape: Sequence[int]) -> Array:
    """Uniform random 32-bit words of ``shape``, as ``int32`` (every bit pattern equally
    likely)."""
    ops = active()
    size = _size(shape)
    pairs = (size + 1) // 2
    counter = ops.arange(pairs, "int32")
    high, low = _threefry(ops, key, counter, ops.zeros((pairs,), "int32"))
    return ops.reshape(ops.concat([high, low], 0)[:size], tuple(shape))


def uniform(
    key: Key, shape: Sequence[int], dtype: str = "float32", low: float = 0.0, high: float = 1.0
) -> Array:
    """Uniform numbers in ``[low, high)``: ``low + (high - low) * k * 2**-p`` with ``k`` the
    top ``p`` bits of :func:`bits` (``p`` is 24 for float32 and float64, 11 for float16, 8
    for bfloat16), so the numbers are the same on every backend and, for float32 and float64,
    in both dtypes."""
    ops = active()
    unit = _unit(ops, bits(key, shape), _precision(dtype), dtype)
    if (low, high) == (0.0, 1.0):
        return unit
    return ops.add(ops.multiply(unit, high - low), low)


def normal(key: Key, shape: Sequence[int], dtype: str = "float32") -> Array:
    """Standard normal numbers, by the Box-Muller transform of two uniform 24-bit draws per
    number (computed in float32, or in float64 for float64)."""
    ops = active()
    size = _size(shape)
    high, low = _threefry(ops, key, ops.arange(size, "int32"), ops.zeros((size,), "int32"))
    work = "float64" if dtype == "float64" else "float32"
    radius_draw = ops.subtract(1.0, _unit(ops, high, 24, work))  # in (0, 1]: its log is finite
    angle = ops.multiply(_unit(ops, low, 24, work), 2.0 * math.pi)
    radius = ops.sqrt(ops.multiply(ops.log(radius_draw), -2.0))
    return ops.cast(ops.reshape(radius * ops.cos(angle), tuple(shape)), dtype)


def bernoulli(key: Key, p: float, shape: Sequence[int]) -> Array:
    """A bool array of ``shape``, each entry true with probability ``p`` (a multiple of
    ``2**-24``: ``p`` is rounded to one), from the top 24 bits of :func:`bits`: the same
    entries on every backend. A dropout mask is ``bernoulli(key, 1 - rate, shape)``."""
    ops = active()
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"a Bernoulli probability is in [0, 1], got {p}")
    return ops.less(_top(ops, bits(key, shape), 24), round(p * 2**24))


def _threefry(ops: ModuleType, key: Key, x0: Array, x1: Array) -> tuple[Array, Array]:
    """Threefry-2x32-20 of the counters ``(x0, x1)`` (int32 arrays of one shape) under
    ``key``, as in Random123 and ``jax.extend.random.threefry_2x32``."""
    k0, k1 = key[0:1], key[1:2]  # slices, not scalars: numpy warns on a wrapping scalar
    schedule = (k0, k1, ops.bitwise_xor(ops.bitwise_xor(k0, k1), _PARITY))
    x0, x1 = ops.add(x0, k0), ops.add(x1, k1)
    for group in range(5):
        for rotation in _ROTATIONS[group % 2]:
            x0 = ops.add(x0, x1)
            x1 = ops.bitwise_xor(_rotate_left(ops, x1, rotation), x0)
        x0 = ops.add(x0, schedule[(group + 1) % 3])
        x1 = ops.add(ops.add(x1, schedule[(group + 2) % 3]), group + 1)
    return x0, x1


def _rotate_left(ops: ModuleType, x: Array, r: int) -> Array:
    """``x``'s 32 bits rotated left by ``r``; the right shift is arithmetic on int32, so the
    bits it drags in from the sign are masked off."""
    spilled = ops.bitwise_and(ops.bitwise_right_shift(x, 32 - r), (1 << r) - 1)
    return ops.bitwise_or(ops.bitwise_left_shift(x, r), spilled)


def _top(ops: ModuleType, words: Array, p: int) -> Array:
    """The top ``p`` bits of each word, as a non-negative int32 below ``2**p``."""
    return ops.bitwise_and(ops.bitwise_right_shift(words, 32 - p), (1 << p) - 1)


def _unit(ops: ModuleType, words: Array, p: int, dtype: str) -> Array:
    """``k * 2**-p`` in ``dtype`` for ``k`` the top ``p`` bits of each word: exact."""
    return ops.multiply(ops.cast(_top(ops, words, p), dtype), 2.0**-p)


def _precision(dtype: str) -> int:
    try:
        return _PRECISION[dtype]
    except KeyError:
        raise ValueError(
            f"uniform draws a floating dtype {sorted(_PRECISION)}, got {dtype!r}"
        ) from None


def _size(shape: Sequence[int]) -> Any:
    """The number of entries of ``shape``: an int, or a scalar tensor where a dimension is
    known only when the graph runs (a ``tf.function``'s batch dimension)."""
    size = math.prod(_dimension(n) for n in shape)
    if isinstance(size, int) and size >= 2**31:
        raise ValueError(f"one draw holds fewer than 2**31 numbers; {tuple(shape)} has {size}")
    return size


def _dimension(n: Any) -> Any:
    try:
        return int(n)
    except TypeError:  # a symbolic dimension: computed with when the graph runs
        return n


def _signed(word: int) -> int:
    """A 32-bit word as the int32 with the same bits."""
    return word - 2**32 if word >= 2**31 else word
