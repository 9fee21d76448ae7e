"""The generation backend registry (CPU, no vllm needed): names, auto, config checks, cache keys."""
from __future__ import annotations

from pathlib import Path

import pytest

from oarctl.config import load_config
from oarctl.errors import OarError
from oarctl.policy import backends
from oarctl.runner import Policy, StageContext, key_parts


def test_the_registry_holds_both_backends():
    assert backends.BACKENDS.names() == ["transformers", "vllm"]
    with pytest.raises(OarError, match="unknown generation backend 'tensorrt'; choose one of: transformers, vllm"):
        backends.BACKENDS.get("tensorrt")


@pytest.mark.parametrize("cuda, installed, expected", [
    (True, True, "vllm"), (True, False, "transformers"), (False, True, "transformers"), (False, False, "transformers")])
def test_auto_is_vllm_only_with_cuda_and_vllm(monkeypatch, cuda, installed, expected):
    monkeypatch.setattr(backends, "cuda_available", lambda: cuda)
    monkeypatch.setattr(backends, "vllm_installed", lambda: installed)
    assert backends.resolve("auto") == expected
    assert backends.resolve("transformers") == "transformers" and backends.resolve("vllm") == "vllm"


def test_generate_dispatches_on_the_policy_backend(monkeypatch):
    calls = []
    monkeypatch.setitem(backends.BACKENDS._entries, "vllm", lambda policy, prompts, **kw: calls.append(kw) or ["g"])
    result = backends.generate(Policy(Path("p"), backend="vllm"), [[1, 2]], temperature=1.0, top_p=1.0,
                               max_new_tokens=4, seed=3, batch_size=8)
    assert result == ["g"] and calls[0]["seed"] == 3 and calls[0]["max_new_tokens"] == 4


def test_transformers_backend_through_the_registry(tiny_policy):
    from oarctl.policy import transformers_backend
    from oarctl.stages.sample import prompt_token_ids

    policy = Policy(tiny_policy)
    model, tokenizer = policy.load()
    prompts = [prompt_token_ids(tokenizer, "Compute 12+3.")] * 3
    settings = dict(temperature=1.0, top_p=1.0, max_new_tokens=6, seed=2, batch_size=2)
    assert backends.generate(policy, prompts, **settings) == transformers_backend.generate(model, tokenizer, prompts,
                                                                                             **settings)


@pytest.mark.parametrize("override, message", [
    ("policy.backend=tensorrt", "policy.backend must be one of"),
    ("vllm.dtype=int8", "vllm.dtype must be one of"),
    ("vllm.tensor_parallel_size=0", "vllm.tensor_parallel_size"),
    ("vllm.data_parallel_size=0", "vllm.data_parallel_size"),
    ("vllm.canary_tokens=-1", "vllm.canary_tokens"),
])
def test_backend_options_are_checked_at_load(override, message):
    with pytest.raises(OarError, match=message):
        load_config(None, [override])


def test_vllm_refuses_top_p_below_one():
    with pytest.raises(OarError, match="sample.top_p must be 1 with policy.backend vllm"):
        load_config(None, ["policy.backend=vllm", "sample.top_p=0.9"])
    assert load_config(None, ["policy.backend=auto"]).policy.backend == "auto"


def test_the_backend_is_in_the_cache_key_only_when_not_transformers(tiny_policy):
    class Stage:
        name, version = "sample", "1"

    def parts(backend):
        context = StageContext(seed=0, step=0, policy=Policy(tiny_policy, backend=backend))
        return key_parts(Stage, {}, {}, context)["inputs"]

    assert set(parts("transformers")) == {"policy"}  # keys of runs made before the registry are unchanged
    assert parts("vllm")["backend"] == "vllm"


def test_the_pipeline_gives_only_generating_stages_the_backend(tiny_policy):
    from oarctl.pipeline import _stage_context

    config = load_config(None, ["policy.backend=vllm"])
    assert _stage_context("sample", config, 0, tiny_policy).policy.backend == "vllm"
    assert _stage_context("evaluate", config, 0, tiny_policy).policy.vllm["canary_tokens"] == 8
    assert _stage_context("update", config, 0, tiny_policy).policy.backend == "transformers"


def test_the_canary_tolerance_follows_the_served_dtype(tmp_path):
    import json

    from oarctl.policy import vllm_backend  # importable without vllm: vllm is imported inside functions

    settings = {"dtype": "auto", "canary_tolerance": 0.0}
    (tmp_path / "config.json").write_text(json.dumps({"torch_dtype": "bfloat16"}))
    assert vllm_backend.canary_tolerance(settings, tmp_path) == 2e-1
    assert vllm_backend.canary_tolerance({**settings, "dtype": "float32"}, tmp_path) == 1e-2
    assert vllm_backend.canary_tolerance({**settings, "canary_tolerance": 0.05}, tmp_path) == 0.05


def test_an_update_checkpoint_is_served_without_its_optimizer_file(tmp_path):
    from oarctl.policy import vllm_backend

    for name in ("config.json", "model.safetensors", "optimizer.safetensors", "tokenizer.json"):
        (tmp_path / name).write_text("x")
    view = vllm_backend.weights_folder(tmp_path)
    assert sorted(p.name for p in view.iterdir()) == ["config.json", "model.safetensors", "tokenizer.json"]
    assert (view / "model.safetensors").resolve() == (tmp_path / "model.safetensors").resolve()
    (tmp_path / "optimizer.safetensors").unlink()
    assert vllm_backend.weights_folder(tmp_path) == tmp_path


def test_prompts_are_shared_out_in_contiguous_near_equal_parts():
    from oarctl.policy.vllm_replicas import shares

    parts = shares(10, 3)
    assert [list(p) for p in parts] == [[0, 1, 2, 3], [4, 5, 6], [7, 8, 9]]
    assert [len(p) for p in shares(2, 4)] == [1, 1, 0, 0]


def test_each_replica_gets_its_own_gpus(monkeypatch):
    from oarctl.policy.vllm_replicas import gpu_groups

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,4,5,6,7")
    assert gpu_groups(2, 2) == ["3,4", "5,6"]
    with pytest.raises(OarError, match="data_parallel_size 3 x vllm.tensor_parallel_size 2 needs 6 GPUs; 5 are visible"):
        gpu_groups(3, 2)


def test_cpu_replicas_get_disjoint_cores(monkeypatch):
    from oarctl.policy import vllm_replicas

    monkeypatch.setattr(vllm_replicas.os, "sched_getaffinity", lambda pid: {0, 1, 2, 5, 6})
    assert vllm_replicas.core_groups(2) == ["0,1,2", "5,6"]
    assert vllm_replicas.core_groups(6) == [None] * 6
