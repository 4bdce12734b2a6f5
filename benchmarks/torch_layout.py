"""Which memory layout the torch backend's image layers should use, measured.

    OMP_NUM_THREADS=1 python -m benchmarks.torch_layout

Portable images are ``(N, H, W, C)``. The torch ops hand convolutions and pooling the free
view ``x.permute(0, 3, 1, 2)``, which torch reads as an NCHW tensor in the channels-last
memory format. The alternative is to copy to contiguous NCHW before each image op and back
after it. This times a forward and backward pass of the paper ResNet's layers (batch 32 on
8x8 digits, and batch 64 on 32x32 images) both ways; the layers already choose the
faster one, and the result is in benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import torch

from unitrain.backends.torch import _ops_nn, layers
from unitrain.models import BatchNorm, Conv2d, GlobalAvgPool, Linear, ReLU, Residual, Sequential


def resnet(channels: int) -> Sequential:
    """Stem, two basic blocks, global pooling, classifier."""

    def block() -> list:
        branch = [Conv2d(channels, channels, 3, padding=1), BatchNorm(channels), ReLU()]
        branch += [Conv2d(channels, channels, 3, padding=1), BatchNorm(channels)]
        return [Residual(branch), ReLU()]

    stem = [Conv2d(3, channels, 3, padding=1), BatchNorm(channels), ReLU()]
    return Sequential([*stem, *block(), *block(), GlobalAvgPool(), Linear(channels, 10)])


def seconds_per_step(model: Sequential, shape: tuple[int, ...], steps: int) -> float:
    """Median seconds of a forward and backward pass."""
    module = layers.PortableModule(model, 0, torch.float32, "cpu").train()
    x = torch.randn(shape)
    times = []
    for _ in range(steps + 3):
        start = time.perf_counter()
        module(x).square().mean().backward()
        times.append(time.perf_counter() - start)
    return sorted(times[3:])[steps // 2]


def _copying(function: Any) -> Any:
    """``function`` on a contiguous NCHW copy of its input, its output copied back to NHWC."""

    def copied(x: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        out = function(x.contiguous(), *args, **kwargs)
        return out.contiguous(memory_format=torch.channels_last)

    return copied


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args()
    # The image ops of the torch ops module (_ops_nn) take channels-last views; the other
    # layout copies each op's input to contiguous NCHW and its output back to NHWC.
    tables = (_ops_nn._CONV, _ops_nn._MAX_POOL, _ops_nn._AVG_POOL)
    views = [dict(table) for table in tables]
    copies = [{k: _copying(f) for k, f in table.items()} for table in tables]
    print(f"torch {torch.__version__}, {torch.get_num_threads()} thread(s)")
    for channels, shape in ((16, (32, 8, 8, 3)), (32, (64, 32, 32, 3))):
        found = {}
        for label, functions in (("channels-last views", views), ("NCHW copies", copies)):
            for table, chosen in zip(tables, functions):
                table.update(chosen)
            found[label] = seconds_per_step(resnet(channels), shape, args.steps)
        for table, chosen in zip(tables, views):
            table.update(chosen)
        cells = ", ".join(f"{k} {v * 1e3:.2f} ms" for k, v in found.items())
        print(f"ResNet {channels} channels, input {shape}: {cells}")


if __name__ == "__main__":
    main()
