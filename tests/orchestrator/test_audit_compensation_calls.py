"""The HTTP requests a compensation makes are listed by ``agentsaga show`` (text and ``--json``) and
the HTML report, each once, labelled with the step whose effect it undid: a compensation's requests
are journaled in its ``CompensationCompleted`` / ``CompensationFailed`` event (``calls``), not as any
step's calls, so the step call tables never held them.

The end-to-end runs make real requests to a local service on a loopback socket (``BookingService``);
the journals of other shapes (older, damaged, hostile) are summarised directly."""

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
from workflows import END, Workflow


class FlakyService(BookingService):
    """The booking service, unavailable (503) for the first cancellation it is asked for."""

    def __init__(self) -> None:
        super().__init__()
        self.unavailable_once = True

    def handle(self, method, path, body, raw, key):
        if method == "DELETE" and self.unavailable_once:
            self.unavailable_once = False
            return 503, {"error": "service unavailable"}
        return super().handle(method, path, body, raw, key)


@pytest.fixture
def service():
    with FlakyService() as svc:
        yield svc


def trip(api: str) -> Workflow:
    """Book a flight (an effect whose compensation cancels it over HTTP), then pay: the payment is
    declined, so the saga cancels the flight. The compensation's first attempt meets the service
    unavailable (503) and fails; its second cancels the flight (200)."""
    wf = Workflow("trip")

    def cancel(ctx, effect):
        reply = ctx.http.delete(f"{api}/flights/{effect.result['flight']}", headers={"Authorization": "Bearer s3cret"})
        return {"cancelled": reply.json()["id"]}

    @wf.step(start=True, effect=True, compensate=cancel)
    def book(ctx, state):
        return {"flight": ctx.http.post(f"{api}/flights", json={"to": "Oslo"}).json()["id"]}

    @wf.step
    def pay(ctx, state):
        ctx.http.post(f"{api}/payments", json={"amount": 5})
        return {"paid": True}

    wf.edge("book", "pay")
    wf.edge("pay", END)
    return wf


def cli(capsys, *argv: str) -> str:
    capsys.readouterr()
    assert main(list(argv)) == 0
    return capsys.readouterr().out


def section(show: str, title: str) -> tuple[str, list[list[str]]]:
    """A table section of ``show``: its title line and its rows, cell by cell."""
    part = show.split(f"\n{title} (", 1)[1].split("\n\n", 1)[0]
    head, _header, *rows = part.splitlines()
    return f"{title} ({head}", [re.split(r"\s{2,}", row.strip()) for row in rows]


def compensation_table(page: str) -> str:
    return page.split('<table class="calls compensation-calls">', 1)[1].split("</table>", 1)[0]


def cells(table: str) -> list[list[str]]:
    """The table's rows as their cells' visible text."""
    return [[" ".join(html.unescape(re.sub(r"<[^>]+>", " ", c)).split())
             for c in re.findall(r"<td[^>]*>(.*?)</td>", row, flags=re.S)]
            for row in re.findall(r"<tr><td.*?</tr>", table, flags=re.S)]


def test_a_compensations_requests_are_listed_with_the_step_it_undid(db_url, orc_factory, service, capsys, tmp_path):
    # Given a trip whose payment is declined, so its saga cancels the booked flight: the cancelling
    # compensation fails once (503: the service is unavailable), then cancels the flight (200)
    service.fail_payments(402)
    wf = trip(service.url)
    orc = orc_factory(wf)
    assert orc.run(wf, {}, run_id="t1").status == "compensated"
    flight = service.ledger()[0]["id"]
    # When the run is shown
    show = cli(capsys, "show", "t1", "--db", db_url)
    # Then both of the compensation's requests are listed, each once, as made by the compensation of
    # step book, with their method, URL, idempotency key and outcome
    title, rows = section(show, "CALLS BY COMPENSATIONS")
    assert title == "CALLS BY COMPENSATIONS (2 journaled, 1 failed)"
    assert [(r[1], r[2], r[3], r[4], r[5]) for r in rows] == [
        ("compensation of book", "1", "DELETE", f"{service.url}/flights/{flight}", "t1:book:0:compensate"),
        ("compensation of book", "2", "DELETE", f"{service.url}/flights/{flight}", "t1:book:0:compensate")]
    assert rows[0][7].startswith("failed 503") and rows[0][8] == "attempt failed"
    assert rows[1][7] == "ok 200" and len(rows[1]) == 8
    # And the step call table still lists only the steps' own requests
    _title, step_rows = section(show, "CALLS")
    assert [(r[1], r[4].rsplit("/", 1)[1]) for r in step_rows] == [("book", "flights"), ("pay", "payments")]
    # And show --json has them too, with their records as journaled (the secret header redacted)
    data = json.loads(cli(capsys, "show", "t1", "--db", db_url, "--json"))
    calls = data["compensation_calls"]
    assert [(c["compensation_of"], c["attempt"], c["method"], c["url"], c["idempotency_key"], c["outcome"],
             c["status"], c["undo"]) for c in calls] == [
        ("book", 1, "DELETE", f"{service.url}/flights/{flight}", "t1:book:0:compensate", "failed", 503, "failed"),
        ("book", 2, "DELETE", f"{service.url}/flights/{flight}", "t1:book:0:compensate", "completed", 200, "completed")]
    [effect] = data["effects"]
    assert {c["effect_seq"] for c in calls} == {effect["seq"]}
    assert "s3cret" not in json.dumps(data)
    # When its report is written
    report = tmp_path / "t1.html"
    cli(capsys, "report", "t1", "--db", db_url, "--html", str(report))
    page = report.read_text()
    # Then the effects section lists the same two requests, labelled with the compensation that made them
    assert "Calls made by compensations (2, 1 failed)" in page
    rows = cells(compensation_table(page))
    assert [r[1:6] for r in rows] == [
        ["compensation of step book (attempt failed)", "1", f"http DELETE {service.url}/flights/{flight}",
         "t1:book:0:compensate", rows[0][5]],
        ["compensation of step book", "2", f"http DELETE {service.url}/flights/{flight}", "t1:book:0:compensate",
         "completed 200"]]
    assert rows[0][5].startswith("failed 503")
    assert "s3cret" not in page


RUN = RunRecord(run_id="r", workflow="w", version="1", fingerprint="f" * 64, target="", status="compensated",
                created_at=100.0, updated_at=101.0, finished_at=101.0, parent_run_id=None, error=None,
                lease_owner=None, lease_token=1, lease_expires_at=None, queue=None, priority=0, dedup_key=None,
                wake_at=None, recoveries=0)


def journal(step: str, *compensations: tuple[str, dict]) -> list[tuple[int, str, float, dict]]:
    """A run whose effect step ``step`` completed and was then compensated by ``compensations``
    (``(kind, data)``, each with the effect's seq and the step filled in)."""
    graph = {"name": "w", "steps": [{"name": step, "start": True}], "edges": [], "routes": [], "joins": []}
    events = [
        (1, "RunStarted", 100.0, {"workflow": "w", "version": "1", "graph": graph, "input": {}, "start": [step]}),
        (2, "StepStarted", 100.1, {"step": step, "tick": 0, "attempt": 1, "key": "r:a:0"}),
        (3, "StepCompleted", 100.2, {"step": step, "tick": 0, "attempt": 1, "input": {"state_at": 1}, "update": {},
                                     "next": [], "ms": 1.0, "effect": True, "compensable": True, "key": "r:a:0"}),
        (4, "SagaStarted", 100.3, {"reason": "failure", "step": step, "error": {"type": "E", "message": "m"}}),
    ]
    seq = 5
    for kind, data in compensations:
        events.append((seq, kind, 100.0 + seq / 10, {"effect": 3, "step": step, **data}))
        seq += 1
    events.append((seq, "SagaCompleted", 101.0, {"outcome": "compensated"}))
    return events


HOSTILE_STEP = '<img src=x onerror="alert(1)">'
HOSTILE_URL = 'http://svc/undo?q=<script>alert("x")</script>&a=1'


def test_hostile_strings_in_a_compensations_calls_are_escaped_in_the_report():
    # Given a compensation of a step with a hostile name whose request's URL, key and error hold markup
    record = {"type": "http", "tool": "http", "method": "DELETE", "url": HOSTILE_URL, "status": 500, "ms": 2.0,
              "attempt": 1, "idempotency_key": "<b>key</b>", "sent": True, "request": {}, "response": None,
              "error": {"type": "RetryableToolError", "message": "</td><script>alert(2)</script>"}}
    events = journal(HOSTILE_STEP, ("CompensationStarted", {"attempt": 1}),
                     ("CompensationCompleted", {"attempt": 1, "calls": [record]}))
    # When the report is rendered
    page = render_report(summarise(RUN, events, [], keep_states=True), generated_at=200.0)
    # Then none of it is markup: every hostile string is there, escaped, and no script tag was let through
    table = compensation_table(page)
    assert "<script" not in page and "<img" not in page and "<b>key" not in page
    [row] = cells(table)
    assert row[1] == f"compensation of step {HOSTILE_STEP}"
    assert row[3] == f"http DELETE {HOSTILE_URL}" and row[4] == "<b>key</b>"
    assert "</td><script>alert(2)</script>" in row[5]


@pytest.mark.parametrize("calls", [
    pytest.param(None, id="no-calls-field"),
    pytest.param([{"method": "DELETE", "url": "http://svc/a", "key": "k"}], id="record-without-outcome"),
    pytest.param([{"request": {"method": "DELETE", "url": "http://svc/b"}, "ms": "slow", "error": "gone"}],
                 id="request-nested-error-as-text"),
    pytest.param(["DELETE http://svc/c"], id="record-as-text"),
    pytest.param({"method": "DELETE", "url": "http://svc/d", "status": 200}, id="one-record-not-a-list"),
])
def test_a_journal_of_an_older_or_other_shape_is_shown_without_failing(calls):
    # Given a compensation event written without a ``calls`` field, or with calls of another shape
    data: dict = {"attempt": 1} if calls is None else {"attempt": 1, "calls": calls}
    events = journal("book", ("CompensationStarted", {"attempt": 1}), ("CompensationCompleted", data))
    # When it is summarised, shown and reported
    s = summarise(RUN, events, [], keep_states=True)
    show = "\n".join(_show_lines(s, limit=None))
    page = render_report(s, generated_at=200.0)
    json.dumps(s.to_json(), default=str)
    # Then each call it holds is listed as made by the compensation of step book, and none is invented
    if calls is None:
        assert s.compensation_calls == [] and "CALLS BY COMPENSATIONS" not in show
        assert "Calls made by compensations" not in page
        return
    _title, rows = section(show, "CALLS BY COMPENSATIONS")
    assert len(rows) == len(s.compensation_calls) == 1
    assert rows[0][1] == "compensation of book"
    assert "http://svc/" in rows[0][4] or "http://svc/" in rows[0][3]
    [row] = cells(compensation_table(page))
    assert row[1] == "compensation of step book" and "http://svc/" in row[3]
