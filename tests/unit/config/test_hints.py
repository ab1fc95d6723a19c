"""Did-you-mean for unknown keys (config/hints.py): aliases from other trainers, close spellings within a section,
the right name in the wrong section, misspelled sections, and an honest "no such key" when nothing is close."""

import pytest

from leantrain.config import known_keys, resolve
from leantrain.config.hints import ALIASES, describe_unknown, suggest
from leantrain.errors import ConfigError

VALID = sorted(known_keys())


@pytest.mark.parametrize("key, hint", [
    ("learning_rate", "train.lr"),               # the Trainer's name
    ("train.Learning_Rate", "train.lr"),         # an alias in any case, under any section
    ("num_train_epochs", "train.epochs"),
    ("data.max_lenght", "data.max_length"),      # a misspelling within the section
    ("train.epoch", "train.epochs"),
    ("train.weight_decay", "optim.weight_decay"),  # the right name in the wrong section
    ("trian.lr", "train.lr"),                    # a misspelled section
    ("lerning_rate", "train.lr"),                # a misspelled alias
])
def test_suggest_finds_the_key_meant(key, hint):
    assert suggest(key, VALID) == hint


@pytest.mark.parametrize("key", ["zzz", "foo.bar", "train.completely_unrelated_thing"])
def test_suggest_does_not_guess_when_nothing_is_close(key):
    assert suggest(key, VALID) is None
    text = describe_unknown(key, VALID)
    assert "there is no such key" in text and "docs/config.md" in text and "did you mean" not in text


def test_every_alias_points_at_keys_that_exist():
    """An alias whose target was renamed would send the user to another unknown key."""
    valid = set(VALID)
    for name, target in ALIASES.items():
        if target.startswith("("):  # an explanation, not a key
            continue
        for word in target.replace(",", " ").replace(";", " ").split():
            if "." in word and not word.endswith(".") or word == "output_dir":
                assert word.split("=", 1)[0] in valid, (name, word)


def test_describe_unknown_quotes_keys_and_not_settings_or_instructions():
    assert describe_unknown("learning_rate", VALID) == "unknown key 'learning_rate' — did you mean 'train.lr'?"
    assert describe_unknown("fp16", VALID) == "unknown key 'fp16' — did you mean efficiency.precision=fp16?"
    text = describe_unknown("gradient_accumulation_steps", VALID)
    assert "did you mean" not in text and "in leantrain: train.batch_size (global)" in text


def test_resolve_reports_every_unknown_key_at_once():
    with pytest.raises(ConfigError) as e:
        resolve({"learning_rate": 1e-4, "train": {"epoch": 2}})
    text = str(e.value)
    assert "'train.lr'" in text and "'train.epochs'" in text
