"""Row -> record converters for the published formats of the real benchmarks and training sets.

Each converter maps one raw row (as published) to a plain-dict record of one of two schemas:

  math: {"id", "problem", "answer", "solution"} (+ "subject", "level" for MATH-500); "answer" is a
    LaTeX string (several answers of an OlympiadBench problem joined by ", ").
  code: {"id", "question", "starter_code", "fn_name", "tests", "private_tests_encoded",
    "time_limit_s", "memory_limit_mb"}; tests are {"input", "output", "kind"} with kind "stdio"
    or "call" (LiveCodeBench functional tests: one JSON argument per input line, JSON output).

Column names are configurable: every converter takes `fields`, a mapping from its canonical
names (the keys of its DEFAULT_FIELDS entry) to the columns of the user's file; `parse_fields`
reads it from the config's "column:canonical,..." string (config.task.fields). A converter
returns None for a row the task does not use (an image problem in OlympiadBench, an interactive
Codeforces problem); `load_records` counts and logs those.

LiveCodeBench's private tests are published as base64(zlib(pickle(json_string))). They are kept
encoded in the record (they can be hundreds of MB in total) and decoded where the code reward
runs, by `decode_lcb_tests`, which never unpickles: it walks the pickle opcodes with pickletools
and accepts a stream that consists of exactly one plain string, so no object can be constructed.
"""

from __future__ import annotations

import base64
import binascii
import json
import logging
import math
import pickletools
import zlib
from collections.abc import Callable, Mapping
from typing import Any

from ibpo_jax.data.files import DataFormatError, get_field, iter_rows

DEFAULT_FIELDS: dict[str, dict[str, str]] = {
    "math500": {"problem": "problem", "answer": "answer", "solution": "solution",
                "subject": "subject", "level": "level", "id": "unique_id"},
    "aime": {"problem": "problem", "answer": "answer", "solution": "solution", "id": "id"},
    "olympiadbench": {"problem": "question", "answer": "final_answer", "solution": "solution",
                      "id": "id"},
    "math_jsonl": {"prompt": "prompt", "answer": "answer", "solution": "solution", "id": "id"},
    "livecodebench": {"question": "question_content", "title": "question_title",
                      "starter_code": "starter_code", "public_tests": "public_test_cases",
                      "private_tests": "private_test_cases", "metadata": "metadata",
                      "id": "question_id"},
    "codeforces": {"title": "title", "description": "description",
                   "input_format": "input_format", "output_format": "output_format",
                   "note": "note", "examples": "examples", "tests": "official_tests",
                   "time_limit": "time_limit", "memory_limit": "memory_limit", "id": "id"},
}

_STRING_OPS = {"SHORT_BINUNICODE", "BINUNICODE", "BINUNICODE8", "UNICODE"}
_FRAMING_OPS = {"PROTO", "FRAME", "MEMOIZE", "BINPUT", "LONG_BINPUT", "PUT", "STOP"}
log = logging.getLogger(__name__)


def _columns(kind: str, fields: Mapping[str, str] | None) -> dict[str, str]:
    cols = dict(DEFAULT_FIELDS[kind])
    unknown = set(fields or {}) - set(cols)
    if unknown:
        raise ValueError(f"unknown field name(s) {sorted(unknown)} for {kind}; "
                         f"configurable: {sorted(cols)}")
    cols.update(fields or {})
    return cols


def parse_fields(spec: str, task: str) -> dict[str, str]:
    """The `fields` mapping {canonical: column} of task `task` (a CONVERTERS name) from the
    command-line form "column:canonical,..." (e.g. "question:prompt,solution:answer": the
    file's column `question` is the prompt). Raises ValueError naming the bad entry."""
    if not spec.strip():
        return {}
    if task not in CONVERTERS:
        raise ValueError(f"task {task!r} reads no files, so it has no columns to map")
    valid = sorted(DEFAULT_FIELDS[CONVERTERS[task][0]])
    fields: dict[str, str] = {}
    for entry in spec.split(","):
        column, sep, canonical = (part.strip() for part in entry.partition(":"))
        if not sep or not column or not canonical:
            raise ValueError(f"entry {entry.strip()!r} is not column:field")
        if canonical not in valid:
            raise ValueError(f"entry {entry.strip()!r}: {task} has no field {canonical!r}; "
                             f"fields: {', '.join(valid)}")
        if canonical in fields:
            raise ValueError(f"field {canonical!r} is mapped twice")
        fields[canonical] = column
    return fields


def _answer_text(value: Any) -> str:
    """A published answer (int, number or LaTeX string, maybe in $...$) as a LaTeX string."""
    text = str(value).strip()
    # One outer $...$ (or $$...$$) pair; "$a$ and $b$" has inner dollars and stays as is.
    for fence in ("$$", "$"):
        inner = text[len(fence):-len(fence)]
        if len(text) > 2 * len(fence) - 1 and text.startswith(fence) and text.endswith(fence) \
                and "$" not in inner:
            return inner.strip()
    return text


def _id(row, col, where) -> str:
    return str(get_field(row, col, where, types=(str, int), default=where.rsplit(":", 1)[-1]))


def math500(row: dict, where: str, cols: Mapping[str, str]) -> dict:
    return {
        "id": _id(row, cols["id"], where),
        "problem": get_field(row, cols["problem"], where, types=str),
        "answer": _answer_text(get_field(row, cols["answer"], where, types=(str, int, float))),
        "solution": get_field(row, cols["solution"], where, types=str, default=None),
        "subject": get_field(row, cols["subject"], where, types=str, default=None),
        "level": get_field(row, cols["level"], where, types=(int, str), default=None),
    }


def aime(row: dict, where: str, cols: Mapping[str, str]) -> dict:
    return {
        "id": _id(row, cols["id"], where),
        "problem": get_field(row, cols["problem"], where, types=str),
        "answer": _answer_text(get_field(row, cols["answer"], where, types=(str, int, float))),
        "solution": get_field(row, cols["solution"], where, types=str, default=None),
    }


def _is_answer(value: Any) -> bool:
    """A published answer: a string or a finite number (JSON's NaN / Infinity are not)."""
    if isinstance(value, bool):
        return False
    return isinstance(value, str | int) or (isinstance(value, float) and math.isfinite(value))


def olympiadbench(row: dict, where: str, cols: Mapping[str, str]) -> dict | None:
    """English, text-only math problems; rows of other languages, subjects or with images: None."""
    if row.get("language", "English") != "English" or row.get("subject", "Math") != "Math":
        return None
    if any(row.get(f"image_{k}") for k in range(1, 6)):
        return None
    answers = get_field(row, cols["answer"], where, types=(list, str))
    answers = [answers] if isinstance(answers, str) else answers
    if not answers or not all(_is_answer(a) for a in answers):
        raise DataFormatError(f"{where}: field {cols['answer']!r} should be a non-empty list of "
                              "answer strings or finite numbers")
    solution = get_field(row, cols["solution"], where, types=(list, str), default=None)
    return {
        "id": _id(row, cols["id"], where),
        "problem": get_field(row, cols["problem"], where, types=str),
        "answer": ", ".join(_answer_text(a) for a in answers),
        "solution": "\n\n".join(solution) if isinstance(solution, list) else solution,
    }


def math_jsonl(row: dict, where: str, cols: Mapping[str, str]) -> dict:
    """A generic RL training prompt file: prompt (the problem) and answer."""
    return {
        "id": _id(row, cols["id"], where),
        "problem": get_field(row, cols["prompt"], where, types=str),
        "answer": _answer_text(get_field(row, cols["answer"], where, types=(str, int, float))),
        "solution": get_field(row, cols["solution"], where, types=str, default=None),
    }


def _unpickle_plain_string(data: bytes) -> str:
    """The string held by a pickle stream that contains exactly one string and nothing else."""
    strings = []
    for opcode, arg, _ in pickletools.genops(data):
        if opcode.name in _STRING_OPS:
            strings.append(arg)
        elif opcode.name not in _FRAMING_OPS:
            raise ValueError(f"pickle opcode {opcode.name} would build a non-string object")
    if len(strings) != 1:
        raise ValueError(f"pickle stream holds {len(strings)} strings, expected exactly one")
    return strings[0]


def _test_case(case: Any) -> dict:
    if not isinstance(case, dict) or not {"input", "output"} <= set(case):
        raise ValueError("each test case must be an object with 'input' and 'output'")
    kind = "call" if case.get("testtype") == "functional" else "stdio"
    return {"input": str(case["input"]), "output": str(case["output"]), "kind": kind}


def decode_lcb_tests(encoded: str) -> list[dict]:
    """LiveCodeBench test cases from their published encoding (plain JSON, or the compressed
    base64/zlib/pickled-JSON string of private_test_cases); raises ValueError when malformed."""
    text = encoded.strip()
    if not text.startswith("["):
        try:
            raw = zlib.decompress(base64.b64decode(text.encode("ascii"), validate=True))
        except (binascii.Error, zlib.error, UnicodeEncodeError) as e:
            raise ValueError(f"not base64(zlib(...)) data: {e}") from None
        text = _unpickle_plain_string(raw)
    try:
        cases = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"test cases are not valid JSON: {e.msg}") from None
    if not isinstance(cases, list):
        raise ValueError("test cases must be a JSON list")
    return [_test_case(c) for c in cases]


def livecodebench(row: dict, where: str, cols: Mapping[str, str]) -> dict:
    """code_generation_lite rows: public tests decoded now, private ones checked, kept encoded."""
    public = get_field(row, cols["public_tests"], where, types=str)
    private = get_field(row, cols["private_tests"], where, types=str)
    metadata = get_field(row, cols["metadata"], where, types=str, default="{}")
    try:
        tests = decode_lcb_tests(public)
    except ValueError as e:
        raise DataFormatError(f"{where}: field {cols['public_tests']!r}: {e}") from None
    try:
        fn_name = json.loads(metadata).get("func_name")
    except (ValueError, AttributeError):
        raise DataFormatError(
            f"{where}: field {cols['metadata']!r} should be a JSON object") from None
    try:  # cheap integrity check of the private tests; the full decode happens in the reward
        head = private.strip()
        if not head.startswith("["):
            blob = base64.b64decode(head.encode("ascii"), validate=True)
            zlib.decompressobj().decompress(blob[:4096])
    except (binascii.Error, zlib.error, UnicodeEncodeError) as e:
        raise DataFormatError(
            f"{where}: field {cols['private_tests']!r}: not in the published encoding ({e})") \
            from None
    if any(t["kind"] == "call" for t in tests) and not fn_name:
        raise DataFormatError(
            f"{where}: field {cols['metadata']!r} lacks func_name for functional tests")
    return {
        "id": _id(row, cols["id"], where),
        "title": get_field(row, cols["title"], where, types=str, default=""),
        "question": get_field(row, cols["question"], where, types=str),
        "starter_code": get_field(row, cols["starter_code"], where, types=str, default=""),
        "fn_name": fn_name,
        "tests": tests,
        "private_tests_encoded": private,
        "time_limit_s": None,
        "memory_limit_mb": None,
    }


def _cf_tests(value: Any, where: str, name: str) -> list[dict]:
    if not isinstance(value, list):
        raise DataFormatError(f"{where}: field {name!r} should be a list of input/output tests")
    try:
        return [_test_case(t) for t in value]
    except ValueError as e:
        raise DataFormatError(f"{where}: field {name!r}: {e}") from None


def codeforces(row: dict, where: str, cols: Mapping[str, str]) -> dict | None:
    """open-r1/codeforces rows; interactive, file-I/O and test-less problems: None."""
    if row.get("interaction_format") or row.get("input_mode", "stdio") != "stdio":
        return None
    tests = []
    for key in ("examples", "tests"):
        raw = get_field(row, cols[key], where, types=list, default=[])
        for t in _cf_tests(raw, where, cols[key]):
            if t not in tests:
                tests.append(t)
    if not tests:
        return None
    title = get_field(row, cols["title"], where, types=str, default="")
    parts = [get_field(row, cols["description"], where, types=str)]
    for key, header in (("input_format", "Input"), ("output_format", "Output"),
                        ("note", "Note")):
        text = get_field(row, cols[key], where, types=str, default="")
        if text:
            parts.append(f"{header}\n{text}")
    for t in _cf_tests(get_field(row, cols["examples"], where, types=list, default=[]),
                       where, cols["examples"]):
        parts.append(f"Example input\n{t['input']}\nExample output\n{t['output']}")
    return {
        "id": _id(row, cols["id"], where),
        "title": title,
        "question": (f"{title}\n\n" if title else "") + "\n\n".join(parts),
        "starter_code": "",
        "fn_name": None,
        "tests": tests,
        "private_tests_encoded": None,
        "time_limit_s": get_field(row, cols["time_limit"], where, types=(int, float),
                                  default=None),
        "memory_limit_mb": get_field(row, cols["memory_limit"], where, types=(int, float),
                                     default=None),
    }


CONVERTERS: dict[str, tuple[str, Callable[..., dict | None]]] = {
    "math500": ("math500", math500),
    "aime24": ("aime", aime),
    "aime25": ("aime", aime),
    "olympiadbench": ("olympiadbench", olympiadbench),
    "math_jsonl": ("math_jsonl", math_jsonl),
    "livecodebench": ("livecodebench", livecodebench),
    "codeforces": ("codeforces", codeforces),
}


def load_records(kind: str, path: str, *, fields: Mapping[str, str] | None = None) -> list[dict]:
    """All records of `path` in the format `kind` (a key of CONVERTERS), validated.

    Raises DataFormatError naming the file, line and field of the first bad row.
    """
    default_kind, convert = CONVERTERS[kind]
    cols = _columns(default_kind, fields)
    records, skipped = [], 0
    for where, row in iter_rows(path):
        record = convert(row, where, cols)
        if record is None:
            skipped += 1
        else:
            records.append(record)
    if skipped:
        log.info("%s: skipped %d rows that %s does not use", path, skipped, kind)
    if not records:
        raise DataFormatError(f"{path}: no usable {kind} records")
    return records
