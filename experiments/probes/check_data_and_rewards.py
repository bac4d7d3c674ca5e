"""End-to-end check of tasks, data and rewards (the "done means" demo of the data issue).

    python experiments/probes/check_data_and_rewards.py [--data_dir DIR] [--workers 2]

1. builds `arith` (TFDS, array_record, no TensorFlow) and tokenizes a batch with CharTokenizer;
2. scores hand-written correct/incorrect arith responses and checks the first wrong steps;
3. loads every real-format fixture (tests/data/fixtures) through get_task;
4. scores math and code answers in a RewardPool of worker processes;
5. runs hostile programs in the code sandbox and checks each is contained as a failure.
Prints one line per check and exits non-zero if any check fails.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

import numpy as np
import tensorflow_datasets as tfds
from absl import logging as absl_logging

from ibpo_jax.data import arith, get_task
from ibpo_jax.data.tokenizer import CharTokenizer
from ibpo_jax.rewards import RewardPool, run_tests

FIXTURES = os.path.join(os.path.dirname(__file__), os.pardir, os.pardir, "tests", "data",
                        "fixtures")
FAILURES: list[str] = []


def check(name: str, ok: bool, detail: str = "") -> None:
    print(f"  [{'ok' if ok else 'FAIL'}] {name}{': ' + detail if detail else ''}")
    if not ok:
        FAILURES.append(name)


def arith_section(data_dir: str) -> None:
    print("arith: build, tokenize, check")
    start = time.perf_counter()
    task = get_task("arith", num_train=2000, num_validation=100, num_test=100,
                    data_dir=data_dir)
    train = task.split("train")
    check("built arith level3", len(train) == 2000,
          f"{len(train)} train records in {time.perf_counter() - start:.2f} s, "
          f"example {train[0]['question']!r}")
    tok = CharTokenizer()
    texts = [task.prompt_text(train[i]) + task.reference_text(train[i]) for i in range(8)]
    rows = [[tok.bos_id, *tok.encode(t), tok.eos_id] for t in texts]
    batch = np.full((len(rows), max(map(len, rows))), tok.pad_id, dtype=np.int32)
    for i, row in enumerate(rows):
        batch[i, : len(row)] = row
    newlines = int(tok.is_delim[batch].sum())
    check("tokenized batch", all(tok.decode(r) == t for r, t in zip(rows, texts, strict=True)),
          f"int32 {batch.shape}, {newlines} delimiter tokens (4 lines per sample = "
          f"{8 * 4} expected)")
    if newlines != 32:
        FAILURES.append("delimiter count")

    record = arith.make_record(37, "+-*", [48, 19, 2], id="demo")
    cases = [("37+48=85\n85-19=66\n66*2=132\nAnswer: 132", True, None),
             ("37+48=85\n85-19=67\n67*2=134\nAnswer: 134", False, 1),
             ("37+48=85\n85-19=66\n66+2=68\nAnswer: 68", False, 2),
             ("37+48=86\n86-19=67\n67*2=134\nAnswer: 134", False, 0),
             ("37+48=85\n85-19=66\n66*2=132\nAnswer: 131", False, 3),
             ("37+48=85\n85-19=66", False, None)]
    with RewardPool("arith", num_workers=0, timeout_s=1.0) as pool:
        rewards, infos = pool.score([record] * len(cases), [c[0] for c in cases])
    for (response, correct, first), reward, info in zip(cases, rewards, infos, strict=True):
        ok = (reward == (1.0 if correct else -1.0)) and info["first_wrong_step"] == first
        check(f"arith response {response.splitlines()[-1]!r:14}", ok,
              f"reward {reward:+.0f}, first wrong step {info['first_wrong_step']}, "
              f"{info['reason']}")


def fixtures_section() -> None:
    print("real-format fixtures")
    files = {"math_jsonl": "math_train.jsonl", "math500": "math500.jsonl",
             "aime24": "aime24.parquet", "aime25": "aime25.jsonl",
             "olympiadbench": "olympiadbench.json", "livecodebench": "livecodebench.jsonl",
             "codeforces": "codeforces.parquet"}
    for name, file in files.items():
        fields = {"problem": "question"} if name == "aime25" else None
        task = get_task(name, path=os.path.join(FIXTURES, file), fields=fields)
        split = "train" if name == "math_jsonl" else "test"
        records = task.split(split)
        check(f"{name:14} <- {file}", len(records) > 0,
              f"{len(records)} records, reward {task.reward!r}, "
              f"first prompt {task.prompt_text(records[0])[:40]!r}...")


def scoring_section(workers: int) -> None:
    print(f"math and code rewards in a RewardPool ({workers} workers)")
    math_cases = [("\\frac{1}{2}", "so \\boxed{0.5}", 1.0),
                  ("\\frac{3}{4}", "\\boxed{\\dfrac{3}{4}}", 1.0),
                  ("(1,2]", "\\boxed{[1,2]}", -1.0),
                  ("1, 2", "\\boxed{2, 1}", 1.0),
                  ("7", "no answer here", -1.0)]
    with RewardPool("math", num_workers=workers, timeout_s=10.0) as pool:
        rewards, infos = pool.score([{"answer": g} for g, _, _ in math_cases],
                                    [r for _, r, _ in math_cases])
    for (gold, response, want), got, info in zip(math_cases, rewards, infos, strict=True):
        check(f"math {gold!r} vs {response!r}", got == want, info["reason"])

    lcb = get_task("livecodebench", path=os.path.join(FIXTURES, "livecodebench.jsonl"))
    cf = get_task("codeforces", path=os.path.join(FIXTURES, "codeforces.parquet"))
    stdin, call = lcb.split("test")
    (plus,) = cf.split("test")
    code_cases = [
        (stdin, "```python\ninput()\nprint(sum(map(int, input().split())))\n```", 1.0),
        (stdin, "```python\nprint(6)\n```", -1.0),
        (call, "```python\nclass Solution:\n    def maxPairSum(self, nums, k):\n"
               "        a = sorted(nums)\n        return a[-1] + a[-2] + k\n```", 1.0),
        (plus, "```python\na, b = map(int, input().split())\nprint(a + b)\n```", 1.0),
        (plus, "```python\nwhile True:\n    pass\n```", -1.0),
    ]
    with RewardPool("code", num_workers=workers, timeout_s=30.0) as pool:
        rewards, infos = pool.score([c[0] for c in code_cases], [c[1] for c in code_cases])
    for (record, _, want), got, info in zip(code_cases, rewards, infos, strict=True):
        check(f"code {record['id']:10}", got == want, f"reward {got:+.0f}, {info['reason']}")


HOSTILE = {
    "infinite loop": ("while True:\n    pass", "time limit exceeded"),
    "200 sleeping forked children": (
        "import os, time\nfor _ in range(200):\n    if os.fork() == 0:\n        time.sleep(1000)",
        "os.fork is not allowed"),
    "allocate 8 GB": ("x = bytearray(8 * 1024 ** 3)", "memory limit exceeded"),
    "write 1 GB to stdout": (
        "import sys\nfor _ in range(1024):\n    sys.stdout.write('x' * (1 << 20))",
        "output limit exceeded"),
    "write outside the temp dir": ("open('/tmp/ibpo_escape_demo.txt', 'w').write('x')",
                                   "writing /tmp/ibpo_escape_demo.txt is not allowed"),
    "open a network socket": ("import socket\nsocket.create_connection(('1.1.1.1', 80))",
                              "socket.__new__ is not allowed"),
    "read the parent's environment": (
        "import os\nprint(os.environ.get('IBPO_DEMO_SECRET'))\n"
        "print(open(f'/proc/{os.getppid()}/environ').read())",
        "reading /proc/"),
}


def hostile_section() -> None:
    print("hostile programs in the code sandbox")
    os.environ["IBPO_DEMO_SECRET"] = "demo-secret-value"
    for name, (program, expected) in HOSTILE.items():
        start = time.perf_counter()
        result = run_tests(program, [{"input": "", "output": "demo-secret-value"}],
                           timeout_s=1.0, memory_mb=256, max_output_bytes=1 << 20)
        contained = (not result.passed and expected in result.reason
                     and "demo-secret-value" not in result.reason.split("got", 1)[-1])
        check(f"{name:30}", contained,
              f"{result.reason} ({time.perf_counter() - start:.2f} s; "
              f"{'+'.join(result.isolation)})")
    check("no file escaped", not os.path.exists("/tmp/ibpo_escape_demo.txt"))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data_dir", default=None,
                        help="TFDS data dir for arith (default: a fresh temporary directory)")
    parser.add_argument("--workers", type=int, default=2, help="RewardPool worker processes")
    args = parser.parse_args()
    tfds.disable_progress_bar()
    absl_logging.set_verbosity(absl_logging.ERROR)
    with tempfile.TemporaryDirectory() as tmp:
        arith_section(args.data_dir or tmp)
    fixtures_section()
    scoring_section(args.workers)
    hostile_section()
    print(f"{'all checks passed' if not FAILURES else f'FAILED: {FAILURES}'}")
    return 1 if FAILURES else 0


if __name__ == "__main__":
    sys.exit(main())
