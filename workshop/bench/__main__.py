"""``python -m workshop.bench ...`` (same as ``workshop bench ...``)."""

import argparse
import sys

from .cli import add_subcommands


def main(argv: list[str] | None = None) -> int:
    # Named as it will be once wired into the workshop command: "workshop bench ..."
    parser = argparse.ArgumentParser(prog="workshop")
    sub = parser.add_subparsers(dest="command", required=True)
    add_subcommands(sub)
    args = parser.parse_args(["bench", *(sys.argv[1:] if argv is None else argv)])
    return args.func(args) or 0


if __name__ == "__main__":
    sys.exit(main())
