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
