"""Running a stage on every rank of an `accelerate launch`: the plumbing attribute and update share.

Reads only the launcher's environment (WORLD_SIZE, RANK, LOCAL_RANK, ACCELERATE_*, FSDP_*); writes
nothing. Two ways a stage uses the ranks:
- update trains one model over all ranks: `make_accelerator` (DDP, FSDP, DeepSpeed ZeRO-3), with the
  `fsdp` / `deepspeed` / `sharded` predicates and `on_rank_zero` for files only rank 0 reads;
- attribute replicates the model (DDP-style, nothing sharded): `process_state` joins the process
  group, `deal` shares the rows out by token count, `gather_to_rank_zero` brings the results back.
Without a launcher none of this starts a process group: one plain process, the bytes of plain PyTorch.
On CPU the ranks talk over gloo (accelerate's `cpu=True`), on GPUs over NCCL, one GPU per rank.
"""
from __future__ import annotations

import contextlib
import os

import torch

from oarctl.errors import OarError


def launched() -> bool:
    """True under `accelerate launch` / torchrun (they set WORLD_SIZE), even with one process."""
    return "WORLD_SIZE" in os.environ or "ACCELERATE_MIXED_PRECISION" in os.environ


def fsdp_requested() -> bool:
    """The launcher asked for FSDP (accelerate launch with an FSDP config)."""
    return os.environ.get("ACCELERATE_USE_FSDP", "false").lower() == "true"


def quiet_deepspeed_without_gpus() -> None:
    """Tell DeepSpeed it runs on CPU when there is no CUDA, before anything imports it. accelerate checks
    for a DeepSpeedEngine whenever transformers saves a model (`save_pretrained` -> `unwrap_model`), which
    imports DeepSpeed where it is installed; DeepSpeed then guesses its accelerator and warns "Setting
    accelerator to CPU" though nothing of oarctl uses DeepSpeed there. Without CUDA that guess is the only
    answer, so its own override (DS_ACCELERATOR) says it instead; a value the user set is kept."""
    if "DS_ACCELERATOR" not in os.environ and not torch.cuda.is_available():
        os.environ["DS_ACCELERATOR"] = "cpu"


_RAM_EFFICIENT = "FSDP_CPU_RAM_EFFICIENT_LOADING"
_SYNC_STATES = "FSDP_SYNC_MODULE_STATES"


def make_accelerator(bf16: bool = False):
    """None for a plain single process without bf16 (the bytes of a plain PyTorch loop); else an Accelerator."""
    if not (launched() or bf16):
        return None
    quiet_deepspeed_without_gpus()
    from accelerate import Accelerator

    if torch.cuda.is_available():
        return Accelerator(mixed_precision="bf16" if bf16 else None)
    # without CUDA, ask for CPU: processes started by the MULTI_GPU launcher then use gloo. accelerate
    # refuses sync_module_states (which ram-efficient loading needs) on CPU: set it up here instead
    ram_efficient = fsdp_requested() and os.environ.get(_RAM_EFFICIENT, "false").lower() == "true"
    with _environment({_RAM_EFFICIENT: "false", _SYNC_STATES: "false"} if ram_efficient else {}):
        accelerator = Accelerator(cpu=True, mixed_precision="bf16" if bf16 else None)
        if fsdp_requested():
            keep_fsdp_on_cpu(accelerator, ram_efficient)
    return accelerator


@contextlib.contextmanager
def _environment(values: dict):
    saved = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def keep_fsdp_on_cpu(accelerator, ram_efficient: bool = False) -> None:
    """accelerate quietly turns an FSDP launch without CUDA into DDP (MULTI_CPU), though torch's FSDP runs
    on CPU with gloo: switch its state back, so cpu-fsdp-2proc.yaml (the tests) runs the code of a GPU FSDP
    run. The device must be plain `cpu`: FSDP refuses device_id `cpu:0` for parameters on `cpu`.
    `ram_efficient`: as fsdp_cpu_ram_efficient_loading on GPUs, the ranks other than 0 build the model on
    the meta device; FSDP refuses sync_module_states on CPU, so the update broadcasts rank 0's weights
    into them before `prepare` (receive_rank_zero_weights)."""
    from accelerate.state import PartialState
    from accelerate.utils import DistributedType, FullyShardedDataParallelPlugin

    if accelerator.mixed_precision != "no":  # accelerate's FSDP mixed-precision set-up is skipped here
        raise OarError("FSDP without CUDA (cpu-fsdp-2proc.yaml) runs in fp32 only: set update.bf16=false")
    state = accelerator.state
    state.fsdp_plugin = FullyShardedDataParallelPlugin()  # read from the launcher's FSDP_* variables
    state.fsdp_plugin.cpu_ram_efficient_loading = ram_efficient
    state.distributed_type = PartialState._shared_state["distributed_type"] = DistributedType.FSDP
    state.device = PartialState._shared_state["device"] = torch.device("cpu")


def every_rank_reads():
    """transformers' from_pretrained, under fsdp_cpu_ram_efficient_loading, gives every rank but the first
    zeros in place of the weights (FSDP is to broadcast them): for a model every rank must read itself
    (the KL reference, never sharded), turn that off around the load."""
    return _environment({_RAM_EFFICIENT: "false"})


def loads_on_rank_zero_only(accelerator) -> bool:
    """FSDP with fsdp_cpu_ram_efficient_loading: rank 0 reads the weights, the other ranks build the model on
    the meta device, and rank 0's weights are broadcast to them: by FSDP itself on GPUs
    (sync_module_states), by receive_rank_zero_weights on CPU."""
    return fsdp(accelerator) and bool(getattr(accelerator.state.fsdp_plugin, "cpu_ram_efficient_loading", False))


def receive_rank_zero_weights(model, accelerator) -> None:
    """Where FSDP does not broadcast the weights itself (on CPU it refuses sync_module_states): the ranks
    built on the meta device allocate theirs, and every parameter and buffer is broadcast from rank 0,
    one tensor at a time (call on every rank, before the optimizer is made: `to_empty` gives the parameters
    new objects; and before `prepare`: they are whole models until then)."""
    if not loads_on_rank_zero_only(accelerator) or accelerator.state.fsdp_plugin.sync_module_states:
        return
    if not accelerator.is_main_process:
        model.to_empty(device=torch.device("cpu"))
        model.tie_weights()  # to_empty gives the parameters new objects: tie the output layer again
    with torch.no_grad():
        for tensor in [*model.parameters(), *model.buffers()]:  # the same order on every rank; tied ones once
            torch.distributed.broadcast(tensor, src=0)


def _distributed_type(accelerator, name: str) -> bool:
    from accelerate.utils import DistributedType

    return accelerator is not None and accelerator.distributed_type == DistributedType[name]


def fsdp(accelerator) -> bool:
    return _distributed_type(accelerator, "FSDP")


def deepspeed(accelerator) -> bool:
    return _distributed_type(accelerator, "DEEPSPEED")


def sharded(accelerator) -> bool:
    return fsdp(accelerator) or deepspeed(accelerator)


def process_state():
    """accelerate's PartialState under a launcher (joins the process group: gloo on CPU, NCCL on GPUs;
    `.device` is cuda:LOCAL_RANK or cpu), None in a plain process. Shared with an Accelerator made later."""
    if not launched():
        return None
    from accelerate import PartialState

    return PartialState(cpu=not torch.cuda.is_available())


def rank() -> int:
    """This process's rank: the one answer to "which rank am I" in oarctl. The launcher's RANK (accelerate
    and torchrun set it; it is the Accelerator's `process_index`), 0 in a plain process."""
    return int(os.environ.get("RANK", "0"))


def world_size() -> int:
    """How many ranks the launcher started (WORLD_SIZE), 1 in a plain process."""
    return int(os.environ.get("WORLD_SIZE", "1"))


def on_rank_zero(state, read):
    """`read()` on rank 0 only; an OarError there is raised on every rank (else the others would wait
    forever in the next collective)."""
    result, message = None, None
    if rank() == 0:
        try:
            result = read()
        except OarError as error:
            message = str(error)
    shared = [message]
    torch.distributed.broadcast_object_list(shared, src=0)
    if shared[0] is not None:
        raise OarError(shared[0])
    return result


def raise_on_every_rank(problem: str | None, state) -> None:
    """Raise OarError(the first rank's problem) on every rank when any rank has one (call on every rank),
    so no rank waits forever in the next collective."""
    problems = [problem]
    if world_size() > 1:  # else no process group may exist (one process, bf16 under an Accelerator)
        problems = [None] * world_size()
        torch.distributed.all_gather_object(problems, problem)
    first = next((p for p in problems if p is not None), None)
    if first is not None:
        raise OarError(first)


@contextlib.contextmanager
def checked_beside(files: dict, state):
    """Verify {checkpoint folder: recorded names} shared out over the ranks while the body uses them, and
    settle before the body's results leave it: on leaving, a problem any rank found is raised on every
    rank, so nothing is written from a file that failed its check (call on every rank). When the body
    fails first (a truncated file may fail to load), this rank's finding is raised instead: it says why.
    Each rank checks every R-th file of them all, so each file is hashed by one rank in all."""
    from oarctl.hashing import BackgroundCheck

    share: dict = {}
    everything = [(directory, name) for directory, names in files.items() for name in names]
    for directory, name in everything[rank()::world_size()]:
        share.setdefault(directory, []).append(name)
    check = BackgroundCheck(share)
    try:
        yield
    except Exception:
        found = check.problem()
        if found is not None:
            raise OarError(found) from None
        raise
    raise_on_every_rank(check.problem(), state)


def gather_to_rank_zero(value, state) -> list | None:
    """[value of rank 0, value of rank 1, ...] on rank 0, None on the others (pickled Python objects:
    meant for results, e.g. scores, not for weights). Call on every rank."""
    if world_size() == 1:
        return [value]
    gathered = [None] * world_size() if rank() == 0 else None
    torch.distributed.gather_object(value, gathered, dst=0)
    return gathered


def deal(groups: list, weights: list[int], ranks: int) -> list[list[int]]:
    """Item indices per rank: items of one group stay on one rank, and the ranks' total weights are as
    even as a greedy deal makes them (groups by descending weight, each to the least-loaded rank; ties:
    the group met first, the lowest rank). Deterministic; each rank's indices ascend.

    groups[i]: item i's group key (a GRPO group: its prompt_id); weights[i]: its cost (its tokens)."""
    members: dict = {}
    for index, group in enumerate(groups):
        members.setdefault(group, []).append(index)
    totals = {group: sum(weights[i] for i in indices) for group, indices in members.items()}
    order = sorted(members, key=lambda group: -totals[group])  # stable: ties keep first-met order
    loads, dealt = [0] * ranks, [[] for _ in range(ranks)]
    for group in order:
        target = loads.index(min(loads))
        loads[target] += totals[group]
        dealt[target] += members[group]
    return [sorted(indices) for indices in dealt]


def release_process_group() -> None:
    """Shut down the launcher's process group at the end of a launched stage. A rank that exits with
    gloo's threads still up can abort in C++ ("terminate called without an active exception"; seen when
    no rank had rows to score). Only under a launcher: in a plain process a group may be someone
    else's (an in-process vLLM engine's)."""
    if launched() and torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
