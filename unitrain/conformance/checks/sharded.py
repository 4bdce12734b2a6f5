"""sharded: workers that split the model, its gradients and optimizer state equal one worker.

Checked on a backend that offers a sharded engine (``sharded_strategy``, see
:mod:`unitrain.backends.sharded`) and a launcher; one whose engine cannot shard (it raises
``ShardingUnsupported``, as TensorFlow does) is skipped with its own reason. The experiment of
the ``data_parallel`` family (:mod:`unitrain.conformance._workers`) runs on two launched
workers with sharding asked for through the environment (``UNITRAIN_SHARD=1``), and:

- run ``a``'s final weights and optimizer state agree with one worker's within the ``step``
  tolerance, with the same epochs, steps, LRs and early-stopping decision; the workers'
  strategy reports two workers;
- run ``b`` resumes run ``a``'s checkpoint on as many sharded workers bit for bit, and one
  unsharded worker resumes it and ends as one worker throughout does (a resume across shard
  counts);
- run ``c`` (dropout) ends where two simulated workers do: each worker keys its masks by its
  place in the oracle's order;
- the sharded run's last checkpoint holds canonical full tensors that the numpy reference
  loads: its held-out loss there equals the backend's own (a hand-off to the reference).

A reduction that sums the workers' gradients where it should average them (pytorch#162338:
gloo's AVG summed inside ``fully_shard``) doubles every gradient on two workers and fails the
first comparison by orders of magnitude.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from unitrain import ConfigError
from unitrain.backends.sharded import SHARD_ENV, ShardedParallel, ShardingUnsupported
from unitrain.backends.strategy import LocalDeviceParallel
from unitrain.checkpoint import list_checkpoints, load_checkpoint
from unitrain.conformance import _workers
from unitrain.conformance._context import Context
from unitrain.conformance._registry import check
from unitrain.conformance.checks.data_parallel import WORKERS, against_one, launched
from unitrain.models import MLP


def _run_sharded(ctx: Context) -> tuple[Path, bool]:
    """The experiment on two launched sharded workers, or in one process sharded over two
    local devices; its directory for this dtype, and whether it was the one process."""
    if ctx.device != "cpu":
        ctx.skip("the kit launches sharded workers on the CPU only")
    factory = ctx.backend.factory
    if not isinstance(factory, ShardedParallel):
        ctx.skip("the backend offers no sharded engine (the optional sharded_strategy)")
    try:
        factory.sharded_strategy(WORKERS)  # type: ignore[attr-defined]
    except ShardingUnsupported as refusal:
        ctx.skip(str(refusal))
    except ConfigError:
        pass  # this process was not launched: the workers below are
    if isinstance(factory, LocalDeviceParallel):  # sharded over one process's devices
        environment = factory.local_devices_environment(WORKERS)
        arguments = [f"--local-devices={WORKERS}", "--shard"]
        label = f"one process sharded over {WORKERS} local devices"
        prefix = [sys.executable]
        return launched(ctx, "local-sharded", prefix, arguments, environment, label), True
    launcher: Any = getattr(factory, "launch_command", None)
    if launcher is None:
        ctx.skip("the backend offers no launch_command(workers) to start sharded workers")
    label = f"{WORKERS} sharded workers"
    return launched(ctx, "sharded", [*launcher(WORKERS)], [], {SHARD_ENV: "1"}, label), False


@check(
    "sharded",
    "sharded_workers_match_one_worker",
    requires=("data_parallel",),
    guards="a gradient reduction that sums where it should average inside the sharded engine "
    "(pytorch#162338), a clip norm or non-finite guard on one worker's shard, a checkpoint of "
    "one worker's shards, a resume that depends on the shard count",
)
def sharded_workers_match_one_worker(ctx: Context) -> None:
    """2 sharded workers equal 1 worker; resume on 2 and on 1; the reference loads it."""
    sharded, local = _run_sharded(ctx)
    factory, single = ctx.backend.factory, ctx.path("single")
    _workers.experiment(factory, ctx.dtype, single, strategy=1, local_devices=local)
    spread = f"{WORKERS} sharded {'devices' if local else 'workers'}"
    outcome, reference, _ = against_one(ctx, sharded, single, spread, "1 with the global batch")
    ctx.require_equal("workers that took part", outcome["world_size"], 1 if local else WORKERS)

    checkpoint = _workers.resume_point(sharded / "a")
    batch = _workers.LOCAL_BATCH if local else _workers.BATCH
    one = _workers.train(factory, ctx.dtype, ctx.path("one"), 1, resume=checkpoint, batch=batch)
    ctx.compare(
        f"{spread}' checkpoint resumed unsharded vs 1 throughout",
        one.backend.state_dict(),
        reference,
        "step",
    )
    if not local:  # one process over devices may draw one worker's masks (see _workers)
        state, _ = _workers.read_result(sharded / "c")
        oracle = _workers.train(
            factory, ctx.dtype, ctx.path("simulated"), WORKERS, dropout=_workers.DROPOUT
        )
        ctx.compare(
            f"final state with dropout {_workers.DROPOUT}, {spread} vs 2 simulated workers",
            state,
            oracle.backend.state_dict(),
            "step",
        )
    _hand_off_to_reference(ctx, sharded / "a", one.backend)


def _hand_off_to_reference(ctx: Context, run: Path, backend: Any) -> None:
    """The run's last checkpoint in ``backend`` (unsharded) and in the numpy reference: the
    same held-out loss."""
    saved = load_checkpoint(list_checkpoints(run / "checkpoints")[-1])
    model = MLP((6, 16, 3), activation="tanh")
    reference = ctx.reference(model, dtype=ctx.dtype if ctx.dtype != "bfloat16" else "float32")
    _, val = _workers.data(ctx.dtype)
    losses = []
    for party in (backend, reference):
        state = dict(party.state_dict())
        state.update({f"model.{name}": value for name, value in saved.model.items()})
        party.load_state_dict(state)
        losses.append(float(party.evaluate(val)["loss"]))
    mine, reference_loss = losses
    what = "held-out loss of the sharded checkpoint, reference vs backend"
    ctx.compare(what, reference_loss, mine, "evaluate")
