"""Where agentsaga's per-step time goes: cProfile of one run of trivial steps.

    python bench/profile_step.py [--n 1000] [--pg] [--top 30] [--sort tottime|cumulative]

Runs the same workflow as bench/core.py in this process (after a short warm-up run, so imports
and first-use caches are not charged to the steps), once unprofiled for the plain ms/step and once
under cProfile, and prints the top functions. cProfile inflates Python call overhead, so read the
shares, not the absolute times. On SQLite it first splits the plain time without a profiler:
the same run and the 1-INSERT floor with ``synchronous=OFF`` (no fsync) next to FULL, so
"engine CPU" = agentsaga(OFF) - floor(OFF) and "flush" = floor(FULL) - floor(OFF).
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import sqlite3  # noqa: E402

from _floor import ROW, PgSchemas, pg_unavailable, pg_url, remove_sqlite, with_search_path  # noqa: E402
from _systems import make_system  # noqa: E402


def floor_1stmt(path: str, n: int, synchronous: str) -> float:
    remove_sqlite(path)
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute(f"PRAGMA synchronous={synchronous}")
    conn.execute("CREATE TABLE floor (id INTEGER PRIMARY KEY, data TEXT NOT NULL)")
    for _ in range(50):
        conn.execute("INSERT INTO floor (data) VALUES (?)", (ROW,))
    t0 = time.perf_counter()
    for _ in range(n):
        conn.execute("INSERT INTO floor (data) VALUES (?)", (ROW,))
    out = (time.perf_counter() - t0) * 1000 / n
    conn.close()
    remove_sqlite(path)
    return out


def split_sqlite(workdir: str, n: int, reps: int = 5) -> None:
    """Median ms/step of agentsaga and of the 1-INSERT floor, with and without fsync."""
    res: dict[str, list[float]] = {}
    for _ in range(reps):
        for sync in ("FULL", "OFF"):
            path = os.path.join(workdir, f"split-{sync}.db")
            remove_sqlite(path)
            system = make_system("agentsaga-sqlite", {"path": path}, {"store_options": {"sqlite_synchronous": sync}})
            system.open()
            system.run("warm-up", 50)
            t0 = time.perf_counter()
            system.run("timed", n)
            res.setdefault(f"agentsaga {sync}", []).append((time.perf_counter() - t0) * 1000 / n)
            system.close()
            remove_sqlite(path)
            res.setdefault(f"floor {sync}", []).append(floor_1stmt(path, n, sync))
    m = {k: sorted(v)[len(v) // 2] for k, v in res.items()}
    for k, v in m.items():
        print(f"  {k:16s} {v:.4f} ms/step")
    print(f"  flush (floor FULL - floor OFF)           {m['floor FULL'] - m['floor OFF']:.4f} ms")
    print(f"  one INSERT without flush (floor OFF)     {m['floor OFF']:.4f} ms")
    print(f"  engine CPU (agentsaga OFF - floor OFF)   {m['agentsaga OFF'] - m['floor OFF']:.4f} ms")
    print(f"  agentsaga FULL - floor FULL              {m['agentsaga FULL'] - m['floor FULL']:.4f} ms")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=1000)
    ap.add_argument("--pg", action="store_true", help="profile on Postgres instead of SQLite")
    ap.add_argument("--top", type=int, default=30)
    ap.add_argument("--sort", default="tottime", choices=["tottime", "cumulative"])
    args = ap.parse_args()

    schemas = PgSchemas(pg_url())
    workdir = tempfile.mkdtemp(prefix="agentsaga-prof-")
    try:
        if args.pg:
            if why := pg_unavailable():
                print(why)
                return 1
            schema = schemas.new("prof")
            target = {"url": pg_url(), "schema": schema, "url_with_schema": with_search_path(pg_url(), schema)}
            system = make_system("agentsaga-pg", target)
        else:
            print(f"SQLite, {args.n}-step runs, median of 5, no profiler:")
            split_sqlite(workdir, args.n)
            target = {"path": os.path.join(workdir, "prof.db")}
            system = make_system("agentsaga-sqlite", target)
        system.open()
        system.run("warm-up", 100)
        t0 = time.perf_counter()
        system.run("plain", args.n)
        plain = (time.perf_counter() - t0) * 1000 / args.n
        prof = cProfile.Profile()
        t0 = time.perf_counter()
        prof.enable()
        system.run("profiled", args.n)
        prof.disable()
        profiled = (time.perf_counter() - t0) * 1000 / args.n
        system.close()
        backend = "postgres" if args.pg else "sqlite"
        print(f"{backend}: {plain:.3f} ms/step plain, {profiled:.3f} ms/step under cProfile")
        stats = pstats.Stats(prof)
        stats.strip_dirs().sort_stats(args.sort).print_stats(args.top)
    finally:
        schemas.close()
        if not args.pg:
            remove_sqlite(os.path.join(workdir, "prof.db"))
        os.rmdir(workdir) if os.path.isdir(workdir) and not os.listdir(workdir) else None
    return 0


if __name__ == "__main__":
    sys.exit(main())
