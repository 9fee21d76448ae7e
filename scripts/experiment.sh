#!/usr/bin/env bash
# The comparison of docs/results.md: GRPO vs OAR-G vs OAR-P on the embedded toy world, 3 seeds each,
# the same budget for all (STEPS steps x PROMPTS prompts x 8 samples), two runs at a time (one core
# each), then `oarctl compare` and `oarctl fidelity` on the seed-0 OAR-G run's last rollouts.
#   scripts/experiment.sh            # ~30 min on 2 quiet cores; resumable (finished stages are cached)
set -euo pipefail
cd "$(dirname "$0")/.."
STEPS=${STEPS:-16}
PROMPTS=${PROMPTS:-64}
OUT=${OUT:-runs/exp}
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 OMP_NUM_THREADS=1
mkdir -p "$OUT"
jobs=()
for seed in 0 1 2; do
  for method in uniform oar_g oar_p; do
    jobs+=("$method $seed")
  done
done
printf '%s\n' "${jobs[@]}" | xargs -P 2 -L 1 bash -c '
  method=$0 seed=$1
  oarctl run -c configs/demo.yaml --run-dir "'"$OUT"'/$method-s$seed" --steps '"$STEPS"' \
    --set run.seed=$seed --set run.progress=false --set run.eval_every=4 --set policy.threads=1 \
    --set attribute.method=$method --set sample.prompts_per_step='"$PROMPTS"' \
    --set update.mini_batch_size=$(('"$PROMPTS"' * 8)) > "'"$OUT"'/$method-s$seed.log" 2>&1 \
    || { echo "$method seed $seed failed: $(tail -1 "'"$OUT"'/$method-s$seed.log")"; exit 255; }
  echo "$method seed $seed: $(tail -1 "'"$OUT"'/$method-s$seed.log")"'
oarctl compare "$OUT"/*-s? -o "$OUT/compare.html"
# the oracle and the methods see the last step's rollouts with the policy that sampled them
last=$(printf 'step_%04d' $((STEPS - 1))); previous=$(printf 'step_%04d' $((STEPS - 2)))
oarctl fidelity "$OUT/oar_g-s0/$last/verified.parquet" -o "$OUT/fidelity.parquet" \
  --policy "$OUT/oar_g-s0/$previous/policy" --sample 128 --methods oar_p,oar_g,entropy,random
