"""A unitrain backend built the way a Keras user would build one: Keras 3 layers and optimizers."""

from keras_native.backend import KerasNativeBackend

__all__ = ["KerasNativeBackend"]
