"""Profile one method on one workload with cProfile, pinned like the benchmark children.

    python benchmarks/profile_step.py jax/unitrain W2 [--epochs 20] [--top 25] [--sort tottime]

Warm-up epochs run before the profiler starts, so compilation is not in the profile. The
report gives microseconds per training step for each function, which is what the
benchmark table compares; cProfile's own overhead inflates Python-heavy code, so compare a
unitrain profile with the native loop's profile of the same workload, not with the table.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import sys
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path[0] = str(Path(__file__).resolve().parents[1])  # the root, not benchmarks/


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("method")
    parser.add_argument("workload")
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--sort", default="tottime", choices=("tottime", "cumulative"))
    args = parser.parse_args()

    from benchmarks._worker import pin_threads
    from benchmarks.methods import METHODS, train
    from benchmarks.workloads import WORKLOADS

    method, workload = METHODS[args.method], WORKLOADS[args.workload]
    pin_threads(method.backend)
    profiler = cProfile.Profile()

    class Gate:
        epochs = args.warmup + args.epochs
        done = 0
        started = 0.0

        def epoch_end(self, loss: float | None) -> None:
            self.done += 1
            if self.done == args.warmup:
                self.started = time.perf_counter()
                profiler.enable()
            elif self.done == self.epochs:
                profiler.disable()
                self.seconds = time.perf_counter() - self.started

    gate = Gate()
    train(method, workload, gate)
    steps = args.epochs * workload.steps_per_epoch
    print(f"{args.method} {args.workload}: {gate.seconds / steps * 1e6:.1f} µs/step under cProfile")
    stats = pstats.Stats(profiler)
    stats.sort_stats(args.sort)
    width = 75
    print(f"{'µs/step self':>12} {'µs/step cum':>12} {'calls/step':>10}  function")
    rows = sorted(
        stats.stats.items(),  # type: ignore[attr-defined]
        key=lambda item: item[1][2 if args.sort == "tottime" else 3],
        reverse=True,
    )
    for (filename, line, name), (_, calls, self_time, cumulative, _) in rows[: args.top]:
        where = f"{Path(filename).name}:{line}({name})" if line else name
        print(
            f"{self_time / steps * 1e6:12.1f} {cumulative / steps * 1e6:12.1f} "
            f"{calls / steps:10.2f}  {where[-width:]}"
        )


if __name__ == "__main__":
    main()
