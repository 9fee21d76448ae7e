"""The embedded toy world: arithmetic task, char-level tokenizer, tiny Qwen2, shipped base policy.

The base policy is committed under `base_policy/` so `oarctl` runs end to end offline with no
download; `python -m oarctl.toy.pretrain --out oarctl/toy/base_policy --seed 0` rebuilds it.
"""
from __future__ import annotations

from pathlib import Path

from oarctl.errors import OarError

BASE_POLICY_DIR = Path(__file__).resolve().parent / "base_policy"


def base_policy_dir() -> Path:
    """The shipped checkpoint's directory; a clear error (not a hub lookup) when it is missing."""
    if not (BASE_POLICY_DIR / "model.safetensors").is_file():
        raise OarError(f"embedded base policy missing at {BASE_POLICY_DIR}; "
                       "rebuild it with `oarctl toy build`")
    return BASE_POLICY_DIR
