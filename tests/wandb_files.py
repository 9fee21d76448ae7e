"""Read back what wandb wrote in offline mode (WANDB_MODE=offline): the history rows of a run file.

A `run-ID.wandb` file is a `:W&B` header (7 bytes) then LevelDB-log records: 32 KiB blocks, each
record a 7-byte header (crc32, length, type: 1 full, 2 first, 3 middle, 4 last) and its bytes; the
joined bytes are one `wandb_internal_pb2.Record`. The reader that used to ship with wandb is gone,
so the tests carry this small one.
"""
from __future__ import annotations

import json
import struct
import time
from pathlib import Path

BLOCK, HEADER = 32768, 7


def records(path: Path):
    from wandb.proto import wandb_internal_pb2

    data = Path(path).read_bytes()
    if len(data) < HEADER:  # not written yet
        return
    assert data[:4] == b":W&B", f"{path}: not a wandb run file"
    position, pending = HEADER, b""
    while position + HEADER <= len(data):
        left = BLOCK - position % BLOCK
        if left < HEADER:  # a block's tail too short for a header is padding
            position += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[position:position + HEADER])
        if position + HEADER + length > len(data):  # the writer is still on this record
            return
        chunk = data[position + HEADER:position + HEADER + length]
        position += HEADER + length
        if kind == 0:
            continue
        pending = chunk if kind in (1, 2) else pending + chunk
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            yield record


def offline_history(folder: Path, wait: float = 60.0) -> list[list[dict]]:
    """One list of history rows ({metric: value}) per offline run under `folder`, oldest run first.

    wandb's service is a separate process: `run.finish()` can return before it has written the run
    file's last records. Wait (up to `wait` seconds) until every run file holds its exit record, so a
    busy machine does not read a file half-written (a missing row then fails the caller's assertion).
    """
    deadline = time.monotonic() + wait
    while True:
        paths = sorted(Path(folder).rglob("offline-run-*/run-*.wandb"))
        runs = [list(records(path)) for path in paths]
        complete = paths and all(any(r.WhichOneof("record_type") == "exit" for r in run) for run in runs)
        if complete or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    return [[{item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in record.history.item}
             for record in run if record.WhichOneof("record_type") == "history"] for run in runs]
