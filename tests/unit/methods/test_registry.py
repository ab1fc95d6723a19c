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


def test_one_registry_the_config_table_is_the_index_of_the_methods():
    """Every registered method's spec is the config's entry of its name (the config checks model.task and metric names
    against that light table before torch loads), and every entry is a registered method."""
    from leantrain.config.tasks import SPECS
    from leantrain.methods import TASKS

    builtin = {n: t for n, t in TASKS.items() if not n.startswith("seam-")}  # test methods register themselves
    assert set(builtin) <= set(SPECS) and all(SPECS[n] == t.spec for n, t in builtin.items())
    assert {n for n in SPECS if not n.startswith(("seam-", "toy-"))} == set(builtin)


def test_the_engine_asks_the_method_for_its_data_side():
    """No module of the engine or the commands reads the data layer's table of data sides: a method's
    ``data.side()`` is the only way to one."""
    for path in sorted((REPO / "src" / "leantrain").rglob("*.py")):
        if path.parent.name in ("data", "lm") or "methods" in path.parts:
            continue
        text = path.read_text()
        assert "MODALITIES" not in text and "for_modality" not in text, path


def test_a_method_record_is_small():
    """What the engine sees of a method: its description (spec, traits, card), its six parts and its settings' entry
    points; at most 20 members (53 before the parts)."""
    import dataclasses

    from leantrain.methods import Task

    members = {n for n in dir(Task) if not n.startswith("_")} | {f.name for f in dataclasses.fields(Task)}
    assert len(members) <= 20, sorted(members)
    assert {"data", "model", "step", "evaluation", "prediction", "report"} <= members


def trait_branches(root) -> list[str]:
    """``file:line`` of each ``if`` / ``while`` / ternary / comprehension test that reads a method's ``traits``."""
    hits = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            tests = node.ifs if isinstance(node, ast.comprehension) else (
                [node.test] if isinstance(node, (ast.If, ast.IfExp, ast.While)) else [])
            hits += [f"{path.relative_to(root)}:{t.lineno}" for t in tests
                     if any(isinstance(n, ast.Attribute) and "traits" in (n.attr, getattr(n.value, "attr", None))
                            for n in ast.walk(t))]
    return hits


def test_few_decisions_outside_the_methods_branch_on_a_methods_traits():
    """A method decides for itself through its parts (``task.model.check_keys``, ``task.evaluation.check_generates``,
    ``task.data.saved_settings``...); outside ``methods/`` only the one place that decides the fast paths, eval's choice
    of rows or pairs and the position-limit check read a trait in a branch: at most 6 (issue 32; 17 before the parts)."""
    src = REPO / "src" / "leantrain"
    outside = [h for h in trait_branches(src) if not h.startswith("methods/")]
    assert len(outside) <= 6, outside
    assert len(trait_branches(src / "methods")) > 6  # the count sees the branches it is meant to see
