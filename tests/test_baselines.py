"""The methods users pick instead of OAR: TRL's 80/20 entropy mask (`entropy_mask`) and KTAE (`ktae`).

entropy_mask: oarctl's mask is TRL's `get_high_entropy_mask` (ties, padding, two processes), and the
attribute + reshape stages give the per-token loss weights TRL's function gives on the entropies of the
update stage's forward. ktae: the key-token values equal a transcription of the method's equations written
here (exact rational Fisher p-values), a hand-computed group, and the reshape stage adds them to the GRPO
advantage."""
from __future__ import annotations

import math
import random
from fractions import Fraction

import numpy as np
import pytest
import torch

from oarctl.artifacts import extend_table, make_table
from oarctl.attribution.ktae import group_key_values, key_values
from oarctl.config import load_config
from oarctl.contract import Policy, StageContext
from oarctl.credit_rules import batch_entropy_mask, high_entropy_mask
from oarctl.errors import OarError
from oarctl.schema import AttributeConfig, ReshapeConfig, UpdateConfig
from oarctl.stages import attribute, reshape


class _Ranks:
    """The accelerator TRL's method sees: this process's values and one other process's."""

    def __init__(self, other: torch.Tensor):
        self.other = other

    @staticmethod
    def _padded(values, length, pad):
        return torch.cat([values, torch.full((length - len(values),), pad, dtype=values.dtype)])

    def pad_across_processes(self, values, dim, pad_index):
        return self._padded(values, max(len(values), len(self.other)), pad_index)

    def gather(self, padded):
        return torch.cat([padded, self._padded(self.other, len(padded), -1e9)])


def _trl_mask(entropies, mask, level, other=torch.zeros(0)):
    trl = pytest.importorskip("trl")

    class Stub:
        accelerator = _Ranks(other)
    return trl.GRPOTrainer.get_high_entropy_mask(Stub(), entropies, mask, level)


def test_high_entropy_mask_is_trls_with_ties_padding_and_two_processes():
    generator = torch.Generator().manual_seed(0)
    entropies = torch.randint(0, 6, (4, 9), generator=generator).float() / 4  # (B, T): many ties
    mask = (torch.arange(9)[None, :] < torch.tensor([9, 5, 1, 7])[:, None]).float()
    other = torch.randint(0, 6, (13,), generator=generator).float() / 4  # another process's valid tokens
    for level in (0.0, 0.5, 0.8, 0.95, 1.0):
        ours = high_entropy_mask(entropies, mask, level, lambda values: torch.cat([values, other]))
        assert torch.equal(ours, _trl_mask(entropies, mask, level, other))
        assert not ours[mask == 0].any()  # padding is never kept
    kept = high_entropy_mask(entropies, mask, 0.8)
    threshold = torch.quantile(entropies[mask.bool()], 0.8)
    assert torch.equal(kept, (entropies >= threshold) & mask.bool())  # ties at the threshold are all kept
    assert not high_entropy_mask(entropies, torch.zeros_like(mask), 0.8).any()


def _verified(tokenizer, groups: int = 3, size: int = 4, temperature: float = 0.7):
    """A verified table of fixed rollouts: response k of a group answers k % 3 + 1 (gold 1 or 2)."""
    rows = []
    for group in range(groups):
        gold = 1 + group % 2
        problem = f"Compute {40 + group}-{40 + group - gold}."
        for k in range(size):
            text = f"{k}+{k * 3 % 7}={k % 3 + 1}. \\boxed{{{k % 3 + 1}}}"
            ids = tokenizer(text, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
            rows.append(dict(prompt_id=f"p{group}", problem=problem, answer=str(gold), sample_index=k,
                             prompt_token_ids=tokenizer(problem)["input_ids"], response_token_ids=ids,
                             response_logprobs=[-0.5] * len(ids), response_text=text, finish_reason="stop",
                             temperature=temperature, reward=float(k % 3 + 1 == gold)))
    columns = {name: [row[name] for row in rows] for name in rows[0] if name != "reward"}
    count = len(rows)
    return extend_table(make_table(columns, "rollouts"), {
        "extracted_answer": [r["response_text"][-2] for r in rows], "reward": [r["reward"] for r in rows],
        "answer_char_start": [-1] * count, "answer_char_end": [-1] * count, "answer_token_start": [-1] * count,
        "answer_token_end": [-1] * count, "normalized_answer": [None] * count, "normalized_gold": [None] * count,
        "verdict": ["correct" if r["reward"] else "wrong" for r in rows], "parse_ok": [True] * count,
        "timed_out": [False] * count, "extraction": ["strict"] * count}, "verified")


def _advantages(policy_path, verified, method: str, **reshape_options):
    context = StageContext(seed=0, step=0, policy=Policy(policy_path))
    attributions = attribute.run({"verified": verified}, AttributeConfig(method=method), context).table
    return reshape.run({"attributions": attributions}, ReshapeConfig(**reshape_options), context).table


def test_update_stage_loss_weights_are_trls_mask_on_one_batch(tiny_policy):
    from oarctl.policy.logprobs import pad_rows, response_token_stats

    model, tokenizer = Policy(tiny_policy).load()
    verified = _verified(tokenizer)
    table = _advantages(tiny_policy, verified, "entropy_mask")
    weights = table["token_weights"].to_pylist()
    prompts, responses = verified["prompt_token_ids"].to_pylist(), verified["response_token_ids"].to_pylist()
    with torch.no_grad():  # the update stage's forward (micro_batch_loss): entropies at the sampling temperature
        _, entropies = response_token_stats(model, prompts, responses, tokenizer.pad_token_id,
                                            verified["temperature"].to_pylist(), UpdateConfig().logit_chunk_tokens)
    mask = pad_rows([[1.0] * len(r) for r in responses], 0.0, torch.float32)
    expected = _trl_mask(entropies, mask, 1 - 0.2)  # GRPOConfig(top_entropy_quantile=0.2)
    for row, row_weights in enumerate(weights):
        assert row_weights == expected[row, :len(row_weights)].float().tolist()
    kept = sum(map(sum, weights)) / sum(map(len, weights))
    assert 0.15 < kept < 0.35  # about the top 20% of the batch's tokens, no rescaling
    advantages = np.array(table["advantage"].to_pylist())
    for row, (w, token) in enumerate(zip(weights, table["token_advantages"].to_pylist())):
        assert token == pytest.approx([advantages[row] * x for x in w])  # masked tokens carry no advantage


def test_batch_entropy_mask_leaves_unscored_rows_out_of_the_quantile():
    scores = [np.array([0.1, 0.9, 0.5], np.float32), np.full(2, np.nan, np.float32), np.array([0.3], np.float32)]
    masks = batch_entropy_mask(scores, 0.5)
    assert [m.tolist() for m in masks] == [[0.0, 1.0, 1.0], [1.0, 1.0], [0.0]]  # median of 0.1, 0.9, 0.5, 0.3: 0.4


# ---- KTAE -------------------------------------------------------------------------------------------

def _fisher_exact(a: int, b: int, c: int, d: int) -> Fraction:
    """Two-sided Fisher p with exact rationals: every table with these margins no likelier than [[a, b], [c, d]]."""
    row, column, total = a + b, a + c, a + b + c + d

    def probability(k):
        return Fraction(math.comb(column, k) * math.comb(total - column, row - k), math.comb(total, row))
    observed = probability(a)
    return sum((probability(k) for k in range(max(0, row + column - total), min(row, column) + 1)
                if probability(k) <= observed), Fraction(0))


def _transcribed(responses, correct, alpha=1.0, beta=1.0, use_tf=True, scale=1.0, unit_p_zero=False) -> dict:
    """The method's equations, term by term, for one group ({} when not mixed)."""
    right = [r for r, ok in zip(responses, correct) if ok]
    wrong = [r for r, ok in zip(responses, correct) if not ok]
    if not right or not wrong:
        return {}
    length_right, length_wrong = sum(map(len, right)), sum(map(len, wrong))
    mean_length = (length_right + length_wrong) / 2

    def tf(token, group, length):
        frequency = sum(r.count(token) for r in group) / length
        return frequency * 3.0 / (frequency + 2.0 * (0.5 + 0.5 * length / mean_length))

    def h(*counts):
        n = sum(counts)
        return -sum(c / n * math.log2(c / n) for c in counts if c)

    values = {}
    for token in {t for r in responses for t in r}:
        a = sum(token in r for r in right)
        b = sum(token in r for r in wrong)
        c, d = len(right) - a, len(wrong) - b
        p = _fisher_exact(a, b, c, d)
        strength = 0.0 if unit_p_zero and p == 1 else math.exp(-2 * float(p))
        n = a + b + c + d
        gain = h(a + c, b + d) - ((a + b) / n * h(a, b) + (c + d) / n * h(c, d))
        direction = math.asin(math.sqrt(a / len(right))) - math.asin(math.sqrt(b / len(wrong)))
        if use_tf:
            t_right, t_wrong = tf(token, right, length_right), tf(token, wrong, length_wrong)
            direction += t_right / (t_wrong + 1e-5) - t_wrong / (t_right + 1e-5)
        combined = (alpha * strength + beta * gain) * direction / (alpha + beta)
        values[token] = (1 / (1 + math.exp(-combined)) - 0.5) * 2 * scale if abs(combined) < 700 else \
            math.copysign(scale, combined)
    return values


def test_ktae_hand_computed_group():
    """Correct [1, 2], wrong [2, 3]; token 1: a=1 b=0 c=0 d=1, Fisher p = 1/2 + 1/2 = 1 (strength exp(-2) as
    released, 0 with unit_p_zero), IG = 1 bit, Cohen's h = asin(1) - asin(0) = pi/2; without tf:
    k = tanh((strength + 1) * pi/2 / 2 / 2)."""
    values = key_values([[1, 2], [2, 3]], [True, False], use_tf=False, unit_p_zero=True)
    assert values[1] == pytest.approx(math.tanh(math.pi / 8), abs=1e-12)
    assert values[3] == pytest.approx(-math.tanh(math.pi / 8), abs=1e-12)
    released = key_values([[1, 2], [2, 3]], [True, False], use_tf=False)
    assert released[1] == pytest.approx(math.tanh((math.exp(-2) + 1) * math.pi / 8), abs=1e-12)
    assert values[2] == 0.0  # in both: no association, no direction
    # with tf, token 1's BM25 ratio 0.6 / 1e-5 saturates the sigmoid: k = +1
    assert key_values([[1, 2], [2, 3]], [True, False])[1] == pytest.approx(1.0)
    assert key_values([[1, 2], [2, 3]], [True, True]) == {}  # not mixed: no key tokens


@pytest.mark.parametrize("options", [{}, {"use_tf": False}, {"alpha": 0.5, "beta": 2.0, "scale": 0.3},
                                     {"unit_p_zero": True}])
def test_ktae_equals_the_transcribed_equations(options):
    rng = random.Random(0)
    for _ in range(12):
        size = rng.randint(2, 9)
        responses = [[rng.randrange(12) for _ in range(rng.randint(1, 15))] for _ in range(size)]
        correct = [rng.random() < 0.5 for _ in range(size)]
        ours, expected = key_values(responses, correct, **options), _transcribed(responses, correct, **options)
        assert ours.keys() == expected.keys()
        for token in expected:
            assert ours[token] == pytest.approx(expected[token], rel=1e-9, abs=1e-12), token


def test_reshape_adds_ktae_key_values_to_the_grpo_advantage(tiny_policy):
    _, tokenizer = Policy(tiny_policy).load()
    verified = _verified(tokenizer, temperature=1.0)
    table = _advantages(tiny_policy, verified, "ktae")
    keys = group_key_values(verified["response_token_ids"].to_pylist(), verified["reward"].to_pylist(),
                            verified["prompt_id"].to_pylist(), AttributeConfig(),
                            {tokenizer.eos_token_id, tokenizer.pad_token_id})
    assert table["token_scores"].to_pylist() == [k.tolist() for k in keys]
    for advantage, row_keys, tokens in zip(table["advantage"].to_pylist(), keys, table["token_advantages"].to_pylist()):
        assert tokens == pytest.approx((advantage + row_keys.astype(np.float64)).tolist(), abs=1e-6)
        assert row_keys[-1] == 0.0  # eos
    assert any(np.ptp(k) > 0.1 for k in keys)  # the groups are mixed: tokens really differ


def test_baseline_options_are_checked_at_load():
    with pytest.raises(OarError, match="reshape.top_entropy_quantile"):
        load_config(None, ["reshape.top_entropy_quantile=1.5"])
    with pytest.raises(OarError, match="attribute.ktae_alpha"):
        load_config(None, ["attribute.ktae_alpha=0", "attribute.ktae_beta=0"])


def test_fidelity_class_table_takes_both(cli, tiny_config, tmp_path):
    import pyarrow.parquet as pq

    from oarctl.artifacts import write_parquet
    from oarctl.toy.tokenizer import build_tokenizer
    from test_credit_truth import chains_columns

    write_parquet(make_table(chains_columns(build_tokenizer()), "rollouts"), tmp_path / "rollouts.parquet")
    config = tiny_config(verify={"method": "boxed"}, fidelity={"max_new_tokens": 8, "ks": [0.5]})
    assert cli("verify", tmp_path / "rollouts.parquet", "-o", tmp_path / "verified.parquet", "-c", config).exit_code == 0
    output = tmp_path / "fidelity.parquet"
    result = cli("fidelity", tmp_path / "verified.parquet", "-o", output, "-c", config, "--methods", "ktae,entropy_mask")
    assert result.exit_code == 0, result.output
    frame = pq.read_table(output).to_pandas().groupby("method")
    weights = ["weight_query", "weight_earlier", "weight_free"]
    masked = frame.get_group("entropy_mask")[weights].to_numpy()
    assert ((masked >= 0) & (masked <= 1)).all() and (masked < 1).any()  # shares of 0/1 weights, some dropped
    assert (frame.get_group("ktae")[weights].to_numpy() != 1).any()  # the right and wrong rollouts differ
    report = output.with_suffix(".md").read_text()
    assert "| ktae | its own rule (ktae) |" in report and "| entropy_mask | its own rule (entropy_mask) |" in report
