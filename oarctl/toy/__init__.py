"""The embedded toy world: generated tasks, char-level tokenizer, tiny Qwen2, shipped base policies.

Two task families share the tokenizer and the model: `arithmetic` (task.py, the original levels)
and `chains` (chains.py: long named-variable chains with free choices and ground-truth credit labels,
truth.py). Each has a base policy committed beside this file, so `oarctl` runs end to end offline:
`base_policy/` (policy.path `toy`), `chains_policy/` (policy.path `toy-chains`) and
`chains_wide_policy/` (`toy-chains-wide`, the chains world with 5-6 distractor steps); the
json in each folder holds the command that rebuilds it (`oarctl toy build [--family chains]`).
"""
from __future__ import annotations

from pathlib import Path

from oarctl.errors import OarError

BASE_POLICY_DIR = Path(__file__).resolve().parent / "base_policy"
CHAINS_POLICY_DIR = Path(__file__).resolve().parent / "chains_policy"
WIDE_POLICY_DIR = Path(__file__).resolve().parent / "chains_wide_policy"
EMBEDDED_POLICIES = {"toy": "arithmetic", "toy-chains": "chains", "toy-chains-wide": "chains_wide"}  # policy.path -> the family it was trained on


def policy_folder(family: str) -> Path:
    """Where the shipped policy of a task family lives (read at call time: tests move them)."""
    return {"arithmetic": BASE_POLICY_DIR, "chains": CHAINS_POLICY_DIR, "chains_wide": WIDE_POLICY_DIR}[family]


def base_policy_dir(name: str = "toy") -> Path:
    """The shipped checkpoint's directory; a clear error (not a hub lookup) when it is missing."""
    family = EMBEDDED_POLICIES[name]
    folder = policy_folder(family)
    if not (folder / "model.safetensors").is_file():
        flag = "" if family == "arithmetic" else f" --family {family}"
        raise OarError(f"embedded base policy missing at {folder}; rebuild it with `oarctl toy build{flag}`")
    return folder
