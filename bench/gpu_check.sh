#!/usr/bin/env bash
# The GPU benchmarks in one script, for a session that is lent a CUDA machine (< 8 min on an H200):
#
#   bash bench/gpu_check.sh            → results under $OUT (default bench/out/gpu)
#
# 1. the CUDA tests (tests/test_cuda_graphs.py: graphs replay the eager greedy ids);
# 2. bench/peers.py --device cuda: ours (CUDA graphs per verify width, cuda_graphs.py) vs HF
#    generate() in bf16 — decode ms/token at prompt depth, prefill tokens/s, end to end for 32
#    tokens — on the embedded pair (plain and speculative) and on random-weight models at the
#    Qwen2.5-Coder-0.5B and 1.5B shapes (Llama and Qwen2 layouts), in bf16 / fp16 / our Triton
#    int8 (fast-int8) / bitsandbytes int8 and nf4.
# bitsandbytes is not in the device image: carry its wheel in .whl/ (see the device README);
# without it the int8/nf4 rows are skipped, and the log says so.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-bench/out/gpu}"
mkdir -p "$OUT"
PY="${PYTHON:-python3}"
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
if ls .whl/*.whl >/dev/null 2>&1; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH="/tmp/site:${PYTHONPATH:-}"
fi
{ nvidia-smi -L; "$PY" -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__, torch.cuda.get_device_name())'; } \
  >"$OUT/env.txt" 2>&1
cat "$OUT/env.txt"

quants="bf16:none,fp16:none,bf16:fast-int8"
if "$PY" -c 'import bitsandbytes' 2>/dev/null; then
  quants="$quants,bf16:int8,bf16:nf4"
else
  echo "bitsandbytes missing: int8/nf4 rows skipped" | tee -a "$OUT/env.txt"
fi

timeout 120 "$PY" -m pytest -q -p no:cacheprovider tests/test_cuda_graphs.py 2>&1 | tee "$OUT/tests.txt"

# the big shapes' checkpoints are written once per machine (bench/out/peers, ignored by git)
timeout 390 "$PY" bench/peers.py --device cuda --no-llamacpp --shapes embedded,0.5b,1.5b --layouts llama,qwen2 \
  --quants "$quants" --spec-quants bf16:none --n 3 --out "$OUT" 2>&1 | grep -v "Loading weights" | tee "$OUT/peers.txt"
echo "gpu_check: done (results in $OUT)"
