"""The vLLM canary's reference: one fixed prompt, the policy's greedy continuation of it, and the
log-prob of each continuation token under the policy's own weights, computed with transformers once
per checkpoint where the weights already are, so no engine process ever loads a transformers copy.

`canary.json` (a policy checkpoint's file, listed and hashed in its checkpoint.json):
    {"version": 1, "problem": "Compute 12+7.", "prompt_token_ids": [...], "token_ids": [...],
     "logprobs": [...], "dtype": "float32"}
- token_ids: REFERENCE_TOKENS greedy tokens (fewer when eos comes first), from transformers;
- logprobs: log_softmax(logits) at temperature 1 of each of them, teacher-forced (one forward over
  prompt + tokens, `oarctl.policy.logprobs.response_token_stats`), which is what vLLM's prompt
  log-probs are (they skip the sampling processors whatever the logprobs mode);
- dtype: of the weights that computed them (the update job's, in update.save_dtype: the weights the
  engines serve). Under FSDP rank 0 computes it on the CPU copy it saves from: a prefill of the
  prompt, 16 cached decoding steps and one forward over ~50 tokens.

Who computes it:
- the update job, for every checkpoint it writes (`runner._write_outputs`): its rank 0 holds the
  trained model in memory, so the reference costs one short greedy generation and one forward;
- for a policy folder we did not write (no checkpoint.json: the embedded default, a hub snapshot),
  a short-lived `python -m oarctl.policy.canary POLICY_DIR OUTPUT DEVICE` process, once per policy
  identity and process (`reference_for` caches it). A subprocess, not a multiprocessing child: a
  spawned child re-imports the caller's main script, which breaks scripts without a `__main__` guard.
A checkpoint that has checkpoint.json but no canary.json (written before the canary moved here), or
whose canary.json does not match its recorded hash, is an error: the engine would otherwise be
checked against nothing, or against numbers someone edited.
"""
from __future__ import annotations

import json
import math
import subprocess
import sys
import tempfile
from pathlib import Path

from oarctl.errors import OarError
from oarctl.schema import REFERENCE_TOKENS  # vllm.canary_tokens may compare at most this many

CANARY_PROBLEM = "Compute 12+7."
FILE = "canary.json"
VERSION = 1
_MAX_BYTES = 1 << 20  # a reference is ~1 KB; a bigger file is not one of ours
_MAX_PROMPT_TOKENS = 4096
_CACHE_SIZE = 4
_references: dict[str, dict] = {}  # policy identity -> reference, this process's recent ones


def canary_prompt(tokenizer) -> list[int]:
    """The canary problem in the model's chat template, or as plain text for a tokenizer without one."""
    from oarctl.templates import encode

    return encode(tokenizer, CANARY_PROBLEM, "chat" if getattr(tokenizer, "chat_template", None) else "base")


def compute_reference(model, tokenizer, tokens: int = REFERENCE_TOKENS) -> dict:
    """The reference of the weights in `model` (any device, eval mode; gradients are not taken)."""
    import torch

    from oarctl.policy import transformers_backend
    from oarctl.policy.logprobs import teacher_forced_logprobs

    prompt = canary_prompt(tokenizer)
    _materialize_meta_buffers(model)
    with torch.no_grad():
        greedy = transformers_backend.generate(model, tokenizer, [prompt], temperature=0, top_p=1.0,
                                               max_new_tokens=tokens, seed=0)[0]
        logprobs = teacher_forced_logprobs(model, [prompt], [greedy.token_ids], tokenizer.pad_token_id)[0]
    dtype = str(next(model.parameters()).dtype).removeprefix("torch.")
    return {"version": VERSION, "problem": CANARY_PROBLEM, "prompt_token_ids": prompt,
            "token_ids": greedy.token_ids, "logprobs": [float(value) for value in logprobs], "dtype": dtype}


def _materialize_meta_buffers(model) -> None:
    """Give buffers left on the meta device their values. A model assembled from gathered weights on
    the meta device (an update under FSDP: training.save._plain_model) has no non-persistent buffers, e.g.
    the rotary `inv_freq`: save_pretrained never needs them, a forward does. They are recomputed by
    transformers' own initializer, on modules that hold such buffers and no parameters of their own
    (so no weight is ever re-initialised); anything still on meta is a clear error."""
    device = next(model.parameters()).device
    for module in model.modules():
        own_parameters = any(True for _ in module.parameters(recurse=False))
        if any(b.is_meta for b in module.buffers(recurse=False)) and not own_parameters:
            module.to_empty(device=device, recurse=False)
            model._init_weights(module)
    left = [name for name, buffer in model.named_buffers() if buffer.is_meta]
    if left:
        raise OarError(f"canary reference: the model has buffers without values ({', '.join(left[:3])})")


def write_reference(model, tokenizer, directory: Path) -> None:
    """canary.json into a checkpoint folder being written (the runner renames the whole folder)."""
    reference = compute_reference(model, tokenizer)
    (Path(directory) / FILE).write_text(json.dumps(reference, sort_keys=True))


def _token_ids(value, limit: int) -> bool:
    return (isinstance(value, list) and 0 < len(value) <= limit
            and all(type(token) is int and 0 <= token < 2**31 for token in value))


def validate(reference, source) -> dict:
    """`reference` when it has the schema above; else an OarError naming `source`."""
    def refuse(why: str):
        raise OarError(f"{source}: not a canary reference ({why})")

    if not isinstance(reference, dict):
        refuse("not a JSON object")
    if reference.get("version") != VERSION:
        refuse(f"version {reference.get('version')!r}, expected {VERSION}")
    if not _token_ids(reference.get("prompt_token_ids"), _MAX_PROMPT_TOKENS):
        refuse(f"prompt_token_ids must be 1 to {_MAX_PROMPT_TOKENS} token ids")
    if not _token_ids(reference.get("token_ids"), REFERENCE_TOKENS):
        refuse(f"token_ids must be 1 to {REFERENCE_TOKENS} token ids")
    logprobs = reference.get("logprobs")
    if not (isinstance(logprobs, list) and len(logprobs) == len(reference["token_ids"])
            and all(type(value) in (int, float) and math.isfinite(value) and value <= 1e-6 for value in logprobs)):
        refuse("logprobs must be one finite log-prob <= 0 per token id")
    if not isinstance(reference.get("dtype"), str):
        refuse("dtype must be a string")
    return reference


def _parse(path: Path) -> dict:
    if path.stat().st_size > _MAX_BYTES:
        raise OarError(f"{path}: not a canary reference (larger than {_MAX_BYTES} bytes)")
    try:
        document = json.loads(path.read_text())
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise OarError(f"{path}: not a canary reference (invalid JSON: {error})") from None
    return validate(document, path)


def read_reference(directory: Path) -> dict:
    """canary.json of a checkpoint folder, checked; an OarError naming the file when missing or malformed."""
    path = Path(directory) / FILE
    if not path.is_file():
        raise OarError(f"{directory}: no canary reference ({FILE}); the vLLM canary needs one. An update "
                       f"writes it with the checkpoint: rerun the update that wrote this folder with --force")
    return _parse(path)


def _verified_checkpoint_reference(directory: Path, weights: bool = True) -> dict:
    """canary.json of a checkpoint we wrote, after checking what vLLM will read against checkpoint.json
    (weights unless `weights` is False, config, tokenizer, canary.json; each file hashed at most once per
    process)."""
    from oarctl.hashing import MANIFEST, verify_checkpoint

    recorded = json.loads((directory / MANIFEST).read_text())["files"]
    if (directory / FILE).exists() and FILE not in recorded:
        raise OarError(f"{directory / FILE}: not listed in {MANIFEST} (added after the checkpoint was written); "
                       f"rerun the update that wrote this folder with --force")
    verify_checkpoint(directory, lambda name: _read_by_engines(name) and (weights or not _weight_file(name)))
    return read_reference(directory)


def _weight_file(name: str) -> bool:
    return name.startswith("model") and name.endswith(".safetensors")


def reference_with_weight_check(policy):
    """(reference, check): the canary reference with every file the engines read verified except the
    weight files, and `check`, a started hashing.BackgroundCheck of those (None when there is
    nothing to check). The engines may load the weights meanwhile (reading safetensors runs no code),
    but nothing may be generated from them before `check.problem()` said None."""
    from oarctl.hashing import MANIFEST, BackgroundCheck

    directory = Path(policy.path)
    if not (directory / MANIFEST).exists():
        return reference_for(policy), None
    reference = _verified_checkpoint_reference(directory, weights=False)
    recorded = json.loads((directory / MANIFEST).read_text())["files"]
    return reference, BackgroundCheck({directory: [n for n in recorded if _read_by_engines(n) and _weight_file(n)]})


def _read_by_engines(name: str) -> bool:
    """What an engine reads of a checkpoint (vllm_backend.weights_folder leaves out any safetensors file
    that is not the model's), plus canary.json; not the AdamW state or the update log."""
    from oarctl.checkpoints import read_by_loaders

    optimizer = name.endswith(".safetensors") and not name.startswith("model")
    return not optimizer and read_by_loaders(name)


def reference_for(policy) -> dict:
    """The canary reference of a runner.Policy, for the process that starts engines: the checkpoint's
    own (verified), or computed once in a subprocess for a folder we did not write."""
    from oarctl.hashing import MANIFEST

    identity = policy.identity
    if identity not in _references:
        directory = Path(policy.path)
        reference = (_verified_checkpoint_reference(directory) if (directory / MANIFEST).exists()
                     else computed_in_subprocess(directory, policy.device))
        while len(_references) >= _CACHE_SIZE:
            _references.pop(next(iter(_references)))
        _references[identity] = reference
    return _references[identity]


def computed_in_subprocess(directory: Path, device: str) -> dict:
    """The reference of a policy folder, computed by `python -m oarctl.policy.canary` (its transformers
    copy lives and dies in that process)."""
    with tempfile.TemporaryDirectory(prefix="oarctl-canary-") as folder:
        output = Path(folder) / FILE
        finished = subprocess.run([sys.executable, "-m", "oarctl.policy.canary", str(directory), str(output), device],
                                  capture_output=True, text=True)
        if finished.returncode != 0:
            lines = ([line for line in finished.stderr.splitlines() if line.strip()]
                     or [f"exit code {finished.returncode}"])
            message = lines[-1].removeprefix("error: ")
            raise OarError(message if message.startswith(str(directory)) else
                           f"{directory}: cannot compute the canary reference ({message})")
        return _parse(output)


def main(arguments: list[str]) -> int:
    """POLICY_DIR OUTPUT DEVICE: write the reference of POLICY_DIR's weights (float32) to OUTPUT."""
    from oarctl.checkpoints import load_policy

    directory, output, device = arguments
    try:
        model, tokenizer = load_policy(directory, device)
        Path(output).write_text(json.dumps(compute_reference(model.eval(), tokenizer), sort_keys=True))
    except OarError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
