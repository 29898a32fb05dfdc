"""Batch operations in the workers on a CPU device (feedpipe/loader/torch/convert.py): the
image-only built-ins and the normalization run in the worker that made the batch, writing the
float32 batch into its ring slot, so the main process is no serial stage; the batches are the
main process's bit for bit, for any number of workers and after a resume."""

from __future__ import annotations

import torch

import feedpipe
from feedpipe.loader import augment
from feedpipe.loader.augment import ColorJitter, MixUp, RandomErasing, RandomGrayscale
from feedpipe.loader.config import IMAGENET_MEAN

KW = dict(size=40, seed=7, device="cpu", crop="random_resized_crop", flip=True)
RECIPE = [ColorJitter(0.4, 0.4, 0.4), RandomGrayscale(0.2),
          RandomErasing(0.5, value=IMAGENET_MEAN)]


def counted(monkeypatch) -> list[int]:
    """Calls of ColorJitter's CPU kernel made in this process (workers count in their own)."""
    calls: list[int] = []
    real = augment.jitter
    monkeypatch.setattr(augment, "jitter",
                        lambda *a, **k: (calls.append(1), real(*a, **k))[1])
    return calls


def test_the_operations_run_in_the_workers_with_the_main_process_batches(packed, monkeypatch):
    calls = counted(monkeypatch)
    ref = [{k: v.clone() for k, v in b.items()}
           for b in feedpipe.make_loader(packed["lmdb"], 8, batch_transforms=RECIPE,
                                         num_workers=0, **KW)]
    assert calls  # in-process: the main process runs them
    calls.clear()
    ld = feedpipe.make_loader(packed["lmdb"], 8, batch_transforms=RECIPE, num_workers=2, **KW)
    kept = list(ld)  # the batches as handed out (the ring's slots, lent), none copied
    assert not calls and len(kept) == len(ref) > 2
    for a, b in zip(kept, ref, strict=True):
        x = a["image"]
        assert x.dtype == torch.float32 and x.shape[1:] == (3, 40, 40)
        assert x.is_contiguous(memory_format=torch.channels_last)
        assert torch.equal(x, b["image"]) and torch.equal(a["label"], b["label"])


def test_a_resume_and_a_user_function_with_the_operations_in_the_workers(packed):
    def darker(sample, rng):  # a per-sample transform= before the batch operations
        sample["image"] //= 2
        return sample

    kw = dict(KW, transform=darker, batch_transforms=RECIPE)
    ref = [b["image"].clone() for b in feedpipe.make_loader(packed["hdf5"], 8, num_workers=0,
                                                            **kw)]
    ld = feedpipe.make_loader(packed["hdf5"], 8, num_workers=2, **kw)
    it = iter(ld)
    first = [next(it)["image"].clone() for _ in range(3)]
    again = feedpipe.make_loader(packed["hdf5"], 8, num_workers=2, **kw)
    again.load_state_dict(ld.state_dict())
    rest = [b["image"].clone() for b in again]
    assert rest and all(torch.equal(a, b) for a, b in zip(first + rest, ref, strict=True))
    assert len(first + rest) == len(ref)


def test_label_mixing_and_user_steps_stay_in_the_main_process(packed, monkeypatch):
    """MixUp changes the labels (their ring column holds ints) and a user's step runs where the
    user expects it: such pipelines run in the main process, as before."""
    calls = counted(monkeypatch)
    seen: list[int] = []

    def mine(batch, gen):
        seen.append(len(batch["image"]))
        return batch

    for steps in ([ColorJitter(0.4), MixUp(0.4, 4)], [ColorJitter(0.4), mine]):
        calls.clear()
        for b in feedpipe.make_loader(packed["lmdb"], 8, batch_transforms=steps,
                                      num_workers=2, **KW):
            assert b["image"].dtype == torch.float32
        assert calls
    assert seen


def test_the_ring_and_the_described_sample_bytes_hold_the_output_images(packed):
    """The slots hold the images as the workers convert them: float32 (4 bytes a value),
    operated on or only normalized; uint8 output as decoded. describe() says so: the tuners and
    doctor size the ring and RAM from it."""
    ops = feedpipe.make_loader(packed["lmdb"], 8, batch_transforms=RECIPE, num_workers=2, **KW)
    plain = feedpipe.make_loader(packed["lmdb"], 8, num_workers=2, **KW)
    u8 = feedpipe.make_loader(packed["lmdb"], 8, num_workers=2,
                              **{**KW, "output": feedpipe.Output(dtype="uint8")})
    assert ops.describe().sample_bytes == 40 * 40 * 3 * 4 + 8  # image float32, label int64
    assert plain.describe().sample_bytes == 40 * 40 * 3 * 4 + 8
    assert u8.describe().sample_bytes == 40 * 40 * 3 + 8
    for ld in (ops, plain):
        assert ld.ring is not None and ld.ring.tensors["image"][0].dtype == torch.float32


def test_a_first_jitter_reads_the_uint8_image_with_the_float_images_values():
    """In the workers a first ColorJitter reads the uint8 batch as x/255 (no float image made
    first): the values of the jitter of that float image, bit for bit."""
    from feedpipe.loader.photometric import jitter

    u8 = torch.randint(0, 256, (6, 17, 19, 3), dtype=torch.uint8,
                       generator=torch.Generator().manual_seed(4)).permute(0, 3, 1, 2)
    unit = u8.float().mul_(1 / 255)
    op = ColorJitter(0.4, 0.4, 0.4, 0.1)
    params = op.params({"image": unit}, torch.Generator().manual_seed(5))
    want = jitter(unit.clone(), params)
    got = torch.empty(6, 17, 19, 3).permute(0, 3, 1, 2)
    assert jitter(u8, params, out=got, unit=True) is got
    assert torch.equal(got, want) and got.max() <= 1
