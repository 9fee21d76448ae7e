"""TRL's 80/20 entropy mask (Wang et al., arXiv 2506.01939; GRPOConfig.top_entropy_quantile): its scores and
its threshold. Registers `entropy_mask`.

Reads each row's prompt and sampled response token ids and the policy; writes the entropy of the
distribution every response token was sampled from (logits / the row's sampling temperature), on every
response token, as TRL's loss forward computes it. The reshape stage keeps the tokens at or above the
batch's (1 - reshape.top_entropy_quantile)-quantile (`credit_rules.high_entropy_mask`, TRL's threshold):
weight 1, the others 0, no rescaling. OARGRPOTrainer needs no scores: it applies the same mask inside
TRL's loss, on the entropies of TRL's own forward.
"""
from __future__ import annotations

import numpy as np
import torch

from oarctl.attribution.base import ATTRIBUTION_METHODS
from oarctl.attribution.oar import token_entropy_batch


@ATTRIBUTION_METHODS.register("entropy_mask")
def entropy_mask_method(rollouts, table, config, context) -> list[np.ndarray]:
    """Entropy of every response token at the row's sampling temperature (0 -> 1), on the sampled ids."""
    model, _ = context.policy.load()
    temperatures = [t if t and t > 0 else 1.0 for t in table["temperature"].to_pylist()]
    pairs = zip(table["prompt_token_ids"].to_pylist(), table["response_token_ids"].to_pylist())
    items = [(torch.tensor(p + r, dtype=torch.long), (len(p), len(p) + len(r))) for p, r in pairs]
    scores = token_entropy_batch(model, items, temperatures, config.batch_size, config.max_batch_tokens)
    return [s.numpy().astype(np.float32) for s in scores]
