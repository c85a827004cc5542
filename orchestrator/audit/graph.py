"""The workflow graph laid out for the HTML report, with the path the run took.

The report must be one file that works without scripts, so the graph is inline SVG whose
coordinates are computed here: a layered layout (each step one row below the nearest step that
leads to it, from the start steps), forward edges as straight lines and edges that go back up
(loops) as curves on the right. Taken edges are drawn solid and labelled with how often they were
taken; declared but untaken edges are faint. The layout is deliberately simple: agent graphs are
small (a loop of a few steps run many times), and past ``MAX_NODES`` steps the report shows only
the edge table, which stays readable at any size.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

__all__ = ["GraphView", "graph_view", "MAX_NODES"]

END = "__end__"
MAX_NODES = 40
_ROW = 78  # vertical distance between layers
_NODE_H = 34
_GAP = 26  # horizontal gap between nodes of a layer
_MARGIN = 24
_LOOP_SPACE = 90  # room on the right for edges that go back up


@dataclass(slots=True)
class GraphView:
    nodes: list[dict[str, Any]] = field(default_factory=list)
    edges: list[dict[str, Any]] = field(default_factory=list)  #: also the table rows
    width: int = 0
    height: int = 0  #: no nodes: too many steps to draw (the edge table remains)


def graph_view(graph: dict[str, Any], taken: Iterable[tuple[str, str, int]], visits: dict[str, int],
               start: list[str]) -> GraphView:
    """``graph`` is RunStarted's description; ``taken`` (from, to, count) the routing the journal
    recorded; ``visits`` executions per step."""
    steps = {s["name"]: s for s in graph.get("steps", []) if isinstance(s, dict) and "name" in s}
    declared: dict[tuple[str, str], str] = {}
    for src, dst in graph.get("edges", []):
        declared[(src, dst)] = "edge"
    for src, _router, targets in graph.get("routes", []):
        for dst in targets or ():
            declared.setdefault((src, dst), "route")
    for target, sources in graph.get("joins", []):
        for src in sources:
            declared.setdefault((src, target), "join")
    for name, step in steps.items():
        if step.get("on_failure"):
            declared.setdefault((name, step["on_failure"]), "on failure")
    counts = {(a, b): n for a, b, n in taken}
    for pair in counts:
        declared.setdefault(pair, "route")  # a router without declared targets: learnt from the run
    for pair in declared:
        for name in pair:
            if name not in steps and name != END:
                steps[name] = {"name": name}
    view = GraphView()
    order = sorted(declared, key=lambda p: (p[0], p[1]))
    view.edges = [{"from": a, "to": b, "from_label": _label(a), "to_label": _label(b), "kind": declared[(a, b)],
                   "count": counts.get((a, b), 0)} for a, b in order]
    names = list(steps) + ([END] if any(b == END for _, b in declared) else [])
    if not names or len(names) > MAX_NODES:
        return view
    _layout(view, names, steps, declared, start, visits)
    return view


def _layout(view: GraphView, names: list[str], steps: dict[str, Any], declared: dict[tuple[str, str], str],
            start: list[str], visits: dict[str, int]) -> None:
    succ: dict[str, list[str]] = {n: [] for n in names}
    for a, b in declared:
        succ[a].append(b)
    level: dict[str, int] = {}
    queue: deque[str] = deque()
    for name in start or [n for n in names if steps.get(n, {}).get("start")] or names[:1]:
        if name in succ and name not in level:
            level[name] = 0
            queue.append(name)
    while queue:
        node = queue.popleft()
        for nxt in sorted(succ[node]):
            if nxt not in level:
                level[nxt] = level[node] + 1
                queue.append(nxt)
    deepest = max(level.values(), default=-1)
    for name in names:  # unreachable steps (a graph that changed, say) get a row of their own
        if name not in level:
            level[name] = deepest + 1
    if END in level:  # END always at the bottom, below every step
        level[END] = max((v for n, v in level.items() if n != END), default=-1) + 1
    rows: dict[int, list[str]] = {}
    for name in names:
        rows.setdefault(level[name], []).append(name)
    labels = {n: _label(n) + (f" ({visits[n]})" if visits.get(n) else "") for n in names}
    widths = {n: max(72, 8 * len(labels[n]) + 24) for n in names}  # ~7.2 px per monospace character
    row_width = {lv: sum(widths[n] for n in row) + _GAP * (len(row) - 1) for lv, row in rows.items()}
    inner = max(row_width.values())
    pos: dict[str, tuple[float, float]] = {}
    for lv, row in sorted(rows.items()):
        x = _MARGIN + (inner - row_width[lv]) / 2
        y = _MARGIN + lv * _ROW
        for name in row:
            pos[name] = (x + widths[name] / 2, y + _NODE_H / 2)
            x += widths[name] + _GAP
    view.width = int(inner + 2 * _MARGIN + _LOOP_SPACE)
    view.height = int(_MARGIN * 2 + (max(rows) + 1) * _ROW - (_ROW - _NODE_H))
    for name in names:
        cx, cy = pos[name]
        w = widths[name]
        step = steps.get(name, {})
        view.nodes.append({
            "name": _label(name), "label": labels[name], "x": round(cx - w / 2, 1), "y": round(cy - _NODE_H / 2, 1), "w": w,
            "h": _NODE_H, "cx": round(cx, 1), "cy": round(cy + 4, 1), "visits": visits.get(name, 0),
            "start": bool(step.get("start")), "effect": bool(step.get("effect")), "end": name == END,
        })
    right = _MARGIN + inner
    for edge in view.edges:
        a, b = edge["from"], edge["to"]
        (ax, ay), (bx, by) = pos[a], pos[b]
        half = _NODE_H / 2
        if level[b] > level[a]:
            x1, y1, x2, y2 = ax, ay + half, bx, by - half
            edge["path"] = f"M{x1:.1f},{y1:.1f} L{x2:.1f},{y2:.1f}"
            edge["lx"], edge["ly"] = round((x1 + x2) / 2 + 6, 1), round((y1 + y2) / 2, 1)
        else:  # back up (a loop) or sideways: around the right of the drawing
            x1 = ax + widths[a] / 2
            x2 = bx + widths[b] / 2
            bend = right + 20 + 12 * (abs(level[a] - level[b]) % 5)
            edge["path"] = f"M{x1:.1f},{ay:.1f} C{bend:.1f},{ay:.1f} {bend:.1f},{by:.1f} {x2 + 2:.1f},{by:.1f}"
            edge["lx"], edge["ly"] = round(bend - 4, 1), round((ay + by) / 2, 1)


def _label(name: str) -> str:
    return "END" if name == END else name
