"""What the scale tests share: the booking service in its own process, worker processes started
as a user would (``agentsaga worker``), an in-process worker on a thread, and the journal checks.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FLOWS = "tests/scale/flows.py"
#: How long a test waits for something that must happen before calling it a hang. Only a bound for
#: a hang, never a measure of speed: a loaded machine (CI, two cores shared with other test runs) may
#: take many times longer than an idle one, and a test must not fail for that.
HANG = 120.0


def target(name: str) -> str:
    return f"{FLOWS}:{name}"


def wait_for(predicate: Callable[[], object], *, timeout: float, what: str, every: float = 0.05) -> object:
    end = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > end:
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(every)


def stopped(proc: subprocess.Popen) -> bool:
    """Whether every thread of ``proc`` has stopped. ``kill(SIGSTOP)`` returns before the target has
    stopped; a test that must act only once a process is frozen waits for this (Linux ``/proc``;
    elsewhere it cannot tell and says yes)."""
    if not Path("/proc/self").exists():
        return True  # no /proc (macOS): nothing to look at
    tasks = Path(f"/proc/{proc.pid}/task")
    if not tasks.is_dir():
        return False  # gone: not "stopped", and the caller's wait reports it
    states = []
    for task in tasks.iterdir():
        try:
            states.append((task / "stat").read_text().rsplit(")", 1)[1].split()[0])
        except (FileNotFoundError, ProcessLookupError, IndexError):  # a thread that just ended
            continue
    return bool(states) and all(state in ("T", "t") for state in states)


class Service:
    """The scripted booking service as a process of its own, its ledger in a file."""

    def __init__(self, tmp: Path, delay: float = 0.0) -> None:
        self.ledger_path = tmp / "ledger.jsonl"
        self.proc = subprocess.Popen([sys.executable, "-m", "orchestrator.testing.booking_service", "--port", "0",
                                      "--ledger", str(self.ledger_path), "--delay", str(delay)],
                                     stdout=subprocess.PIPE, text=True)
        self.url = self.proc.stdout.readline().strip()
        assert self.url.startswith("http://127.0.0.1:"), self.url

    def ledger(self) -> list[dict]:
        if not self.ledger_path.exists():
            return []
        return [json.loads(line) for line in self.ledger_path.read_text().splitlines() if line.strip()]

    def stats(self) -> dict:
        import httpx

        return httpx.get(f"{self.url}/stats", timeout=HANG).json()

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(timeout=HANG)


@pytest.fixture
def service(tmp_path) -> Iterator[Service]:
    svc = Service(tmp_path)
    yield svc
    svc.stop()


@pytest.fixture
def slow_service(tmp_path) -> Iterator[Service]:
    """The service answering each request after 0.15 s, so concurrent calls overlap."""
    svc = Service(tmp_path, delay=0.15)
    yield svc
    svc.stop()


class WorkerProcs:
    """``agentsaga worker`` processes; each logs to a file of its own. All are killed at teardown."""

    def __init__(self, tmp: Path, db_url: str) -> None:
        self.tmp = tmp
        self.db_url = db_url
        self.procs: list[tuple[subprocess.Popen, Path]] = []

    def start(self, *targets: str, args: tuple[str, ...] = (), ready: bool = True) -> tuple[subprocess.Popen, Path]:
        log = self.tmp / f"worker-{len(self.procs)}.log"
        cmd = [sys.executable, "-m", "orchestrator.cli", "worker", *targets, "--db", self.db_url, *args]
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=log.open("w"))
        self.procs.append((proc, log))
        if ready:
            wait_for(lambda: " ready: " in log.read_text() or proc.poll() is not None, timeout=HANG,
                     what=f"worker {len(self.procs) - 1} to start")
            assert proc.poll() is None, log.read_text()[-3000:]
        return proc, log

    def logs(self) -> str:
        return "\n".join(f"--- {log.name}\n{log.read_text()[-4000:]}" for _, log in self.procs)

    def stop_all(self) -> None:
        for proc, _ in self.procs:
            if proc.poll() is None:
                try:
                    proc.send_signal(signal.SIGCONT)
                    proc.kill()
                except ProcessLookupError:
                    pass
        for proc, _ in self.procs:
            proc.wait(timeout=HANG)


@pytest.fixture
def workers(tmp_path) -> Iterator[Callable[[str], WorkerProcs]]:
    made: list[WorkerProcs] = []

    def make(db_url: str) -> WorkerProcs:
        procs = WorkerProcs(tmp_path, db_url)
        made.append(procs)
        return procs

    yield make
    for procs in made:
        procs.stop_all()


class ThreadWorker:
    """An in-process ``Worker`` running on a thread until ``stop()``."""

    def __init__(self, worker) -> None:
        self.worker = worker
        self.thread = threading.Thread(target=worker.run, kwargs={"install_signals": False}, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.worker.stop()
        self.thread.join(timeout=HANG)
        assert not self.thread.is_alive(), "the worker did not stop"


@pytest.fixture
def thread_worker() -> Iterator[Callable[..., ThreadWorker]]:
    started: list[ThreadWorker] = []

    def start(worker) -> ThreadWorker:
        tw = ThreadWorker(worker)
        started.append(tw)
        return tw

    yield start
    for tw in started:
        if tw.thread.is_alive():
            tw.stop()


def journal_problems(history: list[dict]) -> list[str]:
    """What would show that a journal was written wrongly: a step completed twice in one tick, or
    an append by a lease holder other than the one of the latest ``Resumed`` (interleaving)."""
    problems = []
    seen = Counter((e["data"]["step"], e["data"]["tick"], e["data"].get("epoch", 0))
                   for e in history if e["kind"] == "StepCompleted")
    problems += [f"step {step!r} completed {n} times in tick {tick}" for (step, tick, _), n in seen.items() if n > 1]
    lease = None
    for e in history:
        if e["kind"] == "Resumed":
            new = e["data"]["lease"]
            if lease is not None and new <= lease:
                problems.append(f"seq {e['seq']}: Resumed with lease {new} after lease {lease}")
            lease = new
        elif e["kind"] == "StepCompleted" and "lease" in e["data"]:
            if e["data"]["lease"] != lease:
                problems.append(f"seq {e['seq']}: {e['data']['step']} appended under lease {e['data']['lease']} "
                                f"while lease {lease} held the run")
    return problems
