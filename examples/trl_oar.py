"""TRL's GRPOTrainer with OAR-G token credit, on the embedded toy policy, on CPU (about a minute):

    pip install 'oarctl[trl]'
    python examples/trl_oar.py                      # 20 steps; artifacts in runs/trl-oar
    oarctl report runs/trl-oar                      # curves + token-credit heatmaps -> runs/trl-oar/report.html
    oarctl show runs/trl-oar/step_0019/advantages.parquet --row 0

Sharded, as a 7B full fine-tune needs (attribution pads its calls so every process makes as many):

    accelerate launch --config_file configs/accelerate/cpu-fsdp-2proc-trl.yaml examples/trl_oar.py --steps 2
    accelerate launch --config_file configs/accelerate/fsdp.yaml examples/trl_oar.py            # GPUs
    accelerate launch --config_file configs/accelerate/deepspeed_zero3.yaml examples/trl_oar.py # GPUs

Everything but `attribution=` and `oar_log_dir=` is plain TRL: swap in your model, dataset, reward and
GRPOConfig. The dataset is oarctl's generated arithmetic task; the reward is 1 when the last \\boxed{} equals
the gold answer.
"""
from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")


def toy_dataset(count: int, seed: int):
    from datasets import Dataset

    from oarctl.data import toy_prompts

    rows = toy_prompts("train", count, [1, 2, 3, 4, 5], seed).to_pylist()
    return Dataset.from_list([{"prompt": [{"role": "user", "content": r["problem"]}], "answer": r["answer"]}
                              for r in rows])


def boxed_reward(completions, answer, **_):
    from oarctl.verify.boxed import score

    return [score(completion[-1]["content"], gold)[1] for completion, gold in zip(completions, answer)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--method", default="oar_g", help="any oarctl attribution method (uniform = stock GRPO)")
    parser.add_argument("--out", default="runs/trl-oar")
    parser.add_argument("--model", help="a transformers model folder or hub name (default: the toy policy)")
    parser.add_argument("--vllm", action="store_true", help="generate with vLLM in colocate mode (TRL's use_vllm)")
    parser.add_argument("--prompts-per-step", type=int, default=16)
    parser.add_argument("--gathered", action="store_true", help="FSDP / ZeRO-3: attribute on full weights gathered "
                                                                    "on every process (a full copy per GPU)")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (a tiny model on shared cores "
                                                                "runs many times slower with more)")
    options = parser.parse_args()
    if not options.vllm:  # TRL warns about the installed vLLM's version on import, though this run never uses it
        import warnings

        warnings.filterwarnings("ignore", message="TRL currently supports vLLM versions", category=UserWarning)

    import torch

    torch.set_num_threads(options.threads)

    from trl import GRPOConfig

    from oarctl.integrations.trl import OARGRPOTrainer
    from oarctl.toy import base_policy_dir

    group = 8
    args = GRPOConfig(output_dir=os.path.join(options.out, "trl"), max_steps=options.steps,
                      per_device_train_batch_size=options.prompts_per_step * group, num_generations=group,
                      max_completion_length=48, learning_rate=1e-4, temperature=1.0, logging_steps=5,
                      save_strategy="no", report_to=[], use_cpu=not torch.cuda.is_available(),
                      bf16=torch.cuda.is_available(), seed=0, use_vllm=options.vllm, vllm_mode="colocate")
    trainer = OARGRPOTrainer(model=options.model or str(base_policy_dir()), reward_funcs=boxed_reward, args=args,
                             train_dataset=toy_dataset(options.prompts_per_step * options.steps, seed=0),
                             attribution=options.method, oar_log_dir=options.out,
                             attribution_params="gathered" if options.gathered else "sharded")
    started = time.perf_counter()
    trainer.train()
    seconds = time.perf_counter() - started
    accelerator = trainer.accelerator
    if accelerator.is_main_process:
        print(f"{options.steps} steps in {seconds:.0f} s ({seconds / options.steps:.1f} s/step) on "
              f"{_processes(accelerator)}; artifacts: {options.out} (oarctl report {options.out})" + _peak_memory())


# accelerate's DistributedType, as a user would say it
STRATEGIES = {"NO": "not distributed", "MULTI_CPU": "DDP over gloo", "MULTI_GPU": "DDP", "FSDP": "FSDP",
              "DEEPSPEED": "DeepSpeed"}


def _processes(accelerator) -> str:
    """`1 process on cpu, not distributed`, `8 processes on cuda, FSDP`."""
    count, kind = accelerator.num_processes, accelerator.distributed_type.value
    return (f"{count} process{'es' if count > 1 else ''} on {accelerator.device.type}, "
            f"{STRATEGIES.get(kind, kind)}")


def _peak_memory() -> str:
    import torch

    return f"; peak GPU memory {torch.cuda.max_memory_allocated() / 2**30:.2f} GiB" if torch.cuda.is_available() else ""


if __name__ == "__main__":
    main()
