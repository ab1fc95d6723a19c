"""The chunked loss of a causal LM: per-token cross-entropy computed against the output layer a chunk of tokens at a
time, so the full ``tokens x vocab`` logits never exist in fp32, in the forward or the backward pass.

For real vocabularies (49k-150k) the logits dominate a causal LM's training memory: at 16 x 512 tokens and 50k words
the fp32 logits are 1.6 GB, and their gradient as much again. ``install_chunked_loss`` marks the output layer (its
chunk size and kernel) and gives it a forward pre-hook that does nothing but inside :func:`final_hidden`: there the
model's forward runs up to its output layer, the hook keeps the layer's input (the final hidden states of the
positions the forward keeps) and the dtype the layer's matmul would run in (the forward's autocast dtype, else the
weight's), and hands the layer no positions (the forward's ``logits`` are empty). The per-token losses are then one
explicit call (``leantrain.modeling.token_losses.token_losses``, the one every method makes), computed from those
hidden states and the layer's weight by :class:`ChunkedCrossEntropy` (or Liger's fused kernel:
``leantrain.modeling.output_loss``):

- forward: for each chunk of ``chunk_tokens`` tokens, logits = hidden @ W^T (in that dtype, as the plain layer
  would), then in fp32 the log-sum-exp and the target's logit (and, when asked, the entropy from the chunk's
  log-softmax); it keeps the hidden states, the weight, the targets and one fp32 log-sum-exp per token;
- backward: for each chunk again, softmax - one_hot(target) scaled by the incoming gradient gives d(logits) of the
  chunk, from which d(hidden) of the chunk and the chunk's share of d(W) (accumulated in one fp32 buffer).

So the largest temporary is one chunk's ``chunk_tokens x vocab`` fp32 logits (and their gradient in backward), not
the whole batch's. The cost is one more matmul of the output layer (the forward's, again in backward), the same
recomputation gradient checkpointing makes.

The forward goes through whatever wraps the model (DDP, FSDP2, compile, peft), so their hooks run as for the plain
layer; the loss reads the weight right after it: DDP's gradients are all-reduced as any other's, and FSDP2 keeps the
root's group (the output layer's, with the embeddings) unsharded from its forward to its backward. State-dict keys are
unchanged and tied embeddings stay tied (the weight is the layer's own parameter, read at call time). Outside
``final_hidden`` the layer is the plain one (generation, pipelines, evaluation without labels): nothing is stashed on
it between calls.

Models whose logits are post-processed after the output layer (Gemma's ``final_logit_softcapping``, Cohere's
``logit_scale``, Granite's ``logits_scaling``, ...) are refused: :func:`why_not_chunked` says why.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from leantrain.errors import ConfigError
from leantrain.modeling.output_loss import choose_output_loss, liger_available
from leantrain.modeling.wrappers import unwrapped

IGNORE = -100
# one chunk's logits: about this many fp32 values, whatever the vocabulary: 64 MiB on CPU; 256 MiB on GPUs, where
# smaller chunks leave the matmuls too small to keep the GPU busy (measured on an H200: benchmarks/results/causal-lm.md)
CHUNK_ELEMENTS = {"cpu": 2**24, "cuda": 2**26}
AUTO_MIN_VOCAB = 8192  # efficiency.chunked_loss=auto: on from this vocabulary size (below it the logits are small)
# Config fields that post-process the output layer's logits (a value other than these "off" values refuses).
POSTPROCESSING = {"final_logit_softcapping": (None, 0, 0.0), "logit_scale": (None, 1, 1.0),
                  "logits_scaling": (None, 1, 1.0), "logit_softcapping": (None, 0, 0.0),
                  "output_logits_scaling": (None, 1, 1.0)}
MARK = "leantrain_chunked_loss"  # attribute on the output layer: its chunk size, set by install_chunked_loss
KERNEL = "leantrain_loss_kernel"  # attribute on the output layer: "chunked" (here) or "liger" (output_loss)
CAPTURE = "leantrain_output_capture"  # attribute on the output layer: its Capture, read by its pre-hook


class ChunkedCrossEntropy(torch.autograd.Function):
    """Per-token cross-entropy of ``hidden [N, H] @ weight[V, H]^T (+ bias)`` against ``targets [N]`` (-100:
    no loss), ``chunk`` tokens at a time; returns ``[N]`` fp32 losses and, with ``entropy``, each token's ``[N]``
    entropy (fp32, no gradient; else an empty tensor). ``dtype``: the matmul's dtype (autocast)."""

    @staticmethod
    def forward(ctx, hidden, weight, bias, targets, chunk: int, dtype, entropy: bool = False):
        n = hidden.shape[0]
        losses = torch.zeros(n, dtype=torch.float32, device=hidden.device)
        lse = torch.zeros(n, dtype=torch.float32, device=hidden.device)
        spread = torch.zeros(n if entropy else 0, dtype=torch.float32, device=hidden.device)
        w = weight.to(dtype)
        b = bias.to(dtype) if bias is not None else None
        for s in range(0, n, chunk):
            t = targets[s:s + chunk]
            logits = F.linear(hidden[s:s + chunk].to(dtype), w, b).float()
            lse[s:s + chunk] = torch.logsumexp(logits, dim=-1)
            keep = t != IGNORE
            picked = logits.gather(1, t.clamp(min=0).unsqueeze(1)).squeeze(1)
            losses[s:s + chunk] = torch.where(keep, lse[s:s + chunk] - picked, 0.0)
            if entropy:  # -sum p log p from the chunk's log-softmax, made in place of its logits
                logp = logits.sub_(lse[s:s + chunk, None])
                spread[s:s + chunk] = -torch.linalg.vecdot(logp.exp(), logp)
            del logits
        ctx.save_for_backward(hidden, weight, bias, targets, lse)
        ctx.chunk, ctx.dtype = chunk, dtype
        ctx.mark_non_differentiable(spread)
        return losses, spread

    @staticmethod
    def backward(ctx, grad_losses, grad_spread):
        hidden, weight, bias, targets, lse = ctx.saved_tensors
        chunk, dtype = ctx.chunk, ctx.dtype
        need_h, need_w, need_b = ctx.needs_input_grad[:3]
        w = weight.to(dtype)
        b = bias.to(dtype) if bias is not None else None
        grad_h = torch.empty_like(hidden) if need_h else None
        grad_w = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) if need_w else None
        grad_b = torch.zeros(bias.shape, dtype=torch.float32, device=bias.device) if need_b else None
        grad_losses = grad_losses.float()
        for s in range(0, hidden.shape[0], chunk):
            h, t = hidden[s:s + chunk].to(dtype), targets[s:s + chunk]
            keep = t != IGNORE
            g = torch.where(keep, grad_losses[s:s + chunk], 0.0)
            # d loss_i / d logits_i = softmax_i - onehot(t_i), times the incoming gradient of loss_i
            dlogits = F.linear(h, w, b).float()  # in place from here: one chunk-sized buffer
            dlogits.sub_(lse[s:s + chunk, None]).exp_()
            dlogits[torch.arange(t.shape[0], device=t.device), t.clamp(min=0)] -= 1.0
            dlogits.mul_(g[:, None])
            low = dlogits.to(dtype)  # cast once for both products (a no-op in fp32)
            if need_h:
                grad_h[s:s + chunk] = (low @ w).to(hidden.dtype)
            if need_w:
                if dtype == torch.float32:
                    grad_w.addmm_(dlogits.t(), h)
                else:
                    grad_w += low.t() @ h  # added in fp32 (type promotion), without an fp32 copy of the product
            if need_b:
                grad_b += dlogits.sum(0)
            del dlogits, low
        return (grad_h, grad_w.to(weight.dtype) if need_w else None,
                grad_b.to(bias.dtype) if need_b else None, None, None, None, None)


def chunked_token_losses(flat: torch.Tensor, layer: nn.Module, targets: torch.Tensor, chunk_tokens: int,
                         dtype: torch.dtype, entropy: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(per-token losses ``[N]``, each token's entropy ``[N]`` or None) (fp32) of the output ``layer`` on the hidden
    states ``flat [N, H]`` against ``targets [N]`` (-100: no loss), ``chunk_tokens`` at a time, the matmul in
    ``dtype``; the entropy (no gradient) with ``entropy`` only."""
    losses, spread = ChunkedCrossEntropy.apply(flat, layer.weight, getattr(layer, "bias", None), targets,
                                               max(1, int(chunk_tokens)), dtype, entropy)
    return losses, spread if entropy else None


def output_layer(model: nn.Module) -> nn.Module | None:
    """The model's output layer (``get_output_embeddings``) when it is a plain Linear-like layer, else None."""
    get = getattr(model, "get_output_embeddings", None)
    layer = get() if callable(get) else None
    if layer is None or not isinstance(getattr(layer, "weight", None), torch.Tensor) or layer.weight.dim() != 2:
        return None
    return layer


def is_causal_lm(model: nn.Module) -> bool:
    """A transformers causal LM (its class is in the causal-LM auto mapping, or named ``*ForCausalLM``); under a
    peft LoRA wrapper, the model it wraps."""
    base = model.get_base_model() if hasattr(model, "get_base_model") and hasattr(model, "peft_config") else model
    name = type(base).__name__
    if name.endswith("ForCausalLM"):
        return True
    try:
        from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES  # lazy: heavy
    except ImportError:  # pragma: no cover
        return False
    return name in set(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.values())


def keeps_logits(model: nn.Module) -> bool:
    """Whether the model's forward takes ``logits_to_keep`` (the output layer run on the last positions alone, as
    transformers' causal LMs do): its class's forward, inside DDP, compile and peft wrappers and under the forwards
    set on the instance (accelerate's, FSDP's autocast), which pass their keywords on."""
    inner = unwrapped(model)
    base = inner.get_base_model() if hasattr(inner, "peft_config") else inner
    return "logits_to_keep" in inspect.signature(type(base).forward).parameters


def _configs(model: nn.Module):
    cfg = getattr(model, "config", None)
    if cfg is not None:
        yield cfg
        for sub in ("text_config", "decoder"):
            inner = getattr(cfg, sub, None)
            if inner is not None and not isinstance(inner, (dict, str)):
                yield inner


def why_not_chunked(model: nn.Module) -> str | None:
    """Why the chunked loss cannot be installed on ``model`` (None: it can): not a causal LM, no plain output layer,
    or logits post-processed after the output layer (a config field, or found by a 2-token probe)."""
    if not is_causal_lm(model):
        return f"{type(model).__name__} is not a causal language model"
    layer = output_layer(model)
    if layer is None or not isinstance(layer, nn.Linear):
        return f"{type(model).__name__} has no plain Linear output layer (get_output_embeddings)"
    for cfg in _configs(model):
        for key, off in POSTPROCESSING.items():
            value = getattr(cfg, key, None)
            if value not in off:
                return (f"{type(model).__name__} post-processes its logits after the output layer ({key}={value}); "
                        "the chunked loss computes them from the output layer alone")
    for attr in ("logit_scale", "logit_softcap", "logits_scaling"):
        if hasattr(model, attr):
            return (f"{type(model).__name__} post-processes its logits after the output layer ({attr}); "
                    "the chunked loss computes them from the output layer alone")
    return _probe(model, layer)


def _probe(model: nn.Module, layer: nn.Module) -> str | None:
    """Run 2 tokens and check the model returns its output layer's result unchanged (catches post-processing no
    config field names). The RNG is left as it was (dropout draws)."""
    seen = {}
    handle = layer.register_forward_hook(lambda m, i, o: seen.__setitem__("out", o))
    device = layer.weight.device
    if device.type == "meta":
        handle.remove()
        return None
    try:
        with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []), torch.no_grad():
            was = model.training
            model.eval()
            try:
                out = model(input_ids=torch.tensor([[1, 2]], device=device), use_cache=False)
            finally:
                model.train(was)
    except Exception as e:  # noqa: BLE001 - a model that cannot run 2 tokens here: say so, do not guess
        return f"{type(model).__name__} could not run a 2-token probe of its output layer ({type(e).__name__}: {e})"
    finally:
        handle.remove()
    logits = getattr(out, "logits", None)
    raw = seen.get("out")
    if logits is None or raw is None or logits.shape != raw.shape or not torch.equal(logits, raw):
        return (f"{type(model).__name__} post-processes its logits after the output layer (its logits differ from "
                "the output layer's result); the chunked loss computes them from the output layer alone")
    return None


def default_chunk_tokens(vocab: int, device_type: str = "cpu") -> int:
    """Tokens per chunk on a device: a power of two near ``CHUNK_ELEMENTS[device] / vocab``, between 64 and 4096
    (GPT-2's 50k words: 256 on CPU, 1024 on a GPU; 8k words: 2048 and 4096)."""
    n = max(1, CHUNK_ELEMENTS.get(device_type, CHUNK_ELEMENTS["cuda"]) // max(1, vocab))
    return int(min(4096, max(64, 2 ** (n.bit_length() - 1))))


def chunk_tokens_of(layer: nn.Module, device_type: str) -> int:
    """The chunk size of an installed layer on ``device_type`` (its own, or the device's default)."""
    return getattr(layer, MARK) or default_chunk_tokens(layer.weight.shape[0], device_type)


class Hidden(NamedTuple):
    """The output layer's input in one forward: ``states [B, T, H]`` (the positions the forward keeps) and the dtype
    the layer's matmul runs in there (the forward's autocast dtype, else the weight's)."""

    states: torch.Tensor
    dtype: torch.dtype


class Capture:
    """What the output layer's pre-hook does: nothing (``active`` false), or keep its input (``taken``) and hand the
    layer no positions. One per layer: a deep copy of the model (a live reference) gets its own."""

    def __init__(self) -> None:
        self.active = False
        self.taken: Hidden | None = None


def _take_input(layer: nn.Module, args: tuple):
    """The output layer's forward pre-hook: inside :func:`final_hidden`, keep the layer's input and its matmul's dtype,
    and give the layer no positions (an empty ``[B, 0, H]`` input); elsewhere nothing."""
    capture = getattr(layer, CAPTURE, None)
    if capture is None or not capture.active:
        return None
    hidden = args[0]
    device = hidden.device.type
    dtype = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else layer.weight.dtype
    capture.taken = Hidden(hidden, dtype)
    return (hidden.narrow(-2, 0, 0), *args[1:])


def install_chunked_loss(model: nn.Module, chunk_tokens: int | None = None, kernel: str = "chunked") -> bool:
    """Mark the output layer and give it its pre-hook (see the module doc). False (and nothing changed) when the
    model cannot have it (:func:`why_not_chunked` says why); True when installed (or already installed).
    ``chunk_tokens`` None: :func:`default_chunk_tokens` of the vocabulary on the device the loss runs on.
    ``kernel``: ``chunked`` (:class:`ChunkedCrossEntropy`) or ``liger`` (Liger's fused kernel, CUDA:
    ``leantrain.modeling.output_loss``)."""
    layer = output_layer(model)
    if layer is not None and hasattr(layer, MARK):
        setattr(layer, MARK, int(chunk_tokens or 0))
        setattr(layer, KERNEL, kernel)
        return True
    if why_not_chunked(model) is not None:
        return False
    setattr(layer, CAPTURE, Capture())
    layer.register_forward_pre_hook(_take_input)
    setattr(layer, MARK, int(chunk_tokens or 0))  # 0: the device's default
    setattr(layer, KERNEL, kernel)
    return True


def final_hidden(model: nn.Module, forward: Callable[[], object]) -> Hidden:
    """The output layer's input in ``forward()``, a forward of ``model`` (called through whatever wraps it), whose
    output layer has the chunked loss installed: the forward runs up to the layer, which computes nothing (its
    ``logits`` are empty; the module doc). Nothing stays on the layer after it."""
    layer = chunked_layer(model)
    if layer is None:
        raise ValueError(f"{type(unwrapped(model)).__name__} has no chunked output layer (install_chunked_loss)")
    capture = getattr(layer, CAPTURE)
    capture.active, capture.taken = True, None
    try:
        forward()
        taken = capture.taken
    finally:
        capture.active, capture.taken = False, None
    if taken is None:
        raise RuntimeError(f"the forward of {type(unwrapped(model)).__name__} never called its output layer: no hidden "
                           "states to compute the loss from")
    return taken


def same_output_layer(source: nn.Module, target: nn.Module) -> bool:
    """Give ``target`` (a model run beside ``source``: a preference policy's reference) the output layer ``source``
    has: its chunked (or Liger) loss when installed, with the same chunk size. True when installed on ``target``."""
    layer = chunked_layer(source)
    if layer is None:
        return False
    return install_chunked_loss(unwrapped(target), getattr(layer, MARK) or None, getattr(layer, KERNEL))


def chunked_layer(model: nn.Module) -> nn.Module | None:
    """The output layer with the chunked loss installed, or None (also through DDP/FSDP/compile wrappers)."""
    layer = output_layer(unwrapped(model))
    return layer if layer is not None and hasattr(layer, MARK) else None


def is_installed(model: nn.Module) -> bool:
    return chunked_layer(model) is not None


OFF = "chunked loss: off"


class OutputLossNote(str):
    """The log line of the output loss a run chose (``apply_chunked_loss``), with what it says apart: ``kind`` (off,
    plain, liger, chunked) and ``reason`` (the line's parenthesis)."""

    kind: str
    reason: str

    def __new__(cls, kind: str, head: str, reason: str) -> "OutputLossNote":
        note = super().__new__(cls, f"{head} ({reason})")
        note.kind, note.reason = kind, reason
        return note


def apply_chunked_loss(model: nn.Module, setting: bool | str, device_type: str = "cpu",
                       logits_bytes: int | None = None, budget: int | None = None,
                       uniform: bool = True) -> OutputLossNote | None:
    """``efficiency.chunked_loss`` on a built model: a note for the log (None for a model it does not concern).
    auto: for a causal LM with a vocabulary of at least ``AUTO_MIN_VOCAB`` that can have it, what
    :func:`~leantrain.modeling.output_loss.choose_output_loss` picks on ``device_type`` (Liger's fused kernel unless
    the task's per-token gradients are not ``uniform``, the plain logits when ``logits_bytes`` fit the ``budget``, or
    the chunked loss); true: the chunked loss, or a ConfigError naming why not; false: off."""
    if setting is False or setting == "false":
        return OutputLossNote("off", OFF, "efficiency.chunked_loss=false") if is_causal_lm(model) else None
    auto = setting == "auto"
    if auto:
        if not is_causal_lm(model):
            return None
        layer = output_layer(model)
        vocab = layer.weight.shape[0] if layer is not None else 0
        if vocab < AUTO_MIN_VOCAB:
            return OutputLossNote("off", OFF, f"auto: vocabulary {vocab} < {AUTO_MIN_VOCAB}, its logits are small")
    why = why_not_chunked(model)
    if why is not None:
        if auto:
            return OutputLossNote("off", OFF, f"auto: {why}")
        raise ConfigError(f"efficiency.chunked_loss=true: {why}; set efficiency.chunked_loss=false (or auto)")
    kernel, reason = (choose_output_loss(device_type, liger_available(), logits_bytes, budget, uniform) if auto
                      else ("chunked", "as configured"))
    if kernel == "plain":
        return OutputLossNote("plain", "output loss: plain logits", f"auto: {reason}")
    install_chunked_loss(model, kernel=kernel)
    vocab = chunked_layer(model).weight.shape[0]
    if kernel == "liger":
        return OutputLossNote("liger", "output loss: Liger fused linear cross-entropy",
                              f"auto: {reason}; vocabulary {vocab}")
    return OutputLossNote("chunked", "chunked loss: on",
                          f"{'auto: ' + reason if auto else reason}; vocabulary {vocab}, chunks of "
                          f"{default_chunk_tokens(vocab, 'cpu')} tokens on CPU, {default_chunk_tokens(vocab, 'cuda')} "
                          "on GPUs; the fp32 tokens x vocab logits never exist in training")
