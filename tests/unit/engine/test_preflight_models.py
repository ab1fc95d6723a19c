"""Model checks made before any weight loads (issue 35 items 4 and 10): an encoder is not trained as a causal LM,
and a data.max_length above the model's position limit is refused whatever the task (a reward model's rows are cut
at data.block_size, and its MiniLM takes 512 tokens). Config-level: no weights, no data."""

from __future__ import annotations

import pytest

from leantrain.config import resolve
from leantrain.engine.setup.preflight import check_max_length, check_model_plan
from leantrain.errors import ConfigError
from leantrain.methods import get_task
from tests.helpers import TINY_LLAMA, make_tiny_lm_tokenizer


@pytest.mark.parametrize("task", ["preference", "causal-lm"])
def test_an_encoder_trained_as_a_causal_lm_exits_2_naming_its_model_type(tiny_bert, task):
    """A BERT's causal-LM class has a random LM head over bidirectional attention: DPO trained on what it could see
    ahead, with exit 0 and only a transformers warning."""
    cfg = resolve(None, [f"model.name={tiny_bert}", f"model.task={task}"])
    with pytest.raises(ConfigError, match=rf"model.name={tiny_bert}: model type bert is an encoder .* model.task="
                                          rf"{task} trains a causal language model") as e:
        check_model_plan(cfg, get_task(task))
    assert e.value.exit_code == 2


def test_decoders_and_an_encoder_made_a_decoder_are_accepted(tiny_bert, tmp_path):
    tok = make_tiny_lm_tokenizer(tmp_path / "tok")
    check_model_plan(resolve(None, [*TINY_LLAMA, f"model.tokenizer={tok}", "model.task=preference"]),
                     get_task("preference"))
    check_model_plan(resolve(None, [f"model.name={tiny_bert}", "model.task=preference",
                                    "model.config_overrides.is_decoder=true"]), get_task("preference"))
    check_model_plan(resolve(None, [f"model.name={tiny_bert}", "model.task=reward-model"]), get_task("reward-model"))


def test_a_reward_models_max_length_above_its_position_limit_exits_2(tiny_bert):
    base = [f"model.name={tiny_bert}", "model.task=reward-model"]
    with pytest.raises(ConfigError, match="data.max_length=1024 is more than the model takes: its config has "
                                          "max_position_embeddings=256") as e:
        check_max_length(resolve(None, [*base, "data.max_length=1024"]), get_task("reward-model"))
    assert e.value.exit_code == 2
    assert check_max_length(resolve(None, [*base, "data.max_length=256"]), get_task("reward-model")).data.max_length \
        == 256
    assert check_max_length(resolve(None, base), get_task("reward-model")).data.block_size == 256  # 512, lowered
