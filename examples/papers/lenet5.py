"""LeNet-5 (LeCun et al. 1998) adapted to the 8x8 digits, on any backend.

    python examples/papers/lenet5.py --backend torch

The paper's layout, scaled to 8x8 inputs: two convolution + tanh + average-pooling
("subsampling") stages of 6 and 16 maps, then fully connected layers of 120 and 84 units
and 10 outputs. The 5x5 kernels become 3x3 with one pixel of padding, so each stage halves
the image: 8x8 -> 4x4 -> 2x2. SGD with momentum and a cosine schedule replace the paper's
stochastic diagonal Levenberg-Marquardt.
"""

from __future__ import annotations

from _common import arguments, digit_images, run

from unitrain import optim, schedules
from unitrain.models import AvgPool2d, Conv2d, Flatten, Linear, Sequential, Tanh

MODEL = Sequential(
    [
        Conv2d(1, 6, 3, padding=1),
        Tanh(),
        AvgPool2d(2),
        Conv2d(6, 16, 3, padding=1),
        Tanh(),
        AvgPool2d(2),
        Flatten(),
        Linear(2 * 2 * 16, 120),
        Tanh(),
        Linear(120, 84),
        Tanh(),
        Linear(84, 10),
    ]
)


def main() -> None:
    args = arguments(__doc__.splitlines()[0], epochs=40)
    data = digit_images()
    steps = args.epochs * -(-len(data[0]) // 32)
    schedule = schedules.CosineDecay(0.1, decay_steps=steps, min_lr=1e-3)
    run(
        "lenet5",
        args,
        MODEL,
        data,
        optimizer=optim.SGD(momentum=0.9),
        schedule=schedule,
        batch_size=32,
    )


if __name__ == "__main__":
    main()
