"""The workflow graph laid out for the HTML report, with the path the run took.

The report must be one file that works without scripts, so the graph is inline SVG whose
coordinates are computed here: a layered layout (each step one row below the nearest step that
leads to it, from the workflow's start steps, also for a forked run that entered mid-graph), edges
to the next row as straight lines, and every other edge (loops back up, sideways, skipping rows)
along the gaps between rows and lanes outside the boxes, so no edge crosses a box. Taken edges are drawn solid and labelled with how often they were
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
_LANE = 12  # distance between the vertical lanes of edges that cannot go straight down
_LANE_START = 16  # from the boxes to the first lane
_LABEL_SPACE = 40  # room right of the last lane for a count label


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


def _roots(names: list[str], steps: dict[str, Any], succ: dict[str, list[str]], start: list[str]) -> list[str]:
    """Where the layout starts: the workflow's start steps, not the run's. A forked run starts
    mid-graph, and laying out from there would put the steps before it below it."""
    flagged = [n for n in names if steps.get(n, {}).get("start")]
    if flagged:
        return flagged
    entered = {b for a, targets in succ.items() for b in targets if b != a}
    sources = [n for n in names if n not in entered and n != END and succ.get(n)]
    return sources or [n for n in start if n in succ] or names[:1]


def _layout(view: GraphView, names: list[str], steps: dict[str, Any], declared: dict[tuple[str, str], str],
            start: list[str], visits: dict[str, int]) -> None:
    succ: dict[str, list[str]] = {n: [] for n in names}
    for a, b in declared:
        succ[a].append(b)
    level: dict[str, int] = {}
    queue: deque[str] = deque()
    roots = _roots(names, steps, succ, start)
    for name in [*roots, *start]:  # then the run's own entry, if unreached
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
    # Edges between adjacent rows are straight lines through the gap between them. Every other
    # edge runs in the gaps between rows and in lanes outside the boxes: long forward edges in
    # lanes on the left, edges back up (loops) or sideways on the right, a step back to itself
    # beside its own box. So no edge is ever drawn through a box.
    left_edges = [e for e in view.edges if level[e["to"]] > level[e["from"]] + 1]
    right_edges = [e for e in view.edges if level[e["to"]] <= level[e["from"]] and e["to"] != e["from"]]
    x0 = _MARGIN + (_LANE_START + _LANE * len(left_edges) if left_edges else 0)
    pos: dict[str, tuple[float, float]] = {}
    for lv, row in sorted(rows.items()):
        x = x0 + (inner - row_width[lv]) / 2
        y = _MARGIN + lv * _ROW
        for name in row:
            pos[name] = (x + widths[name] / 2, y + _NODE_H / 2)
            x += widths[name] + _GAP
    right = x0 + inner
    view.width = int(right + _GAP / 2 + _LANE_START + _LANE * len(right_edges) + _LABEL_SPACE + _MARGIN)
    view.height = int(_MARGIN * 2 + (max(rows) + 1) * _ROW - (_ROW - _NODE_H))
    for name in names:
        cx, cy = pos[name]
        w = widths[name]
        step = steps.get(name, {})
        view.nodes.append({
            "name": _label(name), "label": labels[name], "x": round(cx - w / 2, 1), "y": round(cy - _NODE_H / 2, 1), "w": w,
            "h": _NODE_H, "cx": round(cx, 1), "cy": round(cy + 4, 1), "visits": visits.get(name, 0),
            "start": bool(step.get("start")), "effect": bool(step.get("effect")), "end": name == END,
            "entry": name in start and name not in roots,  # a fork's entry, mid-graph
        })
    half = _NODE_H / 2
    in_gap: dict[float, int] = {}

    def gap_y(row_top: float, below: bool) -> float:
        """A height inside the gap below (or above) a row, different for each edge using that gap."""
        mid = row_top + _NODE_H + (_ROW - _NODE_H) / 2 if below else row_top - (_ROW - _NODE_H) / 2
        k = in_gap[mid] = in_gap.get(mid, -1) + 1
        return max(4.0, mid + (0, 5, -5, 10, -10)[k % 5])

    lanes = {id(e): x0 - _LANE_START - _LANE * k for k, e in enumerate(left_edges)}
    # Right lanes start beyond the lanes that self-loops use beside the widest boxes.
    lanes.update({id(e): right + _GAP / 2 + _LANE_START + _LANE * k for k, e in enumerate(right_edges)})
    for edge in view.edges:
        a, b = edge["from"], edge["to"]
        (ax, ay), (bx, by) = pos[a], pos[b]
        if level[b] == level[a] + 1:
            x1, y1, x2, y2 = ax, ay + half, bx, by - half
            edge["path"] = f"M{x1:.1f},{y1:.1f} L{x2:.1f},{y2:.1f}"
            edge["lx"], edge["ly"] = round((x1 + x2) / 2 + 6, 1), round((y1 + y2) / 2, 1)
            edge["anchor"] = "start"
            continue
        lane = lanes.get(id(edge), ax + widths[a] / 2 + _GAP / 2)  # a self-loop: beside its own box
        below = gap_y(ay - half, below=True)
        above = gap_y(by - half, below=False)
        xa = ax + (widths[a] / 4 if a == b else 0)
        xb = bx + (widths[b] / 4 if a == b else 0)
        edge["path"] = (f"M{xa:.1f},{ay + half:.1f} L{xa:.1f},{below:.1f} L{lane:.1f},{below:.1f} "
                        f"L{lane:.1f},{above:.1f} L{xb:.1f},{above:.1f} L{xb:.1f},{by - half:.1f}")
        left = lane < x0
        # The count sits beside the lane just below where the edge leaves its source's row.
        edge["lx"], edge["ly"] = round(lane - 4 if left else lane + 4, 1), round(below + 12, 1)
        edge["anchor"] = "end" if left else "start"


def _label(name: str) -> str:
    return "END" if name == END else name
