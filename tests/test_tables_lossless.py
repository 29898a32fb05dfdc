"""Tables lose nothing silently (converters/tables.py, converters/arrays.py, Windows): each case
here used to pass and store something else than the file held, or end in a traceback.

Duplicate column names dropped a column; an integer above 2^53 in a column with a gap became a
float64 that differs; ``true`` among JSONL numbers became 1; CSV ``1_000`` read as 1000; ``1e400``
read as infinity, and infinities were not counted as gaps (``Windows(gaps="refuse")`` served them,
and one made ``normalize=True`` call its column "all NaN"); an integer beyond int64 was an
OverflowError traceback; a small ``.npz`` decompressed whatever it held; a Parquet bool column
with a null was "object dtype"; ``Windows(features=[])`` a bare numpy ValueError.
"""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from fp_helpers import cli_main

import feedpipe
from converters.arrays import pack_arrays
from converters.tables import MAX_MEMBER_BYTES, read_table
from feedpipe.dataset.windows import Windows
from feedpipe.errors import BadInputError, ConfigError

BIG = 2**53 + 1  # 9007199254740993: float64 reads it as ...992


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def test_duplicate_column_names_are_refused(tmp_path, capsys):
    src = _write(tmp_path / "t.csv", "temp,temp,y\n1,2,3\n4,5,6\n")
    rc, _, err = cli_main(capsys, "convert", src, "--to", "lmdb", "-o", tmp_path / "o")
    assert rc == 2 and not (tmp_path / "o").exists()
    assert "the header names 'temp' (columns 1, 2) more than once" in err


def test_a_jsonl_row_giving_a_key_twice_is_skipped_and_named(tmp_path):
    src = _write(tmp_path / "t.jsonl", '{"a": 1, "b": 2}\n{"a": 3, "a": 4, "b": 5}\n'
                 '{"a": 6, "b": 7}\n')
    cols, _, skipped = read_table(src)
    assert cols["a"].tolist() == [1, 6] and cols["b"].tolist() == [2, 7]
    assert skipped == [{"path": "t.jsonl:2", "reason": "key 'a' is given twice in this object "
                                                       "(one value would be lost)"}]


def test_integers_float64_cannot_hold_are_refused_with_a_gap_or_fractions(tmp_path):
    with pytest.raises(BadInputError, match=rf"column 'id': {BIG} \(line 2\) with a missing value "
                       r"\(line 3\): a column with missing values is float64"):
        read_table(_write(tmp_path / "gap.csv", f"id,v\n{BIG},1\n,2\n"))
    with pytest.raises(BadInputError, match=rf"{BIG} \(line 3\) among fractions"):
        read_table(_write(tmp_path / "mix.csv", f"id\n1.5\n{BIG}\n"))
    with pytest.raises(BadInputError, match=rf"column 'id': {BIG} \(line 1\) with a missing "
                       r"value \(line 2\)"):
        read_table(_write(tmp_path / "gap.jsonl", f'{{"id": {BIG}}}\n{{"id": null}}\n'))
    # small integers with a gap still read exactly, as float64 with NaN
    cols, _, _ = read_table(_write(tmp_path / "ok.csv", f"id,v\n{2**53},1\n,2\n-3,3\n"))
    assert cols["id"].dtype == np.float64 and cols["id"][0] == 2**53
    assert np.isnan(cols["id"][1]) and cols["id"][2] == -3


def test_parquet_integers_with_a_null_and_bools_with_a_null(tmp_path):
    pq.write_table(pa.table({"id": pa.array([BIG, None], pa.int64())}), tmp_path / "i.parquet")
    with pytest.raises(BadInputError, match=rf"column 'id': {BIG} with 1 null"):
        read_table(tmp_path / "i.parquet")
    pq.write_table(pa.table({"ok": pa.array([7, None], pa.int64())}), tmp_path / "k.parquet")
    assert read_table(tmp_path / "k.parquet")[0]["ok"].tolist()[0] == 7.0
    pq.write_table(pa.table({"flag": pa.array([True, None, False])}), tmp_path / "b.parquet")
    with pytest.raises(BadInputError, match=r"column 'flag': true/false with 1 null\(s\): a bool "
                       "array holds no missing value.*fill the nulls") as e:
        read_table(tmp_path / "b.parquet")
    assert "pickle" not in str(e.value)
    pq.write_table(pa.table({"flag": pa.array([True, False])}), tmp_path / "c.parquet")
    assert read_table(tmp_path / "c.parquet")[0]["flag"].dtype == bool


def test_true_among_numbers_and_text_digits_are_not_numbers(tmp_path):
    with pytest.raises(BadInputError, match=r"column 'n': true/false \(line 2\) among numbers "
                       r"\(line 1\): nothing is cast silently"):
        read_table(_write(tmp_path / "t.jsonl", '{"n": 5}\n{"n": true}\n{"n": 2}\n'))
    with pytest.raises(BadInputError, match=r"true/false with null \(line 2\)"):
        read_table(_write(tmp_path / "u.jsonl", '{"n": true}\n{"n": null}\n'))
    with pytest.raises(BadInputError, match=r"column 'n' is not numeric \(row 1: '1_000'\)"):
        read_table(_write(tmp_path / "u.csv", "n\n1_000\n2\n"))
    cols, _, _ = read_table(tmp_path / "u.csv", columns=["n"])
    assert cols["n"].tolist() == ["1_000", "2"]  # named: kept as the text it is


def test_values_beyond_int64_or_float64_are_one_line_errors(tmp_path, capsys):
    src = _write(tmp_path / "big.csv", "id,v\n1,2\n99999999999999999999,3\n")
    rc, _, err = cli_main(capsys, "convert", src, "--to", "lmdb", "-o", tmp_path / "o")
    assert rc == 2 and err.count("\n") == 1
    assert "column 'id': 99999999999999999999 (line 3) does not fit int64" in err
    with pytest.raises(BadInputError, match=r"column 'v': a number \(line 3\) does not fit "
                       "float64"):
        read_table(_write(tmp_path / "f.csv", "v\n1.5\n1e400\n"))
    with pytest.raises(BadInputError, match=r"column 'v': a number \(line 3\) does not fit "
                       "float64"):
        read_table(_write(tmp_path / "t.jsonl", '{"v": 1.5}\n{"v": Infinity}\n{"v": 1e400}\n'))
    with pytest.raises(BadInputError, match=r"'n': 123456789012345678901 \(line 1\) does not fit"):
        read_table(_write(tmp_path / "n.jsonl", '{"n": 123456789012345678901}\n'))


def test_infinities_are_gaps_counted_refused_and_left_out_of_statistics(tmp_path, capsys):
    src = _write(tmp_path / "s.csv", "v,w\n" + "".join(
        f"{'inf' if k == 5 else k},{k % 7}\n" for k in range(40)))
    rc, out, _ = cli_main(capsys, "convert", src, "--to", "lmdb", "-o", tmp_path / "s",
                          "--series", "--train-fraction", "0.5")
    assert rc == 0
    assert "missing values (NaN) in v: 1 in 1 rows, 1 infinite (first rows 5)" in out
    with pytest.raises(ConfigError, match=r"missing values \(NaN or infinite\) .*v in 1 rows "
                       r"\(first 5\)"):
        Windows(tmp_path / "s", length=4, targets=["w"])
    skip = Windows(tmp_path / "s", length=4, targets=["w"], gaps="skip")
    assert skip.left_out == 4  # the windows whose 4 input rows hold row 5
    assert all(not (s <= 5 <= s + 3) for s in skip.starts.tolist())
    norm = Windows(tmp_path / "s", length=4, targets=["w"], gaps="fill", normalize=True,
                   split="train")
    mean, std = norm.stats()["x"]
    finite = np.array([k for k in range(20) if k != 5], float)
    assert np.allclose([mean[0], std[0]], [finite.mean(), finite.std()])
    assert np.isfinite(norm.x).all()


def test_npz_members_are_bounded_before_they_are_decompressed(tmp_path, capsys):
    assert MAX_MEMBER_BYTES == 1 << 30
    np.savez_compressed(tmp_path / "z.npz", small=np.arange(4), zeros=np.zeros(1 << 20))
    assert (tmp_path / "z.npz").stat().st_size < 50_000  # 8 MiB of zeros inside
    with pytest.raises(BadInputError, match=r"array 'zeros' holds 8,388,736 bytes \([\d,]+ stored\), "
                       "over the bound of 1,000,000"):
        read_table(tmp_path / "z.npz", max_member_bytes=1_000_000)
    assert read_table(tmp_path / "z.npz")[0]["zeros"].shape == (1 << 20,)
    rc, _, err = cli_main(capsys, "convert", tmp_path / "z.npz", "--to", "lmdb", "-o",
                          tmp_path / "o", "--max-member-size", "1MB")
    assert rc == 2 and "over the bound of 1,000,000" in err
    # a member whose npy header declares more than it holds: refused, nothing allocated for it
    header = {"descr": "<f8", "fortran_order": False, "shape": (1 << 40,)}
    with zipfile.ZipFile(tmp_path / "lie.npz", "w") as z, z.open("x.npy", "w") as fh:
        np.lib.format.write_array_header_1_0(fh, header)
        fh.write(b"\0" * 64)
    with pytest.raises(BadInputError, match="npy payload has 64 bytes, header says 8796093022208"):
        read_table(tmp_path / "lie.npz")


def test_parquet_columns_are_bounded_from_metadata_and_while_read(tmp_path):
    pq.write_table(pa.table({"a": np.arange(100_000)}), tmp_path / "a.parquet")
    with pytest.raises(BadInputError, match="column 'a' holds 800,000 bytes, over the bound of 100,000"):
        read_table(tmp_path / "a.parquet", max_member_bytes=100_000)
    pq.write_table(pa.table({"l": [[0] * 1000] * 1000}), tmp_path / "l.parquet")
    assert (tmp_path / "l.parquet").stat().st_size < 100_000
    with pytest.raises(BadInputError,
                       match=r"column 'l' holds [\d,]+ bytes or more, over the bound of 1,000,000"):
        read_table(tmp_path / "l.parquet", max_member_bytes=1_000_000)


def test_windows_without_features_is_a_config_error(tmp_path):
    pack_arrays({"a": np.arange(20.0)}, tmp_path / "s", to="lmdb", series=True)
    with pytest.raises(ConfigError, match="features: name at least one field") as e:
        Windows(tmp_path / "s", length=4, targets=["a"], features=[])
    assert e.value.option == "features"


def test_a_long_numeric_table_of_rows_points_to_series(tmp_path, capsys):
    src = tmp_path / "t.jsonl"
    src.write_text("".join(json.dumps({"a": k, "b": k / 2}) + "\n" for k in range(1000)))
    rc, out, _ = cli_main(capsys, "convert", src, "--to", "lmdb", "-o", tmp_path / "o")
    assert rc == 0
    assert "note: 1,000 rows of numbers stored one record each take" in out
    assert "with --series" in out and "--to hdf5" in out
    rc, out, _ = cli_main(capsys, "convert", src, "--to", "lmdb", "-o", tmp_path / "s",
                          "--series")
    assert rc == 0 and "note:" not in out
    assert len(feedpipe.open_dataset(tmp_path / "o")) == 1000
