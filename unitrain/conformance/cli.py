"""``unitrain conformance``: run the kit on one backend, print the verdict, write the report."""

from __future__ import annotations

import argparse
import sys
from typing import Any

__all__ = ["add_arguments", "main"]

_MARKS = {"passed": ".", "failed": "F", "skipped": "s", "xfailed": "x", "xpassed": "X"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the ``conformance`` subcommand's options to ``parser``."""
    parser.add_argument(
        "--backend",
        help="torch, jax, tensorflow, numpy, an entry-point name or pkg.module:Class "
        "(default: $UNITRAIN_BACKEND, else the first installed)",
    )
    parser.add_argument("--device", default="all", choices=("cpu", "gpu", "all"))
    parser.add_argument("--dtype", action="append", help="check only this dtype (repeatable)")
    parser.add_argument("--report", help="write the JSON report here")
    parser.add_argument("-k", dest="keyword", help="select checks by id, pytest -k style")
    parser.add_argument(
        "--layer",
        help="certify your own layer instead: pkg.module:Name, a layer class with "
        "conformance_cases() or a function returning [(id, layer, input_shape), ...]",
    )
    parser.add_argument("--hypothesis-profile", default="ci", choices=("ci", "dev"))
    parser.add_argument(
        "--list",
        action="store_true",
        help="list the check ids, what each checks and the bugs it fails on, and exit",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="one line per check")


def main(args: Any) -> int:
    """Run the kit as ``args`` say; return 0 when nothing failed, 1 otherwise."""
    from unitrain.backends.registry import default_backend_name
    from unitrain.conformance import all_checks, run

    if args.list:
        for item in all_checks():
            print(f"{item.base_id:55s} {item.description}")
            print(f"{'':4s}fails on: {item.guards}")
        return 0
    backend = args.backend or default_backend_name()

    def progress(result: Any) -> None:
        if args.verbose:
            print(f"{result.status.upper():8s} {result.id} ({result.duration_s:.2f}s)", flush=True)
        else:
            print(_MARKS[result.status], end="", flush=True)

    report = run(
        backend,
        device=args.device,
        dtypes=args.dtype,
        keyword=args.keyword,
        hypothesis_profile=args.hypothesis_profile,
        progress=progress,
        layer=args.layer,
    )
    if not args.verbose:
        print()
    print(report.table(verbose=args.verbose))
    if args.report:
        print(f"report: {report.write(args.report)}")
    sys.stdout.flush()
    return 1 if report.failed else 0
