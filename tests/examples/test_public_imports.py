"""examples/ read as a user's code: they import only public names, and never patch sys.path."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

EXAMPLES = sorted((Path(__file__).resolve().parents[2] / "examples").glob("*.py"))
OURS = {"orchestrator", "workflows", "compensations", "store"}


def public_names(module_name: str) -> set[str]:
    """What a user may import from ``module_name``: a package's ``__all__`` (a module inside one is not public)."""
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:  # an optional extra (pydantic-ai) missing here; CI installs them all
        if exc.name is None or exc.name.split(".")[0] in OURS:
            raise
        pytest.skip(f"{module_name} needs {exc.name}, not installed here")
    assert hasattr(module, "__path__"), f"{module_name} is a module, not a package: import from its package"
    assert hasattr(module, "__all__"), f"{module_name} has no __all__, so nothing in it is public yet"
    return set(module.__all__)


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.name)
def test_examples_import_only_public_names(example):
    tree = ast.parse(example.read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module.split(".")[0] in OURS:
            allowed = public_names(node.module)
            for alias in node.names:
                assert alias.name in allowed, f"{example.name}:{node.lineno}: {node.module}.{alias.name} is not public"
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"{example.name}:{node.lineno}: a relative import"
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] in OURS:
                    public_names(alias.name)
    assert "sys.path" not in example.read_text(encoding="utf-8"), f"{example.name} patches sys.path"
