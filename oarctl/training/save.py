"""Writing the update stage's checkpoint: the full weights gathered from the ranks, the weight files,
the training state (AdamW, fp32 master weights), and the commit of the policy folder (`Trained.write`,
which the runner calls on rank 0 with the stage's output folder).

Only rank 0 writes the policy folder, update.parquet and the canary's reference. Under FSDP/ZeRO-3 the
full weights are gathered for the safetensors save (16-bit under ZeRO-3), on rank 0 into a model built
on the meta device that takes the gathered tensors as they are (no second read of the checkpoint, no
second copy). Under FSDP every rank writes its turn of the weight files into the checkpoint's temporary
folder first, and once rank 0 has committed the policy, every rank writes its own shard of the AdamW
moments (checkpoint/training_state/optimizer/, one safetensors file per rank, oarctl/sharded_state.py)
in parallel; nothing of it is gathered. Rank 0 adds the step counts and moves training_state/ into
place; the stage's manifest, written after that, vouches for both. Under DeepSpeed ZeRO-3 the
partitioned AdamW state is not saved.
"""
from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from oarctl import sharded_state
from oarctl.artifacts import temporary_sibling, write_parquet
from oarctl.checkpoints import (TRAINING_STATE, policy_identity, replace_directory, save_policy, save_training_state,
                                weight_file_plan, write_weight_files, write_weight_index)
from oarctl.contract import StageContext
from oarctl.distributed import deepspeed, fsdp, gather_to_rank_zero, rank, sharded
from oarctl.hashing import WRITE_HASHING
from oarctl.processes.gpus import announce_ready, release_cuda_cache
from oarctl.schema import UpdateConfig
from oarctl.policy.canary import write_reference
from oarctl.training.setup import KeptState


@dataclass
class Trained:
    """What the update stage hands the runner to save as a checkpoint (on rank 0): `write` commits it."""
    model: object
    tokenizer: object
    optimizer: object | None  # an optimizer or its state_dict(); None when the ranks wrote it (FSDP shards)
    names: list[str]  # parameter names, in the optimizer's order
    prewritten: dict = field(default_factory=dict)  # {relative path: sha256} of files the ranks already wrote
    io: dict = field(default_factory=dict)  # the ranks' I/O of those files, for the manifest
    save_dtype: str = "float32"  # of model.safetensors (update.save_dtype)
    master_in_shards: bool = False  # the fp32 weights are in the ranks' shards, not master.safetensors
    weights_written: bool = False  # the ranks wrote the weight files (FSDP): `write` adds the configs only
    weight_file_mb: float = UpdateConfig.weight_file_mb

    def write(self, table, output: Path) -> tuple[str, dict]:
        """Save the checkpoint with `table` as its update.parquet into `output`'s temporary folder (where
        FSDP ranks may have written their weight files already) and move it into place. Returns (the
        policy's identity, metrics of the checkpoint's I/O: bytes written and hashed, seconds)."""
        temporary = temporary_sibling(output)
        hashed, started = dict(WRITE_HASHING), time.perf_counter()
        identity = save_policy(self.model, self.tokenizer, temporary, self.optimizer, self.names,
                               extra_files=[lambda d: write_parquet(table, d / "update.parquet"),
                                            lambda d: write_reference(self.model, self.tokenizer, d)],  # vLLM canary's
                               prewritten=self.prewritten, save_dtype=self.save_dtype,
                               master=not self.master_in_shards, max_file_mb=self.weight_file_mb,
                               weights_written=self.weights_written)
        io = {"checkpoint_bytes_written": _folder_bytes(temporary),
              "checkpoint_bytes_hashed": WRITE_HASHING["bytes"] - hashed["bytes"]  # + what the ranks wrote and hashed
              + self.io.get("weight_file_bytes", 0),
              "checkpoint_hash_seconds": round(WRITE_HASHING["seconds"] - hashed["seconds"], 3), **self.io}
        io["checkpoint_write_seconds"] = round(time.perf_counter() - started - io["checkpoint_hash_seconds"], 3)
        replace_directory(temporary, output)
        return identity, io


def _folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def _save_weight_files(model, state_dict: dict, config, staging: Path, accelerator) -> tuple[dict, dict]:
    """Every FSDP rank writes its turn of the consolidated weight files (file i by rank i mod R) in
    update.save_dtype and hashes them, all at once, instead of rank 0 writing them all. Returns, on
    rank 0, ({file: sha256}, their I/O) after writing the index that names every file."""
    tied = _tied(accelerator.unwrap_model(model).config)
    itemsize = torch.empty(0, dtype=getattr(torch, config.save_dtype)).element_size()
    sizes = {name: tensor.numel() * itemsize for name, tensor in state_dict.items() if name not in tied}
    plan = weight_file_plan(sizes, config.weight_file_mb)
    mine = [name for i, name in enumerate(plan) if i % accelerator.num_processes == rank()]
    written = write_weight_files(state_dict, plan, mine, staging, config.save_dtype)
    everyone = gather_to_rank_zero(written, accelerator)
    if rank() != 0:
        return {}, {}
    write_weight_index(plan, sizes, staging)
    return _merged(everyone, "weight_file")


def _optimizer_state(model, optimizer, names: list[str], accelerator) -> dict | None:
    """What `save_optimizer` writes, in `optimizer.state_dict()` form; None under ZeRO-3 (not saved) and
    under FSDP (every rank writes its own shard: _save_sharded_optimizer)."""
    if deepspeed(accelerator) or fsdp(accelerator):
        return None
    return optimizer.state_dict()  # DDP: every rank holds all of it


def _gathered_weights(model, accelerator) -> dict:
    """The full weights (call on every rank: FSDP/ZeRO-3 gather the shards). Under FSDP every rank gets
    them, on its own device, because every rank writes its share of the weight files; under ZeRO-3 and
    DDP, as accelerate gathers them (rank 0 at least)."""
    if not fsdp(accelerator):
        return accelerator.get_state_dict(model)
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))


def trained_checkpoint(model, tokenizer, optimizer, names: list[str], config, context: StageContext,
             accelerator) -> Trained | None:
    """What the runner saves (rank 0 only; None on the other ranks). Under FSDP the ranks have already
    written, each its share, the weight files into the checkpoint's staging folder; they write the
    training state after the runner has committed the rest (training_state_after_commit)."""
    sixteen_bit = config.save_dtype != "float32"  # then the fp32 weights are saved beside the AdamW state
    if accelerator is None:
        return Trained(model, tokenizer, optimizer, names, save_dtype=config.save_dtype,
                       weight_file_mb=config.weight_file_mb)
    state_dict = _gathered_weights(model, accelerator)
    optimizer_state = _optimizer_state(model, optimizer, names, accelerator)
    prewritten, io = {}, {}
    if fsdp(accelerator):  # the weight files now; the training state once the policy is committed
        prewritten, io = _save_weight_files(model, state_dict, config, _staging(context.output, accelerator),
                                            accelerator)
    accelerator.wait_for_everyone()
    if rank() != 0:
        return None
    if not sharded(accelerator):
        return Trained(accelerator.unwrap_model(model), tokenizer, optimizer_state, names, save_dtype=config.save_dtype,
                       weight_file_mb=config.weight_file_mb)
    weights = {name: tensor.to("cpu") for name, tensor in state_dict.items()}  # rank 0's copy, for the canary
    return Trained(_plain_model(context.policy.path, weights), tokenizer, optimizer_state, names, prewritten, io,
                   config.save_dtype, master_in_shards=fsdp(accelerator) and sixteen_bit,
                   weights_written=fsdp(accelerator), weight_file_mb=config.weight_file_mb)


def _tied(model_config) -> set[str]:
    """The output layer's name when the model ties it to the embedding (not saved, tied again at load)."""
    return {"lm_head.weight"} if getattr(model_config, "tie_word_embeddings", False) else set()


def _plain_model(path, state_dict: dict):
    """An unwrapped model holding the gathered full weights, for save_pretrained: built on the meta device
    and given the gathered tensors themselves (assign), so rank 0 neither reads the checkpoint again nor
    holds a second copy of the weights; the output layer is tied again where the config ties it."""
    from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig

    config = AutoConfig.from_pretrained(path)
    with torch.device("meta"):
        plain = AutoModelForCausalLM.from_config(config)
    missing, unexpected = plain.load_state_dict(state_dict, strict=False, assign=True)
    plain.tie_weights()
    tied = _tied(config)
    if set(missing) - tied or unexpected:
        raise RuntimeError(f"gathered weights do not fit {path}: missing {sorted(set(missing) - tied)}, "
                           f"unexpected {sorted(unexpected)}")
    if (Path(path) / "generation_config.json").exists():
        plain.generation_config = GenerationConfig.from_pretrained(path)
    return plain


def training_state_after_commit(model, optimizer, config, context: StageContext, accelerator,
                                keep: KeptState | None = None):
    """Under FSDP, what the runner calls on every rank once rank 0 has moved the policy (weights,
    configs, canary) into place, with the checkpoint's I/O metrics so far: say the policy is ready (`oarctl
    run` then samples from it while this runs), then write the training state, which only the next update
    reads, and add its I/O to the metrics. `keep`: remember the state for the next step of a persistent
    worker (in context.resident), valid for the checkpoint just written."""
    def write(io: dict) -> dict:
        accelerator.wait_for_everyone()  # rank 0 has committed the policy folder
        release_cuda_cache()  # the gathered weights are gone: the engines get that memory
        if rank() == 0:
            announce_ready(context.output)
        started = time.perf_counter()
        written = _write_sharded_training_state(model, optimizer, context.output, accelerator,
                                                config.save_dtype != "float32")
        if keep is not None:
            accelerator.wait_for_everyone()  # rank 0 has moved training_state/ into place: the checkpoint is whole
            context.resident.keep(dataclasses.replace(keep, identity=policy_identity(context.output)))
        if written:
            written["training_state_seconds"] = round(time.perf_counter() - started, 3)
        return _with_training_state(io, written)
    return write


def _with_training_state(io: dict, written: dict) -> dict:
    """The checkpoint's I/O metrics with those of the training state the ranks wrote after the commit."""
    if not written:
        return io  # ranks other than 0
    shards = written.get("optimizer_shard_bytes", 0)
    return {**io, **written, "checkpoint_bytes_written": io["checkpoint_bytes_written"] + shards,
            "checkpoint_bytes_hashed": io["checkpoint_bytes_hashed"] + shards}


def _staging(target: Path, accelerator) -> Path:
    """`target`'s temporary folder, named by rank 0's process (which writes the rest of it there
    afterwards and moves it into place), on every rank."""
    shared = [str(temporary_sibling(target)) if rank() == 0 else None]
    torch.distributed.broadcast_object_list(shared, src=0)
    staging = Path(shared[0])
    staging.mkdir(parents=True, exist_ok=True)
    return staging


def _merged(entries: list[dict], prefix: str) -> tuple[dict, dict]:
    """The ranks' {"digests", "io"} as one {relative path: sha256} and I/O metrics (slowest rank's seconds)."""
    digests = {name: digest for entry in entries for name, digest in entry["digests"].items()}
    io = {f"{prefix}_bytes": sum(entry["io"]["bytes"] for entry in entries),
          f"{prefix}_write_seconds": round(max(entry["io"]["write_seconds"] for entry in entries), 3),
          f"{prefix}_hash_seconds": round(max(entry["io"]["hash_seconds"] for entry in entries), 3)}
    return digests, io


def _write_sharded_training_state(model, optimizer, output: Path, accelerator, with_master: bool) -> dict:
    """Every FSDP rank writes its shard of the AdamW moments (with_master: and of the fp32 weights) into
    the training state's staging folder, all at once; rank 0 adds the step counts, seals the folder and
    moves it into the committed policy as training_state/. Returns the I/O on rank 0, {} on the others."""
    staging = _staging(output / TRAINING_STATE, accelerator)
    written, scalars = sharded_state.save_shards(model, optimizer.optimizer, staging, rank(), with_master)
    everyone = gather_to_rank_zero(written, accelerator)
    if rank() != 0:
        return {}
    digests, io = _merged(everyone, "optimizer_shard")
    save_training_state(staging, prewritten=digests, scalars=scalars)
    replace_directory(staging, output / TRAINING_STATE)
    return io
