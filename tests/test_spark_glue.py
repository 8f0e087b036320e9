"""rhino.spark's per-record glue (``runtime/glue.py``) against independent pandas oracles.

- ``group_rows``: ``DataFrame.groupby(keys, sort=False)`` gives the groups in order of first
  appearance with their rows in input order; each group must be one contiguous slice of the
  returned frame, its key tuple the group's name, its routing bytes ``encode_key(key)`` (what routing
  hashes, and the routing part of every state entry of the key).
- ``concat_frames``: ``pd.concat(frames, ignore_index=True)`` of the non-empty frames, values
  and dtypes alike (Spark converts each output frame on its own, so the gathered frame must
  not change a column's type).

Fast: no Spark session, no worker. ``rhino-bench spark glue`` (bench/rhino_bench/spark/glue.py) times the same functions.
"""

from __future__ import annotations

import datetime as dt

import numpy as np
import pytest

pd = pytest.importorskip("pandas")
pa = pytest.importorskip("pyarrow")

from rhino.spark.runtime.glue import concat_frames, group_rows  # noqa: E402
from rhino.spark.state.encoding import encode_key  # noqa: E402


# ---- group_rows ---------------------------------------------------------------------------------


def _py(v):
    return v.item() if isinstance(v, np.generic) else v


def check_groups(pdf: pd.DataFrame, key_columns: list[str], table: pa.Table | None = None) -> None:
    """group_rows(table, pdf, keys) against pandas' groupby; raises AssertionError on a mismatch."""
    table = pa.Table.from_pandas(pdf, preserve_index=False) if table is None else table
    spdf, groups = group_rows(table, pdf, key_columns)
    assert len(spdf) == len(pdf)
    assert list(spdf.columns) == list(pdf.columns)
    assert isinstance(spdf.index, pd.RangeIndex) and spdf.index.start == 0
    oracle = list(pdf.groupby(key_columns, sort=False, dropna=False))
    assert len(groups) == len(oracle), f"{len(groups)} groups, pandas has {len(oracle)}"
    end = 0
    for (ek, kt, a, b), (name, rows) in zip(groups, oracle):
        name = name if isinstance(name, tuple) else (name,)
        assert a == end and b > a, f"group {kt}: rows [{a}, {b}) do not follow the previous group's end {end}"
        end = b
        assert kt == tuple(_py(v) for v in name), f"key tuple {kt!r}, pandas' group {name!r}"
        assert all(not isinstance(v, np.generic) for v in kt), f"numpy scalars in the key tuple {kt!r}"
        assert ek == encode_key(kt), f"routing bytes of {kt!r}"
        pd.testing.assert_frame_equal(spdf.iloc[a:b].reset_index(drop=True), rows.reset_index(drop=True))
    assert end == len(pdf)
    assert len({g[0] for g in groups}) == len(groups), "two groups share routing bytes"


def _mixed(n: int, nkeys: int, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    k = rng.integers(-nkeys, nkeys, n)
    return pd.DataFrame({
        "k": k.astype(np.int64),
        "i8": rng.integers(-100, 100, n).astype(np.int8),
        "f": rng.normal(size=n),
        "s": [f"s{x}é" for x in rng.integers(0, 50, n)],
        "b": [bytes([x]) * 3 for x in rng.integers(0, 256, n)],
        "flag": rng.integers(0, 2, n).astype(bool),
        "ts": pd.to_datetime(rng.integers(0, 10**12, n), unit="ms", utc=True),
        "seq": np.arange(n),  # the row's input position: order within a key must be kept
    })


def test_group_rows_int_key_mixed_dtypes() -> None:
    pdf = _mixed(1200, 100)
    check_groups(pdf, ["k"])


def test_group_rows_keeps_input_order_within_a_key() -> None:
    pdf = _mixed(500, 7, seed=3)
    spdf, groups = group_rows(pa.Table.from_pandas(pdf, preserve_index=False), pdf, ["k"])
    for _, _, a, b in groups:
        seq = spdf["seq"].to_numpy()[a:b]
        assert (np.diff(seq) > 0).all()
    # first appearance order of the keys
    assert [g[1][0] for g in groups] == list(dict.fromkeys(pdf["k"].tolist()))


@pytest.mark.parametrize("itype", [pa.int8(), pa.int32(), pa.int64(), pa.uint16()])
def test_group_rows_int_key_types(itype) -> None:
    """The vectorized int path: its bytes must be encode_key's for every Arrow int width."""
    rng = np.random.default_rng(1)
    vals = rng.integers(0, 100, 400)
    pdf = pd.DataFrame({"k": vals, "v": np.arange(400)})
    table = pa.table({"k": pa.array(vals, itype), "v": pa.array(np.arange(400))})
    check_groups(pdf, ["k"], table)


def test_group_rows_string_key() -> None:
    pdf = _mixed(800, 40, seed=2)
    check_groups(pdf, ["s"])


def test_group_rows_multi_column_key() -> None:
    pdf = _mixed(400, 4, seed=4)
    check_groups(pdf, ["k", "s"])
    check_groups(pdf, ["s", "flag", "k"])


def test_group_rows_timestamp_key() -> None:
    rng = np.random.default_rng(5)
    ts = pd.to_datetime(rng.integers(0, 20, 600) * 1000, unit="ms", utc=True)
    pdf = pd.DataFrame({"window": ts, "k": rng.integers(0, 3, 600), "v": rng.normal(size=600)})
    check_groups(pdf, ["window"])
    check_groups(pdf, ["window", "k"])
    spdf, groups = group_rows(pa.Table.from_pandas(pdf, preserve_index=False), pdf, ["window"])
    assert all(isinstance(kt[0], pd.Timestamp) for _, kt, _, _ in groups)


def test_group_rows_one_key_and_one_row() -> None:
    check_groups(pd.DataFrame({"k": [7] * 50, "v": np.arange(50.0)}), ["k"])
    check_groups(pd.DataFrame({"k": [7], "v": ["x"]}), ["k"])


def test_group_rows_large_and_negative_ints() -> None:
    vals = [-(1 << 63), (1 << 63) - 1, -1, 0, 1, (1 << 53) + 1, -1, (1 << 63) - 1]
    pdf = pd.DataFrame({"k": np.array(vals, dtype=np.int64), "v": np.arange(len(vals))})
    check_groups(pdf, ["k"])


def test_check_groups_can_fail() -> None:
    """The oracle comparison is not vacuous: a wrong grouping is caught."""
    import rhino.spark.runtime.glue as glue

    pdf = _mixed(300, 10, seed=6)
    real = glue.group_rows

    def reversed_rows(table, frame, keys):
        spdf, groups = real(table, frame, keys)
        ek, kt, a, b = groups[0]
        if b - a > 1:  # the first key's rows in reverse order
            spdf = pd.concat([spdf.iloc[a:b].iloc[::-1], spdf.iloc[b:]], ignore_index=True)
        return spdf, groups

    def merged_first_two(table, frame, keys):
        spdf, groups = real(table, frame, keys)
        (e0, k0, a0, _), (_, _, _, b1) = groups[0], groups[1]
        return spdf, [(e0, k0, a0, b1)] + groups[2:]

    for broken in (reversed_rows, merged_first_two):
        glue_group = globals()["group_rows"]
        try:
            globals()["group_rows"] = broken
            with pytest.raises(AssertionError):
                check_groups(pdf, ["k"])
        finally:
            globals()["group_rows"] = glue_group


# ---- concat_frames ------------------------------------------------------------------------------


def oracle_concat(frames: list) -> pd.DataFrame:
    frames = [f for f in frames if f is not None and len(f)]
    if not frames:
        return pd.DataFrame()
    return pd.concat(frames, ignore_index=True)


def check_concat(frames: list) -> pd.DataFrame:
    got = concat_frames(frames)
    want = oracle_concat(frames)
    pd.testing.assert_frame_equal(got, want)
    return got


def _int_frame(rng, n: int, key: int) -> pd.DataFrame:
    return pd.DataFrame({"bidder": np.full(n, key, dtype=np.int64), "bid_count": rng.integers(1, 9, n),
                         "session_start": rng.integers(0, 10**12, n), "session_end": rng.integers(0, 10**12, n)})


def test_concat_many_int_frames() -> None:
    """Q11's shape: thousands of one-row all-int64 frames (the stacked 2-D path)."""
    rng = np.random.default_rng(0)
    frames = [_int_frame(rng, int(rng.integers(1, 3)), k) for k in range(800)]
    out = check_concat(frames)
    assert len(out) == sum(map(len, frames))


def test_concat_strings() -> None:
    """Q8's shape: an object (string) column among int64 ones."""
    rng = np.random.default_rng(1)
    frames = [pd.DataFrame({"person_id": np.full(n, k, dtype=np.int64), "name": [f"name {k} é"] * n,
                            "reserve": rng.integers(0, 10**6, n), "window_start": np.full(n, 10_000)})
              for k, n in enumerate(rng.integers(1, 6, 300))]
    check_concat(frames)


def test_concat_single_frame_and_non_range_index() -> None:
    f = pd.DataFrame({"a": [1, 2, 3], "s": ["x", "y", "z"]}, index=[10, 5, 7])
    out = check_concat([f])
    assert list(out.index) == [0, 1, 2]
    # the index of many frames, too
    check_concat([f, f.iloc[1:], pd.DataFrame({"a": [9], "s": ["w"]}, index=[42])])


def test_concat_empty_frames_and_none() -> None:
    rng = np.random.default_rng(2)
    a, b = _int_frame(rng, 2, 1), _int_frame(rng, 3, 2)
    empty_same = a.iloc[:0]
    check_concat([empty_same, a, None, pd.DataFrame(), b, empty_same])
    out = concat_frames([])
    assert isinstance(out, pd.DataFrame) and len(out) == 0
    assert len(concat_frames([None, pd.DataFrame(), empty_same])) == 0


def test_concat_different_columns() -> None:
    f1 = pd.DataFrame({"a": [1, 2], "b": [1.5, 2.5]})
    f2 = pd.DataFrame({"b": [3.5], "a": [3]})  # same columns, another order
    f3 = pd.DataFrame({"a": [4], "c": ["only here"]})  # another column set
    check_concat([f1, f2])
    check_concat([f1, f3, f2])


def test_concat_float_frames() -> None:
    rng = np.random.default_rng(3)
    frames = [pd.DataFrame({"x": rng.normal(size=n), "y": rng.normal(size=n)}) for n in range(1, 40)]
    check_concat(frames)


def test_concat_naive_timestamps_with_ints() -> None:
    rng = np.random.default_rng(4)
    frames = [pd.DataFrame({"k": np.full(n, i, dtype=np.int64),
                            "ts": pd.to_datetime(rng.integers(0, 10**12, n), unit="ms")})
              for i, n in enumerate(rng.integers(1, 4, 50))]
    check_concat(frames)


def test_concat_bool_columns() -> None:
    frames = [pd.DataFrame({"a": [True, False], "b": [False, False]}), pd.DataFrame({"a": [True], "b": [True]})]
    check_concat(frames)


# Divergences an earlier concat_frames had from pd.concat (it stacked 2-D blocks of frames with
# mixed numeric columns: int64 came out float64, losing bits above 2**53); fixed, and kept.


def test_concat_int_and_float_columns_keep_their_dtypes() -> None:
    big = (1 << 53) + 1
    frames = [pd.DataFrame({"id": np.array([big, big + 2], dtype=np.int64), "score": [0.5, 1.5]}),
              pd.DataFrame({"id": np.array([7], dtype=np.int64), "score": [2.5]})]
    out = check_concat(frames)
    assert out["id"].tolist() == [big, big + 2, 7]


@pytest.mark.parametrize("narrow,wide", [(np.int32, np.int64), (np.float32, np.float64), (np.int16, np.float64)])
def test_concat_numeric_widths_keep_their_dtypes(narrow, wide) -> None:
    frames = [pd.DataFrame({"a": np.array([1, 2], dtype=narrow), "b": np.array([3, 4], dtype=wide)}),
              pd.DataFrame({"a": np.array([5], dtype=narrow), "b": np.array([6], dtype=wide)})]
    check_concat(frames)


def test_concat_bool_and_int_columns() -> None:
    check_concat([pd.DataFrame({"n": [1, 2], "ok": [True, False]}), pd.DataFrame({"n": [3], "ok": [True]})])


def test_concat_tz_aware_timestamps() -> None:
    rng = np.random.default_rng(5)
    frames = [pd.DataFrame({"k": np.full(n, i, dtype=np.int64),
                            "ts": pd.to_datetime(rng.integers(0, 10**12, n), unit="ms", utc=True)})
              for i, n in enumerate(rng.integers(1, 4, 20))]
    check_concat(frames)


def test_concat_only_tz_aware_timestamps() -> None:
    """Every column one extension dtype: to_numpy() gives object blocks, which must not become object columns."""
    ts = pd.to_datetime([0, 10**9, 2 * 10**9], unit="ms", utc=True)
    frames = [pd.DataFrame({"start": ts[i:i + 1], "end": ts[i:i + 1]}) for i in range(3)]
    check_concat(frames)


def test_check_concat_can_fail() -> None:
    """The oracle comparison is not vacuous: a dropped row or a changed dtype is caught."""
    rng = np.random.default_rng(6)
    frames = [_int_frame(rng, 2, k) for k in range(5)]
    got = concat_frames(frames)
    with pytest.raises(AssertionError):
        pd.testing.assert_frame_equal(got.iloc[1:].reset_index(drop=True), oracle_concat(frames))
    with pytest.raises(AssertionError):
        pd.testing.assert_frame_equal(got.astype({"bid_count": np.float64}), oracle_concat(frames))


def test_concat_dates_objects() -> None:
    """Python date objects (an object column) gathered as they are."""
    frames = [pd.DataFrame({"d": [dt.date(2020, 1, i)], "n": [i]}) for i in range(1, 10)]
    check_concat(frames)
