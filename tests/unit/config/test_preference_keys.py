"""The preference.* keys (issue 35 items 8 and 9): each scale within the range where it means something, and a key the
run's method does not read refused naming it, from one table (``config.preference.READS``), at config time when the
config names the method, else once the data does (loss auto: dpo on pairs, kto on feedback). No model, no training."""

from __future__ import annotations

import json

import pytest

from leantrain.config import resolve
from leantrain.errors import ConfigError

pytestmark = pytest.mark.usefixtures("own_datasets_cache")


@pytest.mark.parametrize("override,says", [
    ("preference.beta=1e-300", "0 in float32"),  # > 0, and 0 in fp32: the loss stayed ln 2
    ("preference.beta=1e-6", "below 1e-4 the loss is ln 2"),
    ("preference.beta=1e6", "every pair saturates"),
    ("preference.desirable_weight=1e-300", "0 in float32"),
    ("preference.undesirable_weight=1e5", "balance desirable against undesirable"),
    ("preference.label_smoothing=1e-300", "0 in float32"),
    ("preference.center_rewards=1e-300", "0 in float32"),
    ("train.lr=1e-300", "0 in float32"),  # every float key of every section
])
def test_a_scale_that_float32_holds_as_0_or_that_means_nothing_exits_2_naming_the_key(override, says):
    key = override.split("=")[0]
    with pytest.raises(ConfigError, match=rf"{key}: .*{says}") as e:
        resolve(None, [override])
    assert e.value.exit_code == 2


@pytest.mark.parametrize("beta", ["1e-4", "0.1", "2", "1000"])
def test_the_scales_people_use_are_accepted(beta):
    assert resolve(None, [f"preference.beta={beta}", "preference.gamma=0"]).preference.beta == float(beta)


@pytest.mark.parametrize("overrides,says", [
    (["preference.loss=simpo", "preference.reference=precompute"], "preference.reference=precompute: simpo is "
                                                                   "reference-free"),
    (["preference.loss=orpo", "preference.reference=live"], "preference.reference=live: orpo is reference-free"),
    (["model.task=reward-model", "preference.loss=simpo"], "preference.loss=simpo: a reward model trains with the "
                                                           "Bradley-Terry loss"),
    (["model.task=reward-model", "preference.reference=live"], "preference.reference=live: a reward model"),
    (["preference.loss=ipo", "preference.label_smoothing=0.1"], "preference.label_smoothing=0.1: ipo does not read "
                                                                "it \\(it is for dpo\\)"),
    (["preference.loss=dpo", "preference.center_rewards=0.01"], "preference.center_rewards=0.01: dpo does not read"),
    (["preference.loss=dpo", "preference.gamma=1"], "preference.gamma=1: dpo does not read it \\(it is for simpo\\)"),
    (["preference.loss=dpo", "data.packing=true"], "data.packing=true: not for dpo"),
    (["model.task=preference", "preference.loss=dpo", "data.train_on_prompt=true"], "data.train_on_prompt=true"),
    (["model.task=reward-model", "data.packing=true"], "data.packing=true: not for reward-model"),
    (["preference.loss=kto", "preference.reference=none"], "preference.reference=none: kto compares the policy"),
])
def test_a_key_the_method_does_not_read_exits_2_naming_it_and_why(overrides, says):
    with pytest.raises(ConfigError, match=says) as e:
        resolve(None, overrides)
    assert e.value.exit_code == 2


@pytest.mark.parametrize("overrides", [
    ["preference.loss=simpo", "preference.reference=none", "preference.gamma=1", "preference.beta=2.5"],
    ["preference.loss=dpo", "preference.label_smoothing=0.1", "preference.reference=live"],
    ["preference.loss=kto", "preference.desirable_weight=1.33", "preference.dropout=keep"],
    ["model.task=reward-model", "preference.center_rewards=0.01", "preference.dropout=keep"],
    ["model.task=causal-lm", "data.packing=true", "data.train_on_prompt=true"],  # SFT reads both
])
def test_the_keys_each_method_reads_are_accepted(overrides):
    resolve(None, overrides)


def test_with_loss_auto_the_data_decides_the_method_before_any_model(tmp_path):
    from leantrain.engine.setup.training_data import validate_data

    rows = [{"prompt": "Is 2 + 2 four?", "completion": "Yes.", "label": True},
            {"prompt": "Is 2 + 2 five?", "completion": "Yes.", "label": False}] * 4
    (tmp_path / "kto.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    base = ["model.task=preference", f"data.train={tmp_path / 'kto.jsonl'}", "data.eval_fraction=0.25"]
    with pytest.raises(ConfigError, match="preference.label_smoothing=0.1: kto does not read it") as e:
        validate_data(resolve(None, [*base, "preference.label_smoothing=0.1"]))  # auto: kto on feedback
    assert e.value.exit_code == 2
    validate_data(resolve(None, [*base, "preference.desirable_weight=2"]))
