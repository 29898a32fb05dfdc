"""The one way feedpipe asks about NVIDIA GPUs and their driver: NVML (``nvidia-ml-py``, the
``feedpipe[gpu]`` extra) when installed, else ``torch.cuda``; in the loader layer for DALI."""

from __future__ import annotations

from types import ModuleType

from ..errors import MissingDependencyError, ResourceError


def import_nvml() -> ModuleType:
    """``pynvml``, initialised; a MissingDependencyError without ``nvidia-ml-py``, a
    ResourceError when NVML cannot start (no driver loaded)."""
    try:
        import pynvml
    except ImportError:
        raise MissingDependencyError("GPU monitoring needs NVML bindings (the nvidia-ml-py "
                                     "package): pip install 'feedpipe[gpu]'") from None
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        raise ResourceError(f"NVML is installed but cannot start ({exc}): no NVIDIA driver "
                            "is loaded or no GPU is visible on this machine") from None
    return pynvml


def driver_cuda() -> str | None:
    """The newest CUDA version the driver supports (e.g. "12.4"): NVML's, else torch's CUDA build
    when torch can use a GPU (the driver runs at least that), else None."""
    try:
        nvml = import_nvml()
    except (MissingDependencyError, ResourceError):
        nvml = None
    if nvml is not None:
        try:
            v = int(nvml.nvmlSystemGetCudaDriverVersion_v2())  # e.g. 12040 for 12.4
        except nvml.NVMLError:
            v = 0
        if v > 0:
            return f"{v // 1000}.{v % 1000 // 10}"
    import torch

    return torch.version.cuda if torch.cuda.is_available() and torch.version.cuda else None
