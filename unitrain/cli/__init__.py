"""The ``unitrain`` command: ``train``, ``compare``, ``plot``, ``backends``, ``conformance``.

:func:`main` parses and dispatches (:mod:`unitrain.cli._main`); ``train`` and ``compare``
live in ``_train``, the worker launcher for ``--workers N`` in ``_launch``, and the pictures
of runs in :mod:`unitrain.cli.plot`. ``python -m unitrain.cli`` is the same command.
"""

from __future__ import annotations

from unitrain.cli._main import main

__all__ = ["main"]
