"""The update stage under `accelerate launch`: 2 CPU processes (gloo; DDP, then FSDP) train the same
weights and AdamW state as one plain process, and FSDP continues a checkpoint's AdamW state; token-budget
micro-batches give the gradient of fixed-size ones."""
from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import torch
import yaml
from safetensors.torch import load_file

from oarctl.artifacts import read_artifact, write_parquet
from oarctl.batching import fixed_size, loss_share, plan_step, token_budget
from oarctl.checkpoints import TRAINING_STATE as STATE
from oarctl.checkpoints import seal
from oarctl.config import load_config
from oarctl.stages import update

ROOT = Path(__file__).resolve().parents[1]
# logit_chunk_tokens 16: several vocabulary chunks per micro-batch, recomputed in the backward, so the
# DDP and FSDP runs below also check that the stand-in output layer works inside those wrappers
UPDATE = {"mini_batch_size": 8, "micro_batch_size": 3, "learning_rate": 1e-3, "logit_chunk_tokens": 16}


@pytest.fixture(scope="module")
def batch(tmp_path_factory, tiny_policy, signal_data) -> dict[str, Path]:
    """A 16-row advantages file with mixed rewards, made by the real stage commands; and its config."""
    from typer.testing import CliRunner

    from oarctl.cli import app
    from oarctl.data import load_prompts

    folder = tmp_path_factory.mktemp("accelerate")
    config = folder / "config.yaml"
    config.write_text(yaml.safe_dump({
        "run": {"progress": False}, "policy": {"path": str(tiny_policy)},
        "data": {"train": str(signal_data["train"]), "heldout": str(signal_data["heldout"])},
        "sample": {"prompts_per_step": 4, "group_size": 4, "max_new_tokens": 16}, "update": UPDATE}))
    prompts = folder / "prompts.parquet"
    write_parquet(load_prompts(str(signal_data["train"]), "train", load_config(config)), prompts)
    previous = prompts
    for name, output in (("sample", "rollouts"), ("verify", "verified"), ("attribute", "attributions"),
                         ("reshape", "advantages")):
        result = CliRunner().invoke(app, [name, str(previous), "-o", str(folder / f"{output}.parquet"),
                                          "-c", str(config)])
        assert result.exit_code == 0, result.output
        previous = folder / f"{output}.parquet"
    return {"advantages": previous, "config": config, "folder": folder}


def _free_port() -> int:
    with socket.socket() as handle:
        handle.bind(("127.0.0.1", 0))
        return handle.getsockname()[1]


def _launch_update(batch: dict, policy: Path, output: Path, config: str = "cpu-2proc") -> subprocess.CompletedProcess:
    launcher = Path(sys.executable).parent / "accelerate"
    return subprocess.run(
        [str(launcher), "launch", "--config_file", str(ROOT / "configs" / "accelerate" / f"{config}.yaml"),
         "--main_process_port", str(_free_port()), "-m", "oarctl.cli", "update", str(batch["advantages"]),
         "-o", str(output), "--policy", str(policy), "-c", str(batch["config"])],
        capture_output=True, text=True, timeout=300, cwd=ROOT)


def _update(batch: dict, policy: Path, output: Path) -> None:
    """One plain process (no launcher), in-process."""
    from typer.testing import CliRunner

    from oarctl.cli import app

    result = CliRunner().invoke(app, ["update", str(batch["advantages"]), "-o", str(output), "--policy", str(policy),
                                      "-c", str(batch["config"])])
    assert result.exit_code == 0, result.output


@pytest.fixture(scope="module")
def first_update(batch, tiny_policy):
    """`first_update(config)` -> (folder, launch result): the update of tiny_policy on the batch by one plain
    process (config None, result None) or launched with configs/accelerate/CONFIG.yaml; each run once."""
    made = {}

    def make(config: str | None = None):
        if config in made:
            return made[config]
        output, launched = batch["folder"] / f"policy-{config or 'plain'}", None
        if config is None:
            _update(batch, tiny_policy, output)
        else:
            started = time.perf_counter()
            launched = _launch_update(batch, tiny_policy, output, config)
            print(f"{config} update: {time.perf_counter() - started:.1f} s")
            assert launched.returncode == 0, launched.stderr[-3000:]
        made[config] = output, launched
        return made[config]
    return make


def _max_difference(one: dict, two: dict) -> float:
    assert one.keys() == two.keys()
    return max(float((one[k] - two[k]).abs().max()) for k in one)


@pytest.mark.parametrize("config", ["cpu-2proc", "cpu-fsdp-2proc"])
def test_two_processes_train_the_weights_of_one(first_update, batch, tiny_policy, config):
    """~16 s (idle cores) to ~45 s (busy) each: the launcher and two ranks each import torch. Under FSDP each
    rank writes its own AdamW shard (optimizer/), read whole here."""
    (single, _), (double, launched) = first_update(None), first_update(config)
    assert launched.stdout.count(f"update: wrote {double}") == 2  # both ranks ran the stage
    assert ("update: FullyShardedDataParallel over 2 ranks" in launched.stderr) == ("fsdp" in config)
    # fsdp_cpu_ram_efficient_loading: only rank 0 read the weights; rank 1 started from the meta device
    assert ("update: rank 1 built the policy on the meta device" in launched.stderr) == ("fsdp" in config)

    initial = load_file(tiny_policy / "model.safetensors")
    one, two = load_file(single / "model.safetensors"), load_file(double / "model.safetensors")
    moved, difference = _max_difference(one, initial), _max_difference(one, two)
    moments = _max_difference(_moments(single), _moments(double))
    print(f"{config}: max |w1 - w0| = {moved:.3e}, max |w1 - w2| = {difference:.3e}, moments {moments:.3e}")
    assert moved > 1e-4  # the update really changed the weights
    assert difference < 1e-5
    assert moments < 1e-6
    assert json.loads((double / STATE / "optimizer.json").read_text()) == \
        json.loads((single / STATE / "optimizer.json").read_text())
    assert {p.name for p in double.iterdir()} == {p.name for p in single.iterdir()}
    one_process_form = {"optimizer.safetensors"} if "fsdp" in config else set()
    assert {p.name for p in (double / STATE).iterdir()} | one_process_form == \
        {p.name for p in (single / STATE).iterdir()} | ({"optimizer"} if "fsdp" in config else set())
    assert json.loads((double / "config.json").read_text()) == json.loads((single / "config.json").read_text())
    log_one, log_two = pq.read_table(single / "update.parquet"), pq.read_table(double / "update.parquet")
    assert log_one.column_names == log_two.column_names and log_one.num_rows == log_two.num_rows == 2
    # token means inside a micro-batch (entropy, ratio_mean, clip_fraction) are logged with sequence
    # weights, so they depend on how rows are cut; these do not
    for name in ("loss", "pg_loss", "kl", "tokens", "grad_norm"):
        assert log_two[name].to_pylist() == pytest.approx(log_one[name].to_pylist(), rel=1e-4, abs=1e-6), name
    metrics = json.loads((batch["folder"] / f"{double.name}.manifest.json").read_text())["metrics"]
    for rank in ("rank0", "other_ranks"):  # each rank's peak host memory, once loaded and over the stage
        assert 0 < metrics[f"host_load_peak_rss_mb_{rank}"] <= metrics[f"host_peak_rss_mb_{rank}"]
    assert not list(batch["folder"].glob(f".{double.name}*"))  # rank 1 wrote no temporary


def test_fsdp_with_a_kl_reference_trains_the_weights_of_one_process(batch, tiny_policy, tmp_path):
    """update.kl_coef > 0: every rank holds the whole KL reference (the run's initial policy), read from disk
    even where only rank 0 reads the policy being trained (transformers would give the other ranks zeros
    under fsdp_cpu_ram_efficient_loading). FSDP on 2 ranks = one process."""
    document = yaml.safe_load(batch["config"].read_text())
    document["update"] = {**document["update"], "kl_coef": 0.5}
    (tmp_path / "kl.yaml").write_text(yaml.safe_dump(document))
    with_kl = {**batch, "config": tmp_path / "kl.yaml"}
    _update(with_kl, tiny_policy, tmp_path / "plain")
    launched = _launch_update(with_kl, tiny_policy, tmp_path / "fsdp", "cpu-fsdp-2proc")
    assert launched.returncode == 0, launched.stderr[-3000:]
    one, two = load_file(tmp_path / "plain" / "model.safetensors"), load_file(tmp_path / "fsdp" / "model.safetensors")
    assert _max_difference(one, two) < 1e-5  # 3.9e-3 when rank 1's reference was zeros
    for log in (pq.read_table(tmp_path / name / "update.parquet")["kl"].to_pylist() for name in ("plain", "fsdp")):
        assert log[0] == 0 < log[1]  # the second optimizer step starts away from the reference: the KL term acts


def _moments(policy: Path) -> dict:
    """{"PARAMETER::exp_avg": whole tensor, ...} of a checkpoint, from either form (one file or FSDP shards)."""
    from oarctl.checkpoints import read_optimizer_state

    shapes = {key: value.shape for key, value in load_file(policy / "model.safetensors").items()}
    state = read_optimizer_state(policy / STATE, shapes)
    return {f"{name}::{key}": value for name, entry in state.items() for key, value in entry.items() if value.dim()}


def _relative_difference(one: dict, two: dict) -> float:
    assert one.keys() == two.keys()
    return max(float((one[k] - two[k]).abs().max() / two[k].abs().max().clamp_min(1e-30)) for k in one)


def test_fsdp_ranks_write_their_adamw_shards_and_any_rank_count_continues_them(first_update, batch):
    """FSDP's two ranks each write their AdamW shard (hashed by the rank that wrote it). A second step
    continues it alike from one process, from two FSDP ranks, and (the other way) from two FSDP ranks
    starting from one process's state: every way gives the weights and moments of the plain run's
    second step. A fresh AdamW from the same weights lands elsewhere, so the match is the loaded
    state's doing. ~40-90 s."""
    (single, _), (sharded, _) = first_update(None), first_update("cpu-fsdp-2proc")
    shards = sorted(p.name for p in (sharded / STATE / "optimizer").iterdir())
    from oarctl.sharded_state import FILES_PER_RANK

    assert len(shards) == 2 * FILES_PER_RANK and not (sharded / STATE / "optimizer.safetensors").exists()
    assert {name.split("-")[1] for name in shards} == {"00001", "00002"}  # written by both ranks
    recorded = json.loads((sharded / STATE / "checkpoint.json").read_text())["files"]
    assert {f"optimizer/{name}" for name in shards} <= recorded.keys()
    manifest = json.loads((sharded.parent / f"{sharded.name}.manifest.json").read_text())["metrics"]
    assert manifest["optimizer_shard_bytes"] == sum((sharded / STATE / "optimizer" / n).stat().st_size for n in shards)
    assert _max_difference(_moments(sharded), _moments(single)) < 1e-6  # the shards hold the whole state

    folder = batch["folder"]
    weights_only = folder / "policy-fsdp-weights-only"  # FSDP's step-1 weights without the AdamW state
    shutil.copytree(sharded, weights_only, ignore=shutil.ignore_patterns(STATE, "checkpoint.json"))
    names = ("plain", "fsdp", "plain-after-fsdp", "fsdp-after-plain", "fresh")
    outputs = {name: folder / f"step2-{name}" for name in names}
    for policy, name in ((single, "plain"), (sharded, "plain-after-fsdp"), (weights_only, "fresh")):
        _update(batch, policy, outputs[name])
    for policy, name in ((sharded, "fsdp"), (single, "fsdp-after-plain")):
        started = time.perf_counter()
        launched = _launch_update(batch, policy, outputs[name], "cpu-fsdp-2proc")
        print(f"FSDP second update ({name}): {time.perf_counter() - started:.1f} s")
        assert launched.returncode == 0, launched.stderr[-3000:]
        assert "update: FullyShardedDataParallel over 2 ranks" in launched.stderr
        assert "fresh optimizer" not in launched.stderr

    weights = {name: load_file(path / "model.safetensors") for name, path in outputs.items()}
    resumed = ("fsdp", "plain-after-fsdp", "fsdp-after-plain")
    differences = {name: (_relative_difference(weights[name], weights["plain"]),
                          _max_difference(weights[name], weights["plain"]),
                          _max_difference(_moments(outputs[name]), _moments(outputs["plain"]))) for name in resumed}
    fresh = _max_difference(weights["plain"], weights["fresh"])
    print("step 2 vs the plain run (weights: max relative, max absolute difference; moments: max absolute):", differences,
          f"fresh AdamW weights {fresh:.3e}")
    assert all(absolute < 1e-6 and m < 1e-6 for _, absolute, m in differences.values())
    assert fresh > 100 * max(_max_difference(weights["plain"], weights[name]) for name in resumed)
    for name in resumed:
        steps = json.loads((outputs[name] / STATE / "optimizer.json").read_text())
        assert steps == json.loads((outputs["plain"] / STATE / "optimizer.json").read_text())
    assert set(steps.values()) == {4.0}  # 2 optimizer steps per update, counted on from the checkpoint's


def test_a_bfloat16_checkpoint_continues_from_its_fp32_weights(first_update, batch, tiny_policy, tmp_path):
    """update.save_dtype bfloat16: model.safetensors (what engines, attribute and users read) is 16-bit,
    the fp32 weights are kept beside the AdamW state (master.safetensors; in the shards under FSDP), and
    the next step trains on from them: one process exactly as from an fp32 checkpoint, FSDP (either
    way) within 1e-6. ~60-90 s: two launches."""
    document = yaml.safe_load(batch["config"].read_text())
    document["update"] = {**document["update"], "save_dtype": "bfloat16"}
    (tmp_path / "config16.yaml").write_text(yaml.safe_dump(document))
    half = {**batch, "config": tmp_path / "config16.yaml"}
    (single, _), outputs = first_update(None), {name: tmp_path / name for name in ("one", "two", "fsdp1", "after", "fsdp2")}
    _update(half, tiny_policy, outputs["one"])
    _update(half, outputs["one"], outputs["two"])
    reference = tmp_path / "two-fp32"
    _update(batch, single, reference)  # the fp32 chain: step 1 = `single`, then step 2

    weights, master = load_file(outputs["one"] / "model.safetensors"), load_file(outputs["one"] / STATE / "master.safetensors")
    assert {t.dtype for t in weights.values()} == {torch.bfloat16} and {t.dtype for t in master.values()} == {torch.float32}
    assert json.loads((outputs["one"] / "config.json").read_text())["dtype"] == "bfloat16"
    fp32 = load_file(single / "model.safetensors")
    assert master.keys() == fp32.keys() and all(torch.equal(master[name], fp32[name]) for name in master)
    continued, expected = load_file(outputs["two"] / STATE / "master.safetensors"), load_file(reference / "model.safetensors")
    assert continued.keys() == expected.keys()
    assert all(torch.equal(continued[name], expected[name]) for name in continued)
    assert _max_difference(_moments(outputs["two"]), _moments(reference)) == 0.0

    for policy, name in ((tiny_policy, "fsdp1"), (outputs["fsdp1"], "fsdp2")):
        launched = _launch_update(half, policy, outputs[name], "cpu-fsdp-2proc")
        assert launched.returncode == 0, launched.stderr[-3000:]
        if name == "fsdp1":
            assert not (outputs[name] / STATE / "master.safetensors").exists()  # in the ranks' shards
            _update(half, outputs[name], outputs["after"])
    ends = {name: load_file(outputs[name] / STATE / "master.safetensors") for name in ("after",)}
    ends["fsdp2"] = _fsdp_master(outputs["fsdp2"])
    for name, end in ends.items():
        assert end.keys() == expected.keys()
        difference = max(float((end[k] - expected[k]).abs().max()) for k in expected)
        print(f"bf16 checkpoints, {name} vs the fp32 chain: max |w| difference {difference:.3e}")
        assert end.keys() == continued.keys() and difference < 1e-6


def test_fsdp_ranks_write_the_weight_files_in_turn(batch, tiny_policy, tmp_path):
    """update.weight_file_mb 0.03 cuts the tiny policy's bf16 weights into several files: file i is
    written (and hashed) by rank i mod 2, so a rank that wrote nothing leaves files missing. Every file
    and the index are in checkpoint.json, the manifest counts their bytes, and transformers loads the
    checkpoint through the index to the weights one plain process saves (within one bf16 rounding).
    The next update's ranks verify what they read shared out, each file hashed by one rank."""
    from oarctl.checkpoints import WEIGHTS_INDEX, load_policy

    document = yaml.safe_load(batch["config"].read_text())
    document["update"] = {**document["update"], "save_dtype": "bfloat16", "weight_file_mb": 0.03}
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(document))
    small = {**batch, "config": tmp_path / "config.yaml"}
    launched = _launch_update(small, tiny_policy, tmp_path / "fsdp", "cpu-fsdp-2proc")
    assert launched.returncode == 0, launched.stderr[-3000:]
    _update(small, tiny_policy, tmp_path / "plain")

    files = sorted(p.name for p in (tmp_path / "fsdp").glob("model-*.safetensors"))
    index = json.loads((tmp_path / "fsdp" / WEIGHTS_INDEX).read_text())
    assert len(files) >= 2 and sorted(set(index["weight_map"].values())) == files  # both ranks wrote
    recorded = json.loads((tmp_path / "fsdp" / "checkpoint.json").read_text())["files"]
    assert {*files, WEIGHTS_INDEX} <= recorded.keys()
    manifest = json.loads((tmp_path / "fsdp.manifest.json").read_text())["metrics"]
    assert manifest["weight_file_bytes"] == sum((tmp_path / "fsdp" / name).stat().st_size for name in files)
    assert json.loads((tmp_path / "fsdp" / "config.json").read_text())["dtype"] == "bfloat16"
    written = load_policy(tmp_path / "fsdp", dtype="bfloat16")[0].state_dict()
    expected = load_policy(tmp_path / "plain", dtype="bfloat16")[0].state_dict()
    assert written.keys() == expected.keys() and {t.dtype for t in written.values()} == {torch.bfloat16}
    for name, tensor in expected.items():
        torch.testing.assert_close(written[name].float(), tensor.float(), rtol=8e-3, atol=1e-6)

    # the next update's ranks share the hashing out, beside their work: rank 0 (whose I/O the manifest
    # holds) verifies every other file of what all ranks read followed by the AdamW state
    from oarctl.checkpoints import loaded_files
    from oarctl.sharded_state import shard_files

    launched = _launch_update(small, tmp_path / "fsdp", tmp_path / "next", "cpu-fsdp-2proc")
    assert launched.returncode == 0, launched.stderr[-3000:]
    read, state = loaded_files(tmp_path / "fsdp"), [*shard_files(tmp_path / "fsdp" / STATE), "optimizer.json"]
    read, state = [tmp_path / "fsdp" / name for name in read], [tmp_path / "fsdp" / STATE / name for name in state]
    size = lambda paths: sum(path.stat().st_size for path in paths)  # noqa: E731
    verified = json.loads((tmp_path / "next.manifest.json").read_text())["metrics"]["checkpoint_bytes_verified"]
    metrics = json.loads((tmp_path / "next.manifest.json").read_text())["metrics"]
    assert verified == size([*read, *state][0::2]) < 0.6 * size(read + state)
    assert metrics["checkpoint_verify_waited_seconds"] <= metrics["checkpoint_verify_seconds"] + 0.1  # beside the work


def _fsdp_master(policy: Path) -> dict:
    """The fp32 weights FSDP's ranks wrote in their shards, read whole."""
    from oarctl.checkpoints import _read_master

    shapes = {key: value.shape for key, value in load_file(policy / "model.safetensors").items()}
    return _read_master(policy / STATE, shapes)


# ---- token-budget micro-batches ------------------------------------------------------------------

def _rows(widths: list[tuple[int, int]]) -> list[dict]:
    return [{"prompt_token_ids": [1] * p, "response_token_ids": [2] * r} for p, r in widths]


def test_token_budget_packs_every_row_once_within_the_budget():
    rows = _rows([(3, 5), (3, 1), (4, 9), (2, 2), (3, 3), (5, 10), (1, 1)])
    widths = [len(r["prompt_token_ids"]) + len(r["response_token_ids"]) for r in rows]
    groups = token_budget(list(range(len(rows))), widths, budget=20)
    assert sorted(i for group in groups for i in group) == list(range(len(rows)))
    assert all(len(group) * max(widths[i] for i in group) <= 20 for group in groups)
    assert groups == [[5], [2], [0, 4], [1, 3, 6]]  # widths 15, 13, 8+6, 4+4+2: longest first, ties by position
    assert token_budget([0, 1], [30, 4], budget=20) == [[0], [1]]  # a row wider than the budget is alone


def test_loss_shares_sum_to_one_however_the_rows_are_cut():
    rows = _rows([(2, n) for n in (5, 1, 9, 2, 3)])
    for aggregation in ("seq-mean-token-mean", "token-mean", "seq-mean-token-sum-norm"):
        for groups in (fixed_size([0, 1, 2, 3, 4], 2), [[2, 0], [4], [3, 1]]):
            shares = [loss_share(rows, group, aggregation) for group in groups]
            assert sum(n for n, _ in shares) == shares[0][1]
    assert loss_share(rows, [0, 2], "token-mean") == (14, 20)
    assert loss_share(rows, [0, 2], "seq-mean-token-mean") == (2, 5)


def _gradient(model, rows, plan, config, pad_id: int) -> dict:
    model.zero_grad(set_to_none=True)
    for micro in plan:
        batch = {key: [rows[i][key] for i in micro.rows] for key in rows[0]}
        loss, _ = update.micro_batch_loss(model, None, batch, config, pad_id)
        (loss * micro.numerator / micro.denominator).backward()
    return {name: p.grad.clone() for name, p in model.named_parameters()}


@pytest.mark.parametrize("aggregation", ["seq-mean-token-mean", "token-mean", "seq-mean-token-sum-norm"])
def test_token_budget_micro_batches_give_the_gradient_of_fixed_ones(batch, tiny_policy, aggregation):
    from oarctl.checkpoints import load_policy

    rows = read_artifact(batch["advantages"], "advantages").select(update.COLUMNS).to_pylist()
    model, tokenizer = load_policy(tiny_policy)
    model.train()
    widest = max(len(r["prompt_token_ids"]) + len(r["response_token_ids"]) for r in rows)
    overrides = [f"update.loss_aggregation={aggregation}"]
    whole = load_config(None, overrides + ["update.mini_batch_size=16", "update.micro_batch_size=16"]).update
    packed = load_config(None, overrides + [f"update.micro_batch_tokens={3 * widest}"]).update
    fixed = load_config(None, overrides + ["update.micro_batch_size=5"]).update
    # one forward over all rows
    reference = _gradient(model, rows, plan_step(rows, whole), whole, tokenizer.pad_token_id)
    plan = plan_step(rows, packed)
    assert len(plan) > 3 and sorted(i for micro in plan for i in micro.rows) == list(range(len(rows)))
    for config, micro_plan in ((packed, plan), (fixed, plan_step(rows, fixed))):
        gradient = _gradient(model, rows, micro_plan, config, tokenizer.pad_token_id)
        for name, value in reference.items():
            torch.testing.assert_close(gradient[name], value, atol=1e-6, rtol=1e-5)


# ---- config, launcher files, rank 0 writes -------------------------------------------------------

@pytest.mark.parametrize("override, option", [("update.micro_batch_tokens=-1", "update.micro_batch_tokens"),
                                              ("update.bf16=3", "update.bf16"),
                                              ("update.gradient_checkpointing=maybe", "update.gradient_checkpointing")])
def test_scale_options_are_validated(override, option):
    from oarctl.errors import OarError

    with pytest.raises(OarError, match=option.replace(".", r"\.")):
        load_config(None, [override])


@pytest.mark.parametrize("name, kind", [("ddp", "MULTI_GPU"), ("fsdp", "FSDP"), ("deepspeed_zero3", "DEEPSPEED"),
                                        ("cpu-2proc", "MULTI_GPU"), ("cpu-fsdp-2proc", "FSDP")])
def test_accelerate_configs_load_and_say_how_to_run_them(name, kind):
    from accelerate.commands.config.config_args import load_config_from_file

    path = ROOT / "configs" / "accelerate" / f"{name}.yaml"
    config = load_config_from_file(str(path))
    assert config.distributed_type == kind
    assert f"--config_file configs/accelerate/{name}.yaml -m oarctl.cli update" in path.read_text()
    if kind == "FSDP":
        assert config.fsdp_config["fsdp_transformer_layer_cls_to_wrap"] == "Qwen2DecoderLayer"
        assert config.fsdp_config["fsdp_sharding_strategy"] == "FULL_SHARD"
    if kind == "DEEPSPEED":
        assert config.deepspeed_config["zero_stage"] == 3 and config.mixed_precision == "bf16"


@pytest.mark.parametrize("damage, message", [
    ("tensors", "cannot read the optimizer state"), ("json", "is not a mapping of names to numbers"),
    ("name", "not a parameter of this policy"), ("shape", "has shape")])
def test_a_bad_optimizer_state_is_refused_in_one_line(first_update, batch, tmp_path, damage, message):
    """Read by every strategy (FSDP on rank 0, then told to all ranks) before any training."""
    from safetensors.torch import save_file
    from typer.testing import CliRunner

    from oarctl.cli import app

    policy = tmp_path / "policy"
    shutil.copytree(first_update(None)[0], policy)
    state = policy / STATE
    tensors = load_file(state / "optimizer.safetensors")
    if damage == "tensors":
        (state / "optimizer.safetensors").write_bytes(b"not safetensors")
    elif damage == "json":
        (state / "optimizer.json").write_text('{"model.norm.weight::step": "two"}')
    else:
        key = "model.norm.weight::exp_avg"
        changed = tensors.pop(key)
        tensors["model.other.weight::exp_avg" if damage == "name" else key] = torch.cat([changed, changed])
        save_file(tensors, state / "optimizer.safetensors")
    seal(state)  # recorded as written: the content itself is refused
    result = CliRunner().invoke(app, ["update", str(batch["advantages"]), "-o", str(tmp_path / "out"),
                                      "--policy", str(policy), "-c", str(batch["config"])])
    assert result.exit_code != 0 and message in result.output
    assert "Traceback" not in result.output


@pytest.mark.parametrize("damage, launcher", [("modified", None), ("missing", None), ("modified", "cpu-fsdp-2proc"),
                                              ("step counts", "cpu-fsdp-2proc")])
def test_a_damaged_adamw_shard_is_refused_in_one_line(first_update, batch, tmp_path, damage, launcher):
    """The shards are verified against checkpoint.json before any training, by one process or shared out
    over FSDP's ranks (the rank that finds it tells the others); so are optimizer.json's step counts."""
    from typer.testing import CliRunner

    from oarctl.cli import app

    policy = tmp_path / "policy"
    shutil.copytree(first_update("cpu-fsdp-2proc")[0], policy)
    shard = sorted((policy / STATE / "optimizer").iterdir())[-1]  # one of rank 1's
    if damage == "step counts":  # still valid: {"PARAMETER::step": number}, one step later
        shard = policy / STATE / "optimizer.json"
        shard.write_text(json.dumps({name: step + 1 for name, step in json.loads(shard.read_text()).items()}))
    elif damage == "modified":
        data = bytearray(shard.read_bytes())
        data[-1] ^= 1
        shard.write_bytes(bytes(data))
    else:
        shard.unlink()
    message = "is missing" if damage == "missing" else "does not match its recorded hash"
    if launcher is None:
        result = CliRunner().invoke(app, ["update", str(batch["advantages"]), "-o", str(tmp_path / "out"),
                                          "--policy", str(policy), "-c", str(batch["config"])])
        output, code = result.output, result.exit_code
    else:
        launched = _launch_update(batch, policy, tmp_path / "out", launcher)
        output, code = launched.stdout + launched.stderr, launched.returncode
    assert code != 0 and message in output and shard.name in output
    assert "Traceback" not in output if launcher is None else "oarctl/stages" not in output  # the launcher's own
    assert not (tmp_path / "out").exists()


def test_a_rank_other_than_zero_writes_nothing(batch, tiny_policy, tmp_path, monkeypatch):
    from oarctl.pipeline import run_stage

    monkeypatch.setenv("RANK", "1")  # without WORLD_SIZE the stage itself runs as one plain process
    output = tmp_path / "policy"
    manifest, ran = run_stage("update", load_config(batch["config"]), {"advantages": batch["advantages"]}, output,
                              policy_path=tiny_policy, log=lambda *a: None)
    assert ran and manifest["metrics"]["tokens"] > 0
    assert list(tmp_path.iterdir()) == []
