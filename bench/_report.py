"""Formatting and bookkeeping the benchmark scripts share: tables, summaries, the machine, children."""

from __future__ import annotations

import functools
import json
import os
import platform
import shutil
import sqlite3
import subprocess
import sys
import time
from importlib import metadata

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
CHILD = os.path.join(HERE, "_child.py")


def child_env() -> dict:
    """The environment for children: the working tree's packages first, so the benchmark measures
    this checkout even when another agentsaga is installed (or none is)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, env.get("PYTHONPATH")) if p)
    return env


def fmt_num(v: float | None, digits: int = 3) -> str:
    if v is None:
        return "-"
    if abs(v) >= 100:
        return f"{v:.0f}"
    if abs(v) >= 10:
        return f"{v:.1f}"
    return f"{v:.{digits}f}"


def fmt_summary(s: dict | None, digits: int = 3) -> str:
    """'median (min-max)' or '-'."""
    if not s:
        return "-"
    if s.get("n", 1) == 1 or s["min"] == s["max"]:
        return fmt_num(s["median"], digits)
    return f"{fmt_num(s['median'], digits)} ({fmt_num(s['min'], digits)}-{fmt_num(s['max'], digits)})"


def table(headers: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(str(r[i])) for r in [headers] + rows) for i in range(len(headers))]
    lines = ["  ".join(str(c).ljust(w) for c, w in zip(headers, widths)).rstrip()]
    lines.append("  ".join("-" * w for w in widths))
    for r in rows:
        lines.append("  ".join(str(c).ljust(w) for c, w in zip(r, widths)).rstrip())
    return "\n".join(lines)


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def machine(pg_url: str | None, pg_reason: str | None) -> dict:
    """What the numbers were measured on (nproc, CPU, memory, disk, versions)."""
    info: dict = {
        "nproc": os.cpu_count(),
        "python": platform.python_version(),
        "sqlite": sqlite3.sqlite_version,
        "platform": platform.platform(),
    }
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=5).stdout
        models = [ln.split(":", 1)[1].strip() for ln in out.splitlines() if ln.startswith("Model name")]
        info["cpu"] = models[0] if models else None
    except (OSError, subprocess.SubprocessError):
        info["cpu"] = platform.processor() or None
    try:
        with open("/proc/meminfo") as fh:
            kb = int(fh.readline().split()[1])
        info["memory_gib"] = round(kb / 1024 / 1024, 1)
    except (OSError, ValueError, IndexError):
        info["memory_gib"] = None
    try:
        total, _used, free = shutil.disk_usage(HERE)
        info["disk"] = f"{total / 2**30:.0f} GiB, {free / 2**30:.0f} GiB free"
    except OSError:
        info["disk"] = None
    info["postgres"] = None
    if pg_url and not pg_reason:
        try:
            import psycopg

            with psycopg.connect(pg_url) as conn:
                info["postgres"] = conn.execute("SHOW server_version").fetchone()[0]
                info["pg_synchronous_commit"] = conn.execute("SHOW synchronous_commit").fetchone()[0]
        except Exception as exc:  # informational only
            info["postgres"] = f"unknown ({type(exc).__name__})"
    info["packages"] = {d: _version(d) for d in (
        "agentsaga", "SQLAlchemy", "sqlmodel", "psycopg", "dbos", "langgraph",
        "langgraph-checkpoint-sqlite", "langgraph-checkpoint-postgres")}
    return info


class ChildError(RuntimeError):
    pass


def run_child(spec: dict, *, timeout: float = 600, expect_kill: bool = False) -> tuple[dict | None, float]:
    """Run ``_child.py`` with ``spec``; return (its JSON result, wall time just before spawning).

    ``expect_kill``: the child is meant to SIGKILL itself; anything else is an error.
    """
    env = child_env()
    t_spawn = time.time()
    proc = subprocess.run(
        [sys.executable, CHILD, json.dumps(spec)], capture_output=True, text=True, timeout=timeout, env=env,
        cwd=HERE,
    )
    if expect_kill:
        if proc.returncode != -9:
            raise ChildError(f"expected SIGKILL, got exit {proc.returncode}: {tail(proc)}")
        return None, t_spawn
    if proc.returncode != 0:
        raise ChildError(f"exit {proc.returncode}: {tail(proc)}")
    last = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else ""
    try:
        return json.loads(last), t_spawn
    except json.JSONDecodeError:
        raise ChildError(f"no JSON result: {tail(proc)}") from None


def tail(proc: subprocess.CompletedProcess) -> str:
    text = (proc.stderr or "").strip() or (proc.stdout or "").strip()
    lines = [ln for ln in text.splitlines() if ln.strip()]
    return " | ".join(lines[-3:])[-400:] if lines else "(no output)"


@functools.cache
def check_import(statement: str) -> str | None:
    """None if ``statement`` runs in a fresh interpreter, else the error's last line. Asked once per
    statement: the engines on SQLite and on Postgres need the same import (a fresh interpreter
    answers it the same way each time, and peers.py asked it again for each)."""
    proc = subprocess.run([sys.executable, "-c", statement], capture_output=True, text=True, timeout=120, cwd=HERE,
                          env=child_env())
    if proc.returncode == 0:
        return None
    lines = [ln for ln in (proc.stderr or proc.stdout).splitlines() if ln.strip()]
    return lines[-1].strip()[:300] if lines else f"exit {proc.returncode}"
