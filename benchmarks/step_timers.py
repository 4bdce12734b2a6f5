"""Where a data-parallel step's time goes: forward and backward, the all-reduce, the update.

``python benchmarks/data_parallel.py throughput`` attaches :class:`StepTimers` to a W1 run
on one and on two workers. Each part is timed until its work is done (JAX's asynchronous
calls are waited for), so the parts add up without overlapping; that slows JAX a little, which
is why the throughput figures come from runs without timers.
"""

from __future__ import annotations

import collections
import time
from typing import Any

__all__ = ["StepTimers"]


class StepTimers:
    """Seconds spent in each part of the steps, each part timed until its work is done."""

    def __init__(self, backend: Any) -> None:
        self.seconds: collections.Counter[str] = collections.Counter()
        self._jax = backend.name == "jax"
        self._reduced_in = "step"  # where the engine's all-reduce runs: step, or backward (DDP)

    def _wait(self, value: Any) -> None:
        if self._jax:  # JAX dispatches asynchronously; the others return when done
            import jax

            jax.block_until_ready(value)

    def timed(self, part: str, function: Any) -> Any:
        """``function``, adding its seconds (inputs ready first, outputs done) to ``part``."""

        def run(*args: Any) -> Any:
            self._wait(args)
            started = time.perf_counter()
            result = function(*args)
            self._wait(result)
            self.seconds[part] += time.perf_counter() - started
            return result

        return run

    def attach(self, trainer: Any) -> None:
        """Time the backend's forward, backward and step, and the all-reduce within them."""
        backend, strategy = trainer.backend, trainer.strategy
        for part in ("forward", "backward", "step", "train_step"):  # train_step: 1 worker
            if hasattr(backend, part):
                setattr(backend, part, self.timed(part, getattr(backend, part)))
        if strategy.world_size == 1:
            return
        if backend.name == "torch":  # DDP all-reduces during backward, through a comm hook
            self._reduced_in = "backward"
            backend.distribute(self._timed_ddp, strategy.world_size, strategy.rank)
        else:  # JAX and TensorFlow sum the gradients in step, through this hook
            timed = self.timed("all-reduce", strategy.sum_gradients)
            backend.distribute(timed, strategy.world_size, strategy.rank)

    def _timed_ddp(self, module: Any) -> Any:
        import torch
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel

        def all_reduce(state, bucket):  # type: ignore[no-untyped-def]
            # DDP checks a hook's annotations against its own types: none given here.
            # The default hook's work (average the bucket over workers), waited for here.
            started = time.perf_counter()
            tensor = bucket.buffer().div_(dist.get_world_size())
            dist.all_reduce(tensor)
            self.seconds["all-reduce"] += time.perf_counter() - started
            future: Any = torch.futures.Future()
            future.set_result(tensor)
            return future

        ddp = DistributedDataParallel(module)
        ddp.register_comm_hook(None, all_reduce)
        return ddp

    def report(self, total: float, steps: int) -> dict[str, float]:
        """Milliseconds per step: forward+backward and update without the all-reduce, the
        all-reduce, and the rest of ``total`` (the Trainer loop, slicing, the data)."""
        reduce = self.seconds["all-reduce"]
        parts = {
            "forward+backward": self.seconds["forward"] + self.seconds["backward"],
            "all-reduce": reduce,
            "update": self.seconds["step"],
            "fused step": self.seconds["train_step"],  # one worker: all three in one call
        }
        parts["forward+backward" if self._reduced_in == "backward" else "update"] -= reduce
        parts["trainer and data"] = total - sum(parts.values())
        return {part: round(1000 * seconds / steps, 3) for part, seconds in parts.items()}
