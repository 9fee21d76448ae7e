"""AdamW state under FSDP: every rank writes its own shard, in parallel; any number of ranks reads it.

Gathering a 7B model's AdamW state (61 GB of fp32 moments) to rank 0 and writing it from there costs
one rank's disk bandwidth and one rank's host memory. Instead each rank hands its shard to
`torch.distributed.checkpoint` (DCP) with its safetensors storage (`HuggingFaceStorageWriter`,
save_distributed): rank r writes `optimizer/shard-0000{r+1}-...safetensors`, holding its slices of
every moment keyed `PARAMETER::exp_avg` / `PARAMETER::exp_avg_sq`, with the slices' offsets in the
file's safetensors metadata. DCP's default metadata file is a pickle; this storage has none (the
offsets are JSON in each file's header), so nothing here is ever unpickled. The scalar state (each
parameter's step count) goes to `optimizer.json` as in the one-process format.

Loading reshards: DCP's planner matches the slices a rank needs against the slices in the files, so an
FSDP run over any number of ranks, or one process (`read_full_state`, full tensors), reads the state
another rank count wrote. The one-process format (`optimizer.safetensors`, whole tensors) is read by
oarctl.checkpoints and scattered by FSDP itself (oarctl/training/setup.py).

Each rank hashes the file it wrote (sha256, while its bytes are still in the page cache) and rank 0
records all digests in checkpoint.json; at load, the files are verified once in all, shared out over
the ranks, beside the load and the training (distributed.checked_beside).
"""
from __future__ import annotations

import math
import time
import warnings
from pathlib import Path

import torch

from oarctl.errors import OarError
from oarctl.hashing import WRITE_HASHING, count_read, sha256_files, verify_checkpoint

# names in a checkpoint's training state that both AdamW formats share; defined here, not in checkpoints, so
# that checkpoints (which reads a sharded state whole) imports this module and not the other way round
SHARDED_OPTIMIZER = "optimizer"  # folder of AdamW shards, one file per FSDP rank
OPTIMIZER_STATE = "optimizer.json"  # the scalar state (step counts), in either format

SCALAR_KEYS = ("step",)  # AdamW's per-parameter scalars: in optimizer.json, not in the shards
MASTER = "master"  # PARAMETER::master: the fp32 weights' slices, when model.safetensors is 16-bit
FILES_PER_RANK = 8  # each rank's shard in this many files, so its hashing runs in as many threads


def plain_name(fqn: str) -> str:
    """A wrapped model's parameter name as `named_parameters()` of the plain model spells it."""
    return fqn.replace("_fsdp_wrapped_module.", "").replace("_checkpoint_wrapped_module.", "")


def _sharded_optimizer_state(model, optimizer) -> dict:
    """This rank's optimizer state dict: moments as ShardedTensor/DTensor slices, keyed by FQN."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    return get_optimizer_state_dict(model, optimizer, options=StateDictOptions(full_state_dict=False))


def _flat_moments(state: dict) -> dict:
    """{"PARAMETER::exp_avg": slice, ...}: the tensors DCP writes (0-dim scalars stay out)."""
    return {f"{plain_name(fqn)}::{key}": value for fqn, entry in state["state"].items()
            for key, value in entry.items() if key not in SCALAR_KEYS}


def scalars(state: dict) -> dict:
    """{"PARAMETER::step": float}: the optimizer.json of this state (the same on every rank)."""
    return {f"{plain_name(fqn)}::{key}": float(value) for fqn, entry in state["state"].items()
            for key, value in entry.items() if key in SCALAR_KEYS}


def _sharded_weights(model) -> dict:
    """{"PARAMETER::master": this rank's slice of the fp32 weight}."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    weights = get_model_state_dict(model, options=StateDictOptions(full_state_dict=False))
    parameters = {plain_name(name) for name, _ in model.named_parameters()}  # a tied output layer once
    return {f"{plain_name(fqn)}::{MASTER}": value for fqn, value in weights.items() if plain_name(fqn) in parameters}


def save_shards(model, optimizer, checkpoint: Path, rank: int, with_master: bool = False) -> tuple[dict, dict]:
    """Write this rank's shard of the AdamW moments (and with_master: of the fp32 weights) into
    checkpoint/optimizer/ (call on every rank). Returns ({relative path: sha256} of the files this rank
    wrote, their I/O}, the scalar state)."""
    from torch.distributed.checkpoint import HuggingFaceStorageWriter, save

    state = _sharded_optimizer_state(model, optimizer)
    moments = {**_flat_moments(state), **(_sharded_weights(model) if with_master else {})}
    folder = checkpoint / SHARDED_OPTIMIZER
    started = time.perf_counter()
    writer = HuggingFaceStorageWriter(str(folder), fqn_to_index_mapping=file_of_each(moments), save_distributed=True)
    save(moments, storage_writer=writer)
    written = sorted(folder.glob(f"shard-{rank + 1:05d}-*.safetensors"))  # DCP numbers the ranks' files from 1
    hashing = time.perf_counter()
    digests = dict(zip((f"{SHARDED_OPTIMIZER}/{p.name}" for p in written), sha256_files(written, WRITE_HASHING)))
    io = {"bytes": sum(p.stat().st_size for p in written), "write_seconds": hashing - started,
          "hash_seconds": time.perf_counter() - hashing}
    return {"digests": digests, "io": io}, scalars(state)


def file_of_each(moments: dict) -> dict[str, int]:
    """{key: file number 1..FILES_PER_RANK}, the largest moments first, each to the least-filled file (the
    same on every rank: by full sizes, not by this rank's slices)."""
    sizes = {key: math.prod(value.size()) for key, value in moments.items()}  # ShardedTensor has no numel()
    totals, assigned = [0] * FILES_PER_RANK, {}
    for key in sorted(sizes, key=lambda k: (-sizes[k], k)):
        target = totals.index(min(totals))
        totals[target] += sizes[key]
        assigned[key] = target + 1
    return assigned


def shard_files(checkpoint: Path) -> list[str]:
    return sorted(f"{SHARDED_OPTIMIZER}/{p.name}" for p in (checkpoint / SHARDED_OPTIMIZER).glob("*.safetensors"))


def _reader(checkpoint: Path):
    from torch.distributed.checkpoint import HuggingFaceStorageReader

    return HuggingFaceStorageReader(str(checkpoint / SHARDED_OPTIMIZER))


def _stored_shapes(checkpoint: Path) -> dict[str, torch.Size]:
    """Full shape of every moment the shards hold (from the files' headers)."""
    try:
        metadata = _reader(checkpoint).read_metadata()
    except Exception as error:  # a damaged header: safetensors and json raise several kinds
        raise OarError(f"{checkpoint / SHARDED_OPTIMIZER}: cannot read the sharded optimizer state "
                       f"({str(error).splitlines()[0][:200]})") from None
    return {key: entry.size for key, entry in metadata.state_dict_metadata.items()}


def _check_keys(checkpoint: Path, stored: dict, wanted: dict) -> None:
    """The shards must hold exactly the moments this model's optimizer has, in its shapes."""
    for key, shape in stored.items():
        if key not in wanted:
            raise OarError(f"{checkpoint}: sharded optimizer state for {key.partition('::')[0]!r}, "
                           "which is not a parameter of this policy")
        if tuple(shape) != tuple(wanted[key]):
            raise OarError(f"{checkpoint}: optimizer {key.partition('::')[2]} of {key.partition('::')[0]} has "
                           f"shape {tuple(shape)}, the parameter {tuple(wanted[key])}")


def _load(target: dict, checkpoint: Path, no_dist: bool) -> None:
    """DCP load into `target` (in place); counts the bytes of the slices this process asked for."""
    from torch.distributed.checkpoint import load

    started = time.perf_counter()
    with warnings.catch_warnings():  # DCP warns that a no_dist load is one process: it is meant to be
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        load(target, storage_reader=_reader(checkpoint), no_dist=no_dist)
    count_read(sum(_local_bytes(value) for value in target.values()), started)


def _local_bytes(value) -> int:
    if hasattr(value, "local_shards"):  # ShardedTensor (FSDP1): this rank's slices
        return sum(shard.tensor.numel() * shard.tensor.element_size() for shard in value.local_shards())
    if hasattr(value, "to_local"):  # DTensor (FSDP2)
        value = value.to_local()
    return value.numel() * value.element_size()


MOMENTS = ("exp_avg", "exp_avg_sq")


def has_master(checkpoint: Path) -> bool:
    return any(key.endswith(f"::{MASTER}") for key in _stored_shapes(checkpoint))


def read_full_state(checkpoint: Path, shapes: dict[str, torch.Size], fields=MOMENTS) -> dict[str, dict]:
    """The shards' `fields` as whole tensors in this one process: {parameter: {field: tensor}} (the
    moments, keyed like read_optimizer_state, or MASTER: the fp32 weights)."""
    verify_checkpoint(checkpoint, lambda name: name.startswith(f"{SHARDED_OPTIMIZER}/"))
    stored = _stored_shapes(checkpoint)
    _check_keys(checkpoint, stored, {f"{name}::{key}": shape for name, shape in shapes.items()
                                     for key in (*MOMENTS, MASTER)})
    target = {key: torch.empty(shape, dtype=torch.float32) for key, shape in stored.items()
              if key.partition("::")[2] in fields}
    _load(target, checkpoint, no_dist=True)
    state: dict[str, dict] = {}
    for key, value in target.items():
        name, _, field = key.partition("::")
        state.setdefault(name, {})[field] = value
    return state


def _set_sharded_weights(model, weights: dict) -> None:
    """Put the loaded fp32 slices into the FSDP model's own shards."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, set_model_state_dict

    own = get_model_state_dict(model, options=StateDictOptions(full_state_dict=False))
    loaded = {fqn: weights[f"{plain_name(fqn)}::{MASTER}"] for fqn in own if f"{plain_name(fqn)}::{MASTER}" in weights}
    # strict=False: a tied output layer has no entry of its own; it shares the embedding just set
    set_model_state_dict(model, loaded, options=StateDictOptions(full_state_dict=False, strict=False))


def load_shards(model, optimizer, checkpoint: Path, step_scalars: dict) -> None:
    """Fill this rank's FSDP optimizer shards from checkpoint/optimizer/, whatever rank count wrote it
    (call on every rank, after `prepare`). The files are checked beside (distributed.checked_beside)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    state = _sharded_optimizer_state(model, optimizer)  # initialises AdamW's state: the shapes to fill
    moments = _flat_moments(state)
    stored = _stored_shapes(checkpoint)
    weights = _sharded_weights(model) if has_master(checkpoint) else {}
    targets = {**moments, **weights}
    _check_keys(checkpoint, stored, {key: value.shape for key, value in targets.items()})
    _load(targets, checkpoint, no_dist=False)  # fills the slices in place
    if weights:
        _set_sharded_weights(model, weights)
    for fqn, entry in state["state"].items():
        for key in SCALAR_KEYS:
            if key in entry:
                recorded = step_scalars.get(f"{plain_name(fqn)}::{key}")
                if recorded is None:
                    raise OarError(f"{checkpoint / OPTIMIZER_STATE}: no {key} for {plain_name(fqn)}")
                entry[key] = torch.full_like(entry[key], recorded)
    set_optimizer_state_dict(model, optimizer, optim_state_dict=state,
                             options=StateDictOptions(full_state_dict=False))
