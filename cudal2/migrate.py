"""Records written by earlier versions, in today's spelling.

The database applies ``upgrade`` to every record it reads, so files written before a
change keep meaning what they meant; the files themselves stay as written until they
are migrated (each line through ``upgrade``). Each upgrade is named by what changed:

- ``Status.SANITIZER``: before it, a compute-sanitizer memcheck failure was stored as
  status ``runtime`` with an error text starting ``compute-sanitizer memcheck`` (and
  the gate recognised it by that text). Now the status says it.
"""

from __future__ import annotations

from typing import Any

LEGACY_SANITIZER_PREFIX = "compute-sanitizer memcheck"


def upgrade(record: dict[str, Any]) -> dict[str, Any]:
    """``record`` (a ``Measurement.as_json`` dict) in today's spelling: a new dict where
    something changed, the same one otherwise (a record already in today's spelling
    passes unchanged)."""
    error = record.get("error") or ""
    if record.get("status") == "runtime" and error.startswith(LEGACY_SANITIZER_PREFIX):
        return {**record, "status": "sanitizer"}
    return record
