"""The worker processes of a conversion, each fed through a pipe of its own.

The main process sends a worker a chunk of inputs only when it holds none, and reads back one
result per input, so it always knows which input each worker is on. A worker that dies (kill -9,
the OOM killer, a crash inside a decoder) is seen at once through its process sentinel, and the
conversion stops with :class:`~feedpipe.errors.WorkerDiedError` naming the file it held.
``multiprocessing.Pool`` waits forever for a dead worker's task instead (and ending it can block on
a queue lock the worker died holding); ``ProcessPoolExecutor`` sees the death but not which input
the dead worker held.
"""

from __future__ import annotations

import multiprocessing as mp
import pickle
import signal
from collections import deque
from multiprocessing.connection import Connection, wait
from multiprocessing.pool import ExceptionWithTraceback
from typing import Any, Callable, Iterable, Iterator, NoReturn, Sequence

from feedpipe.errors import WorkerDiedError

Task = tuple[str, tuple[Any, ...]]  # (the file it is about, fn's arguments)
_JOIN_S = 5.0  # a worker ended with SIGTERM that is still there after this is killed


class WorkerPool:
    """``workers`` processes (forkserver where there is one) that run ``fn(*args)`` per task,
    each set up by ``initializer``; see the module docstring. Use it in a ``with``: leaving it
    ends every worker at once (after an error or Ctrl-C too)."""

    def __init__(self, workers: int, initializer: Callable[[], None]) -> None:
        ctx = mp.get_context("forkserver" if "forkserver" in mp.get_all_start_methods()
                             else "spawn")
        self._procs: list[Any] = []
        self._conns: list[Connection] = []
        self._held: list[deque[tuple[int, str]]] = []  # per worker: (job, file) sent, not answered
        self._queue: deque[tuple[Callable[..., Any], list[tuple[int, Task]]]] = deque()
        self._done: dict[int, tuple[bool, Any]] = {}
        self._next = 0
        try:
            for _ in range(workers):
                ours, theirs = ctx.Pipe()
                proc = ctx.Process(target=_serve, args=(theirs, initializer), daemon=True,
                                   name="feedpipe-convert-worker")
                proc.start()
                theirs.close()  # the worker's end: a dead worker's pipe then reads as closed
                self._procs.append(proc)
                self._conns.append(ours)
                self._held.append(deque())
        except BaseException:
            self.close()
            raise

    def __enter__(self) -> WorkerPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def submit(self, fn: Callable[..., Any], tasks: Sequence[Task]) -> list[int]:
        """Queue ``tasks`` as one chunk, run in order by one worker; their job ids."""
        ids = list(range(self._next, self._next + len(tasks)))
        self._next += len(tasks)
        self._queue.append((fn, list(zip(ids, tasks))))
        self._dispatch()
        return ids

    def ready(self, job: int) -> bool:
        """Whether ``job``'s result has come (without waiting)."""
        self._poll(0)
        return job in self._done

    def result(self, job: int) -> Any:
        """``job``'s result, waited for; the worker's exception (its traceback as the cause)
        re-raised; :class:`WorkerDiedError` when a worker died meanwhile."""
        while job not in self._done:
            self._poll(None)
        ok, value = self._done.pop(job)
        if not ok:
            raise value
        return value

    def imap(self, fn: Callable[..., Any], tasks: Iterable[Task], chunksize: int
             ) -> Iterator[Any]:
        """``fn(*args)`` of each task, in order; chunks are queued at most two per worker past
        the result awaited, so results that wait for a slow one stay few."""
        it = iter(tasks)
        jobs: deque[int] = deque()
        ahead = 2 * len(self._procs) * chunksize
        while True:
            while len(jobs) < ahead:
                chunk = [t for _, t in zip(range(chunksize), it)]
                if not chunk:
                    break
                jobs.extend(self.submit(fn, chunk))
            if not jobs:
                return
            yield self.result(jobs.popleft())

    def close(self) -> None:
        """End every worker now (SIGTERM; SIGKILL if one is still there after a few seconds)."""
        for proc in self._procs:
            if proc.is_alive():
                proc.terminate()
        for proc in self._procs:
            proc.join(_JOIN_S)
            if proc.is_alive():
                proc.kill()
                proc.join()
        for conn in self._conns:
            conn.close()
        self._procs, self._conns, self._held = [], [], []

    def _dispatch(self) -> None:
        """Send queued chunks to the workers that hold none: a worker is sent work only while it
        waits for it, so neither side ever blocks sending while the other does."""
        for w, held in enumerate(self._held):
            if not self._queue:
                return
            if held:
                continue
            fn, chunk = self._queue.popleft()
            try:
                self._conns[w].send((fn, [args for _, (_, args) in chunk]))
            except OSError:  # its end is closed: it died
                self._died(w)
            held.extend((job, name) for job, (name, _) in chunk)

    def _poll(self, timeout: float | None) -> None:
        """Collect the results that came (waiting up to ``timeout``), and notice dead workers."""
        sentinels = [p.sentinel for p in self._procs]
        ready = set(wait([*self._conns, *sentinels], timeout))
        for w, conn in enumerate(self._conns):
            if conn in ready or sentinels[w] in ready:
                try:
                    while conn.poll():
                        ok, value = conn.recv()
                        job, _ = self._held[w].popleft()
                        self._done[job] = (ok, value)
                except (EOFError, OSError):
                    self._died(w)
                if sentinels[w] in ready:
                    self._died(w)
        self._dispatch()

    def _died(self, w: int) -> NoReturn:
        proc = self._procs[w]
        proc.join(_JOIN_S)
        code = proc.exitcode
        how = (f"was killed by {_signal_name(-code)}" if code is not None and code < 0 else
               f"exited with status {code}" if code is not None else "stopped answering")
        hint = " (the OOM killer sends SIGKILL when memory runs out)" if code == -signal.SIGKILL \
            else ""
        if self._held[w]:
            name = self._held[w][0][1]
            raise WorkerDiedError(f"{name}: the worker process converting it {how}{hint}; the "
                                  "conversion stopped and kept nothing. Convert with fewer "
                                  "--workers or more memory, or leave this file out", file=name)
        raise WorkerDiedError(f"a conversion worker process {how} between files{hint}; the "
                              "conversion stopped and kept nothing")


def _signal_name(num: int) -> str:
    try:
        return signal.Signals(num).name
    except ValueError:
        return f"signal {num}"


def _serve(conn: Connection, initializer: Callable[[], None]) -> None:
    """A worker's loop: a chunk in, one ``(ok, result or exception)`` out per task."""
    initializer()
    while True:
        try:
            fn, chunk = conn.recv()
        except (EOFError, OSError):  # the main process went away
            return
        for args in chunk:
            try:
                out: tuple[bool, Any] = (True, fn(*args))
            except Exception as exc:
                out = (False, ExceptionWithTraceback(exc, exc.__traceback__))
            try:
                conn.send(out)
            except (pickle.PicklingError, TypeError, AttributeError) as exc:  # nothing was sent
                conn.send((False, RuntimeError(f"a worker's result could not be sent: {exc!r}")))
            except OSError:
                return
