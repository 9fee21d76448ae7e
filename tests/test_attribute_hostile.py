"""Hostile model output through verify and attribute, end to end, with a byte-level tokenizer.

The verifier's corpus (tests/test_verify_hostile.py) plus raw byte sequences that are not UTF-8,
encoded by a byte-level BPE tokenizer (as Qwen's is) into what a policy could have sampled: at most
`LIMIT` tokens each, the text being their decode, as the sample stage writes it. `oarctl verify`
and `oarctl attribute` (OAR-P, OAR-G, entropy) must then: exit 0, execute nothing, record an
outcome for every row, and give every row well-formed spans and scores (finite on the reasoning,
NaN elsewhere, one per token).
"""
from __future__ import annotations

import math

import pyarrow.parquet as pq
import pytest

from conftest import write_rollouts
from test_verify_hostile import HOSTILE, VERDICTS, armed

LIMIT = 96  # response tokens: a sampling limit; longer inputs are cut there, as max_new_tokens would
METHODS = ["oar_p", "oar_g", "entropy"]
CHAT_TEMPLATE = ("{%- for message in messages %}{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] "
                 "+ '<|im_end|>' + '\\n' }}{%- endfor %}{%- if add_generation_prompt %}"
                 "{{- '<|im_start|>assistant\\n' }}{%- endif %}")


@pytest.fixture(scope="module")
def byte_policy(tmp_path_factory):
    """A random tiny Qwen2 with a byte-level BPE tokenizer: every byte sequence is encodable."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    from oarctl.checkpoints import save_policy

    core = Tokenizer(models.BPE())
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=320, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    core.train_from_iterator(["The answer is \\boxed{12}.", "Compute 3+4. First 3+4=7, so \\boxed{7}."] * 20, trainer)
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=core, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    tokenizer.chat_template = CHAT_TEMPLATE
    config = Qwen2Config(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                         num_key_value_heads=2, intermediate_size=64, max_position_embeddings=256,
                         tie_word_embeddings=True, pad_token_id=tokenizer.pad_token_id,
                         eos_token_id=tokenizer.eos_token_id, attn_implementation="eager")
    torch.manual_seed(0)
    folder = tmp_path_factory.mktemp("byte_policy")
    save_policy(Qwen2ForCausalLM(config).float(), tokenizer, folder)
    return folder, tokenizer


def hostile_token_sequences(tokenizer, corpus: list[str]) -> list[list[int]]:
    """Each text encoded (lone surrogates, which no decode can produce, become '?'), cut at LIMIT,
    plus byte fragments that decode to invalid UTF-8: lone lead bytes, lone continuation bytes."""
    def encode(text: str) -> list[int]:
        return tokenizer(text.encode("utf-8", "replace").decode("utf-8"), add_special_tokens=False)["input_ids"]

    sequences = [encode(text)[:LIMIT] for text in corpus]
    emoji, accent = encode("\U0001F600"), encode("é")
    box, close = encode("\\boxed{"), encode("}")
    sequences += [box + accent[:1] + close, box + emoji[1:3] + close, emoji[:1] * 30 + box + accent[1:] + close,
                  (emoji[2:] + accent[:1]) * 20, box + emoji[:3] + emoji[:3] + close]
    return sequences


def hostile_rollouts(path, tokenizer, sequences: list[list[int]]):
    """Two copies of each response make a group of 2 (reshape-ready); prompt 'Compute 1+1.'."""
    from oarctl.stages.sample import prompt_token_ids

    prompt = prompt_token_ids(tokenizer, "Compute 1+1.")
    rows = [ids for ids in sequences for _ in range(2)]
    texts = tokenizer.batch_decode(rows, skip_special_tokens=True)
    return write_rollouts(path, rows=len(rows), prompt_id=[f"h{i // 2}" for i in range(len(rows))],
                          sample_index=[i % 2 for i in range(len(rows))], prompt_token_ids=[prompt] * len(rows),
                          response_token_ids=rows, response_logprobs=[[-1.0] * len(ids) for ids in rows],
                          response_text=texts, finish_reason=["length"] * len(rows), answer=["1"] * len(rows))


def check_spans_and_scores(row: dict) -> None:
    length = len(row["response_token_ids"])
    scores = row["token_scores"]
    assert len(scores) == length
    start, end = row["reasoning_start"], row["reasoning_end"]
    assert 0 <= start <= end <= length
    assert all(math.isfinite(s) for s in scores[start:end]), row["response_text"][:80]
    assert all(math.isnan(s) for s in scores[:start] + scores[end:])
    if not row["uses_probe"]:
        assert end <= row["conclude_start"] <= row["conclude_end"] <= row["answer_start"] <= row["answer_end"] <= length


def test_hostile_responses_survive_verify_and_attribution(cli, byte_policy, tmp_path):
    policy, tokenizer = byte_policy
    traps = tmp_path / "traps"
    traps.mkdir()
    corpus, targets = armed(HOSTILE, traps)
    sequences = hostile_token_sequences(tokenizer, corpus)
    assert len(sequences) >= 50
    rollouts = hostile_rollouts(tmp_path / "rollouts.parquet", tokenizer, sequences)

    verified = tmp_path / "verified.parquet"
    result = cli("verify", rollouts, "-o", verified, "--policy", policy, "--set", "verify.timeout=2")
    assert result.exit_code == 0, result.output
    verdicts = pq.read_table(verified)["verdict"].to_pylist()
    assert len(verdicts) == 2 * len(sequences) and set(verdicts) <= VERDICTS
    texts = pq.read_table(verified)["response_text"].to_pylist()
    assert sum("\ufffd" in text for text in texts) >= 10  # invalid UTF-8 really reached the stages

    for method in METHODS:
        output = tmp_path / f"{method}.parquet"
        result = cli("attribute", verified, "-o", output, "--method", method, "--policy", policy)
        assert result.exit_code == 0, result.output
        rows = pq.read_table(output).to_pylist()
        assert len(rows) == 2 * len(sequences)
        for row in rows:
            assert row["attribution_method"] == method and row["verdict"] in VERDICTS
            check_spans_and_scores(row)
        # both paths are exercised: answers found in hostile text, and the probe where none is
        assert 0 < sum(row["uses_probe"] for row in rows) < len(rows)
        assert sum(row["reasoning_end"] > row["reasoning_start"] for row in rows) >= len(rows) // 3
        advantages = tmp_path / f"{method}-advantages.parquet"
        assert cli("reshape", output, "-o", advantages).exit_code == 0  # and the scores reshape cleanly

    assert sorted(p.name for p in traps.iterdir()) == []  # nothing was executed
    assert not any(target.exists() for target in targets)

