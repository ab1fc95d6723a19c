"""Task names are decided in one place: no task-name string literal (``"causal-lm"``, ``"text-classification"``, ...)
in leantrain's code outside ``config/`` (the names, the specs) and ``methods/`` (the registry, detection): the
rest asks the Task object (``labelled``, ``generates``, ``token_blocks``, ...) or uses the constants."""

from __future__ import annotations

import ast
from pathlib import Path

import leantrain
from leantrain.methods import TASKS

SRC = Path(leantrain.__file__).parent
OWNERS = ("config", "methods")


def _docstrings(tree: ast.AST) -> set[int]:
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                found.add(id(first.value))
    return found


def task_name_literals(root: Path, names: set[str]) -> list[str]:
    """``path:line: 'name'`` for every string constant (not a docstring) equal to a task name, outside the owners."""
    hits = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if rel.startswith(OWNERS):
            continue
        tree = ast.parse(path.read_text(), filename=rel)
        docs = _docstrings(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and node.value in names and id(node) not in docs:
                hits.append(f"{rel}:{node.lineno}: {node.value!r}")
    return hits


def test_no_task_name_literal_outside_config_and_the_registry():
    assert len(TASKS) >= 7  # the built-in tasks are registered: the names below are real
    assert task_name_literals(SRC, set(TASKS)) == []


def test_the_check_finds_a_literal(tmp_path):
    (tmp_path / "engine").mkdir()
    (tmp_path / "engine" / "x.py").write_text('"""causal-lm in a docstring is fine."""\nif task == "causal-lm":\n    pass\n')
    (tmp_path / "config").mkdir()
    (tmp_path / "config" / "y.py").write_text('NAME = "causal-lm"\n')
    assert task_name_literals(tmp_path, set(TASKS)) == ["engine/x.py:2: 'causal-lm'"]
