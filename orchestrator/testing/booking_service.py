"""A scripted booking service over real HTTP on 127.0.0.1: the outside world of a saga, for tests.

It is what the examples, ``agentsaga demo`` and the crash tests book against, and what your own
saga tests can book against too: it honours ``Idempotency-Key`` and keeps a ledger of every side
effect, so a test can count them. In the test's own process:

    from orchestrator.testing import BookingService

    with BookingService(ledger_path=tmp / "ledger.jsonl") as service:   # or service.start() / .stop()
        result = orc.run(trip, {"api": service.url})
        cancelled = [e["id"] for e in service.ledger() if e["action"] == "cancel"]

or as a process of its own, so that a test can SIGKILL the orchestrator and keep the service:

    python -m orchestrator.testing.booking_service --port 0 --ledger ledger.jsonl [--delay S]

which prints its base URL on the first line of stdout and serves until SIGINT or SIGTERM
(``--fail-payments 402`` or ``500:N``: payments are declined always, or fail N times;
``--fail-after-payment 500[:N]`` or ``drop[:N]``: payments are made, then answered with an error or
not answered at all).

Endpoints (JSON bodies):

* ``POST /flights``, ``/hotels``, ``/cars``, ``/payments``: book; ``201 {"id": "flight-1", ...}``.
* ``DELETE /flights/{id}`` (etc.): cancel; ``200 {"id": ..., "status": "cancelled"}``. Cancelling
  again is an idempotent ``200`` with ``"already_cancelled": true`` (a compensation retried after a
  crash must be able to repeat itself safely); an unknown id is ``404``.
* ``GET /flights/{id}`` (etc.): the booking and its status (a check hook can ask).
* ``GET /ledger``: every side effect and replay, in order, with timestamps.
* ``GET /stats``: requests served, in flight now, and the maximum in flight at once.
* ``POST /_admin/config``: ``{"payments": {"status": 402, "times": null}, "delay": 0.1}`` changes
  the failure modes of a running service (``times: null`` = always; ``payments: null`` = succeed).

Idempotency (``Idempotency-Key`` header, as Stripe does it): a repeated key on the same method and
path returns the original status and body without booking again (the ledger gets a ``replay``
entry, so a test can see a re-send happened); the same key with a different body is ``422``.
Deterministic outcomes (2xx, and a payment's 402 decline) are remembered; a 5xx is not, so a retry
with the same key really retries. Requests run concurrently; one lock makes each booking atomic.

``fail_after_payment(500)`` (or ``drop=True``) scripts the failure a client cannot tell from a
refusal: the payment is made (and remembered under its key, as a service that charged does), then
the answer is a 500 (or the connection is closed with no answer at all). The ledger gets the
``book`` (or ``replay``) entry and then ``answer_failed``.

The ledger is kept in memory and, with ``ledger_path``, appended to a JSON-lines file one whole
line per write, so a test in another process can count side effects. State (bookings, keys) lives
in memory only: a restarted service forgets them.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import signal
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

__all__ = ["BookingService"]

KINDS = {"flights": "flight", "hotels": "hotel", "cars": "car", "payments": "payment"}


class BookingService:
    """The service: start() it on a free port, book over HTTP, read its ledger, stop() it."""

    def __init__(self, *, port: int = 0, ledger_path: str | Path | None = None, delay: float = 0.0,
                 clock: Any = time.time) -> None:
        self.port = port
        self.ledger_path = Path(ledger_path) if ledger_path else None
        self.delay = delay
        self._clock = clock
        self._lock = threading.Lock()
        self._entries: list[dict[str, Any]] = []
        self._bookings: dict[str, dict[str, Any]] = {}  # id -> {"kind", "status", "body"}
        self._counters: dict[str, int] = {}
        self._keys: dict[str, tuple[str, str, str, int, dict[str, Any]]] = {}  # key -> (method, path, hash, status, body)
        self._payment_status: int | None = None  # status payments fail with; None = they succeed
        self._payment_times: int | None = None  # failures left; None = always
        self._after_status: int | None = None  # answer of a payment made (0: none, the connection closes)
        self._after_times: int | None = None  # such answers left; None = always
        self.requests = 0
        self.in_flight = 0
        self.max_in_flight = 0
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self.url: str | None = None

    # -- lifecycle -----------------------------------------------------------------------------

    def start(self) -> str:
        """Start serving in a background thread; returns the base URL (``http://127.0.0.1:PORT``)."""
        if self._httpd is not None:
            raise RuntimeError(f"booking service already running at {self.url}")
        self._httpd = ThreadingHTTPServer(("127.0.0.1", self.port), _handler(self))
        self.url = f"http://127.0.0.1:{self._httpd.server_address[1]}"
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05},
                                        name="booking-service", daemon=True)
        self._thread.start()
        return self.url

    def stop(self) -> None:
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None

    def __enter__(self) -> BookingService:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- configuration -------------------------------------------------------------------------

    def fail_payments(self, status: int = 402, times: int | None = None) -> None:
        """Make payments fail with ``status`` (402 = declined; 5xx = an outage) ``times`` times, or always."""
        if not 400 <= status <= 599:
            raise ValueError(f"fail_payments(status={status!r}) must be an HTTP error status (400-599)")
        with self._lock:
            self._payment_status, self._payment_times = status, times

    def succeed_payments(self) -> None:
        with self._lock:
            self._payment_status = self._payment_times = None
            self._after_status = self._after_times = None

    def fail_after_payment(self, status: int = 500, times: int | None = None, *, drop: bool = False) -> None:
        """Make payments go through and then fail to answer, ``times`` times or always: the payment
        is made (or, for a known key, replayed) and the client gets ``status`` (5xx), or, with
        ``drop``, no answer at all (the connection is closed)."""
        if not drop and not 500 <= status <= 599:
            raise ValueError(f"fail_after_payment(status={status!r}) must be a 5xx status (or drop=True)")
        with self._lock:
            self._after_status, self._after_times = (0 if drop else status), times

    # -- reading -------------------------------------------------------------------------------

    def ledger(self) -> list[dict[str, Any]]:
        with self._lock:
            return [dict(e) for e in self._entries]

    def stats(self) -> dict[str, int]:
        with self._lock:
            return {"requests": self.requests, "in_flight": self.in_flight, "max_in_flight": self.max_in_flight}

    # -- the service itself (called by the handler; returns status and JSON body) --------------

    def _log(self, action: str, **fields: Any) -> None:
        entry = {"seq": len(self._entries) + 1, "at": self._clock(), "action": action, **fields}
        self._entries.append(entry)
        if self.ledger_path is not None:
            with self.ledger_path.open("a", encoding="utf-8") as fh:
                fh.write(json.dumps(entry, sort_keys=True) + "\n")  # one write: a whole line or nothing

    def handle(self, method: str, path: str, body: Any, raw: bytes, key: str | None) -> tuple[int, Any]:
        with self._lock:
            self.requests += 1
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            if self.delay:
                time.sleep(self.delay)  # outside the lock, so concurrent requests overlap
            with self._lock:
                status, reply = self._dispatch(method, path, body, raw, key)
                if self._after_status is not None and method == "POST" and path.strip("/") == "payments" \
                        and status < 300:
                    status, reply = self._answer_failed(reply, key)
                return status, reply
        finally:
            with self._lock:
                self.in_flight -= 1

    def _answer_failed(self, reply: Any, key: str | None) -> tuple[int, Any]:
        """The payment was made (or replayed); its answer fails as scripted (status 0: no answer)."""
        status = self._after_status
        assert status is not None
        if self._after_times is not None:
            self._after_times -= 1
            if self._after_times <= 0:
                self._after_status = self._after_times = None
        self._log("answer_failed", kind="payment", id=(reply or {}).get("id"), status=status or None,
                  dropped=status == 0, idempotency_key=key)
        return status, (None if status == 0 else {"error": "internal error after the payment was made"})

    def _dispatch(self, method: str, path: str, body: Any, raw: bytes, key: str | None) -> tuple[int, Any]:
        parts = [p for p in path.split("/") if p]
        if method == "GET" and parts == ["ledger"]:
            return 200, [dict(e) for e in self._entries]
        if method == "GET" and parts == ["stats"]:
            return 200, {"requests": self.requests, "in_flight": self.in_flight, "max_in_flight": self.max_in_flight}
        if method == "POST" and parts == ["_admin", "config"]:
            return self._configure(body)
        if not parts or parts[0] not in KINDS or len(parts) > 2:
            return 404, {"error": f"no endpoint {method} {path}"}
        if key is not None:
            digest = hashlib.sha256(raw).hexdigest()
            seen = self._keys.get(key)
            if seen is not None:
                if seen[:3] != (method, path, digest):
                    return 422, {"error": f"Idempotency-Key {key!r} was used for {seen[0]} {seen[1]} "
                                          "with other parameters"}
                self._log("replay", kind=KINDS[parts[0]], id=seen[4].get("id"), idempotency_key=key)
                return seen[3], seen[4]
        status, reply = self._effect(method, parts, body, key)
        if key is not None and (status < 300 or status == 402):
            self._keys[key] = (method, path, hashlib.sha256(raw).hexdigest(), status, reply)
        return status, reply

    def _effect(self, method: str, parts: list[str], body: Any, key: str | None) -> tuple[int, Any]:
        kind = KINDS[parts[0]]
        if method == "POST" and len(parts) == 1:
            if not isinstance(body, dict):
                return 400, {"error": f"POST /{parts[0]} needs a JSON object body"}
            if kind == "payment" and self._payment_status is not None:
                status = self._payment_status
                if self._payment_times is not None:
                    self._payment_times -= 1
                    if self._payment_times <= 0:
                        self._payment_status = self._payment_times = None
                self._log("payment_failed", kind=kind, status=status, idempotency_key=key)
                why = "card declined" if status == 402 else "payment processor unavailable"
                return status, {"error": why}
            self._counters[kind] = self._counters.get(kind, 0) + 1
            booking_id = f"{kind}-{self._counters[kind]}"
            self._bookings[booking_id] = {"kind": kind, "status": "booked", "body": body}
            self._log("book", kind=kind, id=booking_id, body=body, idempotency_key=key)
            return 201, {"id": booking_id, "status": "booked", **body}
        if method == "DELETE" and len(parts) == 2:
            booking = self._bookings.get(parts[1])
            if booking is None or booking["kind"] != kind:
                return 404, {"error": f"no {kind} {parts[1]!r}"}
            if booking["status"] == "cancelled":
                self._log("cancel_repeat", kind=kind, id=parts[1], idempotency_key=key)
                return 200, {"id": parts[1], "status": "cancelled", "already_cancelled": True}
            booking["status"] = "cancelled"
            self._log("cancel", kind=kind, id=parts[1], idempotency_key=key)
            return 200, {"id": parts[1], "status": "cancelled"}
        if method == "GET" and len(parts) == 2:
            booking = self._bookings.get(parts[1])
            if booking is None or booking["kind"] != kind:
                return 404, {"error": f"no {kind} {parts[1]!r}"}
            return 200, {"id": parts[1], **booking}
        return 405, {"error": f"{method} not supported on /{'/'.join(parts)}"}

    def _configure(self, body: Any) -> tuple[int, Any]:
        if not isinstance(body, dict):
            return 400, {"error": "config must be a JSON object"}
        if "delay" in body:
            self.delay = float(body["delay"])
        if "payments" in body:
            payments = body["payments"]
            if payments is None:
                self._payment_status = self._payment_times = None
            else:
                self._payment_status, self._payment_times = int(payments["status"]), payments.get("times")
        return 200, {"delay": self.delay, "payments": {"status": self._payment_status, "times": self._payment_times}}


def _handler(service: BookingService) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, as a real service would
        # Headers and body go out in two writes: without TCP_NODELAY, Nagle holds the body back
        # until the client's delayed ACK (~40 ms per request on loopback).
        disable_nagle_algorithm = True

        def _serve(self) -> None:
            raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            try:
                body = json.loads(raw) if raw else None
            except ValueError:
                status, reply = 400, {"error": "body is not JSON"}
            else:
                path = self.path.split("?", 1)[0]
                status, reply = service.handle(self.command, path, body, raw, self.headers.get("Idempotency-Key"))
            if status == 0:  # scripted: the work is done, and no answer ever comes
                self.close_connection = True
                return
            data = json.dumps(reply).encode()
            try:
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the client went away (timed out, or was killed): the effect still happened

        do_GET = do_POST = do_PUT = do_DELETE = _serve

        def log_message(self, *args: Any) -> None:
            pass

    return Handler


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m orchestrator.testing.booking_service",
                                     description="A local booking service that honours Idempotency-Key.")
    parser.add_argument("--port", type=int, default=0, help="port on 127.0.0.1 (0: any free port)")
    parser.add_argument("--ledger", help="append the ledger to this JSON-lines file")
    parser.add_argument("--delay", type=float, default=0.0, help="seconds to wait before each response")
    parser.add_argument("--fail-payments", metavar="STATUS[:N]",
                        help="payments fail with STATUS (402 declined, 5xx outage), N times or always")
    parser.add_argument("--fail-after-payment", metavar="STATUS[:N]",
                        help="payments are made, then answered with STATUS (5xx), or not at all ('drop'), "
                             "N times or always")
    args = parser.parse_args(argv)
    service = BookingService(port=args.port, ledger_path=args.ledger, delay=args.delay)
    if args.fail_payments:
        status, _, times = args.fail_payments.partition(":")
        service.fail_payments(int(status), int(times) if times else None)
    if args.fail_after_payment:
        status, _, times = args.fail_after_payment.partition(":")
        drop = status == "drop"
        try:
            service.fail_after_payment(500 if drop else int(status), int(times) if times else None, drop=drop)
        except ValueError as exc:
            parser.error(f"--fail-after-payment {args.fail_after_payment!r}: {exc}")
    stopped = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopped.set())
    print(service.start(), flush=True)
    try:
        stopped.wait()
    except KeyboardInterrupt:
        pass
    service.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
