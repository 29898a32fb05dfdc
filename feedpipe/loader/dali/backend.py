"""The DALI backend: the torch backend's interface and batches, decoded in an NVIDIA DALI pipeline
as the feed engine's decode stage, fed the torch backend's own batch plan (so order and resume
are the same) or (``dali_reader="webdataset"``) by DALI's own reader; other fields on the host.
"""

from __future__ import annotations

import base64
import logging
import math
import weakref
from contextlib import nullcontext
from typing import Any, Iterator

import numpy as np
import torch

from ...dataset.formats.wds import WdsReader
from ...dataset.registry import DatasetReader
from ...errors import ConfigError, CorruptRecordError, FeedpipeError, LoaderError
from ...schema.masks import ignore_index_of
from ..config import LoaderConfig, auto_workers
from ..dataset import BatchDataset
from ..geometry import Framing
from ..position import INDEX_KEY, VALID_KEY, EpochPosition, FeedEngine, Position, Ready
from ..protocol import LoaderView
from ..sampler import BatchRequest, PlanSampler, World, rng_for
from ..transforms import ImageOp
from .index import DaliIndex
from .pipeline import PlanSource, dali_fields, define_graph, graph_spec, import_dali

log = logging.getLogger("feedpipe.loader")


class DaliStream:
    """The DALI pipeline as the feed engine's decode stage, plus the host fields."""

    def __init__(self, loader: DaliLoader) -> None:
        self.dali, self.reader, self.cfg, self.world = (loader.dali, loader.reader, loader.config,
                                                        loader.world)
        self.device, self.image, self.op, self.spec = (loader.device, loader.image, loader.op,
                                                       loader.spec)
        self.host, self.planner, self.threads = loader.host, loader.planner, loader.threads
        self.py_workers, self.outputs = loader.py_workers, loader.outputs
        self.side = torch.cuda.Stream(self.device) if self.device.type == "cuda" else None
        self._it: Any = None

    def open(self, at: Position) -> Iterator[Ready]:
        epoch, start, _ = at
        self._it = None
        return self._ready(epoch, start)

    def _ready(self, epoch: int, start: int) -> Iterator[Ready]:
        it = self._iterator(epoch, start)
        number = start
        while True:
            try:
                with self._on_side():
                    out = next(it)[0]
            except StopIteration:
                self._ended(epoch, number)
                return
            except Exception as exc:
                err = self._explain(exc, epoch, number)
                if err is exc:
                    raise
                raise err from exc
            following = self._following(epoch, number)
            with self._on_side():
                batch = self._finish(out, epoch, number)
                event = None
                if self.side is not None:
                    event = torch.cuda.Event()
                    event.record(self.side)
            tensors = tuple(v for v in batch.values()
                            if isinstance(v, torch.Tensor) and v.is_cuda)
            yield Ready(following, batch, event, tensors, self._notes(it, following))
            if following[0] != epoch:
                it = self._past_epoch(it, epoch)
            epoch, number = following[0], following[1]

    def _on_side(self) -> Any:
        return torch.cuda.stream(self.side) if self.side is not None else nullcontext()

    def _following(self, epoch: int, number: int) -> Position:
        if number + 1 < len(self.planner.plan(epoch)):
            return epoch, number + 1, self.planner.segment(epoch)
        return epoch + 1, 0, self.planner.segment(epoch + 1)

    def _notes(self, it: Any, following: Position) -> Any:
        """What a batch carries besides its tensors (DALI's reader: its checkpoint)."""
        return None

    def _ended(self, epoch: int, number: int) -> None:
        """DALI ended at batch ``number`` of ``epoch``: the plan source ends where nothing is left."""

    def _past_epoch(self, it: Any, epoch: int) -> Any:
        """The iterator for the epoch after ``epoch`` (the plan source's runs on)."""
        return it

    def _iterator(self, epoch: int, start: int) -> Any:
        from nvidia.dali.plugin.pytorch import DALIGenericIterator

        pipe, options = self._pipeline(epoch, start)
        self._it = DALIGenericIterator(pipe, list(self.outputs), prepare_first_batch=False,
                                       **options)
        return self._it

    def _pipeline(self, epoch: int, start: int) -> tuple[Any, dict[str, Any]]:
        """A new pipeline that starts at batch ``start`` of ``epoch``, and iterator options."""
        source = PlanSource(self.reader, self.cfg, self.world, self.image, self.op, epoch, start,
                            windows=self.spec.encoded or self.spec.resize,
                            parallel=self.py_workers > 0, segment=self.planner.segment(epoch))
        # fork is cheap but impossible once this process holds a CUDA context (DALI's or torch's)
        method = self.cfg.workers.multiprocessing_context or (
            "spawn" if self.dali.backend.IsDriverInitialized() else "fork")
        workers = dict(py_num_workers=self.py_workers, py_start_method=method) \
            if self.py_workers else {}
        return self._new_pipeline(self.cfg.seed, source, **workers), {}

    def _new_pipeline(self, seed: int, source: Any, **options: Any) -> Any:
        pipe = self.dali.Pipeline(
            batch_size=self.cfg.batch_size, num_threads=self.threads, seed=seed,
            device_id=(self.device.index or 0) if self.device.type == "cuda" else None,
            prefetch_queue_depth=self.spec.depth, exec_dynamic=True, **options)
        with pipe:
            pipe.set_outputs(*define_graph(self.dali, self.spec, source))
        return pipe

    def _indices(self, out: dict[str, torch.Tensor], epoch: int, number: int) -> np.ndarray:
        return self.planner.plan(epoch)[number]

    def _suspects(self, epoch: int, number: int) -> list[np.ndarray]:
        """Batches a DALI failure at ``number`` may come from (it prefetches ahead)."""
        return self.planner.plan(epoch)[number: number + self.spec.depth + 1]

    def _finish(self, out: dict[str, torch.Tensor], epoch: int, number: int) -> dict[str, Any]:
        """DALI's image batch plus the host fields, in the torch backend's layout and order."""
        image = out["image"]
        if self.spec.layout == "HWC":
            image = image.permute(0, 3, 1, 2)  # NHWC memory seen as NCHW: channels_last
        if self.cfg.output.dtype == "bfloat16":
            image = image.to(torch.bfloat16)
        batch: dict[str, Any] = {self.image: image.to(self.device, non_blocking=True)}
        if self.host is not None:
            req = BatchRequest(self._indices(out, epoch, number), epoch, number, self.world.rank)
            for k, v in self.host.__getitems__(req).items():
                batch[k] = v.to(self.device, non_blocking=True) if isinstance(v, torch.Tensor) \
                    else v
        if self.cfg.sampler.uneven == "mask":
            indices = self.planner.plan(epoch)[number]
            real = self.planner.real(epoch, number)
            batch[VALID_KEY] = (torch.arange(len(indices)) < real).to(self.device)
            batch[INDEX_KEY] = torch.from_numpy(indices).to(self.device)
        return batch

    def _explain(self, exc: Exception, epoch: int, number: int) -> Exception:
        """A DALI failure as a CorruptRecordError naming a damaged sample, else with a note."""
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

    def describe(self, at: Position) -> str:
        return f"batch {at[1]} of epoch {at[0]} of {self.reader.root} (from DALI's pipeline)"

    def abort(self) -> None:
        self._it = None

    close = abort


class DaliLoader(EpochPosition):
    """What ``make_loader(..., backend="dali")`` returns (a ``Loader``, as the torch one)."""

    outputs: tuple[str, ...] = ("image",)
    stream_kind: type[DaliStream] = DaliStream

    def __init__(self, reader: DatasetReader, cfg: LoaderConfig, world: World,
                 device: torch.device) -> None:
        self.dali = import_dali()
        self.reader, self.config, self.world, self.device = reader, cfg, world, device
        self.image, host = dali_fields(reader, cfg)
        self.op = Framing.of(cfg)
        self.spec = graph_spec(reader, cfg, self.image, device)
        # host fields have no geometry: a fixed op draws nothing (PlanSource drew the windows)
        self.host = BatchDataset(reader, host, ImageOp(cfg.size), seed=cfg.seed,
                                 on_error="raise", ragged=cfg.output.ragged) if host else None
        self.planner = PlanSampler(reader, cfg, world)
        self._surface()
        # DALI's CPU threads decode (CPU mode) and assist nvJPEG (GPU mode): this rank's cores;
        # num_workers > 0 adds processes that read and plan batches (parallel external_source)
        self.threads = auto_workers(True)
        self.py_workers = int(cfg.num_workers)  # resolved: loader.api.resolve
        if self.py_workers and cfg.workers.multiprocessing_context not in (None, "fork", "spawn"):
            raise ConfigError(f"multiprocessing_context={cfg.workers.multiprocessing_context!r}: "
                              "DALI starts its reader workers with 'fork' or 'spawn': use one of "
                              "those, or None (fork unless CUDA is initialized)",
                              option="multiprocessing_context")
        log.info("feedpipe loader: %s (%s), %d samples, rank %d/%d, DALI %s on %s (%s), %d "
                 "threads, %d reader processes", reader.root, reader.format_name, len(reader),
                 world.rank, world.size, self.dali.__version__, device, cfg.dali.reader,
                 self.threads, self.py_workers)
        self._epoch = self._consumed = 0
        self.skipped: list[str] = []                # always empty: DALI raises, never skips
        self.classes: tuple[str, ...] = reader.classes
        self.ignore_index: int | None = ignore_index_of(reader.schema)
        self.engine = FeedEngine(self.stream_kind(self), f"feedpipe-dali-{reader.root.name}")
        weakref.finalize(self, self.engine.close)

    def describe(self) -> LoaderView:
        """The resolved settings; a sample's bytes are its output image plus the host fields."""
        cfg, spec = self.config, self.spec
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
        if state.get("dali_reader", "plan") != self.config.dali.reader:
            raise ConfigError(f"state was saved with dali_reader={state.get('dali_reader')!r}, "
                              f"whose order differs from this loader's {self.config.dali.reader!r}")


class DaliWdsStream(DaliStream):
    """DALI's own WebDataset reader: one pipeline per epoch, checkpoints with each batch."""

    def __init__(self, loader: DaliWdsLoader) -> None:
        super().__init__(loader)
        self.index, self.member = loader.index, loader.member
        self.count = loader._count
        self.resume = loader._take_resume  # a loaded state's checkpoint, for its iteration

    def _following(self, epoch: int, number: int) -> Position:
        return (epoch, number + 1, None) if number + 1 < self.count(epoch) else (epoch + 1, 0, None)

    def _notes(self, it: Any, following: Position) -> Any:
        return base64.b64encode(it.checkpoints()[0]).decode() if following[1] else None

    def _ended(self, epoch: int, number: int) -> None:
        raise LoaderError(f"DALI ended epoch {epoch} after {number} of {self.count(epoch)} "
                          "batches")

    def _past_epoch(self, it: Any, epoch: int) -> Any:
        """DALI's reader ends each epoch itself: check it did, then the next epoch's pipeline."""
        try:
            next(it)
        except StopIteration:
            return self._iterator(epoch + 1, 0)
        raise LoaderError(f"DALI produced more than the {self.count(epoch)} batches of epoch "
                          f"{epoch}")

    def _pipeline(self, epoch: int, start: int) -> tuple[Any, dict[str, Any]]:
        from nvidia.dali.plugin.pytorch import LastBatchPolicy

        checkpoint = self.resume(epoch, start)
        w = self.world.size
        args = dict(paths=[str(self.reader.root / s) for s in self.reader.shards],
                    index_paths=[str(p) for p in self.index.paths()],
                    ext=[self.reader.schema[self.image].wds_suffix],
                    shard_id=(self.world.rank + epoch) % w, num_shards=w,
                    random_shuffle=self.cfg.shuffle, initial_fill=self.cfg.sampler.shuffle_buffer,
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


class DaliWdsLoader(DaliLoader):
    """``dali_reader="webdataset"``: DALI's own reader, order and random crops, one pipeline per
    epoch seeded by (seed, epoch, rank); a mid-epoch resume restores a DALI checkpoint."""

    outputs = ("image", "source")
    elastic = False  # DALI deals its own order: a state resumes at the world size it was saved at
    stream_kind = DaliWdsStream

    def __init__(self, reader: DatasetReader, cfg: LoaderConfig, world: World,
                 device: torch.device) -> None:
        if not isinstance(reader, WdsReader):
            raise ConfigError(f"dali_reader='webdataset' reads WebDataset shards; {reader.root} "
                              f"is {reader.format_name}: use Dali(reader='plan')",
                              option="dali_reader")
        image = dali_fields(reader, cfg)[0]
        if not graph_spec(reader, cfg, image, device).encoded:
            raise ConfigError(f"{reader.root}: dali_reader='webdataset' decodes encoded images; "
                              "these are stored raw: use Dali(reader='plan')", option="dali_reader")
        self.index = DaliIndex(reader)
        self.member = list(reader.schema).index(reader.schema[image])
        self._resume: tuple[int, int, bytes] | None = None  # a loaded state's checkpoint
        self._checkpoint: str | None = None  # DALI's, after the last batch handed out
        super().__init__(reader, cfg, world, device)

    def __len__(self) -> int:
        """Batches per epoch on this rank, in DALI's own order."""
        return self._count(self._epoch)

    def _count(self, epoch: int) -> int:
        n, w, b = len(self.reader), self.world.size, self.config.batch_size
        if self.config.drop_last:
            return n // w // b
        return math.ceil(math.ceil(n / w) / b)

    def _plan_key(self, epoch: int) -> None:
        return None

    def _note(self, notes: Any) -> None:
        self._checkpoint = notes

    def _take_resume(self, epoch: int, start: int) -> bytes | None:
        """The checkpoint a pipeline starting at (epoch, start) restores (used once)."""
        if not start:
            return None
        resume, self._resume = self._resume, None
        if resume is None or resume[:2] != (epoch, start):
            raise ConfigError(f"cannot start epoch {epoch} at batch {start} without a DALI "
                              "checkpoint (load_state_dict with one)")
        return resume[2]

    def state_dict(self, *, in_flight: int = 0) -> dict[str, Any]:
        """The position, plus DALI's checkpoint mid-epoch (which cannot step back ``in_flight``)."""
        if in_flight:
            raise ConfigError("dali_reader='webdataset' checkpoints DALI's own reader, which "
                              "cannot step back over batches fetched ahead; use "
                              "dali_reader='plan'", option="dali_reader")
        state = {**super().state_dict(), "dali_reader": "webdataset"}
        if self._consumed:
            cp = self._checkpoint if self._resume is None else \
                base64.b64encode(self._resume[2]).decode()
            if cp is not None:
                state["dali_checkpoint"] = cp
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        cp = state.get("dali_checkpoint")
        if self._consumed and cp is None:
            raise ConfigError("a mid-epoch state of dali_reader='webdataset' needs its "
                              "'dali_checkpoint'; save it with this loader's state_dict()")
        self._resume = (self._epoch, self._consumed, base64.b64decode(cp)) \
            if self._consumed else None
        self.engine.abort()  # (what it made ahead is another position's)

    def _order_name(self) -> str:
        return "dali_reader='webdataset' (DALI's own order, per world size)"


def dali_loader(reader: DatasetReader, cfg: LoaderConfig, world: World,
                device: torch.device) -> DaliLoader:
    """The DALI loader for ``cfg.dali.reader``: feedpipe's plan, or DALI's WebDataset reader."""
    if cfg.batch_transforms is not None:
        raise ConfigError("batch_transforms= run on the torch backend's batches before "
                          "normalization; DALI normalizes inside its graph: use backend='torch'",
                          option="batch_transforms")
    if cfg.transform is not None:
        raise ConfigError("transform= runs Python per sample in the torch backend's workers; "
                          "DALI's graph cannot run it: use backend='torch', or express the "
                          "augmentation on the batch after loading", option="transform")
    if cfg.affine is not None:
        raise ConfigError("affine= resamples each sample in the torch backend's workers; DALI's "
                          "graph does not run it: use backend='torch'", option="affine")
    if cfg.dali.reader == "webdataset" and cfg.sampler.uneven == "mask":
        raise ConfigError("uneven='mask' deals feedpipe's plan; dali_reader='webdataset' reads in "
                          "DALI's own order: use dali_reader='plan' for evaluation",
                          option="uneven")
    kind = DaliWdsLoader if cfg.dali.reader == "webdataset" else DaliLoader
    return kind(reader, cfg, world, device)
