"""Which parameters a run trains: LoRA adapters through the ``peft`` library (``peft.*``), and freezing without
LoRA (``model.freeze``).

``apply_trainable(model, model_cfg, peft_cfg)`` is the one entry point (``leantrain train`` and ``leantrain plan``
call it on the freshly built model, before gradient checkpointing, the memory model and the optimizer see it):

- ``peft.method=lora``: ``peft.get_peft_model`` with a ``LoraConfig`` whose ``target_modules`` are, with ``auto``,
  the Linear (and GPT-2 ``Conv1D``) modules inside the architecture's repeated blocks (the attention and MLP
  projections: q_proj..down_proj for Llama, c_attn/c_proj/c_fc for GPT-2, query/key/value/dense for BERT) and whose
  ``modules_to_save`` are the task's head (the model's top-level children besides its base model, except the
  output embeddings of an LM): a classifier's fresh head stays trainable.
- ``model.freeze``: patterns over parameter names; a part ``0-3`` expands to 0, 1, 2, 3; ``*`` matches within one
  part; a pattern matches at part boundaries anywhere in the name; ``embeddings`` is the model's input embeddings
  plus any module named ``embeddings`` (BERT's word/position/type embeddings and their LayerNorm).

Saving (``save_adapter`` / ``merged_for_saving``): the adapter folder through peft's ``save_pretrained``, and the
merged model (``merge_and_unload``) that loads with ``pipeline()`` without peft.
"""

from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass, field
from pathlib import Path

from torch import nn

from leantrain.config import ModelConfig, PeftConfig
from leantrain.errors import ConfigError, UserError
from leantrain.modeling import qlora
from leantrain.modeling.load import parameter_numel
from leantrain.modeling.peft_import import import_peft, peft_quiet
from leantrain.modeling.switches import embeddings_of, repeated_blocks

log = logging.getLogger("leantrain")

LINEAR_TYPES = ("Linear", "Conv1D")  # torch's Linear; transformers' Conv1D (GPT-2) that peft adapts too


@dataclass
class Trainable:
    """What ``apply_trainable`` did, for the log and summary.json's ``model.peft`` / ``model.frozen``."""

    method: str = "none"
    target_modules: list[str] = field(default_factory=list)  # short names (the last part), as printed
    modules_to_save: list[str] = field(default_factory=list)
    frozen: dict[str, int] = field(default_factory=dict)  # freeze pattern -> parameters it froze
    trainable: int = 0
    total: int = 0
    quantization: dict | None = None  # peft.method=qlora: the 4-bit base (modeling.qlora.record)

    def record(self, peft_cfg: PeftConfig) -> dict:
        out: dict = {"method": self.method, "trainable_parameters": self.trainable, "total_parameters": self.total}
        if self.method != "none":
            out.update(r=peft_cfg.r, alpha=peft_cfg.alpha, dropout=peft_cfg.dropout,
                       target_modules=self.target_modules, modules_to_save=self.modules_to_save,
                       merged=peft_cfg.merge)
        if self.quantization:
            out["quantization"] = self.quantization
        if self.frozen:
            out["frozen"] = self.frozen
        return out


def is_peft_model(model: nn.Module) -> bool:
    """A peft PeftModel (duck-typed: no import of peft for runs without it)."""
    return hasattr(model, "peft_config") and hasattr(model, "get_base_model") and hasattr(model, "merge_and_unload")


def head_modules(model: nn.Module) -> list[str]:
    """The task head: the model's top-level children with parameters, besides its base model (``bert``, ``model``,
    ``transformer``, ...), leaving out a child that holds the output embeddings (an LM's ``lm_head``)."""
    prefix = getattr(model, "base_model_prefix", None)
    out_emb = embeddings_of(model, "get_output_embeddings")
    heads = []
    for name, child in model.named_children():
        if name == prefix or next(child.parameters(), None) is None:
            continue
        if out_emb is not None and any(m is out_emb for m in child.modules()):
            continue
        heads.append(name)
    return heads


def _is_linear(module: nn.Module) -> bool:
    return isinstance(module, nn.Linear) or type(module).__name__ in LINEAR_TYPES


def linear_names(model: nn.Module) -> list[str]:
    """Full names of every Linear / Conv1D module (what a LoRA target can be)."""
    return [n for n, m in model.named_modules() if n and _is_linear(m)]


def auto_target_modules(model: nn.Module) -> list[str]:
    """Full names of the Linear modules inside the repeated blocks (attention and MLP projections); without blocks,
    every Linear outside the head and the output embeddings."""
    inside = {id(m) for b in repeated_blocks(model) for m in b.modules()}
    heads = tuple(f"{h}." for h in head_modules(model)) + tuple(head_modules(model))
    out_emb = embeddings_of(model, "get_output_embeddings")
    found = [n for n, m in model.named_modules() if n and _is_linear(m) and m is not out_emb
             and not n.startswith(heads) and (not inside or id(m) in inside)]
    if not found:
        raise ConfigError(f"peft.target_modules=auto: {type(model).__name__} has no Linear modules to adapt; "
                          "name them in peft.target_modules=[...]")
    return found


def short_names(names: list[str]) -> list[str]:
    """The distinct last parts of module names, in first-seen order (q_proj, k_proj, ...)."""
    return list(dict.fromkeys(n.rsplit(".", 1)[-1] for n in names))


def lora_targets(model: nn.Module, peft_cfg: PeftConfig) -> tuple[list[str], list[str]]:
    """(the full names of the modules LoRA adapts, as shown in the log). ``auto``: ``auto_target_modules``; a list:
    each name matches a module named so or ending in ``.name`` (peft's rule), and must match a Linear / Conv1D /
    Embedding module: ConfigError naming the ones that match nothing, with the model's Linear modules."""
    if peft_cfg.target_modules == "auto":
        targets = auto_target_modules(model)
        return targets, short_names(targets)
    wanted = list(peft_cfg.target_modules)
    found, unmatched = [], []
    for key in wanted:
        hits = [n for n, m in model.named_modules() if n and (n == key or n.endswith("." + key))
                and (_is_linear(m) or isinstance(m, nn.Embedding))]
        (found.extend(hits) if hits else unmatched.append(key))
    if unmatched:
        raise ConfigError(f"peft.target_modules: no Linear or Embedding module of {type(model).__name__} is named "
                          f"{' or '.join(map(repr, unmatched))}",
                          [f"the model's Linear modules: {', '.join(short_names(linear_names(model)))}"])
    return list(dict.fromkeys(found)), wanted


def check_rank(model: nn.Module, targets: list[str], r: int) -> None:
    """``peft.r`` at most the largest rank a target's update can have (min of its input and output sizes): a larger
    rank adds parameters and memory, never expressiveness. ConfigError naming the sizes."""
    modules = dict(model.named_modules())
    ranks = {name: min(_shape(modules[name])) for name in targets if _shape(modules[name])}
    if ranks and r > max(ranks.values()):
        widest = max(ranks, key=ranks.get)
        raise ConfigError(f"peft.r={r} is more than the target layers' rank allows: the largest, {widest} "
                          f"({' x '.join(map(str, _shape(modules[widest])))}), has rank at most {ranks[widest]}; "
                          f"set peft.r={ranks[widest]} or less (8-64 is usual)")


def _shape(module: nn.Module) -> tuple[int, int] | None:
    """(input size, output size) of a Linear, Conv1D or Embedding module."""
    weight = getattr(module, "weight", None)
    if weight is None or weight.dim() != 2:
        return None
    rows, cols = weight.shape
    return (int(rows), int(cols)) if type(module).__name__ == "Conv1D" else (int(cols), int(rows))


def lora_parameters(model: nn.Module, targets: list[str], r: int) -> int:
    """Trainable parameters LoRA adds: r x (input + output size) per target."""
    modules = dict(model.named_modules())
    return sum(r * sum(_shape(modules[n])) for n in targets if _shape(modules[n]))


def apply_lora(model: nn.Module, peft_cfg: PeftConfig) -> tuple[nn.Module, Trainable]:
    """``peft.get_peft_model`` with the configured LoRA; the base frozen, the adapters and the task head trained."""
    peft = import_peft(peft_cfg.method)
    targets, shown = lora_targets(model, peft_cfg)
    heads = head_modules(model)
    lora = peft.LoraConfig(r=peft_cfg.r, lora_alpha=peft_cfg.alpha, lora_dropout=peft_cfg.dropout,
                           target_modules=targets, modules_to_save=heads or None, bias="none")
    try:
        with peft_quiet():
            model = peft.get_peft_model(model, lora)
    except ValueError as e:
        available = short_names(linear_names(model))
        raise ConfigError(f"peft.target_modules={shown}: {e}", [f"the model's Linear modules: "
                                                                 f"{', '.join(available)}"]) from None
    return model, Trainable("lora", shown, heads)


# ---------------------------------------------------------------------------------------------------- freezing


def pattern_regex(pattern: str) -> re.Pattern:
    """A freeze pattern as a regex over dotted parameter names: parts match whole parts, ``a-b`` (numbers) is the
    range a..b, ``*`` any run of characters within one part; anchored at part boundaries anywhere in the name."""
    parts = []
    for part in pattern.strip(".").split("."):
        rng = re.fullmatch(r"(\d+)-(\d+)", part)
        if rng:
            lo, hi = int(rng.group(1)), int(rng.group(2))
            if lo > hi:
                raise ConfigError(f"model.freeze: {pattern!r}: the range {part} is empty (write low-high)")
            parts.append("(?:" + "|".join(str(i) for i in range(lo, hi + 1)) + ")")
        else:
            parts.append(re.escape(part).replace(r"\*", r"[^.]*"))
    return re.compile(r"(?:^|\.)" + r"\.".join(parts) + r"(?:\.|$)")


def matching_parameters(model: nn.Module, pattern: str) -> list[str]:
    """Names of the parameters ``pattern`` selects (``embeddings``: the input embeddings too)."""
    rx = pattern_regex(pattern)
    names = [n for n, _ in model.named_parameters() if rx.search(n)]
    if pattern == "embeddings":
        emb = embeddings_of(model)
        ids = {id(p) for p in emb.parameters()} if emb is not None else set()
        names += [n for n, p in model.named_parameters() if id(p) in ids and n not in names]
    return names


def top_level_modules(model: nn.Module, depth: int = 2) -> list[str]:
    """Module names down to ``depth`` parts (a numbered list shown as a range), for an unmatched pattern's hint."""
    out: dict[str, None] = {}
    for name, mod in model.named_modules():
        if not name or name.count(".") >= depth or next(mod.parameters(), None) is None:
            continue
        if isinstance(mod, nn.ModuleList) and len(mod):
            name = f"{name}.0-{len(mod) - 1}"
        out[name] = None
    return list(out)


def freeze(model: nn.Module, patterns: list[str]) -> dict[str, int]:
    """Freeze the parameters matching each pattern (ConfigError naming an unmatched one and the model's modules);
    returns pattern -> parameters frozen by it."""
    params = dict(model.named_parameters())
    frozen: dict[str, int] = {}
    for pattern in patterns:
        names = matching_parameters(model, pattern)
        if not names:
            raise ConfigError(f"model.freeze: {pattern!r} matches no parameter of {type(model).__name__}",
                              [f"its modules: {', '.join(top_level_modules(model))}"])
        for n in names:
            params[n].requires_grad_(False)
        frozen[pattern] = sum(params[n].numel() for n in names)
    return frozen


# ------------------------------------------------------------------------------------------------ entry points


def apply_trainable(model: nn.Module, model_cfg: ModelConfig, peft_cfg: PeftConfig, *,
                    gradient_checkpointing: bool = False) -> tuple[nn.Module, Trainable]:
    """LoRA (``peft.method``) and then ``model.freeze`` on the built model; logs what is trained. Returns the model
    (a PeftModel under LoRA) and what was done. QLoRA: peft's ``prepare_model_for_kbit_training`` on the 4-bit model
    (``gradient_checkpointing``: the run's setting) and then the same LoRA."""
    done = Trainable()
    if peft_cfg.method == "qlora":
        model = qlora.prepare(model, gradient_checkpointing)
    if peft_cfg.method in ("lora", "qlora"):
        model, done = apply_lora(model, peft_cfg)
        if peft_cfg.method == "qlora":
            done.method, done.quantization = "qlora", qlora.record()
            log.info("QLoRA: base weights 4-bit %s (double quantisation, %s compute)",
                     done.quantization["quant_type"], done.quantization["compute_dtype"])
        log.info("LoRA: r=%d alpha=%g dropout=%g on %s%s", peft_cfg.r, peft_cfg.alpha, peft_cfg.dropout,
                 ", ".join(done.target_modules),
                 f"; trained in full: {', '.join(done.modules_to_save)}" if done.modules_to_save else "")
    if model_cfg.freeze:
        done.frozen = freeze(model, model_cfg.freeze)
        log.info("frozen: %s", "; ".join(f"{p} ({n / 1e6:.2f}M parameters)" for p, n in done.frozen.items()))
    done.total = sum(parameter_numel(p) for p in model.parameters())  # 4-bit weights: their values
    done.trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    if done.method != "none" or done.frozen:
        log.info("trainable: %s of %s parameters (%.2f%%)", f"{done.trainable:,}", f"{done.total:,}",
                 100 * done.trainable / max(done.total, 1))
        if done.trainable == 0:
            raise ConfigError("model.freeze / peft leave no trainable parameter: nothing to train")
    return model, done


# ------------------------------------------------------------------------------------------------------ saving


def save_adapter(model: nn.Module, folder: Path) -> None:
    """The adapter (LoRA weights + the trained head, adapter_config.json) through peft's save_pretrained."""
    model.save_pretrained(folder, safe_serialization=True)


def merged_for_saving(model: nn.Module) -> nn.Module:
    """The base model with the LoRA updates merged into its weights (peft's ``merge_and_unload``): a plain
    transformers model that loads without peft. Input and output embeddings that share one weight are untied first
    when a LoRA adapts either (``untie_adapted_embeddings``): merged into the shared weight, the update of one would
    change the other too. Changes ``model`` in place: call at the end of a run."""
    if untie_adapted_embeddings(model):
        log.info("LoRA adapts a tied embedding: model/ keeps the input and output embeddings untied "
                 "(tie_word_embeddings=false), as they were trained")
    return model.merge_and_unload()


def untie_adapted_embeddings(model: nn.Module) -> bool:
    """When the input and output embeddings of a PeftModel share one weight and a LoRA adapts either of them, give
    the output layer a copy of its own (and the config ``tie_word_embeddings=false``), so each merges its own update.
    Returns whether it did."""
    base = model.get_base_model()
    inp, out = base.get_input_embeddings(), base.get_output_embeddings()
    if inp is None or out is None:
        return False
    held_in, held_out = _base_layer(inp), _base_layer(out)
    if held_in.weight is not held_out.weight or (held_in is inp and held_out is out):
        return False
    held_out.weight = nn.Parameter(held_out.weight.detach().clone(), requires_grad=held_out.weight.requires_grad)
    for config in {id(c): c for c in (base.config, base.config.get_text_config())}.values():
        config.tie_word_embeddings = False
    return True


def _base_layer(module: nn.Module) -> nn.Module:
    """The layer a LoRA wraps (peft's ``get_base_layer``), or the module itself."""
    get = getattr(module, "get_base_layer", None)
    return get() if callable(get) else module


def adapter_state(model: nn.Module) -> dict:
    """The adapter's tensors (peft's ``get_peft_model_state_dict``)."""
    return import_peft().get_peft_model_state_dict(model)


def load_adapter_state(model: nn.Module, folder: Path) -> None:
    """Put an adapter folder's weights (adapter_model.safetensors) back into a PeftModel."""
    from safetensors.torch import load_file

    import_peft().set_peft_model_state_dict(model, load_file(str(Path(folder) / "adapter_model.safetensors")))


def save_adapter_only(model: nn.Module, folder: Path) -> str:
    """peft.merge=false: the adapter plus the task model's config.json (label maps, problem type) in ``folder``;
    returns how to load it, for the log."""
    base = model.get_base_model()
    arch = type(base).__name__
    base.config.architectures = [arch]  # as save_pretrained of the model would record it
    peft_config = model.peft_config[model.active_adapter]
    if peft_config.base_model_name_or_path and Path(peft_config.base_model_name_or_path).is_dir():
        peft_config.base_model_name_or_path = str(Path(peft_config.base_model_name_or_path).resolve())  # any cwd
    source = peft_config.base_model_name_or_path or "<base model>"
    save_adapter(model, folder)
    base.config.save_pretrained(folder)
    if qlora.is_quantized(base):  # the config of the full-precision base: the 4-bit load was this run's choice
        cfg_file = Path(folder) / "config.json"
        saved = json.loads(cfg_file.read_text())
        saved.pop("quantization_config", None)
        cfg_file.write_text(json.dumps(saved, indent=2, sort_keys=True) + "\n")
    if source == "<base model>":
        log.warning("warning: peft.merge=false on a model built from a config: its random initial weights are not "
                    "saved, so %s cannot be loaded again (peft.merge=true keeps the whole model)", folder)
    return (f"adapter only (peft.merge=false): leantrain eval / predict / generate load it over its base; with peft: peft.PeftModel.from_pretrained(transformers.{arch}"
            f".from_pretrained('{source}', config=transformers.AutoConfig.from_pretrained('{folder}')), '{folder}'); "
            "model.merge_and_unload() gives a plain transformers model")
