"""fidelity: the counterfactual oracle on constructed cases, recall@K by hand, the CLI end to end."""
from __future__ import annotations

import math

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

from oarctl import fidelity
from oarctl.fidelity import OracleCase, causal_tokens, causal_tokens_batch
from oarctl.metrics import recall_at_k, top_k_count

PROMPT = [90, 91, 92]
REASONING = [10, 11, 12, 13, 14, 15, 16, 17]  # positions 0..7 of the response
DECISIVE = (2, 5)  # the only positions the fake policy's answer depends on
EOS = 99


def fake_answer(response: list[int]) -> list[int]:
    """The fake policy's final answer: a function of the reasoning tokens at 2 and 5 only."""
    return [(response[2] + response[5]) % 50, EOS]


def fake_regenerate(prefixes: list[list[int]]) -> list[list[int]]:
    """Greedy continuation of a fake policy: the original reasoning from where the prefix stops,
    then an answer computed from positions 2 and 5 of the new response."""
    continuations = []
    for prefix in prefixes:
        head = prefix[len(PROMPT):]
        reasoning = head + REASONING[len(head):]
        continuations.append(reasoning[len(head):] + fake_answer(reasoning))
    return continuations


def correct_if_answer_matches(responses: list[list[int]], golds: list[str]) -> list[bool]:
    return [len(response) > len(REASONING) and str(response[len(REASONING)]) == gold
            for response, gold in zip(responses, golds)]


def case(gold: int, response=None) -> OracleCase:
    response = REASONING + fake_answer(REASONING) if response is None else response
    return OracleCase(PROMPT, response, (0, len(REASONING)), str(gold))


RIGHT = (12 + 15) % 50  # the answer the fake policy gives for the original reasoning
SHIFT = [t + 20 for t in REASONING]  # a replacement per position that changes its token


def test_oracle_finds_exactly_the_decisive_positions():
    causal = causal_tokens(case(RIGHT), SHIFT, fake_regenerate, correct_if_answer_matches)
    assert causal.dtype == bool and causal.shape == (len(REASONING),)
    assert np.flatnonzero(causal).tolist() == list(DECISIVE)


def test_oracle_batches_cases_in_one_generation_call_and_flips_wrong_to_right():
    calls = []

    def spy(prefixes):
        calls.append(len(prefixes))
        return fake_regenerate(prefixes)

    # Wrong rollout: only replacing position 5 by the token that makes the answer right flips it.
    wrong_gold = (12 + 40) % 50
    replacements = list(SHIFT)
    replacements[5] = 40
    results = causal_tokens_batch([case(RIGHT), case(wrong_gold), OracleCase(PROMPT, [EOS], (0, 0), "1")],
                                  [SHIFT, replacements, []], spy, correct_if_answer_matches)
    assert calls == [2 * len(REASONING)]
    assert np.flatnonzero(results[0]).tolist() == list(DECISIVE)
    assert np.flatnonzero(results[1]).tolist() == [5]
    assert results[2].shape == (0,)


def test_greedy_reference_removes_the_sampled_tail_confound():
    # The rollout's sampled answer (wrong) differs from what greedy decoding gives (right): against
    # the rollout's own verdict every position "flips", against the greedy control only 2 and 5 do.
    sampled = case(RIGHT, response=REASONING + [7, EOS])
    against_rollout = causal_tokens(sampled, SHIFT, fake_regenerate, correct_if_answer_matches, "rollout")
    calls = []

    def spy(prefixes):
        calls.append(len(prefixes))
        return fake_regenerate(prefixes)

    against_greedy = causal_tokens(sampled, SHIFT, spy, correct_if_answer_matches, "greedy")
    assert np.flatnonzero(~against_rollout).tolist() == list(DECISIVE)
    assert np.flatnonzero(against_greedy).tolist() == list(DECISIVE)
    assert calls == [len(REASONING)] * 2
    with pytest.raises(ValueError, match="reference"):
        causal_tokens(sampled, SHIFT, fake_regenerate, correct_if_answer_matches, "nope")


def test_pick_alternatives_skips_the_original_and_special_tokens():
    logits = torch.tensor([[5.0, 4.0, 3.0, 1.0],   # original 0 is the argmax -> 1
                           [0.0, 9.0, 1.0, 8.0],   # 1 is special -> 3
                           [1.0, 2.0, 3.0, 4.0]])  # original 3 -> 2
    assert fidelity.pick_alternatives(logits, [0, 2, 3], excluded=[1]) == [2, 3, 2]
    assert fidelity.pick_alternatives(logits, [0, 2, 3], excluded=[]) == [1, 1, 2]


@pytest.mark.parametrize("length, fraction, expected", [(12, 0.05, 1), (10, 0.3, 3), (10, 0.5, 5), (3, 1.0, 3),
                                                         (7, 0.2, 2), (0, 0.5, 0)])
def test_top_k_count_is_ceil_and_at_least_one(length, fraction, expected):
    assert top_k_count(length, fraction) == expected


CAUSAL = np.zeros(10, dtype=bool)
CAUSAL[[2, 5]] = True


@pytest.mark.parametrize("fraction, perfect, reversed_, tied", [
    (0.05, 0.5, 0.0, 0.0),   # 1 token: positions 2 | 0 | 0
    (0.2, 1.0, 0.0, 0.0),    # 2 tokens: {2, 5} | {0, 1} | {0, 1}
    (0.3, 1.0, 0.0, 0.5),    # 3 tokens: ... | {0, 1, 3} | {0, 1, 2}
    (0.5, 1.0, 0.0, 0.5),    # 5 tokens: ... | {0, 1, 3, 4, 6} | {0..4}
    (0.8, 1.0, 0.0, 1.0),    # 8 tokens: ... | the 8 non-causal ones | {0..7}
    (0.9, 1.0, 0.5, 1.0),    # 9 tokens: ... | those and 2 | {0..8}
])
def test_recall_at_k_hand_computed(fraction, perfect, reversed_, tied):
    assert recall_at_k(CAUSAL.astype(float), CAUSAL, fraction)[2] == perfect
    assert recall_at_k(-CAUSAL.astype(float), CAUSAL, fraction)[2] == reversed_
    assert recall_at_k(np.ones(10), CAUSAL, fraction)[2] == tied  # ties: earlier positions first


def test_recall_nan_scores_rank_last_and_no_causal_token_is_nan():
    scores = np.full(10, np.nan)
    scores[9] = 0.0
    assert recall_at_k(scores, CAUSAL, 0.1) == (1, 0, 0.0)  # the one finite score beats every NaN
    assert recall_at_k(scores, CAUSAL, 0.3) == (3, 0, 0.0)  # then NaNs in position order: 0, 1
    count, hits, recall = recall_at_k(np.arange(10.0), np.zeros(10, dtype=bool), 0.5)
    assert (count, hits) == (5, 0) and math.isnan(recall)


def test_sample_rows_is_seeded_sorted_and_bounded():
    assert fidelity.sample_rows(5, 10, 0) == [0, 1, 2, 3, 4]
    drawn = fidelity.sample_rows(100, 8, 3)
    assert drawn == sorted(set(drawn)) and len(drawn) == 8 and drawn == fidelity.sample_rows(100, 8, 3)
    assert drawn != fidelity.sample_rows(100, 8, 4)


# ---- end to end: rollouts -> verify -> fidelity with the tiny policy -----------------------------

METHODS = ["oar_p", "oar_g", "entropy", "random"]
RESPONSES = [("Compute 40-39.", "1", "40-39=1. \\boxed{1}"), ("Compute 41-39.", "2", "41-39=2. \\boxed{2}"),
             ("Compute 42-41.", "1", "42-41=1. so \\boxed{1}"), ("Compute 43-42.", "1", "43-42=3. \\boxed{3}"),
             ("Compute 44-42.", "2", "I think 2")]


def write_toy_rollouts(path, tiny_policy):
    from oarctl.artifacts import make_table, write_parquet
    from oarctl.checkpoints import load_tokenizer
    from oarctl.stages.sample import prompt_token_ids

    tokenizer = load_tokenizer(tiny_policy)
    responses = [tokenizer(text, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
                 for _, _, text in RESPONSES]
    columns = {"prompt_id": [f"p{i}" for i in range(len(RESPONSES))], "problem": [p for p, _, _ in RESPONSES],
               "answer": [a for _, a, _ in RESPONSES], "sample_index": [0] * len(RESPONSES),
               "prompt_token_ids": [prompt_token_ids(tokenizer, p) for p, _, _ in RESPONSES],
               "response_token_ids": responses, "response_logprobs": [[-1.0] * len(r) for r in responses],
               "response_text": [t for _, _, t in RESPONSES], "finish_reason": ["stop"] * len(RESPONSES),
               "temperature": [1.0] * len(RESPONSES)}
    write_parquet(make_table(columns, "rollouts"), path)
    return path


@pytest.fixture
def verified(cli, tiny_config, tiny_policy, tmp_path):
    config = tiny_config(verify={"method": "boxed"}, fidelity={"max_new_tokens": 12})
    rollouts = write_toy_rollouts(tmp_path / "rollouts.parquet", tiny_policy)
    result = cli("verify", rollouts, "-o", tmp_path / "verified.parquet", "-c", config)
    assert result.exit_code == 0, result.output
    return tmp_path / "verified.parquet", config


def test_cli_fidelity_end_to_end(cli, verified, tmp_path):
    path, config = verified
    output = tmp_path / "report" / "fidelity.parquet"
    result = cli("fidelity", path, "-o", output, "-c", config, "--sample", 4, "--methods", ",".join(METHODS))
    assert result.exit_code == 0, result.output
    table = pq.read_table(output).to_pandas()
    ks = [0.05, 0.1, 0.2, 0.3, 0.5]
    assert len(table) == 4 * len(METHODS) * len(ks)
    assert sorted(table["method"].unique()) == sorted(METHODS)
    assert np.allclose(sorted(table["k_fraction"].unique()), ks)
    finite = table["recall"].dropna()
    assert len(finite) and ((finite >= 0) & (finite <= 1)).all()  # some rollout has causal tokens
    assert (table["recall"].isna() == (table["causal_tokens"] == 0)).all()
    assert (table["hits"] <= table["top_k"]).all() and (table["top_k"] <= table["reasoning_tokens"].clip(lower=1)).all()
    report = output.with_suffix(".md").read_text()
    for method in METHODS:
        assert f"| {method} |" in report and f"| {method} |" in result.stdout
    assert "rollouts with >= 1 causal token" in report
    assert output.with_suffix(".png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not list(output.parent.glob(".*"))  # no temporaries left


def test_cli_fidelity_writes_a_manifest_and_reuses_a_finished_output(cli, verified, tmp_path, monkeypatch):
    import json

    import oarctl.fidelity

    path, config = verified
    output = tmp_path / "fidelity.parquet"
    arguments = ["fidelity", path, "-o", output, "-c", config, "--sample", 2, "--methods", "random"]
    first = cli(*arguments)
    assert first.exit_code == 0 and "wrote" in first.stdout, first.output
    manifest = json.loads(output.with_name("fidelity.parquet.manifest.json").read_text())
    assert manifest["stage"] == "fidelity" and manifest["metrics"]["rollouts"] == 2
    assert set(manifest["key_parts"]["inputs"]) == {"verified", "policy"}

    calls = []
    measure = oarctl.fidelity._measure
    monkeypatch.setattr(oarctl.fidelity, "_measure", lambda *a: calls.append(a) or measure(*a))
    again = cli(*arguments)
    assert again.exit_code == 0 and "up to date" in again.stdout and calls == []  # a cache hit computes nothing
    assert again.stdout.startswith(output.with_suffix(".md").read_text())
    changed = cli(*arguments, "--set", "fidelity.ks=[0.5]")  # another option: recomputed
    assert changed.exit_code == 0 and "wrote" in changed.stdout and len(calls) == 1
    output.with_name("fidelity.parquet.manifest.json").unlink()  # no manifest: incomplete, recomputed
    assert "wrote" in cli(*arguments).stdout and len(calls) == 2
    assert "wrote" in cli(*arguments, "--force").stdout and len(calls) == 3


def test_cli_fidelity_pad_replacement_and_greedy_reference(cli, verified, tmp_path):
    path, config = verified
    output = tmp_path / "pad.parquet"
    result = cli("fidelity", path, "-o", output, "-c", config, "--methods", "uniform,entropy",
                 "--set", "fidelity.replacement=pad", "--set", "fidelity.reference=greedy")
    assert result.exit_code == 0, result.output
    table = pq.read_table(output)
    assert table.num_rows == len(RESPONSES) * 2 * 5
    assert "replacement `pad`, reference `greedy`" in output.with_suffix(".md").read_text()


@pytest.mark.parametrize("args, names", [
    (["--methods", "oar_p,nope"], ["--methods", "'nope'"]),  # the CLI's option table names the option
    (["--methods", " , "], ["--methods"]),
    (["--sample", "0"], ["--sample"]),
    (["--set", "fidelity.methods=[oar_p, nope]"], ["fidelity.methods", "'nope'"]),  # the config names its key
    (["--set", "fidelity.sample=0"], ["fidelity.sample"]),
    (["--set", "fidelity.ks=[0.1, 2]"], ["fidelity.ks"]),
    (["--set", "fidelity.replacement=unk"], ["fidelity.replacement"]),
])
def test_cli_fidelity_bad_options_exit_2(cli, verified, tmp_path, args, names):
    path, config = verified
    result = cli("fidelity", path, "-o", tmp_path / "f.parquet", "-c", config, *args)
    assert result.exit_code == 2, result.output
    assert all(name in result.stderr for name in names), result.stderr
    assert not (tmp_path / "f.parquet").exists()


def test_cli_fidelity_missing_input_exits_2(cli, tmp_path):
    result = cli("fidelity", tmp_path / "none.parquet", "-o", tmp_path / "f.parquet")
    assert result.exit_code == 2 and "none.parquet: file not found" in result.stderr


def test_cli_fidelity_reads_an_attributions_file(cli, verified, tmp_path):
    path, config = verified
    attributions = tmp_path / "attributions.parquet"
    assert cli("attribute", path, "-o", attributions, "-c", config).exit_code == 0
    output = tmp_path / "from-attributions.parquet"
    result = cli("fidelity", attributions, "-o", output, "-c", config, "--sample", 2, "--methods", "random")
    assert result.exit_code == 0, result.output
    assert pq.read_table(output).num_rows == 2 * 5
