"""Keep each finished run's stage seconds per step beside its kept metrics, for runs kept without step folders.

    python scripts/keep_seconds.py runs/wide-credit docs/results/wide-credit

scripts/experiment.sh's KEEP folder holds a finished run's metrics.jsonl and config.yaml only; the seconds
each stage took live in the manifests of the run's step folders, which are too big to commit. This writes
KEEP/<run>/seconds.json ({"steps": [{stage: wall seconds}, ...]}, one entry per step, from
OUT/<run>/step_*/*.manifest.json) for every kept run that has none yet, so that `oarctl compare` and
`scripts/ceiling.py --metric equal_time` can read a run's cost after its step folders are gone. A run whose
step folders are missing or incomplete (fewer folders than its configured steps) is listed, not written.
Each file is written atomically; rerunning it writes only what is missing.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as `python scripts/keep_seconds.py` from a clone
    sys.path.insert(0, str(REPO))

from oarctl.artifacts import write_bytes_atomically  # noqa: E402
from oarctl.errors import OarError  # noqa: E402
from oarctl.report.compare import (  # noqa: E402
    SECONDS_FILE, STAGE_OUTPUTS, complete_steps, configured_steps, step_stage_seconds)

RUN = re.compile(r"^.+-s\d+$")


def keep(out: Path, kept: Path) -> str:
    """'written', 'had' or why not: the run's seconds from OUT/<run> into KEEP/<run>/seconds.json."""
    if (kept / SECONDS_FILE).is_file():
        return "had"
    if not (kept / "config.yaml").is_file():
        return "no config.yaml in the kept folder"
    try:
        expected = configured_steps(kept)
    except OarError as error:
        return str(error)
    found = step_stage_seconds(out / kept.name)
    steps = complete_steps(found, expected)
    if steps is None or len(found) != expected:
        return f"{len(found)} complete step folders in {out / kept.name}, {expected} configured"
    text = json.dumps({"steps": [{stage: round(step[stage], 3) for stage in STAGE_OUTPUTS} for step in steps]})
    write_bytes_atomically(kept / SECONDS_FILE, text + "\n")
    return "written"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path, help="the experiment's run folders (OUT of scripts/experiment.sh)")
    parser.add_argument("keep", type=Path, help="the kept runs (KEEP of scripts/experiment.sh)")
    args = parser.parse_args(argv)
    for folder in (args.out, args.keep):
        if not folder.is_dir():
            sys.stderr.write(f"error: {folder}: not a directory\n")
            raise SystemExit(2)
    outcomes = {kept.name: keep(args.out, kept) for kept in sorted(args.keep.iterdir())
                if kept.is_dir() and RUN.match(kept.name)}
    for name, outcome in outcomes.items():
        if outcome not in ("written", "had"):
            sys.stdout.write(f"{name}: not written: {outcome}\n")
    counts = {kind: sum(1 for o in outcomes.values() if o == kind) for kind in ("written", "had")}
    sys.stdout.write(f"{counts['written']} written, {counts['had']} already kept, "
                     f"{len(outcomes) - sum(counts.values())} not written\n")


if __name__ == "__main__":
    main()
