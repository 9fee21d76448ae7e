"""Attribution on a model sharded over ranks (FSDP, DeepSpeed ZeRO-3): every rank makes the same calls.

Reads nothing and writes nothing; used by the attribution methods in `oar.py` and `oar_p_cheap.py`.
Under FSDP and ZeRO-3 a forward gathers every layer's parameters from all ranks (and a backward
gathers them again), so all ranks must run the same number of forwards and backwards in the same
order; only their shapes may differ. Attribution gives each rank its own responses, a different
number of them, of different lengths. So each phase of a method (OAR-G's prefix batches; OAR-P's
clean and perturbed forwards) counts its calls before making them, the ranks agree on the largest
count (one all-reduce), and a rank with fewer makes dummy calls of the same kind (a 1- or 2-token
input through the same code, results discarded) until it has made as many: verl's
`same_micro_num_in_dp`, transformers' `synced_gpus`. Without a `CallSync` (one process, or a model
every rank holds whole) nothing is added: the same calls, the same bytes.

Supported under a `CallSync`: the methods in SYNCED_METHODS. A phase must hold one kind of call
(all no-grad forwards, or all OAR-G prefix batches), which is what makes the dummies interchangeable
with the real calls of another rank. Who passes one (StageContext.call_sync): OARGRPOTrainer under
FSDP1 / ZeRO-3. oarctl's own launched attribute stage holds a whole replica of the policy on every
rank (distributed.py), so its calls are not collective and it passes none; a stage that shards the
policy would pass one the same way.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Callable

import torch

# methods that pad their calls (the others make none, or calls this module does not count)
SYNCED_METHODS = ("uniform", "random", "oar_g", "oar_p", "oar_p_span", "oar_p_screened",
                  "ktae", "entropy_mask")  # these two make no call here (KTAE counts tokens; TRL's loss masks)


@dataclass(frozen=True)
class CallSync:
    """The ranks a model is sharded over: `most(count)` is the largest `count` any of them passes."""
    device: torch.device
    group: object = None  # a torch.distributed process group; None: the default one

    def most(self, count: int) -> int:
        counts = torch.tensor([count], device=self.device)
        torch.distributed.all_reduce(counts, op=torch.distributed.ReduceOp.MAX, group=self.group)
        return int(counts.item())


@contextlib.contextmanager
def padded_calls(sync: CallSync | None, planned: int, dummy: Callable[[], object]):
    """Around a phase that makes `planned` calls of one kind: afterwards `dummy()` runs until this rank has
    made as many calls as the busiest rank. Call on every rank; without `sync` it adds nothing."""
    most = planned if sync is None else sync.most(planned)
    yield
    for _ in range(most - planned):
        dummy()


@torch.no_grad()
def dummy_forward(model) -> None:
    """A one-token forward whose result is discarded: the collectives of any no-grad forward."""
    model(input_ids=torch.zeros((1, 1), dtype=torch.long, device=model.device), logits_to_keep=1)


def input_embeddings(model, ids: torch.Tensor) -> torch.Tensor:
    """The input embeddings of `ids`, looked up outside the model's forward. Under FSDP the embedding weight
    is only this rank's shard between forwards: gather the root unit's parameters (embeddings, final norm,
    output layer; not the decoder layers) for the lookup, a collective like a forward (FSDP1:
    summon_full_params without recursion; FSDP2: the root's unshard / reshard)."""
    from torch.distributed.fsdp import FSDPModule, FullyShardedDataParallel

    if isinstance(model, FullyShardedDataParallel):
        with FullyShardedDataParallel.summon_full_params(model, recurse=False, writeback=False):
            return model.get_input_embeddings()(ids)
    if isinstance(model, FSDPModule):
        model.unshard()
        try:
            return model.get_input_embeddings()(ids)
        finally:
            model.reshard()
    return model.get_input_embeddings()(ids)


@contextlib.contextmanager
def fsdp_gathered(wrapped):
    """The model inside FSDP1's `wrapped` with every unit's full parameters, as a plain module: no call makes a
    collective, so ranks may make different numbers of calls. FSDP's wrappers of the inner units are taken out
    of the module tree meanwhile (their forwards would gather again) and put back after. Memory: a full copy
    of the weights per rank on top of the shards, in full precision (FSDP1 gathers the fp32 master weights
    even under mixed precision): ~30 GB at 7B."""
    from torch.distributed.fsdp import FullyShardedDataParallel

    inner = wrapped.module
    units = [(parent, name, child) for parent in inner.modules() for name, child in parent.named_children()
             if isinstance(child, FullyShardedDataParallel)]
    with FullyShardedDataParallel.summon_full_params(wrapped, writeback=False):
        for parent, name, unit in units:
            setattr(parent, name, unit.module)
        try:
            yield inner
        finally:
            for parent, name, unit in units:
                setattr(parent, name, unit)
