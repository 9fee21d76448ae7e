"""Helpers of tests/test_trl.py, and the script its 2-process test launches:

    accelerate launch --config_file configs/accelerate/cpu-2proc.yaml tests/trl_worker.py POLICY DATA.jsonl LOG_DIR

Completions come from `FixedCompletions` (a function of the prompt and the sample's index in its group),
so one process and two processes train on the same rollouts and their token advantages can be compared.
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")


def boxed_reward(completions, answer, **_):
    """1 when the last \\boxed{} equals the gold answer (TRL reward function signature)."""
    from oarctl.verify.boxed import score

    texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
    return [score(text, gold)[1] for text, gold in zip(texts, answer)]


def dataset(jsonl: Path):
    """Conversational prompts (TRL applies the policy's chat template, as oarctl's `chat` template does)."""
    from datasets import Dataset

    rows = [json.loads(line) for line in Path(jsonl).read_text().splitlines() if line.strip()]
    return Dataset.from_list([{"prompt": [{"role": "user", "content": r["problem"]}], "answer": r["answer"]}
                              for r in rows])


def grpo_args(output_dir: Path, **overrides):
    from trl import GRPOConfig

    settings = dict(output_dir=str(output_dir), per_device_train_batch_size=8, num_generations=4,
                    max_completion_length=16, max_steps=1, learning_rate=1e-3, logging_steps=1, report_to=[],
                    use_cpu=True, save_strategy="no", seed=0, disable_tqdm=True)
    settings.update(overrides)
    return GRPOConfig(**settings)


def fixed_completions_class(base):
    """`base` (GRPOTrainer or a subclass) whose completions are fixed: sample k of a prompt answers
    k % 3 + 1 after a short reasoning that depends on k, then eos."""
    class FixedCompletions(base):
        def _generate_single_turn(self, prompt_ids, images, multimodal_fields, num_generations, *args, **kwargs):
            seen: dict[tuple, int] = {}
            completions = []
            for ids in prompt_ids:
                k = seen[tuple(ids)] = seen.get(tuple(ids), -1) + 1
                text = f"{k}+{k * 3 % 7}={k % 3 + 1}. \\boxed{{{k % 3 + 1}}}"
                completions.append(self.processing_class(text, add_special_tokens=False)["input_ids"]
                                   + [self.processing_class.eos_token_id])
            return completions, None
    return FixedCompletions


def main(policy: str, data: str, log_dir: str) -> None:
    import torch

    from oarctl.integrations.trl import OARGRPOTrainer

    torch.set_num_threads(1)
    trainer = fixed_completions_class(OARGRPOTrainer)(
        model=policy, reward_funcs=boxed_reward, args=grpo_args(Path(log_dir) / "trl", per_device_train_batch_size=4),
        train_dataset=dataset(Path(data)), attribution="oar_g", oar_log_dir=log_dir)
    trainer.train()


if __name__ == "__main__":
    main(*sys.argv[1:4])
