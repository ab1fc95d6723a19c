"""An environment's tools (leantrain.environments.tools): the schema read from a documented function, a ConfigError
naming an undocumented one, and run_tool turning every tool problem into an error the model reads, never a raise."""

from __future__ import annotations

import signal
import threading

import pytest

from leantrain.environments import ToolResult, run_tool, tool_schema
from leantrain.environments.tools import MAX_CHARS
from leantrain.errors import ConfigError


def add(a: int, b: int = 1) -> int:
    """Add two whole numbers.

    Args:
        a: the first number
        b: the second number
    """
    return a + b


def shout(text: str) -> str:
    """Upper-case a text.

    Args:
        text: what to shout
    """
    return text.upper()


def divide(a: float, b: float) -> float:
    """Divide.

    Args:
        a: the dividend
        b: the divisor
    """
    if b == 0:
        raise ValueError("b is zero")
    return a / b


RELEASE = threading.Event()  # set by the hang tests when done: an abandoned worker thread then ends


def sleepy() -> str:
    """Hang until released (no time limit of its own: only the tool's time limit stops it)."""
    RELEASE.wait()
    return "awake"


def undocumented(x: int) -> int:
    return x


def untyped(x):  # noqa: ANN001, ANN201
    """Untyped.

    Args:
        x: a value
    """
    return x


def returns(value):  # noqa: ANN001, ANN201
    """A tool returning ``value``, whatever it is."""
    return lambda: value


TOOLS = {f.__name__: f for f in (add, shout, divide, sleepy)}


def test_schema_of_a_documented_function():
    schema = tool_schema(add)
    assert schema["type"] == "function"
    function = schema["function"]
    assert function["name"] == "add" and function["description"] == "Add two whole numbers."
    assert function["parameters"]["properties"]["a"] == {"type": "integer", "description": "the first number"}
    assert function["parameters"]["required"] == ["a"]


@pytest.mark.parametrize("fn, missing", [(undocumented, "docstring"), (untyped, "type hint")])
def test_schema_error_names_the_function_and_the_fix(fn, missing):
    with pytest.raises(ConfigError) as e:
        tool_schema(fn)
    assert f"tool {fn.__name__}" in str(e.value) and missing in str(e.value) and "Args:" in str(e.value)


def test_a_tool_that_works():
    assert run_tool(TOOLS, "shout", {"text": "hi"}, 5) == ToolResult("shout", "HI", None)


def test_an_unknown_tool_lists_the_known_ones():
    result = run_tool(TOOLS, "sub", {"a": 1}, 5)
    assert result.error and result.content.startswith("error: no tool 'sub'")
    assert "add, shout, divide, sleepy" in result.content


@pytest.mark.parametrize("arguments", [{}, {"a": 1, "c": 2}])
def test_arguments_that_do_not_fit_the_signature(arguments):
    result = run_tool(TOOLS, "add", arguments, 5)
    assert result.error and result.content.startswith("error: bad arguments for add(a: int, b: int = 1)")


def test_a_tool_that_raises():
    result = run_tool(TOOLS, "divide", {"a": 1, "b": 0}, 5)
    assert result.content == "error: ValueError: b is zero" and result.error == "ValueError: b is zero"


def test_a_tool_that_hangs_is_stopped_by_the_alarm():
    RELEASE.clear()
    result = run_tool(TOOLS, "sleepy", {}, 0.2)
    assert result.error and "time limit of 0.2 s" in result.content


def test_the_alarm_puts_back_the_previous_handler_and_timer():
    def handler(signum, frame):  # noqa: ANN001, ANN202
        pass

    previous = signal.signal(signal.SIGALRM, handler)
    try:
        signal.setitimer(signal.ITIMER_REAL, 5)
        assert run_tool(TOOLS, "add", {"a": 1}, 1).content == "2"
        left, _ = signal.getitimer(signal.ITIMER_REAL)
        assert 4 < left <= 5 and signal.getsignal(signal.SIGALRM) is handler
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def test_a_tool_that_hangs_in_a_worker_thread_is_abandoned():
    results = []
    RELEASE.clear()
    worker = threading.Thread(target=lambda: results.append(run_tool(TOOLS, "sleepy", {}, 0.2)))
    worker.start()
    worker.join(20)
    RELEASE.set()  # the abandoned call returns; nothing is left hanging
    assert not worker.is_alive() and results[0].error and "time limit" in results[0].content


def test_a_worker_thread_gets_the_tool_result_and_its_exception():
    results = []
    worker = threading.Thread(target=lambda: results.extend(
        [run_tool(TOOLS, "add", {"a": 2}, 5), run_tool(TOOLS, "divide", {"a": 1, "b": 0}, 5)]))
    worker.start()
    worker.join(20)
    assert [r.content for r in results] == ["3", "error: ValueError: b is zero"]


@pytest.mark.parametrize("value, content", [(3, "3"), (2.5, "2.5"), (True, "true"),
                                            ({"a": [1, None]}, '{"a": [1, null]}'), ((1, "x"), '[1, "x"]')])
def test_values_json_can_write_are_json(value, content):
    assert run_tool({"value": returns(value)}, "value", {}, 5) == ToolResult("value", content, None)


@pytest.mark.parametrize("value, kind", [(None, "NoneType"), (object(), "object"), ({1, 2}, "set")])
def test_values_that_are_not_text(value, kind):
    result = run_tool({"value": returns(value)}, "value", {}, 5)
    assert result.error and result.content == f"error: the tool returned {kind}, not text"


def test_long_content_is_cut():
    result = run_tool({"value": returns("x" * 10_000)}, "value", {}, 5)
    assert result.error is None and result.content == "x" * MAX_CHARS + f"\n... [cut at {MAX_CHARS} characters]"
