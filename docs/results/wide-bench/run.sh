#!/usr/bin/env bash
# The gradient bench on the wide world (docs/results.md, "Every method on the wide world's bench"): every
# method, on the base policy's pool and on a policy trained 4 steps. Run from the checkout's root, alone on
# the machine (the seconds are the cost column). P holds the world bench's pool: P/prompts.parquet from
# `oarctl toy prompts -c configs/chains-wide.yaml -n 4096`, P/base/verified.parquet sampled at --step 4 with
# 256 prompts and verified (the commands of docs/results.md's gradient-check section, with this config).
set -euo pipefail
export OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1
K=docs/results/wide-bench; P=${P:-pool-wide}; C=configs/chains-wide.yaml
M=uniform,random,truth_shuffled,entropy,oar_g,oar_p_span,oar_p_screened,oar_flow_local,entropy_mask,ktae,truth
[ -f $K/base.parquet ] || oarctl gradient-check $P/base/verified.parquet -o $K/base.parquet -c $C \
  --set attribute.skip_uniform_groups=true --batch-prompts 16 --methods $M
[ -f runs/wide-4/step_0003/policy/model.safetensors ] || oarctl run -c $C --run-dir runs/wide-4 --set run.steps=4 \
  --set data.toy_heldout_size=64 --set evaluate.samples=1 --set "evaluate.pass_k=[1]"
[ -f $P/trained/verified.parquet ] || { oarctl sample $P/prompts.parquet -o $P/trained/rollouts.parquet -c $C --step 4 \
  --set sample.prompts_per_step=256 --policy runs/wide-4/step_0003/policy
  oarctl verify $P/trained/rollouts.parquet -o $P/trained/verified.parquet -c $C --policy runs/wide-4/step_0003/policy; }
[ -f $K/trained.parquet ] || oarctl gradient-check $P/trained/verified.parquet -o $K/trained.parquet -c $C \
  --policy runs/wide-4/step_0003/policy --set attribute.skip_uniform_groups=true --batch-prompts 16 --methods $M
