"""Logging for the command-line entry points (`completer`, `completer-lsp`): the one `--log-level`
flag and the one set-up behind it."""
from __future__ import annotations

import argparse
import logging
import sys

LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


def add_argument(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--log-level", type=str.upper, choices=LEVELS, default="WARNING", metavar="LEVEL",
                    help=f"the least severe log records shown on stderr: {', '.join(LEVELS)} (any case) "
                         "[default: WARNING]")


def configure(level: str) -> None:
    logging.basicConfig(stream=sys.stderr, level=level, format="%(asctime)s %(name)s %(levelname)s %(message)s")
