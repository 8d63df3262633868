"""Each integrity check of the fault-injection suite can fail: for every row of
``MUTATIONS`` the check is disabled in the working tree (one exact text replacement),
the fault tests that guard it are run, and they must fail; the file is restored after
each row, whatever happens to the tests (if this script itself is killed, restore the
file with ``git checkout``).

    python ci/fault_mutations.py [--only NAME] [--json bench/results/fault-mutations.json]

A row whose tests still pass with its check disabled is a check nothing tests: exit 1.
A row whose text is no longer found (the code moved) is an error: exit 2, fix the row.
Run it from a checkout whose ``cudal2`` is this tree (``pip install -e .``); CPU only.
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Mutation:
    name: str  # the check, as the issue names it
    path: str  # the file holding it, from the repository root
    old: str  # its text (must occur exactly once)
    new: str  # the text that disables it
    tests: str  # the pytest arguments that must then fail


F = "tests/faults/"
# (name, file, the check's text, the text that disables it, the tests that must fail)
MUTATIONS = [
    Mutation("cache: cubin sha256 checked on read", "generator/cache.py",
             "if sha != result.cubin_sha256 or len(data) != result.cubin_size:", "if False:",
             F + "test_cache_faults.py -k tampered"),
    Mutation("cache: a failed compile's entry gives no cubin", "generator/cache.py",
             "            if want_cubin:\n                raise _Broken(\"a cubin was asked",
             "            if False:\n                raise _Broken(\"a cubin was asked",
             F + "test_cache_faults.py"),
    Mutation("cache: cubins compiled at a fixed path (reproducible)", "generator/nvcc.py",
             "    root = source_root()\n    fd = None if root is None",
             "    root = None\n    fd = None if root is None",
             F + "test_cache_faults.py -k fresh_caches"),
    Mutation("kill: nvcc in its own process group", "generator/nvcc.py",
             "            process_group=0,\n", "",
             F + "test_cache_faults.py -k killed"),
    Mutation("wheel: appears only by an atomic rename", "packaging/wheel.py",
             'tmp_path = out_dir / owned_name(TEMP_PREFIX, ".part")',
             "tmp_path = out_dir / filename",
             F + "test_cache_faults.py -k 'wheel and killed'"),
    Mutation("database: a median is the median of its samples", "cudal2/database.py",
             "if not math.isclose(m.median_us, med, rel_tol=MEDIAN_REL_TOL):", "if False:",
             F + "test_database_faults.py"),
    Mutation("database: no time below the physical floor", "cudal2/database.py",
             "if value is not None and value < floor:", "if False:",
             F + "test_database_faults.py"),
    Mutation("database: numbers are numbers (schema)", "cudal2/schema.py",
             "    ok = ok and (infinite or math.isfinite(v)) and (v > 0 if positive else v >= 0)\n",
             "    ok = True\n",
             F + "test_database_faults.py"),
    Mutation("gate: no kernel ships without a clean memcheck", "cudal2/verdicts.py",
             "return self.state(key) == Gate.CLEAN and not self.blocked(key.artifact)",
             "return not self.vetoed(key.artifact)",
             F + "test_database_faults.py"),
    Mutation("gate: an unfinished check blocks (a torn line)", "cudal2/verdicts.py",
             "return self.state(key) == Gate.CLEAN and not self.blocked(key.artifact)",
             "return self.state(key) == Gate.CLEAN and not self.vetoed(key.artifact)",
             F + "test_database_faults.py"),
    Mutation("manifest: at most MAX_TARGETS targets per group", "cudal2/manifest.py",
             "if count > MAX_TARGETS:", "if False:",
             F + "test_manifest_faults.py"),
    Mutation("manifest: dimensions checked after model expansion", "cudal2/manifest.py",
             "            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= "
             "value <= MAX_DIM:\n                raise r.fail(\n",
             "            if False:\n                raise r.fail(\n",
             F + "test_manifest_faults.py"),
    Mutation("manifest: versions are PEP 440 (packaging's parser)", "packaging/wheel.py",
             "        parsed = Version(version)\n    except InvalidVersion:",
             "        parsed = version\n    except InvalidVersion:",
             F + "test_manifest_faults.py"),
    Mutation("cli: a negative --jobs is exit 2", "cudal2/cli/args.py",
             '    if value < 1:\n        raise argparse.ArgumentTypeError(f"must be a positive',
             '    if False:\n        raise argparse.ArgumentTypeError(f"must be a positive',
             F + "test_cli_faults.py"),
    Mutation("runtime: a table entry missing a key is refused", "packaging/runtime/table.py",
             'raise TableError(f"missing key {key!r}")', "pass",
             F + "test_table_faults.py"),
    Mutation("runtime: launch limits (shared memory)", "packaging/runtime/table.py",
             'if recipe["smem_bytes"] > lim.dynamic_smem_bytes:', "if False:",
             F + "test_table_faults.py"),
    Mutation("diff: cubins compared", "packaging/diff.py",
             "(CUBIN_CHANGED, b.cubin_sha256 != a.cubin_sha256)", "(CUBIN_CHANGED, False)",
             F + "test_diff_faults.py"),
    Mutation("diff: nesting depth bounded", "packaging/table.py",
             "if _deeper_than(obj, MAX_DEPTH):", "if False:",
             F + "test_diff_faults.py"),
]  # fmt: skip


def run(m: Mutation) -> dict:
    path = ROOT / m.path
    text = path.read_text()
    if text.count(m.old) != 1:
        raise SystemExit(f"{m.name}: its text occurs {text.count(m.old)} times in {m.path}")
    started = time.monotonic()
    try:
        path.write_text(text.replace(m.old, m.new))
        proc = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider",
             *shlex.split(m.tests)],
            cwd=ROOT, capture_output=True, text=True, timeout=900,
            start_new_session=True,  # a disabled process group must not kill this script
        )  # fmt: skip
    finally:
        path.write_text(text)
    last = (proc.stdout.strip().splitlines() or [""])[-1]
    if proc.returncode < 0:
        last = f"the test run was killed by signal {-proc.returncode}"
    failed = [ln.split(" - ")[0] for ln in proc.stdout.splitlines() if ln.startswith("FAILED ")]
    return {
        "check": m.name,
        "file": m.path,
        "tests": m.tests,
        # 1: tests failed; below 0: the run was killed (a disabled process group lets the
        # build's group kill reach pytest); 0 passed, 2 to 5: interrupted or none collected
        "caught": proc.returncode == 1 or proc.returncode < 0,
        "exit": proc.returncode,
        "first_failure": failed[0].removeprefix("FAILED ") if failed else "",
        "summary": last,
        "seconds": round(time.monotonic() - started, 1),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", help="run the rows whose name contains this")
    ap.add_argument("--json", type=Path, help="write the results here")
    args = ap.parse_args()
    rows = [m for m in MUTATIONS if not args.only or args.only in m.name]
    results = []
    for m in rows:
        r = run(m)
        results.append(r)
        mark = "caught" if r["caught"] else "NOT CAUGHT"
        print(f"{mark:10}  {m.name:58}  {r['summary']}", flush=True)
    if args.json:
        args.json.write_text(json.dumps({"mutations": results}, indent=1) + "\n")
    missed = [r for r in results if not r["caught"]]
    print(f"{len(results) - len(missed)} of {len(results)} disabled checks caught by the suite")
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
