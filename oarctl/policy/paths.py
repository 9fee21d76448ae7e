"""Where a policy's files are: `policy.path` resolved to a folder on this machine.

`policy.path` names an embedded toy policy (oarctl/toy, built on first use), a local folder, or a
Hugging Face model repository (`owner/name`, fetched into the Hugging Face cache unless
HF_HUB_OFFLINE is set; only safetensors weights, configs and tokenizer files, never pickled weights).
"""
from __future__ import annotations

from pathlib import Path

from oarctl.errors import OarError


def resolve_policy_path(path: str) -> Path:
    from oarctl.toy import EMBEDDED_POLICIES, base_policy_dir

    if path in EMBEDDED_POLICIES:
        return base_policy_dir(path)
    if not Path(path).exists() and _is_hub_name(path):
        return _hub_snapshot(path)
    return Path(path)


def _is_hub_name(path: str) -> bool:
    """`owner/name` that is not a local path: a Hugging Face model repository."""
    owner, slash, name = path.partition("/")
    return bool(slash and owner and name) and "/" not in name and not path.startswith((".", "~"))


def _hub_snapshot(repo_id: str) -> Path:
    """The model's files in the Hugging Face cache (downloaded unless HF_HUB_OFFLINE is set).
    Only safetensors weights, configs and tokenizer files: pickled weights are never fetched."""
    from huggingface_hub import snapshot_download

    try:
        return Path(snapshot_download(repo_id, allow_patterns=["*.json", "*.safetensors", "*.txt", "*.model",
                                                               "*.jinja", "*.tiktoken"]))
    except Exception as error:  # noqa: BLE001 - hub errors come in many types; all mean "not available"
        first = (str(error).splitlines() or [type(error).__name__])[0]
        raise OarError(f"policy.path: cannot fetch Hugging Face model {repo_id!r} ({first})") from None
