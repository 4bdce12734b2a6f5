"""Old names of an adapter's module that keep working, with a deprecation warning.

When the adapters took one name per concept (the portable model is ``PortableModule`` in
every adapter), the names third parties may have imported stayed importable: a module lists
them in ``RENAMED`` and sets ``__getattr__ = renamed_getattr(__name__, RENAMED, globals())``.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["renamed_getattr"]


def renamed_getattr(
    module: str, renamed: Mapping[str, str], namespace: Mapping[str, Any]
) -> Callable[[str], Any]:
    """A module ``__getattr__`` that gives each old name of ``renamed`` its new name's object.

    Args:
        module: the module's ``__name__``, for the messages.
        renamed: old name to new name.
        namespace: the module's ``globals()``, where the new names live.

    Examples:
        >>> import warnings
        >>> getattr_ = renamed_getattr("m", {"old": "new"}, {"new": 42})
        >>> with warnings.catch_warnings(record=True) as caught:
        ...     warnings.simplefilter("always")
        ...     getattr_("old"), str(caught[0].message)
        (42, 'm.old is deprecated: use m.new, its name in every adapter')
    """

    def __getattr__(name: str) -> Any:
        if name not in renamed:
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        new = renamed[name]
        warnings.warn(
            f"{module}.{name} is deprecated: use {module}.{new}, its name in every adapter",
            DeprecationWarning,
            stacklevel=2,
        )
        return namespace[new]

    return __getattr__
