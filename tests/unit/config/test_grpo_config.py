"""The grpo.* section (issue 33): TRL's defaults, a bad value exits 2 naming the key, and grpo.* keys on a run whose
task is not GRPO are refused naming the key (``check_grpo_keys``, which the GRPO task's ``check_config`` calls)."""

from __future__ import annotations

import pytest

from leantrain.config import resolve
from leantrain.config.grpo import check_grpo_keys
from leantrain.errors import ConfigError
from leantrain.methods import get_task


def test_the_defaults_are_trls():
    g = resolve(None, []).grpo
    assert (g.rewards, g.reward_weights, g.num_generations, g.max_new_tokens) == ([], None, 8, 64)
    assert (g.loss, g.scale_rewards, g.epsilon, g.epsilon_high, g.resolved_epsilon_high()) == \
        ("dapo", "group", 0.2, None, 0.2)
    assert (g.num_iterations, g.beta, g.temperature, g.top_p, g.top_k) == (1, 0.0, 1.0, 1.0, 0)
    assert (g.mask_truncated, g.generation, g.log_completions) == (False, "auto", 4)


def test_values_people_set_are_kept():
    g = resolve(None, ["grpo.rewards=[numeric:answer,length:20]", "grpo.reward_weights=[1.0,0.1]",
                       "grpo.num_generations=2", "grpo.loss=dr_grpo", "grpo.epsilon_high=0.28",
                       "grpo.temperature=0"]).grpo
    assert g.rewards == ["numeric:answer", "length:20"] and g.reward_weights == [1.0, 0.1]
    assert (g.num_generations, g.loss, g.resolved_epsilon_high(), g.temperature) == (2, "dr_grpo", 0.28, 0.0)


@pytest.mark.parametrize("overrides,says", [
    (["grpo.num_generations=1"], "grpo.num_generations"),
    (["grpo.rewards=[numeric:answer]", "grpo.reward_weights=[1.0,2.0]"], "2 weights for 1 grpo.rewards"),
    (["grpo.reward_weights=[1.0]"], "1 weights for 0 grpo.rewards"),
    (["grpo.epsilon=-0.1"], "grpo.epsilon"),
    (["grpo.epsilon=0.2", "grpo.epsilon_high=0.1"], "grpo.epsilon_high=0.1 is below grpo.epsilon=0.2"),
    (["grpo.max_new_tokens=0"], "grpo.max_new_tokens"),
    (["grpo.top_p=0"], "grpo.top_p"),
    (["grpo.top_k=-1"], "grpo.top_k"),
    (["grpo.beta=-1"], "grpo.beta"),
    (["grpo.temperature=-1"], "grpo.temperature"),
    (["grpo.num_iterations=0"], "grpo.num_iterations"),
    (["grpo.loss=sum"], "grpo.loss"),
    (["grpo.scale_rewards=std"], "grpo.scale_rewards"),
    (["grpo.generation=sglang"], "grpo.generation"),
    (["grpo.nonsense=1"], "grpo.nonsense"),
])
def test_a_bad_value_exits_2_naming_the_key(overrides, says):
    with pytest.raises(ConfigError, match=says) as e:
        resolve(None, overrides)
    assert e.value.exit_code == 2


def test_grpo_keys_are_refused_on_a_task_that_does_not_read_them():
    cfg = resolve(None, ["grpo.num_generations=4"])
    for name in ("causal-lm", "preference", "text-classification", "distill"):
        with pytest.raises(ConfigError, match=f"grpo.num_generations: for GRPO .* this run's task is {name}"):
            check_grpo_keys(cfg, get_task(name), owner=False)
    check_grpo_keys(resolve(None, []), get_task("causal-lm"), owner=False)  # the defaults are set on every run
    # distillation reads the reward functions (its eval's reward), no other grpo key
    check_grpo_keys(resolve(None, ["grpo.rewards=[numeric:answer]"]), get_task("distill"), owner=False)


def test_grpo_takes_its_keys_and_needs_a_reward():
    grpo = get_task("grpo")
    check_grpo_keys(resolve(None, ["grpo.rewards=[numeric:answer]", "grpo.num_generations=4"]), grpo, owner=True)
    with pytest.raises(ConfigError, match="grpo.rewards: .* none is given"):
        check_grpo_keys(resolve(None, ["grpo.num_generations=4"]), grpo, owner=True)
