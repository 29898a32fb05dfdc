"""The torch backend's slot ring and its one owner of ring and /dev/shm sizes (it once said
"not enough shared memory for a 0 MiB batch ring" with 24 GiB free)."""

from __future__ import annotations

import logging

import numpy as np

import feedpipe
from converters.arrays import pack_arrays
from feedpipe.loader import memory
from feedpipe.loader.torch import backend as ring_mod
from feedpipe.loader.torch.backend import SlotRing


def test_no_ring_warning_when_nothing_stacks(tmp_path, caplog):
    """A series dataset's blocks vary in length: no column stacks, so there is no ring to place
    and nothing to warn about (it said '0 MiB batch ring' beside 24 GiB free)."""
    out = tmp_path / "series"
    pack_arrays({"pm25": np.arange(1500, dtype=np.float32).reshape(500, 3)}, out, to="lmdb",
                series=True, block_rows=64)
    ld = feedpipe.make_loader(out, 2, num_workers=1, device="cpu")
    with caplog.at_level(logging.WARNING, logger="feedpipe.loader"):
        batch = next(iter(ld))
    assert batch["pm25"].shape[0] == 2 and ld.ring is None
    assert not [r for r in caplog.records if "shared memory" in r.getMessage()], caplog.text


def test_ring_too_big_for_shm_says_its_size(monkeypatch, caplog):
    """When /dev/shm lacks the headroom the warning gives the ring's real size (KiB when under a
    MiB, never '0 MiB'), what /dev/shm has and what the ring wants; there is then no ring."""
    shapes = {"label": ((64,), np.dtype(np.int64))}  # a 512-byte batch
    need = memory.ring_bytes(512, 2, 2)
    monkeypatch.setattr(ring_mod, "shm_free", lambda: memory.shm_wanted(need) - 1)
    with caplog.at_level(logging.WARNING, logger="feedpipe.loader"):
        assert SlotRing.for_loader(shapes, 2, 2) is None
    msg = caplog.records[-1].getMessage()
    assert f"{need / 1024:.1f} KiB batch ring" in msg and "0 MiB" not in msg
    monkeypatch.setattr(ring_mod, "shm_free", lambda: memory.shm_wanted(need))
    ring = SlotRing.for_loader(shapes, 2, 2)
    assert ring is not None and ring.count == memory.ring_slots(2, 2) and ring.nbytes == need


def test_shm_fits_is_the_headroom_rule():
    assert memory.shm_fits(100, memory.SHM_HEADROOM * 100)
    assert not memory.shm_fits(100, memory.SHM_HEADROOM * 100 - 1)
    assert not memory.shm_fits(1, None)  # no /dev/shm: no shared ring
    assert memory.size_text(512) == "0.5 KiB" and memory.size_text(3 << 20) == "3 MiB"
