"""The batches a set of loader configurations yield, as SHA-256 digests: run it on two commits
and compare, to show a change to the loader kept every batch bit for bit.

Every format (LMDB, HDF5, WebDataset), 0 and 2 workers, on the CPU: uint8 and normalized float32
output, random-resized crops and flips, the built-in batch operations, masks and a float target
(segmentation), ``uneven="mask"`` on rank 1 of 2, a resume from a mid-epoch state, and the nvJPEG
path with a CPU decoder in nvJPEG's place; two epochs each.

    python benchmarks/batch_hashes.py --save FILE        # record
    python benchmarks/batch_hashes.py --check FILE       # compare, exit 1 on any difference
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path
from typing import Any, Callable

import numpy as np
import simplejpeg
import torch

import feedpipe
from converters import convert
from converters.synth import make_photos
from feedpipe import Output, Sampler, Workers
from feedpipe.loader.augment import ColorJitter, RandomErasing, RandomGrayscale
from feedpipe.loader.sampler import World

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from seg_helpers import write_shapes  # noqa: E402

FORMATS = ("lmdb", "hdf5", "wds")


def digest(batch: dict[str, Any]) -> dict[str, str]:
    """SHA-256 of each tensor field (and of list fields' repr), by name."""
    out = {}
    for k, v in sorted(batch.items()):
        if isinstance(v, torch.Tensor):
            out[k] = f"{v.dtype} {tuple(v.shape)} " + hashlib.sha256(
                v.contiguous().cpu().view(torch.uint8).numpy().tobytes()
                if v.dtype != torch.bool else v.numpy().tobytes()).hexdigest()[:20]
        else:
            out[k] = hashlib.sha256(repr(v).encode()).hexdigest()[:20]
    return out


def epochs(loader: Any, n: int = 2) -> list[dict[str, str]]:
    return [digest(b) for e in range(n) for b in (loader.set_epoch(e) or loader)]


def resumed(make: Callable[[], Any]) -> list[dict[str, str]]:
    """Two batches, a state, then a fresh loader resumed from it for the rest of the epoch."""
    a = make()
    it = iter(a)
    got = [digest(next(it)), digest(next(it))]
    state = a.state_dict()
    del it, a
    b = make()
    b.load_state_dict(state)
    return got + [digest(x) for x in b]


def cpu_decode(files: list[torch.Tensor]) -> list[torch.Tensor]:
    """Stands in for batched nvJPEG (as tests/test_device_decode.py)."""
    return [torch.from_numpy(simplejpeg.decode_jpeg(f.numpy(), colorspace="RGB")).permute(2, 0, 1)
            for f in files]


def device_decoded(path: Path, batch: int, **kw: Any) -> Any:
    from feedpipe.loader.api import LoaderConfig, TorchLoader, resolve
    from feedpipe.loader.torch.device_decode import DeviceDecoder

    reader = feedpipe.open_dataset(path)
    cfg = resolve(LoaderConfig(batch, **kw), reader)
    cpu = torch.device("cpu")
    return TorchLoader(reader, cfg, World(0, 1), cpu,
                       DeviceDecoder(cpu, cpu_decode))


def data(root: Path) -> dict[str, Path]:
    photos = root / "photos"
    if not photos.exists():
        make_photos(photos, 72, size=(160, 120), classes=4, seed=0)
    out = {}
    for fmt in FORMATS:
        out[fmt] = root / fmt
        if not out[fmt].exists():
            convert(photos, out[fmt], to=fmt, workers=0,
                    writer_options={"shard_count": 20} if fmt == "wds" else None)
    out["seg"] = root / "seg"
    if not out["seg"].exists():
        sizes = [(200, 150), (176, 208), (240, 170), (150, 150), (260, 200), (140, 230)] * 3
        images, masks = write_shapes(root / "shapes", sizes, seed=5)
        convert(images, out["seg"], to="lmdb", workers=0, masks=masks,
                targets=["distance_map"])
    return out


def cases(d: dict[str, Path]) -> dict[str, Callable[[], list[dict[str, str]]]]:
    u8 = dict(device="cpu", output=Output(dtype="uint8"))
    f32 = dict(device="cpu", output=Output(dtype="float32"))
    rrc = dict(crop="random_resized_crop", flip=True, seed=7)
    ops = [ColorJitter(0.4, 0.4, 0.4, 0.1), RandomGrayscale(p=0.2), RandomErasing(p=0.5)]
    out: dict[str, Callable[[], list[dict[str, str]]]] = {}
    for fmt in FORMATS:
        for w in (0, 2):
            p = d[fmt]
            out[f"{fmt}-w{w}-u8-center"] = lambda p=p, w=w: epochs(feedpipe.make_loader(
                p, 8, size=48, num_workers=w, seed=3, **u8))
            out[f"{fmt}-w{w}-f32-rrc"] = lambda p=p, w=w: epochs(feedpipe.make_loader(
                p, 8, size=48, num_workers=w, **rrc, **f32))
            out[f"{fmt}-w{w}-f32-ops"] = lambda p=p, w=w: epochs(feedpipe.make_loader(
                p, 8, size=48, num_workers=w, batch_transforms=ops, **rrc, **f32))
            out[f"{fmt}-w{w}-u8-nchw"] = lambda p=p, w=w: epochs(feedpipe.make_loader(
                p, 8, size=40, num_workers=w, crop="resize", seed=1, device="cpu",
                output=Output(dtype="uint8", channels_last=False)))
            out[f"{fmt}-w{w}-mask-rank1"] = lambda p=p, w=w: epochs(feedpipe.make_loader(
                p, 7, size=32, num_workers=w, sampler=Sampler(world=World(1, 2), uneven="mask"),
                **u8))
            out[f"{fmt}-w{w}-resume"] = lambda p=p, w=w: resumed(lambda: feedpipe.make_loader(
                p, 8, size=32, num_workers=w, **rrc, **f32))
            out[f"{fmt}-w{w}-devdecode"] = lambda p=p, w=w: epochs(device_decoded(
                p, 8, size=48, num_workers=w, workers=Workers(decode_on="device"), **rrc, **f32))
    for w in (0, 2):
        out[f"seg-w{w}"] = lambda w=w: epochs(feedpipe.make_loader(
            d["seg"], 4, size=40, num_workers=w, fields=("image", "mask", "distance_map"),
            **rrc, **f32))
        out[f"seg-w{w}-bf16"] = lambda w=w: epochs(feedpipe.make_loader(
            d["seg"], 4, size=40, num_workers=w, fields=("image", "mask"), crop="resize",
            device="cpu", output=Output(dtype="bfloat16")))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--save", type=Path)
    ap.add_argument("--check", type=Path)
    ap.add_argument("--data", type=Path, default=Path("bench-data/hashes"))
    a = ap.parse_args()
    got = {name: run() for name, run in cases(data(a.data)).items()}
    if a.save:
        a.save.write_text(json.dumps(got, indent=1))
        print(f"{len(got)} cases, {sum(map(len, got.values()))} batches -> {a.save}")
    if a.check:
        want = json.loads(a.check.read_text())
        bad = [k for k in want if got.get(k) != want[k]]
        for k in bad:
            first = next((i for i, (x, y) in enumerate(zip(want[k], got.get(k, []), strict=True))
                          if x != y), None)
            print(f"DIFFERS {k}: {len(want[k])} vs {len(got.get(k, []))} batches, first "
                  f"difference at batch {first}")
        print(f"{len(want) - len(bad)} of {len(want)} cases identical")
        return 1 if bad else 0
    return 0


if __name__ == "__main__":
    np.seterr(all="ignore")
    sys.exit(main())
