"""The documentation: the site builds cleanly, and what the pages name is there and runs.

A page that names a file which moved, a command that was renamed or a flag that was dropped
misleads the reader who follows it; these tests read every page as that reader would. Only
the text inside backticks, code blocks and links is taken as a claim: prose may say anything.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import re
import subprocess
import sys
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
PAGES = [README, ROOT / "benchmarks" / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
README_LINE_LIMIT = 170  # a front door, not the manual: the manual is docs/

#: The repository's top level: a backticked path that starts with one of these is a claim
#: that the path exists in the repository.
TOP_LEVEL = {
    ".ci",
    "benchmarks",
    "docs",
    "examples",
    "tests",
    "unitrain",
    "CHANGELOG.md",
    "README.md",
    "conftest.py",
    "mkdocs.yml",
    "pyproject.toml",
}
#: A backticked file name elsewhere (`_harness.py`, `callbacks/progress_bar.py`) names a
#: repository file too, by the end of its path; run outputs (`metrics.jsonl`) do not count.
SOURCE_SUFFIXES = (".py", ".md", ".sh", ".toml", ".yml")
PATH_TOKEN = re.compile(r"\.?[\w-]+(?:[./][\w.-]+)*/?")
FENCE = re.compile(r"^```.*?\n(.*?)^```", re.DOTALL | re.MULTILINE)
INLINE_CODE = re.compile(r"(?<!`)`([^`\n]+)`(?!`)")
LINK = re.compile(r"\]\(([^)\s]+)\)")
# A command starts a line or span (after a prompt or a path to the script), follows `&&`,
# or is the module of `python -m`; `from unitrain import` in Python code is not one.
UNITRAIN_COMMAND = re.compile(
    r"(?:^\$?\s*|&&\s*|-m\s+)(?:[\w./]*/)?unitrain(?:\.cli)?\s+([a-z][\w-]*)(.*)"
)
PYTHON_MODULE = re.compile(r"\bpython3?\s+-m\s+([\w.]+)")
SCRIPT = re.compile(r"\b(?:python3?|bash|sh)\s+([\w./-]+\.(?:py|sh))\b")
FLAG = re.compile(r"(?<![\w-])(--?[a-zA-Z][\w-]*)")


def _code(page: Path) -> tuple[list[str], list[str]]:
    """A page's code blocks (continued lines joined) and its inline code spans."""
    text = page.read_text(encoding="utf-8")
    blocks = [block.replace("\\\n", " ") for block in FENCE.findall(text)]
    prose = FENCE.sub("", text)
    return blocks, INLINE_CODE.findall(prose)


def _commands(page: Path) -> list[str]:
    """Every line of code on a page: each line of a block, each inline span."""
    blocks, spans = _code(page)
    return [line for block in blocks for line in block.splitlines()] + spans


@cache
def _repository_files() -> frozenset[str]:
    """Every file and folder of the repository, as posix paths from its root."""
    skipped = {".git", ".venv", "build", "site", "__pycache__", "unitrain.egg-info", "runs"}
    found = set()
    for folder, folders, files in os.walk(ROOT):
        folders[:] = [name for name in folders if name not in skipped]
        relative = Path(folder).relative_to(ROOT)
        found.update((relative / name).as_posix() for name in folders + files)
    return frozenset(found)


def _named_paths(page: Path) -> list[str]:
    """The repository paths a page names in inline code."""
    _, spans = _code(page)
    named = []
    for span in spans:
        if PATH_TOKEN.fullmatch(span) and (
            span.split("/")[0] in TOP_LEVEL or span.endswith(SOURCE_SUFFIXES)
        ):
            named.append(span)
    return named


@cache
def _subcommands() -> dict[str, set[str]]:
    """`unitrain`'s subcommands and the options each takes, read from its own parser."""
    from unitrain.cli._main import _parser

    (commands,) = [
        action for action in _parser()._actions if isinstance(action, argparse._SubParsersAction)
    ]
    return {
        name: {option for action in parser._actions for option in action.option_strings}
        for name, parser in commands.choices.items()
    }


def _module_exists(name: str) -> bool:
    # The repository's own packages are looked up as files, so that a module of
    # benchmarks/ is found without putting the repository on sys.path.
    if name.split(".")[0] in {"unitrain", "benchmarks"}:
        base = ROOT.joinpath(*name.split("."))
        return any(
            path.is_file()
            for path in (base.with_suffix(".py"), base / "__init__.py", base / "__main__.py")
        )
    return importlib.util.find_spec(name) is not None


def test_the_site_builds_with_no_warnings(tmp_path):
    if importlib.util.find_spec("mkdocs") is None:
        pytest.fail("mkdocs is not installed: pip install -e '.[test]' installs it")
    # No -q: mkdocs 1.6 quiet mode drops the warnings before strict mode counts them.
    command = [sys.executable, "-m", "mkdocs", "build", "--strict"]
    command += ["-f", str(ROOT / "mkdocs.yml"), "-d", str(tmp_path / "site")]
    result = subprocess.run(command, capture_output=True, text=True, timeout=120)
    output = result.stdout + result.stderr
    assert result.returncode == 0 and "WARNING" not in output, output
    assert (tmp_path / "site" / "index.html").is_file()


def test_the_site_lists_every_page():
    listed = re.findall(r"^\s+- [^:]+: ([\w.-]+\.md)$", (ROOT / "mkdocs.yml").read_text(), re.M)
    pages = sorted(path.name for path in (ROOT / "docs").glob("*.md"))
    assert sorted(listed) == pages


def test_the_readme_is_a_front_door():
    lines = README.read_text(encoding="utf-8").count("\n")
    assert lines <= README_LINE_LIMIT, f"README.md has {lines} lines; move detail to docs/"
    linked = set(re.findall(r"\]\(docs/([\w.-]+\.md)\)", README.read_text(encoding="utf-8")))
    assert linked == {path.name for path in (ROOT / "docs").glob("*.md")}


def test_the_pages_repeat_the_readmes_setup_and_quickstart_word_for_word():
    readme_blocks, _ = _code(README)
    setup, quickstart = readme_blocks[0], readme_blocks[2]
    assert setup.startswith("python3 -m venv .venv") and "unitrain train" in setup
    assert quickstart.startswith("from unitrain import")
    assert setup in _code(ROOT / "docs" / "index.md")[0]
    assert quickstart in _code(ROOT / "docs" / "training.md")[0]


def test_ci_runs_the_readmes_test_command_then_the_harnesses():
    """The README's test command is CI's first stage, word for word and not in a comment; the
    harness stage the README shows comes after it; and a stage that fails stops the script."""
    readme_blocks, spans = _code(README)
    script = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    ran = [line.strip() for line in script.splitlines() if not line.lstrip().startswith("#")]
    first_stage = readme_blocks[1].strip()
    (second_stage,) = [span for span in spans if "pytest -m harness" in span]
    assert first_stage in ran, "the README's test command is not a line of .ci/run"
    assert second_stage in ran, "the README's harness command is not a line of .ci/run"
    assert ran.index(first_stage) < ran.index(second_stage)
    assert "--cov-append" in second_stage and "--cov-fail-under=90" in second_stage
    assert re.search(r"^set -\w*e", script, re.MULTILINE), ".ci/run must stop at a failure"


@pytest.mark.parametrize("page", PAGES, ids=lambda page: page.relative_to(ROOT).as_posix())
def test_every_path_a_page_names_exists(page):
    files = _repository_files()
    missing = []
    for path in _named_paths(page):
        if path.split("/")[0] in TOP_LEVEL:
            found = (ROOT / path).exists()
        else:
            found = any(file == path or file.endswith("/" + path) for file in files)
        if not found:
            missing.append(path)
    for target in LINK.findall(page.read_text(encoding="utf-8")):
        target = target.split("#")[0]  # the file part; a web address (https:) is no path
        is_path = target and not re.match(r"[a-z]+:", target)
        if is_path and not (page.parent / target).exists():
            missing.append(target)
    assert not missing, f"{page.relative_to(ROOT)} names paths that do not exist: {missing}"


@pytest.mark.parametrize("page", PAGES, ids=lambda page: page.relative_to(ROOT).as_posix())
def test_every_command_a_page_names_runs(page):
    subcommands, wrong = _subcommands(), []
    for line in _commands(page):
        for match in UNITRAIN_COMMAND.finditer(line):
            command, rest = match.groups()
            rest = re.split(r"\s#|&&|\s\|\s|;", rest)[0]
            if command not in subcommands:
                wrong.append(f"unitrain {command}: no such command")
                continue
            for flag in FLAG.findall(rest):
                if flag not in subcommands[command]:
                    wrong.append(f"unitrain {command} {flag}: no such option")
        for module in PYTHON_MODULE.findall(line):
            if not _module_exists(module):
                wrong.append(f"python -m {module}: no such module")
        for script in SCRIPT.findall(line):
            if not (ROOT / script).is_file():
                wrong.append(f"{script}: no such file")
    assert not wrong, f"{page.relative_to(ROOT)}: {wrong}"


def test_every_subcommand_answers_help(capsys):
    from unitrain.cli import main

    for command in _subcommands():
        with pytest.raises(SystemExit) as stopped:
            main([command, "--help"])
        assert stopped.value.code == 0, command
        assert f"usage: unitrain {command}" in capsys.readouterr().out
