"""bench/credit_candidates.py: the cheap candidates' scores come from the sampler's log-probs on the reasoning
span only, and a `~variant` row is reshaped with its override. Tiny generated rows; no model, no registration
(install() would change the registry of the whole test session)."""
from __future__ import annotations

import math
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pyarrow as pa
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import credit_candidates as candidates  # noqa: E402
from oarctl.config import load_config  # noqa: E402

LOGPROBS = [[-0.1, -2.0, -0.01, -3.0, -0.5], [-1.0, -0.2, -4.0]]
ROLLOUTS = [SimpleNamespace(segments=SimpleNamespace(reasoning=(1, 4)), response_length=5, reasoning=(7, 10),
                            input_ids=None, row=0),
            SimpleNamespace(segments=SimpleNamespace(reasoning=(0, 2)), response_length=3, reasoning=(5, 7),
                            input_ids=None, row=1)]
TABLE = pa.table({"response_logprobs": LOGPROBS, "temperature": [1.0, 0.0]})


def test_confidence_and_surprisal_read_the_sampled_log_probs_on_the_reasoning_only():
    sure = candidates.confidence(ROLLOUTS, TABLE, None, None)
    forks = candidates.surprisal(ROLLOUTS, TABLE, None, None)
    assert np.isnan(sure[0][[0, 4]]).all() and np.isnan(forks[1][2])  # outside the reasoning: NaN, plain advantage
    np.testing.assert_allclose(sure[0][1:4], np.exp([-2.0, -0.01, -3.0]), rtol=1e-6)
    np.testing.assert_allclose(forks[1][:2], [1.0, 0.2], rtol=1e-6)
    assert sure[0].dtype == np.float32 and len(forks[1]) == 3


def test_excess_surprisal_is_surprisal_above_the_entropy_clipped_at_zero(monkeypatch):
    import oarctl.attribution.oar as oar

    seen = {}

    def entropies(model, items, temperatures, batch_size, max_batch_tokens):
        seen["temperatures"] = temperatures
        return [torch.tensor([1.0, 1.0, 1.0]), torch.tensor([0.5, 0.5])]

    monkeypatch.setattr(oar, "token_entropy_batch", entropies)
    context = SimpleNamespace(policy=SimpleNamespace(load=lambda: (None, None)))
    config = load_config(None).attribute
    scores = candidates.excess_surprisal(ROLLOUTS, TABLE, config, context)
    np.testing.assert_allclose(scores[0][1:4], [1.0, 0.0, 2.0], rtol=1e-6)  # 2-1, max(0, 0.01-1), 3-1
    np.testing.assert_allclose(scores[1][:2], [0.5, 0.0], rtol=1e-6)
    assert seen["temperatures"] == [1.0, 1.0]  # temperature 0 (greedy) is read as 1, as `entropy` does
    assert math.isnan(scores[0][0])


def test_a_variant_row_is_reshaped_with_its_override_and_others_are_not():
    config = load_config(None)
    assert candidates.reshape_for("oar_g", config) is config
    ranked = candidates.reshape_for("oar_g~rank", config)
    assert ranked.reshape.normalize == "rank" and ranked.reshape.quantile == config.reshape.quantile
    assert candidates.reshape_for("surprisal~q75", config).reshape.quantile == 0.75
    assert config.reshape.normalize != "rank"  # the run's config is not changed
