"""Multi-process training through the real launchers (torchrun, accelerate launch, leantrain --nproc / --nnodes),
2-4 CPU processes on gloo over loopback, tiny random BERT. Each layout must compute what one process computes. The
2-process runs that test what the workers do (DDP, FSDP, local SGD, the example examples/ddp-cpu.yaml) share one
torchrun launch; the user's own launcher (accelerate launch, 4 processes), two nodes and failing ranks have theirs."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.helpers import REPO, YES_NO, cli_here, process_env, word_rows, write_rows
from tests.processes import BIN, assert_same_training, free_port, run, train_losses, two_processes_each
from leantrain import train
from leantrain.report.logs import read_metrics

pytestmark = pytest.mark.distributed


@pytest.fixture(scope="module")
def job(tmp_path_factory, tiny_bert):
    """A config file: 42 training rows with batch 8 (a last batch of 2: two of four micro-batches are padding),
    13 eval rows (uneven over processes), micro-batch 2, fp32, no dropout."""
    tmp = tmp_path_factory.mktemp("dist")
    cfg = {
        "model": {"name": str(tiny_bert)},
        "data": {"train": str(write_rows(tmp / "train.csv", word_rows(42, 0, max_words=20, words=YES_NO))),
                 "eval": str(write_rows(tmp / "eval.csv", word_rows(13, 1, max_words=20, words=YES_NO)))},
        "train": {"batch_size": 8, "micro_batch_size": 2, "epochs": 2, "lr": 1e-3, "log_every_steps": 1,
                  "seed": 7},
        "report": {"plots": False, "progress": "plain"},
        "efficiency": {"precision": "fp32"},  # exact comparisons across layouts
    }
    path = tmp / "cfg.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path, tmp


@pytest.fixture(scope="module")
def single(job):
    """The reference: one process, accumulation 4."""
    path, tmp = job
    summary = train(path, [f"output_dir={tmp / 'single'}"])
    assert summary["train"]["accumulation_steps"] == 4 and summary["train"]["steps"] == 12
    return tmp / "single"


@pytest.fixture(scope="module")
def two(job) -> Path:
    """The job's 2-process runs that test what the workers do, not how they start, all in one torchrun launch
    (``tests.processes.two_processes_each``): as configured (2 x accumulation 2) in <tmp>/two/p2/p2, local SGD
    (averaging every 3 steps, 6 steps of micro-batch 4, no warm-up) in <tmp>/two/lsgd/p2, FSDP in <tmp>/two/fsdp/p2,
    FSDP with bf16 and gradient checkpointing (4 steps) in <tmp>/two/fsdp_bf16/p2, and examples/ddp-cpu.yaml (its
    model and data keys the job's, 2 steps) in <tmp>/two/ddp_example/p2."""
    path, tmp = job
    cfg = yaml.safe_load(path.read_text())
    lsgd = {**cfg, "train": {**cfg["train"], "max_steps": 6, "micro_batch_size": 4}, "optim": {"warmup_steps": 0},
            "distributed": {"local_sgd_steps": 3}}
    fsdp = {**cfg, "distributed": {"strategy": "fsdp"}}
    fsdp_bf16 = {**cfg, "train": {**cfg["train"], "max_steps": 4}, "distributed": {"strategy": "fsdp"},
                 "efficiency": {"precision": "bf16", "gradient_checkpointing": True}}
    example = yaml.safe_load((REPO / "examples" / "ddp-cpu.yaml").read_text())
    example = {**example, "model": cfg["model"], "data": {**example["data"], **cfg["data"]},
               "train": {**example["train"], "max_steps": 2}, "report": {"plots": False},
               "checkpoint": {"every_steps": 0}}
    (tmp / "two").mkdir()
    two_processes_each(tmp / "two", {"p2": cfg, "lsgd": lsgd, "fsdp": fsdp, "fsdp_bf16": fsdp_bf16,
                                     "ddp_example": example})
    return tmp / "two"


def assert_same_run(a: Path, b: Path, atol: float = 2e-5) -> None:
    assert_same_training(a, b, atol)
    ea, eb = (json.loads((d / "summary.json").read_text())["eval"] for d in (a, b))
    assert ea["samples"] == eb["samples"] == 13  # no duplicates from padding the uneven shards
    assert ea["accuracy"] == eb["accuracy"] and ea["loss"] == pytest.approx(eb["loss"], rel=1e-5)


def _summary(run_dir: Path) -> dict:
    return json.loads((run_dir / "summary.json").read_text())


def test_two_processes_accumulation_two_equals_one_process(single, two):
    """2 processes x accumulation 2 (in ``two``'s launch; ``leantrain --nproc`` itself starts the two-node run and
    the failing ranks below)."""
    p2 = two / "p2" / "p2"
    assert_same_run(single, p2)
    s = _summary(p2)
    assert s["distributed"]["world_size"] == 2 and s["distributed"]["strategy"] == "ddp"
    assert s["train"]["accumulation_steps"] == 2
    # one all-reduce of all gradients per optimizer step, none on accumulation micro-steps
    assert s["distributed"]["communicated_bytes_per_step"] == s["distributed"]["parameter_bytes_full"]
    spreads = [r["replica_spread"] for r in read_metrics(p2 / "metrics.jsonl") if r["type"] == "train"]
    assert len(spreads) == 12 and max(spreads) == 0.0  # replicas bitwise identical after every step


def test_four_processes_under_accelerate_launch(job, single):
    """The user's own launcher: accelerate launch --multi_gpu --num_processes 4 (a CPU accelerator) -m leantrain
    train cfg.yaml (4 x accumulation 1). (torchrun -m leantrain train, the same without the launcher's run file, is
    what ``leantrain --nproc`` starts: the two-node run and the failing ranks below.)"""
    path, tmp = job
    r = run([str(BIN / "accelerate"), "launch", "--multi_gpu", "--num_processes", "4", "--num_machines", "1",
             "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port", str(free_port()),
             "-m", "leantrain", "train", str(path), f"output_dir={tmp / 'p4'}"])
    assert r.returncode == 0, r.stderr[-4000:]
    assert "terminate called" not in r.stderr  # the process group is destroyed before exit
    assert_same_run(single, tmp / "p4")
    assert _summary(tmp / "p4")["train"]["accumulation_steps"] == 1


def test_two_nodes_on_loopback(job, single):
    """Two launcher invocations, node ranks 0 and 1, one process each, meeting at 127.0.0.1: node 1 the console
    script, node 0 the launcher in this process."""
    path, tmp = job
    args = [str(path), "--nnodes", "2", "--nproc", "1", "--master-addr", "127.0.0.1", "--master-port",
            str(free_port()), f"output_dir={tmp / 'nodes'}"]
    with open(tmp / "node1.log", "w+") as log:
        node1 = subprocess.Popen([str(BIN / "leantrain"), "train", *args, "--node-rank", "1"], stdout=log,
                                 stderr=subprocess.STDOUT, text=True, env=process_env())
        node0 = cli_here("train", *args, "--node-rank", "0")
        node1.wait(timeout=300)
        log.seek(0)
        assert (node0.returncode, node1.returncode) == (0, 0), node0.stderr[-3000:] + log.read()[-3000:]
    assert_same_run(single, tmp / "nodes")
    assert _summary(tmp / "nodes")["distributed"]["world_size"] == 2


def test_fsdp_shards_parameters_and_matches(single, two):
    """distributed.strategy=fsdp, 2 processes x accumulation 2 (in ``two``'s launch)."""
    d = _summary(two / "fsdp" / "p2")["distributed"]
    assert d["strategy"] == "fsdp" and d["world_size"] == 2
    assert d["parameter_bytes_per_process"] <= 0.55 * d["parameter_bytes_full"]  # really sharded (DTensors)
    assert_same_run(single, two / "fsdp" / "p2")  # model/ saved from the gathered full state dict
    # FSDP's traffic is counted, not 0: each micro-batch (2 per step here) gathers every unit's full parameters in
    # the forward (and the resharded ones again in the backward) and reduce-scatters their gradients
    full, accum = d["parameter_bytes_full"], 2
    assert accum * full <= d["allgather_bytes_per_step"] <= 2 * accum * full
    assert full <= d["reduce_scatter_bytes_per_step"] <= accum * full
    assert d["communicated_bytes_per_step"] == d["allgather_bytes_per_step"] + d["reduce_scatter_bytes_per_step"]


def test_local_sgd_drifts_then_syncs(two):
    out = two / "lsgd" / "p2"
    spread = {rec["step"]: rec["replica_spread"] for rec in read_metrics(out / "metrics.jsonl")
              if rec["type"] == "train"}
    assert spread[3] == spread[6] == 0.0  # averaged every 3 steps
    assert all(spread[s] > 0 for s in (1, 2, 4, 5))  # each process steps alone inside the window
    lsgd = _summary(out)["distributed"]
    assert lsgd["parameter_syncs"] == 2 and lsgd["gradient_allreduce_calls"] == 0
    # bytes per step: DDP all-reduces every gradient every step; local SGD averages the parameters every 3 steps
    assert lsgd["communicated_bytes_per_step"] == pytest.approx(lsgd["parameter_bytes_full"] / 3)


@pytest.mark.parametrize("kind", ["raise", "kill"])
def test_a_failing_rank_stops_the_run(job, kind):
    path, tmp = job
    r = cli_here("train", str(path), "--nproc", "2", f"output_dir={tmp / kind}", LEANTRAIN_FAULT=f"{kind}@2:1")
    assert r.returncode != 0
    assert "a worker failed" in r.stderr
    if kind == "raise":
        assert "injected fault at step 2" in r.stderr and "rank 1" in r.stderr.lower().replace("rank: 1", "rank 1")
    else:
        assert "SIGKILL" in r.stderr or "Signal 9" in r.stderr or "-9" in r.stderr
    assert not (tmp / kind / "summary.json").exists()


def test_bad_launch_options_fail_before_any_worker(job, capsys):
    from leantrain.cli import main

    path, tmp = job
    assert main(["train", str(path), "--nnodes", "2", "--nproc", "1"]) == 2
    assert "--master-addr" in capsys.readouterr().err


def test_fsdp_with_bf16_and_gradient_checkpointing(two):
    """Mixed precision and gradient checkpointing keep working under a sharding strategy."""
    out = two / "fsdp_bf16" / "p2"
    s = _summary(out)
    assert s["efficiency"]["precision"] == "bf16" and s["efficiency"]["gradient_checkpointing"] is True
    assert s["distributed"]["parameter_bytes_per_process"] <= 0.55 * s["distributed"]["parameter_bytes_full"]
    losses = train_losses(out)
    assert len(losses) == 4 and all(0 < x < 5 for x in losses) and s["eval"]["samples"] == 13


def test_ddp_cpu_example_trains_as_two_processes(two):
    """examples/ddp-cpu.yaml as 2 processes (its header's command: ``--nproc 2``): the global batch 32 is 2 processes
    x micro-batch 8 x accumulation 2, data parallel."""
    s = _summary(two / "ddp_example" / "p2")
    assert s["distributed"]["world_size"] == 2 and s["distributed"]["strategy"] == "ddp"
    assert s["train"]["steps"] == 2 and s["train"]["accumulation_steps"] == 2
