"""The runner a build measures through, made from the manifest's ``[runner]`` table (or
``cudal2-build --runner`` / ``--ray-address``, which override it): docs/runners.md.

- ``local``: worker processes on one GPU of this host (``LocalRunner``, ``--device``);
- ``host``: a worker process on every GPU of this host, or on ``devices``
  (``HostRunner``, ``verify/host.py``);
- ``ray``: an actor per GPU of a Ray cluster (``RayRunner``, ``verify/ray_runner.py``;
  Ray is the optional extra ``cudal2[ray]``); it needs no GPU here.

The worker side is imported only when its runner is made: a build without a GPU, or
with another runner, never imports torch's side or Ray.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from typing import TYPE_CHECKING

from cudal2.manifest import RunnerSettings
from cudal2.verify.gpu import gpu_names

if TYPE_CHECKING:
    from cudal2.verify.runner import Runner


class RunnerUnavailableError(RuntimeError):
    """The runner asked for cannot be made here (Ray not installed, a device this host
    does not have): the message says what to do. The CLI exits 2, having written nothing."""


def make_runner(
    settings: RunnerSettings, device: int = 0, log: Callable[[str], None] | None = None
) -> Runner:
    """The runner ``settings`` name; ``device``: the local runner's CUDA device;
    ``log``: where the host runner reports a GPU it retired."""
    if settings.kind == "local":
        from cudal2.verify.local import LocalRunner  # the worker side: imported on a GPU

        return LocalRunner(device, job_timeout_s=settings.job_timeout_s)
    if settings.kind == "host":
        from cudal2.verify.host import HostRunner

        visible = len(gpu_names())
        devices = list(range(visible)) if settings.devices is None else list(settings.devices)
        absent = [d for d in devices if d >= visible]
        if absent or not devices:
            raise RunnerUnavailableError(
                f"[runner] devices {devices} names CUDA devices this host does not have: "
                f"{visible} GPUs are visible (devices 0 to {visible - 1}; "
                "CUDA_VISIBLE_DEVICES honoured)"
                if absent
                else "[runner] kind = 'host' found no GPU visible here (nvidia-smi, "
                "CUDA_VISIBLE_DEVICES)"
            )
        return HostRunner(
            devices,
            job_timeout_s=settings.job_timeout_s,
            interchangeable=settings.interchangeable,
            log=log,
        )
    if settings.kind == "ray":
        if importlib.util.find_spec("ray") is None:
            raise RunnerUnavailableError(
                "the Ray runner needs Ray, which is not installed here: "
                "pip install 'cudal2[ray]' (docs/runners.md)"
            )
        try:
            from cudal2.verify.ray_runner import RayRunner
        except ImportError as e:
            raise RunnerUnavailableError(f"the Ray runner cannot be loaded: {e}") from e
        return RayRunner(
            settings.ray_address,
            interchangeable=settings.interchangeable,
            job_timeout_s=settings.job_timeout_s,
        )
    raise RunnerUnavailableError(f"no runner of kind {settings.kind!r}")
