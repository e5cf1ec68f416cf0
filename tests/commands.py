"""`python -m proxy ...` as child processes, started together and collected together: each
spends most of its second importing, so the independent ones of a test overlap instead of
queueing one behind another."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

Spec = tuple[Sequence[str], Mapping[str, str]]  # the command's arguments, its whole environment


def start(args: Sequence[str], env: Mapping[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "proxy", *args], cwd=ROOT, env=dict(env),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(proc: subprocess.Popen[str], timeout_s: float = 30) -> subprocess.CompletedProcess[str]:
    """What subprocess.run would have returned; killed (and TimeoutExpired) past the limit."""
    try:
        stdout, stderr = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        raise
    return subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)


def run_all(specs: Sequence[Spec], timeout_s: float = 30) -> list[subprocess.CompletedProcess[str]]:
    """Run every command at once; their results in the order given. `timeout_s` bounds them
    all together; past it (or on any error) the ones still running are killed."""
    procs = [start(args, env) for args, env in specs]
    deadline = time.monotonic() + timeout_s
    try:
        return [finish(proc, max(deadline - time.monotonic(), 0.1)) for proc in procs]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
