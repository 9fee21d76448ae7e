"""bench/gpu_check.py: the CPU-runnable parts (--tiny) and its fail-fast message without CUDA."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).resolve().parents[1] / "bench" / "gpu_check.py"


def _run(*args, timeout=300):
    return subprocess.run([sys.executable, str(SCRIPT), *map(str, args)], capture_output=True, text=True,
                          timeout=timeout)


def test_tiny_runs_every_stage_of_a_step_on_cpu(tmp_path):
    result = _run("--tiny", "--workdir", tmp_path, "--prompts", "2", "--group", "2", "--tokens", "8")
    assert result.returncode == 0, result.stderr[-2000:]
    stages = [line.split()[0] for line in result.stdout.splitlines()[2:-1]]
    assert stages == ["sample", "verify", "attribute_oar_g", "attribute_oar_p", "reshape", "update",
                      "update_fsdp_x2"]
    assert (tmp_path / "policy_next" / "checkpoint.json").exists()
    difference = float(result.stdout.splitlines()[-2].rsplit(" ", 1)[-1])
    # random weights earn ~no reward, so this checks FSDP's gather and save, not training equivalence
    # (tests/test_accelerate.py does that on a batch with mixed rewards)
    assert difference < 1e-5


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is present: the full check would run")
def test_without_cuda_it_fails_fast_with_one_line():
    result = _run(timeout=120)
    assert result.returncode != 0
    assert result.stderr.strip().splitlines()[-1].startswith("error: bench/gpu_check.py needs a CUDA GPU")
