"""An MLflow tracker: the run's description, its metrics with their steps, its checkpoints.

Writes through ``mlflow.MlflowClient`` (no global active run, so two Trainers in one
process do not share one), to the tracking URI given, else MLflow's own default: the
``MLFLOW_TRACKING_URI`` environment variable, or a local SQLite store ``mlflow.db`` in the
working directory (MLflow's files-only ``./mlruns`` store is deprecated and refused from
MLflow 3.13). Each logging point is one ``log_batch`` call.
"""

from __future__ import annotations

import importlib.util
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from unitrain._errors import ConfigError, MissingFrameworkError
from unitrain.callbacks.trackers import TrackerLogger

if TYPE_CHECKING:
    from unitrain.training.trainer import Trainer

__all__ = ["MLflowLogger"]

#: MLflow's limit on a parameter value's length (characters).
_PARAM_LIMIT = 6000


class MLflowLogger(TrackerLogger):
    """Log the run to MLflow; a resumed run appends to the same MLflow run.

    Args:
        experiment: the experiment's name; made when missing.
        tracking_uri: where MLflow keeps runs (``sqlite:///path/mlflow.db``, ``http://...``);
            None is MLflow's default (see the module).
        run_name: the run's name in MLflow (default: MLflow picks one).
        tags: extra tags for the run.
        log_checkpoints: when training ends, copy the newest checkpoint of the Trainer's
            ``checkpoint_dir`` into the run's artifacts (``checkpoints/<name>``).
        artifact_location: where a new experiment keeps its runs' artifacts; None is
            MLflow's default (with a local SQLite store, ``./mlruns`` in the working
            directory).

    Raises:
        MissingFrameworkError: mlflow is not installed (``pip install 'unitrain[mlflow]'``).
    """

    def __init__(
        self,
        experiment: str = "unitrain",
        tracking_uri: str | None = None,
        run_name: str | None = None,
        tags: Mapping[str, str] | None = None,
        log_checkpoints: bool = False,
        artifact_location: str | None = None,
    ) -> None:
        if importlib.util.find_spec("mlflow") is None:  # found now, imported when used
            raise MissingFrameworkError("MLflowLogger needs mlflow: pip install 'unitrain[mlflow]'")
        if not experiment:
            raise ConfigError("MLflowLogger: experiment must be a non-empty name")
        self.experiment = experiment
        self.tracking_uri = tracking_uri
        self.run_name = run_name
        self.tags = dict(tags or {})
        self.log_checkpoints = log_checkpoints
        self.artifact_location = artifact_location
        self.run_id: str | None = None
        self._client: Any = None
        self._checkpoint_dir: str | None = None

    # -- the run ------------------------------------------------------------------------------

    @property
    def client(self) -> Any:
        """The ``MlflowClient`` this logger writes through."""
        if self._client is None:
            from mlflow import MlflowClient

            self._client = MlflowClient(self.tracking_uri)
        return self._client

    def _run(self) -> str:
        """The run's id, opening a new run on the first write of a fresh run."""
        if self.run_id is None:
            experiment = self.client.get_experiment_by_name(self.experiment)
            experiment_id = (
                experiment.experiment_id
                if experiment is not None
                else self.client.create_experiment(self.experiment, self.artifact_location)
            )
            run = self.client.create_run(experiment_id, tags=self.tags, run_name=self.run_name)
            self.run_id = run.info.run_id
        return self.run_id

    def on_train_begin(self, trainer: Trainer) -> None:
        super().on_train_begin(trainer)
        self.run_id = None  # a fresh fit opens a new run unless a resume names one
        self._checkpoint_dir = trainer.config.checkpoint_dir

    def on_train_end(self, trainer: Trainer) -> None:
        if self.log_checkpoints:
            trainer.wait_for_checkpoints()  # the last epoch's save may still be in flight
        super().on_train_end(trainer)

    def run_state(self) -> dict[str, Any]:
        return {"run_id": self.run_id} if self.run_id else {}

    def resume_run(self, state: Mapping[str, Any]) -> None:
        run_id = state.get("run_id")
        if not isinstance(run_id, str):
            return
        self.run_id = run_id
        self.client.update_run(run_id, status="RUNNING")

    # -- the tracker interface ----------------------------------------------------------------

    def log_hyperparams(self, params: Mapping[str, str]) -> None:
        from mlflow.entities import Param

        entries = [Param(key, value[:_PARAM_LIMIT]) for key, value in sorted(params.items())]
        run = self._run()
        for start in range(0, len(entries), 100):  # MLflow takes 100 params per batch
            self.client.log_batch(run, params=entries[start : start + 100])

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        entries = [Metric(key, float(value), now, int(step)) for key, value in metrics.items()]
        if entries:
            self.client.log_batch(self._run(), metrics=entries)

    def finalize(self, status: str) -> None:
        run = self._run()
        if self.log_checkpoints and self._checkpoint_dir:
            newest = _newest_checkpoint(Path(self._checkpoint_dir))
            if newest is not None:
                self.client.log_artifacts(run, str(newest), f"checkpoints/{newest.name}")
        self.client.set_tag(run, "unitrain.end", status)
        self.client.set_terminated(run, "FINISHED")


def _newest_checkpoint(folder: Path) -> Path | None:
    from unitrain.checkpoint import list_checkpoints

    found = list_checkpoints(folder) if folder.is_dir() else []
    return found[-1] if found else None
