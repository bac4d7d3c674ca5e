"""Rows of local data files (jsonl, json, parquet), with errors naming file, line and field.

A `path` may be a file, a directory (every *.jsonl, *.json and *.parquet file in it, sorted by
name, e.g. the shards of a Hugging Face parquet export) or a glob pattern. Rows come back as
plain dicts together with a location string "FILE:LINE" (jsonl: 1-based line; json: 1-based
element of the top-level array; parquet: 1-based row) used in every error message.
"""

from __future__ import annotations

import glob
import json
import math
import os
from collections.abc import Iterator, Mapping
from typing import Any

SUFFIXES = (".jsonl", ".json", ".parquet")
_MISSING = object()


class DataFormatError(ValueError):
    """A data file is missing, has a malformed row, or a row lacks a field (message says where)."""


def expand_paths(path: str | os.PathLike) -> list[str]:
    """The data files `path` stands for: itself, the data files in a directory, or a glob."""
    path = os.fspath(path)
    if os.path.isdir(path):
        files = sorted(os.path.join(path, f) for f in os.listdir(path) if f.endswith(SUFFIXES))
    elif os.path.isfile(path):
        files = [path]
    else:
        files = sorted(glob.glob(path))
    if not files:
        raise DataFormatError(f"{path}: no such file, or no {'/'.join(SUFFIXES)} files there")
    for f in files:
        if not f.endswith(SUFFIXES):
            raise DataFormatError(f"{f}: unsupported file type; expected one of {SUFFIXES}")
    return files


def _decode(raw: bytes, where: str) -> str:
    """UTF-8 text of `raw`; a bad byte is an error at `where` (a file's lines stop mattering
    once a decode error escapes the row loop, so every row decodes itself)."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise DataFormatError(f"{where}: invalid UTF-8 (byte 0x{raw[e.start]:02x} at column "
                              f"{e.start + 1})") from None


def _loads(text: str, where: str) -> Any:
    """json.loads with every failure, nesting too deep for the parser included, named `where`."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise DataFormatError(f"{where}: malformed JSON ({e.msg} at column {e.colno})") \
            from None
    except RecursionError:  # e.g. 100k nested "[": the C scanner recurses per level
        raise DataFormatError(f"{where}: malformed JSON (nested too deeply)") from None


def _jsonl_rows(path: str) -> Iterator[tuple[str, Any]]:
    with open(path, "rb") as f:
        for line_no, raw in enumerate(f, start=1):
            where = f"{path}:{line_no}"
            line = _decode(raw, where)
            if line.strip():
                yield where, _loads(line, where)


def _json_rows(path: str) -> Iterator[tuple[str, Any]]:
    with open(path, "rb") as f:
        raw = f.read()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:  # name the line of the bad byte
        line_no = raw.count(b"\n", 0, e.start) + 1
        column = e.start - (raw.rfind(b"\n", 0, e.start) + 1) + 1
        raise DataFormatError(f"{path}:{line_no}: invalid UTF-8 (byte 0x{raw[e.start]:02x} at "
                              f"column {column})") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise DataFormatError(f"{path}:{e.lineno}: malformed JSON ({e.msg})") from None
    except RecursionError:
        raise DataFormatError(f"{path}:1: malformed JSON (nested too deeply)") from None
    if not isinstance(data, list):
        raise DataFormatError(f"{path}: expected a JSON array of records at the top level")
    for i, row in enumerate(data, start=1):
        yield f"{path}:{i}", row


def _parquet_rows(path: str) -> Iterator[tuple[str, Any]]:
    try:
        import pyarrow.parquet as pq
    except ImportError:  # pragma: no cover - pyarrow ships with the package requirements
        raise DataFormatError(f"{path}: reading parquet needs `pip install pyarrow`") from None
    row_no = 0
    for batch in pq.ParquetFile(path).iter_batches(batch_size=256):
        for row in batch.to_pylist():
            row_no += 1
            yield f"{path}:{row_no}", row


def iter_rows(path: str | os.PathLike) -> Iterator[tuple[str, dict]]:
    """Yields (location, row dict) for every record of every file `path` stands for."""
    for file in expand_paths(path):
        reader = (_jsonl_rows if file.endswith(".jsonl") else
                  _json_rows if file.endswith(".json") else _parquet_rows)
        for where, row in reader(file):
            if not isinstance(row, dict):
                raise DataFormatError(f"{where}: expected a JSON object, got {type(row).__name__}")
            yield where, row


def get_field(row: Mapping[str, Any], name: str, where: str, *, types: type | tuple[type, ...],
              default: Any = _MISSING) -> Any:
    """row[name] checked against `types`; a missing or null field returns `default` if given.

    Raises DataFormatError "FILE:LINE: field 'name' ..." otherwise, and for a non-finite float
    (JSON readers accept NaN / Infinity; no field of a record means anything by them).
    """
    value = row.get(name, None)
    if value is None:
        if default is not _MISSING:
            return default
        present = "is null" if name in row else "is missing"
        raise DataFormatError(f"{where}: field {name!r} {present} (row has: {sorted(row)})")
    if isinstance(value, float) and not math.isfinite(value):  # JSON's NaN / Infinity, 1e400
        raise DataFormatError(f"{where}: field {name!r} is {value}, not a finite number")
    allowed = types if isinstance(types, tuple) else (types,)
    # bool is an int subclass: never accept it where a number is meant
    if not isinstance(value, allowed) or (isinstance(value, bool) and bool not in allowed):
        names = "/".join(t.__name__ for t in allowed)
        raise DataFormatError(
            f"{where}: field {name!r} should be {names}, got {type(value).__name__}")
    return value
