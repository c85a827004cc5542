"""What users install is what works: the wheel builds cleanly, carries its data, and runs the demo.

The wheel is built from a copy of this checkout, installed with its dependencies into a fresh
virtualenv in a temporary directory (no ``--system-site-packages``: nothing of the developer's
environment leaks in), and ``agentsaga demo`` runs from there with the checkout nowhere on the path.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.long]

ROOT = Path(__file__).resolve().parent.parent
# What a wheel is not built from: VCS and virtualenvs (dot-folders), caches, earlier builds, and
# whatever a developer's runs left behind.
NOT_SOURCE = shutil.ignore_patterns(".*", "__pycache__", "*.egg-info", "build", "dist", "reports", "*.db", "*.db-*",
                                    "*.html")


def outside_the_checkout(path: Path) -> Path:
    assert ROOT != path and ROOT not in path.parents, f"{path} is inside the checkout {ROOT}"
    return path


def clean_env() -> dict[str, str]:
    """The environment a user's shell would have: no model configured, no database, no checkout on the path."""
    drop = ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "AGENTSAGA_DB")
    env = {k: v for k, v in os.environ.items() if k not in drop and not k.startswith("OPENAI_")}
    env["PYTHONUNBUFFERED"] = "1"
    return env


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> tuple[Path, str]:
    """The wheel built by pip from a copy of the checkout, and pip's verbose build log."""
    tmp = outside_the_checkout(tmp_path_factory.mktemp("wheel"))
    source = tmp / "source"
    shutil.copytree(ROOT, source, ignore=NOT_SOURCE)
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-v", "-w", str(tmp / "dist"),
                           str(source)], cwd=tmp, env=clean_env(), capture_output=True, text=True, timeout=600)
    log = done.stdout + done.stderr
    assert done.returncode == 0, log[-4000:]
    [wheel] = (tmp / "dist").glob("agentsaga-*.whl")
    return wheel, log


def test_the_wheel_builds_without_deprecation_warnings_and_carries_its_data(built):
    wheel, log = built
    # Then the build backend warned about nothing it will stop accepting
    assert not [line for line in log.splitlines() if "DeprecationWarning" in line], log[-4000:]
    # And the wheel holds the packages with their data, and nothing of the checkout's tests or examples
    names = set(zipfile.ZipFile(wheel).namelist())
    for needed in ("orchestrator/audit/templates/report.html.j2", "orchestrator/py.typed",
                   "orchestrator/cli/demo/agent.py", "orchestrator/cli/demo/child.py",
                   "orchestrator/testing/booking_service.py", "orchestrator/testing/chatserver.py",
                   "workflows/__init__.py", "compensations/__init__.py", "store/__init__.py"):
        assert needed in names, needed
    assert not [n for n in names if n.startswith(("tests/", "examples/", "bench/", "docs/"))]
    metadata = zipfile.ZipFile(wheel).read(f"{wheel.name.split('-py3')[0]}.dist-info/METADATA").decode()
    assert "License-Expression: Apache-2.0" in metadata


def test_the_demo_runs_from_a_clean_install_outside_the_checkout(built, tmp_path):
    wheel, _ = built
    tmp = outside_the_checkout(tmp_path)
    env = clean_env()
    # Given a fresh virtualenv with the wheel and its declared dependencies installed, from the package index
    subprocess.run([sys.executable, "-m", "venv", str(tmp / "venv")], check=True, timeout=300)
    python, agentsaga = tmp / "venv/bin/python", tmp / "venv/bin/agentsaga"
    installed = subprocess.run([str(python), "-m", "pip", "install", "-q", str(wheel)], cwd=tmp, env=env,
                               capture_output=True, text=True, timeout=600)
    assert installed.returncode == 0, installed.stdout[-2000:] + installed.stderr[-4000:]
    where = subprocess.run([str(python), "-c", "import orchestrator; print(orchestrator.__file__)"], cwd=tmp, env=env,
                           capture_output=True, text=True, timeout=60)
    assert where.stdout.startswith(str(tmp / "venv")), where.stdout + where.stderr
    # When a user runs the demo from a directory of their own
    db, report = f"sqlite:///{tmp / 'demo.db'}", tmp / "r.html"
    started = time.monotonic()
    done = subprocess.run([str(agentsaga), "demo", "--db", db, "--report", str(report)], cwd=tmp, env=env,
                          capture_output=True, text=True, timeout=120)
    took = time.monotonic() - started
    out = done.stdout
    # Then it completed, in seconds
    assert done.returncode == 0, out + done.stderr
    assert took < 30, f"the demo took {took:.1f}s"
    run_id = re.search(r"agentsaga demo: run (\S+)", out).group(1)
    assert f"Run {run_id}: completed" in out
    # And its child process died of a real SIGKILL, and this process resumed the run
    assert "child died of SIGKILL" in out
    assert f"Resuming run {run_id}" in out and "-- resumed --" in out
    # And no model request was repeated: every request served is one journaled call
    served, journaled = map(int, re.search(r"model requests served: (\d+); model calls journaled: (\d+)",
                                           out).groups())
    assert served == journaled > 0
    # And the HTML report was written where asked, from the template the wheel carries
    assert f"HTML report: {report}" in out
    assert run_id in report.read_text(encoding="utf-8")
