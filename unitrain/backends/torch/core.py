"""Device, determinism and conversion helpers of the PyTorch adapter."""

from __future__ import annotations

import base64
import os

import numpy as np
import torch

from unitrain import ConfigError

__all__ = [
    "DTYPES",
    "ArrayOps",
    "decode",
    "encode",
    "make_deterministic",
    "numpy_dtype",
    "resolve_device",
    "tensor_like",
    "to_numpy",
]

#: The dtypes the adapter trains in, by their unitrain names.
DTYPES = {"float32": torch.float32, "float64": torch.float64, "bfloat16": torch.bfloat16}


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device == "gpu":
        if not torch.cuda.is_available():
            raise ConfigError("device='gpu' but torch sees no CUDA device; use 'cpu' or 'auto'")
        return torch.device("cuda")
    if device == "cpu":
        return torch.device("cpu")
    raise ConfigError(f"unknown device {device!r}; choose 'cpu', 'gpu' or 'auto'")


def make_deterministic(device: torch.device) -> None:
    # Kernel choice only: TF32 is matmul_precision's to decide (torch/precision.py).
    torch.use_deterministic_algorithms(True)
    if device.type == "cuda":
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.backends.cudnn.benchmark = False


def to_numpy(tensor: torch.Tensor) -> np.ndarray:
    """A host copy of ``tensor``'s full value; a sharded ``DTensor`` (FSDP2, see
    ``.sharding``) is gathered first, a collective every worker takes part in."""
    if hasattr(tensor, "full_tensor"):
        tensor = tensor.full_tensor()
    tensor = tensor.detach().cpu()
    if tensor.dtype == torch.bfloat16:
        tensor = tensor.float()
    return tensor.numpy().copy()


def tensor_like(array: np.ndarray, like: torch.Tensor) -> torch.Tensor:
    """``array`` (a full value) on ``like``'s device and in its dtype; sharded as ``like``
    when that is a ``DTensor`` (each worker keeps its own chunk, no communication)."""
    if hasattr(like, "device_mesh"):
        from unitrain.backends.torch.sharding import placed_like

        return placed_like(array, like)
    return torch.from_numpy(np.array(array)).to(like.device, like.dtype)


def numpy_dtype(dtype: torch.dtype) -> np.dtype:
    return np.dtype("float64" if dtype == torch.float64 else "float32")


def encode(tensor: torch.Tensor) -> str:
    return base64.b64encode(tensor.numpy().tobytes()).decode("ascii")


def decode(text: str) -> torch.Tensor:
    return torch.frombuffer(bytearray(base64.b64decode(text)), dtype=torch.uint8)


class ArrayOps:
    """The numpy-style functions metrics use, on tensors (torch names them differently)."""

    exp, log, reshape = torch.exp, torch.log, torch.reshape

    @staticmethod
    def sum(a: torch.Tensor, axis: int | None = None) -> torch.Tensor:
        return torch.sum(a) if axis is None else torch.sum(a, dim=axis)

    @staticmethod
    def max(a: torch.Tensor, axis: int, keepdims: bool = False) -> torch.Tensor:
        return torch.amax(a, dim=axis, keepdim=keepdims)

    @staticmethod
    def take_along_axis(a: torch.Tensor, indices: torch.Tensor, axis: int) -> torch.Tensor:
        return torch.take_along_dim(a, indices, dim=axis)
