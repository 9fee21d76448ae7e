"""Prompt templates: chat (default, unchanged), qwen25-math-cot, base, user text; cache keys."""
from __future__ import annotations

import pytest

from oarctl.config import load_config
from oarctl.errors import OarError
from oarctl.pipeline import key_section
from oarctl.stages.sample import prompt_token_ids
from oarctl.templates import QWEN25_MATH_COT_SYSTEM, encode, render, resolve
from oarctl.toy.tokenizer import build_tokenizer

PROBLEM = "Compute $\\frac{1}{2}+{x}$."


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer()


def test_default_is_the_old_user_turn_chat_prompt(tokenizer):
    text = tokenizer.apply_chat_template([{"role": "user", "content": PROBLEM}], tokenize=False,
                                         add_generation_prompt=True)
    old = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert prompt_token_ids(tokenizer, PROBLEM) == old
    assert prompt_token_ids(tokenizer, PROBLEM, template="chat") == old


def test_qwen25_math_cot_puts_the_instruction_in_a_system_turn(tokenizer):
    text = render(tokenizer, PROBLEM, "qwen25-math-cot")
    assert text == (f"<|im_start|>system\n{QWEN25_MATH_COT_SYSTEM}<|im_end|>\n"
                    f"<|im_start|>user\n{PROBLEM}<|im_end|>\n<|im_start|>assistant\n")


def test_base_has_no_chat_tokens(tokenizer):
    text = render(tokenizer, PROBLEM, "base")
    assert text == f"Question: {PROBLEM}\nAnswer: Let's think step by step."
    assert "<|im_start|>" not in text
    assert tokenizer.decode(encode(tokenizer, PROBLEM, "base")) == text


def test_user_string_substitutes_only_the_problem(tokenizer):
    spec = "Solve: {problem}\nPut it in \\boxed{} {answer} {0}"
    assert render(tokenizer, PROBLEM, spec) == f"Solve: {PROBLEM}\nPut it in \\boxed{{}} {{answer}} {{0}}"
    # a problem that itself contains "{problem}" is not substituted twice
    assert render(tokenizer, "a {problem} b", "<{problem}>") == "<a {problem} b>"


def test_user_file_template(tokenizer, tmp_path):
    path = tmp_path / "t.txt"
    path.write_text("Q: {problem}\nA:")
    assert render(tokenizer, "1+1", str(path)) == "Q: 1+1\nA:"
    assert resolve(str(path)).identity == "text:Q: {problem}\nA:"  # the key follows the content
    path.write_text("no placeholder")
    with pytest.raises(OarError, match="no {problem} placeholder"):
        resolve(str(path))


def test_chat_template_needs_one(tokenizer):
    plain = build_tokenizer()
    plain.chat_template = None
    with pytest.raises(OarError, match="no chat template"):
        render(plain, PROBLEM, "qwen25-math-cot")
    assert render(plain, PROBLEM, "base").startswith("Question:")


@pytest.mark.parametrize("value", ["qwen-math", "nonexistent.txt"])
def test_unknown_template_is_a_config_error(value):
    with pytest.raises(OarError) as error:
        load_config(None, [f"data.prompt_template={value}"])
    assert "data.prompt_template" in str(error.value) and "\n" not in str(error.value)


def test_cache_key_changes_only_when_the_template_does(tmp_path):
    default = load_config()
    assert key_section(default, "sample") == {k: v for k, v in vars(default.sample).items()}
    cot = load_config(None, ["data.prompt_template=qwen25-math-cot"])
    assert key_section(cot, "sample")["prompt_template"] == "qwen25-math-cot"
    assert key_section(cot, "evaluate")["prompt_template"] == "qwen25-math-cot"
    assert "prompt_template" not in key_section(cot, "verify")


def test_sample_and_evaluate_use_the_template(cli, tiny_config, tmp_path, signal_data):
    config = tiny_config(data={"prompt_template": "base"}, run={"steps": 1, "progress": False})
    prompts = tmp_path / "p.parquet"
    assert cli("toy", "prompts", "-o", prompts, "-n", "4").exit_code == 0
    result = cli("sample", prompts, "-o", tmp_path / "r.parquet", "-c", config)
    assert result.exit_code == 0, result.output
    import pyarrow.parquet as pq

    from oarctl.toy.tokenizer import build_tokenizer as fresh
    rollouts = pq.read_table(tmp_path / "r.parquet").to_pylist()
    text = fresh().decode(rollouts[0]["prompt_token_ids"])
    assert text == f"Question: {rollouts[0]['problem']}\nAnswer: Let's think step by step."
