"""Loading a configuration: YAML files, `--set section.key=value`, validation, `oarctl config --explain`.

The dataclasses and every default live in `oarctl.schema`. A config is validated once, when loaded:
unknown keys, wrong types and out-of-range values are one-line errors naming the option. This is the
only module that imports every registry (to check names at load), so modules below the CLI and the
pipeline read the dataclasses from `oarctl.schema`, not from here.
"""
from __future__ import annotations

import dataclasses
import typing
from pathlib import Path

import yaml

from oarctl.errors import OarError
from oarctl.schema import (DEVIATIONS, METHOD_PAGE, REFERENCE_TOKENS, SAVE_DTYPES, SECTIONS, TOY_FAMILIES, Config,
                           FidelityConfig, section_class)
# re-export for one release: oarctl.schema
from oarctl.schema import (KEYED_WHEN_SET, MC_OPTIONS, AttributeConfig, DataConfig, EvaluateConfig,  # noqa: F401
                           LoggingConfig, PolicyConfig, ReshapeConfig, RunConfig, SampleConfig, UpdateConfig,
                           VerifyConfig, VllmConfig, attribute_key, keyed_when_set, option, section_dict, to_dict)


# The top-level key of a run's config.yaml that records where it ran (oarctl/provenance.py): a fact, not a
# setting, so loading a run's config.yaml (`oarctl status`, a launched stage, a user's copy) skips it.
RECORDED = "provenance"


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


def set_option(config: Config, section: str, key: str, value, where: str) -> None:
    """Set one option as a config file would (type checked, unknown names refused); call `validate` after."""
    _apply(config, section, key, value, where)


def check_override(override: str) -> None:
    """One `--set` value alone: its form, a known option and a value of that option's type (the CLI
    checks it before a command runs; `validate` checks the values together when the config loads)."""
    section, key, value = _parse_override(override)
    _apply(Config(), section, key, value, f"--set {override}")


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


def read_yaml_mapping(path: Path, what: str = "config file", mapping: str = "a mapping of sections") -> dict:
    """A YAML file whose top level is a mapping, or a one-line OarError naming the file."""
    if not path.is_file():
        raise OarError(f"{path}: {what} not found")
    try:
        document = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as error:
        raise OarError(f"{path}: not valid YAML ({str(error).splitlines()[0]})") from None
    if not isinstance(document, dict):
        raise OarError(f"{path}: expected {mapping} at the top level")
    return document


def _read_yaml(path: Path):
    document = read_yaml_mapping(path)
    document.pop(RECORDED, None)
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
    _check(config.attribute.max_batch_tokens >= 0, "attribute.max_batch_tokens must be >= 0 (0: off)")
    _check(config.attribute.dtype in ("float32", "bfloat16"), "attribute.dtype must be float32 or bfloat16")
    _check(config.attribute.span_tokens >= 1, "attribute.span_tokens must be >= 1")
    _check(config.attribute.flow_horizon >= 1, "attribute.flow_horizon must be >= 1")
    _check(config.attribute.span_spread in ("even", "oar_g"), "attribute.span_spread must be even or oar_g")
    _check(0 < config.attribute.screen_fraction <= 1, "attribute.screen_fraction must be in (0, 1]")
    _check(0 <= config.attribute.audit_fraction <= 1, "attribute.audit_fraction must be in [0, 1]")
    _check(config.attribute.max_perturbations >= 1, "attribute.max_perturbations must be >= 1")
    _check(config.attribute.mc_samples >= 1, "attribute.mc_samples must be >= 1")
    _check(config.attribute.mc_max_new_tokens >= 1, "attribute.mc_max_new_tokens must be >= 1")
    _check(0 < config.reshape.quantile < 1, "reshape.quantile must be in (0, 1)")
    _check(0 <= config.reshape.top_entropy_quantile <= 1, "reshape.top_entropy_quantile must be in [0, 1]")
    _check(config.attribute.ktae_alpha >= 0 and config.attribute.ktae_beta >= 0
           and config.attribute.ktae_alpha + config.attribute.ktae_beta > 0,
           "attribute.ktae_alpha and attribute.ktae_beta must be >= 0, not both 0")
    _check(config.attribute.ktae_scale > 0, "attribute.ktae_scale must be > 0")
    _check(0 <= config.reshape.floor <= 1, "reshape.floor must be in [0, 1]")
    _check(config.reshape.beta >= 0, "reshape.beta must be >= 0")
    _check(config.reshape.eps > 0, "reshape.eps must be > 0")
    _check(config.evaluate.samples >= 1, "evaluate.samples must be >= 1")
    _check(all(isinstance(k, int) and 1 <= k <= config.evaluate.samples for k in config.evaluate.pass_k),
           "evaluate.pass_k values must be integers between 1 and evaluate.samples")
    _check_backend(config)
    _check(config.run.seed >= 0, "run.seed must be >= 0")
    _check(config.policy.threads >= 0, "policy.threads must be >= 0")
    _check(config.sample.batch_size >= 1, "sample.batch_size must be >= 1")
    _check(config.evaluate.batch_size >= 1, "evaluate.batch_size must be >= 1")
    _check(config.evaluate.max_new_tokens >= 1, "evaluate.max_new_tokens must be >= 1")
    _check(config.update.sum_norm_length >= 1, "update.sum_norm_length must be >= 1")
    _check(config.update.micro_batch_tokens >= 0, "update.micro_batch_tokens must be >= 0 (0: off)")
    _check(config.update.weight_file_mb > 0, "update.weight_file_mb must be > 0")
    _check(not config.update.persistent or bool(config.update.accelerate_config),
           "update.persistent needs update.accelerate_config (an FSDP launcher file): it keeps launched ranks")
    _check(config.update.save_dtype in SAVE_DTYPES, f"update.save_dtype must be one of {', '.join(SAVE_DTYPES)}")
    _check(config.verify.timeout > 0, "verify.timeout must be > 0")
    _check(config.verify.workers >= 0, "verify.workers must be >= 0")
    _check(config.verify.memory_mb >= 256, "verify.memory_mb must be >= 256")
    _check_extraction(config)
    _validate_data_sources(config)
    _validate_fidelity(config.fidelity)
    _check_names(config)
    from oarctl.logging_backends import check_backends
    check_backends(config.logging.backends)


def _check_extraction(config: Config) -> None:
    from oarctl.verify.extract import EXTRACTION_MODES

    for option_name, value in (("verify.extraction", config.verify.extraction),
                               ("evaluate.extraction", config.evaluate.extraction)):
        _check(value in EXTRACTION_MODES, f"{option_name} must be one of {', '.join(EXTRACTION_MODES)}")


def _validate_fidelity(section: FidelityConfig) -> None:
    from oarctl.attribution import ATTRIBUTION_METHODS

    _check(section.sample >= 1, "fidelity.sample must be >= 1")
    _check(section.max_new_tokens >= 1, "fidelity.max_new_tokens must be >= 1")
    _check(section.batch_size >= 1, "fidelity.batch_size must be >= 1")
    _check(section.replacement in ("alternative", "pad"), "fidelity.replacement must be 'alternative' or 'pad'")
    _check(section.reference in ("rollout", "greedy"), "fidelity.reference must be 'rollout' or 'greedy'")
    _check(bool(section.ks) and all(isinstance(k, (int, float)) and not isinstance(k, bool) and 0 < k <= 1
                                    for k in section.ks), "fidelity.ks must be a non-empty list of numbers in (0, 1]")
    _check(bool(section.methods), "fidelity.methods must not be empty")
    for name in section.methods:
        _check(isinstance(name, str) and name in ATTRIBUTION_METHODS,
               f"fidelity.methods: unknown {ATTRIBUTION_METHODS.kind} {name!r}; "
               f"choose one of: {', '.join(ATTRIBUTION_METHODS.names())}")


def _validate_data_sources(config: Config) -> None:
    """Template, level filter and benchmark table: shapes that would fail late inside a stage."""
    from oarctl.templates import resolve

    resolve(config.data.prompt_template)
    _check(config.data.toy_family in TOY_FAMILIES, f"data.toy_family must be one of {', '.join(TOY_FAMILIES)}")
    _check(bool(config.data.chain_lengths) and all(isinstance(n, int) and not isinstance(n, bool) and 1 <= n <= 12
                                                   for n in config.data.chain_lengths),
           "data.chain_lengths must be a non-empty list of integers in 1..12")
    _check(all(isinstance(level, int) and not isinstance(level, bool) for level in config.data.levels),
           "data.levels must be a list of integers")
    for option_name in ("problem_column", "answer_column", "id_column", "train_split", "heldout_split"):
        _check(bool(getattr(config.data, option_name).strip()), f"data.{option_name} must not be empty")
    _check(config.evaluate.limit >= 0, "evaluate.limit must be >= 0")
    for name, source in config.evaluate.benchmarks.items():
        _check(isinstance(name, str) and bool(name) and "/" not in name,
               f"evaluate.benchmarks: name {name!r} must be non-empty text without '/'")
        _check(isinstance(source, str) and bool(source), f"evaluate.benchmarks.{name}: expected a path or hub name")


def _check_backend(config: Config) -> None:
    backends = ("transformers", "vllm", "auto")
    _check(config.policy.backend in backends, f"policy.backend must be one of {backends}")
    _check(config.policy.backend == "transformers" or config.sample.top_p == 1,
           "sample.top_p must be 1 with policy.backend vllm/auto (vLLM's log-probs renormalise over the nucleus)")
    _check(config.vllm.dtype in ("auto", "float32", "bfloat16", "float16"),
           "vllm.dtype must be one of auto, float32, bfloat16, float16")
    _check(config.vllm.tensor_parallel_size >= 1, "vllm.tensor_parallel_size must be >= 1")
    _check(config.vllm.data_parallel_size >= 1, "vllm.data_parallel_size must be >= 1")
    _check(0 < config.vllm.gpu_memory_utilization <= 1, "vllm.gpu_memory_utilization must be in (0, 1]")
    _check(config.vllm.max_model_len >= 0, "vllm.max_model_len must be >= 0")
    _check(config.vllm.cpu_kv_cache_gib >= 1, "vllm.cpu_kv_cache_gib must be >= 1")
    _check(0 <= config.vllm.canary_tokens <= REFERENCE_TOKENS,
           f"vllm.canary_tokens must be in [0, {REFERENCE_TOKENS}] (a checkpoint's canary.json holds "
           f"{REFERENCE_TOKENS} reference tokens)")
    _check(config.vllm.canary_tolerance >= 0, "vllm.canary_tolerance must be >= 0")


def _check_names(config: Config) -> None:
    """Registry names, checked at load so a typo fails before any stage runs."""
    from oarctl.advantages import ADVANTAGE_ESTIMATORS
    from oarctl.attribution import ATTRIBUTION_METHODS
    from oarctl.attribution.flow import FLOW_RULES
    from oarctl.losses import LOSS_AGGREGATIONS
    from oarctl.reshaping import SCORE_NORMALIZERS
    from oarctl.verify import CHECKERS

    for option_name, value, registry in (
            ("attribute.method", config.attribute.method, ATTRIBUTION_METHODS),
            ("reshape.estimator", config.reshape.estimator, ADVANTAGE_ESTIMATORS),
            ("reshape.normalize", config.reshape.normalize, SCORE_NORMALIZERS),
            ("attribute.flow_rule", config.attribute.flow_rule, FLOW_RULES),
            ("update.loss_aggregation", config.update.loss_aggregation, LOSS_AGGREGATIONS),
            ("verify.method", config.verify.method, CHECKERS),
            ("attribute.mc_checker", config.attribute.mc_checker, CHECKERS),
            ("evaluate.checker", config.evaluate.checker, CHECKERS)):
        _check(value in registry, f"{option_name}: unknown {registry.kind} {value!r}; "
                                  f"choose one of: {', '.join(registry.names())}")


def _help(section: str, f: dataclasses.Field) -> str:
    deviation = DEVIATIONS.get(f"{section}.{f.name}")
    help_text = f.metadata.get("help", "")
    return f"{help_text} [deviation from the released code: {deviation}; {METHOD_PAGE}]" if deviation else help_text


def explain() -> str:
    """Every option with its default and help, for `oarctl config --explain`."""
    lines = []
    for section in SECTIONS:
        cls = section_class(section)
        lines.append(f"{section}:")
        for f in dataclasses.fields(cls):
            default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
            lines.append(f"  {f.name}: {default!r:<24} # {_help(section, f)}")
    return "\n".join(lines)
