"""Training set-up for the update stage: load the policy (and KL reference), prepare it under the
launcher (DDP, FSDP, ZeRO-3), make AdamW with the checkpoint's state, and the state a persistent update
worker keeps from one step to the next (`Resident`). The PPO loop itself is oarctl/stages/update.py.

Loading under FSDP with fsdp_cpu_ram_efficient_loading (fsdp.yaml, cpu-fsdp-2proc.yaml): rank 0 reads
the policy, the other ranks build it on the meta device and get rank 0's weights by broadcast (FSDP's
sync_module_states on GPUs; on CPU, where FSDP refuses it, distributed.receive_rank_zero_weights).
AdamW state under FSDP: every rank reads the slices of its own shards (checkpoint/optimizer/, written by
oarctl/training/save.py; oarctl/sharded_state.py), whatever rank count wrote them (DCP reshards), and one
process or DDP reads it whole, so FSDP, DDP and one process continue each other's checkpoints; FSDP
also reads one process's `optimizer.safetensors` (rank 0 reads, torch scatters it into the shards).
Under DeepSpeed ZeRO-3 the partitioned AdamW state is neither saved nor loaded: each step starts a
fresh optimizer there (with a warning when the checkpoint has a state).
In a persistent worker (update.persistent, FSDP; oarctl/processes/update_worker.py) the ranks keep the prepared
model, AdamW and KL reference (`KeptState`, in the worker's `Resident`, which reaches the stage through
StageContext.resident) for the checkpoint they wrote: the next step, if it starts from that checkpoint
unchanged, trains on from memory and reads nothing (manifest: resident 1).
"""
from __future__ import annotations

import contextlib
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

from oarctl import sharded_state
from oarctl.checkpoints import (OPTIMIZER_STATE, OPTIMIZER_TENSORS, SHARDED_OPTIMIZER, load_master, load_optimizer,
                                load_policy, load_tokenizer, loaded_files, policy_identity, read_optimizer_state,
                                read_scalars, training_state_dir)
from oarctl.contract import StageContext
from oarctl.distributed import (checked_beside, deepspeed, every_rank_reads, fsdp, loads_on_rank_zero_only,
                                on_rank_zero, raise_on_every_rank, rank, receive_rank_zero_weights, sharded)
from oarctl.errors import OarError


def _configure_deepspeed(accelerator, config, accumulation: int) -> None:
    """DeepSpeed takes accumulation, micro-batch size and clipping from its own config: set them here
    so UpdateConfig stays the one source of truth."""
    plugin = accelerator.state.deepspeed_plugin
    if plugin is None:
        return
    micro = config.micro_batch_size
    plugin.deepspeed_config.update({
        "gradient_accumulation_steps": accumulation, "train_micro_batch_size_per_gpu": micro,
        "train_batch_size": micro * accumulation * accelerator.num_processes,
        "gradient_clipping": config.max_grad_norm if config.max_grad_norm > 0 else 0.0})


def _optimizer(model, names: list[str], config, context: StageContext, accelerator):
    """AdamW, with the checkpoint's state unless sharded: FSDP loads it after `prepare` (into the shards)."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.learning_rate, weight_decay=config.weight_decay)
    state = training_state_dir(context.policy.path)
    if not sharded(accelerator):
        load_optimizer(optimizer, names, state)
    elif deepspeed(accelerator) and (state / OPTIMIZER_TENSORS).exists() and rank() == 0:
        print("update: DeepSpeed ZeRO-3 run: the saved AdamW state is not loaded (fresh optimizer)", file=sys.stderr)
    return with_config_rates(optimizer, config)


def with_config_rates(optimizer, config):
    """The optimizer with this step's learning rate and weight decay: a config change takes effect (a loaded
    or kept AdamW state carries those of the step that saved it)."""
    for group in optimizer.param_groups:
        group["lr"], group["weight_decay"] = config.learning_rate, config.weight_decay
    return optimizer


def _load_fsdp_optimizer(model, optimizer, names: list[str], shapes: dict, directory, accelerator) -> None:
    """Fill this rank's AdamW shards from the checkpoint (after `prepare`: the shards exist only then).
    A sharded state (optimizer/, written by FSDP ranks) is read by every rank in parallel, each its own
    slices, whatever rank count wrote it. A one-process state (optimizer.safetensors) is read by rank 0
    and torch broadcasts it tensor by tensor into the shards."""
    if (directory / SHARDED_OPTIMIZER).is_dir():
        _load_sharded_optimizer(model, optimizer, directory, accelerator)
        return
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    if not (directory / OPTIMIZER_TENSORS).exists():  # every rank sees the same checkpoint
        return
    state = on_rank_zero(accelerator, lambda: read_optimizer_state(directory, shapes))
    full = {}
    if rank() == 0:  # keyed by parameter name (FQN), the form torch's full state dict has
        hyperparameters = {k: v for k, v in optimizer.param_groups[0].items() if k != "params"}  # the config's
        full = {"state": state, "param_groups": [{**hyperparameters, "params": names}]}
    set_optimizer_state_dict(model, optimizer.optimizer, optim_state_dict=full,
                             options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True))


def _load_sharded_optimizer(model, optimizer, directory: Path, accelerator) -> None:
    """Every rank reads the slices of its own parameters (the files are checked beside: checked_inputs)."""
    scalars = on_rank_zero(accelerator, lambda: read_scalars(directory))
    shared = [scalars]
    torch.distributed.broadcast_object_list(shared, src=0)  # numbers only: {"PARAMETER::step": float}
    try:
        sharded_state.load_shards(model, optimizer.optimizer, directory, shared[0])
        problem = None
    except OarError as error:
        problem = str(error)
    raise_on_every_rank(problem, accelerator)


def _prepare(model, reference, config, context: StageContext, accelerator, accumulation: int):
    names = [name for name, _ in model.named_parameters()]
    shapes = {name: parameter.shape for name, parameter in model.named_parameters()}  # before FSDP shards them
    if config.gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    optimizer = _optimizer(model, names, config, context, accelerator)
    if accelerator is not None:
        accelerator.gradient_accumulation_steps = accumulation
        _configure_deepspeed(accelerator, config, accumulation)
        model, optimizer = accelerator.prepare(model, optimizer)
        if fsdp(accelerator):
            _load_fsdp_optimizer(model, optimizer, names, shapes, training_state_dir(context.policy.path), accelerator)
            if rank() == 0:  # which wrapper really runs: accelerate can fall back to DDP quietly
                print(f"update: {type(model).__name__} over {accelerator.num_processes} ranks, AdamW state "
                      "carried in the checkpoint", file=sys.stderr)
        reference = reference.to(accelerator.device) if reference is not None else None
    return model, reference, optimizer, names


def _load(policy, accelerator, trained: bool = True):
    """(model, tokenizer) on policy.device; under a launcher on CPU, and `prepare` moves each rank's
    model to its own GPU (policy.device `cuda` would put every rank's full copy on cuda:0). A checkpoint
    saved in 16 bits gets its fp32 weights back (under FSDP from master.safetensors only: the ranks read
    their slices of sharded ones after `prepare`; the KL reference is not sharded: it reads them whole)."""
    rank_zero_reads = trained and loads_on_rank_zero_only(accelerator)
    on_meta = rank_zero_reads and rank() != 0
    if accelerator is None:
        model, tokenizer = policy.load()
    elif on_meta:
        print(f"update: rank {rank()} built the policy on the meta device (rank 0 reads the "
              "weights and they are broadcast to the other ranks)", file=sys.stderr)
        model, tokenizer = _meta_model(policy.path), load_tokenizer(policy.path)
    else:  # every rank reads the weights; each hashes its share of the files beside (checked_inputs)
        with every_rank_reads():  # the KL reference under rank-0-only loading: transformers would give zeros
            model, tokenizer = load_policy(policy.path, "cpu", verified=True)
    if not on_meta:
        load_master(model, training_state_dir(policy.path), shards=not (trained and fsdp(accelerator)))
    if rank_zero_reads:
        receive_rank_zero_weights(model, accelerator)  # every rank, on CPU; on GPUs FSDP broadcasts in `prepare`
    return model, tokenizer


def _meta_model(path):
    """The policy's architecture with its parameters on the meta device: no weights read, no memory held
    until FSDP gives this rank its shards. In fp32, as rank 0 loads it (a 16-bit checkpoint's config says
    bfloat16). Buffers stay real: the rotary embedding's are computed, not saved."""
    from accelerate import init_empty_weights
    from transformers import AutoConfig, AutoModelForCausalLM

    with init_empty_weights(include_buffers=False):
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(path), dtype=torch.float32)
    model.tie_weights()
    return model


def checked_inputs(context: StageContext, accelerator):
    """Under a launcher the ranks verify what they read shared out (each file hashed by one rank in all),
    beside loading and training, and settle before anything is written: the weights and configs of the
    policy (and of the KL reference), and under FSDP the AdamW shards and their step counts. One plain
    process verifies as it loads instead (load_policy, read_optimizer_state)."""
    if accelerator is None:
        return contextlib.nullcontext()
    files = {context.policy.path: loaded_files(context.policy.path)}
    state = training_state_dir(context.policy.path)
    if fsdp(accelerator) and (state / SHARDED_OPTIMIZER).is_dir():
        files.setdefault(state, [])
        files[state] += [*sharded_state.shard_files(state), OPTIMIZER_STATE]
    if context.reference is not None and context.reference.path != context.policy.path:
        files[context.reference.path] = loaded_files(context.reference.path)
    return checked_beside(files, accelerator)


@dataclass
class KeptState:
    """What a persistent update worker (update.persistent, FSDP) keeps from one step to the next: the
    prepared model, AdamW and KL reference, valid for the checkpoint it wrote (`output`, `identity`)."""
    accelerator: object
    model: object
    tokenizer: object
    optimizer: object
    names: list
    reference: object
    output: Path
    identity: str


class Resident:
    """The place a persistent update worker holds its ranks' KeptState in (at most one), from one step to the
    next; it passes it to the stage as StageContext.resident. A launched `oarctl update` has none."""

    def __init__(self):
        self._kept: KeptState | None = None

    def keep(self, state: KeptState) -> None:
        self._kept = state

    def take(self, policy: Path) -> KeptState | None:
        """The kept state when this step continues from the checkpoint it was kept for (unchanged since),
        taken: training changes it in place, so a step that fails leaves nothing kept (the next loads)."""
        kept, self._kept = self._kept, None
        if kept is None:
            return None
        if policy.resolve() != kept.output.resolve() or policy_identity(policy) != kept.identity:
            return None  # another policy: load it from disk
        return kept


def kept_state(context: StageContext) -> KeptState | None:
    """What the worker that runs this step kept for its policy (None outside a persistent worker)."""
    return context.resident.take(context.policy.path) if context.resident is not None else None


def load_and_prepare(config, context: StageContext, accelerator, accumulation: int):
    """(model, tokenizer, optimizer, names, reference), read from the checkpoint and prepared."""
    model, tokenizer = _load(context.policy, accelerator)
    reference = _load(context.reference, accelerator, trained=False)[0].eval() if context.reference is not None else None
    model, reference, optimizer, names = _prepare(model, reference, config, context, accelerator, accumulation)
    return model, tokenizer, optimizer, names, reference


def continue_kept(kept: KeptState, config, accumulation: int):
    """The kept state, set up for this step as _prepare sets up a loaded one."""
    with_config_rates(kept.optimizer, config)
    kept.accelerator.gradient_accumulation_steps = accumulation
    kept.accelerator.step = 0  # accelerate counts micro-batches to find the last of each accumulation
    return kept.model, kept.tokenizer, kept.optimizer, kept.names, kept.reference
