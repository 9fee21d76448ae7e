"""Caching: cache hits, exact invalidation (config section, inputs, step, seed, version, policy),
--force, torn states (no manifest, no output, corrupt manifest), failures, checkpoint checks."""
from __future__ import annotations

import dataclasses
import json
import os

import pyarrow.parquet as pq
import pytest

from oarctl.checkpoints import policy_identity
from oarctl.policy.paths import resolve_policy_path
import torch

from conftest import TOY_RESPONSES, hidden_temporaries, sha256, write_rollouts
from oarctl import pipeline
from oarctl.config import load_config, section_dict
from oarctl.errors import OarError
from oarctl.pipeline import run_stage, stage_state
from oarctl.runner import manifest_path, read_manifest


@pytest.fixture
def settings(tiny_policy):
    def make(*overrides):
        return load_config(None, [f"policy.path={tiny_policy}", "run.progress=false", "update.mini_batch_size=4",
                                  "update.micro_batch_size=2", *overrides])
    return make


@pytest.fixture
def spy(monkeypatch):
    """Count the real calls of each stage function (a cache hit does not call it)."""
    calls = {name: 0 for name in pipeline.STAGES}

    def wrap(name):
        stage = pipeline.STAGES[name]

        def counted(inputs, config, context):
            calls[name] += 1
            return stage.function(inputs, config, context)
        monkeypatch.setitem(pipeline.STAGES, name, dataclasses.replace(stage, function=counted))

    for name in list(pipeline.STAGES):
        wrap(name)
    return calls


def quiet(*args, **kwargs):
    pass


def verify(config, rollouts, output, **kwargs):
    return run_stage("verify", config, {"rollouts": rollouts}, output, log=quiet, **kwargs)


@pytest.fixture
def rollouts(tmp_path):
    return write_rollouts(tmp_path / "rollouts.parquet", rows=4)


def test_second_run_is_a_cache_hit(settings, rollouts, tmp_path, spy):
    config, output = settings(), tmp_path / "verified.parquet"
    first, ran = verify(config, rollouts, output)
    assert ran and spy["verify"] == 1
    assert stage_state("verify", config, {"rollouts": rollouts}, output) == "done"
    mtime = output.stat().st_mtime_ns
    manifest_text = manifest_path(output).read_text()
    second, ran = verify(config, rollouts, output)
    assert not ran and spy["verify"] == 1
    assert second == first
    assert output.stat().st_mtime_ns == mtime and manifest_path(output).read_text() == manifest_text


def test_manifest_records_key_parts_and_output_hash(settings, rollouts, tmp_path):
    output = tmp_path / "verified.parquet"
    config = settings()
    manifest, _ = verify(config, rollouts, output)
    assert manifest_path(output) == tmp_path / "verified.parquet.manifest.json"
    on_disk = json.loads(manifest_path(output).read_text())
    assert on_disk["key"] == manifest["key"] and on_disk["stage"] == "verify"
    assert on_disk["output_sha256"] == sha256(output)
    # verify reads the policy's tokenizer (answer token spans), so the policy is part of its key
    assert on_disk["key_parts"]["inputs"] == {"rollouts": sha256(rollouts),
                                              "policy": policy_identity(resolve_policy_path(config.policy.path))}
    assert on_disk["key_parts"]["config"] == section_dict(config, "verify")
    assert on_disk["metrics"]["reward_mean"] == pytest.approx(0.5)
    assert {"finished_at", "wall_seconds"} <= set(on_disk)


def test_own_config_section_change_reruns_and_says_why(settings, rollouts, tmp_path, spy):
    verified, attributions, advantages = (tmp_path / f"{n}.parquet" for n in ("verified", "attributions", "advantages"))
    config = settings()
    verify(config, rollouts, verified)
    run_stage("attribute", config, {"verified": verified}, attributions, policy_path=config_policy(config), log=quiet)
    run_stage("reshape", config, {"attributions": attributions}, advantages, log=quiet)
    assert spy["reshape"] == 1
    changed = settings("reshape.scale=none")
    assert stage_state("reshape", changed, {"attributions": attributions}, advantages) \
        == "config changed (reshape.scale)"
    assert stage_state("verify", changed, {"rollouts": rollouts}, verified) == "done"
    _, ran = run_stage("reshape", changed, {"attributions": attributions}, advantages, log=quiet)
    assert ran and spy["reshape"] == 2
    assert stage_state("reshape", changed, {"attributions": attributions}, advantages) == "done"
    assert stage_state("reshape", config, {"attributions": attributions}, advantages) \
        == "config changed (reshape.scale)"


def config_policy(config):
    return resolve_policy_path(config.policy.path)


def test_other_sections_do_not_invalidate(settings, rollouts, tmp_path, spy):
    output = tmp_path / "verified.parquet"
    verify(settings(), rollouts, output)
    other = settings("sample.temperature=0.5", "update.learning_rate=0.1", "reshape.beta=3")
    assert stage_state("verify", other, {"rollouts": rollouts}, output) == "done"
    assert not verify(other, rollouts, output)[1] and spy["verify"] == 1


def test_input_content_change_reruns_but_a_rewrite_does_not(settings, rollouts, tmp_path, spy):
    config, output = settings(), tmp_path / "verified.parquet"
    verify(config, rollouts, output)
    data = rollouts.read_bytes()
    rollouts.unlink()
    rollouts.write_bytes(data)  # same bytes, new file and mtime
    os.utime(rollouts, (1, 1))
    assert stage_state("verify", config, {"rollouts": rollouts}, output) == "done"
    text, ids, finish = TOY_RESPONSES[0]  # every response is the correct one
    write_rollouts(rollouts, rows=4, response_text=[text] * 4, response_token_ids=[ids] * 4,
                   response_logprobs=[[-0.5] * len(ids)] * 4, finish_reason=[finish] * 4)
    assert stage_state("verify", config, {"rollouts": rollouts}, output) == "input changed (rollouts)"
    manifest, ran = verify(config, rollouts, output)
    assert ran and spy["verify"] == 2 and manifest["metrics"]["reward_mean"] == 1.0


def test_step_seed_and_version_are_part_of_the_key(settings, rollouts, tmp_path, monkeypatch):
    config, output = settings(), tmp_path / "verified.parquet"
    verify(config, rollouts, output)
    inputs = {"rollouts": rollouts}
    assert stage_state("verify", config, inputs, output, step=3) == "step changed"
    assert stage_state("verify", settings("run.seed=7"), inputs, output) == "seed changed"
    assert stage_state("verify", settings("run.seed=7", "verify.method=math"), inputs, output, step=1) \
        == "seed changed, step changed"
    monkeypatch.setitem(pipeline.STAGES, "verify", dataclasses.replace(pipeline.STAGES["verify"], version="next"))
    assert stage_state("verify", config, inputs, output) == "version changed"


def test_policy_identity_is_an_input(settings, rollouts, tmp_path, random_policy, spy):
    config = settings()
    verified, attributions = tmp_path / "verified.parquet", tmp_path / "attributions.parquet"
    verify(config, rollouts, verified)
    inputs = {"verified": verified}
    run_stage("attribute", config, inputs, attributions, policy_path=config_policy(config), log=quiet)
    assert stage_state("attribute", config, inputs, attributions, policy_path=config_policy(config)) == "done"
    assert stage_state("attribute", config, inputs, attributions, policy_path=random_policy) \
        == "input changed (policy)"
    assert stage_state("attribute", config, inputs, attributions, policy_path=tmp_path / "nope") \
        == f"waiting for {tmp_path / 'nope'}"


def test_force_reruns(cli, settings, rollouts, tmp_path, spy):
    output = tmp_path / "verified.parquet"
    first = cli("verify", rollouts, "-o", output)
    assert first.exit_code == 0, first.output
    assert first.stdout.startswith(f"verify: wrote {output}") and "reward_mean=0.5" in first.stdout
    assert first.stderr == f"[verify] {output}: running: no output yet\n"
    again = cli("verify", rollouts, "-o", output)
    assert again.exit_code == 0 and again.stdout.startswith(f"verify: up to date {output}")
    assert again.stderr == f"[verify] {output}: done (cached)\n"
    before = json.loads(manifest_path(output).read_text())
    forced = cli("verify", rollouts, "-o", output, "--force")
    assert forced.exit_code == 0 and forced.stdout.startswith(f"verify: wrote {output}")
    assert f"{output}: running: forced (--force)" in forced.stderr
    after = json.loads(manifest_path(output).read_text())
    assert after["key"] == before["key"] and after["finished_at"] >= before["finished_at"]
    assert spy["verify"] == 2


@pytest.mark.parametrize("damage, reason", [
    ("delete-manifest", "incomplete (no manifest)"),
    ("corrupt-manifest", "incomplete (no manifest)"),  # unreadable JSON is treated as absent
    ("delete-output", "no output yet"),
])
def test_torn_states_are_recomputed(settings, rollouts, tmp_path, spy, damage, reason):
    config, output = settings(), tmp_path / "verified.parquet"
    verify(config, rollouts, output)
    if damage == "delete-manifest":
        manifest_path(output).unlink()
    elif damage == "corrupt-manifest":
        manifest_path(output).write_text('{"key": ')
    else:
        output.unlink()
    assert stage_state("verify", config, {"rollouts": rollouts}, output) == reason
    _, ran = verify(config, rollouts, output)
    assert ran and spy["verify"] == 2
    assert read_manifest(output)["output_sha256"] == sha256(output)
    assert stage_state("verify", config, {"rollouts": rollouts}, output) == "done"


def test_a_failing_stage_leaves_no_manifest_and_reruns(settings, rollouts, tmp_path, monkeypatch):
    config, output = settings(), tmp_path / "verified.parquet"
    stage = pipeline.STAGES["verify"]

    def broken(inputs, section, context):
        raise OarError("verify: checker crashed")
    monkeypatch.setitem(pipeline.STAGES, "verify", dataclasses.replace(stage, function=broken))
    with pytest.raises(OarError, match="checker crashed"):
        verify(config, rollouts, output)
    assert not output.exists() and not manifest_path(output).exists()
    assert hidden_temporaries(tmp_path) == []
    monkeypatch.setitem(pipeline.STAGES, "verify", stage)
    assert verify(config, rollouts, output)[1]


def test_a_refused_input_leaves_an_old_output_unvouched(settings, rollouts, tmp_path):
    """Once a rerun starts, the old output is no longer vouched for (its manifest goes first)."""
    config, output = settings(), tmp_path / "verified.parquet"
    verify(config, rollouts, output)
    rollouts.write_text("garbage")
    with pytest.raises(OarError, match="not a readable Parquet"):
        verify(config, rollouts, output)
    assert stage_state("verify", config, {"rollouts": rollouts}, output) == "input changed (rollouts)"


def run_chain(config, rollouts, folder, policy):
    paths = {n: folder / f"{n}.parquet" for n in ("verified", "attributions", "advantages")}
    run_stage("verify", config, {"rollouts": rollouts}, paths["verified"], log=quiet)
    run_stage("attribute", config, {"verified": paths["verified"]}, paths["attributions"], policy_path=policy,
              log=quiet)
    run_stage("reshape", config, {"attributions": paths["attributions"]}, paths["advantages"], log=quiet)
    return paths["advantages"]


def test_update_writes_a_verified_checkpoint_and_caches_it(settings, rollouts, tmp_path, tiny_policy, spy):
    config = settings()
    advantages = run_chain(config, rollouts, tmp_path, tiny_policy)
    output = tmp_path / "policy"
    manifest, ran = run_stage("update", config, {"advantages": advantages}, output, policy_path=tiny_policy,
                              log=quiet)
    assert ran
    files = json.loads((output / "checkpoint.json").read_text())["files"]
    assert {"model.safetensors", "update.parquet", "config.json"} <= set(files)
    for name, digest in files.items():
        assert sha256(output / name) == digest
    # what only the next update reads is apart, sealed by its own checkpoint.json
    state = json.loads((output / "training_state" / "checkpoint.json").read_text())["files"]
    assert set(state) == {"optimizer.safetensors", "optimizer.json"} and not set(state) & set(files)
    for name, digest in state.items():
        assert sha256(output / "training_state" / name) == digest
    assert not any(p.suffix in (".bin", ".pt", ".pth", ".pkl") for p in output.iterdir())
    assert pq.read_table(output / "update.parquet").num_rows == 1  # 4 rows, mini batch 4, 1 epoch
    assert manifest_path(output) == tmp_path / "policy.manifest.json"
    assert sha256(output / "model.safetensors") != sha256(tiny_policy / "model.safetensors")
    assert not run_stage("update", config, {"advantages": advantages}, output, policy_path=tiny_policy,
                         log=quiet)[1]
    assert spy["update"] == 1
    assert hidden_temporaries(tmp_path) == []
    # a second update continues from the first one's optimizer state and is keyed on its identity
    second = tmp_path / "policy2"
    parts = run_stage("update", config, {"advantages": advantages}, second, policy_path=output, step=1,
                      log=quiet)[0]["key_parts"]
    assert parts["inputs"]["policy"] == pipeline.Policy(output).identity != pipeline.Policy(tiny_policy).identity


def test_kl_reference_is_part_of_the_update_key(settings, rollouts, tmp_path, tiny_policy):
    config = settings("update.kl_coef=0.1")
    advantages = run_chain(config, rollouts, tmp_path, tiny_policy)
    manifest, ran = run_stage("update", config, {"advantages": advantages}, tmp_path / "policy",
                              policy_path=tiny_policy, log=quiet)
    assert ran and manifest["key_parts"]["inputs"]["reference"] == pipeline.Policy(tiny_policy).identity
    assert manifest["metrics"]["kl"] == pytest.approx(0.0, abs=1e-6)  # the first step starts at the reference
    assert stage_state("update", settings(), {"advantages": advantages}, tmp_path / "policy",
                       policy_path=tiny_policy) == "config changed (update.kl_coef), input changed (reference)"


def test_tampered_checkpoint_is_refused(settings, rollouts, tmp_path, tiny_policy):
    config = settings()
    advantages = run_chain(config, rollouts, tmp_path, tiny_policy)
    output = tmp_path / "policy"
    run_stage("update", config, {"advantages": advantages}, output, policy_path=tiny_policy, log=quiet)
    weights = output / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-16])
    with pytest.raises(OarError, match="model.safetensors does not match its recorded hash"):
        run_stage("update", config, {"advantages": advantages}, tmp_path / "next", policy_path=output, step=1,
                  log=quiet)
    assert not (tmp_path / "next").exists()


def test_stale_temporaries_of_a_dead_process_are_cleaned_up(settings, rollouts, tmp_path, tiny_policy):
    config = settings()
    advantages = run_chain(config, rollouts, tmp_path, tiny_policy)
    dead = 2 ** 22 + 12345  # above the default pid_max: no live process has this id
    (tmp_path / f".verified2.parquet.tmp-{dead}").write_bytes(b"PAR1 half")
    (tmp_path / f".verified2.parquet.manifest.json.tmp-{dead}").write_text("{")
    (tmp_path / f".policy.tmp-{dead}").mkdir()
    (tmp_path / f".policy.tmp-{dead}" / "model.safetensors").write_bytes(b"half")
    run_stage("verify", config, {"rollouts": rollouts}, tmp_path / "verified2.parquet", log=quiet)
    run_stage("update", config, {"advantages": advantages}, tmp_path / "policy", policy_path=tiny_policy, log=quiet)
    assert hidden_temporaries(tmp_path) == []


def test_policy_threads_option_is_applied(settings, tmp_path, monkeypatch):
    prompts = tmp_path / "prompts.parquet"
    from oarctl.artifacts import write_parquet
    from oarctl.data import toy_prompts
    write_parquet(toy_prompts("train", 4, [1], 0), prompts)
    seen = []
    stage = pipeline.STAGES["sample"]

    def recording(inputs, section, context):
        context.policy.load()
        seen.append(torch.get_num_threads())
        return stage.function(inputs, section, context)
    monkeypatch.setitem(pipeline.STAGES, "sample", dataclasses.replace(stage, function=recording))
    threads = torch.get_num_threads()
    wanted = 2 if threads != 2 else 1
    config = settings(f"policy.threads={wanted}", "sample.prompts_per_step=1", "sample.group_size=1")
    try:
        run_stage("sample", config, {"prompts": prompts}, tmp_path / "r.parquet",
                  policy_path=config_policy(config), log=quiet)
    finally:
        torch.set_num_threads(threads)
    assert seen == [wanted]


def test_a_three_step_run_hashes_each_checkpoint_file_once(cli, tiny_config, tmp_path, monkeypatch):
    """Written, the file is hashed; loaded later by the same process (attribute, the next update), it is
    not read again. Counted per file content: (device, inode), which a rename into place keeps."""
    import os
    from collections import Counter

    from oarctl import hashing

    counts: Counter = Counter()
    hash_bytes = hashing._hash_bytes

    def counted(path):
        status = os.stat(path)
        counts[(status.st_dev, status.st_ino)] += 1
        return hash_bytes(path)

    monkeypatch.setattr(hashing, "_hash_bytes", counted)
    monkeypatch.setattr(hashing, "_DIGESTS", {})
    config = tiny_config(run={"steps": 3, "progress": False, "eval_every": 0, "keep_checkpoints": 3},
                         attribute={"method": "oar_g"})
    result = cli("run", "-c", config, "--run-dir", tmp_path / "R")
    assert result.exit_code == 0, result.output
    written = [p for p in (tmp_path / "R").glob("step_*/policy/**/*") if p.is_file() and p.name != "checkpoint.json"]
    assert len({p.parent for p in written}) == 3 * 2 and len(written) >= 3 * 4  # policy/ and policy/training_state/
    for path in written:
        status = os.stat(path)
        assert counts[(status.st_dev, status.st_ino)] == 1, path
    manifest = json.loads((tmp_path / "R" / "step_0002" / "policy.manifest.json").read_text())["metrics"]
    folder = tmp_path / "R" / "step_0002" / "policy"
    files = [p for p in folder.rglob("*") if p.is_file()]
    assert manifest["checkpoint_bytes_written"] == sum(p.stat().st_size for p in files)
    assert manifest["checkpoint_bytes_hashed"] == sum(p.stat().st_size for p in files if p.name != "checkpoint.json")
    assert manifest["checkpoint_write_seconds"] > 0
    previous = tmp_path / "R" / "step_0001" / "policy"  # what the third update read: weights and AdamW state
    assert manifest["checkpoint_bytes_read"] == sum(p.stat().st_size for p in previous.glob("**/*.safetensors"))
    assert manifest["checkpoint_bytes_verified"] == 0  # this process wrote (and hashed) them one step before
    assert manifest["checkpoint_read_seconds"] > 0


def test_a_process_verifies_what_it_reads(settings, rollouts, tmp_path, tiny_policy):
    """Loading the weights does not hash the AdamW state; continuing its optimizer does, and refuses a
    modified one."""
    from oarctl.checkpoints import load_policy

    config = settings()
    advantages = run_chain(config, rollouts, tmp_path, tiny_policy)
    output = tmp_path / "policy"
    run_stage("update", config, {"advantages": advantages}, output, policy_path=tiny_policy, log=quiet)
    moments = output / "training_state" / "optimizer.safetensors"
    data = bytearray(moments.read_bytes())
    data[-1] ^= 0xFF  # the last byte of the last tensor: still a readable file
    moments.write_bytes(bytes(data))
    load_policy(output)  # the weights are intact
    with pytest.raises(OarError, match="optimizer.safetensors does not match its recorded hash"):
        run_stage("update", config, {"advantages": advantages}, tmp_path / "next", policy_path=output, step=1,
                  log=quiet)


def test_a_policy_whose_training_state_was_never_finished_is_refused(settings, rollouts, tmp_path, tiny_policy):
    """training_state/ without its checkpoint.json: the update writing it was killed. Its weights can be
    served (they were committed first), but continuing training from it is one clear error."""
    from oarctl.checkpoints import load_policy

    config = settings()
    advantages = run_chain(config, rollouts, tmp_path, tiny_policy)
    output = tmp_path / "policy"
    run_stage("update", config, {"advantages": advantages}, output, policy_path=tiny_policy, log=quiet)
    (output / "training_state" / "checkpoint.json").unlink()
    load_policy(output)
    with pytest.raises(OarError, match="training_state: the training state is incomplete"):
        run_stage("update", config, {"advantages": advantages}, tmp_path / "next", policy_path=output, step=1,
                  log=quiet)


def _recorded_folder(folder, contents: dict[str, bytes]):
    """A folder of files and the checkpoint.json that records their sha256."""
    folder.mkdir()
    for name, data in contents.items():
        (folder / name).write_bytes(data)
    (folder / "checkpoint.json").write_text(json.dumps({"files": {n: sha256(folder / n) for n in contents}}))
    return folder


def test_a_check_beside_the_work_settles_before_the_results_leave(tmp_path):
    """distributed.checked_beside: the body runs while the files are hashed; a modified file is refused
    when the body is done (so its results are never written), and when the body fails first (a load
    error), the check's finding replaces that error. Each file is hashed once, even when the body verifies
    the same files itself at the same time."""
    from oarctl.hashing import HASHING, verify_checkpoint
    from oarctl.distributed import checked_beside

    contents = {f"part-{i}.bin": os.urandom(1 << 20) for i in range(4)}
    good = _recorded_folder(tmp_path / "good", contents)
    before = dict(HASHING)
    with checked_beside({good: sorted(contents)}, None):
        verify_checkpoint(good)  # the body reads (and verifies) the same files meanwhile
    assert HASHING["files"] - before["files"] == len(contents)
    assert HASHING["bytes"] - before["bytes"] == sum(map(len, contents.values()))

    bad = _recorded_folder(tmp_path / "bad", contents)
    data = bytearray(contents["part-2.bin"])
    data[7] ^= 1
    (bad / "part-2.bin").write_bytes(bytes(data))
    ran = []
    with pytest.raises(OarError, match="part-2.bin does not match its recorded hash"):
        with checked_beside({bad: sorted(contents)}, None):
            ran.append("body")
    assert ran == ["body"]  # the body ran to its end, then the check refused its results
    (bad / "part-2.bin").write_bytes(bytes(data[:100]))  # now truncated: say so, not the body's own error
    with pytest.raises(OarError, match="part-2.bin does not match its recorded hash"):
        with checked_beside({bad: sorted(contents)}, None):
            raise ValueError("cannot parse part-2.bin")
    with pytest.raises(ValueError, match="cannot parse"):  # nothing found: the body's error stands
        with checked_beside({good: sorted(contents)}, None):
            raise ValueError("cannot parse")


def test_the_digests_a_process_keeps_are_bounded(tmp_path, monkeypatch):
    """A long run writes files every step: the process keeps the newest DIGESTS_KEPT digests and no lock
    per file once hashed; a file still kept is not read again, an evicted one is hashed anew."""
    from oarctl import hashing

    monkeypatch.setattr(hashing, "_DIGESTS", {})
    monkeypatch.setattr(hashing, "DIGESTS_KEPT", 3)
    files = [tmp_path / f"f{i}" for i in range(5)]
    for index, path in enumerate(files):
        path.write_bytes(bytes([index]) * 10)
    tally = {"files": 0, "bytes": 0, "seconds": 0.0}
    digests = [hashing.sha256_file(path, tally) for path in files]
    assert digests == [sha256(path) for path in files] and tally["files"] == 5
    assert len(hashing._DIGESTS) == 3 and hashing._HASHING_NOW == {}
    hashing.sha256_file(files[4], tally)  # kept
    assert tally["files"] == 5
    assert hashing.sha256_file(files[0], tally) == digests[0] and tally["files"] == 6  # evicted: read again


def test_weight_file_plan_fills_files_in_name_order():
    """80-byte files: a (40) + b (30) fit; c (50) would pass 80, so it starts file 2 with d (10); e (200)
    is over the limit alone and gets its own file. Under 1 MB all is one model.safetensors."""
    from oarctl.checkpoints import weight_file_plan

    sizes = {"d": 10, "b": 30, "e": 200, "a": 40, "c": 50}
    assert weight_file_plan(sizes, 80e-6) == {"model-00001-of-00003.safetensors": ["a", "b"],
                                              "model-00002-of-00003.safetensors": ["c", "d"],
                                              "model-00003-of-00003.safetensors": ["e"]}
    assert weight_file_plan(sizes, 1) == {"model.safetensors": ["a", "b", "c", "d", "e"]}


def test_large_weights_are_saved_in_several_files_that_load_back(tiny_policy, tmp_path):
    """update.weight_file_mb splits the weights (a 7B fp32 model at 2,000 MB: 16 files, hashed in 8
    threads); every file is recorded and the model loads back whole."""
    from oarctl import checkpoints

    model, tokenizer = checkpoints.load_policy(tiny_policy)
    checkpoints.save_policy(model, tokenizer, tmp_path / "policy", max_file_mb=0.03)  # the policy: ~100 KB in fp32
    files = sorted(p.name for p in (tmp_path / "policy").glob("model-*.safetensors"))
    recorded = json.loads((tmp_path / "policy" / "checkpoint.json").read_text())["files"]
    assert len(files) >= 3 and set(files) <= recorded.keys()
    loaded, _ = checkpoints.load_policy(tmp_path / "policy")
    expected = model.state_dict()
    assert all(torch.equal(value, expected[name]) for name, value in loaded.state_dict().items())


def test_a_persistent_worker_trains_on_from_memory_only_for_the_checkpoint_it_kept(tmp_path):
    """The worker's Resident hands the kept state over once, for the folder it was kept for and only while
    that folder is unchanged; a step that fails after taking it leaves nothing kept, so the next one loads."""
    from types import SimpleNamespace

    from oarctl.checkpoints import policy_identity
    from oarctl.training.setup import KeptState, Resident, kept_state

    folder = tmp_path / "policy"
    folder.mkdir()
    (folder / "model.safetensors").write_bytes(b"weights")
    resident = Resident()
    context = SimpleNamespace(policy=SimpleNamespace(path=folder), resident=resident)
    kept = KeptState(None, "model", None, "adamw", [], None, folder, policy_identity(folder))
    resident.keep(kept)
    assert kept_state(context) is kept
    assert kept_state(context) is None  # taken: a failed step cannot train on a half-changed model
    resident.keep(kept)
    (folder / "model.safetensors").write_bytes(b"other weights")  # changed on disk since: read it
    assert kept_state(context) is None and kept_state(context) is None  # and no longer kept
    resident.keep(kept)
    assert resident.take(tmp_path / "elsewhere") is None
    assert kept_state(SimpleNamespace(policy=SimpleNamespace(path=folder), resident=None)) is None  # no worker
