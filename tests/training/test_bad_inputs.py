"""The catalogue of bad input: each mistake, the error or warning it gets, and its message.

Every entry below makes one mistake through the public API and is run by
:func:`test_catalogue_entry`, which checks the error class, that the message a user sees is
the one documented in ``docs/errors.md`` (temporary paths, pids and digests normalised), and,
for mistakes that can be caught before training, that not a single update ran (fail fast).
Many entries repeat, through the full public path, a case tested in detail elsewhere; the
docs link both.
"""

from __future__ import annotations

import dataclasses
import errno
import os
import re
import socket
import subprocess
import sys
import textwrap
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from _backends import backends

from unitrain import (
    ArrayLoader,
    BackendNotFoundError,
    CheckpointError,
    ConfigError,
    DataError,
    NonFiniteError,
    RunFolderError,
    Trainer,
    TrainerConfig,
    callbacks,
    models,
    optim,
    schedules,
)
from unitrain.checkpoint import _write, load_checkpoint, save_checkpoint
from unitrain.recipes import load_recipe
from unitrain.training._lock import DirectoryLockedError

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "errors.md"


@dataclasses.dataclass(frozen=True)
class Entry:
    """One catalogue entry: what goes wrong, what is raised (or warned), what to do."""

    section: str
    mistake: str
    raises: type[BaseException] | type[Warning]
    action: Callable[[Path], Any]
    fix: str
    fails_fast: bool = True  # no update may run before the error


CATALOGUE: dict[str, Entry] = {}


def entry(section: str, mistake: str, raises: Any, fix: str, fails_fast: bool = True) -> Any:
    def register(action: Callable[[Path], Any]) -> Callable[[Path], Any]:
        CATALOGUE[action.__name__] = Entry(section, mistake, raises, action, fix, fails_fast)
        return action

    return register


# -- helpers -------------------------------------------------------------------------------------


class CountUpdates(callbacks.Callback):
    """Counts updates; only on_batch_end, so monitors can still know the logged metrics."""

    state_key = "CountUpdates"

    def __init__(self) -> None:
        self.updates = 0

    def on_batch_end(self, trainer, batch, logs):
        self.updates += 1


TRAINERS: list[Trainer] = []  # every Trainer an entry built, to check that none trained


def trainer(*hooks: Any, model=None, optimizer=None, schedule=None, **config: Any) -> Trainer:
    config.setdefault("epochs", 2)
    config.setdefault("batch_size", 8)
    built = Trainer(
        model or models.MLP((4, 8, 3)),
        backend=config.pop("backend", "numpy"),
        optimizer=optimizer,
        schedule=schedule,
        callbacks=[CountUpdates(), *hooks],
        config=TrainerConfig(**config),
    )
    TRAINERS.append(built)
    return built


def arrays(n: int = 32, features: int = 4, classes: int = 3) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    return rng.normal(size=(n, features)).astype(np.float32), rng.integers(0, classes, n)


def checkpoint_of(tmp: Path, epochs: int = 1, **config: Any) -> Path:
    """Train a tiny run with a checkpoint per epoch; return the last checkpoint."""
    run = trainer(callbacks.ModelCheckpoint(tmp / "ckpt"), epochs=epochs, **config)
    run.fit(arrays())
    TRAINERS.remove(run)  # this one was meant to train
    return run.callbacks.callbacks[-1].last_saved


# -- backends and devices ------------------------------------------------------------------------

SECTION = "Backends and devices"


@entry(SECTION, "Unknown backend name", BackendNotFoundError, "Use one of the listed names.")
def unknown_backend(tmp: Path) -> None:
    trainer(backend="pytorch")


@entry(
    SECTION,
    "Backend given as a module path that does not import",
    BackendNotFoundError,
    "Check the `package.module:Class` path and that the package is installed.",
)
def unimportable_backend(tmp: Path) -> None:
    trainer(backend="no_such_package.backend:Backend")


def _missing_framework() -> str:
    code = textwrap.dedent(
        """
        import sys
        sys.modules["torch"] = None  # as if torch were not installed
        from unitrain import MissingFrameworkError, Trainer, models
        try:
            Trainer(models.MLP((4, 8, 3)), backend="torch")
        except MissingFrameworkError as error:
            print(error)
        """
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return done.stdout.strip()


class MissingFramework(Exception):
    """Stands for MissingFrameworkError raised in a subprocess (it needs torch hidden)."""


@entry(
    SECTION,
    "Framework of the backend not installed",
    MissingFramework,
    "Run the `pip install` command in the message.",
)
def missing_framework(tmp: Path) -> None:
    raise MissingFramework(_missing_framework())


@entry(SECTION, "Device that does not exist", ConfigError, "Use 'cpu', 'gpu' or 'auto'.")
def unknown_device(tmp: Path) -> None:
    trainer(device="tpu")


@entry(
    SECTION,
    "Device 'gpu' for the numpy backend",
    ConfigError,
    "Use device='cpu' (or 'auto'), or a backend that runs on GPUs.",
)
def numpy_on_gpu(tmp: Path) -> None:
    trainer(device="gpu")


@entry(
    SECTION,
    "A dtype the backend cannot train in",
    ConfigError,
    "Use one of the dtypes listed; each backend lists its own.",
)
def unsupported_dtype(tmp: Path) -> None:
    trainer(dtype="bfloat16")


@entry(
    SECTION,
    "A random generator that does not exist",
    ConfigError,
    "Use 'portable' (the same dropout masks on every backend) or 'native'.",
)
def unknown_random_generator(tmp: Path) -> None:
    trainer(random="philox")


# -- data ---------------------------------------------------------------------------------------

SECTION = "Data"


@entry(SECTION, "Empty data set", DataError, "Pass at least one example.")
def empty_data(tmp: Path) -> None:
    trainer().fit((np.zeros((0, 4), np.float32), np.zeros(0, np.int64)))


@entry(SECTION, "Ragged data (inputs and targets of different lengths)", DataError, "Align them.")
def ragged_data(tmp: Path) -> None:
    x, y = arrays()
    trainer().fit((x, y[:-3]))


@entry(SECTION, "Feature size that does not match the model", DataError, "Fix the data or model.")
def feature_mismatch(tmp: Path) -> None:
    trainer().fit(arrays(features=5))


@entry(SECTION, "Label out of range", DataError, "Relabel, or give the model more outputs.")
def label_out_of_range(tmp: Path) -> None:
    x, y = arrays()
    y[3] = 7
    trainer().fit((x, y))


def _conv_net() -> Any:
    return models.Sequential(
        [models.Conv2d(1, 2, 3, padding=1), models.Flatten(), models.Linear(32, 3)]
    )


@entry(
    SECTION,
    "Label out of range (any portable model: a conv net, label -1)",
    DataError,
    "Relabel, or give the model more outputs.",
)
def conv_label_negative(tmp: Path) -> None:
    x = np.zeros((8, 4, 4, 1), np.float32)
    trainer(model=_conv_net()).fit((x, np.array([0, 1, 2, -1, 0, 1, 2, 0])))


@entry(
    SECTION,
    "One label per example for a model with one output per position",
    DataError,
    "Pass one label per position.",
)
def sequence_labels_per_example(tmp: Path) -> None:
    sequence = models.Sequential(
        [models.Embedding(11, 8), models.PositionalEmbedding(6, 8), models.Linear(8, 5)]
    )
    trainer(model=sequence).fit((np.zeros((8, 6), np.int64), np.zeros(8, np.int64)))


@entry(
    SECTION,
    "mse targets that are class labels",
    DataError,
    "Use `loss='cross_entropy'`, or one-hot float targets of the outputs' shape.",
)
def mse_class_labels(tmp: Path) -> None:
    x = np.zeros((8, 4, 4, 1), np.float32)
    Trainer(_conv_net(), backend="numpy", loss="mse", config=TrainerConfig(batch_size=8)).fit(
        (x, np.arange(8) % 3)
    )


@entry(SECTION, "Float labels for cross-entropy", DataError, "Pass integer class labels.")
def float_labels(tmp: Path) -> None:
    x, y = arrays()
    trainer().fit((x, y.astype(np.float32)))


@entry(SECTION, "NaN or Inf in the inputs", DataError, "Clean or impute the data.")
def nan_inputs(tmp: Path) -> None:
    x, y = arrays()
    x[2, 1] = np.nan
    x[5, 0] = np.inf
    trainer().fit((x, y))


@entry(SECTION, "NaN in the validation data", DataError, "Clean the validation data.")
def nan_validation(tmp: Path) -> None:
    x, y = arrays()
    bad = x.copy()
    bad[0, 0] = np.nan
    trainer().fit((x, y), (bad, y))


@entry(
    SECTION,
    "Native loader whose first batch has the wrong feature size",
    DataError,
    "Fix the loader; only its first batch is checked.",
)
def loader_feature_mismatch(tmp: Path) -> None:
    x, y = arrays(features=6)
    trainer().fit([(x[:8], y[:8]), (x[8:], y[8:])])


@entry(SECTION, "Native loader that yields nothing", DataError, "Pass a loader with data.")
def empty_loader(tmp: Path) -> None:
    trainer().fit([])


@entry(SECTION, "One array without targets", DataError, "Pass `(inputs, targets)`.")
def inputs_without_targets(tmp: Path) -> None:
    trainer().fit(arrays()[0])


@entry(SECTION, "A one-shot iterator", DataError, "Pass a re-iterable or an ArrayLoader.")
def one_shot_iterator(tmp: Path) -> None:
    trainer().fit(iter([arrays()]))


# -- hyperparameters ------------------------------------------------------------------------------

SECTION = "Hyperparameters"


@entry(SECTION, "Negative momentum", ConfigError, "Use a momentum in [0, 1).")
def negative_momentum(tmp: Path) -> None:
    optim.SGD(momentum=-0.9)


@entry(SECTION, "NaN weight decay", ConfigError, "Use a finite weight decay >= 0.")
def nan_weight_decay(tmp: Path) -> None:
    optim.AdamW(weight_decay=float("nan"))


@entry(SECTION, "Negative Adam epsilon", ConfigError, "Use a small positive epsilon.")
def negative_eps(tmp: Path) -> None:
    optim.Adam(eps=-1e-8)


@entry(SECTION, "Negative learning rate", ConfigError, "Use a learning rate >= 0.")
def negative_lr(tmp: Path) -> None:
    schedules.Constant(-0.1)


@entry(SECTION, "NaN learning rate", ConfigError, "Use a finite learning rate.")
def nan_lr(tmp: Path) -> None:
    schedules.CosineDecay(float("nan"), 100)


@entry(SECTION, "Learning rate given as a number", ConfigError, "Wrap it: `Constant(lr)`.")
def bare_lr(tmp: Path) -> None:
    Trainer(models.MLP((4, 8, 3)), backend="numpy", schedule=0.1)  # type: ignore[arg-type]


@entry(SECTION, "Zero epochs", ConfigError, "Use epochs >= 1.")
def zero_epochs(tmp: Path) -> None:
    TrainerConfig(epochs=0)


@entry(SECTION, "NaN gradient clipping norm", ConfigError, "Use a positive norm, or None.")
def nan_clip(tmp: Path) -> None:
    TrainerConfig(grad_clip_norm=float("nan"))


@entry(SECTION, "Negative batch size", ConfigError, "Use a batch size >= 1.")
def negative_batch_size(tmp: Path) -> None:
    TrainerConfig(batch_size=-32)


@entry(SECTION, "checkpoint_dir that is not a path", ConfigError, "Pass a path or None.")
def bad_checkpoint_dir(tmp: Path) -> None:
    TrainerConfig(checkpoint_dir=5)  # type: ignore[arg-type]


@entry(SECTION, "Negative early-stopping patience", ConfigError, "Use patience >= 0.")
def negative_patience(tmp: Path) -> None:
    callbacks.EarlyStopping(patience=-1)


@entry(SECTION, "Plateau factor above 1", ConfigError, "Use a factor in (0, 1).")
def plateau_factor(tmp: Path) -> None:
    callbacks.ReduceLROnPlateau(factor=1.5)


# -- settings that contradict each other -----------------------------------------------------------

SECTION = "Settings that contradict each other"


@entry(
    SECTION,
    "Warmup longer than the whole run",
    ConfigError,
    "Give warmup_steps in updates, shorten it, or train longer (see the rule below).",
)
def warmup_longer_than_run(tmp: Path) -> None:
    schedule = schedules.Warmup(schedules.CosineDecay(0.1, 1000), warmup_steps=500)
    trainer(schedule=schedule, epochs=3).fit(arrays())  # 3 epochs x 4 updates


@entry(
    SECTION,
    "Monitored metric with a typo (mode='auto' cannot tell its direction)",
    ConfigError,
    "Fix the name (the closest common one is suggested) or pass `mode`.",
)
def monitor_typo(tmp: Path) -> None:
    callbacks.EarlyStopping("val_los")


@entry(
    SECTION,
    "Monitored metric with a typo (checked when training begins)",
    ConfigError,
    "Use a name from the list; the closest is suggested.",
)
def monitor_typo_with_mode(tmp: Path) -> None:
    trainer(callbacks.EarlyStopping("val_los", mode="min")).fit(arrays(), arrays())


@entry(
    SECTION,
    "Monitored metric the run never logs (ModelCheckpoint)",
    ConfigError,
    "Use a name from the list.",
)
def monitor_unknown(tmp: Path) -> None:
    trainer(callbacks.ModelCheckpoint(tmp, monitor="val_acc")).fit(arrays(), arrays())


@entry(
    SECTION,
    "Validation metric monitored without validation data",
    ConfigError,
    "Pass `val_data` to `fit`, or monitor the training metric.",
)
def monitor_without_validation(tmp: Path) -> None:
    trainer(callbacks.ReduceLROnPlateau("val_loss")).fit(arrays())


@entry(SECTION, "ModelCheckpoint with no directory", ConfigError, "Pass dirpath or checkpoint_dir.")
def checkpoint_without_directory(tmp: Path) -> None:
    trainer(callbacks.ModelCheckpoint()).fit(arrays())


@entry(SECTION, "Two callbacks with one state key", ConfigError, "Give them distinct state_key.")
def duplicate_state_keys(tmp: Path) -> None:
    trainer(callbacks.EarlyStopping("loss"), callbacks.EarlyStopping("loss", patience=3))


@entry(SECTION, "resume='latest' without checkpoint_dir", ConfigError, "Set checkpoint_dir.")
def latest_without_directory(tmp: Path) -> None:
    trainer().fit(arrays(), resume="latest")


@entry(SECTION, "resume='auto' without checkpoint_dir", ConfigError, "Set checkpoint_dir.")
def auto_without_directory(tmp: Path) -> None:
    trainer().fit(arrays(), resume="auto")


@entry(
    SECTION,
    "A preemption signal that cannot be handled",
    ConfigError,
    "Name signals such as 'SIGTERM', 'SIGUSR1', 'SIGUSR2'.",
)
def bad_preemption_signal(tmp: Path) -> None:
    trainer(preemption_signals=["SIGKILL"])


# -- resuming ------------------------------------------------------------------------------------

SECTION = "Resuming"


@entry(SECTION, "Checkpoint path that does not exist", CheckpointError, "Check the path.")
def resume_missing(tmp: Path) -> None:
    trainer().fit(arrays(), resume=tmp / "nothing")


@entry(SECTION, "Checkpoint of another model", CheckpointError, "Resume with the same model.")
def resume_other_model(tmp: Path) -> None:
    path = checkpoint_of(tmp)
    trainer(model=models.MLP((4, 16, 3))).fit(arrays(), resume=path)


@entry(SECTION, "Checkpoint of another optimizer", CheckpointError, "Resume with the same one.")
def resume_other_optimizer(tmp: Path) -> None:
    path = checkpoint_of(tmp)
    trainer(optimizer=optim.Adam()).fit(arrays(), resume=path)


@entry(
    SECTION,
    "Same optimizer or trajectory settings with other values",
    UserWarning,
    "Intended (e.g. fine-tuning)? Then ignore it; otherwise resume with the saved settings.",
)
def resume_other_settings(tmp: Path) -> None:
    path = checkpoint_of(tmp)
    trainer(optimizer=optim.SGD(weight_decay=1e-4), seed=3).fit(arrays(), resume=path)
    TRAINERS.pop()  # it trains on, by design


@entry(
    SECTION,
    "Checkpoint in another dtype",
    CheckpointError,
    "Resume with `TrainerConfig(dtype=...)` as saved.",
)
def resume_other_dtype(tmp: Path) -> None:
    path = checkpoint_of(tmp)
    trainer(dtype="float64").fit(arrays(), resume=path)


@entry(
    SECTION,
    "Mid-epoch checkpoint resumed with other data or batch size",
    CheckpointError,
    "Resume with the data and batch_size of the run.",
)
def resume_other_batching(tmp: Path) -> None:
    run = trainer(callbacks.ModelCheckpoint(tmp, every_n_steps=3, every_n_epochs=None))
    run.fit(arrays())  # 4 updates per epoch; a checkpoint at step 3 is at batch 3
    TRAINERS.remove(run)
    trainer(batch_size=16).fit(arrays(), resume=tmp / "epoch=0001-step=000003")


@entry(
    SECTION,
    "Checkpoint whose weights hold NaN",
    CheckpointError,
    "Resume from an earlier checkpoint.",
)
def resume_nan_weights(tmp: Path) -> None:
    path = checkpoint_of(tmp)
    saved = load_checkpoint(path)
    saved.model["layers.0.weight"][0, 0] = np.nan
    trainer_state = {k: v for k, v in saved.trainer.items() if k != "format_version"}
    save_checkpoint(path, model=saved.model, optimizer=saved.optimizer, trainer=trainer_state,
                    callbacks=saved.callbacks)  # fmt: skip
    trainer().fit(arrays(), resume=path)


@entry(SECTION, "Damaged checkpoint file", CheckpointError, "Use an earlier checkpoint.")
def resume_damaged(tmp: Path) -> None:
    path = checkpoint_of(tmp)
    with open(path / "optimizer.safetensors", "r+b") as handle:
        handle.seek(-1, os.SEEK_END)
        handle.write(b"\x7f")
    trainer().fit(arrays(), resume=path)


@entry(
    SECTION,
    "resume='latest' where every checkpoint is damaged",
    CheckpointError,
    "Restore a checkpoint, or start without resuming.",
)
def resume_latest_all_damaged(tmp: Path) -> None:
    path = checkpoint_of(tmp)
    (path / "trainer.json").write_text("{}")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the skipped checkpoint's warning
        trainer(checkpoint_dir=str(tmp / "ckpt")).fit(arrays(), resume="latest")


@entry(
    SECTION,
    "Resuming a run that had finished",
    UserWarning,
    "Raise `epochs` to train further; the Trainer holds the final state.",
)
def resume_finished(tmp: Path) -> None:
    path = checkpoint_of(tmp, epochs=2)
    trainer().fit(arrays(), resume=path)


@entry(
    SECTION,
    "Resuming a run that had stopped early",
    UserWarning,
    "The stop is part of the run; start a new run to train on.",
)
def resume_stopped(tmp: Path) -> None:
    stop = callbacks.EarlyStopping("loss", min_delta=100.0)  # never improves by 100
    run = trainer(stop, callbacks.ModelCheckpoint(tmp), epochs=4)
    run.fit(arrays())  # stops after epoch 1 of 4
    TRAINERS.remove(run)
    trainer(callbacks.EarlyStopping("loss", min_delta=100.0), epochs=5).fit(
        arrays(), resume=run.callbacks.callbacks[-1].last_saved
    )


# -- running ------------------------------------------------------------------------------------

SECTION = "While training"


@entry(
    SECTION,
    "Checkpoint directory in use by another run",
    DirectoryLockedError,
    "Wait for it, stop it, or use another directory; delete a dead run's lock file.",
)
def directory_in_use(tmp: Path) -> None:
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        lock = tmp / ".unitrain.lock"
        lock.write_text(
            f'{{"pid": {other.pid}, "host": "{socket.gethostname()}", "started": 0, '
            f'"process_start": null}}'
        )
        trainer(checkpoint_dir=str(tmp)).fit(arrays())
    finally:
        other.kill()
        other.wait()


@entry(
    SECTION,
    "A fresh run in a folder that holds another run's checkpoints",
    CheckpointError,
    "Continue that run with `resume='auto'`, use another folder, or pass "
    "`archive_existing=True` (`--archive-existing`).",
)
def fresh_run_in_used_folder(tmp: Path) -> None:
    first = checkpoint_of(tmp)
    trainer(checkpoint_dir=str(first.parent)).fit(arrays())


@entry(
    SECTION,
    "Disk full (or any write error) while saving a checkpoint",
    CheckpointError,
    "Free space; the previous checkpoints are intact, resume from them.",
    fails_fast=False,
)
def disk_full(tmp: Path) -> None:
    def full(file: Path, data: bytes, **options: Any) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    original, _write._write_file = _write._write_file, full
    try:
        trainer(callbacks.ModelCheckpoint(tmp)).fit(arrays())
    finally:
        _write._write_file = original


class NaNAtStep3:
    exact_resume = True

    def __len__(self) -> int:
        return 4

    def batches(self, epoch, start=0):
        x, y = arrays()
        for index in range(start, 4):
            xb = x[index * 8 : (index + 1) * 8].copy()
            if index == 2:
                xb[0, 0] = np.nan
            yield xb, y[index * 8 : (index + 1) * 8]


@entry(
    SECTION,
    "NaN or Inf loss or gradient (nonfinite='raise')",
    NonFiniteError,
    "Lower the LR, clip gradients, check the data, or choose another `nonfinite` policy.",
    fails_fast=False,
)
def nonfinite_loss(tmp: Path) -> None:
    trainer(log_every_n_steps=1).fit(NaNAtStep3())


@entry(
    SECTION,
    "Something other than a file at the lock's name (a FIFO, a symlink)",
    DirectoryLockedError,
    "Remove it, unless something of yours needs it there.",
)
def lock_not_a_file(tmp: Path) -> None:
    os.mkfifo(tmp / ".unitrain.lock")
    trainer(checkpoint_dir=str(tmp)).fit(arrays())


@entry(
    SECTION,
    "A run lock timing variable that is not a number of seconds",
    ConfigError,
    "Set a positive number, or unset the variable.",
)
def lock_heartbeat_variable(tmp: Path) -> None:
    os.environ["UNITRAIN_LOCK_HEARTBEAT_SECONDS"] = "ten"
    try:
        trainer(checkpoint_dir=str(tmp)).fit(arrays())
    finally:
        del os.environ["UNITRAIN_LOCK_HEARTBEAT_SECONDS"]


@entry(
    SECTION,
    "A run file that is a symlink (metrics.jsonl pointing outside the run)",
    RunFolderError,
    "Delete the link, or put a copy of the file in its place.",
)
def metrics_file_symlink(tmp: Path) -> None:
    outside = tmp / "outside.txt"
    outside.write_text("not the run's\n")
    (tmp / "run").mkdir()
    os.symlink(outside, tmp / "run" / "metrics.jsonl")
    trainer(callbacks.JSONLLogger(tmp / "run" / "metrics.jsonl")).fit(arrays())


@entry(
    SECTION,
    "A run file that is a FIFO, a device or a folder",
    RunFolderError,
    "Move it away, or give the run another folder.",
)
def metrics_file_fifo(tmp: Path) -> None:
    os.mkfifo(tmp / "metrics.jsonl")
    trainer(callbacks.JSONLLogger(tmp / "metrics.jsonl")).fit(arrays())


@entry(
    SECTION,
    "A run folder that cannot be written (read-only, no permission, full)",
    RunFolderError,
    "Give the run a writable folder with free space.",
)
def run_folder_read_only(tmp: Path) -> None:
    real_open = os.open

    def read_only(path: Any, flags: int, *args: Any, **kwargs: Any) -> int:
        if Path(os.fsdecode(path)).parent == tmp and flags & (os.O_WRONLY | os.O_RDWR):
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), os.fsdecode(path))
        return real_open(path, flags, *args, **kwargs)

    os.open = read_only  # type: ignore[assignment]
    try:
        trainer(callbacks.JSONLLogger(tmp / "metrics.jsonl")).fit(arrays())
    finally:
        os.open = real_open


# -- recipes ---------------------------------------------------------------------------------------

SECTION = "Recipes"


@entry(
    SECTION,
    "A TOML recipe or --set naming a 'module:attr' type (code)",
    ConfigError,
    "Pass `--allow-imports` if you trust that code, register the class as an entry point, or "
    "write a Python recipe.",
)
def recipe_imports_code(tmp: Path) -> None:
    load_recipe("digits", ["data.type=os:system"])


@entry(
    SECTION,
    "A recipe path outside the run folder",
    ConfigError,
    "Use a relative path inside the run folder, or pass `--allow-absolute-paths`.",
)
def recipe_path_outside(tmp: Path) -> None:
    load_recipe("digits", ["callbacks.1.dirpath=/tmp/x"])


@entry(SECTION, "An unknown callback type in a recipe", ConfigError, "Use a listed name.")
def recipe_unknown_callback(tmp: Path) -> None:
    load_recipe("digits", ["callbacks.0.type=nope"])


# -- the test -------------------------------------------------------------------------------------


def normalise(message: str, tmp: Path) -> str:
    """The message with what changes from run to run replaced by placeholders."""
    message = message.replace(str(tmp), "<dir>").replace(socket.gethostname(), "<host>")
    message = re.sub(
        r"(xxh3_64 mismatch \(expected) [0-9a-f]{16}, found [0-9a-f]{16}",
        r"\1 <xxh3_64>, found <xxh3_64>",
        message,
    )
    message = re.sub(r"pid \d+", "pid <pid>", message)
    message = re.sub(r"started \d{4}-\d\d-\d\d \d\d:\d\d:\d\d", "started <time>", message)
    message = re.sub(r"expected \d+ bytes, found \d+", "expected <n> bytes, found <n>", message)
    return message.replace("|", "\\|").replace("\n", "<br>")


def trigger(name: str, tmp: Path) -> str:
    """Run an entry; return the message its error or warning carries."""
    case = CATALOGUE[name]
    if issubclass(case.raises, Warning):
        with pytest.warns(case.raises) as caught:
            case.action(tmp)
        return str(next(w.message for w in caught if issubclass(w.category, case.raises)))
    with pytest.raises(case.raises) as info:  # type: ignore[arg-type]
        case.action(tmp)
    return str(info.value)


@pytest.mark.parametrize("name", list(CATALOGUE))
def test_catalogue_entry(name, tmp_path):
    TRAINERS.clear()
    message = trigger(name, tmp_path)
    documented = DOC.read_text(encoding="utf-8")
    assert f"`{name}`" in documented, f"{name} is not in docs/errors.md"
    shown = normalise(message, tmp_path)
    assert shown in documented, f"docs/errors.md lacks the message of {name}:\n{shown}"
    if CATALOGUE[name].fails_fast:
        for built in TRAINERS:
            assert built.callbacks.callbacks[0].updates == 0, f"{name}: trained before failing"


def render_catalogue(tmp_root: Path) -> str:
    """The catalogue as Markdown tables (run by hand to refresh docs/errors.md)."""
    lines: list[str] = []
    section = None
    for name, case in CATALOGUE.items():
        if case.section != section:
            section = case.section
            lines += ["", f"## {section}", "", "| Mistake | Raises | Message | What to do | Test |"]
            lines += ["|---|---|---|---|---|"]
        tmp = tmp_root / name
        tmp.mkdir(parents=True)
        TRAINERS.clear()
        message = normalise(trigger(name, tmp), tmp)
        kind = case.raises.__name__.replace("MissingFramework", "MissingFrameworkError")
        lines.append(f"| {case.mistake} | `{kind}` | {message} | {case.fix} | `{name}` |")
    return "\n".join(lines)


# -- per-backend device and dtype refusals ---------------------------------------------------------


def _gpu_visible(backend: str) -> bool:
    from unitrain.backends.registry import get_backend

    cls: Any = get_backend(backend)
    return "gpu" in (cls.available_devices() if hasattr(cls, "available_devices") else ())


@pytest.mark.parametrize("backend", backends())
def test_every_backend_refuses_a_gpu_it_does_not_have(backend):
    if _gpu_visible(backend):
        pytest.skip("a GPU is visible")
    with pytest.raises(ConfigError, match=r"device='gpu'.*'cpu'|'cpu'.*device='gpu'"):
        Trainer(models.MLP((4, 8, 3)), backend=backend, config=TrainerConfig(device="gpu"))


@pytest.mark.parametrize("backend", backends())
def test_every_backend_refuses_a_dtype_it_cannot_train_in(backend):
    with pytest.raises(ConfigError, match="float16"):
        Trainer(models.MLP((4, 8, 3)), backend=backend, config=TrainerConfig(dtype="float16"))


def test_a_native_loader_is_checked_on_its_first_batch_only():
    x, y = arrays()
    later_bad = [(x[:8], y[:8]), (x[8:16, :2], y[8:16])]  # a later batch is not read ahead
    run = Trainer(models.MLP((4, 8, 3)), backend="numpy", config=TrainerConfig(epochs=1))
    with pytest.raises(ValueError):  # the backend's own error, at the bad batch
        run.fit(later_bad)
    assert run.state.step == 1


def test_monitor_names_are_checked_at_epoch_end_when_a_callback_may_add_metrics():
    class AddsScore(callbacks.Callback):
        def on_epoch_end(self, trainer, epoch, logs):
            logs["score"] = 1.0

    run = Trainer(
        models.MLP((4, 8, 3)),
        backend="numpy",
        callbacks=[AddsScore(), callbacks.EarlyStopping("score", mode="max", patience=5)],
        config=TrainerConfig(epochs=2),
    )
    run.fit(arrays())  # "score" comes from a user callback: not refused up front
    assert run.state.epoch == 2


def test_a_loader_is_not_iterated_for_monitor_names_when_no_monitor_needs_them():
    reads = []

    class Counting(ArrayLoader):
        def batches(self, epoch, start=0):
            reads.append(epoch)
            return super().batches(epoch, start)

    x, y = arrays()
    run = Trainer(models.MLP((4, 8, 3)), backend="numpy", config=TrainerConfig(epochs=1))
    run.fit(arrays(), Counting(x, y, 8, shuffle=False))
    assert reads == [0]  # the validation pass itself, nothing more


def test_resume_other_settings_warning_names_each_change(tmp_path):
    path = checkpoint_of(tmp_path)
    with pytest.warns(UserWarning) as caught:
        trainer(
            optimizer=optim.SGD(weight_decay=1e-4),
            schedule=schedules.Constant(0.5),
            seed=3,
            batch_size=4,
            epochs=3,
        ).fit(arrays(), resume=path)
    message = str(caught[0].message)
    assert "seed=0 -> 3" in message and "batch_size=8 -> 4" in message
    assert "'weight_decay': 0.0} -> {" in message and "'weight_decay': 0.0001}" in message
    assert "schedule {'type': 'constant', 'lr': 0.01} -> {'type': 'constant', 'lr': 0.5}" in message
