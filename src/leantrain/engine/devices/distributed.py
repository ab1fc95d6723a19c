"""Data-parallel strategies on top of Accelerate and torch.distributed: DDP (Accelerate's prepare), FSDP2
(torch's ``fully_shard``, which also runs on CPU with gloo), local SGD (Accelerate's LocalSGD averaging one flat
buffer), and the measurements that show they work: communicated bytes and time, replica spread."""

from __future__ import annotations

import logging
import time
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass

import torch
from accelerate import Accelerator
from torch import nn

from leantrain.config import Config
from leantrain.modeling.switches import repeated_blocks
from leantrain.optim import fused_torch_optimizer
from leantrain.perf.meter import Throughput

log = logging.getLogger("leantrain")


@dataclass
class CommStats:
    """Gradient all-reduce (DDP) and parameter averaging (local SGD) traffic of this process."""

    allreduce_calls: int = 0
    allreduce_bytes: int = 0
    allreduce_seconds: float = 0.0  # from launch to completion; overlaps the backward pass
    param_syncs: int = 0
    param_sync_bytes: int = 0
    allgather_calls: int = 0  # FSDP: unsharded parameters gathered (forward, and backward when resharded)
    allgather_bytes: int = 0  # size of the gathered (output) buffers
    reduce_scatter_calls: int = 0  # FSDP: gradients reduced and scattered back to their shards
    reduce_scatter_bytes: int = 0  # size of the (unsharded) input buffers
    eval_allgather_bytes: int = 0  # FSDP: gathered for evaluation (reported apart, not in ``bytes``)

    @property
    def bytes(self) -> int:
        return self.allreduce_bytes + self.param_sync_bytes + self.allgather_bytes + self.reduce_scatter_bytes


def strategy_name(cfg: Config, world_size: int, quiet: bool = False) -> str:
    """ddp / fsdp / deepspeed with several processes; "none" for one process, whatever was asked (said in the log
    unless ``quiet``)."""
    s = cfg.distributed.strategy
    if world_size == 1:
        if s in ("ddp", "fsdp") and not quiet:
            log.info("distributed.strategy=%s with one process: nothing to replicate or shard; plain training", s)
        return "none" if s != "deepspeed" else s
    return "ddp" if s == "auto" else s


# ------------------------------------------------------------------------------------------------ DDP


def time_allreduce(model, stats: CommStats) -> None:
    """Register a DDP comm hook that does the default all-reduce and counts its bytes and time."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    def hook(state, bucket):
        t0 = time.perf_counter()
        buf = bucket.buffer()
        stats.allreduce_calls += 1
        stats.allreduce_bytes += buf.numel() * buf.element_size()

        def done(fut):
            stats.allreduce_seconds += time.perf_counter() - t0
            return fut.value()

        return default_hooks.allreduce_hook(None, bucket).then(done)

    model.register_comm_hook(None, hook)


# ----------------------------------------------------------------------------------------------- FSDP


def apply_fsdp(model: nn.Module, accelerator) -> nn.Module:
    """Shard parameters, gradients and optimizer state over the processes with FSDP2 (``fully_shard``).

    Accelerate 1.x on CPU ignores its FSDP settings and silently wraps the model in DDP; torch's FSDP2 does run on
    CPU with gloo, so leantrain calls it directly (on GPUs too: one code path). Mixed precision keeps working:
    the forward runs under Accelerate's autocast.
    """
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh(accelerator.device.type, (accelerator.num_processes,))
    model.to(accelerator.device)
    for block in repeated_blocks(model):
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    if accelerator.mixed_precision != "no":
        forward = model.forward

        def autocast_forward(*args, **kwargs):
            with accelerator.autocast():
                return forward(*args, **kwargs)

        model.forward = autocast_forward
    return model


def count_fsdp_traffic(model: nn.Module, stats: CommStats) -> None:
    """Count FSDP2's all-gathers and reduce-scatters (calls and buffer bytes, as the DDP hook counts its all-reduce
    buckets) through its public custom-collective hooks, on every sharded module; the collectives themselves are
    FSDP's defaults."""
    from torch.distributed.fsdp import FSDPModule
    from torch.distributed.fsdp._fully_shard._fsdp_collectives import DefaultAllGather, DefaultReduceScatter

    class CountingAllGather(DefaultAllGather):
        def __init__(self, module):
            super().__init__()
            self.module = module

        def __call__(self, output_tensor, input_tensor, group, async_op=False):
            n = output_tensor.numel() * output_tensor.element_size()
            if self.module.training:  # evaluation's gathers are not training traffic
                stats.allgather_calls += 1
                stats.allgather_bytes += n
            else:
                stats.eval_allgather_bytes += n
            return super().__call__(output_tensor, input_tensor, group, async_op)

    class CountingReduceScatter(DefaultReduceScatter):
        def __call__(self, output_tensor, input_tensor, group, op, async_op=False):
            stats.reduce_scatter_calls += 1
            stats.reduce_scatter_bytes += input_tensor.numel() * input_tensor.element_size()
            return super().__call__(output_tensor, input_tensor, group, op, async_op)

    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.set_custom_all_gather(CountingAllGather(module))
            module.set_custom_reduce_scatter(CountingReduceScatter())


def is_sharded(model: nn.Module) -> bool:
    from torch.distributed.tensor import DTensor

    return any(isinstance(p, DTensor) for p in model.parameters())


def local_parameter_bytes(model: nn.Module) -> tuple[int, int]:
    """(bytes this process holds, bytes of the full model) — equal unless the parameters are sharded."""
    from torch.distributed.tensor import DTensor

    local = full = 0
    for p in model.parameters():
        full += p.numel() * p.element_size()
        local += (p.to_local() if isinstance(p, DTensor) else p).numel() * p.element_size()
    return local, full


def full_state_dict(model: nn.Module) -> dict | None:
    """A gathered, CPU, unsharded state dict for saving (a collective: every rank calls it); None when unsharded."""
    if not is_sharded(model):
        return None
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


# -------------------------------------------------------------------------------- step helpers, any strategy


@contextmanager
def grad_sync(model: nn.Module, accelerator, enabled: bool):
    """No gradient communication on accumulation micro-steps: DDP's no_sync, FSDP2's requires_gradient_sync."""
    if enabled or accelerator.num_processes == 1:
        yield
        return
    if hasattr(model, "set_requires_gradient_sync"):
        model.set_requires_gradient_sync(False)
        try:
            yield
        finally:
            model.set_requires_gradient_sync(True)
        return
    with accelerator.no_sync(model):
        yield


def clip_gradients(model: nn.Module, accelerator, max_norm: float, optimizer=None) -> torch.Tensor:
    """Clip by the global gradient norm; with sharded (DTensor) gradients the norm is reduced over the shards.
    Returns the norm before clipping, as a device tensor (no host sync).

    With a fused torch optimizer (AdamW, the default) and no grad scaler, the clip is folded into the update: the
    gradients are divided by max((norm + 1e-6) / max_norm, 1) inside the fused kernel, through its ``grad_scale``
    input (GradScaler's protocol), instead of a separate multiply over every gradient. Same result as
    ``clip_grad_norm_`` up to rounding (a division in place of a multiplication by the inverse), bitwise when the
    norm is under max_norm.
    """
    if not is_sharded(model):
        torch_opt = fused_torch_optimizer(optimizer) if _clip_foldable(accelerator) else None
        if torch_opt is None:
            return accelerator.clip_grad_norm_(model.parameters(), max_norm)
        norm = torch.nn.utils.get_total_norm([p.grad for p in model.parameters() if p.grad is not None])
        torch_opt.grad_scale = torch.clamp((norm.float() + 1e-6) / max_norm, min=1.0)
        return norm
    from torch.distributed.tensor import DTensor

    accelerator.unscale_gradients()
    params = [p for p in model.parameters() if p.grad is not None]
    norm = torch.nn.utils.get_total_norm([p.grad for p in params])
    if isinstance(norm, DTensor):
        norm = norm.full_tensor()
    torch.nn.utils.clip_grads_with_norm_(params, max_norm, norm)
    return norm


def _clip_foldable(accelerator: Accelerator) -> bool:
    """No grad scaler (fp16 owns grad_scale), no DeepSpeed engine (it clips itself)."""
    from accelerate.utils import DistributedType

    return getattr(accelerator, "scaler", None) is None and accelerator.distributed_type != DistributedType.DEEPSPEED


def replica_spread(model: nn.Module, accelerator) -> float | None:
    """How far the processes' parameters are apart: the largest difference over processes of two parameter
    checksums (sum and sum of squares, float64). 0.0 means identical replicas. None when sharded or alone."""
    if accelerator.num_processes == 1 or is_sharded(model):
        return None
    with torch.no_grad():
        params = [p.detach().double() for p in model.parameters()]
        fp = torch.stack([sum(p.sum() for p in params), sum((p * p).sum() for p in params)])
    every = accelerator.gather(fp.to(accelerator.device).unsqueeze(0))
    return float((every.max(0).values - every.min(0).values).abs().max())


# ------------------------------------------------------------------------------------------- local SGD


def local_sgd(accelerator: Accelerator, model: nn.Module, steps: int, stats: CommStats):
    """Accelerate's LocalSGD (processes step alone, parameters averaged every ``steps``), averaging one flat buffer
    in a single all-reduce instead of one collective per parameter tensor. A null context when off or alone."""
    if steps <= 1 or accelerator.num_processes == 1:
        return nullcontext()
    from accelerate.local_sgd import LocalSGD
    from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

    class FlatLocalSGD(LocalSGD):
        def _sync_and_avg_model_params(self):
            self.accelerator.wait_for_everyone()
            with torch.no_grad():
                params = [p.data for p in self.model.parameters()]
                flat = _flatten_dense_tensors(params)
                torch.distributed.all_reduce(flat)
                flat /= self.accelerator.num_processes
                for p, avg in zip(params, _unflatten_dense_tensors(flat, params)):
                    p.copy_(avg)
            stats.param_syncs += 1
            stats.param_sync_bytes += flat.numel() * flat.element_size()

        def __exit__(self, *exc):
            if self.num_steps % self.local_sgd_steps:  # steps since the last average: average once more
                self._sync_and_avg_model_params()
            self.model_sync_obj.__exit__(*exc)

    return FlatLocalSGD(accelerator=accelerator, model=model, local_sgd_steps=steps, enabled=True)


def distributed_summary(cfg: Config, accelerator: Accelerator, model: nn.Module, comm: CommStats,
                        meter: Throughput) -> dict:
    """summary.json's ``distributed`` section (a collective: every rank calls it)."""
    world = accelerator.num_processes
    local, full = local_parameter_bytes(model)
    steps = max(meter.steps, 1)
    out = {
        "world_size": world,
        "strategy": strategy_name(cfg, world),
        "local_sgd_steps": cfg.distributed.local_sgd_steps if world > 1 else 0,
        "samples_per_second_per_process": meter.samples_per_second / world,
        "parameter_bytes_per_process": local,
        "parameter_bytes_full": full,
        "communicated_bytes_per_process": comm.bytes,
        "communicated_bytes_per_step": comm.bytes / steps,
        "gradient_allreduce_calls": comm.allreduce_calls,
        "parameter_syncs": comm.param_syncs,
    }
    if comm.allgather_calls or comm.reduce_scatter_calls:  # FSDP
        out.update({"allgather_bytes_per_step": comm.allgather_bytes / steps,
                    "reduce_scatter_bytes_per_step": comm.reduce_scatter_bytes / steps,
                    "allgather_calls": comm.allgather_calls, "reduce_scatter_calls": comm.reduce_scatter_calls,
                    "eval_allgather_bytes": comm.eval_allgather_bytes})
    if comm.allreduce_calls and meter.all_time > 0:
        out["allreduce_seconds_per_step"] = comm.allreduce_seconds / steps
        out["allreduce_fraction_of_step_time"] = comm.allreduce_seconds / meter.all_time
    return out
