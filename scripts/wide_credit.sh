#!/usr/bin/env bash
# Start or resume issue 40's pre-registered experiment (docs/results.md, "The decisive experiment"):
# 182 seeds x 6 methods on the wide chains world, every run from a worktree pinned at the plan's commit,
# so that each run records the same code (scripts/ceiling.py refuses runs whose source differs).
#   scripts/wide_credit.sh          # long: ~52 hours over many sessions; rerun it to resume after a stop
# Finished runs are kept in docs/results/wide-credit/ (metrics, config and, every 10 minutes, their stage
# seconds: scripts/keep_seconds.py); commit that folder as it grows. Stop: kill the process group.
set -euo pipefail
main=$(cd "$(dirname "$0")/.." && pwd)
PREREG=ceab40e   # the commit that holds the plan; never move it
tree=${TREE:-$main/../prereg-wide}
if [ ! -d "$tree" ]; then  # prune first: a worktree whose folder was deleted is still registered
  git -C "$main" worktree prune && git -C "$main" worktree add "$tree" "$PREREG"
fi
if [ "$(git -C "$tree" rev-parse --short=7 HEAD)" != "$PREREG" ] || [ -n "$(git -C "$tree" status --porcelain)" ]; then
  echo "error: $tree is not a clean checkout of $PREREG: the runs must use the plan's code unchanged" >&2; exit 2
fi
keep=$main/docs/results/wide-credit out=$main/runs/wide-credit
# the pinned experiment.sh keeps metrics and config only: harvest each finished run's stage seconds too
( while sleep 600; do "$main/.venv/bin/python" "$main/scripts/keep_seconds.py" "$out" "$keep" > /dev/null || true; done ) &
harvester=$!
trap 'kill $harvester 2>/dev/null; "$main/.venv/bin/python" "$main/scripts/keep_seconds.py" "$out" "$keep"' EXIT
cd "$tree"
PYTHONPATH=$tree PATH=$main/.venv/bin:$PATH KEEP=$keep OUT=$out CONFIG=configs/chains-wide.yaml HELDOUT=256 \
  SEEDS="$(seq -s ' ' 300 481)" METHODS="uniform truth oar_flow_local entropy_mask ktae uniform_1.5x" CEILING_SEEDS= \
  scripts/experiment.sh
