"""feedpipe.ray.convert on a local Ray cluster (2 CPUs, one per module): the same dataset as the
CLI for the same input, per-sample bytes included, targets (distance maps) computed in the Ray
workers."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

import feedpipe
from converters import convert as cli_convert
from converters.synth import make_segmentation
from feedpipe.dataset.verify import verify

ray = pytest.importorskip("ray")
fray = pytest.importorskip("feedpipe.ray")


@pytest.fixture(scope="module")
def cluster():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def _same(a, b) -> None:
    assert len(a) == len(b) and a.classes == b.classes
    assert a.schema.to_json() == b.schema.to_json()
    assert [a.key_of(i) for i in range(len(a))] == [b.key_of(i) for i in range(len(b))]
    for x, y in zip(a.read_raw_batch(range(len(a))), b.read_raw_batch(range(len(b))), strict=True):
        assert x.keys() == y.keys()
        for name, value in x.items():
            if isinstance(value, np.ndarray):  # masks and targets: same dtype, shape and bytes
                assert value.dtype == y[name].dtype and value.tobytes() == y[name].tobytes()
            else:
                assert value == y[name], name


def test_ray_wds_equals_cli(cluster, photo_dir, tmp_path):
    subprocess.run([sys.executable, "-m", "feedpipe.cli", "convert", str(photo_dir), "--to",
                    "wds", "-o", str(tmp_path / "cli"), "-q", "--workers", "2"], check=True)
    res = fray.convert(photo_dir, tmp_path / "ray", to="wds", parts=3)
    assert res.parts == 3 and res.num_samples == 72
    _same(feedpipe.open_dataset(tmp_path / "ray"), feedpipe.open_dataset(tmp_path / "cli"))
    assert verify(tmp_path / "ray").ok


@pytest.mark.heavy
def test_ray_distance_maps_and_path_dataset(cluster, tmp_path):
    """Masks and distance-map targets computed in Ray workers, into HDF5; input as a Ray
    Dataset of paths (read_binary_files)."""
    images, masks = make_segmentation(tmp_path / "seg", 12, size=(64, 48), classes=3)
    opts = dict(masks=masks, num_classes=3, targets=["distance_map"])
    cli_convert(images, tmp_path / "cli", to="hdf5", workers=0, **opts)
    paths = ray.data.read_binary_files(str(images), include_paths=True)
    res = fray.convert(paths, tmp_path / "ray", to="hdf5", parts=2, **opts)
    assert res.num_samples == 12
    merged = feedpipe.open_dataset(tmp_path / "ray")
    assert "distance_map" in merged.schema.names
    _same(merged, feedpipe.open_dataset(tmp_path / "cli"))
