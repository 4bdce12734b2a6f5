"""Moved to :mod:`unitrain.training.config`; importing this path warns and gives that module."""

from unitrain._moved import forward

forward(__name__)
