"""The loader protocol: what every backend's loader offers, and all that tune, bench and monitor
may use of one. ``make_loader`` returns a :class:`Loader` whichever backend it picks, so code
written against this protocol runs unchanged on the torch and the DALI backend.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterator, Protocol, runtime_checkable


@dataclass(frozen=True)
class LoaderView:
    """A loader's resolved settings, for measurement and advice (read-only)."""

    backend: str                   # "torch" or "dali"
    root: str                      # the dataset directory
    format: str                    # "lmdb", "hdf5", "wds"
    codec: str | None              # stored image codec ("jpeg", "png", "raw"...); None: no image
    num_samples: int               # samples in the dataset (all ranks)
    batch_size: int
    num_workers: int               # worker processes (torch) / reader processes (DALI)
    prefetch_factor: int | None    # batches each worker prepares ahead; None without workers
    pin_memory: bool
    device: str                    # "cpu" or "cuda"
    decode_threads: int            # threads decoding in this process (DALI); 0 for torch
    sample_bytes: int              # host bytes one sample occupies in a batch before the device
    size: tuple[int, int] | None = None  # output images' (H, W); None: no image field


@runtime_checkable
class Loader(Protocol):
    """What ``make_loader`` returns, whichever backend. Iterate it once per epoch: every new
    ``iter()`` starts its epoch at the first batch, only ``load_state_dict()`` resumes mid-epoch
    (once). A fully consumed epoch moves on to the next. ``len(loader)`` is the epoch's batch
    count on this rank (docs/trainers.md: the contract).

    Attributes:
        classes: Class names from the manifest; () for unlabeled data.
        skipped: Records skipped under ``Workers(on_error="skip")``, by name.
    """

    classes: tuple[str, ...]       # class names from the manifest; () for unlabeled data
    ignore_index: int | None       # the mask value of no class (MaskField); None: none recorded
    skipped: list[str]             # records skipped under on_error="skip", by name

    def __iter__(self) -> Iterator[dict[str, Any]]: ...

    def __len__(self) -> int: ...

    def set_epoch(self, epoch: int) -> None:
        """The epoch to iterate next (its order and augmentation); the same epoch again changes
        nothing, so frameworks that call it every epoch keep a loaded state."""

    def state_dict(self) -> dict[str, Any]:
        """Where the loader is: the next epoch and batch, and which dataset (refused on
        another); resumes at any world size."""

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume at the batch ``state`` names: the next ``iter()`` starts there."""

    def describe(self) -> LoaderView:
        """The resolved settings (backend, workers, prefetch, device...), for measurement."""
