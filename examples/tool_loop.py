"""A durable tool-calling loop: the model asks for tools, the tools run, the model answers.

    OPENAI_BASE_URL=... OPENAI_MODEL=... OPENAI_API_KEY=... python examples/tool_loop.py

Kill it at any moment and run the same command again: run "umbrella" continues where it stopped,
and no model call whose answer was journaled is made (or paid for) again. The database is
$AGENTSAGA_DB, else agentsaga.db in the working directory. docs/examples.md counts its lines.
A loop inside a step of your own: run_tool_loop (docs/agents.md).
"""

from orchestrator import Orchestrator
from orchestrator.agents import tool_agent


def weather(city: str) -> str:
    """Today's weather in a city."""
    return f"rain all day in {city}"


agent = tool_agent("umbrella", [weather])

if __name__ == "__main__":
    result = Orchestrator().run(agent, {"question": "Do I need an umbrella in Lisbon today?"}, run_id="umbrella")
    print(result.state["answer"])
