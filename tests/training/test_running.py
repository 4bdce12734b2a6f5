"""The running training loss: sequential float64 sums, the same wherever reads fall."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from unitrain.training._running import RunningLoss


@given(
    losses=st.lists(st.floats(0, 10, width=32), min_size=1, max_size=60),
    reads=st.sets(st.integers(0, 60)),
)
def test_the_total_does_not_depend_on_where_it_is_read(losses, reads):
    once, often = RunningLoss(), RunningLoss()
    for i, loss in enumerate(losses):
        once.add(np.float32(loss), 32)
        often.add(np.float32(loss), 32)
        if i in reads:
            saved = often.total()
            often = RunningLoss()  # as a resumed run: restart from the saved total
            often.reset(saved, 32 * (i + 1))
    assert once.total() == often.total()
    assert once.mean() == often.mean()
    assert once.count == 32 * len(losses)


def test_vectors_of_multi_step_calls_and_batched_read_back():
    calls = []

    def to_host(values):
        calls.append(len(values))
        return [np.asarray(v) for v in values]

    running = RunningLoss(to_host)
    running.add(np.array([1.0, 2.0], np.float32), batch_size=10, steps=2)
    running.add(np.float32(4.0), batch_size=5)
    assert running.count == 25
    assert running.mean() == (10 + 20 + 20) / 25
    assert calls == [2]  # one batched read for everything pending
    assert np.isnan(RunningLoss().mean())


def test_pending_values_are_bounded():
    running = RunningLoss()
    for _ in range(RunningLoss.FOLD_EVERY + 3):
        running.add(np.float32(1.0), 1)
    assert len(running._values) == 3
    assert running.total() == RunningLoss.FOLD_EVERY + 3
