"""Hashing of checkpoint files: the sha256 memo, the counters the manifests report, and verification.

A 7B checkpoint is ~90 GB, so hashing is paid once: a process remembers the digest of every file it
hashed, keyed by the file's device, inode, size and modification time (a rename keeps all four, so a
checkpoint saved into a temporary folder and moved into place is not hashed again; rewriting a file
changes its mtime). The files of one checkpoint are hashed in parallel threads (hashlib releases
the GIL). `HASHING` counts the bytes and seconds this process spent verifying what it read,
`WRITE_HASHING` those it spent hashing what it wrote, and `READING` its checkpoint reads, for the
manifests. These counters and the memo are the process's own state by design (one per process).

`verify_checkpoint` checks files against the sha256 a folder's checkpoint.json records
(oarctl/checkpoints.py writes it); `BackgroundCheck` runs that check in a thread beside the work.
Imports nothing of oarctl but `errors`: every floor above may hash.
"""
from __future__ import annotations

import hashlib
import json
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from oarctl.errors import OarError

MANIFEST = "checkpoint.json"  # a checkpoint folder's {"files": {relative path: sha256}}
PRUNED = "PRUNED"  # marker of a checkpoint whose weights run.keep_checkpoints dropped (checkpoints.prune)

HASHING = {"files": 0, "bytes": 0, "seconds": 0.0,  # this process's hashing of files it read, so far,
           "waited": 0.0}  # and the seconds it waited for checks that ran beside its work (BackgroundCheck)
WRITE_HASHING = {"files": 0, "bytes": 0, "seconds": 0.0}  # ... and of files it had just written
READING = {"bytes": 0, "seconds": 0.0}  # this process's checkpoint reads so far (weights, AdamW state)
_DIGESTS: dict[tuple, str] = {}  # (device, inode, size, mtime_ns) -> sha256 hex, the newest DIGESTS_KEPT
DIGESTS_KEPT = 4096  # a run of thousands of steps would otherwise keep a digest per file it ever wrote
_COUNTING = threading.Lock()  # files of one checkpoint are hashed in threads
_HASHING_NOW: dict[tuple, threading.Lock] = {}  # one lock per file key: each file hashed once even when raced


def _hash_bytes(path: Path) -> tuple[str, int, float]:
    """(sha256 hex, bytes, seconds) of one file."""
    started, digest, size = time.perf_counter(), hashlib.sha256(), 0
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 22), b""):
            digest.update(block)
            size += len(block)
    return digest.hexdigest(), size, time.perf_counter() - started


def sha256_file(path: Path, tally: dict = HASHING) -> str:
    """The file's sha256, read from disk at most once per process while the file is unchanged; the
    bytes and seconds go to `tally` (HASHING when verifying a read, WRITE_HASHING after a write)."""
    status = os.stat(path)
    key = (status.st_dev, status.st_ino, status.st_size, status.st_mtime_ns)
    with _COUNTING:
        hashing = _HASHING_NOW.setdefault(key, threading.Lock())
    with hashing:  # a file two threads want (a background check and a reader) is hashed by one of them
        digest = _DIGESTS.get(key)
        if digest is None:
            digest, size, seconds = _hash_bytes(path)
            with _COUNTING:
                tally["files"] += 1
                tally["bytes"] += size
                tally["seconds"] += seconds
                _DIGESTS[key] = digest
                while len(_DIGESTS) > DIGESTS_KEPT:
                    del _DIGESTS[next(iter(_DIGESTS))]  # the oldest first: files of steps long pruned
    with _COUNTING:
        _HASHING_NOW.pop(key, None)  # a later caller finds the digest, so needs no lock
    return digest


def sha256_files(paths: list[Path], tally: dict = HASHING) -> list[str]:
    """sha256_file of each path, the files hashed in parallel."""
    if len(paths) < 2:
        return [sha256_file(p, tally) for p in paths]
    with ThreadPoolExecutor(max_workers=min(8, len(paths))) as pool:
        return list(pool.map(lambda path: sha256_file(path, tally), paths))


def count_read(size: int, started: float) -> None:
    READING["bytes"] += size
    READING["seconds"] += time.perf_counter() - started


def verify_checkpoint(directory: Path, wanted=lambda name: True) -> None:
    """Check the recorded files that `wanted` names against checkpoint.json: a process verifies what it
    reads, so one that loads only the weights does not hash the AdamW state (twice their size)."""
    if (directory / PRUNED).exists():
        raise OarError(f"{directory}: this checkpoint's weights were pruned (run.keep_checkpoints); "
                       "raise run.keep_checkpoints and rerun with --force to rebuild it")
    manifest = directory / MANIFEST
    if not manifest.exists():
        return  # a model directory we did not write (the embedded default, a hub snapshot)
    expected = {name: digest for name, digest in json.loads(manifest.read_text())["files"].items() if wanted(name)}
    for name in expected:
        if not (directory / name).exists():
            raise OarError(f"{directory}: checkpoint file {name} is missing")
    for (name, recorded), actual in zip(expected.items(), sha256_files([directory / n for n in expected])):
        if actual != recorded:
            raise OarError(f"{directory}: checkpoint file {name} does not match its recorded hash (truncated or modified)")


class BackgroundCheck:
    """verify_checkpoint of {checkpoint folder: recorded names}, started now in a thread, while the caller
    reads and computes with those files (hashlib releases the GIL; reading safetensors or JSON runs no
    code). The caller must not let anything made from them out before `problem()` said None."""

    def __init__(self, files: dict):
        self._files = {Path(directory): set(names) for directory, names in files.items()}
        self._problem = None
        self._thread = threading.Thread(target=self._check, daemon=True)  # a killed process does not wait for it
        self._thread.start()

    def _check(self) -> None:
        try:
            for directory, names in self._files.items():
                verify_checkpoint(directory, names.__contains__)
        except OarError as error:
            self._problem = str(error)

    def problem(self) -> str | None:
        """The first file that failed its check, as an error message; None when all passed. Waits for the
        check to end, and counts the wait in HASHING["waited"]."""
        started = time.perf_counter()
        self._thread.join()
        HASHING["waited"] += time.perf_counter() - started
        return self._problem
