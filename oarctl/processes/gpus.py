"""The GPU hand-off in one place: who holds the GPUs' memory between the stages of a run, and how it
is given back and waited for.

Three parties share the GPUs of one `oarctl run` in turn (oarctl/processes/launch.py says why):
- the run's vLLM engines (oarctl/policy/vllm_backend.py in this process, vllm_replicas' workers):
  each registers its rest hook here when it is built (`on_rest`), and `rest_generation_engines` calls
  them before attribute and update (sleep on a GPU, shut down on CPU), then gives torch's cache back;
- a launched stage (attribute, update) still running: `hold` says which one may still hold GPU memory,
  by the file its end makes (`gpus_free_file`); `wait_for_gpus` waits for that file. A vLLM replica
  (another process) is told the file in its load request and names it here for the load (`named`);
- a launched update's rank 0 says when the policy is in place (`announce_ready`, through the file
  the variable READY_FILE names), before its training state is written.
This module imports nothing of oarctl above errors and artifacts, so engines and stages can use it
without reaching the orchestration (oarctl/loop.py, oarctl/processes/launch.py).
"""
from __future__ import annotations

import contextlib
import gc
import json
import os
import time
from pathlib import Path
from typing import Callable

READY_FILE = "OARCTL_READY_FILE"  # set for a launched update: the file its rank 0 writes once the policy is in place

_rest_hooks: list[Callable[[], object]] = []  # the engines of this process that give memory back on rest
_free_files = {"held": None, "named": None}  # ended files: a launch of this process; one a parent named


def release_cuda_cache() -> None:
    """Give torch's cached GPU memory back (to the engines, or to a launched stage); nothing on CPU."""
    import torch

    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def on_rest(callback: Callable[[], object]) -> None:
    """Register an engine's rest hook (called by `rest_generation_engines`); registering twice is once."""
    if callback not in _rest_hooks:
        _rest_hooks.append(callback)


def rest_generation_engines() -> None:
    """Free the memory of this process's vLLM engines (those registered) while other stages run:
    asleep on a GPU (kept for an in-place reload), shut down on CPU; then give back cached GPU memory."""
    for callback in list(_rest_hooks):
        callback()
    gc.collect()
    release_cuda_cache()


def announce_ready(output: Path) -> None:
    """In a launched update's rank 0, once the policy folder is committed (its training state still to
    come): tell the `oarctl run` that launched it, which samples from the policy meanwhile."""
    from oarctl.artifacts import write_bytes_atomically

    target = os.environ.get(READY_FILE)
    if target:
        write_bytes_atomically(target, json.dumps({"policy": str(output)}))


def hold(ended_file: Path) -> None:
    """A launch of this process may hold GPU memory until `ended_file` appears (at most one at a time)."""
    _free_files["held"] = ended_file


def let_go(ended_file: Path) -> None:
    """The launch that made `ended_file` has ended (a later launch's hold stays)."""
    if _free_files["held"] == ended_file:
        _free_files["held"] = None


@contextlib.contextmanager
def named(ended_file: str | None):
    """In a vLLM replica, for one load: the file its parent said appears once the GPUs are free."""
    _free_files["named"] = ended_file
    try:
        yield
    finally:
        _free_files["named"] = None


def gpus_free_file() -> str | None:
    """The file that appears when the launch still holding GPU memory has ended (None: no such launch)."""
    ended_file = _free_files["named"] or _free_files["held"]
    return str(ended_file) if ended_file else None


def wait_for_gpus(ended_file: str | None = None, poll_seconds: float = 0.05) -> float:
    """Wait until the launched stage that may still hold GPU memory has ended: the one this process
    started, or the one whose `ended_file` a parent named. Returns the seconds waited."""
    ended_file = ended_file or gpus_free_file()
    started = time.perf_counter()
    while ended_file and not Path(ended_file).exists():
        time.sleep(poll_seconds)
    return time.perf_counter() - started


def shared_with_launches() -> bool:
    """On GPUs the update ranks still writing their training state hold their shards: the engines map
    their KV cache only once the launch has ended (wait_for_gpus), and after sampling a step waits for
    it too, so that an in-process stage that needs the GPUs never runs beside the ranks."""
    import torch

    return torch.cuda.is_available()
