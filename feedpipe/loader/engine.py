"""The feed engine: one thread per loader that turns a backend's stream of batches into finished
batches on the training device, ahead of the training step, across epoch boundaries.

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

import logging
import queue
import threading
from dataclasses import dataclass
from typing import Any, Hashable, Iterator, Protocol

from .memory import FEED_DEPTH as DEPTH

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
        with self._changed:
            self._generation += 1
            self._target = _Target(self._generation, at)
            self._changed.notify()
        self._next = at
        self._drop_made()
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
                log.warning("%s: no batch for %.0f s: waiting for %s", self.name, waited,
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
        finally:
            self.stream.close()


__all__ = ["DEPTH", "FeedEngine", "Position", "Ready", "Stream"]
