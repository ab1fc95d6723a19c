"""distributed.strategy=deepspeed: the keys DeepSpeed ZeRO cannot combine with exit 2 naming each of them (before any
model loads), and the ZeRO JSON file is checked (missing, not an object, an optimizer / scheduler leantrain owns)."""

from __future__ import annotations

import json

import pytest

from leantrain.config import resolve
from leantrain.engine.devices.accelerator import check_deepspeed_json
from leantrain.errors import ConfigError

DS = ["distributed.strategy=deepspeed", "distributed.deepspeed_config=zero2.json"]


def test_every_refused_key_is_named_in_one_message():
    with pytest.raises(ConfigError) as err:
        resolve(None, [*DS, "efficiency.compile=true", "efficiency.precision=fp8", "train.micro_batch_size=auto",
                       "optim.name=muon"])
    text = str(err.value)
    assert "distributed.strategy=deepspeed cannot be combined with" in text
    for key in ("efficiency.compile=true", "efficiency.precision=fp8", "train.micro_batch_size=auto",
                "optim.name=muon"):
        assert key in text


@pytest.mark.parametrize("key", ["efficiency.compile=true", "optim.name=adafactor"])
def test_one_refused_key_alone(key):
    with pytest.raises(ConfigError, match=f"cannot be combined with {key}"):
        resolve(None, [*DS, key])


def test_a_plain_deepspeed_config_is_accepted():
    cfg = resolve(None, [*DS, "efficiency.precision=bf16", "train.micro_batch_size=4", "train.batch_size=8"])
    assert cfg.distributed.strategy == "deepspeed"


def test_the_zero_json_is_checked(tmp_path):
    path = tmp_path / "zero.json"
    with pytest.raises(ConfigError, match="file not found"):
        check_deepspeed_json(path)
    path.write_text("{ not json")
    with pytest.raises(ConfigError, match="is not valid JSON"):
        check_deepspeed_json(path)
    path.write_text("[1, 2]")
    with pytest.raises(ConfigError, match="must hold a JSON object, not list"):
        check_deepspeed_json(path)
    path.write_text(json.dumps({"zero_optimization": {"stage": 2}, "optimizer": {"type": "AdamW"},
                                "scheduler": {"type": "WarmupLR"}}))
    with pytest.raises(ConfigError, match="has 'optimizer' and 'scheduler', which leantrain builds itself"):
        check_deepspeed_json(path)
    path.write_text(json.dumps({"zero_optimization": {"stage": 3}, "bf16": {"enabled": "auto"}}))
    assert check_deepspeed_json(path)["zero_optimization"]["stage"] == 3
