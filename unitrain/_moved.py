"""Old import paths of modules that moved when the source became one tree (unitrain 0.2).

Each old module is a two-line file that calls :func:`forward`: it warns once, with a
``DeprecationWarning`` pointing at the importing line, and puts the new module in its place in
``sys.modules``, so ``from unitrain.backend import Backend`` and ``import unitrain.trainer``
keep working and give the very same objects. The old paths go in unitrain 0.4.

Their test is ``tests/test_moved_paths.py``.
"""

from __future__ import annotations

import importlib
import sys
import warnings

#: old module -> (new module, the path users should import from).
MOVED = {
    "unitrain.backend": ("unitrain.backends.protocol", "unitrain.backends.protocol"),
    "unitrain.registry": ("unitrain.backends.registry", "unitrain.backends.registry"),
    "unitrain.strategy": ("unitrain.backends.strategy", "unitrain.backends.strategy"),
    "unitrain.precision": ("unitrain.backends.precision", "unitrain.backends.precision"),
    "unitrain.state": ("unitrain.backends.state", "unitrain.backends.state"),
    "unitrain.config": ("unitrain.training.config", "unitrain (or unitrain.training.config)"),
    "unitrain.trainer": ("unitrain.training.trainer", "unitrain (or unitrain.training.trainer)"),
    "unitrain.rng": ("unitrain.training.rng", "unitrain.training.rng"),
    "unitrain.recipe": ("unitrain.recipes._recipe", "unitrain.recipes"),
    "unitrain.plot": ("unitrain.cli.plot", "unitrain.cli.plot"),
}


def _importer_stacklevel() -> int:
    """The ``stacklevel`` that points past this module and the old module at the importer.

    ``warnings.warn`` itself steps over importlib's frames when it counts levels, so only the
    frames of this module and of the old module are counted here.
    """
    frame, level = sys._getframe(1), 1
    while frame.f_back is not None and (
        frame.f_code.co_filename.startswith("<frozen importlib")
        or frame.f_globals.get("__name__") in (__name__, *MOVED)
    ):
        if not frame.f_code.co_filename.startswith("<frozen importlib"):
            level += 1
        frame = frame.f_back
    return level


def forward(old: str) -> None:
    """Warn that ``old`` moved, and make ``old`` name the module it moved to."""
    new, advice = MOVED[old]
    warnings.warn(
        f"{old} moved to {new}; import from {advice} instead (the old path is removed in "
        "unitrain 0.4)",
        DeprecationWarning,
        stacklevel=_importer_stacklevel(),
    )
    sys.modules[old] = importlib.import_module(new)
