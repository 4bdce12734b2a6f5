"""The Keras variational autoencoder (keras-io ``examples/generative/vae.py``), written once.

    python examples/papers/vae.py --backend torch
    python examples/papers/vae.py --backend torch --dtype float64    # writes vae_float64-torch.json
    unitrain train examples/papers/vae.py --backend jax    # the same, as a recipe
    unitrain compare examples/papers/vae.py --backends torch,jax,tensorflow

A port of the keras-io example (Kingma and Welling 2014) on scikit-learn's 8x8 digits
instead of MNIST (no download), so every stride-2 stage halves 8 to 4 to 2 where MNIST's go
28 to 14 to 7. Piece by piece:

- ``encoder``: ``Conv2D(32, 3, strides=2, padding="same")`` and ``Conv2D(64, ...)`` with
  ReLU, ``Flatten``, ``Dense(16, relu)``, then ``z_mean`` and ``z_log_var`` (``Dense(2)``
  each) and the ``Sampling`` layer: ``z = z_mean + exp(0.5 * z_log_var) * epsilon`` with
  ``epsilon`` standard normal. Here epsilon comes from the layer's own key
  (``scope.random_key()``), so every backend draws the same noise; in eval mode the layer
  returns ``z_mean`` (the example samples there too; the mean makes the validation loss a
  deterministic number to compare across backends).
- ``decoder``: ``Dense(2 * 2 * 64, relu)``, ``Reshape``, ``Conv2DTranspose(64, 3, strides=2,
  padding="same")`` and ``Conv2DTranspose(32, ...)`` with ReLU, and
  ``Conv2DTranspose(1, 3, padding="same")``. The example ends in a sigmoid and takes the
  binary cross-entropy of its probabilities; the port keeps the logits and takes the binary
  cross-entropy with logits, the same function computed without rounding the probabilities.
- ``VAE.train_step``'s loss: the reconstruction's binary cross-entropy summed over the pixels,
  plus ``-0.5 * sum(1 + z_log_var - z_mean**2 - exp(z_log_var))``, each averaged over the
  batch: the :class:`ELBO` objective below, over the model's three outputs.
- ``vae.compile(optimizer=keras.optimizers.Adam())`` and ``fit(..., epochs=30,
  batch_size=128)``: Adam at Keras's defaults (1e-3, epsilon 1e-7), 30 epochs of 128.

Nothing here names a framework: the backend is ``--backend`` (or ``UNITRAIN_BACKEND``).
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, final

import numpy as np

from unitrain import ArrayLoader, TrainerConfig, losses, ops, optim, schedules
from unitrain.models import (
    AbstractLayer,
    Conv2d,
    ConvTranspose2d,
    Flatten,
    Linear,
    ReLU,
    Reshape,
    Scope,
    Sequential,
)
from unitrain.recipes import Recipe, load_digits

LATENT = 2


def encoder() -> Sequential:
    """Images ``(8, 8, 1)`` to 16 features (before the two latent heads)."""
    return Sequential(
        (
            Conv2d(1, 32, 3, stride=2, padding="same"),
            ReLU(),
            Conv2d(32, 64, 3, stride=2, padding="same"),
            ReLU(),
            Flatten(),
            Linear(2 * 2 * 64, 16),
            ReLU(),
        )
    )


def decoder() -> Sequential:
    """A latent point to the logits of an ``(8, 8, 1)`` image. ``padding=1,
    output_padding=1`` gives the doubled size Keras's ``padding="same"`` gives at stride 2."""
    return Sequential(
        (
            Linear(LATENT, 2 * 2 * 64),
            ReLU(),
            Reshape((2, 2, 64)),
            ConvTranspose2d(64, 64, 3, stride=2, padding=1, output_padding=1),
            ReLU(),
            ConvTranspose2d(64, 32, 3, stride=2, padding=1, output_padding=1),
            ReLU(),
            ConvTranspose2d(32, 1, 3, padding=1),
        )
    )


@dataclasses.dataclass(frozen=True)
class VAE(AbstractLayer, type_name="example_vae"):
    """Encoder, the two latent heads, sampling, decoder: ``(logits, z_mean, z_log_var)``."""

    def children(self) -> tuple[tuple[str, AbstractLayer], ...]:
        return (
            ("encoder", encoder()),
            ("z_mean", Linear(16, LATENT)),
            ("z_log_var", Linear(16, LATENT)),
            ("decoder", decoder()),
        )

    @property
    def drops_values(self) -> bool:
        return True  # it draws noise in train mode, so the backend gives it a random stream

    def forward(self, scope: Scope, x: Any) -> Any:
        hidden = scope.call("encoder", x)
        z_mean, z_log_var = scope.call("z_mean", hidden), scope.call("z_log_var", hidden)
        z = z_mean
        if scope.training:  # the Sampling layer
            epsilon = ops.random.normal(scope.random_key(), ops.shape(z_mean), ops.dtype(z_mean))
            z = z_mean + ops.exp(0.5 * z_log_var) * epsilon
        return scope.call("decoder", z), z_mean, z_log_var

    def _output_shape(self, shape: Any) -> Any:
        if tuple(shape) != (8, 8, 1):
            raise self._refuse(shape, "(8, 8, 1)")
        return (8, 8, 1), (LATENT,), (LATENT,)


@final
@dataclasses.dataclass(frozen=True)
class ELBO(losses.Objective, type_name="example_elbo"):
    """The negative evidence lower bound per example: the reconstruction's binary
    cross-entropy summed over pixels plus the KL divergence of the posterior from N(0, 1)."""

    takes_labels: ClassVar[bool] = False

    def per_example(self, outputs: Any, batch: losses.BatchView) -> Any:
        logits, z_mean, z_log_var = outputs
        images = ops.cast(batch.targets, ops.dtype(logits))
        pixels = ops.softplus(logits) - logits * images  # binary cross-entropy, from logits
        reconstruction = ops.sum(ops.reshape(pixels, (ops.shape(pixels)[0], -1)), axis=1)
        kl = -0.5 * ops.sum(1 + z_log_var - z_mean * z_mean - ops.exp(z_log_var), axis=1)
        return reconstruction + kl


def recipe(config: TrainerConfig | None = None) -> Recipe:
    """The whole port as a recipe: ``unitrain train`` / ``unitrain compare`` read this."""
    split = load_digits()
    images = lambda x: (x.reshape(-1, 8, 8, 1) * 1.0).astype(np.float32)  # noqa: E731
    # The example fits on every image it has (train and test); the held-out fifth here only
    # gives a number per epoch to compare backends by.
    train, val = images(split.x_train), images(split.x_val)
    return Recipe(
        model=VAE(),
        data=(ArrayLoader(train, train, batch_size=128, seed=0), (val, val)),
        optimizer=optim.Adam(eps=1e-7),
        schedule=schedules.Constant(1e-3),
        loss=ELBO(),
        config=config or TrainerConfig(epochs=30, batch_size=128, deterministic=True),
        name="vae",
    )


def main() -> None:
    from _common import arguments, train_recipe  # beside this file, run as a script

    args = arguments(__doc__.splitlines()[0], epochs=30, dtype="float32")
    config = TrainerConfig(epochs=args.epochs, batch_size=128, deterministic=True, dtype=args.dtype)
    name = "vae" if args.dtype == "float32" else f"vae_{args.dtype}"  # its own results file
    train_recipe(name, args, recipe(config))


if __name__ == "__main__":
    main()
