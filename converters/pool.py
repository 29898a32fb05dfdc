"""A conversion's worker processes, each with pipes of its own and the job it is on in shared
memory: one that dies (OOM killer, decoder crash) is seen at once and its input named in a
ResourceError, where ``multiprocessing.Pool`` waits forever and ``ProcessPoolExecutor`` names none."""

from __future__ import annotations

import multiprocessing as mp
import queue
import selectors
import signal
import threading
from collections import deque
from itertools import islice
from multiprocessing.connection import Connection
from multiprocessing.pool import ExceptionWithTraceback
from typing import Any, Callable, Iterable, Iterator, NoReturn, Sequence

from feedpipe.errors import ResourceError

Task = tuple[str, tuple[Any, ...]]  # (the file it is about, fn's arguments)
HELD = 2  # chunks a worker holds: one it works on, the next already in its inbox
_JOIN_S = 5.0  # a worker ended with SIGTERM that is still there after this is killed


class _Worker:
    """One worker process, its pipes, the job it is on (-1: none) and the (job, file) of each task
    of the chunks sent and not yet answered."""

    def __init__(self, ctx: Any, initializer: Callable[[], None]) -> None:
        task_r, self.tasks = ctx.Pipe(duplex=False)
        self.results, result_w = ctx.Pipe(duplex=False)
        self.current = ctx.RawValue("q", -1)
        self.proc = ctx.Process(target=_serve, daemon=True, name="feedpipe-convert-worker",
                                args=(task_r, result_w, self.current, initializer))
        self.proc.start()
        task_r.close()  # the worker's ends: a dead worker's pipes then read as closed
        result_w.close()
        self.chunks: deque[list[tuple[int, str]]] = deque()


class WorkerPool:
    """``workers`` processes (forkserver where there is one) running ``fn(*args)`` per task;
    ``close()`` ends every worker at once."""

    def __init__(self, workers: int, initializer: Callable[[], None]) -> None:
        ctx = mp.get_context("forkserver" if "forkserver" in mp.get_all_start_methods()
                             else "spawn")
        self._workers: list[_Worker] = []
        self._queue: deque[tuple[Callable[..., Any], list[tuple[int, Task]]]] = deque()
        self._done: dict[int, tuple[bool, Any]] = {}
        self._next = 0
        # every worker's results pipe and process sentinel, registered once: a poll is then one
        # system call (the passthrough path asks whether a transcode is ready once per file)
        self._selector = selectors.DefaultSelector()
        try:
            for _ in range(workers):
                w = _Worker(ctx, initializer)
                self._workers.append(w)
                self._selector.register(w.results, selectors.EVENT_READ, w)
                self._selector.register(w.proc.sentinel, selectors.EVENT_READ, w)
        except BaseException:
            self.close()
            raise

    def submit(self, fn: Callable[..., Any], tasks: Sequence[Task]) -> list[int]:
        """Queue ``tasks`` as one chunk, run in order by one worker; their job ids."""
        ids = list(range(self._next, self._next + len(tasks)))
        self._next += len(tasks)
        self._queue.append((fn, list(zip(ids, tasks, strict=True))))
        self._dispatch()
        return ids

    def ready(self, job: int) -> bool:
        """Whether ``job``'s result has come (without waiting)."""
        if job not in self._done:
            self._poll(0)
        return job in self._done

    def result(self, job: int) -> Any:
        """``job``'s result, waited for; the worker's exception re-raised; ResourceError when a
        worker died meanwhile."""
        while job not in self._done:
            self._poll(None)
        ok, value = self._done.pop(job)
        if not ok:
            raise value
        return value

    def imap(self, fn: Callable[..., Any], tasks: Iterable[Task], chunksize: int
             ) -> Iterator[Any]:
        """``fn(*args)`` of each task, in order, with at most ``HELD + 1`` chunks per worker
        submitted past the result awaited."""
        it = iter(tasks)
        jobs: deque[int] = deque()
        ahead = (HELD + 1) * len(self._workers) * chunksize
        while True:
            while len(jobs) < ahead:
                chunk = list(islice(it, chunksize))
                if not chunk:
                    break
                jobs.extend(self.submit(fn, chunk))
            if not jobs:
                return
            yield self.result(jobs.popleft())

    def close(self) -> None:
        """End every worker now (SIGTERM; SIGKILL if one is still there after a few seconds)."""
        for w in self._workers:
            if w.proc.is_alive():
                w.proc.terminate()
        for w in self._workers:
            w.proc.join(_JOIN_S)
            if w.proc.is_alive():
                w.proc.kill()
                w.proc.join()
            w.tasks.close()
            w.results.close()
        self._workers = []
        self._selector.close()

    def _dispatch(self) -> None:
        """Send queued chunks to the workers holding fewest: a busy one gets its next (up to
        :data:`HELD`) only while a chunk is queued for every worker, so the last go to idle ones."""
        while self._queue:
            w = min(self._workers, key=lambda w: len(w.chunks))
            if len(w.chunks) >= HELD or (w.chunks and len(self._queue) < len(self._workers)):
                return
            fn, chunk = self._queue.popleft()
            try:
                w.tasks.send((fn, chunk[0][0], [args for _, (_, args) in chunk]))
            except OSError:  # its end is closed: it died
                self._died(w)
            w.chunks.append([(job, name) for job, (name, _) in chunk])

    def _poll(self, timeout: float | None) -> None:
        """Collect results (waiting up to ``timeout``), notice dead workers, send next chunks."""
        ready = {(key.data, key.fileobj is key.data.results)
                 for key, _ in self._selector.select(timeout)}
        for w in self._workers:
            if (w, True) in ready:
                try:
                    results = w.results.recv()
                except (EOFError, OSError):
                    self._died(w)
                for (job, _), out in zip(w.chunks.popleft(), results, strict=True):
                    self._done[job] = out
            elif (w, False) in ready:  # died, and nothing of it is left to read
                self._died(w)
        self._dispatch()

    def _died(self, w: _Worker) -> NoReturn:
        w.proc.join(_JOIN_S)
        code = w.proc.exitcode
        how = (f"was killed by {_signal_name(-code)}" if code is not None and code < 0 else
               f"exited with status {code}" if code is not None else "stopped answering")
        hint = " (the OOM killer sends SIGKILL when memory runs out)" if code == -signal.SIGKILL \
            else ""
        on = {job: name for chunk in w.chunks for job, name in chunk}.get(w.current.value)
        if on is not None:
            raise ResourceError(f"{on}: the worker process converting it {how}{hint}; the "
                                "conversion stopped and kept nothing. Convert with fewer "
                                "--workers or more memory, or leave this file out", file=on)
        raise ResourceError(f"a conversion worker process {how} between files{hint}; the "
                            "conversion stopped and kept nothing")


def _signal_name(num: int) -> str:
    try:
        return signal.Signals(num).name
    except ValueError:
        return f"signal {num}"


def _serve(tasks: Connection, results: Connection, current: Any,
           initializer: Callable[[], None]) -> None:
    """A worker's loop: chunks in (read ahead by a thread, so a send never waits for the work),
    each task's ``(ok, result or exception)`` out as one list per chunk."""
    initializer()
    inbox: queue.SimpleQueue[Any] = queue.SimpleQueue()
    threading.Thread(target=_read, args=(tasks, inbox), daemon=True).start()
    while (msg := inbox.get()) is not None:
        fn, first, chunk = msg
        outs: list[tuple[bool, Any]] = []
        for job, args in enumerate(chunk, first):
            current.value = job
            try:
                outs.append((True, fn(*args)))
            except Exception as exc:
                outs.append((False, ExceptionWithTraceback(exc, exc.__traceback__)))
        current.value = -1
        try:
            results.send(outs)
        except OSError:  # the main process went away
            return
        except Exception as exc:  # a result the pipe cannot carry: nothing was sent
            why = RuntimeError(f"a worker's result could not be sent: {exc!r}")
            results.send([(False, why)] * len(outs))


def _read(tasks: Connection, inbox: queue.SimpleQueue[Any]) -> None:
    """Move chunks from the pipe to ``inbox`` as they come; None once the pipe is closed."""
    try:
        while True:
            inbox.put(tasks.recv())
    except (EOFError, OSError):
        inbox.put(None)
