"""Run in a fresh process (FEEDPIPE_FETCH=obstore): open a remote dataset in this parent, then
iterate it with 2 forked DataLoader workers; then start obstore's runtime in this parent and do
it again on a fresh cache. Writes OUT.json: each run's batch digests and whether this parent
had started obstore's runtime.

Usage: fetch_fork_probe.py S3_URL ENDPOINT CACHE_ROOT OUT.json"""

import json
import sys
import tempfile
from pathlib import Path

from fp_helpers import batch_digests, remote_batches
from servers import s3_options

from feedpipe import Workers
from feedpipe.dataset.remote import open_remote
from feedpipe.storage import download, fetch

url, endpoint, cache, out = sys.argv[1], sys.argv[2], Path(sys.argv[3]), Path(sys.argv[4])
options = s3_options(endpoint)


def digests(cache_dir: Path) -> list[dict[str, object]]:
    """One epoch with 2 forked workers; no plan-ahead prefetch, so the workers fetch the shards."""
    ds = open_remote(url, cache_dir=cache_dir, storage_options=options, prefetch=0)
    return batch_digests(remote_batches(ds, num_workers=2,
                                        workers=Workers(multiprocessing_context="fork")))


result = {"clean": digests(cache / "clean"), "parent_used_obstore": fetch._RUNTIME_PID is not None}
with tempfile.TemporaryDirectory() as tmp:  # the parent fetches with obstore: its runtime starts
    download(f"{url}/shard-000000.tar", Path(tmp) / "part", 1000, options)
result["after_parent_used_obstore"] = digests(cache / "tainted")
result["parent_runtime_started"] = fetch._RUNTIME_PID is not None
out.write_text(json.dumps(result))
