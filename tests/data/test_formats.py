"""Real-format fixtures load into the documented records; bad rows name file, line and field;
LiveCodeBench's private tests decode without ever unpickling."""

import base64
import json
import os
import pickle
import zlib

import pytest

from ibpo_jax.data import formats
from ibpo_jax.data.files import DataFormatError, expand_paths

FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures")


def fixture(name):
    return os.path.join(FIXTURES, name)


def test_math500():
    records = formats.load_records("math500", fixture("math500.jsonl"))
    assert [r["answer"] for r in records] == ["\\frac{5}{6}", "3", "(1,2]"]
    assert records[0]["id"] == "test/prealgebra/1.json"
    assert (records[1]["subject"], records[1]["level"]) == ("Algebra", 2)
    assert records[1]["solution"] == "Since $x>0$, $x = \\boxed{3}$."


def test_aime_parquet_and_renamed_jsonl_columns():
    aime24 = formats.load_records("aime24", fixture("aime24.parquet"))
    assert [(r["id"], r["answer"]) for r in aime24] == [("60", "24"), ("61", "9")]
    aime25 = formats.load_records("aime25", fixture("aime25.jsonl"), fields={"problem": "question"})
    assert [(r["id"], r["answer"]) for r in aime25] == [("1", "1001"), ("2", "210")]
    assert aime25[0]["problem"] == "What is $7 \\cdot 11 \\cdot 13$?"
    with pytest.raises(ValueError, match=r"unknown field name\(s\) \['question'\]"):
        formats.load_records("aime25", fixture("aime25.jsonl"), fields={"question": "q"})


def test_olympiadbench_keeps_english_text_only_and_joins_multiple_answers():
    records = formats.load_records("olympiadbench", fixture("olympiadbench.json"))
    assert [r["id"] for r in records] == ["1606", "1607"]  # image and Chinese rows dropped
    assert [r["answer"] for r in records] == ["1, 2", "23"]  # $...$ stripped


def test_livecodebench_rows_and_private_tests():
    stdin, functional = formats.load_records("livecodebench", fixture("livecodebench.jsonl"))
    assert stdin["tests"] == [{"input": "3\n1 2 3\n", "output": "6\n", "kind": "stdio"}]
    assert stdin["fn_name"] is None and stdin["starter_code"] == ""
    assert formats.decode_lcb_tests(stdin["private_tests_encoded"]) == [
        {"input": "1\n5\n", "output": "5\n", "kind": "stdio"},
        {"input": "4\n-1 -2 10 0\n", "output": "7\n", "kind": "stdio"}]
    assert functional["fn_name"] == "maxPairSum"
    assert functional["starter_code"].startswith("class Solution:")
    assert formats.decode_lcb_tests(functional["private_tests_encoded"])[1] == {
        "input": "[-4, -1, -7]\n10", "output": "5", "kind": "call"}


class _Evil:
    """Unpickling this would create a file; decode must refuse before anything runs."""

    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


def test_lcb_decode_never_unpickles_objects(tmp_path):
    target = tmp_path / "pwned"
    for payload in (_Evil(str(target)), ["a list, not a string"], ("x", "y")):
        blob = base64.b64encode(zlib.compress(pickle.dumps(payload))).decode()
        with pytest.raises(ValueError, match="pickle"):
            formats.decode_lcb_tests(blob)
    assert not target.exists()
    with pytest.raises(ValueError, match="base64"):
        formats.decode_lcb_tests("not base64 at all!")
    blob = base64.b64encode(zlib.compress(pickle.dumps('{"input": 1}'))).decode()
    with pytest.raises(ValueError, match="JSON list"):
        formats.decode_lcb_tests(blob)


def test_codeforces_merges_tests_and_drops_interactive():
    (record,) = formats.load_records("codeforces", fixture("codeforces.parquet"))
    assert record["id"] == "9999/A"
    assert [t["input"] for t in record["tests"]] == [
        "1 2\n", "-5 5\n", "1000000000 1000000000\n"]  # the example is also test 1: kept once
    assert (record["time_limit_s"], record["memory_limit_mb"]) == (1.0, 256.0)
    assert "Example input\n1 2\n" in record["question"] and "Output\nPrint a+b." in \
        record["question"]


def test_math_jsonl():
    records = formats.load_records("math_jsonl", fixture("math_train.jsonl"))
    assert [(r["problem"], r["answer"]) for r in records][1] == (
        "Simplify $\\frac{6}{8}$.", "\\frac{3}{4}")


def _write(path, lines):
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return str(path)


def test_errors_name_file_line_and_field(tmp_path):
    good = json.dumps({"prompt": "p", "answer": "1"})
    path = _write(tmp_path / "missing.jsonl", [good, json.dumps({"prompt": "p"})])
    with pytest.raises(DataFormatError, match=r"missing\.jsonl:2: field 'answer' is missing"):
        formats.load_records("math_jsonl", path)
    path = _write(tmp_path / "null.jsonl", [good, good, json.dumps({"prompt": None, "answer": 1})])
    with pytest.raises(DataFormatError, match=r"null\.jsonl:3: field 'prompt' is null"):
        formats.load_records("math_jsonl", path)
    path = _write(tmp_path / "broken.jsonl", [good, "", '{"prompt": "p", "answer": '])
    with pytest.raises(DataFormatError, match=r"broken\.jsonl:3: malformed JSON"):
        formats.load_records("math_jsonl", path)
    path = _write(tmp_path / "type.jsonl", [json.dumps({"prompt": ["p"], "answer": "1"})])
    with pytest.raises(DataFormatError, match=r"type\.jsonl:1: field 'prompt' should be str"):
        formats.load_records("math_jsonl", path)
    path = _write(tmp_path / "bool.jsonl", [json.dumps({"prompt": "p", "answer": True})])
    with pytest.raises(DataFormatError, match=r"bool\.jsonl:1: field 'answer' should be"):
        formats.load_records("math_jsonl", path)
    row = json.loads(open(fixture("livecodebench.jsonl")).readline())
    row["private_test_cases"] = "%%%"
    path = _write(tmp_path / "lcb.jsonl", [json.dumps(row)])
    with pytest.raises(DataFormatError, match=r"lcb\.jsonl:1: field 'private_test_cases'"):
        formats.load_records("livecodebench", path)
    with pytest.raises(DataFormatError, match="no such file"):
        formats.load_records("math500", str(tmp_path / "nope.jsonl"))
    only_chinese = tmp_path / "zh.json"
    only_chinese.write_text(json.dumps([json.load(open(fixture("olympiadbench.json")))[3]]))
    with pytest.raises(DataFormatError, match="no usable olympiadbench records"):
        formats.load_records("olympiadbench", str(only_chinese))


def test_paths_can_be_directories_and_globs(tmp_path):
    for i in range(2):
        _write(tmp_path / f"part-{i}.jsonl", [json.dumps({"prompt": f"p{i}", "answer": i})])
    (tmp_path / "README.md").write_text("ignored")
    assert [os.path.basename(p) for p in expand_paths(tmp_path)] == [
        "part-0.jsonl", "part-1.jsonl"]
    records = formats.load_records("math_jsonl", str(tmp_path / "part-*.jsonl"))
    assert [r["problem"] for r in records] == ["p0", "p1"]


@pytest.mark.parametrize("raw, want", [
    ("$x^2$", "x^2"), ("$$\\frac{1}{2}$$", "\\frac{1}{2}"), (12, "12"), (" 3 ", "3"),
    ("$a$ and $b$", "$a$ and $b$"),  # inner dollars: not one math span, kept whole
])
def test_published_answers_lose_one_outer_math_fence_only(raw, want):
    assert formats._answer_text(raw) == want


def test_undecodable_and_too_deeply_nested_rows_name_file_and_line(tmp_path):
    """A bad byte or a nesting the parser cannot follow is a bad row like any other: the error
    names FILE:LINE (not a bare UnicodeDecodeError / RecursionError from inside the reader)."""
    good = json.dumps({"prompt": "p", "answer": "1"}).encode()
    path = tmp_path / "latin1.jsonl"
    path.write_bytes(good + b"\n" + good + b"\n" + b'{"prompt": "caf\xe9", "answer": "1"}\n')
    with pytest.raises(DataFormatError, match=r"latin1\.jsonl:3: invalid UTF-8 \(byte 0xe9 at "
                                              r"column 16\)"):
        formats.load_records("math_jsonl", str(path))
    path = tmp_path / "latin1.json"
    path.write_bytes(b'[\n' + good + b',\n{"prompt": "\xff", "answer": "1"}\n]')
    with pytest.raises(DataFormatError, match=r"latin1\.json:3: invalid UTF-8 \(byte 0xff"):
        formats.load_records("math_jsonl", str(path))
    path = _write(tmp_path / "deep.jsonl", [good.decode(), "[" * 100_000])
    with pytest.raises(DataFormatError, match=r"deep\.jsonl:2: malformed JSON \(nested too deeply"):
        formats.load_records("math_jsonl", path)
    deep = '{"prompt": "p", "answer": ' + "[" * 100_000 + "]" * 100_000 + "}"
    path = _write(tmp_path / "deep_closed.jsonl", [deep])  # well-formed, still too deep
    with pytest.raises(DataFormatError, match=r"deep_closed\.jsonl:1: malformed JSON"):
        formats.load_records("math_jsonl", path)
    path = tmp_path / "deep.json"
    path.write_text("[" * 100_000)
    with pytest.raises(DataFormatError, match=r"deep\.json:1: malformed JSON \(nested too deeply"):
        formats.load_records("math_jsonl", str(path))


@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity", "1e400"])
def test_non_finite_answers_are_rejected(tmp_path, literal):
    """Python's json accepts NaN / Infinity (and 1e400 overflows to inf); an answer "nan" or
    "inf" would silently become the reference the reward compares against."""
    path = _write(tmp_path / "nan.jsonl", ['{"prompt": "p", "answer": 1}',
                                           '{"prompt": "p", "answer": ' + literal + "}"])
    with pytest.raises(DataFormatError, match=r"nan\.jsonl:2: field 'answer' is -?(nan|inf), "
                                              r"not a finite number"):
        formats.load_records("math_jsonl", path)
    row = json.load(open(fixture("olympiadbench.json")))[0]
    text = json.dumps([row]).replace(json.dumps(row["final_answer"]), f"[1, {literal}]")
    (tmp_path / "ob.json").write_text(text)
    with pytest.raises(DataFormatError, match=r"ob\.json:1: field 'final_answer' should be a "
                                              r"non-empty list of answer strings or finite"):
        formats.load_records("olympiadbench", str(tmp_path / "ob.json"))
