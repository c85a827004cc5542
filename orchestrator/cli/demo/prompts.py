"""The demo agent's prompts (jinja2; a missing variable is an error before any model call).

The scripted model (``model.py``) recognises each request by these texts, so a change here is
a change there too.
"""

from __future__ import annotations

from orchestrator.agents import Prompt

__all__ = ["PLANNER", "PLAN", "RESEARCH", "ANSWER"]

PLANNER = Prompt("You are a planner for event logistics. Reply with JSON only: "
                 '{"city": str, "min_capacity": int, "criteria": [str]}.', name="planner", role="system")
PLAN = Prompt("Request: {{ request }}\nCity: {{ city }}\nAttendees: {{ attendees }}", name="plan")
RESEARCH = Prompt("Find the best venue in {{ plan.city }} for at least {{ plan.min_capacity }} people.\n"
                  "Criteria: {{ plan.criteria | join(', ') }}.\nUse the tools. When you have chosen, reply "
                  'with JSON only: {"venue_id": str, "why": str}.', name="research")
ANSWER = Prompt("Write two sentences for the organiser. Request: {{ request }}. Venue: {{ venue.name }} "
                "({{ venue.id }}). {% if booking %}Booking {{ booking.id }} is confirmed.{% else %}"
                "Nothing was booked: {{ reason }}.{% endif %}", name="answer")
