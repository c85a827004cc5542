"""The HTML report: its structure (parsed with html.parser), that hostile run data stays text, and
(in a real headless Chromium) that the timeline renders and expanding a step shows its trace."""

from __future__ import annotations

import html
import json
import os
import re
import shutil
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from audit_helpers import AUDITFLOW, load  # noqa: E402
from auditflow import HOSTILE  # noqa: E402

from orchestrator import Orchestrator  # noqa: E402
from orchestrator.audit.report import render_report  # noqa: E402
from orchestrator.audit.summary import summarise  # noqa: E402
from store import RunRecord  # noqa: E402


class Page(HTMLParser):
    """Every element as (tag, attrs, ids of its open ancestors) plus the text under each id."""

    def __init__(self, text: str) -> None:
        super().__init__(convert_charrefs=True)
        self.elements: list[tuple[str, dict[str, str | None], tuple[str, ...]]] = []
        self.stack: list[tuple[str, str | None]] = []
        self.text: dict[str, list[str]] = {}
        self.feed(text)
        self.close()

    _VOID = {"meta", "br", "img", "input", "link", "hr", "path", "rect"}

    def handle_starttag(self, tag, attrs):
        attrs_d = dict(attrs)
        self.elements.append((tag, attrs_d, tuple(i for _, i in self.stack if i)))
        if tag not in self._VOID:
            self.stack.append((tag, attrs_d.get("id")))

    def handle_startendtag(self, tag, attrs):
        self.elements.append((tag, dict(attrs), tuple(i for _, i in self.stack if i)))

    def handle_endtag(self, tag):
        for i in range(len(self.stack) - 1, -1, -1):
            if self.stack[i][0] == tag:
                del self.stack[i:]
                break

    def handle_data(self, data):
        for _, ident in self.stack:
            if ident:
                self.text.setdefault(ident, []).append(data)

    def text_of(self, ident: str) -> str:
        return "".join(self.text.get(ident, []))

    def tags(self, name: str) -> list[dict[str, str | None]]:
        return [attrs for tag, attrs, _ in self.elements if tag == name]


def hostile_run(db_url: str) -> str:
    wf = load(AUDITFLOW)
    with Orchestrator(db_url, workflows=[wf]) as orc:
        result = orc.run(wf, {"flaky": 1, "decline": True, "payload": HOSTILE, "reason": HOSTILE,
                              "topic": "</pre><script>alert(3)</script>"}, run_id="h1")
        assert result.status == "compensated"
        return orc.report_html("h1")


def test_hostile_output_never_becomes_markup(db_url):
    # Given a run whose outputs, traces, input and error all carry HTML and script
    page_text = hostile_run(db_url)
    page = Page(page_text)
    # Then the page has no script element, no event-handler attribute and no javascript: URL
    assert page.tags("script") == []
    for tag, attrs, _ in page.elements:
        for name, value in attrs.items():
            assert not name.startswith("on"), (tag, name)
            assert not (value or "").strip().lower().startswith("javascript:"), (tag, name, value)
        assert tag not in ("iframe", "object", "embed", "img", "link", "base", "form"), tag
    # And nothing is loaded from anywhere: no src, and only in-page links
    for tag, attrs, _ in page.elements:
        assert "src" not in attrs, tag
        href = attrs.get("href")
        assert href is None or href.startswith("#"), href
    # And the browser is told so as well (defence in depth)
    [csp] = [a for a in page.tags("meta") if a.get("http-equiv") == "Content-Security-Policy"]
    assert "default-src 'none'" in (csp["content"] or "") and "script-src" not in (csp["content"] or "")
    # And the hostile text is shown, as text
    assert "&lt;script&gt;document.title=&#39;pwned&#39;&lt;/script&gt;" in page_text
    search = page.text_of("x2")
    assert "<script>document.title='pwned'</script>" in search and "onerror=alert(1)" in search


def test_report_structure_timeline_failure_effects_snapshots(db_url):
    page_text = hostile_run(db_url)
    page = Page(page_text)
    # Then the timeline has one expandable entry per step execution, in order
    steps = [a for a in page.tags("details") if (a.get("class") or "") == "step"]
    assert [a["id"] for a in steps] == ["x1", "x2", "x3", "x4"]
    # And a step's entry holds its trace, failed attempts, input and output
    assert "split the question into one search" in page.text_of("x1")
    search = page.text_of("x2")
    assert "search backend unavailable (attempt 1)" in search and "retry in" in search
    assert "the state at seq" in search and '"notes"' in search
    # And the failure section points at the step that caused it
    failure = page.text_of("failure")
    assert "step 'confirm' failed and had no failure route" in failure and "PermissionError" in failure
    assert any(tag == "a" and a.get("href") == "#x4" and "failure" in ids for tag, a, ids in page.elements)
    # And the effect is listed with its compensation, and the snapshots with their hashes
    assert "compensated" in page.text_of("effects") and "h1:book:2" in page.text_of("effects")
    assert "verifies" in page.text_of("snapshots")
    # And the graph is drawn, with the path taken
    assert len(page.tags("svg")) == 1 and len(page.tags("rect")) >= 5  # 4 steps and END
    path = page.text_of("graph").split("Path", 1)[1].split()
    assert path == ["plan", "search", "book", "confirm"]
    # And it is made to be printed too
    assert "@media print" in page_text and "details::details-content" in page_text


def test_report_renders_calls_and_events_it_does_not_know():
    # Given a journal with tool and LLM call records, and an event from a newer agentsaga
    rec = RunRecord(run_id="syn", workflow="w", version="1", fingerprint="f" * 64, target="", status="running",
                    created_at=100.0, updated_at=101.0, finished_at=None, parent_run_id=None, error=None,
                    lease_owner=None, lease_token=1, lease_expires_at=None, queue=None, priority=0, dedup_key=None,
                    wake_at=None, recoveries=0)
    graph = {"name": "w", "steps": [{"name": "ask", "start": True}], "edges": [], "routes": [], "joins": []}
    events = [
        (1, "RunStarted", 100.0, {"workflow": "w", "version": "1", "graph": graph, "input": {}, "start": ["ask"]}),
        (2, "CallCompleted", 100.2, {"step": "ask", "tick": 0, "index": 0, "kind": "llm",
                                     "request": {"model": "tiny-model", "prompt": "<b>hi</b>"},
                                     "response": {"text": "hello"}, "ms": 12.5}),
        (3, "StepCompleted", 100.5, {"step": "ask", "tick": 0, "attempt": 1, "input": {"state_at": 1},
                                     "update": {"a": 1}, "next": ["ask"], "ms": 400.0,
                                     "http": [{"type": "http", "tool": "api.example", "method": "GET",
                                               "url": "https://api.example/x", "status": 200, "ms": 33.0}]}),
        (4, "FromTheFuture", 100.7, {"shiny": True}),
    ]
    # When it is summarised and rendered
    s = summarise(rec, events, [], keep_states=True)
    page_text = render_report(s, generated_at=200.0)
    page = Page(page_text)
    # Then the step lists both calls, and the unknown event has a section of its own
    ask = page.text_of("x1")
    assert "llm tiny-model" in " ".join(ask.split()) and "http api.example GET https://api.example/x" in " ".join(
        ask.split())
    assert "&lt;b&gt;hi&lt;/b&gt;" in page_text and "<b>hi</b>" not in page_text
    assert "FromTheFuture" in page.text_of("other")
    assert any("fold stopped at seq 4" in n for n in s.notes)


CHROMIUM = shutil.which("chromium") or ("/usr/bin/chromium" if os.path.exists("/usr/bin/chromium") else None)

# Runs after the page has loaded and writes what the browser laid out into the page, which
# --dump-dom then prints. The report itself has no script and forbids them in its CSP; this probe
# is the test's own, added to a copy of the report with the CSP taken out.
PROBE = """<script>
(function () {
  var out = {};
  var rows = document.querySelectorAll('.timeline details.step');
  out.rows = rows.length;
  out.heights = Array.prototype.map.call(rows, function (r) {
    return r.querySelector('summary').getBoundingClientRect().height; });
  out.bars = Array.prototype.map.call(document.querySelectorAll('.timeline .bar i'), function (b) {
    return b.getBoundingClientRect().width; });
  var step = document.getElementById('x1');
  var trace = step.querySelector('.trace');
  out.visibleBefore = trace.checkVisibility();
  step.open = true;
  out.after = trace.getBoundingClientRect().height;
  out.visible = trace.checkVisibility();
  out.text = trace.innerText;
  out.title = document.title;
  var pre = document.createElement('pre'); pre.id = 'probe'; pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre);
})();
</script>"""


def dump_dom(page: Path, profile: Path) -> str:
    done = subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run", f"--user-data-dir={profile}",
         "--window-size=1280,900", "--dump-dom", page.as_uri()],
        capture_output=True, text=True, timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def test_report_in_headless_chromium(sqlite_url, tmp_path):
    if CHROMIUM is None:
        if os.environ.get("CI"):
            pytest.fail("chromium is not installed (.ci/run installs the Debian package)")
        pytest.skip("chromium not installed (apt-get install chromium)")
    # Given a run's report
    wf = load(AUDITFLOW)
    with Orchestrator(sqlite_url, workflows=[wf]) as orc:
        orc.run(wf, {"flaky": 1, "payload": HOSTILE}, run_id="b1")
        report = orc.report("b1", tmp_path / "report.html")
    # When Chromium opens it as it is
    dom = dump_dom(report, tmp_path / "profile-1")
    # Then the hostile output did not run: no script element, the title is the report's
    assert "<script" not in dom
    assert re.search(r"<title>agentsaga run b1 \(completed\)</title>", dom)
    # When a copy with the test's probe is opened, and the probe expands the first step
    text = report.read_text(encoding="utf-8")
    text = re.sub(r'<meta http-equiv="Content-Security-Policy"[^>]*>', "", text)
    probed = tmp_path / "probed.html"
    probed.write_text(text.replace("</body>", PROBE + "</body>"), encoding="utf-8")
    found = re.search(r'<pre id="probe">(.*?)</pre>', dump_dom(probed, tmp_path / "profile-2"), re.S)
    assert found, "the probe did not run"
    out = json.loads(html.unescape(found.group(1)))
    # Then the timeline rendered: one row per step execution, each laid out with a height
    assert out["rows"] == 4 and all(h > 10 for h in out["heights"]), out
    assert len(out["bars"]) == 4 and all(w >= 1 for w in out["bars"]), out
    # And the trace is hidden until the step is expanded, then visible with its text
    assert out["visibleBefore"] is False and out["visible"] is True and out["after"] > 0, out
    assert "split the question into one search" in out["text"], out
    assert out["title"] == "agentsaga run b1 (completed)"


# -- the graph and the effects, checked in the browser that lays them out (issue 12, point 9) -----------
def maze_workflow():
    """A loop back up, routes that skip rows to END, a step looping on itself, and an effect."""
    from workflows import END, Workflow

    wf = Workflow("maze", version="1")

    def undo(ctx, effect):
        return {"undone": effect.key}

    @wf.step()
    def plan(ctx, state):
        return {"rounds": state.get("rounds", 0)}

    @wf.step()
    def search(ctx, state):
        return {"rounds": state["rounds"] + 1}

    @wf.step()
    def check(ctx, state):
        return {"checked": state["rounds"]}

    @wf.step(effect=True, compensate=undo)
    def book(ctx, state):
        return {"booking": ctx.idempotency_key}

    @wf.step()
    def answer(ctx, state):
        return {"answer": "done"}

    wf.edge("plan", "search")
    wf.route("search", lambda s: "search" if s["rounds"] == 1 else "check", targets=["search", "check", END])
    wf.route("check", lambda s: "plan" if s["rounds"] < 3 else "book", targets=["plan", "book", END])
    wf.edge("book", "answer")
    wf.edge("answer", END)
    return wf


GRAPH_PROBE = """<script>
(function () {
  var out = {crossings: [], nodes: {}, effects: []};
  var boxes = Array.prototype.map.call(document.querySelectorAll('.graph g.node'), function (g) {
    var r = g.querySelector('rect').getBBox();
    out.nodes[g.getAttribute('data-step')] = {x: r.x, y: r.y, w: r.width, h: r.height};
    return {name: g.getAttribute('data-step'), r: r};
  });
  Array.prototype.forEach.call(document.querySelectorAll('.graph path.edge'), function (p) {
    var total = p.getTotalLength();
    for (var d = 0; d <= total; d += 1) {
      var pt = p.getPointAtLength(d);
      boxes.forEach(function (b) {  // strictly inside a box, 1 px in from its border
        if (pt.x > b.r.x + 1 && pt.x < b.r.x + b.r.width - 1 && pt.y > b.r.y + 1 && pt.y < b.r.y + b.r.height - 1) {
          out.crossings.push(p.getAttribute('data-from') + '->' + p.getAttribute('data-to') + ' through ' + b.name);
        }
      });
    }
  });
  out.edges = document.querySelectorAll('.graph path.edge').length;
  var svg = document.querySelector('.graph svg').getBBox();
  out.svg = {w: parseFloat(document.querySelector('.graph svg').getAttribute('width')), x: svg.x, right: svg.x + svg.width};
  Array.prototype.forEach.call(document.querySelector('#effects table').querySelectorAll('tr'), function (tr) {
    if (tr.querySelector('td') && tr.cells.length > 3) { out.effects.push(tr.cells[3].innerText.trim()); }
  });
  var pre = document.createElement('pre'); pre.id = 'probe'; pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre);
})();
</script>"""


def probe_graph(report: Path, tmp_path: Path, name: str) -> dict:
    text = report.read_text(encoding="utf-8")
    text = re.sub(r'<meta http-equiv="Content-Security-Policy"[^>]*>', "", text)
    probed = tmp_path / f"{name}-probed.html"
    probed.write_text(text.replace("</body>", GRAPH_PROBE + "</body>"), encoding="utf-8")
    found = re.search(r'<pre id="probe">(.*?)</pre>', dump_dom(probed, tmp_path / f"profile-{name}"), re.DOTALL)
    assert found, "the probe did not run"
    return json.loads(html.unescape(found.group(1)))


def need_chromium() -> None:
    if CHROMIUM is None:
        if os.environ.get("CI"):
            pytest.fail("chromium is not installed (.ci/run installs the Debian package)")
        pytest.skip("chromium not installed (apt-get install chromium)")


def test_no_edge_is_drawn_through_a_box_and_effects_show_their_real_compensation(sqlite_url, tmp_path):
    need_chromium()
    # Given a run that loops back up twice, loops on a step, and books an effect it never undoes
    wf = maze_workflow()
    with Orchestrator(sqlite_url, workflows=[wf]) as orc:
        assert orc.run(wf, {}, run_id="m1").status == "completed"
        report = orc.report("m1", tmp_path / "maze.html")
    # When Chromium lays out its report
    out = probe_graph(report, tmp_path, "maze")
    # Then every declared edge is drawn, none of them through a box, and all inside the drawing
    assert out["edges"] == 9, out
    assert out["crossings"] == [], out["crossings"]
    assert out["svg"]["x"] >= 0 and out["svg"]["right"] <= out["svg"]["w"], out["svg"]
    # And the steps are laid out from the start down: plan above search above check above book
    n = out["nodes"]
    assert n["plan"]["y"] < n["search"]["y"] < n["check"]["y"] < n["book"]["y"] < n["answer"]["y"] < n["END"]["y"]
    # And the booking, never undone, does not claim a compensation was done
    assert out["effects"] == ["not undone"], out["effects"]


def test_a_compensated_effect_shows_where_it_was_undone(sqlite_url, tmp_path):
    need_chromium()
    wf = load(AUDITFLOW)
    with Orchestrator(sqlite_url, workflows=[wf]) as orc:
        assert orc.run(wf, {"decline": True}, run_id="c9").status == "compensated"
        seq = next(e["seq"] for e in orc.history("c9") if e["kind"] == "CompensationCompleted")
        report = orc.report("c9", tmp_path / "c9.html")
    out = probe_graph(report, tmp_path, "c9")
    assert out["effects"] == [f"compensated at seq {seq}"], out["effects"]
    assert out["crossings"] == []


def test_a_forked_run_is_laid_out_like_its_workflow(sqlite_url, tmp_path):
    need_chromium()
    # Given a run forked at its third step, and the run it was forked from
    wf = load(AUDITFLOW)
    with Orchestrator(sqlite_url, workflows=[wf]) as orc:
        orc.run(wf, {}, run_id="p1")
        orc.fork("p1", from_step="book", run_id="f1")
        orc.resume("f1")
        parent = orc.report("p1", tmp_path / "p1.html")
        fork = orc.report("f1", tmp_path / "f1.html")
    # When Chromium lays out both reports
    p, f = probe_graph(parent, tmp_path, "p1"), probe_graph(fork, tmp_path, "f1")
    # Then the fork's steps sit in the workflow's order, top to bottom, as in its parent's report,
    # with no edge through a box
    for out in (p, f):
        n = out["nodes"]
        assert n["plan"]["y"] < n["search"]["y"] < n["book"]["y"] < n["confirm"]["y"] < n["END"]["y"], n
        assert out["crossings"] == [], out["crossings"]
    assert [f["nodes"][s]["y"] for s in ("plan", "search", "book")] == \
        [p["nodes"][s]["y"] for s in ("plan", "search", "book")]
    # And the fork marks the step it started at
    assert 'class="node visited effect entry" data-step="book"' in fork.read_text(encoding="utf-8")
