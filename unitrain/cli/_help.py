"""Help text from docstrings: the reStructuredText markup that Sphinx renders, taken out.

The command's descriptions are its modules' docstrings, written for the API docs; a terminal
shows markup literally, so ``--help`` printed double backticks and ``:func:`` roles that only
get in the reader's way.
"""

from __future__ import annotations

import inspect
import re

__all__ = ["plain_text"]

#: ``:role:`text <target>```, ``:role:`~pkg.mod.Name```, ``:role:`name``` (Sphinx roles).
_ROLE = re.compile(r":[a-z]+(?::[a-z]+)?:`~?([^`<]*?)\s*(?:<[^`>]*>)?`")
#: ````literal```` and ```interpreted```, the backticks kept off the text.
_LITERAL = re.compile(r"``(.+?)``|`([^`]+)`")


def plain_text(docstring: str) -> str:
    """``docstring`` dedented, with reStructuredText roles and literals as plain words.

    A role's target keeps its last dotted part when written ``~pkg.Name`` (as Sphinx shows
    it), and a titled reference keeps its title.

    Examples:
        >>> plain_text("``unitrain`` runs :func:`main`, :class:`~unitrain.callbacks.Callback`.")
        'unitrain runs main, Callback.'
        >>> plain_text(":mod:`the plots <unitrain.cli.plot>` and `x`")
        'the plots and x'
    """

    def role(match: re.Match[str]) -> str:
        text = match.group(1)
        shortened = match.group(0).split("`", 1)[1].startswith("~")
        return text.rsplit(".", 1)[-1] if shortened else text

    text = _ROLE.sub(role, inspect.cleandoc(docstring))
    return _LITERAL.sub(lambda match: match.group(1) or match.group(2), text)
