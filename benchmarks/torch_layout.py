"""Which memory layout the torch backend's image layers should use, measured.

    OMP_NUM_THREADS=1 python -m benchmarks.torch_layout

Portable images are ``(N, H, W, C)``. The torch layers hand convolutions and pooling the free
view ``x.permute(0, 3, 1, 2)``, which torch reads as an NCHW tensor in the channels-last
memory format. The alternative is to copy to contiguous NCHW before each image op and back
after it. This times a forward and backward pass of the paper ResNet's layers (batch 32 on
8x8 digits, and batch 64 on 32x32 images) both ways; the layers already choose the
faster one, and the result is in benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import time

import torch

from unitrain.backends.torch import layers
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
    module = layers.build_portable(model, 0, torch.float32, "cpu").train()
    x = torch.randn(shape)
    times = []
    for _ in range(steps + 3):
        start = time.perf_counter()
        module(x).square().mean().backward()
        times.append(time.perf_counter() - start)
    return sorted(times[3:])[steps // 2]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args()
    views = layers._nchw, layers._nhwc
    copies = (
        lambda x: x.permute(0, 3, 1, 2).contiguous(),
        lambda x: x.permute(0, 2, 3, 1).contiguous(),
    )
    print(f"torch {torch.__version__}, {torch.get_num_threads()} thread(s)")
    for channels, shape in ((16, (32, 8, 8, 3)), (32, (64, 32, 32, 3))):
        found = {}
        for label, (to_nchw, to_nhwc) in (("channels-last views", views), ("NCHW copies", copies)):
            layers._nchw, layers._nhwc = to_nchw, to_nhwc
            found[label] = seconds_per_step(resnet(channels), shape, args.steps)
        layers._nchw, layers._nhwc = views
        cells = ", ".join(f"{k} {v * 1e3:.2f} ms" for k, v in found.items())
        print(f"ResNet {channels} channels, input {shape}: {cells}")


if __name__ == "__main__":
    main()
