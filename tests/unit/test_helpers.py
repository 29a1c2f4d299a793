"""The test helpers' own failure paths: a worker that does not stop shows where it waits."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.helpers import Output, terminate_worker

# A process that ignores SIGTERM and, like a worker, prints its threads' stacks on SIGUSR1.
STUBBORN = """
import faulthandler, signal, sys, threading
signal.signal(signal.SIGTERM, signal.SIG_IGN)
faulthandler.register(signal.SIGUSR1, all_threads=True, file=sys.stdout)
print("up", flush=True)
threading.Event().wait(120)  # until killed
"""


def test_a_worker_that_ignores_sigterm_fails_the_test_with_its_thread_stacks() -> None:
    process = subprocess.Popen([sys.executable, "-c", STUBBORN], stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True)
    try:
        out = Output(process)
        out.wait_for("^up$", timeout=30)
        with pytest.raises(AssertionError, match=r"did not stop within 0\.5s of SIGTERM") as caught:
            terminate_worker(process, out, timeout=0.5)
        assert "Current thread 0x" in str(caught.value)  # the stacks came with the failure
        assert process.wait(timeout=10) != 0  # killed
    finally:
        if process.poll() is None:
            process.kill()
        process.wait(timeout=10)
        if process.stdout:
            process.stdout.close()
