"""Fast tests of the embedded toy world: task generator, tokenizer, tiny model (seconds, offline)."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

from oarctl.errors import OarError  # noqa: E402
from oarctl.toy import task  # noqa: E402
from oarctl.toy.model import build_model, parameter_count  # noqa: E402
from oarctl.toy.tokenizer import build_tokenizer, format_prompt  # noqa: E402
from oarctl.verify.boxed import extract_boxed  # noqa: E402

STEP = re.compile(r"^(\d+)([+\-*])(\d+)=(\d+)\.$")
OPS = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b}


def _expression_value(problem: str) -> int:
    """Value of `Compute EXPR.` with usual precedence, computed without eval."""
    expr = re.fullmatch(r"Compute ([0-9+\-*]+)\.", problem).group(1)
    terms = re.split(r"([+\-])", expr)
    total = sign = 0
    for index, term in enumerate(terms):
        if index % 2:
            sign = -1 if term == "-" else 1
            continue
        value = 1
        for factor in term.split("*"):
            value *= int(factor)
        total = value if index == 0 else total + sign * value
    return total


def test_generator_is_deterministic_and_ids_unique():
    first, again = task.generate_problems(300, seed=3), task.generate_problems(300, seed=3)
    assert first == again
    assert first != task.generate_problems(300, seed=4)
    assert len({p["prompt_id"] for p in first}) == 300
    assert len({p["problem"] for p in first}) == 300
    assert first[0]["prompt_id"] == "toy-s3-0"


def test_exclude_makes_splits_disjoint_and_keeps_every_level():
    train = task.generate_problems(2000, seed=0)
    texts = {p["problem"] for p in train}
    heldout = task.generate_problems(200, seed=1, exclude=texts)
    assert not texts & {p["problem"] for p in heldout}
    assert {p["level"] for p in heldout} == set(task.DEFAULT_LEVELS)


def test_levels_filter_and_exhaustion_error():
    assert {p["level"] for p in task.generate_problems(50, seed=0, levels=(4,))} == {4}
    with pytest.raises(OarError, match="level 3 ran out of distinct problems after 648 of 2000"):
        task.generate_problems(2000, seed=0, levels=(3,))  # level 3 has 648 problems
    with pytest.raises(OarError, match=r"levels must be a non-empty subset .*, got \(9,\)"):
        task.generate_problems(5, seed=0, levels=(9,))


def test_solutions_are_arithmetically_right():
    for p in task.generate_problems(1000, seed=7):
        *steps, box = p["solution"].split(" ")
        assert box == f"\\boxed{{{p['answer']}}}" and extract_boxed(p["solution"]) == p["answer"]
        assert int(p["answer"]) == _expression_value(p["problem"]) >= 0
        for step in steps:
            a, op, b, value = STEP.match(step).groups()
            assert OPS[op](int(a), int(b)) == int(value), (p["problem"], step)
        assert steps[-1].endswith(f"={p['answer']}.")
        assert len(steps) == {1: 1, 2: 1, 3: 3, 4: 2, 5: 2}[p["level"]]


def test_reserved_split_is_stable():
    # the same split in a process with another string-hash seed (Python's hash() would change it)
    problems = [p["problem"] for p in task.generate_problems(300, seed=0)]
    script = ("import json, sys; from oarctl.toy import task; "
              "print(json.dumps([task.is_reserved(p) for p in json.load(sys.stdin)]))")
    other = subprocess.run([sys.executable, "-c", script], input=json.dumps(problems), capture_output=True, text=True,
                           env={**os.environ, "PYTHONHASHSEED": "12345"}, check=True)
    assert json.loads(other.stdout) == [task.is_reserved(p) for p in problems]
    share = sum(task.is_reserved(p["problem"]) for p in task.generate_problems(3000, seed=0)) / 3000
    assert 0.05 < share < 0.15


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer()


def test_tokenizer_round_trip_and_special_ids(tokenizer):
    assert tokenizer.pad_token == "<|endoftext|>" and tokenizer.eos_token == "<|im_end|>"
    assert tokenizer.pad_token_id != tokenizer.eos_token_id
    assert tokenizer.padding_side == "left"
    for p in task.generate_problems(200, seed=5):
        for text in (p["problem"], p["solution"]):
            ids = tokenizer(text, add_special_tokens=False)["input_ids"]
            assert tokenizer.decode(ids) == text
        solution_ids = tokenizer(p["solution"], add_special_tokens=False)["input_ids"]
        assert tokenizer.convert_tokens_to_ids("\\boxed{") in solution_ids
    digits = tokenizer("1234", add_special_tokens=False)["input_ids"]
    assert len(digits) == 4  # one token per character


def test_chat_template(tokenizer):
    prompt = format_prompt(tokenizer, "Compute 12+7*3.")
    assert prompt == "<|im_start|>user\nCompute 12+7*3.<|im_end|>\n<|im_start|>assistant\n"
    ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    assert len(ids) == 23
    response = tokenizer("7*3=21. 12+21=33. \\boxed{33}", add_special_tokens=False)["input_ids"]
    text = tokenizer.decode(response + [tokenizer.eos_token_id], skip_special_tokens=True)
    assert text == "7*3=21. 12+21=33. \\boxed{33}"


@pytest.mark.parametrize("with_model_config", [False, True])
def test_tokenizer_save_and_autotokenizer_reload(tokenizer, tmp_path, with_model_config):
    """Next to a qwen2 config.json, AutoTokenizer rebuilds a Qwen2Tokenizer: it must not change."""
    from transformers import AutoTokenizer

    tokenizer.save_pretrained(tmp_path)
    if with_model_config:
        build_model(tokenizer).config.save_pretrained(tmp_path)
    reloaded = AutoTokenizer.from_pretrained(tmp_path)
    assert len(reloaded) == len(tokenizer)
    assert (reloaded.pad_token_id, reloaded.eos_token_id) == (tokenizer.pad_token_id, tokenizer.eos_token_id)
    assert reloaded.padding_side == "left"
    assert format_prompt(reloaded, "Compute 1+2.") == format_prompt(tokenizer, "Compute 1+2.")
    for p in task.generate_problems(50, seed=6):
        full = format_prompt(reloaded, p["problem"]) + p["solution"]
        ids = reloaded(full, add_special_tokens=False)["input_ids"]
        assert ids == tokenizer(full, add_special_tokens=False)["input_ids"]
        assert reloaded.decode(ids) == full


def test_sequences_stay_short(tokenizer):
    for p in task.generate_problems(500, seed=8):
        full = format_prompt(tokenizer, p["problem"]) + p["solution"] + tokenizer.eos_token
        assert len(tokenizer(full, add_special_tokens=False)["input_ids"]) <= 60


def test_tiny_model_builds_and_runs(tokenizer):
    torch.set_num_threads(2)
    model = build_model(tokenizer)
    assert 0.5e6 < parameter_count(model) < 1.5e6
    assert model.config.pad_token_id == tokenizer.pad_token_id
    assert model.config.eos_token_id == tokenizer.eos_token_id
    assert model.config.bos_token_id is not None
    assert model.config.vocab_size == len(tokenizer)
    batch = tokenizer([format_prompt(tokenizer, "Compute 1+2."), format_prompt(tokenizer, "Compute 47*6.")],
                      add_special_tokens=False, padding=True, return_tensors="pt")
    assert (batch["input_ids"][0, 0] == tokenizer.pad_token_id).item()  # left padded
    with torch.no_grad():
        logits = model(**batch).logits
    assert logits.shape == (2, batch["input_ids"].shape[1], len(tokenizer))
    assert torch.isfinite(logits).all()


def test_base_policy_dir_error_names_the_fix(monkeypatch, tmp_path):
    import oarctl.toy as toy

    monkeypatch.setattr(toy, "BASE_POLICY_DIR", tmp_path / "missing")
    with pytest.raises(OarError, match="oarctl toy build"):
        toy.base_policy_dir()


def test_pretrain_smoke_writes_checkpoint_atomically(tmp_path):
    """Two steps end to end: the out dir appears whole, with weights, tokenizer and metadata."""
    import json

    from transformers import AutoModelForCausalLM, AutoTokenizer

    from oarctl.toy.pretrain import pretrain

    out = tmp_path / "policy"
    meta = pretrain(out, max_steps=2, eval_every=1, n_heldout=4, eval_samples=1, log=lambda _: None)
    assert meta["steps_run"] == 2 and not meta["in_band"] and "no evaluation inside band" in meta["note"]
    assert json.loads((out / "base_policy.json").read_text())["command"].startswith("python -m oarctl.toy.pretrain")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["policy"]  # no temporary left behind
    model = AutoModelForCausalLM.from_pretrained(out)
    assert model.config.vocab_size == len(AutoTokenizer.from_pretrained(out))


def test_shipped_base_policy_is_right_sometimes():
    """The committed checkpoint loads offline and greedy-solves some, not all, held-out problems."""
    import json

    from transformers import AutoModelForCausalLM, AutoTokenizer

    from oarctl.toy import base_policy_dir
    from oarctl.toy.pretrain import evaluate

    path = base_policy_dir()
    meta = json.loads((path / "base_policy.json").read_text())
    assert meta["in_band"] and 0.2 <= meta["sampled_accuracy"] <= 0.6
    tok, model = AutoTokenizer.from_pretrained(path), AutoModelForCausalLM.from_pretrained(path)
    greedy = evaluate(model, tok, task.generate_problems(64, seed=99), temperature=0.0)
    assert 0.1 < greedy["accuracy"] < 0.9
