"""Credit that reaches the causes: the classes of label-1 tokens (the query's own step, the earlier
chain), the matched controls truth_shuffled and truth_last, rank normalisation, the per-class
fidelity table, and options that join cache keys only when set. Hand-checked cases (CPU, seconds)."""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from oarctl.attribution import ATTRIBUTION_METHODS
from oarctl.attribution.base import segment_rows
from oarctl.config import AttributeConfig, ReshapeConfig, load_config
from oarctl.fidelity_truth import class_summary, class_values, reasoning_classes
from oarctl.reshaping import bilevel_weights, rank
from oarctl.toy import truth
from oarctl.toy.tokenizer import build_tokenizer
from test_credit_truth import PROBLEM, RIGHT, chains_columns

QUERY_STEP_TEXT = "e=44-2=42."
EARLIER_STEPS = ("b=34+7=41.", "c=41-5=36.", "d=36+8=44.")


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer()


@pytest.fixture(scope="module")
def table(tokenizer):
    return pa.table(chains_columns(tokenizer))


def context(tokenizer, seed=0, step=0):
    return SimpleNamespace(seed=seed, step=step, policy=SimpleNamespace(load_tokenizer=lambda: tokenizer))


def text_of(classes, text, value) -> str:
    return "".join(c for c, v in zip(text, classes) if v == value)


def test_character_classes_split_the_answer_path(tokenizer):
    classes = truth.character_classes(truth.parse_problem(PROBLEM), RIGHT)
    labels = truth.character_labels(truth.parse_problem(PROBLEM), RIGHT)
    assert [min(c, 1) for c in classes] == labels  # classes refine the labels
    # the query's step: its name, operands, operator and result (not `=` or `.`), and the boxed answer
    assert text_of(classes, RIGHT, truth.QUERY_STEP) == "e44-24242"
    assert text_of(classes, RIGHT, 1) == "b34+741c41-536d36+844"  # the earlier chain; x (a distractor) is free


def test_token_classes_follow_the_characters(tokenizer, table):
    ids = table["response_token_ids"][0].as_py()
    classes = truth.token_classes(PROBLEM, ids, tokenizer)
    assert [min(c, 1) for c in classes] == truth.token_truth(PROBLEM, ids, tokenizer)
    assert truth.token_classes("not a chains problem", ids, tokenizer) is None


def test_truth_last_marks_only_the_query_step(tokenizer, table):
    rollouts = segment_rows(table, tokenizer)
    last = ATTRIBUTION_METHODS.get("truth_last")(rollouts, table, AttributeConfig(), context(tokenizer))
    full = ATTRIBUTION_METHODS.get("truth")(rollouts, table, AttributeConfig(), context(tokenizer))
    classes = reasoning_classes(table, rollouts, tokenizer)
    for row, rollout in enumerate(rollouts):
        end = rollout.segments.reasoning[1]
        assert last[row][:end].tolist() == [1.0 if c in (truth.QUERY_STEP, -1) else 0.0 for c in classes[row]]
        assert np.isnan(last[row][end:]).all()
        assert last[row][:end].sum() < full[row][:end].sum()  # the earlier chain is left out


def test_truth_shuffled_keeps_each_rows_histogram_and_is_seeded(tokenizer, table):
    rollouts = segment_rows(table, tokenizer)
    method = ATTRIBUTION_METHODS.get("truth_shuffled")
    shuffled = method(rollouts, table, AttributeConfig(), context(tokenizer))
    again = method(rollouts, table, AttributeConfig(), context(tokenizer))
    other_step = method(rollouts, table, AttributeConfig(), context(tokenizer, step=1))
    full = ATTRIBUTION_METHODS.get("truth")(rollouts, table, AttributeConfig(), context(tokenizer))
    for row, rollout in enumerate(rollouts):
        end = rollout.segments.reasoning[1]
        assert sorted(shuffled[row][:end]) == sorted(full[row][:end])
        assert not np.array_equal(shuffled[row][:end], full[row][:end])
        np.testing.assert_array_equal(shuffled[row], again[row])
    assert any(not np.array_equal(a, b) for a, b in zip(shuffled, other_step))


def test_rank_is_the_min_max_scaled_mean_rank():
    np.testing.assert_allclose(rank(np.array([5.0, 1e-6, 2e-6, 5.0])), [1.0, 0.0, 1 / 2.5, 1.0])
    assert rank(np.array([3.0, 3.0])) is None


def test_rank_keeps_the_contrast_that_log1p_minmax_flattens():
    heavy = np.array([5.0, 0.04] + [3e-6] * 6 + [1e-6] * 8)  # OAR-P's shape: one huge score, a flat rest
    paper = bilevel_weights(heavy, normalize="log1p_minmax")
    ranked = bilevel_weights(heavy, normalize="rank")
    assert np.ptp(paper[2:]) < 0.05  # everything but the top two is the same weight
    assert ranked[2:8].min() > 1.5 * ranked[8:].max()  # 3e-6 tokens get clearly more weight than 1e-6 ones
    two_valued = np.array([1.0, 0, 0, 1, 0, 0, 0, 1])
    np.testing.assert_array_equal(bilevel_weights(two_valued, normalize="rank"), bilevel_weights(two_valued))


def test_class_values_by_hand():
    classes = np.array([2, 1, 1, 0, 0, 0, 0, -1], dtype=np.int8)
    scores = np.array([1.0, 1, 1, 0, 0, 0, 0, 1])  # truth's scores
    counts_and_aucs = class_values(scores, classes, bilevel_weights(scores))[:5]
    assert counts_and_aucs == (1, 2, 4, 1.0, 1.0)
    weights = bilevel_weights(scores)  # tau = 0: label 0 keeps 1, label 1 gets 1 + beta, then mass preserved
    summary = class_summary([scores], [classes], ReshapeConfig())
    assert summary["weight_earlier"] == pytest.approx(weights[1])
    assert summary["weight_free"] == pytest.approx(weights[3])
    assert summary["earlier_free_ratio"] == pytest.approx(2.0)
    flat = class_summary([np.ones(8)], [classes], ReshapeConfig())
    assert flat["earlier_free_ratio"] == 1.0 and flat["auc_earlier"] == 0.5


def test_cli_fidelity_reports_credit_by_class(cli, tiny_config, tiny_policy, tmp_path, tokenizer):
    from oarctl.artifacts import make_table, write_parquet

    write_parquet(make_table(chains_columns(tokenizer), "rollouts"), tmp_path / "rollouts.parquet")
    config = tiny_config(verify={"method": "boxed"}, fidelity={"max_new_tokens": 8, "ks": [0.5]})
    verified = cli("verify", tmp_path / "rollouts.parquet", "-o", tmp_path / "verified.parquet", "-c", config)
    assert verified.exit_code == 0
    output = tmp_path / "fidelity.parquet"
    result = cli("fidelity", tmp_path / "verified.parquet", "-o", output, "-c", config,
                 "--methods", "truth,truth_last,uniform")
    assert result.exit_code == 0, result.output
    frame = pq.read_table(output).to_pandas()
    by_method = frame.groupby("method")
    assert (by_method.get_group("truth")[["truth_auc_query", "truth_auc_earlier"]] == 1.0).all().all()
    assert (by_method.get_group("truth_last")["truth_auc_earlier"] == 0.5).all()
    assert (by_method.get_group("uniform")["weight_earlier"] == by_method.get_group("uniform")["weight_free"]).all()
    report = output.with_suffix(".md").read_text()
    assert "Credit by class" in report
    rows = {line.split("|")[1].strip() + "/" + line.split("|")[2].strip(): line.split("|")[3:-1]
            for line in report.splitlines() if line.startswith("| truth") or line.startswith("| uniform")}
    truth_row = rows["truth/configured (log1p_minmax)"]
    assert [float(v) for v in truth_row[:3]] == [1.0, 1.0, 1.0] and float(truth_row[-1]) > 1.5
    assert float(rows["uniform/normalize=rank"][-1]) == 1.0
    assert float(rows["truth_last/configured (log1p_minmax)"][2]) == 0.5
    assert "uniform/quantile_carry (released code)" in rows  # the released code's reshaping, one more row


def test_quantile_carry_weights_follow_the_batch_order():
    """Under quantile_carry the second rollout's cut-off is the first one's threshold: its weights differ
    from those of the same rollout reshaped alone, and class_summary sees them."""
    import dataclasses

    from oarctl.fidelity_truth import reshaped

    rng = np.random.default_rng(0)
    scores = [rng.exponential(size=12) ** 4 for _ in range(3)]
    carry = dataclasses.replace(ReshapeConfig(), quantile_carry=True)
    alone, carried = reshaped(scores, ReshapeConfig()), reshaped(scores, carry)
    np.testing.assert_array_equal(alone[0], carried[0])
    assert not np.allclose(alone[1], carried[1])
    classes = [np.array([2, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0], dtype=np.int8)] * 3
    plain = class_summary(scores, classes, ReshapeConfig())
    assert class_summary(scores, classes, carry)["weight_free"] != plain["weight_free"]


def test_later_options_join_cache_keys_only_when_set():
    from oarctl.pipeline import key_section

    plain = load_config()
    assert "normalize" not in key_section(plain, "reshape") and "flow_rule" not in key_section(plain, "attribute")
    changed = load_config(overrides=["reshape.normalize=rank", "attribute.flow_rule=widest"])
    assert key_section(changed, "reshape")["normalize"] == "rank"
    assert key_section(changed, "attribute")["flow_rule"] == "widest"


@pytest.mark.parametrize("override, option", [("reshape.normalize=ranks", "reshape.normalize"),
                                              ("attribute.flow_rule=longest", "attribute.flow_rule")])
def test_unknown_names_are_one_line_errors(override, option):
    from oarctl.errors import OarError

    with pytest.raises(OarError, match=option):
        load_config(overrides=[override])
