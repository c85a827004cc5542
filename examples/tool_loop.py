"""A durable tool-calling loop: the model asks for tools, the tools run, the model answers.

    OPENAI_BASE_URL=... OPENAI_MODEL=... OPENAI_API_KEY=... python examples/tool_loop.py

Kill it at any moment and run the same command again: run "umbrella" continues where it stopped,
and no model call whose answer was journaled is made (or paid for) again. The database is
$AGENTSAGA_DB, else agentsaga.db in the working directory. docs/examples.md counts its lines.
"""

from orchestrator import Orchestrator
from orchestrator.agents import LLM, run_tool_loop
from workflows import Workflow

agent = Workflow("umbrella")


def weather(city: str) -> str:
    """Today's weather in a city."""
    return f"rain all day in {city}"


@agent.step
def ask(ctx, state):
    return {"answer": run_tool_loop(ctx, LLM(), state["question"], [weather]).content}


if __name__ == "__main__":
    result = Orchestrator().run(agent, {"question": "Do I need an umbrella in Lisbon today?"}, run_id="umbrella")
    print(result.state["answer"])
