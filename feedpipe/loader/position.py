"""The position both backends share (epochs, ``set_epoch`` / ``state_dict`` /
``load_state_dict``, the hand-out of an epoch's batches) and the feed engine that serves it.

**Epochs.** An epoch ends when its last planned batch is handed out, not when the caller asks once
more: trainers (Lightning, the HF Trainer, accelerate) take exactly ``len(loader)`` batches and
never call ``next()`` again. ``len(loader)`` is always the batches of a whole epoch on this rank
(at this world and batch size), also while a resumed epoch runs.

**States** are global: the epoch, the seed, the epoch's order (:class:`OrderSpec`), ``samples``,
how many samples of that epoch's global order all ranks together have consumed, and the identity
of the dataset they index. A loader resumed at any world size, batch size or ``num_workers`` reads
exactly the rest of the epoch: the global order from ``samples`` on, dealt anew to its ranks
(:class:`~feedpipe.loader.sampler.Segment`). Resumed at the saver's world and batch size, it
continues the saver's own plan batch for batch. The only samples read twice are the wrap-around
padding of ``uneven="pad"`` at an epoch's end (``uneven="mask"`` marks them in ``valid``).

**The feed engine** (:class:`FeedEngine`, at the end of this module): one thread per loader
that turns a backend's stream of batches into finished batches on the training device, ahead of
the training step, across epoch boundaries.

The training thread's ``next()`` is a queue get plus, on CUDA, a wait on the batch's event: the
worker iterator, the copy to the device on a side stream, the conversion and the batch operations
all run in the feed thread (:class:`Stream.finish`). The thread lives as long as the loader, so
the workers never drain at an epoch's end: the plans are pure functions of (seed, epoch, rank),
so the stream goes on into the next epoch while this one's last batches are handed out. When the
caller asks for another position (a ``set_epoch`` to elsewhere, a ``load_state_dict``, an
abandoned epoch started again), the batches made ahead are dropped and the stream reopens there.

What it holds back is bounded: at most ``depth`` finished batches wait in the queue (a token
queue is the semaphore, so both sides stay in C).
"""

from __future__ import annotations

import hashlib
import json
import logging
import queue
import threading
from dataclasses import dataclass
from typing import Any, Hashable, Iterator, Protocol

import torch
from torch.utils.data import IterableDataset

from ..dataset.formats.base import DatasetReader
from ..dataset.mixed import MixedReader
from ..errors import ConfigError, LoaderError
from .config import LoaderConfig
from .memory import FEED_DEPTH as DEPTH
from .order import SAVED_WITH
from .sampler import PlanSampler, Segment, World
from .surface import LoaderBatches, LoaderSampler, batch_as_is, in_gradient_state

STATE_KEYS = ("epoch", "batches", "seed", "rank", "world_size", "dataset")  # every state has these
VALID_KEY, INDEX_KEY = "valid", "index"  # the fields uneven="mask" adds to every batch


def refuse_nested_workers(cfg: LoaderConfig) -> None:
    """A loader with workers iterated inside another DataLoader's worker (a daemon process, which
    may not start children): say how to wrap it instead of failing in multiprocessing."""
    if cfg.num_workers and torch.utils.data.get_worker_info() is not None:
        raise ConfigError("a feedpipe loader runs its own worker processes and cannot be iterated "
                          "inside a DataLoader worker: wrap it with num_workers=0 (e.g. "
                          "StatefulDataLoader(loader, batch_size=None)), or make it with "
                          "num_workers=0", option="num_workers")


def dataset_identity(reader: DatasetReader) -> dict[str, Any]:
    """What a saved position indexes into: the format, sample and shard counts, and a digest of
    the data files' SHA-256s (another packing of the same images is another dataset)."""
    if isinstance(reader, MixedReader):
        return {"mix": [dataset_identity(s) for s in reader.sources]}
    files = sorted((f.name, f.sha256) for f in reader.manifest.files)
    digest = hashlib.sha256(json.dumps(files).encode()).hexdigest()[:16]
    identity = {"format": reader.format_name, "samples": len(reader),
                "shards": len(reader.shard_ranges() or ()), "files": digest}
    windows = reader.manifest.conversion.get("windows")  # a time series cut into windows
    return {**identity, "windows": windows} if windows else identity


class EpochPosition(IterableDataset[dict[str, Any]]):
    """What both backends' loaders share: the position (``_epoch``, ``_consumed``), the hand-out
    of batches, and the part of ``DataLoader``'s surface that trainers read.

    ``_consumed`` counts the batches the latest iteration yielded (so ``state_dict()`` taken
    mid-iteration, or after a ``break``, is exact); ``_resume_at`` is the start a loaded state
    gives the next iteration, whose plan is ``planner.resumed`` (None: the epoch's fresh plan).
    ``elastic`` False: the backend's order is not feedpipe's plan, so a state only resumes at the
    world size it was saved at.

    The surface, decided on purpose: ``sampler`` and ``batch_sampler`` (one object) reach
    ``set_epoch``, as Lightning and the HF Trainer look for it; ``dataset``, ``collate_fn``,
    ``batch_size`` and ``drop_last`` let a framework rebuild a ``DataLoader`` around the batch
    sampler (``accelerate.skip_first_batches``), which then yields this loader's own batches from
    where that sampler starts. ``end_of_dataloader`` and ``remainder`` follow accelerate's
    GradientState protocol (:mod:`feedpipe.integrations.accelerate`).
    """

    config: LoaderConfig  # every choice made, every "auto" resolved (loader.api.resolve)
    world: World
    planner: PlanSampler
    reader: DatasetReader
    device: torch.device
    engine: FeedEngine  # makes the batches; the training thread only takes them (engine.py)
    elastic: bool = True
    _epoch: int = 0
    _consumed: int = 0
    _resume_at: int | None = None
    _last_end: tuple[int, int] | None = None  # (epoch, batches) the last iteration ended at
    end_of_dataloader: bool = False  # the epoch's last batch is out (accelerate's GradientState)
    remainder: int = -1  # real samples of the last gathered step under "mask" (0: full; -1: n/a)
    # a DataLoader rebuilt around the surface runs in this process (no num_workers attribute:
    # DataLoader's default 0), the loader's own workers doing the work; so no prefetch there
    prefetch_factor: None = None

    def _surface(self) -> None:
        """Build the DataLoader-shaped surface (call once the planner exists)."""
        self.sampler = self.batch_sampler = LoaderSampler(self)
        self.dataset = LoaderBatches(self)
        self.collate_fn = batch_as_is

    @property
    def batch_size(self) -> int:
        return self.config.batch_size

    @property
    def drop_last(self) -> bool:
        return self.config.drop_last

    def __len__(self) -> int:
        """Batches of a whole epoch on this rank (the same on every rank; a resumed epoch hands
        out only those its state left, but its length stays the epoch's)."""
        return self.planner.epoch_length(self._epoch)

    def set_epoch(self, epoch: int) -> None:
        """Choose the epoch (and so the order) of the next iteration."""
        if epoch != self._epoch:
            self._epoch, self._consumed, self._resume_at = int(epoch), 0, None
            self._last_end = None
            self.planner.resumed = None

    def position(self) -> tuple[int, int]:
        """(epoch, batch) in this world's whole-epoch terms: a resumed epoch's next batch counts
        as if the epoch had run here from its start (what a trainer's batch counter should read)."""
        left = len(self.planner.plan(self._epoch)) - self._consumed
        return self._epoch, max(0, len(self) - left)

    def state_dict(self, *, in_flight: int = 0) -> dict[str, Any]:
        """Position to resume from: the epoch, the samples of its global order consumed (with
        the order), this rank's plan position (batches yielded, world and batch size) and the
        identity of the dataset.

        ``in_flight``: batches handed out that the caller has not used yet (a trainer that
        fetches ahead): the state resumes at the first of them, in their epoch.
        """
        epoch, taken = self._epoch, self._consumed
        if in_flight:
            if taken == 0 and self._last_end is not None:  # they were the end of the last epoch
                epoch, taken = self._last_end
            if in_flight > taken:
                raise ConfigError(f"in_flight={in_flight}: only {taken} batches of epoch "
                                  f"{epoch} were handed out", option="in_flight")
            taken -= in_flight
        state = {"epoch": epoch, "batches": taken, "seed": self.config.seed,
                 "rank": self.world.rank, "world_size": self.world.size,
                 "dataset": dataset_identity(self.reader), **self.planner.order.saved_with()}
        if not self.elastic:
            return state
        seg = self.planner.segment(epoch)
        order, start = (seg.order, seg.start) if seg else (self.planner.order, 0)
        return {**state, "batch_size": self.config.batch_size, "uneven": self.config.sampler.uneven,
                "order": order.to_dict(), "start": start,
                "samples": start + self.planner.consumed(epoch, taken)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Make the next iteration continue exactly after the samples the saved loader's ranks
        consumed (later iterations start their epoch from the first batch again)."""
        missing = [k for k in STATE_KEYS if k not in state]
        if missing:
            raise ConfigError(f"not a feedpipe loader state: missing {missing}")
        if state.get("seed") != self.config.seed:
            raise ConfigError(f"state is for seed={state.get('seed')}; this loader has seed="
                              f"{self.config.seed}")
        mine_with = self.planner.order.saved_with()
        for key in SAVED_WITH:  # a mix's sources, weights and epoch size (or no mix)
            if state.get(key) != mine_with.get(key):
                raise ConfigError(f"state is for the {key} {state.get(key)}; this loader reads "
                                  f"{mine_with.get(key)}")
        mine = dataset_identity(self.reader)
        if state["dataset"] != mine:
            raise ConfigError(f"state was saved on another dataset or another packing of it "
                              f"({state['dataset']}); this loader reads {self.reader.root} "
                              f"({mine}): a position indexes one packing's samples, so resume "
                              "on the dataset it was saved on")
        self._check_state(state)
        epoch, batches, world = _count(state, "epoch"), _count(state, "batches"), \
            state["world_size"]
        same = world == self.world.size \
            and state.get("batch_size", self.config.batch_size) == self.config.batch_size \
            and state.get("uneven", self.config.sampler.uneven) == self.config.sampler.uneven
        samples: int | None = None
        if not self.elastic:
            if not same:
                raise ConfigError(f"state was saved at world_size={world}; this loader has "
                                  f"world_size={self.world.size}, and {self._order_name()} "
                                  f"cannot be dealt anew: resume it at world_size={world}")
            seg = Segment(epoch, self.planner.order, 0)
        else:
            order = self.planner.order.restore(state.get("order"))
            start, samples = _count(state, "start"), _count(state, "samples")
            length = order.length(len(self.reader))
            if samples < start or samples > length:
                raise ConfigError(f"state 'samples'={samples} is outside {start}..{length} "
                                  "(start..epoch size)")
            if not same:  # re-deal what the saver's ranks had not read yet
                seg, batches, samples = Segment(epoch, order, samples), 0, None
            else:  # the saver's own plan, from its next batch
                seg = Segment(epoch, order, start)
        fresh = seg.start == 0 and seg.order == self.planner.order  # the epoch's own plan
        resumed = None if fresh or not self.elastic else seg
        self._check_position(resumed, epoch, batches, samples)
        self._epoch, self._consumed, self._resume_at = epoch, batches, batches
        self.planner.resumed = resumed

    def _check_position(self, resumed: Segment | None, epoch: int, batches: int,
                        samples: int | None) -> None:
        """Refuse a position its plan cannot hold (a state edited, or another loader's): more
        batches than ``epoch``'s plan (``resumed``) has here, or ``samples`` other than what
        those batches read (the state's two counts of one position)."""
        kept, self.planner.resumed = self.planner.resumed, resumed
        try:
            count = len(self.planner.plan(epoch))
            read = self.planner.consumed(epoch, min(batches, count))
        finally:
            self.planner.resumed = kept
        if batches > count:
            raise ConfigError(f"state 'batches'={batches} is past the end of epoch {epoch}: its "
                              f"plan here has {count} batches; the state was edited or is "
                              "another loader's")
        start = resumed.start if resumed is not None else 0
        if samples is not None and samples != start + read:
            raise ConfigError(f"state 'batches'={batches} and 'samples'={samples} disagree: "
                              f"{batches} batches of {self.config.batch_size} on "
                              f"{self.world.size} rank(s) read {start + read} samples of epoch "
                              f"{epoch}; the state was edited or is another loader's")

    def __iter__(self) -> Iterator[dict[str, Any]]:
        """One epoch from its first batch (or, once, from where ``load_state_dict`` says)."""
        refuse_nested_workers(self.config)
        epoch, start = self._begin()
        count = self._count(epoch)
        self.end_of_dataloader, self.remainder = False, self._remainder(epoch)
        if start >= count:  # nothing left to hand out: the epoch is over all the same
            self._end_epoch(epoch)
            return
        self.engine.start((epoch, start, self._plan_key(epoch)))
        with in_gradient_state(self):  # accelerate's active dataloader, when it is in use
            yield from self._hand_out(epoch, start, count)

    def _hand_out(self, epoch: int, start: int, count: int) -> Iterator[dict[str, Any]]:
        """Hand out the engine's batches of ``epoch`` from ``start``, counting them; the epoch
        ends as its last planned batch goes out. Per batch this thread takes it from the queue
        and, on CUDA, waits for its event: nothing else (the engine made it complete)."""
        engine, wait = self.engine, self._wait
        number = start
        try:
            while number < count:
                ready = engine.get()
                number += 1
                if ready.following[:2] != ((epoch, number) if number < count else (epoch + 1, 0)):
                    raise LoaderError(f"the feed engine handed out a batch out of order: "
                                      f"{ready.following[:2]} after batch {number - 1} of epoch "
                                      f"{epoch} ({count} planned)")
                if ready.event is not None:
                    wait(ready)
                if ready.notes is not None:
                    self._note(ready.notes)
                self._consumed = number
                if number == count:
                    self._end_epoch(epoch)
                # the caller holds the batch alone: freed where it lets go, never in next()
                box = [ready.batch]
                del ready
                yield box.pop()
        except GeneratorExit:
            raise  # the caller stopped early: the engine keeps its workers for the next epoch
        except BaseException:
            engine.abort()  # a worker's error, Ctrl-C: stop the workers, as a DataLoader does
            raise

    def _wait(self, ready: Ready) -> None:
        """Order the caller's CUDA stream after the batch's event, and mark its tensors as used
        there (so their memory is not reused before the caller's work on them is done)."""
        stream = torch.cuda.current_stream(self.device)
        stream.wait_event(ready.event)
        for t in ready.tensors:
            t.record_stream(stream)

    def _note(self, notes: Any) -> None:
        """Backend hook: what a batch brought beside its tensors (skipped records...)."""

    def _plan_key(self, epoch: int) -> Hashable:
        """What besides (epoch, batch) fixes the batches a stream yields: the resumed plan."""
        return self.planner.segment(epoch)

    def close(self) -> None:
        """Stop the workers and the feed thread now (``del loader`` does it too)."""
        self.engine.close()

    def _count(self, epoch: int) -> int:
        """Batches ``epoch``'s current plan hands out on this rank, from its first."""
        return len(self.planner.plan(epoch))

    def _end_epoch(self, epoch: int) -> None:
        """The epoch's last batch is going out: the next iteration is the next epoch."""
        self._epoch_done(epoch)
        self._last_end = (epoch, self._consumed)
        self._epoch, self._consumed, self._resume_at = epoch + 1, 0, None
        self.end_of_dataloader = True

    def _epoch_done(self, epoch: int) -> None:
        """Backend hook, before the epoch's last batch is handed out (reports, checks)."""

    def _remainder(self, epoch: int) -> int:
        """accelerate's ``remainder``: real samples in the last gathered step of ``epoch`` when it
        is short, 0 when it is full; -1 unless ``uneven="mask"`` (padding is not marked)."""
        if self.config.sampler.uneven != "mask":
            return -1
        rest = self.planner.consumed(epoch, len(self.planner.plan(epoch)))
        return rest % (self.config.batch_size * self.world.size)

    def _begin(self) -> tuple[int, int]:
        """(epoch, first batch) of an iteration that starts now; a loaded state is used once."""
        start, self._resume_at, self._last_end = self._resume_at, None, None
        if start is None:
            start, self.planner.resumed = 0, None
        self._consumed = start
        return self._epoch, start

    def _seek(self, epoch: int, number: int) -> None:
        """Make the next iteration start at batch ``number`` of ``epoch``'s current plan."""
        self.set_epoch(epoch)
        self._resume_at = number

    def _check_state(self, state: dict[str, Any]) -> None:
        """Backend-specific refusals, raised before the position changes."""

    def _order_name(self) -> str:
        """What this loader's order is, for messages."""
        return "this order"


def _count(state: dict[str, Any], key: str) -> int:
    value = state.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigError(f"state {key!r}={value!r}: expected an int >= 0")
    return value


log = logging.getLogger("feedpipe.loader")

#: seconds the caller waits for a batch before the batch is named in a warning (and again after
#: each as many); ``Workers(batch_timeout=)`` makes a worker's batch an error after its own
PATIENCE = 60.0

#: (epoch, batch number, plan key): where a stream is, or is asked to start
Position = tuple[int, int, Hashable]


@dataclass(frozen=True)
class Ready:
    """A finished batch as it waits in the queue: the position after it, the batch, and what
    the training thread still does with it (wait on ``event``, mark ``tensors`` as used on its
    stream, record ``notes``)."""

    following: Position
    batch: dict[str, Any]
    event: Any = None                # a torch.cuda.Event the batch is complete at (None: CPU)
    tensors: tuple[Any, ...] = ()    # its CUDA tensors, for record_stream on the caller's stream
    notes: Any = None                # skipped records and decoder fallbacks (rare)


class Stream(Protocol):
    """A backend's decode stage as the engine drives it, in the feed thread only."""

    def open(self, at: Position) -> Iterator[Ready]:
        """Finished batches from ``at`` on, endlessly across epochs (it may end where there is
        nothing left to plan)."""
        ...

    def abort(self) -> None:
        """Stop the current iteration's workers now (after an error): the next open starts
        afresh."""
        ...

    def close(self) -> None:
        """Release everything (workers, pinned memory): the loader is gone."""
        ...

    def describe(self, at: Position) -> str:
        """The batch at ``at``, for a message: its samples, where they come from."""
        ...


@dataclass(frozen=True)
class _Target:
    generation: int
    at: Position


class _Failed:
    """An exception the stream raised, handed to the training thread to re-raise there."""

    def __init__(self, exc: BaseException) -> None:
        self.exc = exc


class FeedEngine:
    """Runs ``stream`` in a thread of its own and hands its batches to the caller in order."""

    def __init__(self, stream: Stream, name: str, depth: int = DEPTH) -> None:
        self.stream, self.name, self.depth = stream, name, depth
        self.patience = PATIENCE
        self._out: queue.SimpleQueue[tuple[int, Ready | _Failed]] = queue.SimpleQueue()
        self._room: queue.SimpleQueue[None] = queue.SimpleQueue()
        for _ in range(depth):
            self._room.put(None)
        self._changed = threading.Condition()
        self._target: _Target | None = None
        self._generation = 0
        self._next: Position | None = None  # what the next get() returns, if nothing changes
        self._abort = False
        self._closed = False
        self._thread: threading.Thread | None = None

    def start(self, at: Position) -> None:
        """Make the next :meth:`get` return the batch at ``at``: the stream goes on where it is
        when it is there already, else it reopens at ``at`` (what it made ahead is dropped)."""
        if at == self._next:
            return
        # drop what was made before the new target is published: dropped after it, a batch the
        # thread had already made for the new position went too (the next came out of order)
        self._drop_made()
        with self._changed:
            self._generation += 1
            self._target = _Target(self._generation, at)
            self._changed.notify()
        self._next = at
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
            self._thread.start()

    def get(self) -> Ready:
        """The next finished batch (blocking); re-raises what the stream raised. A batch that
        takes longer than :data:`PATIENCE` is named in a warning (and again each time as long
        again passes): a transform that never returns, a stalled read, a worker stopped in a
        debugger all wait here, and the caller should know which batch it is."""
        generation, waited = self._generation, 0.0
        while True:
            try:
                got, item = self._out.get(timeout=self.patience)
            except queue.Empty:
                waited += self.patience
                log.warning("%s: no batch for %g s: waiting for %s", self.name, waited,
                            self.stream.describe(self._next) if self._next else "the workers")
                continue
            self._room.put(None)
            if got == generation:
                break
        if isinstance(item, _Failed):
            self._next = None  # the next start() reopens
            raise item.exc
        self._next = item.following
        return item

    def abort(self) -> None:
        """The caller's iteration failed (Ctrl-C in the training step, an error it raised): stop
        the workers, as a DataLoader does; the next :meth:`start` reopens."""
        with self._changed:
            self._generation += 1
            self._abort = True
            self._target = None
            self._changed.notify()
        self._next = None
        self._drop_made()

    def _drop_made(self) -> None:
        """Drop the batches made for an older position now (their memory goes back at once,
        and the feed thread, if it waited for room, goes on)."""
        while True:
            try:
                self._out.get_nowait()
            except queue.Empty:
                return
            self._room.put(None)

    def close(self, timeout: float = 10.0) -> None:
        """Stop the thread and release the stream (its workers) and the batches made ahead; the
        loader is gone, or its owner wants the memory back."""
        with self._changed:
            self._closed = True
            self._changed.notify()
        self._room.put(None)  # (the thread may wait for room)
        thread, self._thread = self._thread, None
        if thread is None:
            self.stream.close()
        elif thread is not threading.current_thread():
            thread.join(timeout)
            if thread.is_alive():
                log.warning("%s: the feed thread did not stop within %.0f s (a worker still "
                            "busy); it ends with the process", self.name, timeout)
        self._drop_made()
        self._next = None
        if self._thread is None and (thread is None or not thread.is_alive()):
            with self._changed:  # ready to start again, should the loader be iterated again
                self._closed, self._target, self._abort = False, None, False
            self._room = queue.SimpleQueue()
            for _ in range(self.depth):
                self._room.put(None)

    # -- the feed thread ------------------------------------------------------------------------
    def _run(self) -> None:
        it: Iterator[Ready] | None = None
        generation = -1
        try:
            while True:
                self._room.get()
                with self._changed:
                    while not self._closed and (self._abort or self._target is None or (
                            it is None and self._target.generation == generation)):
                        if self._abort:
                            self._abort = False
                            it = None
                            self.stream.abort()
                            continue
                        self._changed.wait()
                    if self._closed:
                        return
                    target = self._target
                assert target is not None
                if target.generation != generation:
                    it, generation = self.stream.open(target.at), target.generation
                try:
                    item: Ready | _Failed = next(it)  # type: ignore[arg-type]
                except StopIteration:  # nothing left to plan: wait to be sent elsewhere
                    it = None
                    self._room.put(None)
                    continue
                except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread
                    it = None
                    self.stream.abort()
                    item = _Failed(exc)
                self._out.put((generation, item))
                del item  # (the caller alone then holds the batch: freed where it lets go)
        finally:
            self.stream.close()


__all__ = ["DEPTH", "EpochPosition", "FeedEngine", "INDEX_KEY", "Position", "Ready", "STATE_KEYS",
           "Stream", "VALID_KEY", "dataset_identity", "refuse_nested_workers"]
