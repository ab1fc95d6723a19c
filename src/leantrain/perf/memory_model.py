"""The memory and speed model behind ``leantrain plan`` and ``train.micro_batch_size=auto`` (one model for both).

Peak memory of one training process (what summary.json's ``train.peak_memory_bytes`` measures: whole-life peak
RSS on CPU; on CUDA the allocator's peak) is predicted line by line:

    framework_overhead   RSS of the process before the training step (python, torch, transformers, data, the
                         loaded model minus its parameters) + what the first forward/backward leaves behind; measured
    parameters           the model's tensors (FSDP: this process's shard + one unsharded block)
    gradients            one per trainable parameter, in its dtype (FSDP: sharded; DDP: + its bucket copy)
    optimizer_state      the real optimizer built on a meta-device copy of the model and stepped once: exact
                         bytes for every registered optimizer (AdamW 8 B/param, Adafactor factored, 8-bit, ...)
    casts                bf16 copies of the matmul weights autocast keeps for backward
    activations          bytes autograd saves in the forward pass, counted at two small micro-batches, linear
    logits               causal LMs: the tokens x vocab logits (plain: in the matmul dtype + their fp32 log-softmax
                         + its gradient; chunked loss: one chunk's), shown apart from the two lines around it
    temporary_buffers    the rest of the measured forward/backward peak (backward transients, allocator slack)

Activations and temporaries are calibrated by short forward/backward passes of the actual model on this device
at two small micro-batch sizes on the longest sequence, per precision and checkpointing, and extrapolated
linearly in the micro-batch (which is how transformer activations grow at a fixed length). The same passes are
timed, which with a measured optimizer step gives the predicted step time and samples/s. Each timing is repeated
(the larger pass ``TIME_REPEATS`` times, the optimizer step ``TIME_REPEATS`` times on one block, scaled to the
model), so every predicted speed comes with the spread measured on this machine: ``leantrain plan`` ranks two
settings only where their ranges do not overlap ("within noise" otherwise).
"""

from __future__ import annotations

import statistics
import time
from contextlib import nullcontext
from dataclasses import dataclass, field

import torch
from torch._subclasses.fake_tensor import FakeTensor

from leantrain.modeling.chunked_loss import chunk_tokens_of, chunked_layer, is_causal_lm, output_layer
from leantrain.modeling.switches import is_checkpointing, repeated_blocks, set_checkpointing
from leantrain.optim import build_optimizer
from leantrain.optim.state import state_tensors
from leantrain.perf import memory
from leantrain.units import format_duration

FALLBACK_STATE_BYTES = {"adamw": 8, "adafactor": 0.1, "adamw8bit": 2.1, "sgd": 4, "lion": 4, "muon": 6}
CALIBRATION_SECONDS = 4.0  # the larger calibration pass takes about this long (a micro-batch of 1 is the other)
TIME_REPEATS = 3  # timed runs of the larger pass and of the optimizer step: their min-max is the measured spread


@dataclass
class Calibration:
    """Measured on this device at ``seq_len`` tokens, for one precision and checkpointing setting, at two
    micro-batch ``sizes``: bytes saved for backward, peak bytes of the forward/backward (incl. gradients), seconds."""

    precision: str
    checkpointing: bool
    seq_len: int
    sizes: tuple[int, int]
    saved: tuple[int, int]
    peak: tuple[int, int]
    seconds: tuple[float, float]
    warmup_bytes: int = 0  # left resident by the first pass (runtime caches), counted once in the framework line
    big_seconds: tuple[float, ...] = ()  # every timed run of the larger timing pass (its median is seconds[1])
    time_sizes: tuple[int, int] | None = None  # the micro-batches ``seconds`` were timed at (None: ``sizes``)
    method: str = "measured"  # or "estimated": fake-tensor passes (``perf.estimate``), bytes only

    def _at(self, pair, m: int, sizes=None) -> float:
        (a, b), (ya, yb) = sizes or self.sizes, pair
        slope = max(0.0, (yb - ya) / (b - a)) if b != a else 0.0
        return ya + slope * (m - a)

    def saved_at(self, m: int) -> int:
        return max(0, int(self._at(self.saved, m)))

    def peak_at(self, m: int) -> int:
        return max(0, int(self._at(self.peak, m)))

    def seconds_at(self, m: int) -> float:
        return max(1e-6, self._at(self.seconds, m, self.time_sizes))

    def seconds_range_at(self, m: int) -> tuple[float, float]:
        """(fastest, slowest) seconds at ``m``: the prediction scaled by the larger pass's measured min / max
        relative to its median (one timed run: no spread)."""
        mid = self.seconds_at(m)
        if len(self.big_seconds) < 2 or self.seconds[1] <= 0:
            return mid, mid
        return mid * min(self.big_seconds) / self.seconds[1], mid * max(self.big_seconds) / self.seconds[1]


@dataclass
class ModelFacts:
    """What the lines need from the model, taken once: byte counts and the process's measured baseline."""

    parameter_bytes: int
    gradient_bytes: int
    trainable: int
    cast_bytes: int  # bf16 copies of Linear weights
    largest_block_bytes: int
    framework_bytes: int
    warmup_bytes: int = 0  # the largest first-pass residue of any calibration (runtime caches, made once)
    state_bytes: dict[str, int] = field(default_factory=dict)
    step_seconds: dict[str, float] = field(default_factory=dict)
    step_range: dict[str, tuple[float, float]] = field(default_factory=dict)  # (min, max) of the timed steps
    vocab: int = 0  # a causal LM's output layer size (0: not a causal LM: no logits line)
    chunk_tokens: int = 0  # tokens per chunk of the chunked loss (0: plain logits)


def autocast_for(precision: str, device: torch.device):
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)
    return (lambda: torch.autocast(device.type, dtype=dtype)) if dtype else nullcontext


def calibration_batch(model, task, m: int, seq_len: int, low: int = 0) -> dict:
    """A synthetic batch of ``m`` rows of ``seq_len`` random token ids (from ``low``, below the vocabulary), all
    attended, weighing 1, with the task's labels for them (``Task.model.calibration_labels``) and what else its batches
    carry (``Task.model.calibration_batch``)."""
    device = next(model.parameters()).device
    vocab = getattr(model.config, "vocab_size", 1000) or 1000
    ids = torch.randint(min(low, vocab - 1), vocab, (m, seq_len), device=device)
    return task.model.calibration_batch({"input_ids": ids, "attention_mask": torch.ones_like(ids),
                                   "labels": task.model.calibration_labels(model, ids),
                                   "loss_weight": torch.ones(m, device=device)})


def _pass(model, task, m: int, seq_len: int, autocast, memory_too: bool = True) -> tuple[int, int, float]:
    """One forward/backward at (m, seq_len) through ``task.forward_loss`` (the loss a run computes: a causal LM's
    over every token, chunked where installed): (saved-for-backward bytes, peak bytes above the start, seconds).
    ``memory_too=False``: timing only, in the steady state a training loop runs in (no heap trim before it, whose
    fresh pages cost first-touch faults that a running loop does not pay; no saved-tensor hooks); bytes are 0."""
    device = next(model.parameters()).device
    saved = SavedBytes(model)
    start = _memory_start(device) if memory_too else 0
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    t0 = time.perf_counter()
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        forward_backward(model, task, m, seq_len, autocast, saved.hooks() if memory_too else nullcontext())
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    seconds = time.perf_counter() - t0
    if not memory_too:
        model.zero_grad(set_to_none=True)
        return 0, 0, seconds
    peak = _memory_peak(device) - start
    model.zero_grad(set_to_none=True)
    return saved.total(), peak, seconds


class SavedBytes:
    """Bytes of the distinct storages autograd saves for backward (the model's parameters left out)."""

    def __init__(self, model, params=None):
        self.params = {storage_key(p) for p in (model.parameters() if params is None else params)}
        self.storages: dict[tuple[bool, int], int] = {}

    def hooks(self):
        def pack(t: torch.Tensor):
            s = t.untyped_storage()
            self.storages[storage_key(t)] = s.nbytes()
            return t

        return torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t)

    def total(self) -> int:
        return sum(n for k, n in self.storages.items() if k not in self.params)


def storage_key(t: torch.Tensor) -> tuple[bool, int]:
    """A storage's identity: its data pointer (real tensors), its C object's address (fake tensors have no data)."""
    s = t.untyped_storage()
    return (True, s._cdata) if isinstance(t, FakeTensor) else (False, s.data_ptr())


def forward_backward(model, task, m: int, seq_len: int, autocast, hooks) -> None:
    """One training forward/backward of ``model`` on random token ids (m x seq_len) through the task's own
    ``step.forward_loss`` (a causal LM's over every token, chunked where installed); ``hooks`` around the forward."""
    batch = calibration_batch(model, task, m, seq_len, low=1000)
    with hooks, autocast():
        loss, _ = task.step.forward_loss(model, batch)
    loss.backward()


def _memory_start(device: torch.device) -> int:
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
        return torch.cuda.memory_allocated(device)
    memory.trim_heap()
    memory.reset_peak_rss()
    return memory.current_rss_bytes()


def _memory_peak(device: torch.device) -> int:
    return torch.cuda.max_memory_allocated(device) if device.type == "cuda" else memory.window_peak_rss_bytes()


def resident_bytes(device: torch.device) -> int:
    """What this process holds now: allocated bytes on CUDA, RSS (after trimming the heap) on CPU."""
    if device.type == "cuda":
        return torch.cuda.memory_allocated(device)
    memory.trim_heap()
    return memory.current_rss_bytes()


def calibrate(model, seq_len: int, precision: str, checkpointing: bool, per_process: int,
              seconds: float = CALIBRATION_SECONDS, timing: bool = True, size: int | None = None,
              progress=None, *, task) -> Calibration:
    """Memory: forward/backward passes at a micro-batch of 1 and at the largest size (<= ``per_process``) that
    takes about ``seconds`` (or at ``size``), after one warm-up pass at 1 (its residue is the runtime's one-time
    caches). Time (``timing``; else call :func:`time_calibrations` on several calibrations at once, interleaved):
    steady-state passes at 1 and at a quarter of the larger size, ``TIME_REPEATS`` times (their spread is the
    noise). ``progress(text)``: told before each pass, with the time left once a pass has been timed. ``task``: whose
    ``step.forward_loss`` the passes run."""
    device = next(model.parameters()).device
    was_training, was_ckpt = model.training, is_checkpointing(model)
    model.train()
    set_checkpointing(model, checkpointing)
    autocast = autocast_for(precision, device)
    tell = _Eta(progress, seq_len)
    try:
        before = resident_bytes(device)
        tell(1, [1, 1] + ([size] if size else []))
        _pass(model, task, 1, seq_len, autocast)
        warmup = max(0, resident_bytes(device) - before)
        tell(1, [1] + ([size] if size else []))
        one = _pass(model, task, 1, seq_len, autocast)
        big = size or min(per_process, max(2, int(seconds / max(one[2], 1e-3))))  # size: measure there, exactly
        tell(big, [big])
        many = _pass(model, task, big, seq_len, autocast)
    finally:
        set_checkpointing(model, was_ckpt)
        model.train(was_training)
    timed = max(2, big // 4)  # timed at a quarter of the memory pass's size: a quarter of the cost, linear beyond
    cal = Calibration(precision, checkpointing, seq_len, (1, big), (one[0], many[0]), (one[1], many[1]),
                      (one[2], many[2] * timed / big), warmup, (), (1, timed))
    if timing:
        time_calibrations(model, [cal], task=task)
    return cal


class _Eta:
    """Progress of the calibration passes: before each, what it is and (from the examples timed so far) how long the
    passes still to run will take."""

    def __init__(self, progress, seq_len: int):
        self.progress, self.seq_len = progress, seq_len
        self.t0, self.done = time.perf_counter(), 0

    def __call__(self, m: int, todo: list[int]) -> None:
        if self.progress is None:
            return
        elapsed = time.perf_counter() - self.t0
        left = f", about {format_duration(elapsed / self.done * sum(todo))} left" if self.done else ""
        self.progress(f"pass at micro-batch {m} x {self.seq_len} tokens{left}")
        self.done += m


def time_calibrations(model, cals: list[Calibration], rounds: int = TIME_REPEATS, *, task) -> None:
    """Steady-state timing of each calibration's two sizes (1 once, the larger in every round), in interleaved
    rounds (A, B, C, A, B, C, ...) so that a busy moment on a shared machine lands on every setting alike rather
    than on one; sets ``seconds`` (medians) and ``big_seconds`` (each round's time at the larger size: the spread)."""
    device = next(model.parameters()).device
    was_training, was_ckpt = model.training, is_checkpointing(model)
    model.train()
    small: dict[int, list[float]] = {i: [] for i in range(len(cals))}
    large: dict[int, list[float]] = {i: [] for i in range(len(cals))}
    try:
        for r in range(rounds):
            for i, c in enumerate(cals):
                set_checkpointing(model, c.checkpointing)
                autocast = autocast_for(c.precision, device)
                m = (c.time_sizes or c.sizes)[1]
                if r == 0:  # the intercept (per-pass overhead) once; the spread comes from the larger size
                    small[i].append(_pass(model, task, 1, c.seq_len, autocast, memory_too=False)[2])
                large[i].append(_pass(model, task, m, c.seq_len, autocast, memory_too=False)[2])
    finally:
        set_checkpointing(model, was_ckpt)
        model.train(was_training)
    for i, c in enumerate(cals):
        c.seconds = (statistics.median(small[i]), statistics.median(large[i]))
        c.big_seconds = tuple(large[i])


def meta_state_bytes(model, optim_cfg) -> int:
    """Bytes of optimizer state after one step, from the real optimizer on a meta-device copy of the model (no
    memory, no compute); a model that cannot be rebuilt from its config (a peft LoRA model) is copied as its
    trainable parameters alone, each its own (meta) Linear when 2-D. Falls back to bytes/parameter when the
    optimizer cannot run on meta."""
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    try:
        with torch.device("meta"):
            wrapped = _is_wrapper(model)
            clone = _Trainables(model) if wrapped else type(model)(model.config)
        for n, p in clone.named_parameters():
            p.requires_grad_(wrapped or n in trainable)
            if p.requires_grad:
                p.grad = torch.zeros_like(p)
        opt = build_optimizer(clone, optim_cfg, 1e-3)
        opt.step()
        unique = {id(t): t for t in state_tensors(opt)}  # meta tensors have no data pointer: one per object
        return sum(t.numel() * t.element_size() for t in unique.values())
    except Exception:  # noqa: BLE001 - any model/optimizer that meta cannot run: the documented per-parameter rate
        n = sum(p.numel() for p in model.parameters() if p.requires_grad)
        return int(n * FALLBACK_STATE_BYTES.get(optim_cfg.name, 8))


def _is_wrapper(model) -> bool:
    """A model whose class cannot be rebuilt from its config alone (peft's PeftModel wraps the transformers one)."""
    return hasattr(model, "get_base_model") and hasattr(model, "peft_config")


class _Trainables(torch.nn.Module):
    """The trainable parameters of a model, as meta tensors with the same names' shapes: 2-D ones as Linear
    modules (so matrix-aware optimizers such as Muon treat them as matrices), the rest as plain parameters."""

    def __init__(self, model):
        super().__init__()
        self.linears = torch.nn.ModuleList()
        self.rest = torch.nn.ParameterList()
        for _, p in model.named_parameters():
            if not p.requires_grad:
                continue
            if p.ndim == 2:
                self.linears.append(torch.nn.Linear(p.shape[1], p.shape[0], bias=False, dtype=p.dtype))
            else:
                self.rest.append(torch.nn.Parameter(torch.empty(p.shape, dtype=p.dtype)))


def measure_step_times(model, optim_cfg, repeats: int = TIME_REPEATS) -> list[float]:
    """Seconds of one optimizer step (clip + step) with random gradients, ``repeats`` timed steps after the first
    (which allocates the state). To stay cheap it runs on one repeated block (a transformer layer) and scales by
    the trainable parameters (the step's cost grows with them; the whole model when it has no blocks). The
    parameters change: call on a planning copy only."""
    total = sum(p.numel() for p in model.parameters() if p.requires_grad)
    target, scale = model, 1.0
    blocks = [b for b in repeated_blocks(model) if any(p.requires_grad for p in b.parameters())]
    if blocks:  # a layer of the most repeated kind (BERT lists its embeddings among the blocks too)
        kinds = [type(b).__name__ for b in blocks]
        block = next(b for b in blocks if type(b).__name__ == max(set(kinds), key=kinds.count))
        part = sum(p.numel() for p in block.parameters() if p.requires_grad)
        target, scale = block, total / part
    params = [p for p in target.parameters() if p.requires_grad]
    try:
        opt = build_optimizer(target, optim_cfg, 1e-6)
    except Exception:  # noqa: BLE001 - an optimizer that needs the whole model (its head, embeddings): time that
        target, scale = model, 1.0
        params = [p for p in model.parameters() if p.requires_grad]
        opt = build_optimizer(model, optim_cfg, 1e-6)
    times = []
    for i in range(repeats + 1):
        for p in params:
            p.grad = torch.randn_like(p) * 1e-3
        t0 = time.perf_counter()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        if params[0].device.type == "cuda":
            torch.cuda.synchronize()
        if i:
            times.append((time.perf_counter() - t0) * scale)
        opt.zero_grad(set_to_none=True)
    del opt
    return times


def measure_step_seconds(model, optim_cfg) -> float:
    """The median of :func:`measure_step_times`."""
    return statistics.median(measure_step_times(model, optim_cfg))


def model_facts(model, framework_bytes: int) -> ModelFacts:
    params = list(model.parameters())
    trainable = [p for p in params if p.requires_grad]
    linear = [m.weight for m in model.modules() if isinstance(m, torch.nn.Linear) and m.weight.requires_grad]
    blocks = repeated_blocks(model)
    largest = max((sum(p.numel() * p.element_size() for p in b.parameters()) for b in blocks), default=0)
    return ModelFacts(
        parameter_bytes=sum(p.numel() * p.element_size() for p in params),
        gradient_bytes=sum(p.numel() * p.element_size() for p in trainable),
        trainable=sum(p.numel() for p in trainable),
        cast_bytes=sum(w.numel() * 2 for w in linear),
        largest_block_bytes=largest, framework_bytes=framework_bytes, **logit_facts(model))


def logit_facts(model) -> dict[str, int]:
    """A causal LM's vocabulary and chunk size (the chunked loss's, 0 when plain); nothing for other models."""
    if not is_causal_lm(model) or output_layer(model) is None:
        return {}
    layer = chunked_layer(model)
    device = output_layer(model).weight.device.type
    return {"vocab": int(output_layer(model).weight.shape[0]),
            "chunk_tokens": chunk_tokens_of(layer, device) if layer is not None else 0}


def logits_bytes(facts: ModelFacts, precision: str, tokens: int) -> int:
    """Bytes a causal LM's logits take at their peak for ``tokens`` tokens per micro-batch. Plain: the
    ``tokens x vocab`` logits in the matmul dtype, their fp32 log-softmax kept for backward and its fp32 gradient;
    chunked: one chunk's fp32 logits and their gradient, plus two fp32 values per token (log-sum-exp, loss)."""
    if not facts.vocab:
        return 0
    if facts.chunk_tokens:
        return 2 * min(tokens, facts.chunk_tokens) * facts.vocab * 4 + 8 * tokens
    width = 2 if precision in ("bf16", "fp16") else 4
    return tokens * facts.vocab * (width + 4 + 4)


def lines(facts: ModelFacts, cal: Calibration, micro: int, state_bytes: int, *, strategy: str = "none",
          nproc: int = 1) -> dict[str, int]:
    """Predicted peak bytes of one process, line by line, with ``total``."""
    shard = nproc if strategy == "fsdp" and nproc > 1 else 1
    params = facts.parameter_bytes // shard + (2 * facts.largest_block_bytes if shard > 1 else 0)
    grads = facts.gradient_bytes // shard + (facts.gradient_bytes if strategy == "ddp" and nproc > 1 else 0)
    saved = cal.saved_at(micro)
    casts = min(facts.cast_bytes, saved) if cal.precision in ("bf16", "fp16") else 0
    activations, temporary = saved - casts, max(0, cal.peak_at(micro) - facts.gradient_bytes - saved)
    # a causal LM's logits, shown on their own line: taken out of the measured temporaries, then activations (the
    # total stays the calibrated one)
    logits = min(logits_bytes(facts, cal.precision, micro * cal.seq_len), activations + temporary)
    from_temporary = min(logits, temporary)
    out = {
        "framework_overhead": facts.framework_bytes + max(facts.warmup_bytes, cal.warmup_bytes),
        "parameters": params,
        "gradients": grads,
        "optimizer_state": state_bytes // shard,
        "casts": casts,
        "activations": activations - (logits - from_temporary),
        **({"logits": logits} if facts.vocab else {}),
        "temporary_buffers": temporary - from_temporary,
    }
    out["total"] = sum(out.values())
    return out
