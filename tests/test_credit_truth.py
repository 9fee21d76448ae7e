"""`truth` and `mc_value` attribution, the token_truth column through the artifacts, and fidelity
against the ground truth: hand-checked cases (CPU, seconds)."""
from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pyarrow.parquet as pq
import pytest

from oarctl.attribution import ATTRIBUTION_METHODS
from oarctl.attribution import mc_value as mc
from oarctl.attribution.base import segment_rows
from oarctl.attribution.ground_truth import label_scores
from oarctl.config import AttributeConfig
from oarctl.fidelity_truth import truth_columns
from oarctl.metrics import auc
from oarctl.toy import truth
from oarctl.toy.tokenizer import build_tokenizer

PROBLEM = "a=34, b=a+7, c=b-5, x=b+3, d=c+8, e=d-2. Find e."
RIGHT = "b=34+7=41. so c=41-5=36. then x=41+3=44. d=36+8=44. now e=44-2=42. \\boxed{42}"
WRONG = "b=34+7=41. c=41-5=35. d=35+8=43. e=43-2=41. \\boxed{41}"


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer()


def chains_columns(tokenizer, responses=(RIGHT, WRONG)) -> dict:
    from oarctl.stages.sample import prompt_token_ids

    ids = [tokenizer(text, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id] for text in responses]
    rows = len(responses)
    return {"prompt_id": ["p0"] * rows, "problem": [PROBLEM] * rows, "answer": ["42"] * rows,
            "sample_index": list(range(rows)), "prompt_token_ids": [prompt_token_ids(tokenizer, PROBLEM)] * rows,
            "response_token_ids": ids, "response_logprobs": [[-1.0] * len(r) for r in ids],
            "response_text": list(responses), "finish_reason": ["stop"] * rows, "temperature": [1.0] * rows,
            "token_truth": [truth.token_truth(PROBLEM, r, tokenizer) for r in ids]}


# ---- token_truth in the artifacts ------------------------------------------------------------------

def test_token_truth_is_optional_kept_downstream_and_checked(tokenizer, tmp_path):
    from oarctl.artifacts import extend_table, make_table, read_artifact, write_parquet
    from oarctl.errors import OarError

    columns = chains_columns(tokenizer)
    table = make_table(columns, "rollouts")
    assert str(table.schema.field("token_truth").type) == "list<item: int8>"
    assert "token_truth" not in make_table({**columns, "token_truth": None}, "rollouts").column_names
    extended = extend_table(table, {"attribution_method": ["x", "x"]}, "rollouts")
    assert extended["token_truth"].to_pylist() == columns["token_truth"]
    write_parquet(table, tmp_path / "ok.parquet")
    assert read_artifact(tmp_path / "ok.parquet", "rollouts")["token_truth"].to_pylist() == columns["token_truth"]
    bad = {**columns, "token_truth": [columns["token_truth"][0], [1, 0]]}
    write_parquet(make_table(bad, "rollouts"), tmp_path / "bad.parquet")
    with pytest.raises(OarError, match=r"row 1: column 'token_truth' has 2 values"):
        read_artifact(tmp_path / "bad.parquet", "rollouts")


# ---- truth -----------------------------------------------------------------------------------------

def test_label_scores_keep_unknown_tokens():
    assert label_scores([1, 0, -1, 0]).tolist() == [1.0, 0.0, 1.0, 0.0]


def test_truth_scores_are_the_labels_over_the_reasoning(tokenizer):
    import pyarrow as pa

    table = pa.table(chains_columns(tokenizer))
    rollouts = segment_rows(table, tokenizer)
    scores = ATTRIBUTION_METHODS.get("truth")(rollouts, table, AttributeConfig(), None)
    for row, (rollout, labels) in enumerate(zip(rollouts, table["token_truth"].to_pylist())):
        start, end = rollout.segments.reasoning
        assert np.isnan(scores[row][end:]).all() and start == 0
        assert scores[row][:end].tolist() == [float(label) for label in labels[:end]]
    right = table["response_text"][0].as_py()
    assert "".join("1" if s == 1 else "." for s in scores[0][:rollouts[0].segments.reasoning[1]]) == \
        "".join("1" if c else "." for c in truth.character_labels(
            truth.parse_problem(PROBLEM), right)[:right.index("\\boxed")])


def test_truth_without_labels_names_the_file(cli, tiny_config, tmp_path):
    from conftest import write_rollouts

    rollouts = write_rollouts(tmp_path / "rollouts.parquet", rows=2)
    config = tiny_config(verify={"method": "boxed"})
    assert cli("verify", rollouts, "-o", tmp_path / "verified.parquet", "-c", config).exit_code == 0
    result = cli("attribute", tmp_path / "verified.parquet", "-o", tmp_path / "a.parquet", "-c", config,
                 "--method", "truth")
    assert result.exit_code == 2
    assert "verified.parquet" in result.output and "token_truth" in result.output and "chains" in result.output


# ---- mc_value ------------------------------------------------------------------------------------------

def test_step_boundaries_cut_after_sentence_ends(tokenizer):
    text = "b=34+7=41. so c=41-5=36. \\boxed{36}"
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    decoded, offsets = mc.token_offsets(tokenizer, ids)
    reasoning_end = ids.index(tokenizer.convert_tokens_to_ids("\\boxed{"))
    assert mc.step_boundaries(decoded, offsets, (0, reasoning_end)) == [0, 10, 24, reasoning_end]
    assert mc.step_boundaries("a.b", [0, 1, 2, 3], (0, 3)) == [0, 3]  # no space after the dot: one step
    assert mc.step_boundaries("", [0], (0, 0)) == [0]


def test_boundary_values_and_credit_when_only_one_step_decides(tokenizer):
    """A fake policy whose continuations succeed iff the head already holds step 2 written right:
    V = 0 before step 2 is written and 1 after, so all credit lands on step 2."""
    response = list(range(100, 112))  # 12 tokens, steps [0,4) [4,8) [8,12)
    boundaries = [0, 4, 8, 12]
    calls = []

    def sample(prefixes, seed):
        calls.append((len(prefixes), seed))
        return [[1] for _ in prefixes]

    def is_correct(responses, golds):
        return [len(r) >= 9 and r[4:8] == response[4:8] for r in responses]  # head reached step 2's end

    values = mc.boundary_values([7, 7], response, boundaries, "1", 3, 64, sample, is_correct, seed=5)
    assert values.tolist() == [0.0, 0.0, 1.0, 1.0] and calls == [(12, 5)]
    assert mc.spread_credit(values, boundaries, (0, 12)).tolist() == [0] * 4 + [1] * 4 + [0] * 4


def test_credit_is_the_absolute_change_and_continuations_keep_the_budget():
    values = np.array([0.5, 0.25, 1.0])
    assert mc.spread_credit(values, [2, 4, 5], (2, 5)).tolist() == [0.25, 0.25, 0.75]
    seen = []

    def is_correct(responses, golds):
        seen.extend(responses)
        return [True] * len(responses)

    mc.boundary_values([9], [1, 2, 3], [0, 3], "g", 1, 4, lambda p, s: [[5, 6, 7, 8]] * len(p), is_correct, 0)
    assert seen == [[5, 6, 7, 8], [1, 2, 3, 5]]  # cut where the response would pass 4 tokens


def test_mc_value_method_through_the_registry(tokenizer, monkeypatch):
    """The registered method: boundaries from the response text, one seeded call per row, K per boundary,
    the row's temperature; success here depends only on the step that computes c."""
    import pyarrow as pa

    table = pa.table(chains_columns(tokenizer, responses=(RIGHT,)))
    rollouts = segment_rows(table, tokenizer)
    calls = []

    def fake_sampler(context, temperature, budget, batch_size):
        def sample(prefixes, seed):
            calls.append((len(prefixes), seed, temperature, budget))
            return [tokenizer("\\boxed{42}", add_special_tokens=False)["input_ids"]] * len(prefixes)
        return sample

    def fake_checker(tok, name):
        def is_correct(responses, golds):
            return ["c=41-5=36." in tok.decode(r) for r in responses]
        return is_correct

    monkeypatch.setattr(mc, "_policy_sampler", fake_sampler)
    monkeypatch.setattr(mc, "_checker", fake_checker)
    context = SimpleNamespace(policy=SimpleNamespace(load=lambda: (None, tokenizer)), seed=3, step=1)
    config = AttributeConfig(mc_samples=2, mc_max_new_tokens=200)
    (scores,) = ATTRIBUTION_METHODS.get("mc_value")(rollouts, table, config, context)
    end = rollouts[0].segments.reasoning[1]
    assert calls == [(2 * 7, mc.row_seed(3, 1, 0), 1.0, 200)]  # 6 boundaries inside + the end, K = 2
    step_c = RIGHT.index(" so c=41-5=36."), RIGHT.index(" then x")
    expected = np.zeros(end)
    expected[step_c[0]:step_c[1]] = 1.0
    assert scores[:end].tolist() == expected.tolist() and np.isnan(scores[end:]).all()


# ---- fidelity against the truth ----------------------------------------------------------------------

@pytest.mark.parametrize("scores, labels, expected", [
    ([3, 2, 1, 0], [1, 1, 0, 0], 1.0), ([0, 1, 2, 3], [1, 1, 0, 0], 0.0), ([1, 1, 1, 1], [1, 0, 1, 0], 0.5),
    ([2, 1, 2, 0], [1, 0, 0, -1], 0.75), ([1, np.nan], [0, 1], 0.0), ([1, 2], [1, 1], math.nan)])
def test_auc_by_hand(scores, labels, expected):
    value = auc(np.array(scores, dtype=float), np.array(labels))
    assert (math.isnan(value) and math.isnan(expected)) or value == expected


def test_truth_columns_rows_follow_rollout_method_k():
    labels = [np.array([1, 0, 0, 1]), np.array([0, 0])]
    scores = {"good": [np.array([4.0, 1, 0, 3]), np.array([1.0, 2])],
              "bad": [np.array([0.0, 3, 4, 1]), np.array([1.0, 2])]}
    columns = truth_columns(labels, scores, [0.5])
    assert columns["truth_tokens"] == [2, 2, 0, 0]
    assert columns["truth_hits"] == [2, 0, 0, 0] and columns["truth_recall"][:2] == [1.0, 0.0]
    assert columns["truth_auc"][:2] == [1.0, 0.0] and math.isnan(columns["truth_auc"][2])


def test_cli_fidelity_scores_methods_against_the_truth(cli, tiny_config, tiny_policy, tmp_path):
    from oarctl.artifacts import make_table, write_parquet
    from oarctl.checkpoints import load_tokenizer

    tokenizer = load_tokenizer(tiny_policy)
    write_parquet(make_table(chains_columns(tokenizer), "rollouts"), tmp_path / "rollouts.parquet")
    # at K = 90% the top tokens hold every label-1 token (about half of the reasoning) when ranked right
    config = tiny_config(verify={"method": "boxed"}, fidelity={"max_new_tokens": 8, "ks": [0.9]})
    verified = cli("verify", tmp_path / "rollouts.parquet", "-o", tmp_path / "verified.parquet", "-c", config)
    assert verified.exit_code == 0, verified.output
    output = tmp_path / "fidelity.parquet"
    result = cli("fidelity", tmp_path / "verified.parquet", "-o", output, "-c", config, "--methods", "truth,random")
    assert result.exit_code == 0, result.output
    table = pq.read_table(output).to_pandas()
    assert set(table.columns) >= {"truth_tokens", "truth_hits", "truth_recall", "truth_auc"}
    assert (table[table["method"] == "truth"]["truth_auc"] == 1.0).all()  # the labels rank themselves perfectly
    report = output.with_suffix(".md").read_text()
    assert "Against the ground truth" in report and "| truth | 1.000 | 1.000 |" in report
    assert "| random | 1.000" not in report
    assert "of the oracle's causal tokens are label 1" in report


def test_a_chains_run_carries_token_truth_to_the_advantages(cli, tiny_config, tmp_path):
    """One step of `oarctl run` on the chains family: the rollouts get labels, truth scores them."""
    from oarctl.artifacts import read_artifact

    config = tiny_config(run={"steps": 1, "progress": False}, data={"toy_family": "chains", "chain_lengths": [4]},
                         attribute={"method": "truth"})
    result = cli("run", "-c", config, "--run-dir", tmp_path / "run")
    assert result.exit_code == 0, result.output
    step = tmp_path / "run" / "step_0000"
    rollouts = read_artifact(step / "rollouts.parquet", "rollouts")
    problems, responses = rollouts["problem"].to_pylist(), rollouts["response_token_ids"].to_pylist()
    tokenizer = build_tokenizer()
    assert rollouts["token_truth"].to_pylist() == [truth.token_truth(p, r, tokenizer) for p, r in zip(problems, responses)]
    advantages = read_artifact(step / "advantages.parquet", "advantages")
    assert advantages["token_truth"].to_pylist() == rollouts["token_truth"].to_pylist()
    for labels, scores, end in zip(advantages["token_truth"].to_pylist(), advantages["token_scores"].to_pylist(),
                                   advantages["reasoning_end"].to_pylist()):
        assert scores[:end] == [1.0 if label else 0.0 for label in labels[:end]]  # -1 scores 1 too


def test_arithmetic_rollouts_stay_as_they_were(cli, tiny_config, tmp_path):
    """No token_truth column (and so the same bytes and cache keys) for the arithmetic family."""
    result = cli("sample", tmp_path / "p.parquet", "-o", tmp_path / "r.parquet", "-c", tiny_config())
    assert result.exit_code != 0  # no prompts file yet: write one with `oarctl toy prompts`
    assert cli("toy", "prompts", "-o", tmp_path / "p.parquet", "-n", 4, "-c", tiny_config()).exit_code == 0
    assert cli("sample", tmp_path / "p.parquet", "-o", tmp_path / "r.parquet", "-c", tiny_config()).exit_code == 0
    assert "token_truth" not in pq.read_table(tmp_path / "r.parquet").column_names


def test_mc_options_join_the_attribute_cache_key_only_for_mc_value():
    """Runs of every other method keep the attribute cache keys they had before mc_value existed."""
    from oarctl.config import MC_OPTIONS, load_config
    from oarctl.pipeline import key_section

    assert not set(MC_OPTIONS) & set(key_section(load_config(), "attribute"))
    assert set(MC_OPTIONS) <= set(key_section(load_config(overrides=["attribute.method=mc_value"]), "attribute"))


def test_fidelity_key_has_mc_options_only_when_mc_value_is_scored(tmp_path, tiny_policy):
    from oarctl.config import MC_OPTIONS, load_config
    from oarctl.fidelity import fidelity_key

    (tmp_path / "v.parquet").write_bytes(b"x")
    plain = fidelity_key(tmp_path / "v.parquet", load_config(), tiny_policy)["config"]["attribute"]
    with_mc = fidelity_key(tmp_path / "v.parquet", load_config(overrides=["fidelity.methods=[mc_value]"]),
                           tiny_policy)["config"]["attribute"]
    assert not set(MC_OPTIONS) & set(plain) and set(MC_OPTIONS) <= set(with_mc)
