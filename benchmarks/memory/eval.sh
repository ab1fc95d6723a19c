#!/bin/bash
# Peak memory of `leantrain eval` of a DPO + LoRA model against the run's own (issue 35 item 1), small scale: a tiny
# Llama (1 layer, hidden 16) with a 65,536-word output layer, 8 training / 32 eval pairs of ~72 tokens, block 128,
# micro-batch 2. Trains once with this tree, then evaluates the same model folder with BASELINE_SRC's code and with
# this tree's, each under /usr/bin/time (peak RSS). Memory only: run it under the shared lock on a busy machine.
#   flock /tmp/leantrain-cpu.lock benchmarks/memory/eval.sh /work/main/src [WORKDIR]
set -euo pipefail
BASELINE_SRC=${1:?the src folder of the baseline tree, e.g. /work/main/src}
WORK=${2:-/tmp/eval_memory}
HERE=$(cd "$(dirname "$0")/../.." && pwd)
PY=${PYTHON:-python}
export HF_HUB_OFFLINE=1 OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
mkdir -p "$WORK"
PYTHONPATH="$HERE/src:$HERE" "$PY" - "$WORK" <<'PYEOF'
import sys
from pathlib import Path
from tests.helpers import CHATML, make_tiny_chat_tokenizer, make_tiny_llama, write_jsonl
root = Path(sys.argv[1])
long = "Once upon a time there was a small model. It learned to answer questions about the weather. " * 2
pairs = lambda n, s: [{"prompt": f"{long} What is {i} + {s}?", "chosen": "The answer is 4.", "rejected": "Numbers."}
                      for i in range(n)]
make_tiny_llama(root / "llama", make_tiny_chat_tokenizer(root / "tok", chat_template=CHATML), layers=1, hidden=16,
                vocab_size=2**16)
write_jsonl(root / "train.jsonl", pairs(8, 0))
write_jsonl(root / "dev.jsonl", pairs(32, 1))
PYEOF
date -u
PYTHONPATH="$HERE/src" /usr/bin/time -f "train (run's own evaluation included): peak_rss_kb=%M" "$PY" -m leantrain train \
  model.name="$WORK/llama" data.train="$WORK/train.jsonl" data.eval="$WORK/dev.jsonl" data.block_size=128 \
  train.batch_size=4 train.micro_batch_size=2 train.max_steps=2 peft.method=lora report.plots=false \
  report.progress=none efficiency.precision=fp32 checkpoint.every_steps=0 output_dir="$WORK/run" 2>&1 | grep peak_rss
for src in "$BASELINE_SRC" "$HERE/src"; do
  PYTHONPATH="$src" /usr/bin/time -f "eval with $src: peak_rss_kb=%M" "$PY" -m leantrain eval "$WORK/run/model" \
    data.eval="$WORK/dev.jsonl" --output "$WORK/m.json" 2>&1 | grep -E "peak_rss|eval batch"
done
date -u
