"""Callbacks: hooks into the training loop whose state survives checkpoints and resumes."""

from unitrain.callbacks._base import HOOKS, Callback, CallbackList, callback_from_dict
from unitrain.callbacks.csv_tracker import CSVTracker
from unitrain.callbacks.early_stopping import EarlyStopping
from unitrain.callbacks.loggers import ConsoleLogger, CSVLogger, JSONLLogger
from unitrain.callbacks.lr_monitor import LRMonitor
from unitrain.callbacks.mlflow_logger import MLflowLogger
from unitrain.callbacks.model_checkpoint import ModelCheckpoint
from unitrain.callbacks.progress_bar import ProgressBar
from unitrain.callbacks.reduce_lr_on_plateau import ReduceLROnPlateau
from unitrain.callbacks.tensorboard import TensorBoardLogger
from unitrain.callbacks.terminate_on_nan import TerminateOnNaN
from unitrain.callbacks.trackers import TrackerLogger

__all__ = [
    "HOOKS",
    "CSVLogger",
    "CSVTracker",
    "Callback",
    "CallbackList",
    "ConsoleLogger",
    "EarlyStopping",
    "JSONLLogger",
    "LRMonitor",
    "MLflowLogger",
    "ModelCheckpoint",
    "ProgressBar",
    "ReduceLROnPlateau",
    "callback_from_dict",
    "TensorBoardLogger",
    "TerminateOnNaN",
    "TrackerLogger",
]
