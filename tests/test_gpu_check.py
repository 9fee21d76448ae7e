"""bench/gpu_check.py (its parts in bench/gpu_parts/): the CPU-runnable parts (--tiny), its report of the
engine-reuse check on given metrics, and its fail-fast message without CUDA."""
from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from oarctl.checkpoints import policy_identity

SCRIPT = Path(__file__).resolve().parents[1] / "bench" / "gpu_check.py"
sys.path.insert(0, str(SCRIPT.parents[1]))

from bench import gpu_check  # noqa: E402
from bench.gpu_parts.rows import note  # noqa: E402
from bench.gpu_parts.twostep import engine_reuse_verdict  # noqa: E402


def _run(*args, timeout=300):
    return subprocess.run([sys.executable, str(SCRIPT), *map(str, args)], capture_output=True, text=True,
                          timeout=timeout)


LOG_LINE = re.compile(r"^\[\d{4}-\d\d-\d\d[ T]")


def _rows(stdout: str) -> dict[str, str]:
    """{row name: its line} of the table between the header and the total."""
    lines = stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("stage "))
    # launched ranks share the stdout: a library's log line (DeepSpeed's "[2026-...] [WARNING] ...") is not a row
    return {re.split(r"\s{2,}", line)[0]: line for line in lines[start + 1:]
            if not line.startswith("total ") and not LOG_LINE.match(line)}


def test_tiny_runs_every_stage_of_a_step_and_the_long_attribution_on_cpu(tmp_path):
    result = _run("--tiny", "--workdir", tmp_path, "--prompts", "2", "--group", "2", "--tokens", "8",
                  "--long-tokens", "48", "--chunk", "8", "--parts", "step", "long")
    assert result.returncode == 0, result.stderr[-2000:]
    rows = _rows(result.stdout)
    step = ["sample", "verify", "attribute_oar_g", "attribute_oar_p_span", "reshape", "update", "update_fsdp_x2",
            "update_persistent_request1", "update_persistent_request2"]
    methods = ("oar_g", "oar_p_span", "oar_p_screened", "oar_flow_local")
    long = ["long_verify", *(f"long_attribute_{m}" for m in methods), "long_attribute_oar_p",
            *(f"long_attribute_{m} vs oar_p" for m in methods), "long_reshape", "long_update"]
    assert list(rows) == step + long
    assert "4 responses" in rows["long_attribute_oar_g"] and "2 responses" in rows["long_attribute_oar_p"]
    assert "top-20% recall" in rows["long_attribute_oar_p_span vs oar_p"]
    assert (tmp_path / "policy_next" / "checkpoint.json").exists()
    assert (tmp_path / "long_policy_next" / "checkpoint.json").exists()
    difference = float(re.search(r"differ from the in-process update by (\S+);", rows["update_fsdp_x2"]).group(1))
    # random weights earn ~no reward, so this checks FSDP's gather and save, not training equivalence
    # (tests/test_accelerate.py does that on a batch with mixed rewards)
    assert difference < 1e-5
    # the persistent worker: its first request loads and gives the one-shot launch's weights, the second
    # trains on from what the ranks kept, reading nothing
    first, second = rows["update_persistent_request1"], rows["update_persistent_request2"]
    assert "resident 0" in first and float(re.search(r"weight_difference (\S+)", first).group(1)) == 0.0
    assert "resident 1" in second and "checkpoint_bytes_read 0" in second


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is present: the full check would run")
def test_without_cuda_it_fails_fast_with_one_line():
    result = _run(timeout=120)
    assert result.returncode != 0
    assert result.stderr.strip().splitlines()[-1].startswith("error: bench/gpu_check.py needs a CUDA GPU")


def test_tiny_runs_two_steps_in_a_row_and_says_the_engine_check_is_skipped_without_vllm(tmp_path):
    result = _run("--tiny", "--workdir", tmp_path, "--prompts", "2", "--group", "2", "--tokens", "8",
                  "--parts", "twostep")
    assert result.returncode == 0, result.stderr[-2000:]
    rows = _rows(result.stdout)
    stages = ["sample", "rest_engines", "verify", "attribute_oar_g", "reshape", "update"]
    assert list(rows) == [f"twostep{n}_{s}" for n in (1, 2) for s in stages] + ["twostep engine"]
    assert "engine-reuse check is skipped" in rows["twostep engine"]
    assert re.search(r"checkpoint written in [\d.]+ s, hashed in [\d.]+ s", rows["twostep2_update"])
    first, second = tmp_path / "twostep" / "step_0", tmp_path / "twostep" / "step_1"
    assert (second / "policy" / "canary.json").exists() and (second / "policy" / "checkpoint.json").exists()
    sampled = json.loads((second / "rollouts.parquet.manifest.json").read_text())["key_parts"]
    assert sampled["inputs"]["policy"] == policy_identity(first / "policy") and sampled["step"] == 1


def test_every_part_runs_by_default_and_twostep_can_be_chosen_alone():
    assert gpu_check._arguments([]).parts == ["step", "long", "twostep", "trl"]
    assert gpu_check._arguments(["--parts", "twostep"]).parts == ["twostep"]
    with pytest.raises(SystemExit):
        gpu_check._arguments(["--parts", "three"])


REUSED = {"responses": 128, "response_length_mean": 200.0, "engine": "reloaded", "engine_load_seconds": 3.2,
          "canary_seconds": 0.04, "canary_failures": 0}


def test_the_engine_verdict_passes_only_an_in_place_reload_that_passed_the_canary():
    verdict = engine_reuse_verdict
    assert verdict("vllm", REUSED) == (True, "engine kept: new weights loaded in place in 3.2 s, canary 0.04 s")
    ok, line = verdict("vllm", {**REUSED, "engine": "built"})
    assert not ok and line.startswith("engine NOT kept: built")
    assert not verdict("vllm", {**REUSED, "engine": "built", "canary_failures": 1})[0]
    assert not verdict("vllm", {**REUSED, "canary_failures": 1})[0]
    assert verdict("transformers", {"responses": 4})[0]


def test_the_report_shows_the_overhead_of_each_part():
    assert note("twostep2_sample", 10.0, REUSED) == \
        "25600 tokens, 2560 tokens/s; engine reloaded (3.2 s), canary 0.04 s"
    assert note("sample", 10.0, {"responses": 2, "response_length_mean": 5.0}) == "10 tokens, 1 tokens/s"
    update = {"checkpoint_write_seconds": 4.0, "checkpoint_hash_seconds": 1.5, "checkpoint_bytes_written": 2**31}
    assert note("twostep2_update", 60.0, update) == "checkpoint written in 4.0 s, hashed in 1.5 s (2.00 GiB)"
    assert note("twostep engine", float("nan"), {"verdict": "engine NOT kept: built", "ok": False}) == \
        "FAILED: engine NOT kept: built"


def test_tiny_runs_the_trl_part_under_fsdp_on_two_cpu_ranks(tmp_path):
    """Part trl: examples/trl_oar.py on the random policy under accelerate's FSDP (here cpu-fsdp-2proc-trl.yaml;
    on a GPU fsdp.yaml with one process, then with vLLM colocate generation when installed). ~40-80 s."""
    result = _run("--tiny", "--workdir", tmp_path, "--parts", "trl")
    assert result.returncode == 0, result.stderr[-2000:]
    rows = _rows(result.stdout)
    assert list(rows) == ["trl_fsdp_x2"]
    assert "2 steps in" in rows["trl_fsdp_x2"] and re.search(r"on 2 processes on \w+, FSDP;", rows["trl_fsdp_x2"])
    assert (tmp_path / "trl-oar-fsdp" / "step_0001" / "advantages.parquet").is_file()
