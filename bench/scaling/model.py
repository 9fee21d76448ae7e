"""Model shapes, the hardware, and the constants of a response and of the attribution methods."""
from __future__ import annotations

from dataclasses import dataclass

GB = 1e9
CONCLUDE_TOKENS, ANSWER_TOKENS, CLOSING_TOKENS = 4, 4, 2  # `\boxed{`, the answer, `}` + eos
METHODS = ("uniform", "random", "entropy", "oar_p", "oar_p_span", "oar_p_screened", "oar_g", "oar_flow",
           "oar_flow_span", "oar_flow_local", "entropy_mask", "ktae")  # the registry, but:
# the truth methods read labels only the chains toy world has; mc_value (sampled continuations) is not modelled
NOT_MODELLED = ("truth", "truth_shuffled", "truth_last", "mc_value")
OAR_P_FAMILY = ("oar_p", "oar_p_span", "oar_p_screened", "oar_flow", "oar_flow_span")
FLOW_LOGIT_TOKENS = 1024  # oarctl.attribution.flow.LOGIT_TOKENS: rows x positions projected at once


# ---- model shapes --------------------------------------------------------------------------------

@dataclass(frozen=True)
class Shape:
    name: str
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int
    vocab: int
    tied: bool

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads


# From the models' config.json. Qwen2.5-7B (and -Math-7B) pad their vocabulary to 152,064 rows;
# the 1.5B models have 151,936 (the tokenizer's 151,665 tokens either way).
SHAPES = {
    "7b": Shape("Qwen2.5-7B", 3584, 28, 28, 4, 18944, 152064, False),
    "1.5b": Shape("Qwen2.5-1.5B", 1536, 28, 12, 2, 8960, 151936, True),
}


def shape_of(policy_path: str) -> Shape:
    name = policy_path.lower()
    for key in ("1.5b", "7b"):
        if f"-{key}" in name:
            return SHAPES[key]
    raise SystemExit(f"{policy_path}: no known shape in the name; pass --shape 7b or --shape 1.5b")


# ---- hardware ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Hardware:
    gpus: int
    tflops: float  # dense bf16 peak
    fp32_tflops: float  # plain fp32 (PyTorch's default: no TF32 in matmuls)
    memory_gb: float
    hbm_tbps: float
    nvlink_gbps: float  # per GPU, one direction
    efficiency: float  # share of every peak that every kernel reaches
    overhead_gb: float  # per GPU and process: CUDA context, cuBLAS/NCCL workspaces

    def peak(self, dtype: str) -> float:
        return (self.tflops if dtype == "bfloat16" else self.fp32_tflops) * 1e12


def dtype_bytes(dtype: str) -> int:
    return 2 if dtype in ("bfloat16", "float16") else 4
