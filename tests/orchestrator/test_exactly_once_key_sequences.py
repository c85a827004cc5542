"""Invariant 4 across crashes and retries, enumerated: every sequence of up to three attempt endings
of one effect step (dying before its key left, after it left, after the service acted; failing
after the service acted; succeeding), each death followed by a resume in a fresh Orchestrator.

The step uses the default in-doubt rule (no check hook, no ``resend``): a resume re-sends with the
same key when that key had left the process in any attempt of this execution, and fails the step
as in doubt only when it never had. Whatever the sequence: one key for the whole execution, the
service never charged twice, a crash never leaves the run failed in doubt while a charge stands,
and a run whose retries ran out after the service acted says that its charge may stand.
On SQLite and Postgres.
"""

from __future__ import annotations

import itertools
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from exactly_once_helpers import Died  # noqa: E402

from workflows import END, Retry, Workflow  # noqa: E402

#: how an attempt of the step ends
ENDINGS = ("die-before-key", "die-after-key", "die-after-send", "fail-after-send", "ok")


def sequences() -> list[tuple[str, ...]]:
    """Every sequence of up to three endings that a run can meet: it stops at the first success, and
    a third ending is only reached when the second did not end the execution."""
    out = []
    for n in (1, 2, 3):
        for seq in itertools.product(ENDINGS, repeat=n):
            if "ok" in seq[:-1]:
                continue
            out.append(seq)
    return out


class Service:
    """The outside world: charges by idempotency key; a repeated key is answered, not charged again."""

    def __init__(self) -> None:
        self.charged: dict[str, int] = {}
        self.requests: list[str] = []

    def charge(self, key: str) -> None:
        self.requests.append(key)
        self.charged.setdefault(key, len(self.charged) + 1)


def flow(service: Service, endings: list[str]) -> Workflow:
    wf = Workflow("keyed-sequence")

    @wf.step(start=True, effect=True, retry=Retry(attempts=3, initial=0.001, jitter=False))
    def charge(ctx, state):
        ending = endings.pop(0) if endings else "ok"
        if ending == "die-before-key":
            raise Died
        key = ctx.idempotency_key  # the key leaves the process (KeyIssued is journaled first)
        if ending == "die-after-key":
            raise Died
        service.charge(key)
        if ending == "die-after-send":
            raise Died
        if ending == "fail-after-send":
            raise ConnectionError("the service took it, then the connection dropped")
        return {"charged": key}

    @wf.step()
    def confirm(ctx, state):
        return {"confirmed": True}

    wf.edge("charge", "confirm")
    wf.edge("confirm", END)
    return wf


@pytest.mark.parametrize("seq", [pytest.param(s, id="+".join(s)) for s in sequences()])
def test_every_sequence_of_attempt_endings_keeps_one_key_and_never_leaves_a_charge_in_doubt(orc_factory, seq):
    # Given an effect step whose attempts end as ``seq`` says, each death followed by a resume
    service = Service()
    endings = list(seq)
    wf = flow(service, endings)
    result = None
    for round_ in range(len(seq) + 2):
        orc = orc_factory(wf)
        try:
            result = orc.run(wf, {}, run_id="k") if round_ == 0 else orc.resume("k")
        except Died:
            continue
        break
    assert result is not None, f"the run never ended after {seq}"
    # Then the whole execution used one key, and the service charged it at most once
    assert len(service.charged) <= 1, service.charged
    assert set(service.requests) <= {"k:charge:0"}
    left = [i for i, e in enumerate(seq) if e != "die-before-key"]  # attempts whose key left
    if seq == ("fail-after-send",) * 3:
        # the step's retries ran out, each attempt failing after the service acted: the run fails with
        # the step's own error and says that the charge, by its key, may have taken effect
        assert result.status == "failed", (seq, result.status)
        assert result.error.startswith("orchestrator.errors.InDoubtError: ") and "ConnectionError" in result.error
        assert "charge (key k:charge:0)" in result.error
        assert service.requests == ["k:charge:0"] * 3
    elif result.status == "failed" and "InDoubtError" in result.error:
        # in doubt only when no attempt's key had left before the one that died without sending it
        first_death_before_key = seq.index("die-before-key")
        assert not any(i < first_death_before_key for i in left), (seq, result.error)
        assert not service.charged  # and then nothing was charged: nothing stands undone
    else:
        # it completed, with the one charge
        assert result.status == "completed", (seq, result.status, result.error)
        assert result.state["charged"] == "k:charge:0" and service.charged == {"k:charge:0": 1}
