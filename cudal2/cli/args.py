"""Command-line arguments of the cudal2 CLIs: the parser and the argument types they share.

A bad argument is the user's mistake, found before any work starts: one line on stderr
(``cudal2-build: error: argument --jobs: must be a positive integer, got '-1'``) and
exit status 2, never a traceback and never a half-done build. Paths are checked for
what the command will do with them (read a file, write a file, fill a folder), so a
build that would fail at its last step, writing its wheel or its checkpoint, fails
at its first.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import NoReturn

EXIT_USAGE = 2


class UsageError(Exception):
    """A bad command line; ``str()`` is the one line to print."""


class Parser(argparse.ArgumentParser):
    """``argparse.ArgumentParser`` whose errors are one line (argparse prints the whole
    usage first, which for these CLIs is many lines) raised as ``UsageError``, so a
    CLI's ``main(argv)`` returns 2 instead of exiting the interpreter (tests call it).
    Sub-parsers made with ``add_subparsers().add_parser`` are of this class too."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{self.prog}: error: {message} (see {self.prog} --help)")

    def parse(self, argv: Sequence[str] | None) -> argparse.Namespace | int:
        """``parse_args(argv)``, or the exit status 2 after printing the error's line."""
        try:
            return self.parse_args(argv)
        except UsageError as e:
            print(" ".join(str(e).split()), file=sys.stderr)
            return EXIT_USAGE


def fail(prog: str, message: str) -> int:
    """Print a usage error found after parsing as one line; returns the exit status 2."""
    print(f"{prog}: error: {' '.join(message.split())}", file=sys.stderr)
    return EXIT_USAGE


def _integer(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None


def positive_int(text: str) -> int:
    """An integer >= 1 (``--jobs``, ``--reps``, seeds counts)."""
    value = _integer(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text!r}")
    return value


def non_negative_int(text: str) -> int:
    """An integer >= 0 (``--device``, step counts, seeds)."""
    value = _integer(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be an integer >= 0, got {text!r}")
    return value


def seed(text: str) -> int:
    """A seed every generator takes (Python's, torch's): 0 to 2**32 - 1."""
    value = non_negative_int(text)
    if value > 2**32 - 1:
        raise argparse.ArgumentTypeError(f"must be at most {2**32 - 1}, got {text!r}")
    return value


def positive_float(text: str) -> float:
    """A finite number > 0 (a learning rate)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"must be a finite number > 0, got {text!r}")
    return value


def _nearest_existing(path: Path) -> Path:
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def _writable_folder(path: Path, what: str, text: str) -> None:
    base = _nearest_existing(path)
    if not base.is_dir():
        raise argparse.ArgumentTypeError(f"{what} {text!r} cannot be made: {base} is not a folder")
    if not os.access(base, os.W_OK | os.X_OK):
        raise argparse.ArgumentTypeError(f"{what} {text!r} cannot be made: {base} is not writable")


def out_folder(text: str) -> Path:
    """A folder to write into: an existing folder, or one that can be made (its nearest
    existing ancestor is a writable folder). An existing file is refused."""
    path = Path(text).expanduser()
    if path.exists() and not path.is_dir():
        raise argparse.ArgumentTypeError(f"{text!r} exists and is not a folder")
    _writable_folder(path, "folder", text)
    return path


def out_file(text: str) -> Path:
    """A file to write (or append to): not a folder, in a folder that exists."""
    path = Path(text).expanduser()
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"{text!r} is a folder, not a file")
    in_folder(text)
    return path


def out_prefix(text: str) -> Path:
    """A path that names files by adding suffixes (a checkpoint: ``<path>.safetensors``,
    ``<path>.json``): its folder exists or can be made."""
    path = Path(text).expanduser()
    _writable_folder(path.parent, "folder", str(path.parent))
    return path


def in_folder(text: str) -> Path:
    """A file path whose folder exists (the file itself may not yet): a file that a
    command reads if present and later writes, such as a measurement database. What
    the file is, when it exists, is the reader's to check."""
    path = Path(text).expanduser()
    folder = path.parent
    if not folder.is_dir():
        reason = "does not exist" if not folder.exists() else "is not a folder"
        raise argparse.ArgumentTypeError(f"{text!r}: its folder {str(folder)!r} {reason}")
    return path


def in_file(text: str) -> Path:
    """An existing regular file to read."""
    path = Path(text).expanduser()
    if not path.exists():
        raise argparse.ArgumentTypeError(f"{text!r}: no such file")
    if not path.is_file():
        raise argparse.ArgumentTypeError(f"{text!r} is not a regular file")
    if not os.access(path, os.R_OK):
        raise argparse.ArgumentTypeError(f"{text!r} is not readable")
    return path


def in_dir(text: str) -> Path:
    """An existing folder to read."""
    path = Path(text).expanduser()
    if not path.is_dir():
        reason = "no such folder" if not path.exists() else "not a folder"
        raise argparse.ArgumentTypeError(f"{text!r}: {reason}")
    return path
