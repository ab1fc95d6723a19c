"""Loading edges (config/read.py, config/strict_yaml.py): how a ``key=value`` override is parsed, keys given twice in
YAML, a section where a value belongs and the reverse, and what the metric and problem_type checks accept."""

import pytest
import yaml

from leantrain.config import resolve
from leantrain.config.read import describe_keys, overrides_tree, parse_override
from leantrain.config.metric_names import check_metric, lower_is_better, metric_names
from leantrain.config.problem_type import check_problem_type
from leantrain.config.strict_yaml import DuplicateKeyError, safe_load_strict
from leantrain.errors import ConfigError


@pytest.mark.parametrize("text, expected", [
    ("train.lr=1", ("train.lr", 1)),
    (" train.lr = 2 ", ("train.lr", 2)),              # spaces around the key and value
    ("data.label_names=[neg, pos]", ("data.label_names", ["neg", "pos"])),  # YAML values
    ("output_dir=", ("output_dir", "")),               # empty value: an empty string, not None
    ("output_dir=null", ("output_dir", None)),
    ("data.text_column=a=b", ("data.text_column", "a=b")),  # only the first '=' splits
    ("data.text_column=: x", ("data.text_column", ": x")),  # not valid YAML: kept as text
])
def test_parse_override(text, expected):
    assert parse_override(text) == expected


@pytest.mark.parametrize("text, match", [("train.lr", "not of the form key=value"), ("=3", "has no key")])
def test_parse_override_rejects(text, match):
    with pytest.raises(ConfigError, match=match):
        parse_override(text)


def test_overrides_as_the_mapping_a_config_file_would_hold(tmp_path):
    overrides = ["train.lr=0.5", "model.config_overrides.depths=[1,1]", "model.config_type=vit", "output_dir=x"]
    tree = overrides_tree(overrides)
    assert tree == {"train": {"lr": 0.5}, "model": {"config_overrides": {"depths": [1, 1]}, "config_type": "vit"},
                    "output_dir": "x"}
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(tree))
    assert resolve(tmp_path / "c.yaml") == resolve(None, overrides)


def test_on_and_off_are_the_words_where_a_key_takes_them_and_booleans_elsewhere():
    """YAML 1.1 reads on/off as booleans: a key whose choices are words gets the word back, a boolean key the bool."""
    cfg = resolve(None, ["grpo.importance_sampling=off", "grpo.skip_zero_advantage=off", "preference.dropout=off",
                         "grpo.mask_truncated=on"])
    assert (cfg.grpo.importance_sampling, cfg.grpo.skip_zero_advantage, cfg.preference.dropout) == ("off",) * 3
    assert cfg.grpo.mask_truncated is True
    assert resolve(None, ["grpo.importance_sampling=on"]).grpo.importance_sampling == "on"
    with pytest.raises(ConfigError, match="grpo.episode_cache"):  # no such word among its choices: still refused
        resolve(None, ["grpo.episode_cache=off"])


def test_override_into_a_value_or_onto_a_section_is_refused():
    with pytest.raises(ConfigError, match="'lr' is a value, not a section"):
        resolve(None, ["train.lr=1", "train.lr.x=2"])
    with pytest.raises(ConfigError, match="train: is a section; set one of its keys, e.g. train.batch_size"):
        resolve(None, ["train=3"])


def test_later_override_wins_and_mapping_source_is_not_changed():
    source = {"train": {"lr": 1e-3}}
    assert resolve(source, ["train.lr=1e-4", "train.lr=2e-4"]).train.lr == 2e-4
    assert source == {"train": {"lr": 1e-3}}


def test_yaml_key_given_twice_names_key_and_both_lines(tmp_path):
    with pytest.raises(DuplicateKeyError) as e:
        safe_load_strict("model:\n  name: x\ntrain:\n  lr: 1\n  epochs: 2\n  lr: 2\n")
    assert (e.value.key, e.value.first_line, e.value.second_line) == ("train.lr", 4, 6)
    with pytest.raises(DuplicateKeyError, match=r"'l\[1\]\.a'"):  # inside a list
        safe_load_strict("l:\n  - a: 1\n  - a: 1\n    a: 2\n")
    f = tmp_path / "c.yaml"
    f.write_text("train:\n  lr: 1\ntrain:\n  epochs: 2\n")
    with pytest.raises(ConfigError, match=r"c\.yaml: key 'train' is given twice, on lines 1 and 3"):
        resolve(f)


def test_yaml_same_leaf_in_two_sections_and_merge_keys_are_fine():
    assert safe_load_strict("a: {x: 1}\nb: {x: 2}\n") == {"a": {"x": 1}, "b": {"x": 2}}
    assert safe_load_strict("base: &b {x: 1}\nrun:\n  <<: *b\n  x: 2\n")["run"] == {"x": 2}


def test_yaml_file_must_hold_a_mapping(tmp_path):
    f = tmp_path / "list.yaml"
    f.write_text(yaml.safe_dump([1, 2]))
    with pytest.raises(ConfigError, match="must hold a mapping"):
        resolve(f)
    empty = tmp_path / "empty.yaml"
    empty.write_text("")
    assert resolve(empty) == resolve()


def test_describe_keys_lists_every_key_with_its_default():
    text = describe_keys()
    assert "  train.lr = 5e-05" in text and "  data.max_length = 128" in text


@pytest.mark.parametrize("num_labels, has_mcc", [(2, True), (3, False), (None, True)])
def test_mcc_only_for_two_classes(num_labels, has_mcc):
    assert ("mcc" in metric_names(num_labels, "text-classification")) is has_mcc


def test_metric_names_without_a_task_is_every_task_once():
    names = metric_names()
    assert len(names) == len(set(names)) and {"accuracy", "pearson", "entity_f1", "perplexity"} <= set(names)


def test_check_metric_messages():
    check_metric("accuracy", None, "auto")  # an unresolved task accepts any task's metric
    check_metric("pearson", None, "auto")
    with pytest.raises(ValueError, match="2 classes only; this data has 3: use one of eval.accuracy"):
        check_metric("mcc", 3, "text-classification")
    with pytest.raises(ValueError, match="did you mean eval.accuracy"):
        check_metric("acc", None, "text-classification")
    with pytest.raises(ValueError, match="did you mean eval.f1_micro"):
        check_metric("f1", None, "multi-label")
    with pytest.raises(ValueError, match="reports no metric 'pearson'") as e:
        check_metric("pearson", None, "text-classification")
    assert "did you mean" not in str(e.value)


def test_lower_is_better_per_task():
    assert lower_is_better("mse", "text-regression") and lower_is_better("loss", "text-classification")
    assert not lower_is_better("mse", "text-classification") and not lower_is_better("accuracy")


@pytest.mark.parametrize("task, given, ok", [
    ("text-regression", "regression", True),
    ("text-classification", "single_label_classification", True),
    ("auto", "single_label_classification", True),
    ("auto", "regression", False),
    ("multi-label", "single_label_classification", False),
])
def test_check_problem_type(task, given, ok):
    check_problem_type(task, {})  # no override: nothing to check
    if ok:
        check_problem_type(task, {"problem_type": given})
    else:
        with pytest.raises(ConfigError, match=f"contradicts the task \\({task}\\)"):
            check_problem_type(task, {"problem_type": given})


def test_problem_type_error_names_the_task_to_set():
    with pytest.raises(ConfigError, match="set model.task=text-regression"):
        check_problem_type("text-classification", {"problem_type": "regression"})
    with pytest.raises(ConfigError) as e:
        check_problem_type("text-regression", {"problem_type": "weird"})
    assert "set model.task" not in str(e.value)
