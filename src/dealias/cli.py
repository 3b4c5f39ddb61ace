"""The `dealias` command line: `dealias demo` compiles built-in examples, prints their traces and checks
them against eager PyTorch."""

from __future__ import annotations

import argparse
import sys

from . import demo


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="dealias", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("demo", help="compile the built-in examples, print their traces, check them against eager")
    args = parser.parse_args(argv)
    if args.command == "demo":
        return demo.run()
    return 2


if __name__ == "__main__":
    sys.exit(main())
