"""An environment's tools: plain Python functions, described to the model by a JSON schema read from their signature
and docstring, and run on the arguments the model wrote with a time limit.

``tool_schema`` is ``transformers.utils.get_json_schema``, the schema ``apply_chat_template(tools=[fn])`` writes:
every argument needs a type hint and a line in the docstring's ``Args:`` section.

``run_tool`` never raises for the tool's problems: an unknown name, arguments that do not fit the signature, an
exception inside, a run past the time limit or a return that is not text each become a ``ToolResult`` whose content,
``error: ...``, is what the model reads next (it can correct its call). A str is returned as it is; a number, a bool,
a dict, a list or a tuple is written as JSON; None or an object JSON cannot write is an error. Content is cut at
``MAX_CHARS`` characters, so one tool cannot fill the context.

The time limit: in the main thread (where Python handles signals) a SIGALRM timer (``signal.setitimer``) interrupts
the tool between two Python bytecodes, and the previous handler and timer are put back after; elsewhere (or without
``setitimer``) the tool runs in a daemon thread that is abandoned, still running, when it overruns. A tool blocked
inside C code that does not return to Python (a socket read without a timeout, a long C call) does not see the
signal: only the thread fallback's abandonment stops waiting for it, so give such calls their own timeout.
"""

from __future__ import annotations

import inspect
import json
import signal
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

from leantrain.errors import ConfigError

MAX_CHARS = 4000  # the longest content the model reads from one call
EXAMPLE = '''def add(a: int, b: int) -> int:
        """Add two whole numbers.

        Args:
            a: the first number
            b: the second number
        """'''


@dataclass(frozen=True)
class ToolResult:
    name: str  # the tool the model called (as written, when there is no such tool)
    content: str  # what the model reads: the tool's text, or "error: ..."
    error: str | None = None  # None when the tool ran and returned text; else the error, as in content


class _Timeout(BaseException):  # a BaseException: a tool's ``except Exception`` does not swallow it
    pass


def tool_schema(fn: Callable) -> dict:
    """``{"type": "function", "function": {"name", "description", "parameters"}}`` for a tool function, from its
    type hints and Google-style docstring; a ConfigError naming the function and what is missing."""
    from transformers.utils import get_json_schema  # ~1 s to import; parsing and running tools do not need it

    name = getattr(fn, "__name__", repr(fn))
    if not inspect.isfunction(fn) and not inspect.ismethod(fn):
        raise ConfigError(f"tool {name}: a {type(fn).__name__}, not a Python function")
    try:
        return get_json_schema(fn)
    except Exception as e:  # transformers' DocstringParsingException, TypeHintParsingException
        raise ConfigError(f"tool {name}: no JSON schema for the model ({e}); a tool needs a type hint on every "
                          f"argument and a Google-style docstring describing it and each argument, e.g.\n"
                          f"    {EXAMPLE}") from None


def run_tool(tools: dict[str, Callable], name: str, arguments: dict, timeout: float) -> ToolResult:
    """Call ``tools[name](**arguments)``, stopped after ``timeout`` seconds (0 or less: no limit). Never raises for
    the tool's problems: they come back as a ToolResult with ``error`` set (see the module's docstring)."""
    fn = tools.get(name)
    if fn is None:
        return _failed(name, f"no tool {name!r}; the tools: {', '.join(tools) or 'none'}")
    if not isinstance(arguments, dict):
        return _failed(name, f"the arguments of {name} are a {type(arguments).__name__}, not a JSON object")
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):  # a builtin without a signature: the call itself says what is wrong
        signature = None
    if signature is not None:
        try:
            signature.bind(**arguments)
        except TypeError as e:
            return _failed(name, f"bad arguments for {_shown(name, signature)}: {e}")
    try:
        returned = _call(fn, arguments, timeout)
    except _Timeout:
        return _failed(name, f"{name} ran past its time limit of {timeout:g} s and was stopped")
    except Exception as e:
        return _failed(name, f"{type(e).__name__}: {e}")
    if isinstance(returned, str):
        return ToolResult(name, _cut(returned))
    try:
        if returned is None:
            raise TypeError
        return ToolResult(name, _cut(json.dumps(returned, ensure_ascii=False)))
    except (TypeError, ValueError):
        return _failed(name, f"the tool returned {type(returned).__name__}, not text")


def _shown(name: str, signature: inspect.Signature) -> str:
    """``add(a: int, b: int = 1)``: a tool's parameters as the model reads them (its types unquoted)."""
    def one(p: inspect.Parameter) -> str:
        hint = p.annotation if isinstance(p.annotation, str) else getattr(p.annotation, "__name__", str(p.annotation))
        return (p.name + ("" if p.annotation is p.empty else f": {hint}")
                + ("" if p.default is p.empty else f" = {p.default!r}"))
    return f"{name}({', '.join(one(p) for p in signature.parameters.values())})"


def _failed(name: str, error: str) -> ToolResult:
    return ToolResult(name, _cut("error: " + error), error)


def _cut(text: str) -> str:
    return text if len(text) <= MAX_CHARS else text[:MAX_CHARS] + f"\n... [cut at {MAX_CHARS} characters]"


def _call(fn: Callable, arguments: dict, timeout: float) -> Any:
    """``fn(**arguments)``, raising _Timeout after ``timeout`` seconds: a SIGALRM timer in the main thread, else an
    abandoned daemon thread."""
    if not timeout or timeout <= 0:
        return fn(**arguments)
    if threading.current_thread() is threading.main_thread() and hasattr(signal, "setitimer"):
        return _call_with_alarm(fn, arguments, timeout)
    return _call_in_thread(fn, arguments, timeout)


def _call_with_alarm(fn: Callable, arguments: dict, timeout: float) -> Any:
    def alarm(signum, frame) -> None:  # noqa: ANN001
        raise _Timeout

    start = time.monotonic()
    previous_handler = signal.signal(signal.SIGALRM, alarm)
    previous_delay, previous_interval = signal.setitimer(signal.ITIMER_REAL, timeout)
    try:
        return fn(**arguments)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous_handler)
        if previous_delay > 0:  # someone else's timer: what was left of it (at least a moment, so it still fires)
            left = max(previous_delay - (time.monotonic() - start), 1e-3)
            signal.setitimer(signal.ITIMER_REAL, left, previous_interval)


def _call_in_thread(fn: Callable, arguments: dict, timeout: float) -> Any:
    outcome: dict[str, Any] = {}

    def target() -> None:
        try:
            outcome["returned"] = fn(**arguments)
        except BaseException as e:  # noqa: BLE001 - handed back to the caller's thread
            outcome["raised"] = e

    worker = threading.Thread(target=target, name=f"leantrain-tool-{getattr(fn, '__name__', 'tool')}", daemon=True)
    worker.start()
    worker.join(timeout)
    if worker.is_alive():  # abandoned: a daemon thread does not keep the process alive
        raise _Timeout
    if "raised" in outcome:
        raise outcome["raised"]
    return outcome.get("returned")
