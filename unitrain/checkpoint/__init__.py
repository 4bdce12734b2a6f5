"""Checkpoint storage: one directory per checkpoint, written atomically, verified on load.

A checkpoint directory holds exactly five files:

- ``model.safetensors``, ``optimizer.safetensors`` and ``callbacks.safetensors``: flat
  ``name -> numpy array`` maps in safetensors format (the last two may be empty; the third
  holds arrays from callback states, such as early stopping's best weights);
- ``trainer.json``: the trainer's own state (int ``step`` and ``epoch`` plus whatever else the
  caller stores) with ``"format_version"`` added;
- ``manifest.json``: the XXH3-64 digest and size of the other four files (SHA-256 in
  checkpoints of format version 1, which still load); it detects damage, it is not a
  signature (see ``unitrain/checkpoint/_digest.py`` for why XXH3-64).

A sharded run's checkpoint adds each worker's rows of the sharded tensors, in files of its
own, and ``shards.json`` (see :mod:`unitrain.checkpoint._shards`); it loads whole, as any other.

Tensors stream between the arrays' memory and the files, digested chunk by chunk as they
pass, so saving and loading copy each byte once. This layer is pure storage and knows nothing
of the Trainer. Nothing here uses pickle, and every problem raises
:class:`~unitrain.CheckpointError` with a message naming the file.
"""

from unitrain.checkpoint._discovery import checkpoint_run, list_checkpoints, resolve_checkpoint
from unitrain.checkpoint._format import FORMAT_VERSION, CheckpointWarning
from unitrain.checkpoint._read import Checkpoint, load_checkpoint, verify_checkpoint
from unitrain.checkpoint._remove import remove_checkpoint, remove_leftovers
from unitrain.checkpoint._shards import RowShard
from unitrain.checkpoint._write import CheckpointWriter, checkpoint_name, save_checkpoint

__all__ = [
    "FORMAT_VERSION",
    "Checkpoint",
    "CheckpointWarning",
    "CheckpointWriter",
    "RowShard",
    "checkpoint_name",
    "checkpoint_run",
    "list_checkpoints",
    "load_checkpoint",
    "remove_checkpoint",
    "remove_leftovers",
    "resolve_checkpoint",
    "save_checkpoint",
    "verify_checkpoint",
]
