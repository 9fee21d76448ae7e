"""A config file reduced to what the arithmetic reads: the config's sections over oarctl's defaults,
`--set` overrides, the model shape and the response lengths; and what its accelerate config says."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import yaml

from oarctl.config import Config

from bench.scaling.lengths import Lengths, response_lengths
from bench.scaling.model import Shape, shape_of

ROOT = Path(__file__).resolve().parents[2]  # the repository: configs/ and the accelerate configs' paths


@dataclass(frozen=True)
class Setting:
    """A config file reduced to what the arithmetic reads."""
    path: str
    shape: Shape
    config: Config
    lengths: Lengths
    mixed_fraction: float  # assumed share of groups with mixed rewards (skip_uniform_groups scores only those)


def accelerate_processes(path: str, default: int) -> int:
    file = ROOT / path
    if not path or not file.is_file():
        return 1 if not path else default
    return int((yaml.safe_load(file.read_text()) or {}).get("num_processes", default))


def accelerate_kind(path: str) -> str:
    if not path:
        return "none"
    file = ROOT / path
    settings = yaml.safe_load(file.read_text()) if file.is_file() else {}
    return {"FSDP": "fsdp", "DEEPSPEED": "zero3"}.get(settings.get("distributed_type"), "ddp")


def _set(config: Config, section: str, key: str, value, where: str) -> None:
    part = getattr(config, section, None)
    if part is None or not hasattr(part, key):
        raise SystemExit(f"{where}: unknown option {section}.{key}")
    setattr(part, key, value)


def apply_overrides(config: Config, overrides) -> None:
    """`section.key=value` strings (YAML values) onto `config`, as `oarctl --set` reads them."""
    for override in overrides:
        name, _, raw = override.partition("=")
        section, _, key = name.strip().partition(".")
        _set(config, section, key, yaml.safe_load(raw), f"--set {override}")


def load_setting(path: Path, shape: Shape | None, lengths_args, mixed_fraction: float, overrides=()) -> Setting:
    """The config's sections over the defaults (oarctl.config's dataclasses), then `section.key=value`
    overrides. tests/test_configs_real.py validates the files themselves; this does not import the
    registries, so it needs no torch."""
    config = Config()
    for section, values in (yaml.safe_load(path.read_text()) or {}).items():
        for key, value in (values or {}).items():
            _set(config, section, key, value, str(path))
    apply_overrides(config, overrides)
    lengths = response_lengths(config.sample.prompts_per_step * config.sample.group_size, config.sample.group_size,
                               lengths_args.prompt_tokens, lengths_args.mean_response, config.sample.max_new_tokens,
                               lengths_args.sigma)
    name = str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)
    return Setting(name, shape or shape_of(config.policy.path), config, lengths, mixed_fraction)
