"""Multi-turn environments for RL with tools: a class whose ``reset`` opens an episode from a data row and whose
``step`` answers each completion (tool results, a reward, done), with Python functions as the model's tools.

An environment in a file (``grpo.environment=calc_env.py:Calculator``)::

    from leantrain.environments import ToolEnvironment


    def multiply(a: float, b: float) -> float:
        \"\"\"Multiply two numbers.

        Args:
            a: the first number
            b: the second number
        \"\"\"
        return a * b


    class Calculator(ToolEnvironment):
        tools = (multiply,)

        def reward(self, messages, completion):
            return float(completion.strip() == str(self.row["answer"]))  # the row's answer column

What maps to what: verifiers' ``MultiTurnEnv`` / ``ToolEnv`` (``env_response`` is ``step``'s messages,
``is_completed`` its ``done``), OpenEnv's ``reset`` / ``step``, TRL's ``environment_factory`` (a class made per
episode) and ``rollout_func`` (here the loop is leantrain's, the environment only answers turns).

``tools.py`` holds the tool schemas and the guarded tool call, ``tool_calls.py`` the tool-call formats of chat
templates (hermes, llama, mistral), ``base.py`` the classes and their loading.
"""

from leantrain.environments.base import Environment, ToolEnvironment, load_environment, schemas
from leantrain.environments.tool_calls import (FALLBACK_FORMAT, MalformedToolCall, ToolCall, call_format, parse_tool_calls,
                                               template_format)
from leantrain.environments.tools import ToolResult, run_tool, tool_schema

__all__ = ["FALLBACK_FORMAT", "Environment", "MalformedToolCall", "ToolCall", "ToolEnvironment", "ToolResult", "call_format",
           "load_environment", "parse_tool_calls", "run_tool", "schemas", "template_format", "tool_schema"]
