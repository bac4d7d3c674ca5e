"""Module-level verifiers for the RewardPool tests (importable by spawned worker processes)."""

import os
import signal
import time


def behave(record: dict, response: str) -> tuple[bool, dict]:
    """Misbehaves on request: "hang" sleeps, "raise" raises, "crash" kills its own process;
    otherwise correct iff the response equals record["answer"]."""
    if response == "hang":
        time.sleep(600)
    if response == "raise":
        raise ValueError("kaboom")
    if response == "crash":
        os.kill(os.getpid(), signal.SIGKILL)
    return response == record["answer"], {"reason": "compared", "answer": response}
