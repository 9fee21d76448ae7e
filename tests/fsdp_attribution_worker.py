"""Helpers of tests/test_trl_fsdp.py, and the script its attribution tests launch on 2 CPU ranks (gloo):

    python -m torch.distributed.run --nproc_per_node 2 tests/fsdp_attribution_worker.py POLICY OUT.json MODE

The policy is wrapped in FSDP1 (full shard, one unit per Qwen2DecoderLayer, as fsdp.yaml). Rank 0 scores
rows 0-2 (three samples of one prompt), rank 1 row 3 (another prompt, a longer reasoning), so the ranks
make different numbers of OAR-G batches (attribute.batch_size 1) and of OAR-P forwards. MODE:
- `padded`: the methods with a CallSync (collective.py); rank 0 writes every row's scores to OUT.json;
- `gathered`: the plain model on full weights (fsdp_gathered), no CallSync: no collective to pad;
- `unpadded`: rank 1 agrees on the counts but skips its dummy calls: must hang or fail, not finish;
- `padded-zero3` / `unpadded-zero3`: the same under DeepSpeed ZeRO-3 (DS_ACCELERATOR=cpu) instead of FSDP1;
- `padded-empty`: rank 0 scores every row, rank 1 none (a rank whose groups all had one reward).
"""
from __future__ import annotations

import datetime
import json
import os
import sys

os.environ.setdefault("OMP_NUM_THREADS", "1")

METHODS = ("oar_g", "oar_p", "oar_p_span")
PROMPTS = ["Compute 5-3.", "Compute 9-8."]
RESPONSES = [(0, "5-3=2. \\boxed{2}"), (0, "5 less 3 is 2. \\boxed{2}"), (0, "so 1. \\boxed{1}"),
             (1, "9-8 is 1, as 8+1=9. \\boxed{1}")]
RANK_ROWS = [[0, 1, 2], [3]]
EMPTY_RANK_ROWS = [[0, 1, 2, 3], []]  # mode `padded-empty`: rank 1 has nothing to score and only pads


def rollout_table(tokenizer):
    import pyarrow as pa

    prompts = [tokenizer(PROMPTS[p])["input_ids"] for p, _ in RESPONSES]
    responses = [tokenizer(text, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
                 for _, text in RESPONSES]
    return pa.table({"prompt_token_ids": prompts, "response_token_ids": responses,
                     "temperature": [1.0] * len(RESPONSES)})


def attribute_config(method: str):
    from oarctl.config import AttributeConfig

    return AttributeConfig(method=method, batch_size=1, chunk_size=4, span_tokens=2)


def scores(model, tokenizer, rows: list[int], sync, methods=METHODS) -> dict[str, list[list[float]]]:
    """{method: scores of `rows`} from oarctl's registry, as the attribute stage calls it."""
    from types import SimpleNamespace

    import pyarrow as pa

    from oarctl.attribution import ATTRIBUTION_METHODS
    from oarctl.attribution.base import segment_rows
    from oarctl.contract import StageContext

    table = rollout_table(tokenizer)
    rollouts = [segment_rows(table, tokenizer)[row] for row in rows]  # rows keep their global index (seeds)
    context = StageContext(seed=0, step=0, policy=SimpleNamespace(load=lambda: (model, tokenizer)), call_sync=sync)
    mine = table.take(pa.array(rows, pa.int64()))  # typed: `rows` may be empty
    return {method: [s.tolist() for s in ATTRIBUTION_METHODS.get(method)(rollouts, mine, attribute_config(method),
                                                                        context)]
            for method in methods}


class SkippedPadding:
    """A CallSync whose rank 1 joins the count but skips its dummy calls (the bug the padding prevents)."""

    def __init__(self, sync, rank: int):
        self.sync, self.rank = sync, rank

    def most(self, count: int) -> int:
        most = self.sync.most(count)
        return count if self.rank == 1 else most


def _fsdp_model(policy: str):
    import functools

    import torch
    from torch.distributed.fsdp import FullyShardedDataParallel
    from torch.distributed.fsdp.wrap import transformer_auto_wrap_policy
    from transformers import AutoModelForCausalLM
    from transformers.models.qwen2.modeling_qwen2 import Qwen2DecoderLayer

    model = AutoModelForCausalLM.from_pretrained(policy, dtype=torch.float32)
    wrap = functools.partial(transformer_auto_wrap_policy, transformer_layer_cls={Qwen2DecoderLayer})
    return FullyShardedDataParallel(model, auto_wrap_policy=wrap, use_orig_params=True, device_id=torch.device("cpu"))


def _zero3_model(policy: str):
    """The policy partitioned by DeepSpeed ZeRO-3 (its CPU accelerator, gloo); no optimizer: attribution only."""
    import deepspeed
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(policy, dtype=torch.float32)
    config = {"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 3}}
    engine, *_ = deepspeed.initialize(model=model, config=config, dist_init_required=False)
    return engine.module  # its forwards gather each layer's partitions (a collective per layer)


def main(policy: str, out: str, mode: str) -> None:
    import torch
    import torch.distributed as dist
    from transformers import AutoTokenizer

    from oarctl.attribution.collective import CallSync, fsdp_gathered

    torch.set_num_threads(1)
    # a missed collective fails in 10 s (unpadded); padded runs wait longer for a rank slowed by busy cores
    seconds = 10 if mode.startswith("unpadded") else 120
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=seconds))
    rank = dist.get_rank()
    rows = (EMPTY_RANK_ROWS if mode == "padded-empty" else RANK_ROWS)[rank]
    tokenizer = AutoTokenizer.from_pretrained(policy)
    model = _zero3_model(policy) if mode.endswith("zero3") else _fsdp_model(policy)
    sync = CallSync(torch.device("cpu"))
    if mode == "gathered":
        with fsdp_gathered(model) as plain:
            mine = scores(plain, tokenizer, rows, None)
    else:
        padded = mode.startswith("padded")
        mine = scores(model, tokenizer, rows, sync if padded else SkippedPadding(sync, rank))
    with_grad = [name for name, parameter in model.named_parameters() if parameter.grad is not None]
    gathered = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, {"rows": rows, "scores": mine, "with_grad": with_grad})
    if rank == 0:
        with open(out, "w") as handle:
            json.dump(gathered, handle)
    dist.barrier()  # no rank tears its connections down while the other still uses them (gloo aborts in C++)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(*sys.argv[1:4])
