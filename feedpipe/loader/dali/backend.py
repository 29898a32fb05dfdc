"""The DALI backend: the torch backend's interface and batch dicts, with decode and augmentation
in an NVIDIA DALI pipeline (on the GPU when there is one, in DALI's CPU threads otherwise).

Default (``dali_reader="plan"``): DALI is fed by ``external_source`` from the torch backend's own
batch plan, so order, rank sharding, per-rank batch counts, ``set_epoch`` and mid-epoch resume
are identical by construction; only the image pixels come from a different decoder and resizer.
Fields other than the image (labels, paths, arrays) are read on the host by the torch backend's
own :class:`BatchDataset`. ``dali_reader="webdataset"`` (opt-in) reads WebDataset shards with
DALI's native reader instead, in DALI's order (:class:`DaliWdsLoader`).
"""

from __future__ import annotations

import base64
import logging
import math
from typing import Any, Iterator, Literal

import numpy as np
import torch

from ...dataset.formats.wds import WdsReader
from ...dataset.registry import DatasetReader
from ...errors import ConfigError, CorruptRecordError, FeedpipeError, LoaderError
from ...schema.masks import ignore_index_of
from ..config import LoaderConfig, auto_workers
from ..dataset import BatchDataset
from ..geometry import Framing
from ..position import EpochPosition, refuse_nested_workers
from ..protocol import LoaderView
from ..sampler import BatchRequest, PlanSampler, Segment, World, rng_for
from ..transforms import ImageOp
from .index import DaliIndex
from .pipeline import PlanSource, dali_fields, dali_installed, define_graph, graph_spec, import_dali

log = logging.getLogger("feedpipe.loader")


def choose_backend(reader: DatasetReader, cfg: LoaderConfig,
                   device: torch.device) -> Literal["torch", "dali"]:
    """``backend="auto"``: DALI when it is installed, the device is a GPU and the image is stored
    as JPEG (DALI's hardware-accelerated case) and the request suits it; the torch backend
    otherwise. An explicit choice is kept as it is."""
    if cfg.backend != "auto":
        return cfg.backend
    why = None
    if device.type != "cuda":
        why = "no CUDA device"
    elif not dali_installed():
        why = "DALI is not installed"
    else:
        try:
            image, _ = dali_fields(reader, cfg)
        except ConfigError as exc:
            why = str(exc)
        else:
            codec = reader.schema[image].codec  # type: ignore[attr-defined]
            why = None if codec == "jpeg" else f"images are stored as {codec}, not JPEG"
    log.info("backend='auto': %s", "dali" if why is None else f"torch ({why})")
    return "torch" if why else "dali"


class DaliLoader(EpochPosition):
    """What ``make_loader(..., backend="dali")`` returns: iterate it once per epoch (a
    :class:`~feedpipe.loader.protocol.Loader`, as the torch backend's)."""

    outputs: tuple[str, ...] = ("image",)

    def __init__(self, reader: DatasetReader, cfg: LoaderConfig, world: World,
                 device: torch.device) -> None:
        self.dali = import_dali()
        self.reader, self.cfg, self.world, self.device = reader, cfg, world, device
        self.image, host = dali_fields(reader, cfg)
        self.op = Framing.of(cfg)
        self.spec = graph_spec(reader, cfg, self.image, device)
        # host fields (labels, paths, arrays) have no geometry: a fixed op spares the per-batch
        # random generator the image's windows already drew in PlanSource
        self.host = BatchDataset(reader, host, ImageOp(cfg.size), seed=cfg.seed,
                                 on_error="raise", ragged=cfg.ragged) if host else None
        self.planner = PlanSampler(reader, cfg, world)
        self._surface()
        # DALI's CPU threads decode (CPU mode) and assist nvJPEG (GPU mode): this rank's cores;
        # num_workers > 0 adds processes that read and plan batches (parallel external_source)
        self.threads = auto_workers(True)
        self.py_workers = cfg.num_workers if isinstance(cfg.num_workers, int) else 0
        if self.py_workers and cfg.multiprocessing_context not in (None, "fork", "spawn"):
            raise ConfigError(f"multiprocessing_context={cfg.multiprocessing_context!r}: DALI "
                              "starts its reader workers with 'fork' or 'spawn': use one of "
                              "those, or None (fork unless CUDA is initialized)",
                              option="multiprocessing_context")
        log.info("feedpipe loader: %s (%s), %d samples, rank %d/%d, DALI %s on %s (%s), %d "
                 "threads, %d reader processes", reader.root, reader.format_name, len(reader),
                 world.rank, world.size, self.dali.__version__, device, cfg.dali_reader,
                 self.threads, self.py_workers)
        self._epoch = self._consumed = 0
        self._it: Any = None                       # the DALIGenericIterator being drained
        self._next: tuple[int, int] | None = None  # the (epoch, batch) it yields next
        self._ended = False                         # it raised StopIteration: reset() goes on
        self._seg: Segment | None = None            # the resumed plan it was built for
        self.skipped: list[str] = []                # always empty: DALI raises, never skips
        self.classes: tuple[str, ...] = reader.classes
        self.ignore_index: int | None = ignore_index_of(reader.schema)

    def describe(self) -> LoaderView:
        """The resolved settings (see :class:`~feedpipe.loader.protocol.LoaderView`); a sample's
        bytes are its output image (DALI's prefetched buffers) plus the host fields."""
        cfg, spec = self.cfg, self.spec
        itemsize = {"float32": 4, "float16": 2, "uint8": 1}[spec.dtype]
        host = sum(int(np.prod(c.shape)) * np.dtype(c.dtype).itemsize for c in self.host.columns
                   if c.shape is not None and c.dtype is not None) if self.host else 0
        return LoaderView(
            backend="dali", root=str(self.reader.root), format=self.reader.format_name,
            codec=getattr(self.reader.schema[self.image], "codec", None),
            num_samples=len(self.reader), batch_size=cfg.batch_size,
            num_workers=self.py_workers, prefetch_factor=spec.depth if self.py_workers else None,
            pin_memory=self.device.type == "cuda", device=self.device.type,
            decode_threads=self.threads,
            sample_bytes=spec.size[0] * spec.size[1] * 3 * itemsize + host,
            size=tuple(spec.size[:2]))

    def _check_state(self, state: dict[str, Any]) -> None:
        if state.get("dali_reader", "plan") != self.cfg.dali_reader:
            raise ConfigError(f"state was saved with dali_reader={state.get('dali_reader')!r}, "
                              f"whose order differs from this loader's {self.cfg.dali_reader!r}")

    def __iter__(self) -> Iterator[dict[str, Any]]:
        """One epoch from its first batch (or, once, from where ``load_state_dict`` says)."""
        refuse_nested_workers(self.cfg)
        epoch, start = self._begin()
        yield from self._hand_out(self._run(epoch, start), epoch, start)

    def _run(self, epoch: int, start: int) -> Iterator[dict[str, Any]]:
        """The epoch's batches from DALI; its end of epoch is checked before the last goes out."""
        count = self._count(epoch)
        it = self._iterator(epoch, start)
        for number in range(start, count):
            try:
                out = next(it)[0]
            except StopIteration:
                self._close()
                raise LoaderError(f"DALI ended epoch {epoch} after {number} of {count} "
                                  "batches") from None
            except Exception as exc:
                self._close()
                err = self._explain(exc, epoch, number)
                if err is exc:
                    raise
                raise err from exc
            self._next = (epoch, number + 1)
            batch = self._finish(out, epoch, number)
            if number == count - 1:
                self._check_end(it, epoch, count)
            yield batch
        if start == count:
            self._check_end(it, epoch, count)

    def _check_end(self, it: Any, epoch: int, count: int) -> None:
        """DALI's end of epoch (our source's StopIteration) lets reset() go on."""
        try:
            next(it)
            self._close()
            raise LoaderError(f"DALI produced more than the {count} batches of epoch {epoch}")
        except StopIteration:
            self._ended = True

    # -- feedpipe's plan through external_source (the default) -----------------------------------
    def _count(self, epoch: int) -> int:
        return len(self.planner.plan(epoch))

    def _reuse(self, epoch: int, start: int) -> bool:
        """Whether the running pipeline can go on to (epoch, start): it is positioned there, or
        it ended the epoch before (its source maps DALI's next epoch to ours)."""
        if not self._ended:
            return self._next == (epoch, start) and self._seg == self.planner.segment(epoch)
        if self._next == (epoch, 0) and start == 0 and self.planner.segment(epoch) is None:
            self._it.reset()
            self._ended = False
            return True
        return False

    def _pipeline(self, epoch: int, start: int) -> tuple[Any, dict[str, Any]]:
        """A new pipeline that starts at batch ``start`` of ``epoch``, and iterator options."""
        source = PlanSource(self.reader, self.cfg, self.world, self.image, self.op, epoch, start,
                            windows=self.spec.encoded or self.spec.resize,
                            parallel=self.py_workers > 0, segment=self.planner.segment(epoch))
        # fork is cheap but impossible once this process holds a CUDA context (DALI's or torch's)
        method = self.cfg.multiprocessing_context or (
            "spawn" if self.dali.backend.IsDriverInitialized() else "fork")
        workers = dict(py_num_workers=self.py_workers, py_start_method=method) \
            if self.py_workers else {}
        return self._new_pipeline(self.cfg.seed, source, **workers), {}

    def _indices(self, out: dict[str, torch.Tensor], epoch: int, number: int) -> np.ndarray:
        return self.planner.plan(epoch)[number]

    def _suspects(self, epoch: int, number: int) -> list[np.ndarray]:
        """Batches a DALI failure at ``number`` may come from (it prefetches ahead)."""
        return self.planner.plan(epoch)[number: number + self.spec.depth + 1]

    # -- shared machinery ------------------------------------------------------------------------
    def _new_pipeline(self, seed: int, source: Any, **options: Any) -> Any:
        pipe = self.dali.Pipeline(
            batch_size=self.cfg.batch_size, num_threads=self.threads, seed=seed,
            device_id=(self.device.index or 0) if self.device.type == "cuda" else None,
            prefetch_queue_depth=self.spec.depth, exec_dynamic=True, **options)
        with pipe:
            pipe.set_outputs(*define_graph(self.dali, self.spec, source))
        return pipe

    def _iterator(self, epoch: int, start: int) -> Any:
        """The running pipeline's iterator when it can go on to (epoch, start), else a new one."""
        if self._it is not None and self._reuse(epoch, start):
            return self._it
        self._close()
        from nvidia.dali.plugin.pytorch import DALIGenericIterator

        pipe, options = self._pipeline(epoch, start)
        self._it = DALIGenericIterator(pipe, list(self.outputs), prepare_first_batch=False,
                                       **options)
        self._next, self._ended = (epoch, start), False
        self._seg = self.planner.segment(epoch)
        return self._it

    def _close(self) -> None:
        self._it, self._next, self._ended = None, None, False

    def _finish(self, out: dict[str, torch.Tensor], epoch: int, number: int) -> dict[str, Any]:
        """DALI's image batch plus the host fields, in the torch backend's layout and order."""
        image = out["image"]
        if self.spec.layout == "HWC":
            image = image.permute(0, 3, 1, 2)  # NHWC memory seen as NCHW: channels_last
        if self.cfg.dtype == "bfloat16":
            image = image.to(torch.bfloat16)
        batch: dict[str, Any] = {self.image: image.to(self.device, non_blocking=True)}
        if self.host is not None:
            req = BatchRequest(self._indices(out, epoch, number), epoch, number, self.world.rank)
            for k, v in self.host.__getitems__(req).items():
                batch[k] = v.to(self.device, non_blocking=True) if isinstance(v, torch.Tensor) \
                    else v
        return batch

    def _explain(self, exc: Exception, epoch: int, number: int) -> Exception:
        """A DALI failure as a CorruptRecordError naming the sample when a host decode of the
        batches in flight finds one that cannot decode; otherwise ``exc`` with a note."""
        if isinstance(exc, FeedpipeError):
            return exc
        field = self.reader.schema[self.image]
        for batch in self._suspects(epoch, number):
            for i in batch:
                try:
                    field.to_user(self.reader.read_raw(int(i))[self.image], self.image)
                except Exception as bad:  # noqa: BLE001 - any decode failure names the sample
                    return CorruptRecordError(f"{self.reader.describe(int(i))}: cannot decode "
                                              f"{self.image}: {bad}")
        exc.add_note(f"feedpipe: DALI failed at batch {number} of epoch {epoch} reading "
                     f"{self.reader.root}")
        return exc


class DaliWdsLoader(DaliLoader):
    """``dali_reader="webdataset"``: DALI's native ``readers.webdataset`` reads the shards.

    DALI's order, not feedpipe's: rank r reads the contiguous sample range DALI assigns to shard
    ``(r + epoch) % world_size`` (one range per rank, rotating every epoch), shuffled by a DALI
    shuffle buffer of ``shuffle_buffer`` samples; ranks are padded to the same batch count
    (``ceil(ceil(N / world_size) / batch_size)``, floor with ``drop_last``). Crops and flips come
    from DALI's random operators. Each epoch is a pipeline seeded by (seed, epoch, rank), so
    ``set_epoch`` is deterministic; mid-epoch resume restores a DALI checkpoint.
    """

    outputs = ("image", "source")
    elastic = False  # DALI deals its own order: a state resumes at the world size it was saved at

    def __init__(self, reader: DatasetReader, cfg: LoaderConfig, world: World,
                 device: torch.device) -> None:
        if not isinstance(reader, WdsReader):
            raise ConfigError(f"dali_reader='webdataset' reads WebDataset shards; {reader.root} "
                              f"is {reader.format_name}: use Dali(reader='plan')",
                              option="dali_reader")
        super().__init__(reader, cfg, world, device)
        if not self.spec.encoded:
            raise ConfigError(f"{reader.root}: dali_reader='webdataset' decodes encoded images; "
                              "these are stored raw: use Dali(reader='plan')", option="dali_reader")
        self.index = DaliIndex(reader)
        self.member = list(reader.schema).index(reader.schema[self.image])
        self._resume: bytes | None = None  # a DALI checkpoint for the next pipeline

    def __len__(self) -> int:
        """Batches per epoch on this rank, in DALI's own order."""
        return self._count(self._epoch)

    def _count(self, epoch: int) -> int:
        n, w, b = len(self.reader), self.world.size, self.cfg.batch_size
        if self.cfg.drop_last:
            return n // w // b
        return math.ceil(math.ceil(n / w) / b)

    def state_dict(self, *, in_flight: int = 0) -> dict[str, Any]:
        """The position, plus DALI's checkpoint of its reader and random state mid-epoch (of
        the batches handed out: DALI's checkpoint cannot step back ``in_flight`` batches)."""
        if in_flight:
            raise ConfigError("dali_reader='webdataset' checkpoints DALI's own reader, which "
                              "cannot step back over batches fetched ahead; use "
                              "dali_reader='plan'", option="dali_reader")
        state = {**super().state_dict(), "dali_reader": "webdataset"}
        if self._consumed and self._it is not None and self._next == (self._epoch,
                                                                       self._consumed):
            state["dali_checkpoint"] = base64.b64encode(self._it.checkpoints()[0]).decode()
        elif self._consumed and self._resume is not None:
            state["dali_checkpoint"] = base64.b64encode(self._resume).decode()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        cp = state.get("dali_checkpoint")
        if self._consumed and cp is None:
            raise ConfigError("a mid-epoch state of dali_reader='webdataset' needs its "
                              "'dali_checkpoint'; save it with this loader's state_dict()")
        self._resume = base64.b64decode(cp) if self._consumed else None
        self._close()

    def _order_name(self) -> str:
        return "dali_reader='webdataset' (DALI's own order, per world size)"

    def _reuse(self, epoch: int, start: int) -> bool:
        return not self._ended and self._next == (epoch, start)  # each epoch has its own seed

    def _pipeline(self, epoch: int, start: int) -> tuple[Any, dict[str, Any]]:
        from nvidia.dali.plugin.pytorch import LastBatchPolicy

        checkpoint = self._resume if start else None
        if start and checkpoint is None:
            raise ConfigError(f"cannot start epoch {epoch} at batch {start} without a DALI "
                              "checkpoint (load_state_dict with one)")
        self._resume = None
        w = self.world.size
        args = dict(paths=[str(self.reader.root / s) for s in self.reader.shards],
                    index_paths=[str(p) for p in self.index.paths()],
                    ext=[self.reader.schema[self.image].wds_suffix],
                    shard_id=(self.world.rank + epoch) % w, num_shards=w,
                    random_shuffle=self.cfg.shuffle, initial_fill=self.cfg.shuffle_buffer,
                    pad_last_batch=True, missing_component_behavior="error")
        seed = int(rng_for(self.cfg.seed, epoch, self.world.rank).integers(0, 2 ** 31))
        pipe = self._new_pipeline(seed, args, enable_checkpointing=True,
                                  **({"checkpoint": checkpoint} if checkpoint else {}))
        policy = LastBatchPolicy.DROP if self.cfg.drop_last else LastBatchPolicy.PARTIAL
        return pipe, dict(reader_name="reader", last_batch_policy=policy)

    def _indices(self, out: dict[str, torch.Tensor], epoch: int, number: int) -> np.ndarray:
        rows = out["source"].cpu().numpy()
        return np.array([self.index.locate(bytes(r).rstrip(b"\0").decode(), self.member)
                         for r in rows], np.int64)

    def _suspects(self, epoch: int, number: int) -> list[np.ndarray]:
        return []  # DALI chose the samples; its message names the shard and offset


def dali_loader(reader: DatasetReader, cfg: LoaderConfig, world: World,
                device: torch.device) -> DaliLoader:
    """The DALI loader for ``cfg.dali_reader``: feedpipe's plan, or DALI's WebDataset reader."""
    if cfg.batch_transforms is not None:
        raise ConfigError("batch_transforms= run on the torch backend's batches before "
                          "normalization; DALI normalizes inside its graph: use backend='torch'",
                          option="batch_transforms")
    if cfg.transform is not None:
        raise ConfigError("transform= runs Python per sample in the torch backend's workers; "
                          "DALI's graph cannot run it: use backend='torch', or express the "
                          "augmentation on the batch after loading", option="transform")
    if getattr(cfg, "affine", None) is not None:
        raise ConfigError("affine= resamples each sample in the torch backend's workers; DALI's "
                          "graph does not run it: use backend='torch'", option="affine")
    if cfg.dali_reader == "webdataset" and cfg.uneven == "mask":
        raise ConfigError("uneven='mask' deals feedpipe's plan; dali_reader='webdataset' reads in "
                          "DALI's own order: use dali_reader='plan' for evaluation",
                          option="uneven")
    kind = DaliWdsLoader if cfg.dali_reader == "webdataset" else DaliLoader
    return kind(reader, cfg, world, device)
