"""A calculator environment for multi-turn GRPO (examples/grpo-calculator.yaml): the model may call ``calculate``
on an arithmetic expression, reads the result, then answers with the number; the reward is 1 when its last answer's
last number is the row's ``answer``. The rows: leantrain's built-in calculator problems (``question``, ``answer``)."""

from __future__ import annotations

import ast
import operator
import re

from leantrain.environments import ToolEnvironment

OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
       ast.USub: operator.neg}
SYSTEM = ("You are a careful assistant with a calculator. For any arithmetic, call the calculate tool, e.g. "
          '<tool_call>{"name": "calculate", "arguments": {"expression": "37 * 24"}}</tool_call>, then answer '
          "with just the number it returned.")

EXAMPLE = [  # one worked episode before the question: a 135M model calls the tool only after seeing it done
    {"role": "user", "content": "A box holds 37 pens. How many pens are in 24 boxes?"},
    {"role": "assistant", "content": '<tool_call>{"name": "calculate", "arguments": {"expression": "37 * 24"}}'
                                     '</tool_call>'},
    {"role": "tool", "content": "888"},
    {"role": "assistant", "content": "888"}]


def calculate(expression: str) -> str:
    """Evaluate an arithmetic expression with + - * / and parentheses.

    Args:
        expression: the expression, e.g. "37 * 24"
    """
    def value(node):  # noqa: ANN001, ANN202
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in OPS:
            return OPS[type(node.op)](value(node.left), value(node.right))
        if isinstance(node, ast.UnaryOp) and type(node.op) in OPS:
            return OPS[type(node.op)](value(node.operand))
        raise ValueError(f"not arithmetic: {ast.unparse(node)}")

    result = value(ast.parse(expression, mode="eval").body)
    return str(int(result)) if float(result).is_integer() else f"{result:.6g}"


class Calculator(ToolEnvironment):
    tools = (calculate,)

    def reset(self, row: dict) -> list[dict]:
        self.row = row
        return [{"role": "system", "content": SYSTEM}, *EXAMPLE, {"role": "user", "content": row["question"]}]

    def reward(self, messages: list[dict], completion: str) -> float:
        numbers = re.findall(r"-?\d+(?:\.\d+)?", completion.replace(",", ""))
        return float(bool(numbers) and float(numbers[-1]) == float(self.row["answer"]))
