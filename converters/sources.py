"""Conversion sources: an ImageFolder tree, a flat folder, or a CSV/JSONL manifest, each a sorted,
deterministic list of :class:`SourceItem` plus the class names; every file not taken is listed
with the reason."""

from __future__ import annotations

import csv
import errno
import json
import os
import re
import stat
from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Iterator, Sequence

from feedpipe.errors import BadInputError, ConfigError, NotRegularFileError
from feedpipe.paths import KINDS

from .options import LabelsAs, Layout, Unlabeled

IMAGE_EXTS = frozenset({".jpg", ".jpeg", ".jpe", ".jfif", ".png", ".webp", ".bmp", ".dib", ".tif",
                        ".tiff", ".gif", ".ppm", ".pgm", ".pbm", ".pnm", ".jp2", ".j2k", ".j2c",
                        ".jpx", ".jpf"})
Entry = tuple[str, str]  # (path relative to the source root, why it was not taken)
SPLIT_NAMES = ("train", "val", "test")  # the folders of a split root (split_dirs)


@dataclass(frozen=True)
class SourceItem:
    """One input image: where it is, its path relative to the source root, its label, extras,
    and its mask file (segmentation sources)."""

    path: Path
    rel: str
    label: int = -1
    extra: dict[str, Any] | None = None
    mask: Path | None = None
    fields: dict[str, Any] | None = None  # values of the source's typed fields (Source.typed)
    row: int = 0  # a manifest's line number (1: a CSV's header), for messages; 0: no manifest


@dataclass(frozen=True)
class Source:
    """A scanned source: items in deterministic order, class names, and the files not taken.

    ``ignored`` holds files that are not images (by extension) or hidden; ``refused`` holds
    entries that may be images but cannot be taken (symlink loops, broken links, names that are
    not UTF-8, unreadable folders, images outside the class folders of an ImageFolder tree).
    """

    root: Path
    kind: str
    items: tuple[SourceItem, ...]
    classes: tuple[str, ...] = ()
    ignored: tuple[Entry, ...] = field(default_factory=tuple)
    masked: bool = False  # a segmentation source: every item should have a mask
    unmatched_masks: tuple[str, ...] = ()  # mask files that no image matched
    refused: tuple[Entry, ...] = ()
    split_by: str = ""  # a split root (converters.split_root): "separate" or "field"
    split_names: tuple[str, ...] = ()
    typed: tuple[Any, ...] = ()  # label fields (keypoints, boxes, text...) the items fill
    contained: bool = False  # every file it names must lie inside ``root`` (see :func:`outside`)

    @property
    def labeled(self) -> bool:
        return self.kind == "imagefolder" or any(i.label >= 0 for i in self.items)

    @property
    def has_extra(self) -> bool:
        return any(i.extra for i in self.items)

    @property
    def not_taken(self) -> list[dict[str, str]]:
        """Every file not taken, refused first: ``{"path", "reason"}`` (for the manifest)."""
        return [{"path": p, "reason": r} for p, r in (*self.refused, *self.ignored)]


def open_regular(path: str | os.PathLike[str]) -> tuple[int, os.stat_result]:
    """A read-only descriptor of ``path`` and its ``fstat`` when it is a regular file (symlinks
    followed). It is opened non-blocking (opening a FIFO waits for a writer, forever): a FIFO, a
    device (``/dev/zero`` never ends), a socket or a folder is closed again and refused with
    :class:`NotRegularFileError` before a byte is read."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        mode = st.st_mode
        if not stat.S_ISREG(mode):
            kind = KINDS.get(stat.S_IFMT(mode), "not a regular file")
            raise NotRegularFileError(f"{os.fspath(path)}: {kind}, not a regular file; refused "
                                      "unread (reading it could block forever or never end)",
                                      kind=kind, file=os.fspath(path))
    except BaseException:
        os.close(fd)
        raise
    return fd, st


def read_regular(path: str | os.PathLike[str]) -> bytes:
    """A whole regular file (:func:`open_regular`'s check) in four system calls
    (``Path.read_bytes`` takes eight: buffered open's isatty and seeks, and a second read to see
    the end; ~10 µs an image in a passthrough conversion)."""
    fd, st = open_regular(path)
    try:
        size = st.st_size
        data = os.read(fd, size + 1)
        if len(data) <= size:  # a short read: the end of a regular file
            return data
        chunks = [data]  # it grew meanwhile, or reports no size (/proc)
        while chunk := os.read(fd, 1 << 20):
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def outside(root: Path, rel: str) -> str | None:
    """Why ``rel`` (a path a source names, relative to ``root``) leads outside ``root``, or None
    when it stays inside: an absolute path, a ``..`` that climbs out, or a symlink (the file or a
    folder on its way) whose target lies outside. Checked under ``contained=True``."""
    if os.path.isabs(rel):
        return "an absolute path, outside the source folder"
    norm = os.path.normpath(rel)
    if norm == ".." or norm.startswith("../"):
        return "'..' leads outside the source folder"
    base = os.path.realpath(root)
    real = os.path.realpath(os.path.join(base, rel))
    if os.path.commonpath([base, real]) != base:
        return f"a symlink leads outside the source folder (to {real})"
    return None


def display_name(rel: str) -> str:
    """A path as it can be printed and stored in JSON: bytes that are not UTF-8 become \\xNN."""
    return os.fsencode(rel).decode("utf-8", "backslashreplace")


@dataclass
class _Tree:
    files: list[tuple[Path, str]] = field(default_factory=list)
    ignored: list[Entry] = field(default_factory=list)
    refused: list[Entry] = field(default_factory=list)


def _walk(folder: Path, base: Path, tree: _Tree, seen: frozenset[tuple[int, int]],
          contained: bool = False) -> None:
    """List ``folder`` recursively (symlinks followed, loops and unreadable entries reported;
    ``contained``: symlinks leading outside ``base`` refused)."""
    try:
        with os.scandir(folder) as it:
            entries = sorted(it, key=lambda e: os.fsencode(e.name))
    except OSError as exc:
        tree.refused.append((display_name(folder.relative_to(base).as_posix()) + "/",
                             f"unreadable folder: {exc.strerror or exc}"))
        return
    prefix = folder.relative_to(base).as_posix()
    prefix = "" if prefix == "." else prefix + "/"
    for e in entries:
        path = Path(e.path)
        rel = prefix + e.name
        shown = display_name(rel)
        if e.name.startswith("."):
            tree.ignored.append((shown, "hidden (name starts with '.')"))
            continue
        try:
            if not e.is_symlink() and e.is_file(follow_symlinks=False):
                regular = True  # the directory entry's type says so: no stat call (~20k/s saved)
            else:
                st = os.stat(path)  # follows symlinks
                regular = stat.S_ISREG(st.st_mode)
        except OSError as exc:
            why = ("symlink loop" if exc.errno == errno.ELOOP else
                   f"broken symlink ({exc.strerror})" if e.is_symlink() else
                   f"cannot stat: {exc.strerror or exc}")
            tree.refused.append((shown, why))
            continue
        if contained and e.is_symlink() and (away := outside(base, rel)) is not None:
            tree.refused.append((shown, away))
            continue
        if not regular and stat.S_ISDIR(st.st_mode):
            if (st.st_dev, st.st_ino) in seen:
                tree.refused.append((shown + "/", "symlink loop (links to a folder that holds it)"))
            else:
                _walk(path, base, tree, seen | {(st.st_dev, st.st_ino)}, contained)
        elif not regular:
            tree.ignored.append((shown, "not a regular file"))
        elif shown != rel:
            tree.refused.append((shown, "file name is not valid UTF-8: rename it to convert it"))
        elif path.suffix.lower() in IMAGE_EXTS:
            tree.files.append((path, rel))
        else:
            tree.ignored.append((rel, "not an image (file extension)"))


def _walk_root(root: Path, contained: bool = False) -> _Tree:
    """Everything under ``root``, files sorted by relative path."""
    tree, st = _Tree(), os.stat(root)
    _walk(root, root, tree, frozenset({(st.st_dev, st.st_ino)}), contained)
    tree.files.sort(key=lambda f: f[1])
    return tree


def scan(src: str | Path, layout: Layout = "auto", labels: LabelsAs = "auto",
         unlabeled: Unlabeled = "refuse", contained: bool = False) -> Source:
    """Detect the source kind and list its images (docs/convert.md): a folder is an ImageFolder
    tree when a top-level sub-folder holds an image (images at its top level are then refused by
    name, never made unlabeled), else a flat folder; ``layout`` forces either reading. A ``.csv``
    or ``.jsonl`` file is a manifest (``labels``, ``unlabeled``: :func:`manifest_labels`)."""
    if layout not in ("auto", "imagefolder", "flat"):
        raise ConfigError(f"layout={layout!r}: use 'auto', 'imagefolder' or 'flat'",
                          option="layout")
    src = Path(src)
    if not src.exists():
        raise FileNotFoundError(f"{src}: source does not exist")
    if src.is_file():
        if src.suffix.lower() in (".csv", ".jsonl"):
            return _scan_manifest(src, labels, unlabeled, contained)
        raise ConfigError(f"{src}: a source file must be a .csv or .jsonl manifest")
    if layout == "auto" and (splits := split_dirs(src)):
        raise ConfigError(f"{src} holds {' and '.join(splits)} split folders: pass "
                          "split_root='separate' (--split-root separate: one dataset each) or "
                          "'field' (one dataset with a split field), or layout='imagefolder' "
                          "(--layout imagefolder) to read them as classes")
    tree = _walk_root(src, contained)
    in_dirs = any("/" in rel for _, rel in tree.files)
    if layout == "flat" or (layout == "auto" and not in_dirs):
        items = tuple(SourceItem(p, rel) for p, rel in tree.files)
        return Source(src, "folder", items, (), tuple(tree.ignored), refused=tuple(tree.refused),
                      contained=contained)
    classes = sorted(display_name(e.name) for e in os.scandir(src)
                     if not e.name.startswith(".") and _is_dir(Path(e.path)))
    label = {c: k for k, c in enumerate(classes)}
    items, refused = [], list(tree.refused)
    for p, rel in tree.files:
        top, sep, _ = rel.partition("/")
        if sep and top in label:
            items.append(SourceItem(p, rel, label[top]))
        else:
            refused.append((rel, "outside the class folders of an ImageFolder tree (labels come "
                                 "from class folders; --layout flat reads the folder unlabeled)"))
    items.sort(key=lambda i: i.label)  # stable: class order, then path order within a class
    return Source(src, "imagefolder", tuple(items), tuple(classes), tuple(tree.ignored),
                  refused=tuple(refused), contained=contained)


def split_dirs(src: Path) -> list[str]:
    """The split folders of ``src`` when its visible top level is only 2-3 of train/val/test,
    each holding sub-folders (class folders); else [] (a split root: converters.split_root)."""
    if not src.is_dir():
        return []
    names = sorted(e.name for e in os.scandir(src) if not e.name.startswith("."))
    if len(names) < 2 or not set(names) <= set(SPLIT_NAMES):
        return []
    if not all(_is_dir(src / n) and any(_is_dir(p) for p in (src / n).iterdir()) for n in names):
        return []
    return [n for n in SPLIT_NAMES if n in names]


def _is_dir(path: Path) -> bool:
    try:
        return path.is_dir()
    except OSError:  # a symlink loop: refused by the walk
        return False


def _scan_manifest(path: Path, how: LabelsAs = "auto", unlabeled: Unlabeled = "refuse",
                   contained: bool = False) -> Source:
    """CSV (header row) or JSONL rows with ``path`` (relative to the manifest), optional ``label``
    (read by :func:`manifest_labels`) and any extra columns (kept as the ``meta`` JSON field).
    A malformed row (a JSONL line that is not a JSON object, a row without a path; with
    ``contained``, a path or mask outside the manifest's folder) is refused by line number, not
    fatal: one bad row must not stop a million-row conversion (``strict`` does)."""
    rows, lines, bad = _read_rows(path)
    if not rows and not bad:
        raise BadInputError(f"{path}: the manifest has no rows" + (
            " (only a header)" if path.suffix.lower() == ".csv" else ""), file=path)
    if rows and not any("path" in r for r in rows):
        raise BadInputError(f"{path}: no 'path' column (it has {sorted(rows[0])[:8]}); name the "
                            "column of image paths 'path', or drop the image columns to pack "
                            "the table as arrays (docs/arrays.md)", file=path)
    why = {k: "no 'path' value in this row" for k, r in enumerate(rows)
           if r.get("path") in (None, "")}
    if contained:
        for k, r in enumerate(rows):
            for col in ("path", "mask"):
                if k not in why and r.get(col) not in (None, "") and \
                        (away := outside(path.parent, str(r[col]))) is not None:
                    why[k] = f"{col} {str(r[col])!r}: {away}"
    keep = [k for k in range(len(rows)) if k not in why]
    bad += [(f"{path.name}:{lines[k]}", w) for k, w in why.items()]
    if not keep:
        raise BadInputError(f"{path}: no usable row; " + "; ".join(f"{w}: {r}" for w, r in
                                                                    bad[:3]), file=path)
    rows, lines = [rows[k] for k in keep], [lines[k] for k in keep]
    labels, classes = manifest_labels(path, rows, how, unlabeled)
    masked = any(r.get("mask") not in (None, "") for r in rows)
    items = []
    for r, label, line in zip(rows, labels, lines, strict=True):
        rel = str(r["path"])
        extra = {k: v for k, v in r.items() if k not in ("path", "label", "mask")}
        mask = path.parent / str(r["mask"]) if r.get("mask") not in (None, "") else None
        items.append(SourceItem((path.parent / rel), rel, label, extra or None, mask, row=line))
    return Source(path.parent, "manifest", tuple(items), classes, (), masked,
                  refused=tuple(sorted(bad, key=lambda e: int(e[0].rpartition(":")[2]))),
                  contained=contained)


def _read_rows(path: Path) -> tuple[list[dict[str, Any]], list[int], list[Entry]]:
    """A manifest's rows, each row's line number, and the lines refused (``name:line``, why)."""
    rows: list[dict[str, Any]] = []
    lines: list[int] = []
    bad: list[Entry] = []
    with open(path, newline="", encoding="utf-8") as fh:
        if path.suffix.lower() == ".csv":
            reader = csv.reader(fh)
            header = next(reader, [])
            check_header(path, header)
            for r in reader:
                if len(r) == len(header):
                    rows.append(dict(zip(header, r, strict=True)))
                    lines.append(reader.line_num)
                elif r:  # a blank line is no row; a ragged one would lose or misplace a cell
                    bad.append((f"{path.name}:{reader.line_num}",
                                f"{len(r)} cells, the header has {len(header)}"))
            return rows, lines, bad
    for n, r, why in json_lines(path, "not a JSON line"):
        if why is None and isinstance(r, dict):
            rows.append(r)
            lines.append(n)
        else:
            bad.append((f"{path.name}:{n}", why or f"a JSON {type(r).__name__}, not an object "
                                                   "with a 'path'"))
    return rows, lines, bad


_INT = re.compile(r"[+-]?\d+")


def check_header(path: Path, header: Sequence[str]) -> None:
    """Refuse a CSV header that names a column twice (one of each would be lost)."""
    twice = [h for h, n in Counter(header).items() if n > 1]
    if twice:
        where = ", ".join(f"{h!r} (columns "
                          f"{', '.join(str(j + 1) for j, g in enumerate(header) if g == h)})"
                          for h in twice)
        raise BadInputError(f"{path}: the header names {where} more than once; one of each "
                            "would be lost: give every column its own name", file=path)


def json_lines(path: Path, invalid: str, **decode: Any) -> Iterator[tuple[int, Any, str | None]]:
    """Each non-blank line of a JSONL file: (line number, value, None), or (line number, None,
    why) for a line that is not JSON (``invalid``: the reason's start) or gives a key twice."""
    decoder = json.JSONDecoder(object_pairs_hook=json_object, **decode)
    with open(path, encoding="utf-8") as fh:
        for n, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                yield n, decoder.decode(line), None
            except KeyError as exc:  # from json_object
                yield n, None, (f"key {exc.args[0]!r} is given twice in this object (one value "
                                "would be lost)")
            except ValueError as exc:
                yield n, None, f"{invalid}: {exc}"


def json_object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """``json``'s object hook that refuses a key given twice (a KeyError naming it): ``json``
    would keep the last value only."""
    d = dict(pairs)
    if len(d) != len(pairs):
        raise KeyError(next(k for k, n in Counter(k for k, _ in pairs).items() if n > 1))
    return d


def manifest_labels(path: Path, rows: list[dict[str, Any]], how: LabelsAs = "auto",
                    unlabeled: Unlabeled = "refuse") -> tuple[list[int], tuple[str, ...]]:
    """Each row's label index (-1: none) and the class names, read one way for every row
    (``labels=``, docs/convert.md). A column mixing integers and names is refused under "auto",
    naming the rows of the smaller kind: one ``unknown`` among 0..11 would renumber every class."""
    if how not in ("auto", "ints", "names"):
        raise ConfigError(f"labels={how!r}: use 'auto', 'ints' or 'names'", option="labels")
    if unlabeled not in ("refuse", "keep"):
        raise ConfigError(f"unlabeled={unlabeled!r}: use 'refuse' or 'keep'", option="unlabeled")
    kinds: dict[str, list[int]] = {"empty": [], "int": [], "name": [], "bad": []}
    for n, r in enumerate(rows):
        lab = r.get("label")
        kind = ("empty" if lab is None or (isinstance(lab, str) and not lab.strip()) else
                "bad" if isinstance(lab, (bool, dict, list)) else
                "int" if isinstance(lab, int) or (isinstance(lab, str) and _INT.fullmatch(
                    lab.strip())) else "name")
        kinds[kind].append(n)
    ints, names = kinds["int"], kinds["name"]

    def refuse(picked: list[int], what: str, fix: str) -> BadInputError:
        shown = ", ".join(f"row {n + 1} ({rows[n]['path']}: {rows[n].get('label')!r})"
                          for n in picked[:5])
        more = f" and {len(picked) - 5} more" if len(picked) > 5 else ""
        return BadInputError(f"{path}: {len(picked)} row(s) {what}: {shown}{more}; {fix}",
                             file=path)

    if kinds["bad"]:
        raise refuse(kinds["bad"], "have a label that is neither an integer nor a class name",
                     "give each row one integer or name")
    if how == "auto" and ints and names:
        few, many = (names, "integers") if len(names) <= len(ints) else (ints, "names")
        raise refuse(few, f"break a label column of {many} ({len(ints)} integer, {len(names)} "
                     "other)", "fix them, or say how to read every label: labels='names' "
                     "(--labels names) makes each a class name (integers first, in numeric "
                     "order), labels='ints' (--labels ints) refuses anything but an integer")
    if how == "ints" and names:
        raise refuse(names, "have a label that is not an integer class index (labels='ints')",
                     "fix them, or pass labels='names' (--labels names) to read labels as names")
    if kinds["empty"] and (ints or names) and unlabeled == "refuse":
        raise refuse(kinds["empty"], f"have an empty label among {len(ints) + len(names)} "
                     "labelled rows", "fill or drop them, or pass unlabeled='keep' (--unlabeled "
                     "keep) to store them with label -1 (counted in the summary)")
    out = [-1] * len(rows)
    classes: tuple[str, ...] = ()
    if how == "names" or (names and how == "auto"):
        found = {str(rows[n]["label"]) for n in ints + names}
        classes = tuple(sorted(found, key=lambda c: (0, int(c), c) if _INT.fullmatch(c.strip())
                               else (1, 0, c)))
        index = {c: k for k, c in enumerate(classes)}
        for n in ints + names:
            out[n] = index[str(rows[n]["label"])]
        return out, classes
    negative = [n for n in ints if int(rows[n]["label"]) < 0]
    if negative:
        raise refuse(negative, "have a negative class index", "class indices are 0 or more "
                     "(-1 is what feedpipe stores for 'no label'); labels='names' (--labels "
                     "names) reads them as names")
    for n in ints:
        out[n] = int(rows[n]["label"])
    return out, classes


def attach_masks(source: Source, masks: str | Path) -> Source:
    """Pair each image with the mask of the same path without extension in ``masks`` (``cls/a.jpg``
    ↔ ``cls/a.png``), else of the same file stem when exactly one mask and one image have it.
    Images without a mask are skipped later, by name; masks without an image are listed."""
    root = Path(masks)
    if not root.is_dir():
        raise FileNotFoundError(f"{root}: mask folder does not exist")
    files = [p for p, _ in _walk_root(root, source.contained).files]
    by_rel: dict[str, Path] = {}
    by_stem: dict[str, list[Path]] = {}
    for p in files:
        by_rel[p.relative_to(root).with_suffix("").as_posix()] = p
        by_stem.setdefault(p.stem, []).append(p)
    image_stems = Counter(Path(it.rel).stem for it in source.items)
    used: set[Path] = set()
    items = []
    for it in source.items:
        rel = Path(it.rel).with_suffix("").as_posix()
        name = Path(it.rel).stem
        stem = by_stem.get(name, [])
        # by stem only when it is unique on both sides: one mask must never serve two images
        m = by_rel.get(rel) or (stem[0] if len(stem) == 1 and image_stems[name] == 1 else None)
        if m is not None:
            used.add(m)
        items.append(replace(it, mask=m))
    unmatched = tuple(p.relative_to(root).as_posix() for p in files if p not in used)
    return replace(source, items=tuple(items), masked=True, unmatched_masks=unmatched)
