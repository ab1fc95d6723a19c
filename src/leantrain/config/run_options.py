"""The sections around the training itself: checkpoints, efficiency switches, reporting, distributed strategy,
evaluation options and parameter-efficient fine-tuning."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from leantrain.config.metric_names import metric_names
from leantrain.config.base import Section


class CheckpointConfig(Section):
    """Resumable checkpoints, auto-resume, and the best model."""

    every_steps: int = Field(500, ge=0, description="save a resumable checkpoint every N optimizer steps; 0 = never")
    keep: int = Field(3, ge=1, description="newest complete checkpoints kept in output_dir/checkpoints/")
    keep_final: int = Field(
        1, ge=0, description="checkpoints kept once the run has finished (model/ and summary.json written); the log "
        "and summary.json say what was removed"
    )
    resume: str = Field(
        "auto", description="auto: continue from the last complete checkpoint in output_dir (same config); "
        "never: start afresh (old checkpoints are removed); or a checkpoint folder"
    )
    best_metric: str | None = Field(
        None, description="eval metric that picks output_dir/best/, e.g. eval.f1_macro, eval.loss; unset = no best/"
    )
    best_mode: Literal["auto", "max", "min"] = Field("auto", description="auto: min for eval.loss, else max")
    save_model: Literal["last", "best"] = Field("last", description="what output_dir/model/ holds")
    allow_inexact_resume: bool = Field(
        False, description="resume although the world size, global batch, data or RNG state differ (with a warning)"
    )

    @field_validator("best_metric")
    @classmethod
    def _known_metric(cls, v: str | None) -> str | None:
        names = [f"eval.{n}" for n in metric_names()]
        if v is not None and v not in names:
            raise ValueError(f"must be one of {', '.join(names)}")
        return v


class EfficiencyConfig(Section):
    """Switches that change speed and memory but not the result: precision, checkpointing, compile, fast paths."""

    precision: Literal["auto", "fp32", "bf16", "fp16", "fp8"] = Field(
        "auto", description="auto: bf16 where the CPU/GPU runs it natively, fp16 + grad scaler on older GPUs, "
        "else fp32; fp16/fp8 need a GPU"
    )
    gradient_checkpointing: bool = Field(
        False, description="recompute activations in backward (less memory, ~25-30% more time)"
    )
    compile: Literal["auto"] | bool = Field(
        "auto", description="torch.compile the model (compile time is reported separately); auto: off today on every "
        "device (no gain on the CPU; on CUDA not measured yet: benchmarks/gpu/check.sh measures it, and a measured "
        "gain for causal-LM training on CUDA goes here), and the log says why; true is refused under DeepSpeed"
    )
    dropout: Literal["auto", "fast", "torch"] = Field(
        "auto", description="fast: nn.Dropout masks drawn 4 elements per random word, p rounded to 1/65536 "
        "(about half the cost of torch's on CPU); auto: fast on CPU, torch on GPUs"
    )
    chunked_loss: Literal["auto"] | bool = Field(
        "auto", description="causal LMs: the loss computed against the output layer a chunk of tokens at a time, so "
        "the fp32 tokens x vocab logits never exist (same loss and gradients, one more output-layer matmul); auto "
        "(vocabulary of 8192 or more): Liger's fused linear cross-entropy on CUDA with liger-kernel installed "
        "(leantrain[liger]), else on CUDA the plain logits when they fit 25% of the memory budget, else (and on CPU) "
        "the chunked loss, and the log says why; true on a model that post-processes its logits fails (exit 2)"
    )
    recast_weights: Literal["auto"] | bool = Field(
        "auto", description="under bf16/fp16 autocast, the bias-free linear layers keep their fp32 weight for the "
        "backward and cast it again there, instead of keeping the forward's bf16 copy (the same numbers bit for bit; "
        "2 bytes per weight less from each forward to its backward, one more cast per layer per backward); auto: on "
        "for CPU training, where it was measured, off on GPUs until measured there; never under FSDP, DeepSpeed, "
        "compile or gradient checkpointing, and the log says why"
    )
    cpu_allocator: Literal["auto", "reuse", "system"] = Field(
        "auto", description="reuse: freed host memory stays in the process for the next step instead of being "
        "unmapped and page-faulted in again (glibc), and the previous settings are restored at the end; system: "
        "leave the allocator alone; auto: reuse on CPU training (where it was measured to help), system on GPUs"
    )
    memory_budget: int | str | None = Field(
        None, description="bytes (or '4GiB', '500MB') per process for train.micro_batch_size=auto; "
        "unset = device memory on GPU, a safe share of available RAM on CPU"
    )
    profile: bool = Field(False, description="torch profiler trace + a table of where the step's time goes "
                          "(output_dir/profile/)")
    profile_steps: int = Field(10, gt=0, description="optimizer steps profiled (after 3 skipped and 1 warm-up)")


class ReportConfig(Section):
    """What the run reports besides metrics.jsonl and summary.json: trackers, progress, plots."""

    trackers: list[Literal["tensorboard", "trackio", "wandb", "mlflow", "comet_ml", "aim", "clearml", "dvclive",
                           "swanlab"]] = Field(
        default_factory=list, description="Accelerate trackers, e.g. [tensorboard] or [trackio] (local: SQLite "
        "under TRACKIO_DIR, default ~/.cache/huggingface/trackio; `trackio show` for its dashboard); none by default"
    )
    progress: Literal["auto", "bar", "plain", "none"] = Field(
        "auto", description="auto: a bar on a terminal, plain log lines otherwise; a long generation "
        "(GRPO's rollouts, sample prompts) or evaluation adds a second bar, or a line every 10 s (positions, new "
        "tokens, tokens/s, time left), rank 0 only"
    )
    plots: bool = Field(True, description="write output_dir/loss_curve.png at the end")
    sample_prompts: list[str] = Field(
        default_factory=list, description="causal LM: prompts whose greedy continuations are written to metrics.jsonl "
        "and the log before training and at each evaluation, e.g. [\"Once upon a time\"]"
    )
    sample_max_new_tokens: int = Field(40, gt=0, le=4096, description="tokens generated per sample prompt")

    @field_validator("trackers")
    @classmethod
    def _installed(cls, v: list[str]) -> list[str]:
        """A tracker whose package is missing would be dropped silently by Accelerate: refuse it here."""
        import importlib.util

        for name in v:
            packages = TRACKER_PACKAGES[name]
            if not any(importlib.util.find_spec(p) for p in packages):
                raise ValueError(f"tracker {name!r} needs the package {packages[0]!r}, which is not installed: "
                                 f"pip install {packages[0]}")
        return v


TRACKER_PACKAGES = {"tensorboard": ("tensorboard", "tensorboardX"), "trackio": ("trackio",), "wandb": ("wandb",),
                    "mlflow": ("mlflow",), "comet_ml": ("comet_ml",), "aim": ("aim",), "clearml": ("clearml",),
                    "dvclive": ("dvclive",), "swanlab": ("swanlab",)}


class DistributedConfig(Section):
    """Several processes or machines (started with --nproc / --nnodes, torchrun or accelerate launch)."""

    strategy: Literal["auto", "ddp", "fsdp", "deepspeed"] = Field(
        "auto", description="auto: DDP when there are several processes; fsdp: torch FSDP2 (fully_shard) "
        "parameter sharding; deepspeed: ZeRO from distributed.deepspeed_config (CUDA only)"
    )
    deepspeed_config: str | None = Field(None, description="path to a DeepSpeed ZeRO JSON config")
    local_sgd_steps: int = Field(
        0, ge=0, description="K > 1: each process steps alone and parameters are averaged every K steps (local SGD)"
    )
    timeout_seconds: int = Field(300, gt=0, description="process-group timeout: a hung collective fails after this")


class EvalConfig(Section):
    """How evaluation and predictions read the model's outputs (the metrics themselves are ``eval.<metric>``)."""

    threshold: float = Field(
        0.5, gt=0, lt=1, description="multi-label: a label is predicted when its sigmoid score is above this "
        "(eval.f1_micro, eval.f1_macro, eval.subset_accuracy and the labels leantrain predict writes)"
    )
    tag_scheme: Literal["auto", "IOB1", "IOB2", "IOE1", "IOE2", "IOBES", "BILOU"] = Field(
        "auto", description="token classification: the tagging scheme of the entity metrics (strict span "
        "matching); auto: BILOU or IOBES from the tag names, IOB1 when a gold entity starts with I-, else IOB2"
    )
    tune_threshold: bool = Field(
        True, description="multi-label: at each evaluation pick the one threshold (for all labels) that maximises "
        "micro-F1 on the eval data; the metrics are reported at it (eval.threshold holds it) and the saved model's "
        "config.json keeps it (threshold), which leantrain predict / eval then use unless eval.threshold is set. "
        "Setting eval.threshold alone turns tuning off"
    )
    harness_tasks: list[str] = Field(
        default_factory=list, description="causal LM: lm-evaluation-harness tasks run on the saved model at the end "
        "of the run (as leantrain eval --harness does); the scores go into summary.json (harness) and the model card. "
        "Needs pip install 'leantrain[eval]'; checked (defined, loadable offline) before training"
    )
    harness_dir: str | None = Field(
        None, description="the folder of task YAMLs for eval.harness_tasks (e.g. dataset_path: json with local "
        "data_files, relative to the folder); unset: the harness's built-in tasks (their data sets need the Hub)"
    )


class PeftConfig(Section):
    """Parameter-efficient fine-tuning through the peft library (pip install 'leantrain[peft]')."""

    method: Literal["none", "lora", "qlora"] = Field(
        "none", description="lora: low-rank adapters on the target modules, the base frozen (the task's head stays "
        "trainable); qlora: LoRA over 4-bit base weights (bitsandbytes, CUDA)"
    )
    r: int = Field(16, gt=0, description="LoRA rank")
    alpha: float = Field(32.0, gt=0, description="LoRA scaling numerator (the update is scaled by alpha / r)")
    dropout: float = Field(0.05, ge=0, lt=1, description="dropout on the LoRA branch's input")
    target_modules: Literal["auto"] | list[str] = Field(
        "auto", description="auto: the attention and MLP projections of the architecture's repeated blocks (their "
        "Linear modules, e.g. q_proj..down_proj for Llama, c_attn/c_proj/c_fc for GPT-2, query/key/value/dense for "
        "BERT; printed at the start); or a list of module names (peft's suffix match)"
    )
    merge: bool = Field(
        True, description="model/ holds the merged model (loads without peft); false = only output_dir/adapter/"
    )
