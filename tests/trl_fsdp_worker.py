"""The script tests/test_trl_fsdp.py launches on 2 CPU processes under FSDP1 (gloo):

    accelerate launch --config_file configs/accelerate/cpu-fsdp-2proc-trl.yaml tests/trl_fsdp_worker.py \
        POLICY DATA.jsonl OUT

In one launch (each trainer one or two steps, fixed completions): stock TRL GRPOTrainer and OARGRPOTrainer
with `uniform`, both under FSDP (losses and final full weights to OUT/{stock,uniform}.json / .pt), then
OARGRPOTrainer with `oar_g` and `oar_p_span`, their artifacts in OUT/{method}/. The second group of the
global batch reasons longer (`uneven_completions_class`), so the ranks make different numbers of OAR-G
batches and OAR-P forwards; every count the ranks agree on is recorded (OUT/counts-RANK.json).
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
sys.path.insert(0, str(Path(__file__).parent))

from trl_worker import boxed_reward, dataset, grpo_args  # noqa: E402

# the OAR runs' attribute options: OAR-G batches of at most 64 tokens (rows x padded length), so the longer
# second group splits into more batches than the first; small OAR-P chunks and windows
ATTRIBUTION = {"oar_g": {"method": "oar_g", "max_batch_tokens": 64},
               "oar_p_span": {"method": "oar_p_span", "span_tokens": 2, "chunk_size": 2}}


def uneven_completions_class(base):
    """`base` whose completions are fixed: sample k of the global batch's group g reasons, then answers
    k % 3 + 1; group g's reasoning is 4 g characters longer (one token per character)."""
    class UnevenCompletions(base):
        def _generate_single_turn(self, prompt_ids, images, multimodal_fields, num_generations, *args, **kwargs):
            first = self.accelerator.process_index * len(prompt_ids)  # this process's rows in the global batch
            completions = []
            for index in range(len(prompt_ids)):
                group, k = divmod(first + index, num_generations)
                text = f"{'so ' * group}{k}+{k * 3 % 7}={k % 3 + 1}. \\boxed{{{k % 3 + 1}}}"
                completions.append(self.processing_class(text, add_special_tokens=False)["input_ids"]
                                   + [self.processing_class.eos_token_id])
            return completions, None
    return UnevenCompletions


def _fsdp_stock_class():
    """Stock TRL, kept FSDP without CUDA as OARGRPOTrainer is (else accelerate would run it as DDP)."""
    from trl import GRPOTrainer

    from oarctl.integrations.trl import keep_trainer_fsdp_on_cpu

    class FSDPGRPOTrainer(GRPOTrainer):
        def create_accelerator_and_postprocess(self) -> None:
            super().create_accelerator_and_postprocess()
            keep_trainer_fsdp_on_cpu(self)
    return FSDPGRPOTrainer


def _gradient_checked(base):
    """`base` that fails when attribution leaves a gradient on a parameter (or on FSDP's flat parameters)."""
    class GradientChecked(base):
        def _scores(self, batch: dict):
            scores = super()._scores(batch)
            touched = [name for name, parameter in self.model_wrapped.named_parameters() if parameter.grad is not None]
            if touched:
                raise AssertionError(f"attribution left gradients on {touched[:3]}")
            return scores
    return GradientChecked


def _train(base, policy: str, data: str, folder: Path, steps: int, **extra):
    import torch

    torch.manual_seed(0)
    trainer = uneven_completions_class(base)(
        model=policy, reward_funcs=boxed_reward, train_dataset=dataset(Path(data)),
        args=grpo_args(folder / "trl", per_device_train_batch_size=4, max_steps=steps, bf16=False), **extra)
    trainer.train()
    from torch.distributed.fsdp import FSDPModule, FullyShardedDataParallel

    assert trainer.is_fsdp_enabled and isinstance(trainer.model_wrapped, (FullyShardedDataParallel, FSDPModule))
    return trainer


def _save_run(trainer, out: Path, name: str) -> None:
    """Losses and the full weights (gathered from the shards: call on every process)."""
    import torch
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    # as oarctl's update gathers FSDP weights on CPU (accelerate's get_state_dict offloads to CPU: crashes there)
    weights = get_model_state_dict(trainer.model_wrapped, options=StateDictOptions(full_state_dict=True))
    if trainer.accelerator.is_main_process:
        losses = [line["loss"] for line in trainer.state.log_history if "loss" in line]
        (out / f"{name}.json").write_text(json.dumps({"losses": losses}))
        torch.save({key: value.clone() for key, value in weights.items()}, out / f"{name}.pt")


def _record_counts(out: Path, rank: int) -> None:
    """Every (this rank's count, the most of any rank) the attribution phases agree on, to OUT/counts-RANK.json."""
    from oarctl.attribution.collective import CallSync

    agreed, most = [], CallSync.most

    def recording(self, count: int) -> int:
        agreed.append((count, most(self, count)))
        (out / f"counts-{rank}.json").write_text(json.dumps(agreed))
        return agreed[-1][1]
    CallSync.most = recording


def main(policy: str, data: str, out: str) -> None:
    import torch

    from oarctl.integrations.trl import OARGRPOTrainer

    torch.set_num_threads(1)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    _save_run(_train(_fsdp_stock_class(), policy, data, out / "stock", 2), out, "stock")
    _save_run(_train(OARGRPOTrainer, policy, data, out / "uniform", 2, attribution="uniform"), out, "uniform")
    _record_counts(out, int(os.environ["RANK"]))
    for method, options in ATTRIBUTION.items():
        _train(_gradient_checked(OARGRPOTrainer), policy, data, out / method, 1, attribution=options,
               oar_log_dir=out / method)


if __name__ == "__main__":
    main(*sys.argv[1:4])
