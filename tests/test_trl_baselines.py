"""OARGRPOTrainer with the methods users pick instead of OAR: `entropy_mask` is stock TRL's
top_entropy_quantile=0.2 (losses and gradients), through oarctl's mask; `ktae` feeds TRL A_i + k_it.
Completions are fixed (tests/trl_worker.py), so both trainers see the same batch."""
from __future__ import annotations

import numpy as np
import pytest
import torch

pytest.importorskip("trl")

from trl import GRPOTrainer  # noqa: E402

from oarctl.attribution.ktae import group_key_values  # noqa: E402
from oarctl.errors import OarError  # noqa: E402
from oarctl.integrations.trl import OARGRPOTrainer  # noqa: E402
from oarctl.schema import AttributeConfig  # noqa: E402
from test_trl import _losses, _train  # noqa: E402

SETTINGS = dict(max_steps=2, beta=0.04)  # the KL term too: TRL adds it after the mask


def _assert_same(stock_run, oar_run) -> None:
    (stock_trainer, stock, _), (oar_trainer, ours, _) = stock_run, oar_run
    assert len(stock) == len(ours) == 2
    for step_stock, step_ours in zip(stock, ours):
        assert step_stock.keys() == step_ours.keys()
        for name in step_stock:
            torch.testing.assert_close(step_ours[name], step_stock[name], rtol=1e-5, atol=1e-8)
    assert _losses(oar_trainer) == pytest.approx(_losses(stock_trainer), rel=1e-5, abs=1e-8)


def test_entropy_mask_is_stock_trl_top_entropy_quantile(tiny_policy, signal_data, tmp_path, monkeypatch):
    calls = []
    oarctl_mask = OARGRPOTrainer.get_high_entropy_mask
    monkeypatch.setattr(OARGRPOTrainer, "get_high_entropy_mask",
                        lambda self, *args: calls.append(args) or oarctl_mask(self, *args))
    stock = _train(GRPOTrainer, tiny_policy, signal_data["train"], tmp_path / "stock", top_entropy_quantile=0.2,
                   **SETTINGS)
    oar = _train(OARGRPOTrainer, tiny_policy, signal_data["train"], tmp_path / "oar", attribution="entropy_mask",
                 **SETTINGS)
    assert calls and all(level == pytest.approx(0.8) for _, _, level in calls)  # oarctl's mask ran in TRL's loss
    kept = torch.cat([oarctl_mask(oar[0], e, m, level)[m.bool()] for e, m, level in calls]).float().mean()
    assert 0.1 < kept < 0.4  # it masks: about the top 20% of each micro-batch's tokens keep their gradient
    assert torch.equal(oar[2][0]["advantages"], stock[2][0]["advantages"][:, None].expand_as(oar[2][0]["advantages"]))
    _assert_same(stock, oar)
    unmasked = _train(GRPOTrainer, tiny_policy, signal_data["train"], tmp_path / "plain", **SETTINGS)
    assert any(not torch.allclose(oar[1][0][n], unmasked[1][0][n], rtol=1e-3, atol=1e-6) for n in unmasked[1][0])


def test_entropy_mask_share_is_set_once(tiny_policy, signal_data, tmp_path):
    with pytest.raises(OarError, match="top_entropy_quantile"):
        _train(OARGRPOTrainer, tiny_policy, signal_data["train"], tmp_path, attribution="entropy_mask",
               top_entropy_quantile=0.5, max_steps=1)


def test_ktae_adds_key_values_to_trls_advantage(tiny_policy, signal_data, tmp_path):
    stock_trainer, _, stock_batches = _train(GRPOTrainer, tiny_policy, signal_data["train"], tmp_path / "stock")
    trainer, _, batches = _train(OARGRPOTrainer, tiny_policy, signal_data["train"], tmp_path / "oar",
                                 attribution={"method": "ktae", "ktae_tf": False})
    captured = trainer._oar_batch
    tokenizer = trainer.processing_class
    keys = group_key_values(captured["completion_ids"], captured["rewards"],
                            [i // trainer.num_generations for i in range(len(captured["rewards"]))],
                            AttributeConfig(ktae_tf=False), {tokenizer.eos_token_id, tokenizer.pad_token_id})
    sequence = stock_batches[-1]["advantages"]
    token = batches[-1]["advantages"]
    mask = batches[-1]["completion_mask"]
    for row, row_keys in enumerate(keys):
        expected = sequence[row].double() + torch.as_tensor(row_keys, dtype=torch.float64)
        torch.testing.assert_close(token[row, :len(row_keys)].double(), expected, rtol=0, atol=1e-6)
        assert mask[row, :len(row_keys)].all()
    assert any(np.ptp(k) > 0.1 for k in keys)
