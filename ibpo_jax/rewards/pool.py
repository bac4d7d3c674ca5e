"""RewardPool: score a batch of responses in parallel host processes, surviving bad rewards.

Each worker is a `spawn`ed process (never `fork`: the trainer is multithreaded once JAX starts)
that reports ready once its imports are done, then loops: receive (index, record, response),
call the Reward, send back (index, RewardResult). The dispatcher hands jobs only to ready
workers, keeps them all busy, and gives each job a deadline of `timeout_s` from the moment it
was handed out (start-up time never counts against a response). A job that misses it is scored
`wrong` with the reason; its worker is killed with SIGKILL and replaced. The worker's code
sandboxes die with it (PR_SET_PDEATHSIG) and their directories, which live in the worker's own
temporary directory, are removed. So one hang costs at most timeout_s plus a little slack and
the pool stays usable. A worker that dies mid-job (segfault, OOM kill) likewise yields `wrong`
with the reason and a replacement. Exceptions inside a reward are already turned into `wrong`
by Reward itself.

num_workers=0 scores in the calling process (the `arith` checker takes microseconds: no IPC);
exceptions are still contained, but a hang cannot be interrupted there.
"""

from __future__ import annotations

import multiprocessing as mp
import shutil
import tempfile
import time
from collections import deque
from collections.abc import Sequence
from multiprocessing.connection import wait

import numpy as np

from ibpo_jax.rewards.base import Reward, RewardResult, get_reward

STARTUP_TIMEOUT_S = 120.0  # a fresh worker imports the reward's modules (sympy, ...) first


def _worker_main(conn, reward: Reward, tmp_dir: str) -> None:
    tempfile.tempdir = tmp_dir  # sandboxes go here, so the pool can remove them after a kill
    conn.send(None)  # ready: the reward and its modules are loaded
    while True:
        try:
            job = conn.recv()
        except EOFError:
            return
        if job is None:
            return
        index, record, response = job
        conn.send((index, reward(record, response)))


class _Worker:
    def __init__(self, ctx, reward: Reward):
        self.conn, child_conn = ctx.Pipe()
        self.tmp_dir = tempfile.mkdtemp(prefix="ibpo-reward-worker-")
        self.process = ctx.Process(target=_worker_main, args=(child_conn, reward, self.tmp_dir),
                                   daemon=True)
        self.process.start()
        child_conn.close()
        self.ready = False  # set by the worker's first message, once its imports are done
        self.job: int | None = None  # index of the job in flight
        self.deadline = time.monotonic() + STARTUP_TIMEOUT_S  # for start-up, then for the job

    def stop(self, *, kill: bool) -> None:
        if not kill:
            self.process.join(timeout=2.0)
        if self.process.is_alive():
            self.process.kill()
            self.process.join()
        self.conn.close()
        shutil.rmtree(self.tmp_dir, ignore_errors=True)


class RewardPool:
    """Parallel reward scoring with per-response timeouts.

    Args:
      reward: a REWARDS name (then get_reward(reward, values=values)) or a Reward.
      num_workers: worker processes; 0 scores in-process.
      timeout_s: seconds one response may take before it is scored as wrong.
      values: (wrong, correct) reward values when `reward` is a name.
    """

    def __init__(self, reward: str | Reward, *, num_workers: int, timeout_s: float,
                 values: tuple[float, float] = (-1.0, 1.0)):
        if num_workers < 0:
            raise ValueError(f"RewardPool: num_workers must be >= 0, got {num_workers}")
        if timeout_s <= 0:
            raise ValueError(f"RewardPool: timeout_s must be > 0, got {timeout_s}")
        if isinstance(reward, Reward) and values != (-1.0, 1.0):
            raise ValueError("RewardPool: pass values to get_reward when giving a Reward")
        self.reward = reward if isinstance(reward, Reward) else get_reward(reward, values=values)
        self.num_workers = num_workers
        self.timeout_s = timeout_s
        self._ctx = mp.get_context("spawn")
        self._workers = [_Worker(self._ctx, self.reward) for _ in range(num_workers)]
        self._closed = False

    def score(self, records: Sequence[dict],
              responses: Sequence[str]) -> tuple[np.ndarray, list[dict]]:
        """Rewards float32 [N] and info dicts [N] for N (record, response) pairs, in order."""
        if self._closed:
            raise RuntimeError("RewardPool.score called after close()")
        if len(records) != len(responses):
            raise ValueError(f"RewardPool.score: {len(records)} records but "
                             f"{len(responses)} responses")
        if self.num_workers == 0:
            results = [self.reward(r, s) for r, s in zip(records, responses, strict=True)]
        else:
            results = self._score_parallel(records, responses)
        return (np.array([r.reward for r in results], dtype=np.float32),
                [r.info for r in results])

    def _score_parallel(self, records, responses) -> list[RewardResult]:
        results: list[RewardResult | None] = [None] * len(records)
        pending = deque(range(len(records)))
        while pending or any(w.job is not None for w in self._workers):
            for w in self._workers:
                if w.ready and w.job is None and pending:
                    w.job = pending.popleft()
                    w.deadline = time.monotonic() + self.timeout_s
                    w.conn.send((w.job, records[w.job], responses[w.job]))
            waiting = [w for w in self._workers if w.job is not None or not w.ready]
            timeout = max(0.0, min(w.deadline for w in waiting) - time.monotonic())
            ready = wait([w.conn for w in waiting], timeout=timeout)
            for i, w in enumerate(self._workers):
                if w.ready and w.job is None:
                    continue
                if w.conn in ready:
                    try:
                        message = w.conn.recv()
                    except (EOFError, OSError):
                        if not w.ready:
                            raise RuntimeError(
                                f"reward worker for {self.reward.name!r} died while starting "
                                f"(exit code {w.process.exitcode})") from None
                        self._fail(i, f"reward worker died (exit code {w.process.exitcode})",
                                   results)
                        continue
                    if not w.ready:
                        w.ready = True
                        continue
                    index, result = message
                    results[index], w.job = result, None
                elif time.monotonic() >= w.deadline:
                    if not w.ready:
                        raise RuntimeError(f"reward worker for {self.reward.name!r} did not "
                                           f"start within {STARTUP_TIMEOUT_S:g} s")
                    self._fail(i, f"reward timed out after {self.timeout_s:g} s", results)
        return results  # type: ignore[return-value]

    def _fail(self, i: int, reason: str, results: list) -> None:
        """Scores worker i's job as wrong with `reason` and replaces the worker."""
        w = self._workers[i]
        elapsed = time.monotonic() - (w.deadline - self.timeout_s)
        results[w.job] = self.reward.result(False, {"reason": reason, "answer": None,
                                                    "time_s": elapsed})
        w.stop(kill=True)
        self._workers[i] = _Worker(self._ctx, self.reward)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for w in self._workers:
            try:
                w.conn.send(None)
            except (BrokenPipeError, OSError):
                pass
        for w in self._workers:
            w.stop(kill=False)

    def __enter__(self) -> RewardPool:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
