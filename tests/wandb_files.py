"""Read back what wandb wrote in offline mode (WANDB_MODE=offline): the history rows of a run file.

A `run-ID.wandb` file is a `:W&B` header (7 bytes) then LevelDB-log records: 32 KiB blocks, each
record a 7-byte header (crc32, length, type: 1 full, 2 first, 3 middle, 4 last) and its bytes; the
joined bytes are one `wandb_internal_pb2.Record`. The reader that used to ship with wandb is gone,
so the tests carry this small one.
"""
from __future__ import annotations

import json
import struct
from pathlib import Path

BLOCK, HEADER = 32768, 7


def records(path: Path):
    from wandb.proto import wandb_internal_pb2

    data = Path(path).read_bytes()
    assert data[:4] == b":W&B", f"{path}: not a wandb run file"
    position, pending = HEADER, b""
    while position + HEADER <= len(data):
        left = BLOCK - position % BLOCK
        if left < HEADER:  # a block's tail too short for a header is padding
            position += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[position:position + HEADER])
        chunk = data[position + HEADER:position + HEADER + length]
        position += HEADER + length
        if kind == 0:
            continue
        pending = chunk if kind in (1, 2) else pending + chunk
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            yield record


def offline_history(folder: Path) -> list[list[dict]]:
    """One list of history rows ({metric: value}) per offline run under `folder`, oldest run first."""
    runs = []
    for path in sorted(Path(folder).rglob("offline-run-*/run-*.wandb")):
        runs.append([{item.key or "/".join(item.nested_key): json.loads(item.value_json)
                      for item in record.history.item}
                     for record in records(path) if record.WhichOneof("record_type") == "history"])
    return runs
