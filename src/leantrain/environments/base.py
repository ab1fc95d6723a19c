"""What a user subclasses for a multi-turn episode (``Environment``, or ``ToolEnvironment`` for the tool-calling
loop ready made), and how leantrain loads it from ``FILE.py:Class`` or ``module:Class``.

An episode: ``reset(row)`` gives the opening messages; the model writes a completion; ``step(messages,
completion)`` answers with the messages that follow it (tool results), a reward or None, and whether the episode is
done; until done, the model writes its next turn after those messages. leantrain makes one instance per episode
with no arguments, sets ``tool_format`` (the chat template's, or ``hermes``) and ``tool_timeout`` on it, and calls
``_begin()`` before ``reset``; ``stats`` and ``errors`` are read for the log after the episode.
"""

from __future__ import annotations

import inspect

from leantrain.environments.tool_calls import MalformedToolCall, parse_tool_calls
from leantrain.environments.tools import run_tool, tool_schema
from leantrain.errors import ConfigError
from leantrain.environments.user_code import load_module


class Environment:
    """One episode of a multi-turn task. Subclass it and override ``reset`` and/or ``step``; ``tools`` are the
    Python functions the model may call (their schemas go into the prompt; see ``ToolEnvironment`` to run them)."""

    tools: tuple = ()
    tool_format: str = "hermes"  # the tool-call format completions are parsed in (set by leantrain)
    tool_timeout: float = 10.0  # seconds one tool call may run (set by leantrain)

    def __init__(self) -> None:
        self._begin()

    def _begin(self) -> None:
        """The episode's counters, from zero."""
        self.stats = {"tool_calls": 0, "tool_errors": 0}
        self.errors: list[str] = []  # the tool errors' texts, for the log

    def reset(self, row: dict) -> list[dict]:
        """The episode's opening messages, from a data row (all of its columns). Default: the row's ``prompt``, a
        text (one user message) or a list of messages.

        It must be a function of the row: it is called when the data is prepared and again at the start of every
        episode, and the environment's state is not checkpointed, so randomness comes from the row (e.g. a
        ``random.Random(row["seed"])``), never from a generator kept between episodes."""
        if "prompt" not in row:
            raise ValueError(f"{type(self).__name__}.reset: the row has no 'prompt' (its columns: "
                             f"{', '.join(row) or 'none'}); override reset(self, row) to build the opening messages")
        prompt = row["prompt"]
        if isinstance(prompt, str):
            return [{"role": "user", "content": prompt}]
        if isinstance(prompt, (list, tuple)) and all(isinstance(m, dict) for m in prompt):
            return [dict(m) for m in prompt]
        raise ValueError(f"{type(self).__name__}.reset: the row's 'prompt' is a {type(prompt).__name__}, not a text "
                         "or a list of messages; override reset(self, row) to build the opening messages")

    def step(self, messages: list[dict], completion: str) -> tuple[list[dict], float | None, bool]:
        """The answer to the model's new ``completion`` (its text), given the conversation before it (the opening
        messages and earlier turns, not yet this completion): (the messages to append after the assistant's turn,
        a reward or None, done). Default: a single turn, done, the reward functions score the answer."""
        return [], None, True


class ToolEnvironment(Environment):
    """The tool-calling loop: each completion's tool calls are run and their results given back as ``tool``
    messages; a completion without a call ends the episode with ``reward``. A malformed call is answered with an
    error message the model can act on, not a crash; every tool problem is counted in ``stats`` and ``errors``."""

    def reset(self, row: dict) -> list[dict]:
        """Keeps the row as ``self.row`` (for ``reward``), then the opening messages as Environment's."""
        self.row = row
        return super().reset(row)

    def step(self, messages: list[dict], completion: str) -> tuple[list[dict], float | None, bool]:
        try:
            calls = parse_tool_calls(completion, self.tool_format)
        except MalformedToolCall as e:
            self.stats["tool_errors"] += 1
            self.errors.append(str(e))
            return [{"role": "tool", "name": "error", "content": f"error: {e}"}], None, False
        if not calls:
            return [], self.reward(messages, completion), True
        tools = {f.__name__: f for f in self.tools}
        out = []
        for call in calls:
            result = run_tool(tools, call.name, call.arguments, self.tool_timeout)
            self.stats["tool_calls"] += 1
            if result.error is not None:
                self.stats["tool_errors"] += 1
                self.errors.append(f"{call.name}: {result.error}")
            out.append({"role": "tool", "name": call.name, "content": result.content})
        return out, None, False

    def reward(self, messages: list[dict], completion: str) -> float | None:
        """The reward of the final answer ``completion`` (``self.row`` holds the episode's row). Default None: the
        ``grpo.rewards`` functions score it."""
        return None


def schemas(env_class: type[Environment]) -> list[dict]:
    """The JSON schemas of an environment's tools, for the chat template's ``tools``."""
    return [tool_schema(f) for f in env_class.tools]


def load_environment(spec: str, key: str) -> type[Environment]:
    """The Environment class of ``FILE.py:ClassName`` or ``module:ClassName``, checked: a subclass of Environment,
    made with no arguments, every tool with a schema; else a ConfigError naming ``key``."""
    where, sep, name = spec.rpartition(":")
    if not sep or not where or not name:
        raise ConfigError(f"{key}: not FILE.py:ClassName or module:ClassName (e.g. my_env.py:Calculator)")
    module = load_module(where, key, "environment", "FILE.py:ClassName")
    env_class = getattr(module, name, None)
    if env_class is None:
        defined = sorted(n for n, v in vars(module).items()
                         if inspect.isclass(v) and issubclass(v, Environment) and v.__module__ == module.__name__)
        raise ConfigError(f"{key}: {where} has no {name!r}; its environments: {', '.join(defined) or 'none'}")
    if not inspect.isclass(env_class):
        raise ConfigError(f"{key}: {where}'s {name!r} is a {type(env_class).__name__}, not a class")
    if not issubclass(env_class, Environment):
        raise ConfigError(f"{key}: {name} is not an environment; subclass leantrain.environments.Environment or "
                          "ToolEnvironment")
    try:
        env_class()
    except Exception as e:
        raise ConfigError(f"{key}: {name}() fails ({type(e).__name__}: {e}); leantrain makes one instance per "
                          "episode with no arguments") from e
    names = [getattr(f, "__name__", repr(f)) for f in env_class.tools]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ConfigError(f"{key}: two tools are named {twice[0]!r}; the model calls a tool by its name")
    try:
        schemas(env_class)
    except ConfigError as e:
        raise ConfigError(f"{key}: {e}") from None
    return env_class
