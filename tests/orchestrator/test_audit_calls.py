"""Every call a step journaled is shown once, with its outcome, by ``agentsaga show``, ``history``
and the HTML report: a ``ctx.http`` request is journaled both as a durable call (``CallCompleted``
or ``CallFailed``) and in its attempt's records, and is still one row; a failed call is a row too;
``KeyIssued`` is the key leaving the process, not a wait.

The runs make real requests to a local service on a loopback socket (``BookingService``)."""

from __future__ import annotations

import html
import json
import re

import pytest

from orchestrator.audit.report import render_report
from orchestrator.audit.summary import summarise
from orchestrator.cli import main
from orchestrator.cli.audit import _show_lines
from orchestrator.testing import BookingService
from store import RunRecord
from workflows import END, Retry, Workflow


@pytest.fixture
def service():
    with BookingService() as svc:
        yield svc


def booking(api: str, attempts: int) -> Workflow:
    wf = Workflow("book-and-pay")

    @wf.step(start=True, effect=True, retry=Retry(attempts=attempts, initial=0.01, jitter=0))
    def book(ctx, state):
        flight = ctx.http.post(f"{api}/flights", json={"to": "Oslo"})
        payment = ctx.http.post(f"{api}/payments", json={"amount": 5})
        return {"flight": flight.json()["id"], "payment": payment.json()["id"]}

    wf.edge("book", END)
    return wf


def cli(capsys, *argv: str) -> str:
    capsys.readouterr()
    assert main(list(argv)) == 0
    return capsys.readouterr().out


def call_rows(show: str) -> tuple[str, list[list[str]]]:
    """The CALLS section of ``show``: its title and its rows, cell by cell."""
    section = show.split("\nCALLS (", 1)[1].split("\n\n", 1)[0]
    title, _header, *rows = section.splitlines()
    return "CALLS (" + title, [re.split(r"\s{2,}", row.strip()) for row in rows]


def calls_table(page: str, execution: int = 1) -> str:
    step = page.split(f'id="x{execution}"', 1)[1]
    return step.split('<table class="calls">', 1)[1].split("</table>", 1)[0]


def test_a_failed_request_then_its_retry_are_two_calls_and_each_request_is_shown_once(
        db_url, orc_factory, service, capsys, tmp_path):
    # Given an effect step that books (201) and pays, where the payment fails once with a 500
    # and the step's retry pays (201): three requests went out, each journaled as a durable call
    # and in its attempt's records
    service.fail_payments(500, times=1)
    wf = booking(service.url, attempts=3)
    orc = orc_factory(wf)
    assert orc.run(wf, {}, run_id="b1").status == "completed"
    # When the run is shown
    show = cli(capsys, "show", "b1", "--db", db_url)
    # Then the call table lists the three requests once each, in order, with their outcomes
    title, rows = call_rows(show)
    assert title == "CALLS (3 journaled, 1 failed)"
    assert [(r[2], r[3], r[4].rsplit("/", 1)[1]) for r in rows] == [
        ("0", "http", "flights"), ("1", "http", "payments"), ("1", "http", "payments")]
    assert [r[6].split(":")[0] for r in rows] == ["ok 201", "failed 500", "ok 201"]
    assert "RetryableToolError" in rows[1][6]
    # And history says what KeyIssued is
    history = cli(capsys, "history", "b1", "--db", db_url)
    assert history.count("its idempotency key left the process") == 2
    # And show --json has the same three calls, with their outcomes, and the keys apart
    data = json.loads(cli(capsys, "show", "b1", "--db", db_url, "--json"))
    [x] = data["executions"]
    assert [(c["index"], c["outcome"], c["status"]) for c in x["calls"]] == [
        (0, "completed", 201), (1, "failed", 500), (1, "completed", 201)]
    assert all(c["http"]["idempotency_key"] == ("b1:book:0" if c["index"] == 0 else "b1:book:0:1")
               for c in x["calls"])
    assert [k["attempt"] for k in x["key_issued"]] == [1, 2]
    assert not [e for e in x["extra"] if e["kind"] in ("KeyIssued", "CallFailed")]
    # When its report is written
    report = tmp_path / "b1.html"
    cli(capsys, "report", "b1", "--db", db_url, "--html", str(report))
    page = report.read_text()
    # Then the step's call table has the same three rows, once each, with their outcomes
    table = calls_table(page)
    assert len(re.findall(r"<tr><td class=\"num\">", table)) == 3
    assert re.findall(r'badge st-\w+">(\w+)<', table) == ["completed", "failed", "completed"]
    cells = [" ".join(html.unescape(re.sub(r"<[^>]+>", " ", c)).split())
             for c in re.findall(r'<td class="mono">(.*?)</td>', table)]
    assert [c for c in cells if c.startswith("http ")] == [
        f"http POST {service.url}/flights", f"http POST {service.url}/payments", f"http POST {service.url}/payments"]
    # And the key leaving the process is said as such, and is not shown as a wait
    assert "Waits, signals and timers" not in page and "KeyIssued" not in page
    assert "key left the process" in page and "attempt 1 (seq 3) · attempt 2 (seq " in html.unescape(page)


def test_a_step_that_gives_up_still_shows_its_failed_calls(db_url, orc_factory, service, capsys):
    # Given an effect step whose payment fails with a 500 on both of its attempts
    service.fail_payments(500)
    wf = booking(service.url, attempts=2)
    orc = orc_factory(wf)
    assert orc.run(wf, {}, run_id="b2").status == "failed"
    # When the run is shown
    show = cli(capsys, "show", "b2", "--db", db_url)
    # Then the booking (made once: the retry reused its journaled answer) and both failed payments are listed
    title, rows = call_rows(show)
    assert title == "CALLS (3 journaled, 2 failed)"
    assert [(r[2], r[6].split(":")[0]) for r in rows] == [("0", "ok 201"), ("1", "failed 500"), ("1", "failed 500")]


def record(status: int, url: str, method: str = "POST", **more) -> dict:
    return {"type": "http", "tool": "svc", "method": method, "url": url, "status": status, "ms": 1.0,
            "attempt": 1, "idempotency_key": "r:a:0", "sent": True, "request": {}, "response": None,
            "error": None, **more}


def test_a_journal_from_before_records_carried_positions_pairs_them_by_method_and_url():
    # Given a journal written before request records carried their call's position: a durable HTTP
    # call (seq 2) and its record in the step's event, plus a request that was no durable call
    rec = RunRecord(run_id="r", workflow="w", version="1", fingerprint="f" * 64, target="", status="completed",
                    created_at=100.0, updated_at=101.0, finished_at=101.0, parent_run_id=None, error=None,
                    lease_owner=None, lease_token=1, lease_expires_at=None, queue=None, priority=0, dedup_key=None,
                    wake_at=None, recoveries=0)
    graph = {"name": "w", "steps": [{"name": "a", "start": True}], "edges": [], "routes": [], "joins": []}
    events = [
        (1, "RunStarted", 100.0, {"workflow": "w", "version": "1", "graph": graph, "input": {}, "start": ["a"]}),
        (2, "CallCompleted", 100.1, {"step": "a", "tick": 0, "index": 0, "kind": "http",
                                     "request": {"method": "GET", "url": "http://svc/items", "params": {"q": 1}},
                                     "response": {"status": 200, "headers": {}, "url": "", "text": "[]"}, "ms": 2.0}),
        (3, "StepCompleted", 100.5, {"step": "a", "tick": 0, "attempt": 1, "input": {"state_at": 1}, "update": {},
                                     "next": [], "ms": 5.0,
                                     "calls": [record(200, "http://svc/items?q=1", "GET"),
                                               record(503, "http://svc/hook", error={"type": "RetryableToolError",
                                                                                     "message": "503"})]}),
        (4, "RunCompleted", 100.5, {}),
    ]
    # When it is summarised
    s = summarise(rec, events, [], keep_states=True)
    # Then the durable call and its record are one call, and the other request is one of its own
    [x] = s.executions
    assert [(c.get("index"), c["outcome"], c["status"]) for c in x.calls] == [(0, "completed", 200),
                                                                              (None, "failed", 503)]
    assert x.calls[0]["http"]["url"] == "http://svc/items?q=1"
    # And show lists both, the second marked as no durable call
    _title, rows = call_rows("\n".join(_show_lines(s, limit=None)))
    assert [(r[2], r[6].split(":")[0], r[-1]) for r in rows] == [("0", "ok 200", "ok 200"),
                                                                ("-", "failed 503", "not durable")]
    # And the report has two rows
    assert len(re.findall(r"<tr><td class=\"num\">", calls_table(render_report(s, generated_at=200.0)))) == 2
