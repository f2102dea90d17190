"""Command-line flags, checked before any work starts: one line naming the fix, exit status 2.

Every script builds its parser with ``Parser`` instead of ``argparse.ArgumentParser``: a bad
flag raises LaunchError, which ``run_main`` prints once (rank 0 under torchrun) without the
usage block, before the process group forms or data is read. The flag types say what a
value must be::

    p = Parser(description="...")
    p.add_argument("--epochs", type=positive_int, default=8)
    p.add_argument("--lr", type=positive_float, default=0.05)
    p.add_argument("--checkpoint", type=writable_path, default="")
"""
from __future__ import annotations

import argparse
import os
import tempfile

from source_code.errors import LaunchError


class Parser(argparse.ArgumentParser):
    def error(self, message: str):
        raise LaunchError(f"error: {message} ({self.prog} --help lists the flags)")


def _number(kind, text: str, ok, what: str):
    try:
        value = kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not ok(value):
        raise argparse.ArgumentTypeError(f"{text} is not {what}")
    return value


def positive_int(text: str) -> int:
    return _number(int, text, lambda v: v > 0, "a positive integer (>= 1)")


def nonnegative_int(text: str) -> int:
    return _number(int, text, lambda v: v >= 0, "a count >= 0")


def positive_float(text: str) -> float:
    return _number(float, text, lambda v: v > 0 and v == v and v != float("inf"), "a positive number")


def fraction(text: str) -> float:
    """A value in [0, 1): momentum, dropout."""
    return _number(float, text, lambda v: 0 <= v < 1, "in [0, 1)")


def writable_path(text: str) -> str:
    """A file or directory path whose parent directory exists or can be made, and is writable.

    Checked by creating and removing a file there, so a read-only or missing mount fails now
    and not after the first epoch."""
    if not text:
        return text
    parent = os.path.dirname(os.path.abspath(text)) or "."
    try:
        os.makedirs(parent, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=parent, prefix=".write-test-"):
            pass
    except OSError as exc:
        raise argparse.ArgumentTypeError(
            f"cannot write to {parent} ({exc.strerror}); choose a directory you can write, "
            "e.g. under $SCRATCH or $HOME") from None
    return text
