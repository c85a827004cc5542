"""A ``ctx.http`` response larger than the journal keeps (1 MiB) is handed to the step live and
journaled as no call at all: a step that runs again sends that request again, with the same
idempotency key, and the requests after it keep their positions and their journaled responses.

It used to be journaled as a failed call: the step, run again in the same attempt (woken from a
wait, or resumed after a crash), met that "failure" instead of the response and the run failed.
"""

from __future__ import annotations

import http.server
import threading

import pytest

from orchestrator import Orchestrator
from orchestrator.agents import Cassette
from orchestrator.tools.http import MAX_DURABLE_BODY
from workflows import END, Workflow

BIG = MAX_DURABLE_BODY + 1024


@pytest.fixture
def service():
    """A loopback service: GET /big answers a body over the journal's limit, POST /book a small one;
    ``seen`` lists (method, path, Idempotency-Key) of every request served."""
    seen: list[tuple[str, str, str | None]] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def _answer(self, body: bytes) -> None:
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:  # noqa: N802
            seen.append(("GET", self.path, self.headers.get("Idempotency-Key")))
            self._answer(b"x" * BIG)

        def do_POST(self) -> None:  # noqa: N802
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            seen.append(("POST", self.path, self.headers.get("Idempotency-Key")))
            self._answer(b'{"booking": "b-1"}')

        def log_message(self, *args) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_port}", seen
    finally:
        server.shutdown()
        server.server_close()


def flow(base: str, *, effect: bool, is_async: bool) -> Workflow:
    wf = Workflow("large-response")
    options = {"start": True, "effect": effect, "resend": True if effect else None}

    if is_async:
        @wf.step(**options)
        async def fetch(ctx, state):
            size = len((await ctx.ahttp.get(f"{base}/big")).text)
            booking = (await ctx.ahttp.post(f"{base}/book", json={"room": "A"})).json()["booking"]
            go = ctx.wait_for("go")
            return {"size": size, "booking": booking, "go": go}
    else:
        @wf.step(**options)
        def fetch(ctx, state):
            size = len(ctx.http.get(f"{base}/big").text)
            booking = ctx.http.post(f"{base}/book", json={"room": "A"}).json()["booking"]
            go = ctx.wait_for("go")
            return {"size": size, "booking": booking, "go": go}

    wf.edge("fetch", END)
    return wf


@pytest.mark.parametrize("is_async", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("effect", [False, True], ids=["plain-step", "effect-step"])
def test_a_response_too_large_to_journal_is_fetched_again_when_the_step_runs_again(orc_factory, service, effect,
                                                                                   is_async):
    base, seen = service
    wf = flow(base, effect=effect, is_async=is_async)
    orc = orc_factory(wf)
    # Given a step that got a response over the journal's limit, then a small one, and now waits
    first = orc.run(wf, {}, run_id="big-1")
    assert first.status == "waiting"
    assert [m for m, _, _ in seen] == ["GET", "POST"]
    calls = [e["data"] for e in orc.history("big-1") if e["kind"] in ("CallCompleted", "CallFailed")]
    assert [(c["index"], c["kind"]) for c in calls] == [(1, "http")]  # the big one is no call of the journal
    assert not any(e["kind"] == "CallFailed" for e in orc.history("big-1"))
    # When its signal arrives and the step runs again from its first line
    orc.signal("big-1", "go", {"ok": True})
    result = orc.resume("big-1")
    # Then it completes: the big request was sent again with the same key, the booking was not
    assert result.status == "completed", result.error
    assert result.state == {"size": BIG, "booking": "b-1", "go": {"ok": True}}
    assert [m for m, _, _ in seen] == ["GET", "POST", "GET"]
    assert seen[2][2] == seen[0][2]
    assert not any(e["kind"] == "CallFailed" for e in orc.history("big-1"))


def test_replaying_a_run_whose_response_was_too_large_names_the_limit(db_url, orc_factory, service):
    base, seen = service
    wf = flow(base, effect=False, is_async=False)
    orc = orc_factory(wf)
    # Given a run that got a response over the journal's limit (not journaled) and a small one
    assert orc.run(wf, {}, run_id="big-rec").status == "waiting"
    cassette = Cassette.from_run(orc, "big-rec")
    assert [(c["index"], c["kind"]) for c in cassette.calls] == [(1, "http")]
    served = len(seen)
    # When the run is replayed from its cassette
    with Orchestrator(db_url, workflows=[wf], replay=cassette) as replaying:
        result = replaying.run(wf, {}, run_id="big-replay")
    # Then the big request has no recording, and the error says why such a call never has one
    assert result.status == "failed" and "ReplayMissingError" in result.error
    assert "no recording for step 'fetch' (visit 0), http call 0" in result.error
    assert "over 1 MiB when recorded is never journaled" in result.error
    assert len(seen) == served  # a replay sends nothing
