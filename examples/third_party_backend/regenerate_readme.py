"""Rewrite the verdict in this example's README from a real run of the conformance kit.

    python examples/third_party_backend/regenerate_readme.py          # run the kit, rewrite
    python examples/third_party_backend/regenerate_readme.py --check  # exit 1 if it changed

The kit runs on ``keras_native.backend:KerasNativeBackend`` (this folder goes on ``sys.path``,
nothing is installed) on the CPU, and its table replaces what lies between :data:`BEGIN` and
:data:`END` in ``README.md``: the counts a reader sees are the kit's, never typed by hand, so
they cannot go stale when a family or a check is added. A run takes about 80 s on a 2-core
CPU. Long result lines are wrapped and shortened (the kit prints them whole), and paths under
the repository are written relative to it, so the block does not depend on the machine.
"""

from __future__ import annotations

import argparse
import sys
import textwrap
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
README = HERE / "README.md"
TARGET = "keras_native.backend:KerasNativeBackend"

BEGIN = "<!-- verdict: written by regenerate_readme.py from a run of the kit; do not edit -->"
END = "<!-- end of verdict -->"
#: Result lines are wrapped to this width and cut after :data:`MAX_LINES` lines.
WIDTH = 96
MAX_LINES = 3
#: The words that open a result line of the kit's table (``XFAILED  id: reason``).
_RESULT_WORDS = ("FAILED", "XFAILED", "XPASSED", "SKIPPED", "SIMULATED", "NOTE", "WARNING")


def verdict_block(report: Any, root: Path = ROOT) -> str:
    """The README's verdict block for ``report`` (a :class:`unitrain.conformance.Report`).

    A sentence naming where and with what it ran, then the kit's table in a ``text`` fence:
    the table as the kit prints it, result lines wrapped to :data:`WIDTH` columns.
    """
    results = report.results
    devices = ", ".join(dict.fromkeys(r.device.upper() for r in results))
    dtypes = ", ".join(dict.fromkeys(r.dtype for r in results))
    versions: dict[str, str] = {}
    for result in results:
        versions.update(result.backend_versions)
    used = ", ".join(f"{package} {version}" for package, version in versions.items())
    lines = []
    for line in report.table().replace(f"{root}/", "").splitlines():
        if line.split(" ", 1)[0] in _RESULT_WORDS and len(line) > WIDTH:
            wrapped = textwrap.wrap(
                line, WIDTH, subsequent_indent=" " * 9, max_lines=MAX_LINES, placeholder=" ..."
            )
            lines.extend(wrapped)
        else:
            lines.append(line)
    caption = (
        f"The verdict on the {devices} in {dtypes} ({used}), as "
        "`python examples/third_party_backend/regenerate_readme.py` last wrote it:"
    )
    return "\n".join([caption, "", "```text", *lines, "```"])


def replace_block(readme: str, block: str) -> str:
    """``readme`` with the text between :data:`BEGIN` and :data:`END` replaced by ``block``.

    Raises:
        ValueError: the markers are missing, repeated or out of order.
    """
    if readme.count(BEGIN) != 1 or readme.count(END) != 1:
        raise ValueError(f"README.md must hold {BEGIN!r} and {END!r} once each")
    head, _, rest = readme.partition(BEGIN)
    if END not in rest:
        raise ValueError(f"{END!r} must come after {BEGIN!r}")
    tail = rest.partition(END)[2]
    return f"{head}{BEGIN}\n{block}\n{END}{tail}"


def main(argv: list[str] | None = None) -> int:
    """Run the kit, rewrite the README's verdict (or with ``--check`` only compare)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if the block would change")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(HERE))
    from unitrain.conformance import run

    report = run(TARGET, device="cpu")
    text = README.read_text(encoding="utf-8")
    updated = replace_block(text, verdict_block(report))
    if args.check:
        return 0 if updated == text else 1
    README.write_text(updated, encoding="utf-8")
    print(f"{README.relative_to(ROOT)}: {report.verdict_line()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
