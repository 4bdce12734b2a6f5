"""The default recipe, with worker 1 SIGKILLed twice in a torchrun job.

A test of ``torchrun --max-restarts=3``: worker 1 dies at step 60 and again at step 120 (each
after a checkpoint; a marker file in ``--out`` records each kill, so a restart that failed
for another reason does not skip one). ``UNITRAIN_TEST_NO_KILL=1`` gives the uninterrupted
run to compare with.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

from unitrain import callbacks
from unitrain.recipes import Recipe, digits

KILL_AT = (60, 120)


class KillWorker1(callbacks.Callback):
    def on_batch_end(self, trainer, batch, logs) -> None:
        step = trainer.state.step
        if os.environ.get("RANK") != "1" or step not in KILL_AT:
            return
        marker = Path(trainer.config.checkpoint_dir).parent / f"killed-at-{step}"
        if not marker.exists():
            marker.touch()
            os.kill(os.getpid(), signal.SIGKILL)


def recipe(config=None) -> Recipe:
    made = digits.recipe(config)
    if not os.environ.get("UNITRAIN_TEST_NO_KILL"):
        made.callbacks.append(KillWorker1())
    return made
