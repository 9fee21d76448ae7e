"""Every oarctl config shipped under configs/ (recursively) loads and validates, so none rots.

configs/accelerate/ holds `accelerate launch` configs, not oarctl configs: they are only checked to
be YAML mappings. Loading validates options, ranges, registry names and the prompt template; it
reads no data files, so these tests need neither ../shared nor a GPU.
"""
from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from oarctl.config import load_config

CONFIGS = Path(__file__).parent.parent / "configs"
ACCELERATE = CONFIGS / "accelerate"
ALL = sorted(CONFIGS.rglob("*.yaml"))
OARCTL = [p for p in ALL if ACCELERATE not in p.parents]
REAL_SIZE = sorted(CONFIGS.glob("qwen2.5*/*.yaml"))


def _id(path: Path) -> str:
    return str(path.relative_to(CONFIGS))


@pytest.mark.parametrize("path", OARCTL, ids=_id)
def test_every_config_loads_and_says_how_to_run_it(path):
    load_config(path)
    header = path.read_text().split("\n", 1)[0]
    assert header.startswith("#"), "each config starts with a comment"
    assert f"configs/{_id(path)}" in path.read_text(), "the header gives the command that runs this file"


@pytest.mark.parametrize("path", sorted(ACCELERATE.glob("*.yaml")), ids=_id)
def test_accelerate_configs_are_yaml_mappings(path):
    assert isinstance(yaml.safe_load(path.read_text()), dict)


def test_the_real_size_configs_exist():
    names = {_id(p) for p in REAL_SIZE}
    assert names == {f"{model}/{method}.yaml" for model in ("qwen2.5-math-7b", "qwen2.5-7b")
                     for method in ("grpo", "oar-g", "oar-p")}


@pytest.mark.parametrize("path", REAL_SIZE, ids=_id)
def test_real_size_settings(path):
    config = load_config(path)
    assert (config.sample.group_size, config.sample.prompts_per_step) == (8, 128)
    assert config.sample.temperature == 1.0 and config.sample.max_new_tokens == 3072
    assert config.update.learning_rate == 1e-6 and config.update.kl_coef == 0.0
    assert config.data.levels == [3, 4, 5] and config.data.prompt_template == "qwen25-math-cot"
    assert set(config.evaluate.benchmarks) == {"math500", "aime2024", "aime2025", "amc2023", "minerva_math",
                                               "olympiadbench", "gsm8k"}
    assert config.policy.path in ("Qwen/Qwen2.5-Math-7B", "Qwen/Qwen2.5-7B")
    assert config.vllm.data_parallel_size == 8 and config.policy.backend == "vllm"
    assert (CONFIGS.parent / config.update.accelerate_config) == ACCELERATE / "fsdp.yaml"  # run launches FSDP
    method = path.stem.replace("-", "_").replace("grpo", "uniform")
    # oar-p.yaml runs a variant of OAR-P that finishes within a step (exact oar_p is a comment away)
    variants = {"oar_p": ("oar_p", "oar_p_span", "oar_p_screened")}.get(method, (method,))
    assert config.attribute.method in variants
