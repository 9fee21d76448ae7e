"""The persistent update worker: `oarctl run` with update.persistent launches the update ranks once
(`accelerate launch -m oarctl.cli update-worker FOLDER -c RUN_DIR/config.yaml`) and sends one request
per step, instead of one launch per step. Each rank runs the same update stage a launched `oarctl
update` runs (pipeline.run_stage, which the CLI passes to `serve`: same cache key, same checkpoint
files, same manifest), but keeps the prepared model, AdamW state and KL reference in memory (a
training.setup.Resident), so from the second step on no process starts, no weights are read and
nothing is wrapped again.

The requests are files in FOLDER, written atomically by `oarctl run` (processes/launch.py, UpdateWorker):
`request.json` {"id": n, "advantages", "output", "policy", "step", "force", "ready_file"} or
{"id": n, "stop": true}. Every rank polls it (no collective while idle, so no timeout however long
sampling takes); rank 0 answers `done-n.json`, {"ok": true} or {"error": "one line"}, once the
checkpoint and the manifest are written. The update stage's ready file says, before that, when the
policy is committed. A killed run takes the worker with it (its launcher gets SIGTERM), and the next
`oarctl run` starts one that loads the last checkpoint from disk.
"""
from __future__ import annotations

import json
import os
import time
from pathlib import Path

from oarctl.artifacts import write_bytes_atomically
from oarctl.distributed import rank
from oarctl.errors import OarError
from oarctl.processes.gpus import READY_FILE, release_cuda_cache
from oarctl.training.setup import Resident

REQUEST = "request.json"


def answer_path(folder: Path, request_id: int) -> Path:
    return folder / f"done-{request_id}.json"


def _next_request(folder: Path, last: int, poll_seconds: float = 0.05) -> dict:
    while True:
        try:
            request = json.loads((folder / REQUEST).read_text())
            if request["id"] > last:
                return request
        except FileNotFoundError:
            pass
        time.sleep(poll_seconds)


def serve(folder: Path, config, log, run_stage) -> None:
    """Every rank: answer update requests until a stop request. `run_stage` is pipeline.run_stage, passed
    in by the CLI so that this process layer never imports the table of stages."""
    last, resident = -1, Resident()  # what the ranks keep from one step to the next
    while True:
        request = _next_request(folder, last)
        last = request["id"]
        if request.get("stop"):
            return
        os.environ[READY_FILE] = request["ready_file"]
        try:
            run_stage("update", config, {"advantages": Path(request["advantages"])}, Path(request["output"]),
                      step=request["step"], policy_path=Path(request["policy"]), force=request["force"], log=log,
                      resident=resident)
            answer = {"ok": True}
        except OarError as error:
            answer = {"error": str(error)}
        if rank() == 0:
            write_bytes_atomically(answer_path(folder, last), json.dumps(answer))
        release_cuda_cache()  # what the step left in torch's cache goes back to the engines
