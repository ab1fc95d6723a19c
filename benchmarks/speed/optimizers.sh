#!/usr/bin/env bash
# Optimizers side by side: packaged MiniLM on a 1,024-row SST-2 slice, 12 optimizer steps each, one round,
# every run in a fresh process. Results: benchmarks/results/optimizers.md. Usage:
#   benchmarks/speed/optimizers.sh [OUT_DIR] [extra key=value ...]
set -euo pipefail
DATA=${SHARED_DATA:-$(dirname "$0")/../../../shared/data}/sst2
OUT=${1:-runs/bench-optimizers}; shift || true
exec leantrain bench --sweep optim.name=adamw,adafactor,adamw8bit,sgd,lion,muon --repeat 1 \
  data.train="$DATA/train.tsv" data.eval="$DATA/dev.tsv" data.max_train_samples=1024 data.max_eval_samples=256 \
  train.max_steps=12 train.batch_size=32 train.lr=1e-4 report.plots=false output_dir="$OUT" "$@"
