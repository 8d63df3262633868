"""Stand-in measuring workers for the host runner's CPU tests: a worker process per "GPU"
that answers from a ``ReplayRunner`` over a recorded H100 database, speaking the real
worker's pipe protocol through the worker's own loop (``verify/worker.py``'s ``serve``: a
hello with the GPU, then a ``Job`` as JSON in and ``{"result": ...}`` out, prepare
messages readied while the pipe is empty), with faults chosen by the test.

It is imported by its module name (``host_workers``, the tests put this folder on
``sys.path``) because the ``spawn`` context pickles a worker's entry point by name and
the child process imports it again.

``faults`` (every key optional):

- ``state``: a folder; each job run is appended to ``state/ran.log`` as one line
  ``device kind key`` (the tests count runs there), and a GPU that dies for good
  leaves ``state/dead-<device>`` so that its worker refuses to start again;
- ``crash``: job keys (a design key, or ``cublaslt:<target label>``) on which the
  worker exits at once (``os._exit``), as a kernel's illegal address kills it;
- ``hang``: job keys on which it sleeps forever (the pool's timeout ends it);
- ``die``: job keys on which the GPU dies for good: the worker leaves the ``dead``
  marker and exits, and no worker of that GPU starts again;
- ``dead``: devices whose worker never starts;
- ``models``: device -> the GPU model its hello names (mixed fleets);
- ``cublaslt``: device -> the cuBLASLt version its hello names;
- ``delay_s``: seconds each job takes (so several GPUs share a batch);
- ``job_s``: the job seconds the worker reports in its answers (``JobResult.job_s``;
  absent: none, as the real worker before it timed its jobs);
- ``prepare_s``: seconds each target's preparation takes (logged ``device prepare
  <target label>`` in ``state/ran.log``);
- ``prepare_crash``: target labels whose preparation kills the worker (``os._exit``);
  ``prepare_cuda``: labels whose preparation raises a CUDA error (the worker leaves).
"""

from __future__ import annotations

import dataclasses
import os
import socket
import time
from pathlib import Path
from typing import Any

from cudal2.database import MeasurementDB
from cudal2.records import Job, JobKind, JobResult, Target, TimingConfig
from cudal2.verify.inputs import InputCache
from cudal2.verify.replay import ReplayRunner
from cudal2.verify.worker import serve


def job_key(job: Job) -> str:
    """What ``faults`` name a job by."""
    if job.kind == JobKind.AUTOTUNE or job.design is None:
        return f"cublaslt:{job.target.label}"
    return job.design.key


def replay_worker(conn: Any, device: int, db: str, faults: dict[str, Any] | None = None) -> None:
    """The entry point (``functools.partial(replay_worker, db=..., faults=...)``)."""
    faults = faults or {}
    state = Path(faults["state"]) if faults.get("state") else None
    if device in faults.get("dead", ()) or (state and (state / f"dead-{device}").exists()):
        os._exit(4)  # the GPU is gone: no hello
    contents = MeasurementDB(db).load(warn=False)
    replay = ReplayRunner(contents.measurements, checks=contents.checks, name=db)
    gpu = dataclasses.replace(
        replay.gpu,
        name=faults.get("models", {}).get(device, replay.gpu.name),
        index=device,
        host=socket.gethostname(),
    )
    version = faults.get("cublaslt", {}).get(device, replay.cublaslt_version)
    conn.send({"hello": gpu.as_json(), "cublaslt_version": version})

    def answer(job: Job) -> JobResult:
        key = job_key(job)
        if state:
            with open(state / "ran.log", "a") as f:
                f.write(f"{device} {job.kind.value} {key}\n")
        if key in faults.get("die", ()):
            assert state is not None, "a GPU that dies for good needs faults['state']"
            (state / f"dead-{device}").touch()
            os._exit(3)
        if key in faults.get("crash", ()):
            os._exit(3)
        if key in faults.get("hang", ()):
            time.sleep(3600)
        time.sleep(faults.get("delay_s", 0.0))
        res: JobResult = replay.answer(job)
        if "job_s" in faults:
            res = dataclasses.replace(res, job_s=faults["job_s"])
        return res

    def ready(t: Target, timing: TimingConfig) -> None:
        time.sleep(faults.get("prepare_s", 0.0))
        if t.label in faults.get("prepare_crash", ()):
            os._exit(3)
        if t.label in faults.get("prepare_cuda", ()):
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        if state:
            with open(state / "ran.log", "a") as f:
                f.write(f"{device} prepare {t.label}\n")

    serve(conn, answer, ready, InputCache())
