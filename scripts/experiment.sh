#!/usr/bin/env bash
# The experiment of docs/results.md: does token-level credit help GRPO where the tokens that matter
# are known? The chains toy world (docs/testbed.md), every method trained from the same base with the
# same budget, paired by seed (one seed = the same training prompts, the same sampling seed), all
# scored on ONE held-out set of HELDOUT problems (data.toy_heldout_seed is fixed).
#   scripts/experiment.sh                      # ~90 min on 2 cores; resumable: rerun it after a kill
#   SEEDS="0 1" METHODS="uniform truth" CEILING_SEEDS= STEPS=4 scripts/experiment.sh    # a smaller one
# Writes OUT/<method>-s<seed>/ (one oarctl run each), OUT/compare.{md,html} (table, paired differences
# to uniform with 95% intervals, seconds per step by stage, accuracy/reward/entropy curves), and
# OUT/fidelity.* (every method against the truth labels and the regeneration oracle on one batch).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-runs/experiment}
CONFIG=${CONFIG:-configs/chains.yaml}   # the world: configs/chains-wide.yaml is the wide chains world
SEEDS=${SEEDS:-"0 1 2 3 4"}
METHODS=${METHODS:-"uniform truth truth_q75 oar_g oar_p_span entropy random uniform_lr3x"}
# more seeds for the question the world must answer (does the ceiling beat GRPO?), cheap methods only
CEILING_SEEDS=${CEILING_SEEDS-"5 6 7 8 9"}   # set it empty for none; docs/results.md's confirmation: "5 ... 19"
CEILING_METHODS=${CEILING_METHODS:-"uniform truth truth_q75"}
STEPS=${STEPS:-12}
PROMPTS=${PROMPTS:-24}          # prompts per step (x 8 samples); one optimizer step per RL step
HELDOUT=${HELDOUT:-1024}
EVAL_EVERY=${EVAL_EVERY:-0}     # held-out evaluations: 0 = base and final only (each ~1 min for 1,024 problems)
PARALLEL=${PARALLEL:-2}         # runs at a time, one torch thread each
FIDELITY_SAMPLE=${FIDELITY_SAMPLE:-32}   # the oracle regenerates every reasoning token (93 s for 32 here)
FIDELITY_METHODS=${FIDELITY_METHODS:-truth,mc_value,oar_p,oar_p_span,oar_g,entropy,random}
OARCTL=${OARCTL:-oarctl}
# A folder (committed) that keeps each finished run's metrics.jsonl, config.yaml and seconds.json: a later
# session, whose clone has no runs/, takes them from there instead of training those runs again (docs/results.md)
KEEP=${KEEP:-}
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 OMP_NUM_THREADS=1 OUT CONFIG STEPS PROMPTS HELDOUT EVAL_EVERY OARCTL KEEP
case " $METHODS " in *" uniform "*) ;; *) echo "METHODS must include uniform (the baseline of every pair)" >&2; exit 2 ;; esac
mkdir -p "$OUT"

finished() {  # RUN_DIR: its metrics hold the final evaluation
  grep -s '"kind": "eval"' "$1/metrics.jsonl" | grep -q "\"after_steps\": $STEPS,"
}
export -f finished

one_run() {  # METHOD SEED
  local method=$1 seed=$2 extra=() base="$OUT/uniform-s$2/eval" run="$OUT/$1-s$2"
  if [ -n "$KEEP" ] && ! finished "$run" && finished "$KEEP/$method-s$seed"; then
    mkdir -p "$run" && cp "$KEEP/$method-s$seed/metrics.jsonl" "$KEEP/$method-s$seed/config.yaml" "$run/"
    if [ -f "$KEEP/$method-s$seed/seconds.json" ]; then cp "$KEEP/$method-s$seed/seconds.json" "$run/"; fi
  fi
  if finished "$run"; then echo "$method seed $seed: finished before"; return 0; fi
  case $method in
    truth_q75) extra=(--set attribute.method=truth --set reshape.quantile=0.75) ;;  # label 0 at the floor
    truth_zero) extra=(--set attribute.method=truth --set reshape.quantile=0.75 --set reshape.floor=0) ;;  # label 0 weighs 0
    uniform_lr3x) extra=(--set attribute.method=uniform --set update.learning_rate=1.5e-3) ;;  # control: a bigger step
    # positive control of known size: plain GRPO on 1.5x the responses a step, still one optimizer step
    uniform_1.5x) extra=(--set attribute.method=uniform --set sample.prompts_per_step=$((PROMPTS * 3 / 2))
                         --set update.mini_batch_size=$((PROMPTS * 12))) ;;
    # groups whose rewards are all equal have advantage 0: their weights change nothing, so the costly
    # methods do not score them (the same update, fewer perturbed forwards)
    oar_flow|oar_flow_span|oar_flow_local|oar_p_span|oar_p) extra=(--set attribute.method="$method" --set attribute.skip_uniform_groups=true) ;;
    *) extra=(--set attribute.method="$method") ;;
  esac
  # The base policy's evaluation has the same cache key in every run of a seed (same policy, prompts,
  # options and seed): take uniform's (queued before) instead of computing it again.
  if [ "$method" != uniform ] && [ ! -e "$OUT/$method-s$seed/eval" ]; then
    for _ in $(seq 600); do  # a kept uniform run (metrics only) has no evaluation to share
      { [ -f "$base/base.parquet.manifest.json" ] || finished "$OUT/uniform-s$seed"; } && break; sleep 1
    done
    if [ -f "$base/base.parquet.manifest.json" ]; then
      mkdir -p "$OUT/$method-s$seed/eval" && cp "$base/base.parquet" "$base/base.parquet.manifest.json" "$OUT/$method-s$seed/eval/"
    fi
  fi
  "$OARCTL" run -c "$CONFIG" --run-dir "$OUT/$method-s$seed" --steps "$STEPS" \
    --set run.seed="$seed" --set run.progress=false --set run.eval_every="$EVAL_EVERY" \
    --set policy.threads=1 --set sample.prompts_per_step="$PROMPTS" \
    --set update.mini_batch_size=$((PROMPTS * 8)) --set update.micro_batch_size=$((PROMPTS * 8 < 64 ? PROMPTS * 8 : 64)) \
    --set data.toy_heldout_size="$HELDOUT" \
    --set evaluate.samples=1 --set "evaluate.pass_k=[1]" --set run.group="$method" "${extra[@]}" > "$OUT/$method-s$seed.log" 2>&1 \
    || { echo "$method seed $seed FAILED: $(tail -n 1 "$OUT/$method-s$seed.log")"; return 255; }
  echo "$(date +%T) $method seed $seed: $(tail -n 1 "$OUT/$method-s$seed.log")"
  if [ -n "$KEEP" ]; then
    mkdir -p "$KEEP/$method-s$seed" && cp "$run/metrics.jsonl" "$run/config.yaml" "$KEEP/$method-s$seed/"
    python scripts/keep_seconds.py "$OUT" "$KEEP" > /dev/null  # + its stage seconds (the step folders are not kept)
  fi
}
export -f one_run

# seed-major, so that a partial experiment already holds whole pairs; each seed's uniform run is
# queued a seed ahead, so that its base evaluation is there when the seed's other methods start
jobs() {  # SEEDS METHODS
  local seeds=($1) i
  echo "uniform ${seeds[0]}"
  for i in "${!seeds[@]}"; do
    [ -n "${seeds[i + 1]:-}" ] && echo "uniform ${seeds[i + 1]}"
    for method in $2; do [ "$method" = uniform ] || echo "$method ${seeds[i]}"; done
  done
}
{ jobs "$SEEDS" "$METHODS"; [ -z "$CEILING_SEEDS" ] || jobs "$CEILING_SEEDS" "$CEILING_METHODS"; } \
  | xargs -P "$PARALLEL" -L 1 bash -c 'one_run "$0" "$1"'

runs=()
for seed in $SEEDS; do for method in $METHODS; do runs+=("$OUT/$method-s$seed"); done; done
for seed in $CEILING_SEEDS; do for method in $CEILING_METHODS; do runs+=("$OUT/$method-s$seed"); done; done
"$OARCTL" compare "${runs[@]}" -o "$OUT/compare.html" --target 0.8

# Fidelity on the last batch of the first seed's uniform run, scored by the policy that sampled it
first=$(echo $SEEDS | cut -d' ' -f1)
last=$(printf 'step_%04d' $((STEPS - 1))); previous=$(printf 'step_%04d' $((STEPS - 2)))
if [ ! -f "$OUT/uniform-s$first/$last/verified.parquet" ]; then  # a kept run holds its metrics only
  echo "fidelity: skipped ($OUT/uniform-s$first has no step folders: it was taken from KEEP)"; exit 0
fi
"$OARCTL" fidelity "$OUT/uniform-s$first/$last/verified.parquet" -c "$CONFIG" -o "$OUT/fidelity.parquet" \
  --policy "$OUT/uniform-s$first/$previous/policy" --sample "$FIDELITY_SAMPLE" \
  --methods "$FIDELITY_METHODS" \
  --set fidelity.max_new_tokens=224 --set policy.threads="$PARALLEL"
