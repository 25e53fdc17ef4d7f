#!/usr/bin/env bash
# The next-edit fine-tune (python -m draft_models.finetune_edits) on a lent CUDA machine, in one
# command that fits the device tool's 10-minute limit, the pair coming back under $OUT:
#
#   bash draft_models/gpu_finetune.sh [extra finetune_edits args]
#       → $OUT/log.txt, $OUT/pair.tar.part-aa, -ab (the pair split under the 16 MiB a file may be)
#   here: cat pair.tar.part-* | tar -x -C DIR, then bench/next_edit.py and bench/holes.py --target
#   DIR/target --draft DIR/draft before it replaces draft_models/default (the numbers: log.txt)
#   DEVICE=cpu and small step counts (later arguments win) try the script without a GPU
#
# On 2 CPU cores the same recipe makes ≈ 2 000 edit tasks an hour (bf16 where the CPU has AMX);
# a GPU step is milliseconds, so batches are made ahead by forked workers (--workers).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-runs/gpu}"
mkdir -p "$OUT"
PY="${PYTHON:-python3}"
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
workers=$(( $(nproc) - 2 ))
"$PY" -c 'import torch; print("torch", torch.__version__, torch.cuda.get_device_name() if torch.cuda.is_available() else "no CUDA")' | tee "$OUT/log.txt"
timeout 540 "$PY" -m draft_models.finetune_edits --device "${DEVICE:-cuda}" --workers "$workers" --run-dir "$OUT/run" \
  --out "$OUT/pair" --ctx 1024 --induction-steps 1500 --realign-steps 800 --realign-rate 0.15 --target-steps 2500 \
  --draft-steps 800 --batch-size 16 \
  --lr 1e-3 --edit-rate 0.7 --warmup 100 "$@" 2>>"$OUT/log.txt" | tee -a "$OUT/log.txt"
rc=${PIPESTATUS[0]}
if [ "$rc" -eq 0 ]; then
  tar -C "$OUT/pair" -cf "$OUT/pair.tar" target draft && split -b 15M "$OUT/pair.tar" "$OUT/pair.tar.part-"
  rm -rf "$OUT/pair" "$OUT/pair.tar" "$OUT/run"
fi
echo "gpu_finetune: exit $rc (results in $OUT)" | tee -a "$OUT/log.txt"
exit "$rc"
