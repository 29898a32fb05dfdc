"""What a conversion costs per image, counted in ways a busy machine does not blur: page faults
(fresh memory the kernel hands out, the system time of a passthrough conversion) and which files
take the progressive transcode."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

# A fresh process (its heap as glibc leaves it), writing 1,500 records of ~40 kB (a 500×375 photo)
# through the LMDB writer; prints the minor page faults the writes and close took per record, and
# the share of the process's CPU time that the writing thread itself took.
_FAULTS = textwrap.dedent("""
    import json, os, resource, sys, time
    from pathlib import Path
    from feedpipe.dataset.registry import WRITERS
    from feedpipe.schema.fields import BytesField
    from feedpipe.schema.model import Schema
    blobs = [os.urandom(38_000 + 97 * k) for k in range(16)]
    w = WRITERS[sys.argv[2]](Path(sys.argv[1]), Schema((BytesField("image"),)))
    n = 1500
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    cpu, mine = time.process_time(), time.thread_time()
    for i in range(n):
        w.write({"image": blobs[i % 16]})
    w.close()
    share = (time.thread_time() - mine) / (time.process_time() - cpu)
    print(json.dumps([(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / n, share]))
""")


def _write_costs(tmp_path: Path, fmt: str = "lmdb") -> tuple[float, float]:
    out = subprocess.run([sys.executable, "-c", _FAULTS, str(tmp_path / "ds"), fmt], check=True,
                         capture_output=True, text=True, timeout=120)
    faults, share = json.loads(out.stdout)
    return faults, share


def test_lmdb_writer_does_not_refault_its_memory(tmp_path: Path) -> None:
    """LMDB copies a transaction's records into malloc'd pages it frees at commit; with 64 MiB
    transactions glibc gave that memory back and faulted it in again: ~11 faults a 40 kB record
    (10 is the record's own size in pages). Now the memory is reused: well under one."""
    per_record, _ = _write_costs(tmp_path)
    assert per_record < 3, f"{per_record:.1f} page faults a record"


def test_lmdb_commits_run_beside_the_writing_thread(tmp_path: Path) -> None:
    """LMDB's commits (the copy into the page cache) run on a helper thread, so a conversion's
    packing and writing use two cores: the writing thread takes well under all of the process's
    CPU time (before: all of it)."""
    _, share = _write_costs(tmp_path)
    assert share < 0.9, f"the writing thread took {share:.0%} of the CPU time"


def test_read_file_reads_whole_files(tmp_path: Path) -> None:
    """The packer's file read (four system calls, not ``Path.read_bytes``'s eight) returns every
    byte: of a photo, of an empty file, and of a file whose size says 0 but holds more (/proc)."""
    from converters.sources import read_regular as read_file

    data = bytes(range(256)) * 300
    (tmp_path / "a.jpg").write_bytes(data)
    (tmp_path / "empty.jpg").write_bytes(b"")
    assert read_file(tmp_path / "a.jpg") == data
    assert read_file(tmp_path / "empty.jpg") == b""
    status = Path("/proc/self/status")
    if status.exists():
        assert read_file(status).startswith(b"Name:")


_SIGINT = textwrap.dedent("""
    import os, signal, sys, time
    from pathlib import Path
    from feedpipe.dataset.registry import WRITERS
    from feedpipe.schema.fields import BytesField
    from feedpipe.schema.model import Schema
    w = WRITERS[sys.argv[2]](Path(sys.argv[1]), Schema((BytesField("image"),)))
    for i in range(200):  # past a batch: the helper thread is running
        w.write({"image": os.urandom(40_000)})
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})  # as while a worker pool starts
    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(0.3)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    w.close()
    print("not interrupted")
""")


def test_writer_threads_leave_ctrl_c_to_the_main_thread(tmp_path: Path) -> None:
    """The LMDB writer's helper thread blocks SIGINT: while the main thread blocks it (the converter
    does while its worker pool starts), a Ctrl-C waits instead of reaching Python through the
    helper thread (which would interrupt the pool's start half-way)."""
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "1"}  # numpy's BLAS thread would let it in too
    out = subprocess.run([sys.executable, "-c", _SIGINT, str(tmp_path / "ds"), "lmdb"], env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "not interrupted", out.stderr[-500:]
