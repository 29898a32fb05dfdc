"""The one GPU probe (feedpipe.loader.gpu): NVML when installed, else torch.cuda; the no-GPU
paths run on any machine."""

from __future__ import annotations

import importlib.util
import sys

import pytest
import torch

from feedpipe.errors import MissingDependencyError, ResourceError
from feedpipe.loader import gpu
from feedpipe.loader.dali import pipeline as dali_pipeline


def test_without_nvml_the_driver_is_torchs_cuda_or_unknown(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # nvidia-ml-py not installed
    with pytest.raises(MissingDependencyError, match=r"pip install 'feedpipe\[gpu\]'"):
        gpu.import_nvml()
    want = torch.version.cuda if torch.cuda.is_available() else None
    assert gpu.driver_cuda() == want
    pkg, how = dali_pipeline.dali_package(None)  # the DALI hint asks the same probe
    assert how == ("no CUDA found; default" if want is None else f"CUDA {want} (the driver)")
    assert pkg == "nvidia-dali-cuda130" if want is None else pkg.startswith("nvidia-dali-cuda")


@pytest.mark.skipif(importlib.util.find_spec("pynvml") is None, reason="nvidia-ml-py missing")
def test_with_nvml_a_driver_version_or_a_clear_error():
    try:
        nvml = gpu.import_nvml()
    except ResourceError as exc:  # installed, no driver here
        assert "no NVIDIA driver" in str(exc)
        assert gpu.driver_cuda() is None or torch.cuda.is_available()
        return
    major, minor = gpu.driver_cuda().split(".")  # e.g. "12.4"
    assert int(major) >= 10 and minor.isdigit()
    assert nvml.nvmlDeviceGetCount() >= 0

