"""What machine a measurement ran on (CPU, usable cores, memory, GPU, /dev/shm, library versions),
for bench's reports and doctor: read without side effects, as plain JSON types; a failed probe
gives ``None``.
"""

from __future__ import annotations

import os
import platform
import shutil
from importlib import metadata, util
from pathlib import Path
from typing import Any

from ..schema.imaging import decoder_info
from ..system import usable_cores

LIBRARIES = {  # import name -> distribution names to ask for the version, in order
    "torch": ("torch",), "numpy": ("numpy",), "PIL": ("pillow-simd", "Pillow-SIMD", "pillow"),
    "simplejpeg": ("simplejpeg",), "lmdb": ("lmdb",), "h5py": ("h5py",),
    "webdataset": ("webdataset",), "psutil": ("psutil",),
    "nvidia.dali": ("nvidia-dali-cuda130", "nvidia-dali-cuda120", "nvidia-dali-cuda110",
                    "nvidia-dali"),
}
THREAD_ENV = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")


def cpu_model() -> str:
    """The CPU's marketing name (``/proc/cpuinfo``), else what ``platform`` reports."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def cgroup_cpu_limit(root: str | os.PathLike[str] = "/sys/fs/cgroup") -> float | None:
    """The cgroup CPU quota in cores (``docker --cpus``; v2 ``cpu.max`` or v1 ``cpu.cfs_*``),
    or None when unlimited or unknown."""
    root = Path(root)
    try:
        quota, period = (root / "cpu.max").read_text().split()[:2]
    except (OSError, ValueError):
        try:
            quota = (root / "cpu" / "cpu.cfs_quota_us").read_text().strip()
            period = (root / "cpu" / "cpu.cfs_period_us").read_text().strip()
        except OSError:
            return None
    if quota in ("max", "-1"):
        return None
    try:
        return int(quota) / int(period)
    except (ValueError, ZeroDivisionError):
        return None


def memory() -> dict[str, int | None]:
    """Total and available RAM in bytes (psutil; None where it cannot tell)."""
    import psutil

    try:
        vm = psutil.virtual_memory()
    except (OSError, RuntimeError):
        return {"total": None, "available": None}
    return {"total": int(vm.total), "available": int(vm.available)}


def host_available_bytes() -> int:
    """RAM the kernel could give this machine's processes now (MemAvailable), in bytes."""
    avail = memory()["available"]
    return avail if avail is not None else os.sysconf("SC_AVPHYS_PAGES") * os.sysconf(
        "SC_PAGE_SIZE")


def shm_usage(path: str = "/dev/shm") -> dict[str, int] | None:
    """Size and free bytes of /dev/shm, through which DataLoader workers hand batches over."""
    try:
        du = shutil.disk_usage(path)
    except OSError:
        return None
    return {"total": du.total, "free": du.free}


def fs_type(path: str | os.PathLike[str], mounts: str = "/proc/mounts") -> str | None:
    """Filesystem type holding ``path`` (longest matching mount point), e.g. 'ext4', 'nfs4'."""
    target = os.path.realpath(path)
    best, kind = "", None
    try:
        lines = Path(mounts).read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        parts = line.split()
        if len(parts) < 3:
            continue
        point = parts[1].replace("\\040", " ")
        inside = target == point or target.startswith(point.rstrip("/") + "/")
        if inside and len(point) >= len(best):
            best, kind = point, parts[2]
    return kind


def gpus() -> list[dict[str, Any]]:
    """CUDA devices torch can see: name, memory, compute capability."""
    import torch

    if not torch.cuda.is_available():
        return []
    out = []
    for i in range(torch.cuda.device_count()):
        p = torch.cuda.get_device_properties(i)
        out.append({"index": i, "name": p.name, "memory": int(p.total_memory),
                    "capability": f"{p.major}.{p.minor}"})
    return out


def library_versions() -> dict[str, str | None]:
    """Installed versions of the libraries that decide loading speed (None: not installed)."""
    out: dict[str, str | None] = {"python": platform.python_version()}
    for module, dists in LIBRARIES.items():
        version = None
        if util.find_spec(module.split(".")[0]) is not None:
            for dist in dists:
                try:
                    version = metadata.version(dist)
                    break
                except metadata.PackageNotFoundError:
                    continue
        out["pillow" if module == "PIL" else module.replace("nvidia.", "")] = version
    return out


def describe() -> dict[str, Any]:
    """The whole machine description as plain JSON types."""
    import torch

    return {
        "platform": platform.platform(),
        "cpu_model": cpu_model(),
        "cores_machine": os.cpu_count(),
        "cores_usable": usable_cores(),
        "cgroup_cpu_limit": cgroup_cpu_limit(),
        "memory": memory(),
        "shm": shm_usage(),
        "cuda_available": torch.cuda.is_available(),
        "cuda_version": torch.version.cuda,
        "gpus": gpus(),
        "torch_threads": torch.get_num_threads(),
        "thread_env": {k: os.environ.get(k) for k in THREAD_ENV},
        "libraries": library_versions(),
        "decoders": decoder_info(),
    }


def summary_line(machine: dict[str, Any]) -> str:
    """One line for titles and reports: 'AMD EPYC, 2/2 cores, 7.7 GiB RAM, no GPU'."""
    cores = f"{machine['cores_usable']}/{machine['cores_machine']} cores"
    ram = machine["memory"].get("total")
    gpu = ", ".join(g["name"] for g in machine["gpus"]) or "no GPU"
    parts = [machine["cpu_model"], cores] + ([f"{ram / 2**30:.1f} GiB RAM"] if ram else [])
    return ", ".join(parts + [gpu])
