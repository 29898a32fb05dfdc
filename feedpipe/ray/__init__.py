"""Conversion on Ray Data: ``feedpipe.ray.convert(paths_or_dataset, out, to="wds")``: each task
packs one part (``convert --part i/N``), then the parts merge, so the bytes are the CLI's."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

from converters.merge import MergeResult, merge
from converters.options import Format
from converters.parts import Part
from converters.sources import Source, SourceItem, scan
from feedpipe.errors import ConfigError, MissingDependencyError

if TYPE_CHECKING:
    import ray.data


def source_of(data: str | os.PathLike[str] | Sequence[str] | ray.data.Dataset) -> Source:
    """A folder or CSV/JSONL manifest (scanned as the CLI scans it), a list of image paths, or
    a Ray Dataset with a ``path`` column (e.g. ``ray.data.read_binary_files(...,
    include_paths=True)``): the paths are sorted, unlabeled, relative to their common folder."""
    if isinstance(data, (str, os.PathLike)):
        return scan(Path(data))
    if hasattr(data, "select_columns"):
        ds: Any = data
        if "path" not in ds.columns():
            raise ConfigError(f"a Ray Dataset for feedpipe.ray.convert needs a 'path' column; it "
                              f"has {ds.columns()}")
        data = [str(r["path"]) for r in ds.select_columns(["path"]).take_all()]
    paths = sorted({os.path.abspath(os.fspath(p)) for p in data})
    if not paths:
        raise ConfigError("feedpipe.ray.convert: no input paths")
    root = Path(os.path.commonpath(paths))
    if len(paths) == 1:
        root = root.parent
    items = tuple(SourceItem(Path(p), Path(p).relative_to(root).as_posix()) for p in paths)
    return Source(root, "paths", items)


def _pack(batch: dict[str, Any], *, source: Source, out: str, to: Format, count: int,
          options: dict[str, Any]) -> dict[str, Any]:
    """One Ray task: pack the parts of this batch in-process with feedpipe's converter."""
    from converters import convert

    written, skipped = [], []
    for i in batch["part"]:
        res = convert(source, out, to=to, workers=0, part=Part(int(i), count), **options)
        written.append(res.written)
        skipped.append(len(res.skipped))
    return {"part": list(batch["part"]), "written": written, "skipped": skipped}


def convert(data: str | os.PathLike[str] | Sequence[str] | ray.data.Dataset,
            out: str | os.PathLike[str], to: Format = "wds", *, parts: int | None = None,
            **options: Any) -> MergeResult:
    """Pack ``data`` into the dataset ``out`` with Ray Data, then merge the parts.

    ``parts``: how many parts (Ray tasks); default the cluster's CPUs, at most one per
    input. ``options``: :func:`converters.convert`'s keywords (``store``, ``resize``, ``masks``,
    ``targets``, ``writer_options``...); ``workers`` and ``val_fraction`` are not taken (Ray
    runs the parts in parallel; a part is one slice of the whole source).
    """
    try:
        import ray
    except ImportError as exc:
        raise MissingDependencyError("feedpipe.ray needs Ray Data: pip install 'feedpipe[ray]'") \
            from exc
    for bad in ("workers", "val_fraction", "part"):
        if bad in options:
            raise ConfigError(f"feedpipe.ray.convert: {bad}= is not taken (Ray runs the parts; "
                              "see the docstring)")
    source = source_of(data)
    if not ray.is_initialized():
        ray.init()
    if parts is None:
        parts = max(1, int(ray.cluster_resources().get("CPU", 1)))
    parts = max(1, min(parts, len(source.items)))
    ctx = ray.data.DataContext.get_current()
    reserve = ctx.op_resource_reservation_enabled
    # one operator and one block per part: Ray Data's per-operator CPU reservation only holds
    # part tasks back (measured: docs/distributed-conversion.md, benchmarks/RESULTS.md)
    ctx.op_resource_reservation_enabled = False
    try:
        ds: Any = ray.data.from_items([{"part": i} for i in range(parts)],
                                      override_num_blocks=parts)
        ds.map_batches(_pack, batch_size=1, num_cpus=1, fn_kwargs={
            "source": source, "out": os.fspath(out), "to": to, "count": parts,
            "options": options}).materialize()
    finally:
        ctx.op_resource_reservation_enabled = reserve
    return merge(out)
