"""``cudal2-build`` that stops at one point of its work and waits there to be killed
(run as a script by tests/faults/test_cache_faults.py).

``CUDAL2_PAUSE_AT`` names the point; on reaching it the build writes its pid to
``CUDAL2_PAUSE_MARKER`` and sleeps. Points: ``entry-rename`` (a compiled entry staged
in the cache's tmp/, not yet renamed into place), ``wheel-half`` (the wheel half
written), ``wheel-rename`` (the wheel written whole under its temporary name, not yet
renamed), ``none`` (no pause: a kill during compile uses a fake nvcc instead).
"""

from __future__ import annotations

import os
import signal
import sys
import time
import zipfile
from pathlib import Path


def _pause() -> None:
    Path(os.environ["CUDAL2_PAUSE_MARKER"]).write_text(str(os.getpid()))
    time.sleep(600)


def _install(point: str) -> None:
    if point == "entry-rename":
        rename = os.rename

        def paused_rename(src, dst, *args, **kwargs):
            if Path(src).name == "entry":
                _pause()
            return rename(src, dst, *args, **kwargs)

        os.rename = paused_rename
    elif point == "wheel-half":
        writestr = zipfile.ZipFile.writestr
        calls = [0]

        def paused_writestr(self, *args, **kwargs):
            calls[0] += 1
            if calls[0] == 6:
                self.fp.flush()
                _pause()
            return writestr(self, *args, **kwargs)

        zipfile.ZipFile.writestr = paused_writestr
    elif point == "wheel-rename":
        replace = os.replace

        def paused_replace(src, dst, *args, **kwargs):
            if str(dst).endswith(".whl"):
                _pause()
            return replace(src, dst, *args, **kwargs)

        os.replace = paused_replace
    elif point != "none":
        raise SystemExit(f"unknown pause point {point!r}")


if __name__ == "__main__":
    # As at a terminal: a test runner started in the background may hand its children
    # SIGINT ignored, and then Ctrl-C would not reach the build.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    _install(os.environ.get("CUDAL2_PAUSE_AT", "none"))
    from cudal2.cli.build import main

    sys.exit(main(sys.argv[1:]))
