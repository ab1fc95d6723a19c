"""``leantrain generate MODEL --prompt ... --max-new-tokens N``: continuations of prompts by a causal LM.

MODEL is a run's ``model/`` folder, a run folder (its ``model/`` is used), a Hub id, or a preset
(``smollm2-135m``). Greedy by default; ``--temperature`` > 0 samples (``--top-p``, ``--seed``). Each prompt is
rendered as the run's training rendered a user turn (``leantrain.data.lm.sft.sample_inputs``): its template and
``data.system_prompt`` from ``model/leantrain.json``; ``--system`` (or ``data.system_prompt=...``) sets the system
prompt, ``--tools FILE`` the tool schemas; a model without a record: the tokenizer's chat template when it has one.
``--no-chat``: the raw prompt. Text to stdout, logs to stderr.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from pathlib import Path

from leantrain.config import resolve
from leantrain.data.lm.conversation import row_tools
from leantrain.data.lm.sft import Prompts, sample_inputs
from leantrain.engine.devices.accelerator import device_type, setup_logging
from leantrain.engine.devices.connector import choose_paths
from leantrain.engine.devices.paths import PathsContext
from leantrain.engine.setup.preflight import check_weights
from leantrain.engine.setup.run_settings import stored_prompt_format, with_run_settings
from leantrain.heartbeat import reporting
from leantrain.modeling.positions import position_limit
from leantrain.errors import UserError
from leantrain.modeling.generation.continuations import continuations
from leantrain.modeling.generation.prompts import check_room, check_settings, prompt_lengths, prompt_texts
from leantrain.modeling.load import is_adapter_folder, load_adapter_model
from leantrain.modeling.hubcheck import check_model_name
from leantrain.modeling.names import resolve_model_name
from leantrain.report.progress import Progress
from leantrain.modeling.pad_token import ensure_pad_token

log = logging.getLogger("leantrain")


def model_folder(name: str, revision: str | None = None) -> str:
    """The folder or Hub id to load: a run folder (with ``model/config.json``) stands for its model/; a preset or
    the packaged model for its folder; anything else as given (checked: a missing folder or unknown Hub id exits 2)."""
    path = Path(name).expanduser()
    if path.is_dir() and not (path / "config.json").is_file() and (path / "model" / "config.json").is_file():
        return str(path / "model")
    resolved = resolve_model_name(name, revision)
    check_model_name(resolved, revision)
    return resolved


def causal_lm_config(name: str, *, revision: str | None = None, trust_remote_code: bool = False,
                     allow_pickle: bool = False):
    """The config of a causal LM folder or Hub id (exit 2 when it is none, or has weights leantrain won't load)."""
    from transformers import AutoConfig

    check_weights(name, allow_pickle)
    kwargs = {"revision": revision, "trust_remote_code": trust_remote_code}
    try:
        config = AutoConfig.from_pretrained(name, **kwargs)
    except (OSError, ValueError) as e:
        raise UserError(f"could not read the config of {name!r}: {str(e).splitlines()[0] if str(e) else e}") from None
    archs = getattr(config, "architectures", None) or []
    if archs and not any(a.endswith(("ForCausalLM", "LMHeadModel", "ForConditionalGeneration")) for a in archs):
        raise UserError(f"{name} is a {', '.join(archs)}, not a causal language model; leantrain generate needs one "
                        "(e.g. a run of model.task=causal-lm, or smollm2-135m)")
    return config


def load_causal_lm_tokenizer(name: str, *, revision: str | None = None, trust_remote_code: bool = False):
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(name, revision=revision, trust_remote_code=trust_remote_code)
    except (OSError, ValueError) as e:
        raise UserError(f"could not load the tokenizer of {name!r}: "
                        f"{str(e).splitlines()[0] if str(e) else type(e).__name__}") from None
    ensure_pad_token(tokenizer, name)
    return tokenizer


def load_causal_lm_model(name: str, *, revision: str | None = None, trust_remote_code: bool = False,
                         allow_pickle: bool = False):
    """The model of a causal LM folder, Hub id or LoRA adapter folder (loaded over its base), on the accelerator
    when there is one, in eval mode."""
    import torch
    from transformers import AutoModelForCausalLM

    kwargs = {"revision": revision, "trust_remote_code": trust_remote_code,
              "use_safetensors": None if allow_pickle else True}
    try:
        if is_adapter_folder(name):
            model = load_adapter_model(name, AutoModelForCausalLM, kwargs)
        else:
            model = AutoModelForCausalLM.from_pretrained(name, **kwargs)
    except (OSError, ValueError) as e:
        raise UserError(f"could not load {name!r} as a causal language model (AutoModelForCausalLM): "
                        f"{str(e).splitlines()[0] if str(e) else type(e).__name__}") from None
    return model.to(torch.device(device_type())).eval()


def read_tools(path: str | None) -> list[dict] | None:
    """``--tools FILE``: a JSON list of function schemas (as a training row's ``tools`` holds), or None."""
    if path is None:
        return None
    try:
        return row_tools({"tools": Path(path).expanduser().read_text(encoding="utf-8")})
    except OSError as e:
        raise UserError(f"--tools {path}: cannot read it ({e.strerror or e})") from None
    except ValueError as e:
        raise UserError(f"--tools {path}: {e}") from None


def rendered_prompts(folder: str, tokenizer, cfg, prompts: list[str], chat: bool | None,  # noqa: ANN001
                     tools: list[dict] | None) -> Prompts:
    """The prompts as the run's training rendered a user turn (its format, template and system prompt from
    ``model/leantrain.json``, with ``cfg``'s keys first); ``chat=False`` (--no-chat): the raw prompts; ``chat=True``:
    the chat template (exit 2 for a run trained without it)."""
    if chat is False:
        return Prompts(list(prompts), False)
    rendered = sample_inputs(prompts, tokenizer, cfg.data, stored_prompt_format(folder), tools)
    if chat and rendered.chat is False:
        raise UserError(f"chat=True, but {folder} was trained on prompts without the chat template (data.template "
                        f"{cfg.data.template!r} or prompt/completion rows)")
    return dataclasses.replace(rendered, chat=True) if chat else rendered


def system_override(cfg, system: str | None):  # noqa: ANN001, ANN201 - leantrain Config
    """``cfg`` with ``--system``'s text as data.system_prompt (given: the run's stays out); None: as it is."""
    if system is None:
        return cfg
    return cfg.model_copy(update={"data": cfg.data.model_copy(update={"system_prompt": system})})


def generate(model_name: str, prompts: list[str], *, max_new_tokens: int, temperature: float = 0.0,
             top_p: float = 1.0, seed: int | None = None, chat: bool | None = None, system: str | None = None,
             tools_file: str | None = None, overrides: list[str] = ()) -> dict:
    """Load the model and return {"model", "chat", "system", "temperature", "top_p", "seed", "max_new_tokens",
    "seconds", "paths" (the attention and the decode step chosen, and why), "continuations": [{"prompt", "text"},
    ...]}. The settings, the prompts and their room in the model's positions are checked before the model loads."""
    if not prompts:
        raise UserError("leantrain generate needs at least one --prompt")
    blank = [i for i, p in enumerate(prompts, 1) if not p.strip()]
    if blank:
        raise UserError(f"--prompt {blank[0]} is empty: give each prompt some text")
    check_settings(max_new_tokens, temperature, top_p, seed, prefix="--")
    tools = read_tools(tools_file)
    cfg = system_override(resolve(None, list(overrides)), system)  # model.revision, model.trust_remote_code, ...
    own_system = bool(cfg.data.system_prompt) and "system_prompt" in cfg.data.model_fields_set  # not the run's
    given = [w for w, v in (("a system prompt (--system / data.system_prompt)", own_system), ("--tools", tools)) if v]
    setup_logging(True)
    folder = model_folder(model_name, cfg.model.revision)
    cfg = with_run_settings(folder, cfg, None, keys=("template", "system_prompt"))  # unless set here
    hub = {"revision": cfg.model.revision, "trust_remote_code": cfg.model.trust_remote_code}
    config = causal_lm_config(folder, allow_pickle=cfg.model.allow_pickle, **hub)
    tokenizer = load_causal_lm_tokenizer(folder, **hub)
    rendered = rendered_prompts(folder, tokenizer, cfg, prompts, chat, tools)
    texts, templated = prompt_texts(tokenizer, rendered.texts, **rendered.context())
    raw = not templated and rendered.texts == list(prompts)
    if raw and given:
        raise UserError(f"{' and '.join(given)} given, but the prompts go to the model as they are (--no-chat, no "
                        "chat template, or a run on prompt/completion rows): there is no place for them")
    check_room(prompt_lengths(tokenizer, texts, templated), max_new_tokens, position_limit(config), "--max-new-tokens")
    model = load_causal_lm_model(folder, allow_pickle=cfg.model.allow_pickle, **hub)
    log.info("generate: %s (%s, %s), %s, %s", folder, type(model).__name__, model.dtype,
             "chat template" if templated else "raw prompts" if raw else "plain template",
             f"sampling (temperature {temperature}, top_p {top_p}, seed {seed})" if temperature > 0 else "greedy")
    paths = choose_paths(model, PathsContext("generate", next(model.parameters()).device, generates=True))
    for line in paths.lines():  # the attention, the decode step
        log.info(line)
    start = time.perf_counter()
    with reporting(Progress(0, enabled=True, mode=cfg.report.progress).sink):  # long generation: how far
        texts = continuations(model, tokenizer, rendered.texts, max_new_tokens=max_new_tokens,
                              temperature=temperature, top_p=top_p, seed=seed, **rendered.context())
    return {"model": folder, "chat": templated, "system": None if raw else cfg.data.system_prompt or None,
            "temperature": temperature, "top_p": top_p, "seed": seed,
            "max_new_tokens": max_new_tokens, "seconds": round(time.perf_counter() - start, 3),
            "paths": paths.record(), "continuations": [{"prompt": p, "text": t} for p, t in zip(prompts, texts)]}


def generate_command(model_name: str, prompts: list[str], overrides: list[str], *, max_new_tokens: int,
                     temperature: float = 0.0, top_p: float = 1.0, seed: int | None = None, chat: bool | None = None,
                     system: str | None = None, tools_file: str | None = None, as_json: bool = False) -> int:
    """``leantrain generate``: each continuation on stdout (one prompt: the text alone; several: each under a
    ``### prompt`` line), or one JSON object with ``--json``."""
    result = generate(model_name, prompts, max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p,
                      seed=seed, chat=chat, system=system, tools_file=tools_file, overrides=overrides)
    if as_json:
        print(json.dumps(result, indent=2, ensure_ascii=False))
    elif len(prompts) == 1:
        print(result["continuations"][0]["text"])
    else:
        for c in result["continuations"]:
            print(f"### {c['prompt']}\n{c['text']}\n")
    return 0
