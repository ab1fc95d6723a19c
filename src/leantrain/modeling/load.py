"""Load or build the model of a run: its config, processor and AutoModelFor<task> from a Hub id, a local folder
or (``model.config`` / ``model.config_type``) from a config alone; the task ``model.task=auto`` decides; label maps;
parameter counts.

Loading is safe by default: safetensors weights only (``model.allow_pickle`` opts into *.bin), no remote code
(``model.trust_remote_code``), and a warning when remote code runs without a pinned revision.
"""

from __future__ import annotations

import logging
import math
import re
from pathlib import Path
from typing import Any

import torch

from leantrain.config import ModelConfig
from leantrain.errors import ConfigError, UserError
from leantrain.modeling import short_attention
from leantrain.modeling.hubcheck import check_model_name
from leantrain.modeling.head_reuse import needs_remap, remap_head
from leantrain.modeling.names import (CLASSIFIER_ARCHS, PACKAGED_MODEL, packaged_model_path,  # noqa: F401
                                      resolve_model_name)
from leantrain.modeling.pad_token import ensure_pad_token
from leantrain.modeling.switches import embeddings_of
from leantrain.modeling.from_scratch import build_processor, check_config_overrides, config_from_spec, from_scratch
from leantrain.modeling.peft_import import import_peft, peft_quiet

log = logging.getLogger("leantrain")

# Weights are loaded in fp32 whatever dtype the checkpoint holds (transformers 5 keeps a bf16 checkpoint in bf16 by
# default): training updates fp32 master weights (mixed precision is autocast's, efficiency.precision), and eval /
# predict compute in full precision. A bf16 checkpoint's values are exact in fp32, so nothing is lost by loading.
WEIGHTS_DTYPE = torch.float32


def model_name(cfg: ModelConfig) -> str:
    return resolve_model_name(cfg.name, cfg.revision)


def _hub_kwargs(cfg: ModelConfig) -> dict[str, Any]:
    if cfg.trust_remote_code and not cfg.revision:
        log.warning("model.trust_remote_code is on without model.revision: pin a commit so the code you run can't change")
    return {"revision": cfg.revision, "trust_remote_code": cfg.trust_remote_code}


def _weights_kwargs(cfg: ModelConfig) -> dict[str, Any]:
    """``from_pretrained`` keywords of every weight load: safetensors only unless ``model.allow_pickle``, plus the
    Hub's revision / remote-code keywords."""
    return {"use_safetensors": None if cfg.allow_pickle else True, **_hub_kwargs(cfg)}


def _load_error(name: str, err: Exception) -> UserError:
    where = "local folder" if Path(name).exists() else "Hub id (is the Hub reachable? set HF_HUB_OFFLINE=1 to fail fast)"
    return UserError(f"could not load model {name!r} as a {where}: {err}")


def load_config(cfg: ModelConfig):
    from transformers import AutoConfig

    if from_scratch(cfg):
        return config_from_spec(cfg)
    name = model_name(cfg)
    check_model_name(name, cfg.revision)  # a missing folder or an unknown Hub id: named, in seconds
    try:
        return AutoConfig.from_pretrained(name, **_hub_kwargs(cfg))
    except (OSError, ValueError) as e:
        raise _load_error(name, e) from None


def load_tokenizer(cfg: ModelConfig, *, say: bool = True):
    """The tokenizer (model.tokenizer, else the model's), with a pad token; ``say``: log the EOS-as-pad choice (the
    processor's load says it; the loads that only read its vocabulary or ids do not repeat it)."""
    from transformers import AutoTokenizer

    name = cfg.tokenizer or model_name(cfg)  # model.tokenizer (causal LM) wins over the model's own
    try:
        tokenizer = AutoTokenizer.from_pretrained(name, **_hub_kwargs(cfg))
    except (OSError, ValueError) as e:
        raise _load_error(name, e) from None
    ensure_pad_token(tokenizer, name, say=say)  # GPT-2 / Llama-style tokenizers: EOS as pad token
    return tokenizer


def load_processor(cfg: ModelConfig, task, *, say: bool = True):  # noqa: ANN001 - a leantrain.methods Task
    """The model's own processor: tokenizer (text), image processor (images) or feature extractor (audio); ``say``:
    as ``load_tokenizer``'s (the data checks' early load is quiet, the run's own load says it).

    A model trained from scratch (model.config / model.config_type) gets one built from its config."""
    kind = task.traits.processor
    if kind == "tokenizer":
        return load_tokenizer(cfg, say=say)
    if from_scratch(cfg):
        return build_processor(load_config(cfg), kind)
    from transformers import AutoFeatureExtractor, AutoImageProcessor

    name = model_name(cfg)
    auto = {"image_processor": AutoImageProcessor, "feature_extractor": AutoFeatureExtractor}[kind]
    try:
        return auto.from_pretrained(name, **_hub_kwargs(cfg))
    except (OSError, ValueError) as e:
        raise _load_error(name, e) from None


_DEFAULT_LABEL = re.compile(r"^LABEL_\d+$")


def trained_label_names(config) -> list[str] | None:
    """The label names a fine-tuned classifier carries, or None for a base model (no head, or LABEL_i names)."""
    id2label = getattr(config, "id2label", None) or {}
    archs = getattr(config, "architectures", None) or []
    if not id2label or not any(c in a for a in archs for c in CLASSIFIER_ARCHS):
        return None
    names = [str(id2label[i]) for i in sorted(id2label, key=int)]
    return None if all(_DEFAULT_LABEL.match(n) for n in names) else names


def build_model(cfg: ModelConfig, label_names: list[str], task, extra: dict | None = None,  # noqa: ANN001 - a Task
                attention: str | None = None):
    """The task's AutoModelFor... (unset: the text classifier's) with the data's labels; a new head when the label
    set changes.

    With model.config / model.config_type: random initialisation from that config (seeded by the caller).
    ``extra``: more ``from_pretrained`` keywords (QLoRA's quantization_config / device_map / dtype); ``attention``:
    transformers' ``attn_implementation`` (None: its default, SDPA where the class has it;
    ``leantrain.modeling.attention.choose_attention`` decides it for a run)."""
    auto = task.model.auto_class()
    if attention == short_attention.NAME:
        short_attention.register()
    attn = {"attn_implementation": attention} if attention else {}
    config = load_config(cfg)
    check_config_overrides(config, cfg.config_overrides)
    labels = task.model.fields(label_names)  # num_labels, label maps, problem_type: the task's
    if from_scratch(cfg):
        config.update(labels)
        config.update(_scratch_fields(cfg, task, config))
        try:
            model = auto.from_config(config, **attn)
        except ValueError as e:
            raise UserError(f"cannot build a {task.name} model from {config.model_type!r} config: {e}") from None
        log.info("new model: random initialisation from a %s config (train.seed)", config.model_type)
        return _made_ready(model, cfg, task)
    trained = trained_label_names(config)
    remap = needs_remap(trained, label_names, cfg.reuse_head)  # a fine-tuned head: rows follow the label names
    kwargs = {  # a dict display: an override of a field the task sets (problem_type) is no duplicate keyword
        **({} if remap else labels),
        "ignore_mismatched_sizes": not remap and trained != label_names,  # a new head for a base model
        "dtype": WEIGHTS_DTYPE,  # QLoRA's extra sets its own
        **attn,
        **_weights_kwargs(cfg),
        **cfg.config_overrides,
        **(extra or {}),
    }
    name = model_name(cfg)
    try:
        model, info = auto.from_pretrained(name, output_loading_info=True, **kwargs)
    except (OSError, ValueError) as e:
        if not cfg.allow_pickle and "safetensors" in str(e).lower():
            raise UserError(
                f"model {name!r} has no safetensors weights; leantrain refuses pickle files (*.bin) by default "
                "because loading them can run code. If you trust the source, set model.allow_pickle=true"
            ) from None
        raise _load_error(name, e) from None
    fresh = sorted(set(info.get("missing_keys", [])) | {k for k, *_ in info.get("mismatched_keys", [])})
    if fresh:
        log.info("new weights (initialised from train.seed): %s", ", ".join(fresh[:6]) + (" ..." if len(fresh) > 6 else ""))
    if remap:
        remap_head(model, trained, label_names, cfg.reuse_head)  # logs what it did
    return _made_ready(model, cfg, task)


def meta_model(cfg: ModelConfig, task, config=None):  # noqa: ANN001 - a methods Task, a transformers config
    """The task's model on the meta device (shapes, no weights, milliseconds), from its config with
    ``model.config_overrides``: what the preflight checks measure before any weight loads. None when the
    architecture cannot be built so (remote code, a model that computes in its constructor)."""
    import copy

    config = copy.deepcopy(config if config is not None else load_config(cfg))
    if not from_scratch(cfg):
        config.update(cfg.config_overrides)
    try:
        with torch.device("meta"):
            return task.model.auto_class().from_config(config, trust_remote_code=cfg.trust_remote_code)
    except Exception:  # noqa: BLE001 - a best-effort look: the real build reports its own errors
        return None


def _scratch_fields(cfg: ModelConfig, task, config) -> dict:  # noqa: ANN001 - a leantrain.methods Task
    """The task's processor-dependent fields of a model from a config (causal LM: vocab_size = len(tokenizer),
    special token ids; ``Model.check_keys`` checked model.tokenizer before, with the run). A vocab_size the user set larger than the tokenizer's is kept (e.g. padded to a multiple of
    64); a smaller one cannot hold the token ids: exit 2."""
    fields = task.model.scratch_fields(cfg)
    given = cfg.config_overrides.get("vocab_size")
    if given is not None and "vocab_size" in fields:
        if given < fields["vocab_size"]:
            raise ConfigError(f"model.config_overrides.vocab_size={given} is smaller than the tokenizer's vocabulary "
                              f"({fields['vocab_size']} tokens, model.tokenizer={cfg.tokenizer}); leave it unset")
        fields["vocab_size"] = given
    if "vocab_size" in fields and fields["vocab_size"] != getattr(config, "vocab_size", None):
        log.info("new model: vocab_size %d (the tokenizer's)", fields["vocab_size"])
    return fields


def _made_ready(model, cfg: ModelConfig, task):  # noqa: ANN001 - a leantrain.methods Task
    """The model made ready by its method (``Model.finish``: a sequence classifier's pooler, a text model's pad
    token)."""
    return task.model.finish(model, cfg)


def parameter_numel(p) -> int:
    """A parameter's element count; a bitsandbytes 4-bit weight (``Params4bit``, two values packed per byte)
    counts the values of its original shape."""
    state = getattr(p, "quant_state", None) if type(p).__name__ == "Params4bit" else None
    shape = getattr(state, "shape", None)
    return int(math.prod(shape)) if shape is not None else p.numel()


def parameter_counts(model) -> dict[str, int]:
    """Total, trainable, and embedding parameters (input embeddings and position/type embeddings)."""
    total = sum(parameter_numel(p) for p in model.parameters())
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    emb_ids = set()
    for mod in model.modules():
        if type(mod).__name__ == "Embedding":
            emb_ids.update(id(p) for p in mod.parameters())
    embeddings = sum(p.numel() for p in model.parameters() if id(p) in emb_ids)
    return {"total": total, "trainable": trainable, "embeddings": embeddings, "non_embedding": total - embeddings}


def flop_parameters(model, counts: dict[str, int]) -> int:
    """The parameters that do a multiply-add per token (MFU's N): the non-embedding ones, plus an output layer that
    shares the input embedding's weight (a tied LM head multiplies every token by the vocabulary matrix; nanoGPT's
    estimate counts it); an untied output layer is no Embedding and is counted already."""
    n = counts["non_embedding"]
    out, inp = embeddings_of(model, "get_output_embeddings"), embeddings_of(model, "get_input_embeddings")
    weight = getattr(out, "weight", None)
    if weight is not None and inp is not None and weight is getattr(inp, "weight", None):
        n += weight.numel()
    return n


def save_dtype(cfg: ModelConfig) -> torch.dtype:
    """The dtype model/ is saved in: ``model.save_dtype=float32``, or (``auto``) the checkpoint's own as its config
    records it (a 16-bit one: bf16 / fp16), float32 for an fp32 checkpoint or a model built from a config."""
    if cfg.save_dtype == "float32" or from_scratch(cfg):
        return torch.float32
    dtype = getattr(load_config(cfg), "dtype", None)
    dtype = getattr(torch, dtype, None) if isinstance(dtype, str) else dtype
    return dtype if dtype in (torch.bfloat16, torch.float16) else torch.float32


def load_trained_model(model_dir: str, task, cfg: ModelConfig):  # noqa: ANN001 - a leantrain.methods Task
    """A trained model folder for eval / predict: the task's AutoModelFor..., fp32 weights (``WEIGHTS_DTYPE``),
    safetensors unless ``model.allow_pickle``. A LoRA adapter folder (``peft.merge=false``) is loaded over its base
    and merged."""
    kwargs = {"dtype": WEIGHTS_DTYPE, **_weights_kwargs(cfg)}
    if is_adapter_folder(model_dir):
        return load_adapter_model(model_dir, task.model.auto_class(), kwargs)
    return task.model.auto_class().from_pretrained(model_dir, **kwargs)


ADAPTER_CONFIG = "adapter_config.json"


def is_adapter_folder(folder: str) -> bool:
    """A peft adapter folder (``adapter_config.json``), such as a run's ``adapter/`` with ``peft.merge=false``."""
    return (Path(folder) / ADAPTER_CONFIG).is_file()


def adapter_base(folder: str) -> str:
    """The base model an adapter folder was trained over (its ``base_model_name_or_path``), checked: exit 2 when
    it was not recorded (a base built from a config: its random weights were not saved) or cannot be found."""
    import json

    try:
        base = json.loads((Path(folder) / ADAPTER_CONFIG).read_text()).get("base_model_name_or_path")
    except (OSError, ValueError) as e:
        raise UserError(f"{folder}: {ADAPTER_CONFIG} cannot be read ({e})") from None
    if not base:
        raise UserError(f"{folder} is a LoRA adapter over a model built from a config (model.config / "
                        "model.config_type), whose random initial weights were not saved, so it cannot be loaded "
                        "again; train with peft.merge=true to keep the whole model in model/")
    check_model_name(base)
    return base


def load_adapter_model(folder: str, auto, kwargs: dict):  # noqa: ANN001 - an AutoModelFor... class
    """The base of an adapter folder (``adapter_base``) loaded with ``auto`` and the folder's config (the task's
    label maps), the adapter put over it and merged (peft's ``merge_and_unload``): a plain transformers model."""
    from transformers import AutoConfig


    base = adapter_base(folder)
    config = AutoConfig.from_pretrained(folder, trust_remote_code=kwargs.get("trust_remote_code", False))
    try:
        model = auto.from_pretrained(base, config=config, **kwargs)
    except (OSError, ValueError) as e:
        raise _load_error(base, e) from None
    with peft_quiet():
        return import_peft().PeftModel.from_pretrained(model, folder).merge_and_unload()


def inspect_model(cfg: ModelConfig, classifier_class) -> dict[str, Any]:  # noqa: ANN001 - a callable
    """Config and parameter counts of a model, as ``leantrain inspect`` prints them.

    A fine-tuned classifier is loaded as such (``classifier_class(config)``: its AutoModelFor... class); a base model
    gets the AutoModel it was saved as.
    """
    from transformers import AutoModel


    config = load_config(cfg)
    archs = getattr(config, "architectures", None) or []
    classifier = any(c in a for a in archs for c in CLASSIFIER_ARCHS)
    auto = classifier_class(config) if classifier else AutoModel
    name = model_name(cfg)
    try:
        model = auto.from_pretrained(name, **_weights_kwargs(cfg))
    except (OSError, ValueError) as e:
        raise _load_error(name, e) from None
    return {"name": name, "class": type(model).__name__, "parameters": parameter_counts(model),
            "labels": trained_label_names(config), "config": config.to_diff_dict()}


def detection_config(m: ModelConfig):
    """The model's config for ``model.task=auto``, or None when there is no model to read (an unreachable Hub id:
    building the model reports it)."""
    if not (m.name or m.config or m.config_type):
        return None
    try:
        return load_config(m)
    except ConfigError:
        raise
    except UserError:
        return None
