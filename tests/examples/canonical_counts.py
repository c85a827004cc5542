"""Count the canonical programs' lines and framework names; print the table docs/examples.md shows.

    python tests/examples/canonical_counts.py

Lines: non-blank lines that are not comments, imports and the code that runs or resumes the program
included; the module docstring (prose for the reader) is left out, other docstrings are counted (a
tool's docstring is what the model is told).

Names: the distinct names of the framework the program uses: each name imported from agentsaga's
packages, each attribute reached from one (``orc.run``, ``ctx.http.post``, ``result.state``; a
call's result is followed, ``ctx.http.post(...).json``, a subscript's is not: it is data), and
each keyword option given to one (``run_id=``, ``compensate=``). What counts as reached from the
framework: imported names, variables assigned from such an expression, the step context (a
parameter named ``ctx``) and the parameters of functions handed to the framework as options
(a compensation's ``effect``).
"""

from __future__ import annotations

import ast
import io
import sys
import tokenize
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OURS = {"orchestrator", "workflows", "compensations", "store"}
# program, file, line target, name target (issue 12)
CANONICAL = [
    ("tool loop", "examples/tool_loop.py", 18, 5),
    ("booking saga", "examples/booking_saga.py", 20, 6),
    ("approval", "examples/approval.py", 18, 6),
]


@dataclass(frozen=True)
class Count:
    lines: int
    names: tuple[str, ...]


def count_lines(source: str) -> int:
    tree = ast.parse(source)
    skip: set[int] = set()
    doc = tree.body[0] if tree.body and isinstance(tree.body[0], ast.Expr) else None
    if doc is not None and isinstance(doc.value, ast.Constant) and isinstance(doc.value.value, str):
        skip.update(range(doc.lineno, doc.end_lineno + 1))
    code_lines = {tok.start[0] for tok in tokenize.generate_tokens(io.StringIO(source).readline)
                  if tok.type not in (tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT,
                                      tokenize.DEDENT, tokenize.ENDMARKER)}
    # a token spanning lines (a triple-quoted string) covers all of them
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.STRING:
            code_lines.update(range(tok.start[0], tok.end[0] + 1))
    return len(code_lines - skip)


def _root(node: ast.AST) -> ast.AST:
    """Follow attributes and calls down to what the chain starts from (a subscript ends it)."""
    while isinstance(node, (ast.Attribute, ast.Call)):
        node = node.value if isinstance(node, ast.Attribute) else node.func
    return node


def count_names(source: str) -> tuple[str, ...]:
    tree = ast.parse(source)
    framework: set[str] = {"ctx"}
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] in OURS:
            for alias in node.names:
                names.add(alias.name)
                framework.add(alias.asname or alias.name)
        elif isinstance(node, ast.Import):
            assert not any(a.name.split(".")[0] in OURS for a in node.names), "import names from packages"

    def ours(expr: ast.AST) -> bool:
        root = _root(expr)
        return isinstance(root, ast.Name) and root.id in framework

    functions = {n.name: n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
    for _ in range(3):  # to a fixed point: a variable may be bound from another one
        for node in ast.walk(tree):
            if isinstance(node, ast.Assign) and ours(node.value):
                framework.update(t.id for t in node.targets if isinstance(t, ast.Name))
            elif isinstance(node, (ast.With, ast.AsyncWith)):
                for item in node.items:
                    if ours(item.context_expr) and isinstance(item.optional_vars, ast.Name):
                        framework.add(item.optional_vars.id)
            elif isinstance(node, ast.Call) and ours(node.func):
                for kw in node.keywords:  # a function given as an option: its parameters are ours
                    if isinstance(kw.value, ast.Name) and kw.value.id in functions:
                        framework.update(a.arg for a in functions[kw.value.id].args.args if a.arg != "state")
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and ours(node):
            names.add(node.attr)
        elif isinstance(node, ast.Call) and ours(node.func):
            names.update(kw.arg for kw in node.keywords if kw.arg is not None)
    return tuple(sorted(names))


def count(path: Path) -> Count:
    source = path.read_text(encoding="utf-8")
    return Count(lines=count_lines(source), names=count_names(source))


def table() -> str:
    rows = ["| program | file | lines (target) | framework names (target) | the names |",
            "|---|---|---|---|---|"]
    for program, file, line_target, name_target in CANONICAL:
        c = count(ROOT / file)
        rows.append(f"| {program} | [`{file}`](../{file}) | {c.lines} (<= {line_target}) | "
                    f"{len(c.names)} (<= {name_target}) | {', '.join(f'`{n}`' for n in c.names)} |")
    return "\n".join(rows) + "\n"


if __name__ == "__main__":
    sys.stdout.write(table())
