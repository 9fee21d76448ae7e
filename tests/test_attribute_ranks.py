"""The attribute stage on every rank: rows dealt to ranks by token count (whole groups), 2 CPU ranks under
`accelerate launch` (gloo) writing the scores of one process, skip_uniform_groups, and `oarctl run`
launching each step's attribute stage (attribute.accelerate_config), killed and resumed."""
from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml
from conftest import hidden_temporaries, oarctl_executable, sha256

from oarctl.distributed import deal

ROOT = Path(__file__).resolve().parents[1]
TWO_CPU_RANKS = ROOT / "configs" / "accelerate" / "cpu-2proc.yaml"
METHODS = ("oar_g", "oar_p", "oar_flow", "oar_flow_local")


# ---- dealing rows to ranks -----------------------------------------------------------------------

def test_deal_keeps_groups_whole_and_balances_tokens():
    # groups a: 10 + 10 = 20, b: 7 + 8 = 15, c: 12, d: 6 + 6 = 12, e: 3
    groups = ["a", "a", "b", "b", "c", "d", "d", "e"]
    weights = [10, 10, 7, 8, 12, 6, 6, 3]
    # by descending total, each to the least-loaded rank: a(20) -> 0, b(15) -> 1, c(12) -> 1 (15 < 20),
    # d(12) -> 0 (20 < 27), e(3) -> 1 (27 < 32): loads 32 and 30
    assert deal(groups, weights, 2) == [[0, 1, 5, 6], [2, 3, 4, 7]]
    assert deal(groups, weights, 3) == [[0, 1], [2, 3, 7], [4, 5, 6]]  # a | b, e | c, d: loads 20, 18, 24
    assert deal(groups, weights, 1) == [list(range(8))]


def test_deal_is_deterministic_and_ties_go_by_order():
    groups = [f"g{i // 2}" for i in range(12)]
    weights = [5] * 12  # six equal groups
    dealt = deal(groups, weights, 3)
    assert dealt == deal(groups, weights, 3)
    assert dealt == [[0, 1, 6, 7], [2, 3, 8, 9], [4, 5, 10, 11]]  # first-met group to the lowest rank
    assert deal(groups[:2], weights[:2], 3) == [[0, 1], [], []]  # fewer groups than ranks: idle ranks


def test_deal_never_splits_a_group_and_deals_every_row_once():
    rng = np.random.default_rng(0)
    groups = [f"p{g}" for g in rng.integers(0, 9, size=40)]
    weights = rng.integers(1, 50, size=40).tolist()
    dealt = deal(groups, weights, 4)
    assert sorted(i for part in dealt for i in part) == list(range(40))
    owners = {}
    for rank, part in enumerate(dealt):
        for i in part:
            assert owners.setdefault(groups[i], rank) == rank
    totals = {g: sum(w for h, w in zip(groups, weights) if h == g) for g in set(groups)}
    loads = [sum(weights[i] for i in part) for part in dealt]
    assert max(loads) - min(loads) <= max(totals.values())  # greedy bound: within one group of even


# ---- 2 CPU ranks write the scores of one process -------------------------------------------------

@pytest.fixture(scope="module")
def verified(tmp_path_factory) -> dict[str, Path]:
    """A 16-row verified file made by the real stage commands with the embedded toy policy (4 prompts x 4
    samples, up to 40 new tokens: responses of 3-36 tokens with reasoning, some groups mixed, some
    uniform, two prompts of one length, so OAR-G batches rows of two groups together); and its config."""
    from typer.testing import CliRunner

    from oarctl.cli import app

    folder = tmp_path_factory.mktemp("attribute_ranks")
    config = folder / "config.yaml"
    config.write_text(yaml.safe_dump({
        "run": {"progress": False}, "data": {"toy_train_size": 32, "toy_heldout_size": 8},
        "sample": {"prompts_per_step": 4, "group_size": 4, "max_new_tokens": 40},
        "attribute": {"batch_size": 3, "chunk_size": 4}}))  # OAR-G batches of 3: a group of 4 spans two
    commands = [["toy", "prompts", "-o", str(folder / "prompts.parquet"), "-n", "32"],
                ["sample", str(folder / "prompts.parquet"), "-o", str(folder / "rollouts.parquet"), "--step", "5"],
                ["verify", str(folder / "rollouts.parquet"), "-o", str(folder / "verified.parquet")]]
    for command in commands:
        result = CliRunner().invoke(app, command + ([] if command[0] == "toy" else ["-c", str(config)]))
        assert result.exit_code == 0, result.output
    return {"verified": folder / "verified.parquet", "config": config, "folder": folder}


def _free_port() -> int:
    with socket.socket() as handle:
        handle.bind(("127.0.0.1", 0))
        return handle.getsockname()[1]


def _attribute(verified: dict, output: Path, method: str, *extra: str, ranks: int = 1):
    """The attribute command on the fixture's file: in this process, or under accelerate launch on 2 CPU ranks."""
    arguments = ["attribute", str(verified["verified"]), "-o", str(output), "--method", method,
                 "-c", str(verified["config"]), *extra]
    if ranks == 1:
        from typer.testing import CliRunner

        from oarctl.cli import app

        result = CliRunner().invoke(app, arguments)
        assert result.exit_code == 0, result.output
        return result
    launcher = Path(sys.executable).parent / "accelerate"
    result = subprocess.run([str(launcher), "launch", "--config_file", str(TWO_CPU_RANKS), "--main_process_port",
                             str(_free_port()), "-m", "oarctl.cli", *arguments],
                            capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert result.returncode == 0, result.stderr[-3000:]
    return result


def _scores(path: Path) -> list[np.ndarray]:
    return [np.array(s, dtype=np.float64) for s in pq.read_table(path)["token_scores"].to_pylist()]


def _metrics(path: Path) -> dict:
    return json.loads(path.with_name(path.name + ".manifest.json").read_text())["metrics"]


def _relative_difference(one: list[np.ndarray], two: list[np.ndarray]) -> float:
    """Largest |a - b| over each row's largest |a|, over rows; NaN where and only where both are NaN."""
    worst = 0.0
    for a, b in zip(one, two, strict=True):
        assert np.array_equal(np.isnan(a), np.isnan(b))
        finite = ~np.isnan(a)
        if finite.any() and np.abs(a[finite]).max() > 0:
            worst = max(worst, float(np.abs(a[finite] - b[finite]).max() / np.abs(a[finite]).max()))
    return worst


def _scored_per_rank(verified: dict, method: str, ranks: int = 2) -> list[np.ndarray]:
    """What `ranks` ranks compute, in this process: the method called on each rank's dealt rows."""
    from oarctl.attribution import ATTRIBUTION_METHODS
    from oarctl.attribution.base import segment_rows
    from oarctl.config import load_config
    from oarctl.contract import Policy, StageContext
    from oarctl.policy.paths import resolve_policy_path
    from oarctl.stages.attribute import rows_of_rank

    config = load_config(verified["config"], [f"attribute.method={method}"])
    table = pq.read_table(verified["verified"])
    context = StageContext(seed=config.run.seed, step=0, policy=Policy(resolve_policy_path(config.policy.path)))
    rollouts = segment_rows(table, context.policy.load_tokenizer())
    scores = {}
    for rank in range(ranks):
        rows = rows_of_rank(table, list(range(table.num_rows)), ranks, rank)
        part = ATTRIBUTION_METHODS.get(method)([rollouts[i] for i in rows], table.take(rows), config.attribute, context)
        scores.update(zip(rows, part))
    return [scores[i].astype(np.float64) for i in range(table.num_rows)]


@pytest.mark.parametrize("method", METHODS)
def test_two_ranks_write_the_scores_of_one_process(verified, method):
    """~20-45 s each: the launcher and two ranks import torch."""
    one, two = verified["folder"] / f"{method}-1.parquet", verified["folder"] / f"{method}-2.parquet"
    _attribute(verified, one, method)
    launched = _attribute(verified, two, method, ranks=2)
    assert launched.stdout.count(f"attribute: wrote {two}") == 2  # both ranks ran the stage
    table_one, table_two = pq.read_table(one), pq.read_table(two)
    assert table_one.schema == table_two.schema
    assert table_one.drop(["token_scores"]).equals(table_two.drop(["token_scores"]))  # same rows, same order
    assert not list(verified["folder"].glob(f".{two.name}*"))  # rank 1 wrote no temporary
    difference = _relative_difference(_scores(one), _scores(two))
    same_bytes = sha256(one) == sha256(two)
    print(f"{method}: 1 vs 2 ranks, max relative difference {difference:.3e}, identical bytes: {same_bytes}")
    # the launch adds nothing of its own: each rank's scores are, bit for bit, those of the method called
    # in one process on that rank's rows
    assert _relative_difference(_scores(two), _scored_per_rank(verified, method)) == 0.0
    # OAR-P and the oar_flows score each row on its own (its clean pass and perturbation chunks), and OAR-G batches only
    # rows of one prompt (oar._prefix_batches), whose group is never split over ranks: every row meets
    # the same batch, padding and kernels as in one process, so the bytes are those of one process.
    assert same_bytes and difference == 0.0
    if method.startswith("oar_flow"):  # its knobs are recorded beside the outcome_mode column
        manifest = json.loads(Path(f"{one}.manifest.json").read_text())
        assert manifest["metrics"]["flow_rule"] == "product"
        local = method == "oar_flow_local"  # its direct effect is OAR-G's, read within a horizon
        assert manifest["metrics"].get("flow_horizon") == (16 if local else None)
        assert set(table_one["outcome_mode"].to_pylist()) <= ({"answer_mean", "last"} if local else {"last"})


# ---- skip_uniform_groups -------------------------------------------------------------------------

def _groups(path: Path) -> dict[str, list[int]]:
    rows: dict[str, list[int]] = {}
    for row, prompt_id in enumerate(pq.read_table(path)["prompt_id"].to_pylist()):
        rows.setdefault(prompt_id, []).append(row)
    return rows


def test_skip_uniform_groups_scores_only_mixed_groups(verified):
    folder = verified["folder"]
    every, skipping = folder / "skip-off.parquet", folder / "skip-on.parquet"
    _attribute(verified, every, "oar_g")
    _attribute(verified, skipping, "oar_g", "--set", "attribute.skip_uniform_groups=true")
    rewards = pq.read_table(verified["verified"])["reward"].to_pylist()
    uniform = {p: len({rewards[i] for i in rows}) == 1 for p, rows in _groups(verified["verified"]).items()}
    assert 0 < sum(uniform.values()) < len(uniform)  # the fixture has both kinds
    all_scores, some_scores = _scores(every), _scores(skipping)
    scored = 0
    for prompt_id, rows in _groups(verified["verified"]).items():
        for row in rows:
            if uniform[prompt_id]:
                assert np.isnan(some_scores[row]).all() and not np.isnan(all_scores[row]).all()
            else:  # the uniform group has a prompt length of its own: the other OAR-G batches are unchanged
                np.testing.assert_array_equal(some_scores[row], all_scores[row])
                scored += 1
    assert _metrics(skipping)["scored_fraction"] == scored / len(rewards)
    assert _metrics(every)["scored_fraction"] == 1.0
    assert pq.read_table(every).drop(["token_scores"]).equals(pq.read_table(skipping).drop(["token_scores"]))


def test_skip_uniform_groups_with_no_mixed_group_scores_nothing(verified, tmp_path):
    table = pq.read_table(verified["verified"])
    rewards = pa.array([0.0] * table.num_rows, type=table.schema.field("reward").type)
    uniform = table.set_column(table.column_names.index("reward"), "reward", rewards)
    path = tmp_path / "verified.parquet"
    pq.write_table(uniform, path)
    _attribute({**verified, "verified": path}, tmp_path / "out.parquet", "oar_p",
                        "--set", "attribute.skip_uniform_groups=true")
    assert _metrics(tmp_path / "out.parquet")["scored_fraction"] == 0.0
    assert all(np.isnan(s).all() for s in _scores(tmp_path / "out.parquet"))


# ---- attribute.dtype -----------------------------------------------------------------------------

def test_the_stage_loads_the_policy_in_attribute_dtype(verified):
    """bfloat16 weights (half the memory of a replica per rank); the other stages keep float32."""
    import torch

    from oarctl.config import load_config
    from oarctl.pipeline import _stage_context

    config = load_config(verified["config"], ["attribute.dtype=bfloat16"])
    model, _ = _stage_context("attribute", config, 0, None).policy.load()
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    assert _stage_context("update", config, 0, None).policy.dtype == "float32"
    output = verified["folder"] / "bf16.parquet"
    _attribute(verified, output, "oar_g", "--set", "attribute.dtype=bfloat16")
    reasoning = [s[~np.isnan(s)] for s in _scores(output)]
    assert all(np.isfinite(s).all() for s in reasoning) and any((s > 0).any() for s in reasoning)
