"""`dflash-trt` command line: a small dispatcher; each subcommand lives in dflash_trt/commands/<name>.py.

A command module exposes `register(subparsers)`, which adds its parser and sets `func=run`, and
`run(args) -> int`. User errors (DFlashError) are printed as one line without a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from dflash_trt.errors import DFlashError

COMMANDS = ("generate", "bench", "bench_report", "bench_loaded", "check_batching", "demo", "engine", "plan", "repo",
            "serve", "openai", "train_drafter")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dflash-trt", description=__doc__.splitlines()[0])
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMANDS:
        importlib.import_module(f"dflash_trt.commands.{name}").register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = build_parser().parse_args(argv)
    args.argv = argv  # the command line as given, for reports that state how they were produced
    try:
        return int(args.func(args) or 0)
    except DFlashError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
