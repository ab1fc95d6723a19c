"""The keys only some tasks read are checked by the task that owns them (``Task.check_config``, run for every
registered task by ``check_config``): set for another task, each exits 2 naming it; the engine's data preparation
imports no task module and holds no task's check."""

from __future__ import annotations

import ast

import pytest

from leantrain.config import resolve
from leantrain.errors import ConfigError
from leantrain.methods import check_config, get_task
from tests.helpers import REPO

OWNED = [("train.loss=huber", "text-regression", "train.loss=huber: for regression"),
         ("data.standardize_targets=true", "text-regression", "data.standardize_targets=true: for regression"),
         ("preference.beta=0.2", "preference", "preference.beta: for preference tuning and reward models only"),
         ("preference.center_rewards=0.01", "reward-model", "preference.center_rewards: for preference tuning"),
         ("train.pos_weight=2", "multi-label", "train.pos_weight is for multi-label")]


@pytest.mark.parametrize("key,owner,message", OWNED)
def test_a_key_is_taken_by_its_task_and_refused_by_the_others(key, owner, message):
    cfg = resolve(None, [key])
    check_config(cfg, get_task(owner))
    for other in ("text-classification", "token-classification", "causal-lm"):
        with pytest.raises(ConfigError, match=message.replace(".", r"\.")):
            check_config(cfg, get_task(other))


def test_defaults_pass_for_every_task():
    cfg = resolve(None, [])
    for name in ("text-classification", "text-regression", "multi-label", "causal-lm", "preference", "reward-model"):
        check_config(cfg, get_task(name))


def test_the_engine_imports_no_task_module():
    """The engine reaches a task through the registry's ``Task`` only (its settings, checks and weighted forms are the
    method's own): no engine module imports a task module, and the task-specific checks live in their methods."""
    for path in sorted((REPO / "src" / "leantrain" / "engine").rglob("*.py")):
        tree = ast.parse(path.read_text())
        imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
        tasks = {m for m in imported if m.startswith("leantrain.methods.")} - {
            "leantrain.methods.seam"}
        assert not tasks, (path.name, tasks)
        names = {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}
        assert not names & {"check_regression_keys", "check_preference_keys", "check_pos_weight_task",
                            "resolve_class_weights"}, path.name
