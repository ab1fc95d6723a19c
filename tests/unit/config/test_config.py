import pytest
import yaml

from leantrain.config import Config, known_keys, resolve
from leantrain.errors import ConfigError


def test_defaults_are_documented_values():
    c = resolve()
    assert (c.train.batch_size, c.train.micro_batch_size, c.train.lr, c.data.max_length) == (32, None, 5e-5, 128)
    assert c.optim.warmup_ratio == 0.06 and c.data.batching == "grouped" and c.output_dir is None


def test_required_keys_exist():
    keys = set(known_keys())
    for k in ["model.name", "data.train", "data.eval", "data.text_column", "data.text_pair_column",
              "data.label_column", "data.max_length", "train.epochs", "train.max_steps", "train.batch_size",
              "train.micro_batch_size", "train.lr", "train.seed", "output_dir", "model.config_overrides"]:
        assert k in keys, k


def test_precedence_defaults_yaml_overrides(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text(yaml.safe_dump({"train": {"lr": 1e-4, "epochs": 2}, "data": {"max_length": 64}}))
    c = resolve(f, ["train.lr=3e-5", "model.config_overrides.hidden_dropout_prob=0"])
    assert c.train.lr == 3e-5  # override beats file
    assert c.train.epochs == 2  # file beats default
    assert c.data.max_length == 64
    assert c.train.batch_size == 32  # default
    assert c.model.config_overrides == {"hidden_dropout_prob": 0}


def test_unknown_key_says_did_you_mean():
    with pytest.raises(ConfigError, match="did you mean 'train.lr'"):
        resolve(None, ["train.lrr=1"])
    with pytest.raises(ConfigError, match="did you mean 'optim.weight_decay'"):
        resolve({"train": {"weight_decay": 0.1}})


def test_bad_value_names_key_and_type():
    with pytest.raises(ConfigError) as e:
        resolve(None, ["train.lr=fast", "data.batching=sorted"])
    text = str(e.value)
    assert "train.lr" in text and "number" in text
    assert "data.batching" in text and "'grouped'" in text  # both problems in one pass


def test_micro_batch_must_divide_batch():
    with pytest.raises(ConfigError, match="not a multiple"):
        resolve(None, ["train.batch_size=32", "train.micro_batch_size=5"])


def test_yaml_errors(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        resolve(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("train: [1, 2")
    with pytest.raises(ConfigError, match="not valid YAML"):
        resolve(bad)


def test_roundtrip_resolved_config(tmp_path):
    c = resolve(None, ["train.lr=3e-5", "data.label_names=[neg, pos]"])
    f = tmp_path / "config.yaml"
    f.write_text(c.to_yaml())
    assert resolve(f) == c and isinstance(c, Config)
