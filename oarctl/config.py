"""Typed configuration: one dataclass per stage section, YAML files, `--set section.key=value`.

Every default lives here and nowhere else. A config is validated once, when loaded: unknown keys,
wrong types and out-of-range values are one-line errors naming the option.
"""
from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from oarctl.errors import OarError


def option(default, help: str):
    """A dataclass field with one line of help (shown by `oarctl config --explain`)."""
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: type(default)(default), metadata={"help": help})
    return field(default=default, metadata={"help": help})


@dataclass
class RunConfig:
    seed: int = option(0, "seed of everything: sampling, attribution noise, data order")
    steps: int = option(20, "number of RL steps (sample -> verify -> attribute -> reshape -> update)")
    eval_every: int = option(0, "evaluate the held-out set every N steps (0: only base and final)")
    keep_checkpoints: int = option(2, "policy checkpoints kept on disk; older ones are pruned (manifests stay)")
    progress: bool = option(True, "show progress bars on long stages")


@dataclass
class DataConfig:
    train: str = option("toy", "training prompts: 'toy' (generated) or a Parquet/JSONL file with problem/answer")
    heldout: str = option("toy", "held-out prompts for evaluate: 'toy' or a Parquet/JSONL file")
    toy_train_size: int = option(4096, "number of generated training problems")
    toy_heldout_size: int = option(256, "number of generated held-out problems (disjoint from train)")
    toy_levels: list = option([1, 2, 3, 4, 5], "difficulty levels of the generated problems (see oarctl/toy/task.py)")


@dataclass
class PolicyConfig:
    path: str = option("toy", "initial policy: 'toy' (embedded tiny model) or a transformers model directory")
    backend: str = option("transformers", "generation backend")
    device: str = option("cpu", "torch device of the policy")
    threads: int = option(0, "torch CPU threads (0: torch's default)")


@dataclass
class SampleConfig:
    prompts_per_step: int = option(32, "prompts drawn per step")
    group_size: int = option(8, "responses sampled per prompt (the GRPO group)")
    temperature: float = option(1.0, "sampling temperature")
    top_p: float = option(1.0, "nucleus sampling threshold")
    max_new_tokens: int = option(64, "maximum response length in tokens")
    batch_size: int = option(128, "sequences generated per forward batch")


@dataclass
class VerifyConfig:
    method: str = option("math", "answer checker: 'math' (extraction + symbolic equivalence, oarctl/verify) "
                                 "or 'boxed' (last \\boxed{} equals the gold text)")
    timeout: float = option(5.0, "seconds per symbolic check; a slower one is killed and scored 0 (verdict 'timeout')")
    workers: int = option(0, "symbolic-check worker processes, started only when needed (0: all cores)")
    memory_mb: int = option(2048, "address-space cap of each worker process, in MiB")


@dataclass
class AttributeConfig:
    method: str = option("uniform", "token attribution method: uniform (plain GRPO), random, entropy, oar_p, oar_g")
    oar_p_mode: str = option("last", "OAR-P outcome: last, answer_mean, answer_joint")
    oar_g_mode: str = option("answer_mean", "OAR-G outcome: last, answer_mean, answer_joint")
    chunk_size: int = option(8, "OAR-P perturbations per forward pass (bounds memory; 4-16 is fastest on CPU)")
    noise_std: float = option(1e-3, "OAR-G Gaussian noise on reasoning embeddings")
    batch_size: int = option(32, "responses per OAR-G / entropy forward pass")


@dataclass
class ReshapeConfig:
    estimator: str = option("grpo", "sequence advantage estimator: grpo, rloo")
    scale: str = option("group", "advantage std scaling: group, batch, none (Dr. GRPO)")
    eps: float = option(1e-6, "added to the std before dividing")
    quantile: float = option(0.25, "Bi-Level threshold quantile q")
    beta: float = option(1.0, "Bi-Level boost: top tokens get weights up to 1+beta")
    floor: float = option(0.1, "Bi-Level floor of suppressed weights")
    preserve_mass: bool = option(True, "rescale weights to sum to the reasoning length")


@dataclass
class UpdateConfig:
    learning_rate: float = option(2e-4, "AdamW learning rate")
    weight_decay: float = option(0.0, "AdamW weight decay")
    clip_low: float = option(0.2, "PPO ratio clip below 1")
    clip_high: float = option(0.2, "PPO ratio clip above 1 (0.28 = clip-higher)")
    kl_coef: float = option(0.0, "k3 KL penalty to the initial policy (0: no reference model loaded)")
    loss_aggregation: str = option("seq-mean-token-mean", "seq-mean-token-mean, token-mean, seq-mean-token-sum-norm")
    epochs: int = option(1, "passes over each batch (PPO iterations) using the stored old log-probs")
    mini_batch_size: int = option(256, "sequences per optimizer step")
    micro_batch_size: int = option(64, "sequences per forward/backward (gradient accumulation)")
    max_grad_norm: float = option(1.0, "gradient clipping norm (0: off)")
    sum_norm_length: int = option(64, "constant divisor of seq-mean-token-sum-norm (Dr. GRPO): the max response length")


@dataclass
class EvaluateConfig:
    samples: int = option(4, "sampled responses per held-out prompt (for avg@k and pass@k)")
    temperature: float = option(1.0, "temperature of the sampled responses (greedy is always measured)")
    top_p: float = option(1.0, "nucleus threshold of the sampled responses")
    max_new_tokens: int = option(64, "maximum response length")
    batch_size: int = option(128, "sequences per generation batch")
    pass_k: list = option([1, 4], "k values of the unbiased pass@k")
    checker: str = option("math", "answer checker for grading (a verify.method name; default limits)")


@dataclass
class Config:
    run: RunConfig = field(default_factory=RunConfig)
    data: DataConfig = field(default_factory=DataConfig)
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    sample: SampleConfig = field(default_factory=SampleConfig)
    verify: VerifyConfig = field(default_factory=VerifyConfig)
    attribute: AttributeConfig = field(default_factory=AttributeConfig)
    reshape: ReshapeConfig = field(default_factory=ReshapeConfig)
    update: UpdateConfig = field(default_factory=UpdateConfig)
    evaluate: EvaluateConfig = field(default_factory=EvaluateConfig)


SECTIONS = {f.name: f.type for f in dataclasses.fields(Config)}


def _section_class(name: str):
    return typing.get_type_hints(Config)[name]


def _coerce(value, expected: type, where: str):
    """Check one value against its declared type; ints are accepted where floats are expected."""
    if expected is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if expected is float and isinstance(value, str):  # YAML 1.1 reads `3e-5` (no dot) as text
        try:
            return float(value)
        except ValueError:
            pass
    if expected is list and isinstance(value, list):
        return value
    if type(value) is not expected:
        raise OarError(f"{where}: expected {expected.__name__}, got {type(value).__name__} {value!r}")
    return value


def _apply(config: Config, section: str, key: str, value, where: str) -> None:
    if section not in SECTIONS:
        raise OarError(f"{where}: unknown section {section!r}; sections: {', '.join(SECTIONS)}")
    part = getattr(config, section)
    hints = typing.get_type_hints(type(part))
    if key not in hints:
        raise OarError(f"{where}: unknown option {section}.{key}; options: {', '.join(hints)}")
    setattr(part, key, _coerce(value, hints[key], f"{where}: {section}.{key}"))


def load_config(path: str | Path | None = None, overrides: list[str] = ()) -> Config:
    """Defaults, then the YAML file, then `section.key=value` overrides (values parsed as YAML)."""
    config = Config()
    if path is not None:
        for section, key, value in _read_yaml(Path(path)):
            _apply(config, section, key, value, str(path))
    for override in overrides:
        section, key, value = _parse_override(override)
        _apply(config, section, key, value, f"--set {override}")
    validate(config)
    return config


def _read_yaml(path: Path):
    if not path.is_file():
        raise OarError(f"{path}: config file not found")
    try:
        document = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as error:
        raise OarError(f"{path}: not valid YAML ({str(error).splitlines()[0]})") from None
    if not isinstance(document, dict):
        raise OarError(f"{path}: expected a mapping of sections at the top level")
    for section, values in document.items():
        if not isinstance(values, dict):
            raise OarError(f"{path}: section {section!r} must be a mapping of options")
        for key, value in values.items():
            yield section, key, value


def _parse_override(override: str) -> tuple[str, str, object]:
    name, sep, raw = override.partition("=")
    section, dot, key = name.strip().partition(".")
    if not sep or not dot or not key:
        raise OarError(f"--set {override}: expected section.key=value")
    try:
        value = yaml.safe_load(raw)
    except yaml.YAMLError:
        value = raw
    return section, key, value


def _check(condition: bool, message: str) -> None:
    if not condition:
        raise OarError(f"config: {message}")


def validate(config: Config) -> None:
    """Range checks that types alone do not catch; names are checked against the registries."""
    _check(config.run.steps >= 0, "run.steps must be >= 0")
    _check(config.run.keep_checkpoints >= 1, "run.keep_checkpoints must be >= 1")
    _check(config.sample.group_size >= 1, "sample.group_size must be >= 1")
    _check(config.sample.prompts_per_step >= 1, "sample.prompts_per_step must be >= 1")
    _check(config.sample.temperature > 0, "sample.temperature must be > 0 for RL sampling")
    _check(0 < config.sample.top_p <= 1, "sample.top_p must be in (0, 1]")
    _check(config.sample.max_new_tokens >= 1, "sample.max_new_tokens must be >= 1")
    _check(config.update.micro_batch_size >= 1, "update.micro_batch_size must be >= 1")
    _check(config.update.mini_batch_size >= config.update.micro_batch_size,
           "update.mini_batch_size must be >= update.micro_batch_size")
    _check(config.update.epochs >= 1, "update.epochs must be >= 1")
    _check(config.update.learning_rate > 0, "update.learning_rate must be > 0")
    modes = ("last", "answer_mean", "answer_joint")
    _check(config.attribute.oar_p_mode in modes, f"attribute.oar_p_mode must be one of {modes}")
    _check(config.attribute.oar_g_mode in modes, f"attribute.oar_g_mode must be one of {modes}")
    _check(config.attribute.chunk_size >= 1, "attribute.chunk_size must be >= 1")
    _check(config.attribute.batch_size >= 1, "attribute.batch_size must be >= 1")
    _check(0 < config.reshape.quantile < 1, "reshape.quantile must be in (0, 1)")
    _check(0 <= config.reshape.floor <= 1, "reshape.floor must be in [0, 1]")
    _check(config.reshape.beta >= 0, "reshape.beta must be >= 0")
    _check(config.reshape.eps > 0, "reshape.eps must be > 0")
    _check(config.evaluate.samples >= 1, "evaluate.samples must be >= 1")
    _check(all(isinstance(k, int) and 1 <= k <= config.evaluate.samples for k in config.evaluate.pass_k),
           "evaluate.pass_k values must be integers between 1 and evaluate.samples")
    _check(config.policy.backend in ("transformers",), "policy.backend must be 'transformers'")
    _check(config.run.seed >= 0, "run.seed must be >= 0")
    _check(config.policy.threads >= 0, "policy.threads must be >= 0")
    _check(config.sample.batch_size >= 1, "sample.batch_size must be >= 1")
    _check(config.evaluate.batch_size >= 1, "evaluate.batch_size must be >= 1")
    _check(config.evaluate.max_new_tokens >= 1, "evaluate.max_new_tokens must be >= 1")
    _check(config.update.sum_norm_length >= 1, "update.sum_norm_length must be >= 1")
    _check(config.verify.timeout > 0, "verify.timeout must be > 0")
    _check(config.verify.workers >= 0, "verify.workers must be >= 0")
    _check(config.verify.memory_mb >= 256, "verify.memory_mb must be >= 256")
    _check_names(config)


def _check_names(config: Config) -> None:
    """Registry names, checked at load so a typo fails before any stage runs."""
    from oarctl.advantages import ADVANTAGE_ESTIMATORS
    from oarctl.attribution import ATTRIBUTION_METHODS
    from oarctl.losses import LOSS_AGGREGATIONS
    from oarctl.verify import CHECKERS

    for option_name, value, registry in (
            ("attribute.method", config.attribute.method, ATTRIBUTION_METHODS),
            ("reshape.estimator", config.reshape.estimator, ADVANTAGE_ESTIMATORS),
            ("update.loss_aggregation", config.update.loss_aggregation, LOSS_AGGREGATIONS),
            ("verify.method", config.verify.method, CHECKERS),
            ("evaluate.checker", config.evaluate.checker, CHECKERS)):
        _check(value in registry, f"{option_name}: unknown {registry.kind} {value!r}; "
                                  f"choose one of: {', '.join(registry.names())}")


def section_dict(config: Config, section: str) -> dict:
    return dataclasses.asdict(getattr(config, section))


def to_dict(config: Config) -> dict:
    return dataclasses.asdict(config)


def explain() -> str:
    """Every option with its default and help, for `oarctl config --explain`."""
    lines = []
    for section in SECTIONS:
        cls = _section_class(section)
        lines.append(f"{section}:")
        for f in dataclasses.fields(cls):
            default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
            lines.append(f"  {f.name}: {default!r:<24} # {f.metadata.get('help', '')}")
    return "\n".join(lines)
