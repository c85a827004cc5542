"""ctx.http inside steps: journaled calls, idempotency keys, redaction down to the database file,
and store-backed circuit breakers that a graph can route around."""

from __future__ import annotations

from pathlib import Path

import pytest

from compensations import BreakerConfig, BreakerRegistry
from orchestrator import Orchestrator
from orchestrator.testing import BookingService
from workflows import END, Workflow

SECRET = "sk-live0123456789abcdefghijklmnop"


@pytest.fixture
def service():
    with BookingService() as svc:
        yield svc


def test_http_calls_are_journaled_with_the_effect_key(db_url, service):
    wf = Workflow("book-one")

    @wf.step(start=True, effect=True, compensate=lambda ctx, e: None)
    def book(ctx, state):
        r = ctx.http.post(f"{state['api']}/flights", json={"to": "Oslo"})
        return {"flight": r.json()["id"]}

    wf.edge("book", END)
    with Orchestrator(db_url, workflows=[wf]) as orc:
        result = orc.run(wf, {"api": service.url}, run_id="h1")
        history = orc.history("h1")
    assert result.status == "completed"
    [completed] = [e["data"] for e in history if e["kind"] == "StepCompleted"]
    [call] = completed["calls"]
    assert call["method"] == "POST" and call["status"] == 201 and call["idempotency_key"] == "h1:book:0"
    assert service.ledger()[0]["idempotency_key"] == "h1:book:0"


def test_secrets_never_reach_the_database(db_url, service, tmp_path):
    # Given a step that sends an API key in a header and in its arguments, and returns one
    wf = Workflow("leaky")

    @wf.step(start=True)
    def call(ctx, state):
        ctx.http.post(f"{state['api']}/hotels?api_key={SECRET}", json={"city": "Rome", "password": "hunter22"},
                      headers={"Authorization": f"Bearer {SECRET}"})
        ctx.trace("called with a token", token=SECRET)
        return {"api_key": SECRET, "note": f"used {SECRET}", "internal": "ACME-7781-PRIVATE"}

    wf.edge("call", END)
    with Orchestrator(db_url, workflows=[wf], redact=[r"ACME-\d{4}-PRIVATE"]) as orc:
        result = orc.run(wf, {"api": service.url}, run_id="leak")
        assert result.status == "completed"
        texts = [e.data for e in orc.store.events("leak")] + [s.state for s in orc.store.snapshots("leak")]
    # Then neither the events nor the snapshots hold the secrets, whatever path they took
    for text in texts:
        assert SECRET not in text and "hunter22" not in text and "ACME-7781-PRIVATE" not in text
    assert any("[REDACTED]" in t for t in texts)
    # And on SQLite, not a byte of them is in the database files either
    if db_url.startswith("sqlite"):
        for path in Path(db_url.removeprefix("sqlite:///")).parent.glob("agentsaga.db*"):
            raw = path.read_bytes()
            assert SECRET.encode() not in raw and b"hunter22" not in raw, path


def test_an_open_breaker_fails_fast_and_the_graph_routes_around_it(db_url):
    # Given a step guarded by a breaker that opens after 2 failures, with a fallback route
    registry = BreakerRegistry()
    flaky = BreakerConfig(name="search-api", failure_threshold=2, reset_timeout=60)
    calls = []
    wf = Workflow("search")

    @wf.step(start=True, breaker=flaky, on_failure="cached")
    def search(ctx, state):
        calls.append(1)
        raise ConnectionError("search API is down")

    @wf.step()
    def cached(ctx, state):
        return {"source": "cache", "why": ctx.failure["type"]}

    wf.edge("search", END)
    wf.edge("cached", END)
    now = [1_000.0]
    with Orchestrator(db_url, workflows=[wf], breakers=registry, clock=lambda: now[0]) as orc:
        # When two runs fail, and a third starts
        first = [orc.run(wf, {}, run_id=f"s{i}") for i in range(3)]
        history = orc.history("s1")
    # Then the third never called the API: the breaker failed it fast, and the fallback answered
    assert len(calls) == 2
    assert [r.state for r in first] == [{"source": "cache", "why": "ConnectionError"}] * 2 + [
        {"source": "cache", "why": "orchestrator.errors.CircuitOpenError"}]
    # And the run that tripped it journaled the transition
    failed = [e["data"] for e in history if e["kind"] == "StepFailed"]
    assert failed[0]["breakers"][0]["to"] == "open"


def test_one_breaker_name_with_two_configurations_is_an_error(db_url):
    wf1, wf2 = Workflow("a"), Workflow("b")
    wf1.step(name="x", start=True, breaker=BreakerConfig(name="pay", failure_threshold=3))(lambda c, s: None)
    wf2.step(name="y", start=True, breaker=BreakerConfig(name="pay", failure_threshold=5))(lambda c, s: None)
    from compensations import BreakerConfigError

    with pytest.raises(BreakerConfigError, match="pay"):
        Orchestrator(db_url, workflows=[wf1, wf2], breakers=BreakerRegistry())


def test_the_report_and_summary_show_breaker_transitions(db_url, tmp_path):
    registry = BreakerRegistry()
    wf = Workflow("trip-breaker")

    @wf.step(start=True, breaker=BreakerConfig(name="maps", failure_threshold=1), on_failure="fallback")
    def lookup(ctx, state):
        raise ConnectionError("maps down")

    @wf.step()
    def fallback(ctx, state):
        return {"ok": True}

    wf.edge("lookup", END)
    wf.edge("fallback", END)
    with Orchestrator(db_url, workflows=[wf], breakers=registry) as orc:
        orc.run(wf, {}, run_id="br")
        summary = orc.summary("br")
        orc.report("br", tmp_path / "r.html")
    assert any(b["kind"] == "BreakerTransition" and "maps: closed -> open" in b["message"] for b in summary.breakers)
    assert "maps: closed -&gt; open" in (tmp_path / "r.html").read_text()


def test_http_responses_replay_from_a_cassette_with_no_server(db_url, tmp_path):
    from orchestrator.agents import Cassette

    def build(city: str) -> Workflow:
        wf = Workflow("replay-http")

        @wf.step(start=True)
        def look(ctx, state):
            r = ctx.http.post(f"{state['api']}/hotels", json={"city": city})
            return {"hotel": r.json()["id"], "status": r.status_code}

        wf.edge("look", END)
        return wf

    # Given a run recorded against the live service, which then goes away
    with BookingService() as svc:
        api = svc.url
        rome = build("Rome")
        with Orchestrator(db_url, workflows=[rome]) as orc:
            recorded = orc.run(rome, {"api": api}, run_id="rec")
            cassette = Cassette.from_run(orc, "rec")
    cassette.save(tmp_path / "c.json")
    # When the same workflow runs again with the cassette (nothing listens on that port now)
    rome = build("Rome")
    with Orchestrator(f"sqlite:///{tmp_path}/replay.db", workflows=[rome],
                      replay=Cassette.load(tmp_path / "c.json")) as orc:
        replayed = orc.run(rome, {"api": api}, run_id="rep")
    # Then it gets the recorded responses
    assert replayed.status == "completed" and replayed.state == recorded.state
    # And a different request is a clear error showing the difference
    oslo = build("Oslo")
    with Orchestrator(f"sqlite:///{tmp_path}/replay2.db", workflows=[oslo], replay=cassette) as orc:
        bad = orc.run(oslo, {"api": api}, run_id="rep2")
    assert bad.status == "failed" and "Oslo" in bad.error and "Rome" in bad.error


def test_ctx_ahttp_trips_the_shared_breaker_and_then_fails_fast_without_a_request(db_url):
    # Given a server that answers 503, and an async step calling it through ctx.ahttp
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    hits = []

    class Down(BaseHTTPRequestHandler):
        def do_GET(self):
            hits.append(self.path)
            self.send_response(503)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Down)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    host = f"127.0.0.1:{server.server_address[1]}"
    registry = BreakerRegistry()
    registry.declare(BreakerConfig(name=host, failure_threshold=2, reset_timeout=60))
    wf = Workflow("ahttp-breaker")

    @wf.step(start=True, on_failure="fallback")
    async def fetch(ctx, state):
        await ctx.ahttp.get(f"http://{host}/status")
        return {"source": "live"}

    @wf.step()
    def fallback(ctx, state):
        return {"source": "fallback", "why": ctx.failure["type"]}

    wf.edge("fetch", END)
    wf.edge("fallback", END)
    try:
        with Orchestrator(db_url, workflows=[wf], breakers=registry, clock=lambda: 1_000.0) as orc:
            # When three runs call it, one after the other
            results = [orc.run(wf, {}, run_id=f"a{i}") for i in range(3)]
            failed = [e["data"] for e in orc.history("a1") if e["kind"] == "StepFailed"]
    finally:
        server.shutdown()
    # Then two requests reached the server; the second tripped the breaker (journaled), and the
    # third run failed fast without a request
    assert len(hits) == 2
    assert [r.state["why"] for r in results] == ["orchestrator.errors.RetryableToolError"] * 2 + [
        "orchestrator.errors.CircuitOpenError"]
    assert [(t["from"], t["to"]) for t in failed[0]["breakers"]] == [("closed", "open")]


def test_a_steps_retry_waits_an_open_breaker_out_instead_of_spending_its_attempts(orc_factory, fake_time):
    # Given a step guarded by a breaker that opens after 2 failures for 30 s, a service that fails
    # twice then works, and a step policy of 4 quick retries (well under the breaker's reset)
    from workflows import Retry

    flaky = BreakerConfig(name="pricing", failure_threshold=2, reset_timeout=30)
    calls: list[float] = []
    wf = Workflow("wait-it-out")

    @wf.step(start=True, breaker=flaky, retry=Retry(attempts=4, initial=0.5, jitter=False))
    def price(ctx, state):
        calls.append(fake_time.clock())
        if len(calls) <= 2:
            raise ConnectionError("pricing is down")
        return {"price": 42}

    wf.edge("price", END)
    orc = orc_factory(wf, breakers=BreakerRegistry())
    # When the run is driven
    result = orc.run(wf, {}, run_id="w1")
    # Then the attempt that met the open breaker failed fast, the next one waited until the breaker
    # let a probe through (not the policy's 2 s), and completed: the retries were not spent in vain
    assert result.status == "completed" and result.state == {"price": 42}
    assert len(calls) == 3 and calls[2] - calls[1] >= 30
    failed = [e["data"] for e in orc.history("w1") if e["kind"] == "StepFailed"]
    assert [f["error"]["type"] for f in failed] == ["ConnectionError", "ConnectionError",
                                                   "orchestrator.errors.CircuitOpenError"]
    assert failed[2]["retry_in"] >= 28 and failed[0]["retry_in"] < 5


def test_a_compensation_waits_out_the_breaker_its_failing_step_opened(orc_factory, fake_time):
    # Given a flight booked (an effect with a compensation) and a payment to the same host that keeps
    # answering 503, so its retries open the host's breaker; cancelling a flight works all along
    from workflows import Retry

    def cancel(ctx, effect):
        ctx.http.delete(effect.result["href"])

    wf = Workflow("brk-saga")

    @wf.step(start=True, compensate=cancel)
    def book(ctx, state):
        reply = ctx.http.post(f"{state['api']}/flights", json={"to": "Lisbon"})
        return {"href": f"{state['api']}/flights/{reply.json()['id']}"}

    @wf.step(retry=Retry(attempts=5, initial=0.05, max_backoff=0.2, jitter=False))
    def pay(ctx, state):
        ctx.http.post(f"{state['api']}/payments", json={"amount": 10})
        return {"paid": True}

    wf.edge("book", "pay")
    wf.edge("pay", END)
    with BookingService() as service:
        service.fail_payments(503)
        orc = orc_factory(wf, breakers=BreakerRegistry())
        # When the run fails at the payment and its saga compensates the flight
        result = orc.run(wf, {"api": service.url}, run_id="b1")
        history = orc.history("b1")
        ledger = service.ledger()
    # Then the compensation that met the open breaker waited until it let a probe through (instead of
    # spending its attempts failing fast), and the flight was cancelled: the run is compensated
    assert result.status == "compensated", result.error
    failed = [e["data"] for e in history if e["kind"] == "CompensationFailed"]
    assert failed and failed[0]["error"]["type"] == "orchestrator.errors.CircuitOpenError"
    assert failed[0]["retry_in"] >= 1  # the breaker's reset, not the policy's sub-second backoff
    assert [e["kind"] for e in history if e["kind"].startswith("Compensation")][-1] == "CompensationCompleted"
    booked = [e["id"] for e in ledger if e["action"] == "book"]
    assert len(booked) == 1 and [e["id"] for e in ledger if e["action"] == "cancel"] == booked, ledger


def test_compensate_after_an_outage_waits_out_the_breaker_the_outage_left_open(orc_factory, fake_time):
    # Given a booking whose cancellation endpoint is down (503) for as long as the saga tries (its
    # 5 attempts open the host's breaker: 5 failures), so the run ends compensation_failed
    import json
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    down = threading.Event()
    down.set()
    cancelled: list[str] = []

    class Bookings(BaseHTTPRequestHandler):
        def _answer(self, status: int, body: dict | None = None) -> None:
            data = json.dumps(body or {}).encode()
            self.send_response(status)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_POST(self):
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            self._answer(201, {"id": "f1"})

        def do_DELETE(self):
            if down.is_set():
                self._answer(503)
            else:
                cancelled.append(self.path)
                self._answer(200)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Bookings)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    api = f"http://127.0.0.1:{server.server_address[1]}"
    wf = Workflow("outage-then-compensate")

    @wf.step(start=True, compensate=lambda ctx, effect: ctx.http.delete(f"{api}/flights/{effect.result['id']}"))
    def book(ctx, state):
        return {"id": ctx.http.post(f"{api}/flights", json={"to": "Oslo"}).json()["id"]}

    @wf.step()
    def pay(ctx, state):
        raise ValueError("card declined")

    wf.edge("book", "pay")
    wf.edge("pay", END)
    try:
        orc = orc_factory(wf, breakers=BreakerRegistry())
        assert orc.run(wf, {}, run_id="o1").status == "compensation_failed"
        # When the outage is over and the operator runs compensate straight away
        down.clear()
        result = orc.compensate("o1")
        history = orc.history("o1")
    finally:
        server.shutdown()
    # Then its first attempt met the breaker the outage left open and waited until it let a probe
    # through, instead of failing at once with the earlier attempts spent: the flight is cancelled
    assert result.status == "compensated", result.error
    assert cancelled == ["/flights/f1"]
    failed = [e["data"] for e in history if e["kind"] == "CompensationFailed"]
    assert [f["error"]["type"] for f in failed][-1] == "orchestrator.errors.CircuitOpenError"
    assert failed[-1]["final"] is False and failed[-1]["retry_in"] >= 1
