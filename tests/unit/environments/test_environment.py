"""Environments (leantrain.environments.base): the default reset and step, ToolEnvironment's loop on a calculator
(a call answered by a tool message, a malformed call by an error message, no call ending the episode with the
reward, the counters), and load_environment's ConfigError naming the key for each way a spec can be wrong."""

from __future__ import annotations

import textwrap

import pytest

from leantrain.environments import Environment, ToolEnvironment, load_environment, schemas
from leantrain.errors import ConfigError

KEY = "grpo.environment"


def multiply(a: float, b: float) -> float:
    """Multiply two numbers.

    Args:
        a: the first number
        b: the second number
    """
    return a * b


class Calculator(ToolEnvironment):
    tools = (multiply,)

    def reward(self, messages, completion):  # noqa: ANN001, ANN201
        return float(completion.strip() == str(self.row["answer"]))


def episode() -> tuple[Calculator, list[dict]]:
    env = Calculator()
    return env, env.reset({"prompt": "What is 6 x 7?", "answer": 42})


def test_default_reset_takes_the_prompt():
    env = Environment()
    assert env.reset({"prompt": "Hi", "answer": 1}) == [{"role": "user", "content": "Hi"}]
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    assert env.reset({"prompt": messages}) == messages and env.reset({"prompt": messages})[0] is not messages[0]


@pytest.mark.parametrize("row, problem", [({"question": "Hi"}, "has no 'prompt'"), ({"prompt": 3}, "is a int")])
def test_default_reset_says_to_override_it(row, problem):
    with pytest.raises(ValueError, match=problem) as e:
        Environment().reset(row)
    assert "override reset(self, row)" in str(e.value)


def test_default_step_is_one_turn():
    assert Environment().step([{"role": "user", "content": "Hi"}], "Hello") == ([], None, True)


def test_a_new_environment_has_its_defaults_and_zero_counters():
    env = Calculator()
    assert (env.tool_format, env.tool_timeout) == ("hermes", 10.0)
    assert env.stats == {"tool_calls": 0, "tool_errors": 0} and env.errors == []


def test_a_tool_call_is_answered_by_a_tool_message():
    env, messages = episode()
    completion = '<tool_call>{"name": "multiply", "arguments": {"a": 6, "b": 7}}</tool_call>'
    assert env.step(messages, completion) == ([{"role": "tool", "name": "multiply", "content": "42"}], None, False)
    assert env.stats == {"tool_calls": 1, "tool_errors": 0}


def test_no_tool_call_ends_the_episode_with_the_reward():
    env, messages = episode()
    assert env.step(messages, "42") == ([], 1.0, True)
    assert env.step(messages, "41") == ([], 0.0, True)
    assert ToolEnvironment().step(messages, "42") == ([], None, True)  # no reward: grpo.rewards score it


def test_a_malformed_call_is_an_error_message_not_a_crash():
    env, messages = episode()
    new, reward, done = env.step(messages, '<tool_call>{"name": "multiply", "arguments": {"a": 6,}}</tool_call>')
    assert (reward, done) == (None, False) and len(new) == 1
    assert new[0]["role"] == "tool" and new[0]["name"] == "error"
    assert new[0]["content"].startswith("error: malformed tool call: not valid JSON")
    assert env.stats == {"tool_calls": 0, "tool_errors": 1} and len(env.errors) == 1


def test_several_calls_and_their_errors_are_counted_then_begin_clears_them():
    env, messages = episode()
    completion = ('<tool_call>{"name": "multiply", "arguments": {"a": 6, "b": 7}}</tool_call>'
                  '<tool_call>{"name": "divide", "arguments": {"a": 6, "b": 7}}</tool_call>'
                  '<tool_call>{"name": "multiply", "arguments": {"a": 6}}</tool_call>')
    new, reward, done = env.step(messages, completion)
    assert [m["name"] for m in new] == ["multiply", "divide", "multiply"] and (reward, done) == (None, False)
    assert new[0]["content"] == "42" and all(m["content"].startswith("error: ") for m in new[1:])
    assert env.stats == {"tool_calls": 3, "tool_errors": 2}
    assert env.errors[0].startswith("divide: no tool 'divide'; the tools: multiply")
    env._begin()
    assert env.stats == {"tool_calls": 0, "tool_errors": 0} and env.errors == []


def test_the_tool_format_is_the_one_set_on_the_instance():
    env, messages = episode()
    env.tool_format = "llama"
    new, _, done = env.step(messages, '{"name": "multiply", "parameters": {"a": 2, "b": 3}}')
    assert new == [{"role": "tool", "name": "multiply", "content": "6"}] and not done


def test_schemas():
    assert [s["function"]["name"] for s in schemas(Calculator)] == ["multiply"]
    assert schemas(Environment) == []


ENV_FILE = '''
from dataclasses import dataclass

from leantrain.environments import Environment, ToolEnvironment


def lookup(word: str) -> str:
    """Look a word up.

    Args:
        word: the word
    """
    return word


def undocumented(word: str) -> str:
    return word


@dataclass
class Setting:
    level: int = 1


class Dictionary(ToolEnvironment):
    tools = (lookup,)


class Broken(ToolEnvironment):
    tools = (lookup, undocumented)


class Twice(ToolEnvironment):
    tools = (lookup, lookup)


class NeedsArguments(Environment):
    def __init__(self, level):
        super().__init__()


def not_a_class():
    pass
'''


@pytest.fixture
def env_file(tmp_path):
    path = tmp_path / "my_env.py"
    path.write_text(textwrap.dedent(ENV_FILE))
    return path


def test_load_an_environment_from_a_file(env_file):
    env_class = load_environment(f"{env_file}:Dictionary", KEY)
    assert env_class.__name__ == "Dictionary" and issubclass(env_class, ToolEnvironment)


def test_load_an_environment_from_a_module():
    assert load_environment("leantrain.environments:ToolEnvironment", KEY) is ToolEnvironment


@pytest.mark.parametrize("name, problem", [
    ("Missing", "has no 'Missing'; its environments: Broken, Dictionary, NeedsArguments, Twice"),
    ("not_a_class", "'not_a_class' is a function, not a class"),
    ("Setting", "subclass leantrain.environments.Environment or ToolEnvironment"),
    ("NeedsArguments", "NeedsArguments() fails (TypeError"),
    ("Broken", "tool undocumented: no JSON schema"),
    ("Twice", "two tools are named 'lookup'"),
])
def test_load_errors_name_the_key(env_file, name, problem):
    with pytest.raises(ConfigError) as e:
        load_environment(f"{env_file}:{name}", KEY)
    assert str(e.value).startswith(f"{KEY}: ") and problem in str(e.value)


@pytest.mark.parametrize("spec, problem", [("no_colon", "not FILE.py:ClassName"), ("nowhere.py:X", "no file"),
                                           ("no_such_module_xyz:X", "cannot import module")])
def test_load_errors_for_the_spec(spec, problem):
    with pytest.raises(ConfigError, match=problem):
        load_environment(spec, KEY)


def test_a_file_that_fails_to_load(tmp_path):
    path = tmp_path / "bad_env.py"
    path.write_text("raise RuntimeError('oops')\n")
    with pytest.raises(ConfigError, match="fails to load: RuntimeError: oops"):
        load_environment(f"{path}:X", KEY)
