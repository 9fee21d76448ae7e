"""`oarctl gradient-check`: the bench's gradients, its statistics, its bytes and its command line.

The handmade case: the reward depends on a response's first token only. Later tokens are sampled after
it, so their gradient terms have expectation 0 given the reward (pure noise): credit that shrinks them
must give a batch gradient closer to the policy gradient, and credit that shrinks the first token instead
must give one further from it. Sampled here from the tiny untrained policy (high entropy everywhere).
"""
from __future__ import annotations

import io
import json
import math

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from oarctl.advantages import grpo
from oarctl.checkpoints import load_policy
from oarctl.config import load_config
from oarctl.gradient_check import MEASURED_COLUMNS, gradients, summary
from oarctl.gradient_check.credit import dense_groups, prompt_batches

PROMPTS, GROUP, LENGTH, BATCH_PROMPTS = 64, 4, 6, 4


@torch.no_grad()
def sampled_pool(model, seed: int = 0) -> pa.Table:
    """PROMPTS x GROUP responses of LENGTH tokens sampled from `model` (all rows at once), with their
    log-probs; the reward is 1 when the first response token is below the median token id."""
    generator = torch.Generator().manual_seed(seed)
    prompts = [[1 + p % 40, 2 + p // 40, 3] for p in range(PROMPTS) for _ in range(GROUP)]
    ids, logprobs = torch.tensor(prompts), []
    for _ in range(LENGTH):
        distribution = torch.log_softmax(model(input_ids=ids).logits[:, -1].double(), -1)  # (N, V)
        tokens = torch.multinomial(distribution.exp(), 1, generator=generator)  # (N, 1)
        logprobs.append(distribution.gather(1, tokens))
        ids = torch.cat([ids, tokens], dim=1)
    responses = ids[:, 3:].tolist()
    return pa.table({"prompt_id": [f"p{i // GROUP}" for i in range(len(prompts))], "prompt_token_ids": prompts,
                     "response_token_ids": responses, "response_logprobs": torch.cat(logprobs, 1).tolist(),
                     "temperature": [1.0] * len(prompts),
                     "reward": [float(r[0] < model.config.vocab_size // 2) for r in responses]})


def credit(table: pa.Table, first: float, rest: float) -> list[list[float]]:
    """GRPO advantages with weight `first` on the first response token and `rest` on the others."""
    rewards = np.array(table["reward"].to_pylist())
    advantages = grpo(rewards, dense_groups(table["prompt_id"].to_pylist()), scale="group")
    return [[float(a) * first] + [float(a) * rest] * (LENGTH - 1) for a in advantages]


@pytest.fixture(scope="module")
def handmade(random_policy):
    model, tokenizer = load_policy(random_policy)
    table = sampled_pool(model)
    assert 0.3 < np.mean(table["reward"].to_pylist()) < 0.7  # mixed groups: the advantages are not all 0
    advantages = {"uniform": credit(table, 1.0, 1.0), "focused": credit(table, 1.0, 0.1),
                  "misplaced": credit(table, 0.1, 1.0)}
    halves = prompt_batches(table["prompt_id"].to_pylist(), BATCH_PROMPTS, 0, "pool")
    update = load_config(None, ["update.micro_batch_size=5"]).update  # micro-batches that cut groups
    return model, tokenizer, table, advantages, halves, update


def test_shrinking_the_tokens_the_reward_does_not_depend_on_raises_the_cosine(handmade):
    model, tokenizer, table, advantages, halves, update = handmade
    scores, sums, checks = gradients.measure(model, tokenizer.pad_token_id, update, table, advantages, halves,
                                             log=lambda _: None)
    columns = summary.summarise(scores, sums, list(advantages),
                                summary.reference_checks(scores, sums)["references_cosine"])
    row = {method: {name: values[i] for name, values in columns.items()} for i, method in enumerate(columns["method"])}
    assert row["uniform"]["batches"] == 2 * (PROMPTS // 2 // BATCH_PROMPTS)
    assert row["focused"]["vs_uniform_low"] > 0  # the interval of the paired difference is above 0
    assert row["misplaced"]["vs_uniform_high"] < 0
    assert row["focused"]["effective_batch"] > 1 > row["misplaced"]["effective_batch"]  # 0 if no signal at all
    assert row["uniform"]["vs_uniform"] == 0 and row["uniform"]["effective_batch"] == pytest.approx(1)
    # the split-half estimate (the reference's noise from cos(R_A, R_B)) orders them the same way
    assert row["focused"]["effective_batch_split"] > 1 > row["misplaced"]["effective_batch_split"]
    assert row["uniform"]["effective_batch_split"] == pytest.approx(1)
    assert row["focused"]["grad_sq_norm"] < row["uniform"]["grad_sq_norm"]  # less noise, the same expectation
    assert checks["ratio_mean"] == pytest.approx(1, abs=1e-4) and checks["clip_fraction"] == 0


def test_the_reference_on_its_own_half_has_cosine_one(handmade):
    """The reference (the mean of a half's uniform batch gradients) is the update's gradient of the whole half
    as one batch, micro-batched otherwise: the two point the same way, with the same length."""
    model, tokenizer, table, advantages, halves, update = handmade
    base = table.select(list(gradients.COLUMNS)).to_pylist()
    bench = gradients.Bench(model, tokenizer.pad_token_id, update)
    gradients._reference_of(bench, base, advantages["uniform"], halves[0])
    whole_half = [row for batch in halves[0] for row in batch]
    grads, _ = bench.batch(gradients.batch_rows(base, advantages["uniform"], whole_half))
    reference = bench._views(bench.reference)
    dot, norm, reference_norm = (gradients._dot(grads, reference), gradients._dot(grads, grads),
                                 gradients._dot(reference, reference))
    assert norm > 0 and dot / math.sqrt(norm * reference_norm) == pytest.approx(1, abs=1e-6)
    assert norm == pytest.approx(reference_norm, rel=1e-5)
    other, _ = bench.batch(gradients.batch_rows(base, advantages["uniform"], halves[1][0]))
    assert gradients._dot(other, reference) / math.sqrt(gradients._dot(other, other) * reference_norm) < 0.99


def test_batches_are_whole_groups_disjoint_and_seeded(tmp_path):
    prompt_ids = [f"p{i // 3}" for i in range(3 * 21)]
    halves = prompt_batches(prompt_ids, 4, 7, tmp_path)
    rows = [row for half in halves for batch in half for row in batch]
    assert [len(half) for half in halves] == [2, 2] and len(rows) == len(set(rows)) == 3 * 16
    assert all({prompt_ids[r] for r in batch} and len(batch) == 12 for half in halves for batch in half)
    assert prompt_batches(prompt_ids, 4, 7, tmp_path) == halves != prompt_batches(prompt_ids, 4, 8, tmp_path)
    from oarctl.errors import OarError
    with pytest.raises(OarError, match="--batch-prompts"):
        prompt_batches(prompt_ids, 6, 7, tmp_path)  # 1 batch per half


@pytest.fixture(scope="module")
def pool(tmp_path_factory, tiny_policy, signal_data):
    """A verified pool of the tiny policy's own rollouts (8 prompts x 4), made as a user would."""
    import yaml
    from typer.testing import CliRunner

    from oarctl.cli import app

    folder = tmp_path_factory.mktemp("gradient_check")
    config = folder / "tiny.yaml"
    config.write_text(yaml.safe_dump({
        "run": {"progress": False}, "policy": {"path": str(tiny_policy)},
        "data": {"train": str(signal_data["train"]), "heldout": str(signal_data["heldout"])},
        "sample": {"prompts_per_step": 8, "group_size": 4, "max_new_tokens": 16},
        "update": {"micro_batch_size": 4}}))
    runner = CliRunner()
    for stage, source, target in (("sample", signal_data["train"], "rollouts"), ("verify", None, "verified")):
        source = source or folder / "rollouts.parquet"
        result = runner.invoke(app, [stage, str(source), "-o", str(folder / f"{target}.parquet"), "-c", str(config)])
        assert result.exit_code == 0, result.output
    return folder, config


def _check(cli, folder, config, output, *extra):
    return cli("gradient-check", folder / "verified.parquet", "-o", output, "-c", config,
               "--methods", "random,entropy", "--batch-prompts", "2", *extra)


def _seeded_bytes(path) -> bytes:
    buffer = io.BytesIO()
    pq.write_table(pq.read_table(path).drop_columns(list(MEASURED_COLUMNS)), buffer)
    return buffer.getvalue()


def test_the_command_writes_the_table_and_the_same_seed_gives_the_same_bytes(cli, pool):
    folder, config = pool
    first, second = folder / "a" / "check.parquet", folder / "b" / "check.parquet"
    result = _check(cli, folder, config, first)
    assert result.exit_code == 0, result.output
    assert "| uniform |" in result.stdout and "| entropy |" in result.stdout
    table = pq.read_table(first).to_pylist()
    assert [row["method"] for row in table] == ["uniform", "random", "entropy"]
    assert all(row["cosine_low"] <= row["cosine"] <= row["cosine_high"] and -1 <= row["cosine"] <= 1 for row in table)
    assert all(row["batches"] == 4 and row["grad_sq_norm"] > 0 for row in table)
    sampling = [row["cost_vs_sampling"] for row in table]
    assert all(c >= 0 for c in sampling)  # sampling timed here: 8 prompts (all the pool has) x 4, scaled x 1
    assert first.with_suffix(".png").stat().st_size > 0
    assert "timed here: 8 prompts x 4 sampled again in " in first.with_suffix(".md").read_text()
    assert "x 32/32 rows of the pool" in first.with_suffix(".md").read_text()
    assert _check(cli, folder, config, second).exit_code == 0
    assert _seeded_bytes(first) == _seeded_bytes(second)
    assert first.with_suffix(".png").read_bytes() == second.with_suffix(".png").read_bytes()
    third = folder / "c" / "check.parquet"
    assert _check(cli, folder, config, third, "--set", "run.seed=1").exit_code == 0
    assert _seeded_bytes(third) != _seeded_bytes(first)  # another seed deals other batches


@pytest.mark.parametrize("extra, message", [
    (["--methods", "uniform,nope"], "--methods"),
    (["--batch-prompts", "0"], "--batch-prompts"),
    (["--batch-prompts", "3"], "--batch-prompts"),  # 8 prompts: 1 batch of 3 per half
    (["--sample-seconds", "-1"], "--sample-seconds"),
    (["--time-sampling", "-1"], "--time-sampling"),
])
def test_bad_options_are_one_line_errors(cli, pool, tmp_path, extra, message):
    folder, config = pool
    result = cli("gradient-check", folder / "verified.parquet", "-o", tmp_path / "out.parquet", "-c", config,
                 "--batch-prompts", "2", *extra)
    assert result.exit_code == 2, result.output
    assert result.stderr.startswith("error: ") and message in result.stderr and "Traceback" not in result.output
    assert not (tmp_path / "out.parquet").exists()


def test_sampling_timed_here_or_read_from_the_pools_manifest(cli, pool, tmp_path):
    """--time-sampling N samples N prompts again and scales to the pool; 0 takes the pool's sample manifest."""
    folder, config = pool
    output = tmp_path / "out.parquet"
    args = ["gradient-check", folder / "verified.parquet", "-o", output, "-c", config, "--methods", "random",
            "--batch-prompts", "2"]
    assert cli(*args, "--time-sampling", "2").exit_code == 0
    assert "timed here: 2 prompts x 4 sampled again in " in output.with_suffix(".md").read_text()
    assert "x 32/8 rows of the pool" in output.with_suffix(".md").read_text()
    assert cli(*args, "--time-sampling", "0").exit_code == 0
    manifest = json.loads((folder / "rollouts.parquet.manifest.json").read_text())
    assert f"- sampling: {manifest['wall_seconds']:.1f} s ({folder / 'rollouts.parquet'}'s sample manifest)" in \
        output.with_suffix(".md").read_text()


def test_a_pool_without_its_sample_manifest_has_no_cost_unless_given(cli, pool, tmp_path):
    folder, config = pool
    alone = tmp_path / "verified.parquet"
    alone.write_bytes((folder / "verified.parquet").read_bytes())
    output = tmp_path / "out.parquet"
    args = ["gradient-check", alone, "-o", output, "-c", config, "--methods", "random", "--batch-prompts", "2",
            "--time-sampling", "0"]
    assert cli(*args).exit_code == 0
    rows = pq.read_table(output).to_pylist()
    assert all(math.isnan(r["cost_vs_sampling"]) and r["pays"] is None for r in rows)
    assert "give --sample-seconds" in output.with_suffix(".md").read_text()
    assert cli(*args, "--sample-seconds", "10").exit_code == 0
    rows = pq.read_table(output).to_pylist()
    assert [r["cost_vs_sampling"] for r in rows] == pytest.approx([r["seconds"] / 10 for r in rows])


@pytest.mark.parametrize("method", ["entropy_mask", "ktae", "entropy"])
def test_each_method_is_reshaped_by_its_own_rule_as_the_reshape_stage_does(pool, method):
    """The bench's token advantages are the credit rule's: TRL's mask keeps A_i on some tokens and 0 on
    the others, KTAE adds its key values to A_i, entropy goes through Bi-Level (never exactly 0 there)."""
    from pathlib import Path

    from oarctl.artifacts import read_artifact
    from oarctl.attribution.base import segment_rows
    from oarctl.contract import Policy, StageContext
    from oarctl.credit_rules import token_credit
    from oarctl.gradient_check.credit import pool_advantages, token_scores

    folder, config_path = pool
    config = load_config(config_path)
    table = read_artifact(folder / "verified.parquet", "verified")
    policy = Policy(Path(config.policy.path), config.policy.device)
    rollouts = segment_rows(table, policy.load()[1])
    context = StageContext(seed=0, step=0, policy=policy, progress=False)
    per_token, _ = pool_advantages(method, table, rollouts, config, context)
    rewards = np.asarray(table["reward"].to_pylist())
    advantages = grpo(rewards, dense_groups(table["prompt_id"].to_pylist()), scale="group")
    scores = token_scores(method, table, rollouts, config.attribute, context)
    spans = [r.segments.reasoning for r in rollouts]
    _, expected = token_credit(method, list(zip(scores, spans)), advantages, config.reshape)
    assert all(np.allclose(a, e) for a, e in zip(per_token, expected))
    mixed = [(np.asarray(t), a) for t, a in zip(per_token, advantages) if a != 0]
    assert mixed  # the pool has groups whose rewards differ
    zeroed = sum(int(np.sum(t == 0)) for t, _ in mixed)
    if method == "entropy_mask":
        assert zeroed > 0 and all(np.all((t == 0) | np.isclose(t, a)) for t, a in mixed)
    elif method == "entropy":
        assert zeroed == 0


def test_a_vllm_pool_takes_its_sampling_seconds_from_its_manifest(cli, pool, tmp_path):
    """Re-timing 32 prompts with vLLM would mostly time the engine's start: the manifest's seconds are used."""
    folder, config = pool
    output = tmp_path / "out.parquet"
    result = cli("gradient-check", folder / "verified.parquet", "-o", output, "-c", config, "--methods", "random",
                 "--batch-prompts", "2", "--set", "policy.backend=vllm")
    assert result.exit_code == 0, result.output
    assert "'s sample manifest)" in output.with_suffix(".md").read_text()
    assert "timed here" not in output.with_suffix(".md").read_text()
