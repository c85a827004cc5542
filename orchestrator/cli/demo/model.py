"""The demo's scripted model: answers like a capable model would, from the conversation alone.

Served by ``orchestrator.testing.ChatServer`` when no real model is configured. It keeps no
memory between calls, so a resumed run gets the same answers whatever was replayed before.
"""

from __future__ import annotations

import json
import re
from typing import Any

from orchestrator.testing import reply, tool_call

__all__ = ["scripted_model"]


def scripted_model(body: dict[str, Any], n: int) -> Any:
    """The reply to one chat request (``n``, the request's number, is not needed: no memory)."""
    messages = body.get("messages") or []
    first = str(messages[0].get("content") or "") if messages else ""
    if first.startswith("You are a planner"):
        return _plan(str(messages[-1].get("content") or ""))
    if body.get("tools"):
        return _research(first, [m for m in messages if m.get("role") == "tool"])
    return _answer(str(messages[-1].get("content") or ""))


def _plan(text: str) -> Any:
    city = re.search(r"City: (.+)", text)
    people = re.search(r"Attendees: (\d+)", text)
    return reply(json.dumps({"city": city.group(1).strip() if city else "Lisbon",
                             "min_capacity": int(people.group(1)) if people else 1,
                             "criteria": ["capacity", "rating", "price"]}))


def _research(ask: str, results: list[dict[str, Any]]) -> Any:
    """Search, then read the cheapest fitting venue's details, then recommend it."""
    if not results:
        wanted = re.search(r"venue in (.+?) for at least (\d+)", ask)
        return tool_call("search_venues", {"city": wanted.group(1) if wanted else "Lisbon",
                                           "min_capacity": int(wanted.group(2)) if wanted else 1})
    found = json.loads(results[0]["content"])
    if not found:
        return reply(json.dumps({"venue_id": None, "why": "nothing fits"}))
    best = min(found, key=lambda v: v["price"])
    if len(results) == 1:
        return tool_call("venue_details", {"venue_id": best["id"]})
    details = json.loads(results[-1]["content"])
    return reply(json.dumps({"venue_id": best["id"], "why": f"cheapest that fits, rated {details.get('rating')}"}))


def _answer(text: str) -> Any:
    venue = re.search(r"Venue: (.+?) \(", text)
    booking = re.search(r"Booking (\S+) is confirmed", text)
    name = venue.group(1) if venue else "the venue"
    if booking:
        return reply(f"{name} is booked for your event (booking {booking.group(1)}). "
                     "It was the best-priced venue with room for everyone.")
    return reply(f"{name} fits your event, but nothing was booked. Approve the booking to go ahead.")
