"""A request that carries its own ``Idempotency-Key`` header sends that key (an explicit header
wins, docs/sagas.md), and its journaled record names that key: the one the service saw, which an
operator looks up. It used to name the key the engine would have sent."""

from __future__ import annotations

from orchestrator.testing import BookingService
from workflows import END, Workflow


def flow() -> Workflow:
    wf = Workflow("explicit-key")

    def refund(ctx, effect):
        ctx.http.delete(f"{effect.result['api']}/payments/{effect.result['payment']}",
                        headers={"Idempotency-Key": f"refund-{effect.result['payment']}"})

    @wf.step(start=True, effect=True, resend=True, compensate=refund)
    def pay(ctx, state):
        answer = ctx.http.post(f"{state['api']}/payments", json={"amount": 5},
                               headers={"Idempotency-Key": "order-42"}).json()
        return {"payment": answer["id"], "api": state["api"]}

    @wf.step
    def fail(ctx, state):
        raise ValueError("the order was withdrawn")

    wf.edge("pay", "fail")
    wf.edge("fail", END)
    return wf


def test_the_record_names_the_key_the_request_carried(orc_factory):
    wf = flow()
    orc = orc_factory(wf)
    with BookingService() as service:
        # Given a payment sent with the caller's own key, then a failure that refunds it with its own key
        result = orc.run(wf, {"api": service.url}, run_id="ek")
        sent = [(e["action"], e.get("idempotency_key")) for e in service.ledger() if e.get("kind") == "payment"]
    assert result.status == "compensated", result.error
    # Then the service saw the caller's keys
    assert sent == [("book", "order-42"), ("cancel", "refund-payment-1")]
    # And the journal's records name those keys, for the step's call and for the compensation's
    history = orc.history("ek")
    [step] = [e["data"] for e in history if e["kind"] == "StepCompleted" and e["data"]["step"] == "pay"]
    [undo] = [e["data"] for e in history if e["kind"] == "CompensationCompleted"]
    assert [c["idempotency_key"] for c in step["calls"]] == ["order-42"]
    assert [c["idempotency_key"] for c in undo["calls"]] == ["refund-payment-1"]
