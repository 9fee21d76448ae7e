"""Shared fixtures of the machinery tests: a tiny policy, tiny configs, the CLI in-process and as a
subprocess.

Speed: the machine has 2 shared cores, and torch's default intra-op thread pool makes a tiny model
~7x slower when the cores are busy, so tests (and the `oarctl` subprocesses they start, which
inherit the environment) use one torch thread.
"""
from __future__ import annotations

import json
import os

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["HF_DATASETS_OFFLINE"] = "1"
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("OMP_NUM_THREADS", "1")

import hashlib  # noqa: E402
import shutil  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402
import yaml  # noqa: E402

torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _one_torch_thread_after_each_test():
    """Every test starts with the one torch thread set above: a test (or the code it runs, e.g. the toy
    pretrain's `threads`) that sets another count must not change later tests' float sums (OAR-G's
    weights under FSDP differed from one process's by 1e-3 after tests/test_toy.py left 2 threads)."""
    yield
    if torch.get_num_threads() != 1:
        torch.set_num_threads(1)


def _quiet_transformers() -> None:
    from transformers.utils import logging as transformers_logging

    transformers_logging.disable_progress_bar()

# The policy is warm-started to answer `\boxed{1}` or `\boxed{2}` (about half each), whatever the
# prompt, and the "signal" prompt sets below have gold answers 1 or 2: groups get mixed rewards,
# advantages are non-zero and `update` really changes the weights, so byte-identity checks of
# checkpoints are meaningful. With plain random weights every reward is 0 and the update is a no-op.
TARGETS = ["\\boxed{1}", "\\boxed{2}"]


def _warm_start(model, tokenizer, steps: int = 120, batch: int = 16) -> None:
    from oarctl.stages.sample import prompt_token_ids

    generator = torch.Generator().manual_seed(0)
    problems = [f"Compute {a}+{b}." for a in range(10, 30) for b in range(1, 4)]
    encoded = [prompt_token_ids(tokenizer, p) for p in problems]
    targets = [tokenizer(t, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id] for t in TARGETS]
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model.train()
    for _ in range(steps):
        prompts = torch.randint(len(encoded), (batch,), generator=generator).tolist()
        answers = torch.randint(len(targets), (batch,), generator=generator).tolist()
        rows = [(encoded[p], targets[a]) for p, a in zip(prompts, answers)]
        width = max(len(p) + len(t) for p, t in rows)
        ids = torch.full((batch, width), tokenizer.pad_token_id, dtype=torch.long)
        labels = torch.full((batch, width), -100, dtype=torch.long)
        mask = torch.zeros((batch, width), dtype=torch.long)
        for i, (p, t) in enumerate(rows):
            ids[i, :len(p) + len(t)] = torch.tensor(p + t)
            labels[i, len(p):len(p) + len(t)] = torch.tensor(t)
            mask[i, :len(p) + len(t)] = 1
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    model.eval()


@pytest.fixture(scope="session")
def tiny_policy(tmp_path_factory) -> Path:
    """A 24k-parameter toy Qwen2 (hidden 32, 2 layers), warm-started, saved as a transformers folder."""
    from oarctl.toy.model import build_model
    from oarctl.toy.tokenizer import build_tokenizer

    torch.manual_seed(0)
    tokenizer = build_tokenizer()
    model = build_model(tokenizer, hidden_size=32, num_layers=2, num_heads=2, num_kv_heads=2,
                        intermediate_size=64, max_positions=128, seed=0)
    _warm_start(model, tokenizer)
    _quiet_transformers()
    folder = tmp_path_factory.mktemp("tiny_policy")
    model.save_pretrained(folder, safe_serialization=True)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="session")
def random_policy(tmp_path_factory) -> Path:
    """The same tiny architecture with untrained weights (rewards are ~0)."""
    from oarctl.toy.model import build_model
    from oarctl.toy.tokenizer import build_tokenizer

    torch.manual_seed(0)
    tokenizer = build_tokenizer()
    model = build_model(tokenizer, hidden_size=32, num_layers=2, num_heads=2, num_kv_heads=2,
                        intermediate_size=64, max_positions=128, seed=0)
    _quiet_transformers()
    folder = tmp_path_factory.mktemp("random_policy")
    model.save_pretrained(folder, safe_serialization=True)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="session")
def signal_data(tmp_path_factory) -> dict[str, Path]:
    """JSONL prompt sets whose gold answers are 1 or 2 (what the tiny policy answers)."""
    folder = tmp_path_factory.mktemp("signal_data")
    paths = {}
    for split, count, offset in (("train", 24, 40), ("heldout", 6, 80)):
        lines = []
        for i in range(count):
            a, answer = offset + i, 1 + i % 2
            lines.append(json.dumps({"id": f"{split}-{i}", "problem": f"Compute {a}-{a - answer}.",
                                     "answer": str(answer)}))
        paths[split] = folder / f"{split}.jsonl"
        paths[split].write_text("\n".join(lines) + "\n")
    return paths


def _merge(base: dict, extra: dict) -> dict:
    merged = {section: dict(values) for section, values in base.items()}
    for section, values in extra.items():
        merged.setdefault(section, {}).update(values)
    return merged


@pytest.fixture
def tiny_config(tmp_path, tiny_policy, signal_data):
    """`tiny_config(name="tiny.yaml", signal=False, **sections)` writes a tiny YAML config.

    The default data is the generated toy task (32 train / 8 held-out); `signal=True` uses the
    JSONL sets with answers 1/2 (mixed rewards). Keyword arguments are sections merged on top.
    """
    def write(name: str = "tiny.yaml", signal: bool = False, **sections) -> Path:
        document = {
            "run": {"steps": 2, "progress": False},
            "data": {"toy_train_size": 32, "toy_heldout_size": 8},
            "policy": {"path": str(tiny_policy)},
            "sample": {"prompts_per_step": 2, "group_size": 4, "max_new_tokens": 16},
            "evaluate": {"samples": 2, "max_new_tokens": 16, "pass_k": [1, 2]},
            "update": {"mini_batch_size": 8, "micro_batch_size": 4},
        }
        if signal:
            document["data"].update(train=str(signal_data["train"]), heldout=str(signal_data["heldout"]))
        document = _merge(document, sections)
        path = tmp_path / name
        path.write_text(yaml.safe_dump(document, sort_keys=False))
        return path
    return write


@pytest.fixture
def cli():
    """`cli(*args)` runs `oarctl` in-process; the result has .exit_code, .stdout, .stderr."""
    from typer.testing import CliRunner

    from oarctl.cli import app

    runner = CliRunner()

    def invoke(*args):
        return runner.invoke(app, [str(a) for a in args])
    return invoke


def oarctl_executable() -> str:
    beside = Path(sys.executable).parent / "oarctl"
    found = str(beside) if beside.exists() else shutil.which("oarctl")
    if not found:
        pytest.skip("the oarctl console script is not installed")
    return found


def run_oarctl(*args, cwd=None, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([oarctl_executable(), *map(str, args)], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout)


def load_script(path: Path):
    """A script of scripts/ or bench/ as a module (it is no package), to call its functions in-process."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(f"script_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def sha256(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def walk_while_written(folder: Path, pattern: str) -> list[Path]:
    """`folder.rglob(pattern)`, sorted, safe to call while a run writes: a temporary folder renamed into
    place during the walk makes the walk start over."""
    for _ in range(100):
        try:
            return sorted(Path(folder).rglob(pattern))
        except FileNotFoundError:
            continue
    raise AssertionError(f"{folder}: kept changing during 100 walks")


def hidden_temporaries(folder: Path) -> list[Path]:
    """Leftovers of `temporary_sibling`: hidden `.NAME.tmp-PID` files or folders (safe while a run writes)."""
    return [p for p in walk_while_written(folder, ".*") if ".tmp-" in p.name]


# ---- artifact builders (valid and broken input files) -------------------------------------------

# Two responses as the toy tokenizer encodes them (the first with its eos), so the verify stage maps
# answer spans to tokens as it does on sampled rollouts, and attribution has reasoning to score.
TOY_RESPONSES = [("1+1=2 \\boxed{2}", [4, 75, 4, 83, 5, 97, 100, 5, 95, 2], "stop"),
                 ("1+1=3 \\boxed{3}", [4, 75, 4, 83, 6, 97, 100, 6, 95], "length")]


def rollouts_columns(rows: int = 2) -> dict:
    """Python columns of a small valid rollouts table (response lengths 10, 9, 10, 9, ...)."""
    responses = [TOY_RESPONSES[i % 2] for i in range(rows)]
    return {
        "prompt_id": [f"p{i // 2}" for i in range(rows)],
        "problem": ["Compute 1+1."] * rows,
        "answer": ["2"] * rows,
        "sample_index": [i % 2 for i in range(rows)],
        "prompt_token_ids": [[1, 2, 3]] * rows,
        "response_token_ids": [ids for _, ids, _ in responses],
        "response_logprobs": [[-0.5] * len(ids) for _, ids, _ in responses],
        "response_text": [text for text, _, _ in responses],
        "finish_reason": [finish for _, _, finish in responses],
        "temperature": [1.0] * rows,
    }


def write_rollouts(path: Path, rows: int = 2, **replace) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from oarctl.artifacts import make_table

    columns = rollouts_columns(rows)
    table = make_table(columns, "rollouts")
    for name, value in replace.items():
        index = table.column_names.index(name)
        table = table.remove_column(index) if value is None else table.set_column(index, name, pa.array(value))
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, path)
    return path


def _truncated(path: Path) -> Path:
    write_rollouts(path)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    return path


def _empty_table(path: Path) -> Path:
    import pyarrow.parquet as pq

    from oarctl.artifacts import make_table

    pq.write_table(make_table({k: [] for k in rollouts_columns(0)}, "rollouts"), path)
    return path


# name -> (writer of a broken rollouts file, substrings the error must contain besides the path)
BAD_ROLLOUTS = {
    "missing": (lambda p: p, ["not found"]),
    "empty-file": (lambda p: (p.write_bytes(b""), p)[1], ["empty"]),
    "not-parquet": (lambda p: (p.write_text("prompt_id,problem\n1,2\n"), p)[1], ["not a readable Parquet"]),
    "truncated": (_truncated, ["not a readable Parquet"]),
    "directory": (lambda p: (p.mkdir(), p)[1], ["directory"]),
    "no-rows": (_empty_table, ["no rows"]),
    "missing-column": (lambda p: write_rollouts(p, response_logprobs=None), ["'response_logprobs'", "missing"]),
    "mistyped-column": (lambda p: write_rollouts(p, temperature=["hot", "cold"]), ["'temperature'", "string"]),
    "mistyped-token-column": (lambda p: write_rollouts(p, response_token_ids=[["a"], ["b", "c"]]),
                              ["'response_token_ids'"]),
    "misaligned-tokens": (lambda p: write_rollouts(p, response_logprobs=[[-0.5] * 10, [-0.5] * 10]),
                          ["row 1", "'response_logprobs'", "10 values for 9"]),
}
