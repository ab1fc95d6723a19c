"""Multi-turn episodes (``grpo.environment``): the model answers, the environment replies (tool results), the model
answers again, until the environment says done, ``grpo.max_turns`` turns were taken or the episode's token budget
(``grpo.max_episode_tokens``) is spent.

Every turn is one generation of leantrain's engine (``turns.Turns``) on the episodes still going: the first on
the prompts, ``num_generations`` samples each, as a single-turn step samples (so one turn is exactly GRPO's
rollout); a later one on each episode's prompt + everything after it so far, one sample each: with
``grpo.episode_cache=keep`` the cache of the previous turn continued (``turns.Turns``: only the last sampled token
and the environment's reply prefilled), with ``prefill`` (or a model whose cache cannot be kept) the whole sequence
encoded again. Token-in/token-out: the tokens the model sampled are kept as sampled, the
environment's reply is tokenized once (``env_tokens``) and appended; the model's tokens are trained, the
environment's are attended to but not trained (``Rollout.trained``).

One instance of the environment class per episode, ``reset(row)`` first (it holds the row), then ``step`` after
each of the model's turns. A reward that is not a number, or an exception in the environment's own code, stops the
run (a UserError naming the environment, the method and the prompt); a tool's error is the environment's business
(``ToolEnvironment``: a message the model reads, counted in ``episodes/tool_errors``).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import numbers
from dataclasses import dataclass, field

import torch

from leantrain.data.lm.prompts import padded
from leantrain.methods.grpo import env_rows
from leantrain.methods.grpo.env_tokens import environment_ids
from leantrain.modeling.generation.decode import Rollout
from leantrain.modeling.generation.turns import Turns
from leantrain.errors import UserError

log = logging.getLogger("leantrain")
STATS = ("episodes/turns", "episodes/tool_calls", "episodes/tool_errors", "episodes/length")


@dataclass
class Episode:
    """One episode's state: the conversation as the environment sees it, the tokens after the prompt (the model's
    and the environment's, ``trained`` telling which), the sampler's log-probs of the model's."""

    env: object
    messages: list[dict]
    ids: list[int] = field(default_factory=list)
    trained: list[bool] = field(default_factory=list)
    logps: list[float] = field(default_factory=list)
    rewards: list[float] = field(default_factory=list)
    turns: int = 0
    done: bool = False
    truncated: bool = False
    answer: str = ""  # the model's last turn, as text: what grpo.rewards score

    def add(self, ids: list[int], trained: bool, logps: list[float] | None = None) -> None:
        self.ids += ids
        self.trained += [trained] * len(ids)
        self.logps += logps if logps is not None else [0.0] * len(ids)

    def stats(self) -> list[float]:
        counts = getattr(self.env, "stats", None) or {}
        return [self.turns, counts.get("tool_calls", 0), counts.get("tool_errors", 0), len(self.ids)]


@dataclass(frozen=True)
class Settings:
    """What an episode runs with: the environment class and its tool schemas (the ``tools`` the prompts were
    rendered with), the tool-call format and time limit, the turn and token limits."""

    environment: type
    tools: list[dict] | None
    tool_format: str
    tool_timeout: float
    max_turns: int
    max_tokens: int
    eos_ids: frozenset = frozenset()  # the ids that end the model's turn (``decode.stop_ids``)
    keep_cache: bool = False  # grpo.episode_cache=keep: a later turn continues the cache (``turns.Turns``)


@dataclass
class Episodes:
    """A micro-batch's episodes as a rollout (row ``i*G + j``: prompt i's j-th episode) and what the rewards and the
    log need: each episode's last answer, environment reward (NaN: none), statistics (``STATS``), messages."""

    rollout: Rollout
    answers: list[str]
    env_rewards: torch.Tensor  # (rows,) fp64
    stats: torch.Tensor  # (rows, len(STATS)) fp64
    messages: list[list[dict]]


def run(model, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, rows: list[dict],  # noqa: ANN001
        settings: Settings, *, num_generations: int, sampling, tokenizer, eos_ids, pad_id: int,  # noqa: ANN001
        generator=None, stop=None, lap=None) -> Episodes:  # noqa: ANN001
    """The episodes of the left-padded prompts (``rows``: each prompt's data row, for ``reset``), ``num_generations``
    each, turn by turn on leantrain's generation engine (``turns.Turns``); ``lap(phase)`` told when each generation
    and each round of environment steps ends."""
    lap = lap or (lambda phase, synced=False: None)
    episodes = [_begin(settings, row) for row in rows for _ in range(num_generations)]
    prompts = [ids[m.bool()].tolist() for ids, m in zip(prompt_ids, prompt_mask)]
    engine = Turns(model, eos_ids=eos_ids, pad_id=pad_id, generator=generator, stop=stop, keep=settings.keep_cache)
    before: dict[int, int] = {}  # episode -> its row in the last turn
    for turn in range(settings.max_turns):
        live = [k for k, e in enumerate(episodes) if not e.done]
        if not live:
            break
        room = min(sampling.max_new_tokens, max(settings.max_tokens - len(episodes[k].ids) for k in live))
        step = dataclasses.replace(sampling, max_new_tokens=room)
        if turn == 0:  # the prompts, G samples each: a single-turn step's rollout
            rollout = engine.first(prompt_ids, prompt_mask, num_generations=num_generations, sampling=step)
        else:  # each episode's sequence so far continued: its cache kept, or encoded again (``Turns.next``)
            rollout = engine.next([before[k] for k in live],
                                  [prompts[k // num_generations] + episodes[k].ids for k in live], sampling=step)
        before = {k: i for i, k in enumerate(live)}
        lap("generation", synced=True)
        turns = _turns(rollout)  # the turn's rows read from the device once
        for (ids, logps, truncated), k in zip(turns, live):
            _take_turn(episodes[k], ids, logps, truncated, settings, tokenizer, last=turn == settings.max_turns - 1)
        lap("environment", synced=True)
    return _collected(episodes, pad_id, prompt_ids.device)


def prompt_rows(batch: dict) -> list[dict]:
    """A prompt micro-batch's data rows as they were read (``env_rows.ROW``), one per prompt: what an episode's
    ``reset`` is given."""
    return [json.loads(r) for r in (batch.get("columns") or {})[env_rows.ROW]]


def _begin(settings: Settings, row: dict) -> Episode:
    env = settings.environment()
    env.tool_format, env.tool_timeout = settings.tool_format, settings.tool_timeout
    messages = env.reset(dict(row))
    return Episode(env, [dict(m) for m in messages])


def _turns(rollout: Rollout) -> list[tuple[list[int], list[float] | None, bool]]:
    """Each row of a turn's rollout on the host: (its tokens, the sampler's log-probs of them or None, truncated)."""
    lengths = rollout.completion_mask.sum(-1).tolist()
    ids = [row[:n] for row, n in zip(rollout.completion_ids.tolist(), lengths)]
    logps = [row[:n] for row, n in zip(rollout.logps.float().tolist(), lengths)] if rollout.logps is not None \
        else [None] * len(ids)
    return list(zip(ids, logps, rollout.truncated.tolist()))


def _take_turn(e: Episode, ids: list[int], logps: list[float] | None, truncated: bool, settings: Settings,
               tokenizer, last: bool) -> None:  # noqa: ANN001
    """Episode ``e`` takes one row of a turn (``_turns``): its tokens (trained), then the environment's step, then
    (unless the episode ends) the environment's reply as tokens (not trained)."""
    budget = settings.max_tokens - len(e.ids)
    cut = len(ids) > budget or truncated
    ids, logps = ids[:budget], (logps[:budget] if logps is not None else None)
    e.add(ids, True, logps)
    e.turns += 1
    ended_by = ids[-1:] if ids and ids[-1] in settings.eos_ids else []  # the end of turn the model sampled
    text = tokenizer.decode(ids[:-1] if ended_by else ids, skip_special_tokens=True)
    e.answer = text
    new, reward, done = _stepped(e, text)  # a cut turn too: its reward (the environment's reply is not read)
    if reward is not None:
        e.rewards.append(reward)
    before = list(e.messages)
    e.messages += [{"role": "assistant", "content": text}, *([] if cut else new)]
    if cut:  # no end of turn within the budget: the episode ends, cut
        e.done = e.truncated = True
        return
    if done or last or not new:
        e.done = True
        return
    stop_text = tokenizer.decode(ended_by, skip_special_tokens=False)
    reply = environment_ids(tokenizer, before, text, stop_text, new, settings.tools)
    if len(e.ids) + len(reply) >= settings.max_tokens:  # no room for the reply and a turn after it
        e.done = e.truncated = True
        return
    e.add(reply, False)


def _stepped(e: Episode, text: str) -> tuple[list[dict], float | None, bool]:
    """The environment's step, its return checked: (messages, reward, done); a UserError naming the environment
    and the prompt for anything else."""
    name = type(e.env).__name__
    where = f"{name}.step (turn {e.turns} of the episode of prompt {_shown(e.messages)})"
    try:
        out = e.env.step([dict(m) for m in e.messages], text)
    except Exception as err:
        raise UserError(f"{where} failed: {type(err).__name__}: {err}") from err
    if not (isinstance(out, tuple) and len(out) == 3):
        raise UserError(f"{where} returned {type(out).__name__}, not (new messages, reward or None, done)")
    new, reward, done = out
    if not isinstance(new, list) or not all(isinstance(m, dict) and "role" in m and "content" in m for m in new):
        raise UserError(f"{where} returned new messages {str(new)[:120]!r}: not a list of {{role, content}} dicts")
    if reward is not None and (isinstance(reward, bool) or not isinstance(reward, numbers.Real)
                               or not math.isfinite(float(reward))):
        raise UserError(f"{where} returned the reward {reward!r} ({type(reward).__name__}): a reward is a finite "
                        "number, or None for no reward at this turn")
    return [{"role": str(m["role"]), "content": str(m["content"]), **({"name": str(m["name"])} if "name" in m else {})}
            for m in new], (None if reward is None else float(reward)), bool(done)


def _shown(messages: list[dict]) -> str:
    users = [m["content"] for m in messages if m.get("role") == "user"]
    text = users[0] if users else str(messages[:1])
    return repr(text if len(text) <= 80 else text[:77] + "...")


def _collected(episodes: list[Episode], pad_id: int, device) -> Episodes:  # noqa: ANN001
    """The episodes as one right-padded rollout: ids, mask (1 on every token of the episode), truncated, the
    sampler's log-probs (0 on the environment's tokens), ``trained``."""
    ids, mask = padded([e.ids for e in episodes], pad_id)
    trained = padded([[int(t) for t in e.trained] for e in episodes], 0)[0].bool()
    logps = torch.zeros(ids.shape, dtype=torch.float32)
    for i, e in enumerate(episodes):
        logps[i, :len(e.logps)] = torch.as_tensor(e.logps, dtype=torch.float32)
    rollout = Rollout(ids.to(device), mask.to(device), torch.tensor([e.truncated for e in episodes]).to(device),
                      logps.to(device), trained.to(device))
    rewards = torch.tensor([sum(e.rewards) if e.rewards else math.nan for e in episodes], dtype=torch.float64)
    stats = torch.tensor([e.stats() for e in episodes], dtype=torch.float64)
    return Episodes(rollout, [e.answer for e in episodes], rewards, stats, [e.messages for e in episodes])
