"""The ``fencegate`` command line."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

from leases import cli as leases_cli


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="fencegate", description="Fenced leases and a side-effect gateway."
    )
    sub = p.add_subparsers(dest="command", required=True)
    leases_cli.add_commands(sub)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    args = parser().parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
