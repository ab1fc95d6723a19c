#!/bin/bash
# Multi-turn GRPO with a calculator tool (benchmarks/results/grpo.md, issue 51): the base SmolLM2-135M-Instruct, the
# same model trained with the calculator environment, and trained single-turn without the tool, each evaluated on the
# built-in calculator eval prompts (greedy) with the environment and single-turn.
#   bash benchmarks/convergence/grpo_calculator.sh OUT_DIR [STEPS]      (from the repository root, leantrain's .venv)
set -euxo pipefail
OUT=${1:?usage: grpo_calculator.sh OUT_DIR [STEPS]}; STEPS=${2:-40}
L=".venv/bin/leantrain"
mkdir -p "$OUT"
.venv/bin/python -m leantrain.data.lm.calculator_problems "$OUT/task"
COMMON="model.name=smollm2-135m model.task=grpo data.train=builtin:calculator grpo.num_generations=8 grpo.temperature=1.0
 train.batch_size=8 train.max_steps=$STEPS train.lr=3e-5 report.plots=false report.progress=plain checkpoint.every_steps=0
 data.max_eval_samples=100 grpo.max_new_tokens=48"
ENV="grpo.environment=examples/calculator_env.py:Calculator grpo.max_turns=2"
$L train $COMMON $ENV "grpo.rewards=[]" output_dir="$OUT/tool" > "$OUT/tool.log" 2>&1
$L train $COMMON "grpo.rewards=[numeric:answer]" output_dir="$OUT/single" > "$OUT/single.log" 2>&1
for m in smollm2-135m "$OUT/tool/model" "$OUT/single/model"; do
  n=$(basename "$(dirname "$m")")_$(basename "$m")
  $L eval "$m" model.task=grpo $ENV "grpo.rewards=[]" grpo.max_new_tokens=48 data.eval="$OUT/task/eval.jsonl" \
    efficiency.precision=bf16 --output "$OUT/eval-tool-$n.json" > "$OUT/eval-tool-$n.log" 2>&1
  $L eval "$m" model.task=grpo grpo.environment=null "grpo.rewards=[numeric:answer]" grpo.max_new_tokens=48 \
    data.eval="$OUT/task/eval.jsonl" efficiency.precision=bf16 --output "$OUT/eval-single-$n.json" > "$OUT/eval-single-$n.log" 2>&1
done
