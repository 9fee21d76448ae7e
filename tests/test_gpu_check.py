"""bench/gpu_check.py: the CPU-runnable parts (--tiny) and its fail-fast message without CUDA."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).resolve().parents[1] / "bench" / "gpu_check.py"


def _run(*args, timeout=300):
    return subprocess.run([sys.executable, str(SCRIPT), *map(str, args)], capture_output=True, text=True,
                          timeout=timeout)


def _rows(stdout: str) -> dict[str, str]:
    """{row name: its line} of the table between the header and the total."""
    lines = stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("stage "))
    return {re.split(r"\s{2,}", line)[0]: line for line in lines[start + 1:] if not line.startswith("total ")}


def test_tiny_runs_every_stage_of_a_step_and_the_long_attribution_on_cpu(tmp_path):
    result = _run("--tiny", "--workdir", tmp_path, "--prompts", "2", "--group", "2", "--tokens", "8",
                  "--long-tokens", "48", "--chunk", "8")
    assert result.returncode == 0, result.stderr[-2000:]
    rows = _rows(result.stdout)
    step = ["sample", "verify", "attribute_oar_g", "attribute_oar_p_span", "reshape", "update", "update_fsdp_x2"]
    long = ["long_verify", "long_attribute_oar_g", "long_attribute_oar_p_span", "long_attribute_oar_p_screened",
            "long_attribute_oar_p", *(f"long_attribute_{m} vs oar_p" for m in ("oar_g", "oar_p_span", "oar_p_screened")),
            "long_reshape", "long_update"]
    assert list(rows) == step + long
    assert "4 responses" in rows["long_attribute_oar_g"] and "2 responses" in rows["long_attribute_oar_p"]
    assert "top-20% recall" in rows["long_attribute_oar_p_span vs oar_p"]
    assert (tmp_path / "policy_next" / "checkpoint.json").exists()
    assert (tmp_path / "long_policy_next" / "checkpoint.json").exists()
    difference = float(rows["update_fsdp_x2"].rsplit(" ", 1)[-1])
    # random weights earn ~no reward, so this checks FSDP's gather and save, not training equivalence
    # (tests/test_accelerate.py does that on a batch with mixed rewards)
    assert difference < 1e-5


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is present: the full check would run")
def test_without_cuda_it_fails_fast_with_one_line():
    result = _run(timeout=120)
    assert result.returncode != 0
    assert result.stderr.strip().splitlines()[-1].startswith("error: bench/gpu_check.py needs a CUDA GPU")
