"""Each task declares what it is once (``Traits``): every registered task's record is complete and consistent, the
questions the rest of leantrain asks are answered from it, and nothing outside ``methods`` guesses what a
task is from its unit or its modality (issue 32: a token classifier counts tokens, but its speed is in samples and
its eval rows are examples, not a language model's blocks)."""

from __future__ import annotations

import dataclasses
import re

import pytest

from leantrain.methods import TASKS, get_task
from leantrain.methods.traits import Traits
from leantrain.report.final_line import final_line
from tests.helpers import REPO


@pytest.mark.parametrize("name", list(TASKS))
def test_every_registered_record_is_complete_and_consistent(name):
    traits = get_task(name).traits
    assert isinstance(traits, Traits)
    assert traits.problems() == []
    assert all(getattr(traits, f.name) is not None for f in dataclasses.fields(traits) if f.name != "model_mapping")


def test_the_records_say_what_each_task_is():
    lm, ner = get_task("causal-lm").traits, get_task("token-classification").traits
    assert (lm.unit, lm.speed_unit, lm.eval_row_kind, lm.generates, lm.labelled) == ("tokens", "tokens", "blocks",
                                                                                      True, False)
    assert (ner.unit, ner.speed_unit, ner.eval_row_kind, ner.generates) == ("tokens", "samples", "examples", False)
    assert get_task("text-classification").traits.class_labels and get_task("text-regression").traits.score_labels
    image = get_task("image-classification").traits
    assert image.media_inputs and not image.tokenized
    assert get_task("reward-model").traits.paired and get_task("reward-model").traits.sequence_classifier
    assert not get_task("preference").traits.evaluated_by_rows and get_task("multi-label").traits.evaluated_by_rows
    assert [n for n, t in TASKS.items() if t.traits.generates] == ["causal-lm", "preference", "grpo", "distill"]
    grpo = get_task("grpo").traits  # labelled by prompts, not by what a row's prediction is compared with
    assert (grpo.speed_unit, grpo.evaluated_by_rows, grpo.uniform_token_gradients) == ("tokens", False, False)


def test_a_token_classifier_said_to_count_blocks_is_caught_and_its_final_line_keeps_the_loss():
    """The NER summary bug of issue 32: a record that made NER's eval rows blocks (or its speed tokens/s) is
    inconsistent, and the final line built from NER's record names examples, samples/s and the loss."""
    ner = get_task("token-classification")
    assert dataclasses.replace(ner.traits, eval_row_kind="blocks").problems()
    assert dataclasses.replace(ner.traits, speed_unit="tokens").problems()
    ev = {"entity_f1": 0.5, "entity_precision": 0.5, "entity_recall": 0.5, "token_accuracy": 0.9, "loss": 1.25,
          "samples": 60}
    summary = {"eval": ev,
               "data": {"eval_row_kind": ner.traits.eval_row_kind},
               "train": {"steps": 3, "samples_per_second": 2.0, "tokens_per_second": 86.0,
                         "speed_unit": ner.traits.speed_unit}}
    line = final_line(ner.evaluation.headline(summary["eval"]), summary, with_loss=not ner.traits.headline_loss)
    assert ", loss 1.2500 on 60 examples" in line and "2.0 samples/s" in line
    assert "blocks" not in line and "tokens/s" not in line


def test_a_configured_task_replaces_only_its_settings_traits():
    from leantrain.config import resolve

    task = get_task("reward-model").configured(resolve(None, ["model.task=reward-model"]))
    assert task.traits == dataclasses.replace(get_task("reward-model").traits, keeps_dropout=False)


GUESSES = re.compile(r"\bunit ==|\bmodality ==|\.modality in \(|spec\.labels|\btask\w*\.(labelled|paired|class_labels|"
                     r"score_labels|token_blocks|generates|media_inputs|tokenized|sequence_classifier|"
                     r"evaluated_by_rows|speed_unit|eval_row_kind|headline_loss|keeps_dropout|uniform_token_gradients|"
                     r"auto_model)\b")


def test_no_code_outside_the_tasks_guesses_what_a_task_is():
    src = REPO / "src" / "leantrain"
    found = [f"{path.relative_to(src)}:{i}: {line.strip()}" for path in sorted(src.rglob("*.py"))
             if "methods" not in path.relative_to(src).as_posix()
             for i, line in enumerate(path.read_text().splitlines(), 1) if GUESSES.search(line)]
    assert found == []
