"""The counts of the canonical programs in docs/examples.md are the programs' own (they cannot drift),
the line targets hold, and the counter counts what it says it counts."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from canonical_counts import CANONICAL, ROOT, count, count_lines, count_names, table

DOC = (ROOT / "docs" / "examples.md").read_text(encoding="utf-8")


def test_the_table_in_the_docs_is_the_programs_count():
    start, end = "<!-- counts: python tests/examples/canonical_counts.py -->\n", "<!-- /counts -->"
    assert start in DOC and end in DOC
    assert DOC[DOC.index(start) + len(start):DOC.index(end)] == table()


@pytest.mark.parametrize(("program", "file", "lines", "names"), CANONICAL, ids=[c[0] for c in CANONICAL])
def test_each_canonical_program_is_within_its_line_target(program, file, lines, names):
    assert count(ROOT / file).lines <= lines


def test_lines_leave_out_blanks_comments_and_the_module_docstring():
    source = '"""Prose\n\nfor the reader."""\n\nimport os  # why\n\n# a comment\ndef f():\n    """Counted."""\n    return (1,\n            2)\n'
    assert count_lines(source) == 5


def test_names_are_imports_attributes_and_options_reached_from_them():
    source = (
        "import os\n"
        "from orchestrator import Orchestrator\n"
        "from workflows import Workflow\n"
        "wf = Workflow('w')\n"
        "def undo(ctx, effect):\n"
        "    ctx.http.delete(effect.result['href'])\n"
        "@wf.step(compensate=undo)\n"
        "def book(ctx, state):\n"
        "    return {'id': ctx.http.post(os.environ['API']).json()['id']}\n"
        "result = Orchestrator().run(wf, {}, run_id='r')\n"
        "print(result.state['id'].upper(), os.path.sep, state.get('x'))\n"
    )
    assert count_names(source) == ("Orchestrator", "Workflow", "compensate", "delete", "http", "json", "post",
                                   "result", "run", "run_id", "state", "step")
