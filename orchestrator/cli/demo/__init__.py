"""``agentsaga demo``, shipped in the package so that it runs from an installed wheel.

One idea per module:

* ``agent``: the research-and-book agent, written as a user would write it (public names only);
* ``prompts``: its jinja2 prompts;
* ``model``: the scripted model that answers them offline;
* ``verb``: the ``demo`` verb, the story it tells and the commands it prints;
* ``child``: the child process that runs the agent and SIGKILLs itself
  (``python -m orchestrator.cli.demo.child --child ...``);
* ``steps``: the step table the demo prints, read from the journal alone.

The booking service and the chat server it talks to are the public test doubles of
``orchestrator.testing``. Only the verb is imported here: importing the agent reads the model's
address from the environment, which the verb sets up first.
"""

from orchestrator.cli.demo.verb import add_demo_verb, cmd_demo

__all__ = ["add_demo_verb", "cmd_demo"]
