"""Run one page's code blocks in order, in the current folder: ``python docs_run.py PAGE``.

Tracebacks name the page and the Markdown line (each block is compiled at its own line), so a
failing example points at itself. Exit status 1 on the first block that fails.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from docs_blocks import ROOT, RUN, blocks  # noqa: E402


def main(page: str) -> int:
    namespace: dict[str, object] = {"__name__": "__main__"}
    for block in blocks(ROOT / page):
        if block.not_run is not None or block.language not in RUN:
            continue
        where = f"{block.page}:{block.line}"
        absent = [m for m in block.needs if importlib.util.find_spec(m) is None]
        if absent:
            print(f"--- {where}: skipped, {', '.join(absent)} not installed", flush=True)
            continue
        print(f"--- {where} ({block.language}{', hidden' if block.hidden else ''})", flush=True)
        if block.language in ("bash", "console"):
            env = dict(os.environ,  # as hidden blocks left it (an S3 endpoint on 127.0.0.1)
                       PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
            done = subprocess.run(["bash", "-euo", "pipefail", "-c", block.script], env=env)
            if done.returncode:
                print(f"{where}: the bash block exited {done.returncode}", file=sys.stderr)
                return 1
            continue
        try:
            exec(compile("\n" * (block.line - 1) + block.code, block.page, "exec"), namespace)
        except BaseException:
            traceback.print_exc()
            print(f"{where}: the python block failed", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
