"""A small ResNet (He et al. 2016: basic blocks with BatchNorm) on the 8x8 digits.

    python examples/papers/resnet.py --backend jax

A 3x3 stem of 16 channels, two basic blocks (``x + BN(conv(ReLU(BN(conv(x)))))``, then
ReLU) at 8x8, a strided 3x3 convolution to 32 channels at 4x4 (the paper's projection
between stages, without the identity path it cannot have across a change of shape), one
block there, global average pooling and a linear classifier. SGD with momentum and weight
decay on a cosine schedule, as the paper's CIFAR runs use a step schedule of the same kind.
"""

from __future__ import annotations

from _common import arguments, digit_images, run

from unitrain import optim, schedules
from unitrain.models import (
    BatchNorm,
    Conv2d,
    GlobalAvgPool,
    Linear,
    ReLU,
    Residual,
    Sequential,
)


def basic_block(channels: int) -> list:
    """He et al.'s basic block and the ReLU after the sum."""
    branch = [
        Conv2d(channels, channels, 3, padding=1),
        BatchNorm(channels),
        ReLU(),
        Conv2d(channels, channels, 3, padding=1),
        BatchNorm(channels),
    ]
    return [Residual(branch), ReLU()]


MODEL = Sequential(
    [
        Conv2d(1, 16, 3, padding=1),
        BatchNorm(16),
        ReLU(),
        *basic_block(16),
        *basic_block(16),
        Conv2d(16, 32, 3, stride=2, padding=1),
        BatchNorm(32),
        ReLU(),
        *basic_block(32),
        GlobalAvgPool(),
        Linear(32, 10),
    ]
)


def main() -> None:
    args = arguments(__doc__.splitlines()[0], epochs=20)
    data = digit_images()
    steps = args.epochs * -(-len(data[0]) // 32)
    schedule = schedules.CosineDecay(0.1, decay_steps=steps, min_lr=1e-3)
    optimizer = optim.SGD(momentum=0.9, weight_decay=5e-4)
    run("resnet", args, MODEL, data, optimizer=optimizer, schedule=schedule, batch_size=32)


if __name__ == "__main__":
    main()
