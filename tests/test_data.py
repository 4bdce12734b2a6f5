"""Tests for unitrain.data: the (seed, epoch) shuffle, O(1) seeking, validation, adapters."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from unitrain import ConfigError, DataError, Trainer, TrainerConfig, models
from unitrain.data import ArrayLoader, BatchSource, IterableSource, as_batch_source, check_arrays


def arrays(n: int, features: int = 2) -> tuple[np.ndarray, np.ndarray]:
    """Inputs whose first column is the example index, and the index as the target."""
    x = np.zeros((n, features), dtype=np.float32)
    x[:, 0] = np.arange(n)
    return x, np.arange(n)


def targets_of(batches) -> list[list[int]]:
    return [y.tolist() for _, y in batches]


loader_args = st.fixed_dictionaries(
    {
        "n": st.integers(1, 40),
        "batch_size": st.integers(1, 16),
        "drop_last": st.booleans(),
        "shuffle": st.booleans(),
        "seed": st.integers(0, 2**32 - 1),
    }
)


def build(args: dict) -> ArrayLoader:
    x, y = arrays(args["n"])
    return ArrayLoader(
        x,
        y,
        args["batch_size"],
        shuffle=args["shuffle"],
        seed=args["seed"],
        drop_last=args["drop_last"],
    )


# -- ArrayLoader: order ---------------------------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(args=loader_args, epoch=st.integers(0, 1000), start=st.integers(0, 45))
def test_seek_equals_slicing_the_full_epoch(args, epoch, start):
    if args["drop_last"] and args["n"] < args["batch_size"]:
        with pytest.raises(DataError, match="drop_last"):
            build(args)
        return
    loader = build(args)
    full = list(loader.batches(epoch))
    assert len(full) == len(loader)
    sought = list(loader.batches(epoch, start=start))
    assert targets_of(sought) == targets_of(full[start:])
    for (xs, ys), (xf, yf) in zip(sought, full[start:], strict=True):
        np.testing.assert_array_equal(xs, xf)
        np.testing.assert_array_equal(ys, yf)
        np.testing.assert_array_equal(xs[:, 0], ys)  # inputs and targets stay paired


@settings(max_examples=200, deadline=None)
@given(args=loader_args, epoch=st.integers(0, 1000))
def test_order_is_a_pure_function_of_seed_and_epoch(args, epoch):
    if args["drop_last"] and args["n"] < args["batch_size"]:
        return
    first, second = build(args), build(args)
    # Iterating other epochs first must not change anything: no hidden RNG state.
    for other in (epoch + 1, epoch + 7, 0):
        list(first.batches(other))
    np.testing.assert_array_equal(first.order(epoch), second.order(epoch))
    assert targets_of(first.batches(epoch)) == targets_of(second.batches(epoch))
    assert targets_of(first.batches(epoch)) == targets_of(first.batches(epoch))


@settings(max_examples=200, deadline=None)
@given(args=loader_args, epoch=st.integers(0, 1000))
def test_every_example_appears_once_per_epoch(args, epoch):
    if args["drop_last"] and args["n"] < args["batch_size"]:
        return
    loader = build(args)
    n, size = args["n"], args["batch_size"]
    batches = targets_of(loader.batches(epoch))
    seen = [i for batch in batches for i in batch]
    assert len(seen) == len(set(seen))
    if args["drop_last"]:
        assert len(batches) == n // size
        assert all(len(batch) == size for batch in batches)
        assert len(seen) == (n // size) * size
    else:
        assert sorted(seen) == list(range(n))
        assert len(batches) == -(-n // size)
        assert all(len(batch) == size for batch in batches[:-1])
        assert len(batches[-1]) == n - size * (len(batches) - 1)
    if not args["shuffle"]:
        assert seen == list(range(len(seen)))


def test_different_epochs_and_seeds_give_different_orders():
    x, y = arrays(50)
    loader = ArrayLoader(x, y, 8, seed=3)
    orders = {tuple(loader.order(epoch).tolist()) for epoch in range(10)}
    assert len(orders) == 10
    other_seed = ArrayLoader(x, y, 8, seed=4)
    assert not np.array_equal(loader.order(0), other_seed.order(0))
    assert sorted(loader.order(0).tolist()) == list(range(50))


def test_shuffle_false_keeps_the_array_order_every_epoch():
    x, y = arrays(10)
    loader = ArrayLoader(x, y, batch_size=4, shuffle=False, seed=9)
    for epoch in (0, 1, 5):
        assert targets_of(loader.batches(epoch)) == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]


def test_drop_last_drops_only_the_short_final_batch():
    x, y = arrays(10)
    loader = ArrayLoader(x, y, batch_size=4, shuffle=False, drop_last=True)
    assert len(loader) == 2
    assert targets_of(loader.batches(0)) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    exact = ArrayLoader(*arrays(8), batch_size=4, drop_last=True)
    assert len(exact) == 2 and len(ArrayLoader(*arrays(8), batch_size=4)) == 2


def test_drop_last_with_fewer_examples_than_a_batch_is_refused():
    with pytest.raises(DataError, match=r"drop_last=True with 3 examples and batch_size=4"):
        ArrayLoader(*arrays(3), batch_size=4, drop_last=True)


def test_drop_last_keeps_a_single_full_batch():
    loader = ArrayLoader(*arrays(4), batch_size=4, shuffle=False, drop_last=True)
    assert targets_of(loader.batches(0)) == [[0, 1, 2, 3]]


def test_batch_size_one_gives_one_example_per_batch():
    loader = ArrayLoader(*arrays(3), batch_size=1, shuffle=False)
    assert targets_of(loader.batches(0)) == [[0], [1], [2]]


def test_the_defaults_are_batches_of_32_in_the_order_of_seed_0():
    """Unset, the batch size is Keras's ``fit`` default and the seed is 0: a run that sets
    neither has a fixed order, which its checkpoints rely on when it resumes."""
    x, y = arrays(70)
    loader = ArrayLoader(x, y)
    assert [len(batch) for _, batch in loader.batches(0)] == [32, 32, 6]
    for epoch in (0, 1):
        seeded = ArrayLoader(x, y, batch_size=70, seed=0).order(epoch)
        np.testing.assert_array_equal(loader.order(epoch), seeded)


def test_an_unnamed_loader_calls_its_arrays_data_in_errors():
    x, y = arrays(4)
    x[1, 1] = np.inf
    with pytest.raises(DataError, match=r"^data inputs contain 1 NaN or infinite"):
        ArrayLoader(x, y, batch_size=2)


def test_seeking_past_the_end_yields_nothing():
    loader = ArrayLoader(*arrays(10), batch_size=4)
    assert list(loader.batches(0, start=3)) == []
    assert list(loader.batches(0, start=100)) == []


def test_array_loader_is_a_batch_source_with_exact_resume():
    loader = ArrayLoader(*arrays(4), batch_size=2)
    assert isinstance(loader, BatchSource)
    assert loader.exact_resume is True
    assert IterableSource.exact_resume is False


@pytest.mark.parametrize("batch_size", [0, -3, 2.5, True, "4", None])
def test_bad_batch_size_is_a_config_error(batch_size):
    with pytest.raises(ConfigError, match=r"batch_size must be a positive int, got batch_size="):
        ArrayLoader(*arrays(4), batch_size=batch_size)


@pytest.mark.parametrize("seed", [-1, 1.5, None])
def test_bad_seed_is_a_config_error_at_construction(seed):
    with pytest.raises(ConfigError, match="seed"):
        ArrayLoader(*arrays(4), batch_size=2, seed=seed)


def test_array_loader_validates_its_arrays():
    x, y = arrays(4)
    x[2, 1] = np.nan
    with pytest.raises(DataError, match="NaN"):
        ArrayLoader(x, y, batch_size=2)
    with pytest.raises(DataError, match="ragged"):
        ArrayLoader(*arrays(4)[:1], np.arange(3), batch_size=2)


# -- check_arrays ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("inputs", "targets", "kwargs", "message"),
    [
        (np.zeros((0, 3)), np.zeros(0, int), {}, r"train_data is empty: it has no examples"),
        (np.float32(1.0), np.int64(0), {}, r"train_data is empty"),
        (np.zeros((5, 3)), np.zeros(4, int), {}, r"train_data is ragged: 5 inputs but 4 targets"),
        (
            np.array([[0.0, np.nan, 1.0], [np.inf, 0.0, 0.0]]),
            np.zeros(2, int),
            {},
            r"train_data inputs contain 2 NaN or infinite values",
        ),
        (np.zeros((2, 3)), np.array([0.5, np.nan]), {}, r"train_data targets contain 1 NaN"),
        (
            np.zeros((3, 3)),
            np.array([0, 1, 3]),
            {"num_classes": 3},
            r"labels in \[0, 3\], but the model has 3 outputs; labels must be in \[0, 2\]",
        ),
        (
            np.zeros((3, 3)),
            np.array([-1, 0, 1]),
            {"num_classes": 3},
            r"labels in \[-1, 1\]",
        ),
        (
            np.zeros((3, 3)),
            np.array([0.0, 1.0, 1.0]),
            {"num_classes": 2},
            r"targets must be integer class labels for cross-entropy, got dtype float64",
        ),
        (
            np.zeros((3, 5)),
            np.zeros(3, int),
            {"in_features": 4},
            r"inputs of shape \(5,\), but the model expects 4 features",
        ),
        (np.zeros(3), np.zeros(3, int), {"in_features": 1}, r"model expects 1 features"),
    ],
)
def test_check_arrays_names_the_problem(inputs, targets, kwargs, message):
    with pytest.raises(DataError, match=message):
        check_arrays(inputs, targets, name="train_data", **kwargs)


def test_check_arrays_accepts_good_data():
    check_arrays(np.zeros((3, 4)), np.array([0, 1, 2]), in_features=4, num_classes=3)
    check_arrays(np.zeros((3, 4)), np.array([0.5, 1.5, -2.0]), in_features=4)  # regression
    check_arrays(np.zeros((3, 4), np.int64), np.zeros(3, np.uint8), num_classes=1)


@pytest.mark.parametrize(
    ("train", "val", "message"),
    [
        (lambda x, y: (x[:, :2], y), None, "train_data has inputs of shape"),
        (lambda x, y: (x, y + 5), None, "train_data has labels in"),
        (lambda x, y: (x, y), lambda x, y: (x[:, :2], y), "val_data has inputs of shape"),
    ],
)
def test_trainer_checks_arrays_before_training(train, val, message):
    x = np.random.default_rng(0).normal(size=(8, 3)).astype("float32")
    y = (x[:, 0] > 0).astype("int64")
    trainer = Trainer(
        models.MLP((3, 4, 2)), backend="numpy", config=TrainerConfig(epochs=1, batch_size=4)
    )
    before = trainer.backend.state_dict()
    with pytest.raises(DataError, match=message):
        trainer.fit(train(x, y), None if val is None else val(x, y))
    assert trainer.state.step == 0
    for key, value in trainer.backend.state_dict().items():
        np.testing.assert_array_equal(value, before[key])


# -- IterableSource ---------------------------------------------------------------------------


def list_of_batches(count: int = 4) -> list[tuple[np.ndarray, np.ndarray]]:
    x, y = arrays(2 * count)
    return [(x[i : i + 2], y[i : i + 2]) for i in range(0, 2 * count, 2)]


def test_iterable_source_yields_the_loaders_batches_every_epoch():
    batches = list_of_batches()
    source = IterableSource(batches)
    assert len(source) == 4
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for epoch in (0, 1):
            assert targets_of(source.batches(epoch)) == targets_of(batches)


def test_iterable_source_warns_when_resuming_mid_epoch():
    batches = list_of_batches()
    source = IterableSource(batches)
    with pytest.warns(UserWarning, match=r"resuming a native loader at batch 2 of epoch 3"):
        resumed = list(source.batches(3, start=2))
    assert targets_of(resumed) == targets_of(batches[2:])


@pytest.mark.parametrize(
    "one_shot",
    [lambda b: iter(b), lambda b: (batch for batch in b), lambda b: map(tuple, b)],
    ids=["iter", "generator", "map"],
)
def test_iterable_source_rejects_one_shot_iterators(one_shot):
    with pytest.raises(DataError, match="one-shot iterator"):
        IterableSource(one_shot(list_of_batches()))


def test_iterable_source_without_len_has_zero_length():
    batches = list_of_batches()

    class Reiterable:
        def __iter__(self):
            return iter(batches)

    source = IterableSource(Reiterable())
    assert len(source) == 0
    assert targets_of(source.batches(0)) == targets_of(batches)


# -- as_batch_source --------------------------------------------------------------------------


def test_as_batch_source_wraps_a_tuple_of_arrays_in_an_array_loader():
    x, y = arrays(10)
    source = as_batch_source((x, y), batch_size=4, seed=7, shuffle=False)
    assert isinstance(source, ArrayLoader)
    assert (source.batch_size, source.seed, source.shuffle, source.drop_last) == (
        4,
        7,
        False,
        False,
    )
    assert len(source) == 3
    shuffled = as_batch_source((x, y), batch_size=4, seed=7, shuffle=True)
    np.testing.assert_array_equal(shuffled.order(2), ArrayLoader(x, y, 4, seed=7).order(2))


def test_as_batch_source_passes_a_loader_through_unchanged():
    loader = ArrayLoader(*arrays(10), batch_size=3, seed=1)
    assert as_batch_source(loader, batch_size=99, seed=5, shuffle=False) is loader


def test_as_batch_source_wraps_a_list_of_batches():
    batches = list_of_batches()
    source = as_batch_source(batches, batch_size=4, seed=0, shuffle=True)
    assert isinstance(source, IterableSource)
    assert source.iterable is batches


def test_as_batch_source_checks_a_tuple_of_arrays():
    with pytest.raises(DataError, match="ragged"):
        as_batch_source((np.zeros((4, 2)), np.zeros(3)), batch_size=2, seed=0, shuffle=True)


@pytest.mark.parametrize(
    "garbage",
    [42, None, object(), 3.5, "train.csv", b"bytes", {"x": 1}],
    ids=lambda value: type(value).__name__,  # stable across xdist workers, unlike repr(object())
)
def test_as_batch_source_refuses_garbage(garbage):
    with pytest.raises(DataError, match=f"cannot train on {type(garbage).__name__}"):
        as_batch_source(garbage, batch_size=4, seed=0, shuffle=True)


def test_as_batch_source_refuses_a_one_shot_iterator():
    with pytest.raises(DataError, match="one-shot"):
        as_batch_source(iter(list_of_batches()), batch_size=4, seed=0, shuffle=True)


def test_as_batch_source_refuses_a_bare_array():
    x, _ = arrays(8)
    with pytest.raises(DataError):
        as_batch_source(x, batch_size=4, seed=0, shuffle=True)


def test_as_batch_source_on_a_tuple_of_lists_is_not_two_batches():
    """``(inputs, targets)`` given as lists is one data set of 8 examples, as arrays would
    be, not a re-iterable of two batches (the inputs list and the targets list)."""
    x, y = arrays(8)
    source = as_batch_source((x.tolist(), y.tolist()), batch_size=4, seed=0, shuffle=False)
    assert isinstance(source, ArrayLoader)
    assert targets_of(source.batches(0)) == [[0, 1, 2, 3], [4, 5, 6, 7]]


def test_a_torch_data_loader_is_wrapped_as_a_native_loader():
    torch = pytest.importorskip("torch")
    from torch.utils.data import DataLoader, TensorDataset

    x, y = arrays(10)
    loader = DataLoader(TensorDataset(torch.from_numpy(x), torch.from_numpy(y)), batch_size=4)
    source = as_batch_source(loader, batch_size=99, seed=0, shuffle=True)
    assert isinstance(source, IterableSource) and source.exact_resume is False
    assert len(source) == 3
    assert [b.tolist() for _, b in source.batches(0)] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    with pytest.warns(UserWarning, match="batch 1 of epoch 0"):
        assert [b.tolist() for _, b in source.batches(0, start=1)] == [[4, 5, 6, 7], [8, 9]]


def test_the_shuffle_order_is_pinned_to_default_rng_of_seed_and_epoch():
    """The order is part of every checkpoint's meaning (a resume replays it), so it is
    pinned: ``default_rng([seed, epoch]).permutation(n)``, values recorded from numpy 2.x's
    PCG64 when the loader was written. ``[1, 0]`` and ``[0, 1]`` are different orders, which
    a seed derived as ``seed + epoch`` would merge."""
    x, y = arrays(10)
    shuffled = lambda seed, epoch: targets_of(  # noqa: E731
        ArrayLoader(x, y, batch_size=10, seed=seed).batches(epoch)
    )[0]
    assert shuffled(3, 2) == [7, 4, 1, 8, 6, 0, 2, 9, 3, 5]
    assert shuffled(1, 0) == [8, 4, 7, 0, 1, 2, 5, 9, 6, 3]
    assert shuffled(0, 1) == [9, 1, 3, 8, 7, 6, 0, 4, 2, 5]


def test_fit_reads_the_training_arrays_for_bad_values_once(monkeypatch):
    """The loader checks its arrays when built; the Trainer then checks only the model's fit."""
    from unitrain import data

    calls = []
    original = data.check_arrays
    monkeypatch.setattr(data, "check_arrays", lambda *a, **k: calls.append(k) or original(*a, **k))
    x = np.random.default_rng(0).normal(size=(12, 3)).astype("float32")
    y = np.arange(12) % 2
    Trainer(models.MLP((3, 2)), backend="numpy", config=TrainerConfig(epochs=1, batch_size=4)).fit(
        (x, y)
    )
    assert [call.get("name") for call in calls] == ["train_data"]
    with pytest.raises(DataError, match="labels in \\[0, 1\\], but the model has 1 outputs"):
        Trainer(models.MLP((3, 1)), backend="numpy").fit((x, y))
