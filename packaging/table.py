"""Reading dispatch tables from files: a ``dispatch.json``, or the one inside a
generated wheel (``<package>/dispatch.json``).

The table's schema, its rules and its canonical bytes are the runtime's
(``cudal2.packaging.runtime.table``: ``DispatchTable``, ``TableError``); this module only
finds and reads the bytes, so a missing file, a broken wheel or a malformed table all
fail here with a message naming the file.
"""

from __future__ import annotations

import zipfile
from pathlib import Path

from wheel.wheelfile import WheelError, WheelFile

from .runtime.table import DispatchTable, TableError


def read_table(path: str | Path) -> DispatchTable:
    """Read and validate the dispatch table of a ``.whl`` or of a ``dispatch.json`` file.

    Raises :class:`TableError` when the file is missing or unreadable, is not a
    wheel / not JSON, or holds a table that breaks format 1.
    """
    path = Path(path)
    # Checked up front: WheelFile would otherwise report a missing file by its name.
    if not path.is_file():
        reason = "no such file" if not path.exists() else "not a regular file"
        raise TableError(f"{path}: cannot read: {reason}")
    if path.suffix == ".whl":
        raw, source = _read_from_wheel(path)
    else:
        source = str(path)
        try:
            raw = path.read_bytes()
        except OSError as exc:
            raise TableError(f"{source}: cannot read: {exc.strerror or exc}") from exc
    return DispatchTable.from_bytes(raw, source)


def _read_from_wheel(path: Path) -> tuple[bytes, str]:
    """The bytes of ``<package>/dispatch.json`` inside a wheel, and a name for messages."""
    try:
        # WheelFile checks each member against RECORD as it is read, so a corrupted
        # wheel is reported here rather than yielding a half-right table.
        with WheelFile(path) as whl:
            names = [
                n for n in whl.namelist() if n.count("/") == 1 and n.endswith("/dispatch.json")
            ]
            if len(names) != 1:
                found = ", ".join(names) if names else "none"
                raise TableError(
                    f"{path}: expected exactly one <package>/dispatch.json in the wheel, "
                    f"found {found}"
                )
            return whl.read(names[0]), f"{path}!{names[0]}"
    except OSError as exc:
        raise TableError(f"{path}: cannot read: {exc.strerror or exc}") from exc
    except (zipfile.BadZipFile, WheelError) as exc:
        raise TableError(f"{path}: not a readable wheel: {exc}") from exc
