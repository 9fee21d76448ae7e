"""The vLLM canary's reference (oarctl.policy.canary), CPU only, no vllm needed: what it holds, that an
update writes it into the checkpoint, and that a missing, unlisted, tampered or malformed one is refused."""
from __future__ import annotations

import json
import math

import pytest

from oarctl.checkpoints import load_policy, save_policy
from oarctl.contract import Policy
from oarctl.errors import OarError
from oarctl.policy import canary, transformers_backend


@pytest.fixture(scope="module")
def loaded(tiny_policy):
    return load_policy(tiny_policy)


@pytest.fixture
def checkpoint(tmp_path, loaded):
    """A checkpoint folder as the update job writes it: canary.json listed in checkpoint.json."""
    model, tokenizer = loaded
    folder = tmp_path / "policy"
    save_policy(model, tokenizer, folder, extra_files=[lambda d: canary.write_reference(model, tokenizer, d)])
    return folder


@pytest.fixture(autouse=True)
def no_cached_references(monkeypatch):
    monkeypatch.setattr(canary, "_references", {})


def test_the_reference_is_the_greedy_continuation_and_its_teacher_forced_logprobs(loaded):
    model, tokenizer = loaded
    reference = canary.compute_reference(model, tokenizer)
    prompt = canary.canary_prompt(tokenizer)
    greedy = transformers_backend.generate(model, tokenizer, [prompt], temperature=0, top_p=1.0,
                                           max_new_tokens=canary.REFERENCE_TOKENS, seed=0)[0]
    assert reference["prompt_token_ids"] == prompt and reference["token_ids"] == greedy.token_ids
    assert 0 < len(reference["token_ids"]) <= canary.REFERENCE_TOKENS
    # greedy decoding reports log_softmax(logits) at temperature 1 of the same tokens, step by step
    assert max(abs(a - b) for a, b in zip(reference["logprobs"], greedy.logprobs)) < 1e-4
    assert reference["dtype"] == "float32" and reference["version"] == canary.VERSION
    assert canary.validate(json.loads(json.dumps(reference)), "x") == reference


def test_a_model_assembled_on_meta_from_gathered_weights_gives_the_same_reference(tiny_policy, loaded):
    """What an update under FSDP holds on rank 0 (training.save._plain_model): no rotary buffers until the
    reference recomputes them."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    model, tokenizer = loaded
    with torch.device("meta"):
        plain = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(tiny_policy))
    plain.load_state_dict({k: v.clone() for k, v in model.state_dict().items()}, strict=False, assign=True)
    plain.tie_weights()
    assert any(buffer.is_meta for buffer in plain.buffers())
    assert canary.compute_reference(plain, tokenizer) == canary.compute_reference(model, tokenizer)


def test_a_checkpoint_carries_its_reference_listed_in_checkpoint_json(checkpoint, loaded):
    recorded = json.loads((checkpoint / "checkpoint.json").read_text())["files"]
    assert canary.FILE in recorded
    assert canary.reference_for(Policy(checkpoint)) == canary.compute_reference(*loaded)


def test_a_checkpoint_without_a_reference_says_how_to_get_one(checkpoint, loaded):
    model, tokenizer = loaded
    old = checkpoint.parent / "old"
    save_policy(model, tokenizer, old)  # as written before the reference moved into checkpoints
    with pytest.raises(OarError, match=r"old: no canary reference \(canary.json\); .* rerun the update .* --force"):
        canary.reference_for(Policy(old))
    (old / canary.FILE).write_text((checkpoint / canary.FILE).read_text())  # added afterwards: not vouched for
    with pytest.raises(OarError, match=r"old/canary.json: not listed in checkpoint.json"):
        canary.reference_for(Policy(old))


def test_a_tampered_reference_is_refused_by_its_recorded_hash(checkpoint):
    reference = json.loads((checkpoint / canary.FILE).read_text())
    reference["logprobs"][0] -= 0.5
    (checkpoint / canary.FILE).write_text(json.dumps(reference, sort_keys=True))
    with pytest.raises(OarError, match="checkpoint file canary.json does not match its recorded hash"):
        canary.reference_for(Policy(checkpoint))


def test_the_engine_side_verifies_what_engines_read_and_not_the_optimizer_state(tmp_path, loaded):
    model, tokenizer = loaded
    folder = tmp_path / "policy"
    save_policy(model, tokenizer, folder, extra_files=[lambda d: canary.write_reference(model, tokenizer, d),
                                                       lambda d: (d / "optimizer-00001.safetensors").write_bytes(b"x")])
    (folder / "optimizer-00001.safetensors").write_bytes(b"y")  # not read by engines: not hashed for them
    assert canary.reference_for(Policy(folder))["version"] == canary.VERSION
    canary._references.clear()
    with open(folder / "model.safetensors", "r+b") as weights:
        weights.seek(-1, 2)
        weights.write(b"!")
    with pytest.raises(OarError, match="checkpoint file model.safetensors does not match its recorded hash"):
        canary.reference_for(Policy(folder))


def _valid() -> dict:
    return {"version": 1, "problem": "p", "prompt_token_ids": [1, 2], "token_ids": [3, 4], "logprobs": [-0.1, -2.0],
            "dtype": "float32"}


@pytest.mark.parametrize("change, message", [
    ({"version": 2}, "version 2, expected 1"),
    ({"prompt_token_ids": []}, "prompt_token_ids must be 1 to"),
    ({"token_ids": [3, "4"]}, "token_ids must be 1 to 16 token ids"),
    ({"token_ids": [3, True]}, "token_ids must be"),
    ({"token_ids": [3, -4]}, "token_ids must be"),
    ({"token_ids": list(range(17)), "logprobs": [-1.0] * 17}, "token_ids must be 1 to 16"),
    ({"logprobs": [-0.1]}, "one finite log-prob <= 0 per token id"),
    ({"logprobs": [-0.1, math.nan]}, "one finite log-prob"),
    ({"logprobs": [-0.1, 0.5]}, "one finite log-prob"),
    ({"dtype": None}, "dtype must be a string"),
])
def test_a_malformed_reference_is_one_clear_error(change, message):
    with pytest.raises(OarError, match=f"^where: not a canary reference \\(.*{message}"):
        canary.validate({**_valid(), **change}, "where")


def test_unreadable_reference_files_are_refused(tmp_path):
    path = tmp_path / canary.FILE
    path.write_text("{not json")
    with pytest.raises(OarError, match=r"canary.json: not a canary reference \(invalid JSON"):
        canary.read_reference(tmp_path)
    path.write_text(json.dumps([1, 2]))
    with pytest.raises(OarError, match="not a JSON object"):
        canary.read_reference(tmp_path)
    path.write_text(" " * (2 << 20))
    with pytest.raises(OarError, match="larger than"):
        canary.read_reference(tmp_path)


def test_a_folder_we_did_not_write_gets_its_reference_from_a_subprocess_once(tiny_policy, loaded, monkeypatch):
    """The reference of a folder without checkpoint.json is computed outside this process, and once."""
    computed = canary.computed_in_subprocess(tiny_policy, "cpu")
    assert computed == canary.compute_reference(*loaded)
    calls = []
    monkeypatch.setattr(canary, "computed_in_subprocess", lambda path, device: calls.append(path) or computed)
    assert canary.reference_for(Policy(tiny_policy)) == computed
    assert canary.reference_for(Policy(tiny_policy)) == computed
    assert calls == [tiny_policy]


def test_the_subprocess_names_the_folder_it_could_not_read(tmp_path):
    (tmp_path / "model.safetensors").write_bytes(b"not safetensors")
    with pytest.raises(OarError, match=f"^{tmp_path}: cannot load the"):
        canary.computed_in_subprocess(tmp_path, "cpu")


def test_canary_tokens_cannot_exceed_the_stored_reference():
    from oarctl.config import load_config

    assert load_config(None, ["vllm.canary_tokens=16"]).vllm.canary_tokens == 16
    with pytest.raises(OarError, match=r"vllm.canary_tokens must be in \[0, 16\]"):
        load_config(None, ["vllm.canary_tokens=17"])


def test_the_weight_files_are_checked_apart_while_the_rest_is_checked_first(checkpoint):
    """reference_with_weight_check verifies canary.json, the configs and the tokenizer before it
    returns, and the weight files in a started check that raises on a modified one and releases
    what loaded them."""
    from oarctl.policy import vllm_backend

    data = bytearray((checkpoint / "model.safetensors").read_bytes())
    data[-1] ^= 1
    (checkpoint / "model.safetensors").write_bytes(bytes(data))
    reference, check = canary.reference_with_weight_check(Policy(checkpoint))
    assert reference == canary.read_reference(checkpoint)
    released = []
    with pytest.raises(OarError, match="checkpoint file model.safetensors does not match its recorded hash"):
        vllm_backend.awaited(check, lambda: released.append(True))
    assert released == [True]
    (checkpoint / "config.json").write_text((checkpoint / "config.json").read_text() + " ")
    with pytest.raises(OarError, match="checkpoint file config.json does not match its recorded hash"):
        canary.reference_with_weight_check(Policy(checkpoint))  # before any engine may load
