"""Policy checkpoints: their layout, and saving and loading them (safetensors weights, tokenizer,
optimizer state, and a hash manifest).

`checkpoint.json` lists the sha256 of every file; loading verifies them, so a truncated or
tampered checkpoint is refused instead of silently training on garbage. Pickle is never used:
transformers is told `use_safetensors=True`, and optimizer moments are stored as safetensors.
The hashing itself (a memo per process, the counters the manifests report, verification) is in
oarctl/hashing.py.

Layout: the policy folder holds what engines, attribution and users load (weights in the served dtype,
configs, tokenizer, the canary reference, update.parquet), listed in its checkpoint.json, which names
the policy (`policy_identity`). What only the next update reads (the AdamW state and, for 16-bit
weights, the fp32 weights) is in `training_state/`, with a checkpoint.json of its own. So the policy can
be committed, and sampled from, while the training state is still being written (FSDP ranks do that:
oarctl/training/save.py); the update stage's manifest, written last, vouches for both. Checkpoints of
earlier versions kept the training state beside the weights: `training_state_dir` reads those too.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from oarctl.errors import OarError
from oarctl.hashing import MANIFEST, PRUNED, WRITE_HASHING, count_read, sha256_files, verify_checkpoint
from oarctl.hashing import HASHING, READING, BackgroundCheck, sha256_file  # noqa: F401 re-export for one release: oarctl.hashing
from oarctl.schema import UpdateConfig
from oarctl.sharded_state import MASTER, OPTIMIZER_STATE, SHARDED_OPTIMIZER, has_master, read_full_state

WEIGHTS = "model.safetensors"  # the weights in one file, or with WEIGHTS_INDEX, in several (transformers' names)
WEIGHTS_INDEX = "model.safetensors.index.json"
OPTIMIZER_TENSORS = "optimizer.safetensors"
MASTER_WEIGHTS = "master.safetensors"  # fp32 weights training continues from, when model.safetensors is 16-bit
TRAINING_STATE = "training_state"  # subfolder with the files above and its own checkpoint.json (see below)
# also the training state's: OPTIMIZER_STATE (optimizer.json, the step counts) and SHARDED_OPTIMIZER (optimizer/,
# the FSDP ranks' AdamW shards), named in oarctl/sharded_state.py, which reads and writes those shards


def _file_hashes(directory: Path, known: dict[str, str] | None = None) -> dict[str, str]:
    """{relative path: sha256} of every file under `directory`; `known` digests (files other ranks wrote
    and hashed) are taken as they are, not hashed again."""
    known = known or {}
    files = [*directory.iterdir(), *(directory / SHARDED_OPTIMIZER).glob("*")]  # other folders: not ours
    names = sorted(p.relative_to(directory).as_posix() for p in files if p.is_file() and p.name != MANIFEST)
    missing = [name for name in known if name not in names]
    if missing:
        raise OarError(f"{directory}: files written by other ranks are missing: {missing}")
    unknown = [name for name in names if name not in known]
    return {**known, **dict(zip(unknown, sha256_files([directory / n for n in unknown], WRITE_HASHING)))}


def policy_identity(directory: str | Path) -> str:
    """A content hash naming a policy: from checkpoint.json when we wrote it, else from its files."""
    directory = Path(directory)
    if not directory.is_dir():
        raise OarError(f"{directory}: policy directory not found")
    manifest = directory / MANIFEST
    files = json.loads(manifest.read_text())["files"] if manifest.exists() else _file_hashes(directory)
    if not any(name.endswith(".safetensors") for name in files):
        raise OarError(f"{directory}: no safetensors weights (pickled weights are never loaded)")
    return hashlib.sha256(json.dumps(files, sort_keys=True).encode()).hexdigest()


OPTIMIZER_FILES = (OPTIMIZER_TENSORS, OPTIMIZER_STATE, MASTER_WEIGHTS)
LOG_FILES = ("update.parquet",)


def is_training_state(name: str) -> bool:
    """Files only the update stage reads (AdamW state, one-process or sharded form)."""
    return name in OPTIMIZER_FILES or name.startswith(f"{SHARDED_OPTIMIZER}/")


def training_state_dir(policy: Path) -> Path:
    """Where a policy's training state is: policy/training_state/, or the policy folder itself for a
    checkpoint without one (earlier versions, a model we did not write: then it has no state)."""
    folder = Path(policy) / TRAINING_STATE
    if not folder.is_dir():
        return Path(policy)
    if not (folder / MANIFEST).exists():
        raise OarError(f"{folder}: the training state is incomplete (no {MANIFEST}): the update that wrote "
                       "this policy did not finish; rerun it")
    return folder


def seal(directory: Path, prewritten: dict[str, str] | None = None) -> dict[str, str]:
    """Hash the files of a finished folder (those not `prewritten` by other ranks) into its checkpoint.json."""
    files = _file_hashes(directory, prewritten)
    (directory / MANIFEST).write_text(json.dumps({"files": files}, indent=1, sort_keys=True))
    return files


def load_tokenizer(directory: str | Path):
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(Path(directory))
    except (OSError, ValueError) as error:
        raise OarError(f"{directory}: cannot load the tokenizer ({str(error).splitlines()[0]})") from None


def read_by_loaders(name: str) -> bool:
    """The files of a checkpoint that load_policy reads (weights, configs, tokenizer), by recorded name."""
    return not is_training_state(name) and name not in LOG_FILES


def loaded_files(directory: Path) -> list[str]:
    """The recorded names of the files load_policy reads ([] for a folder we did not write)."""
    manifest = Path(directory) / MANIFEST
    if not manifest.exists():
        return []
    return sorted(name for name in json.loads(manifest.read_text())["files"] if read_by_loaders(name))


def load_policy(directory: str | Path, device: str = "cpu", dtype: str = "float32", verified: bool = False):
    """(model, tokenizer) from a model directory, weights from safetensors only, in `dtype` (float32 for
    training; the attribute stage may take bfloat16, half the memory of a copy per rank). `verified`: the
    caller has checked the files against checkpoint.json already (ranks that share the hashing out)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as transformers_logging

    transformers_logging.disable_progress_bar()  # our own progress bars are enough

    directory = Path(directory)
    policy_identity(directory)  # existence and safetensors checks
    if not verified:
        verify_checkpoint(directory, read_by_loaders)
    started = time.perf_counter()
    try:
        tokenizer = AutoTokenizer.from_pretrained(directory)
        model = AutoModelForCausalLM.from_pretrained(directory, use_safetensors=True,
                                                     dtype=getattr(torch, dtype))
    except (OSError, ValueError) as error:
        raise OarError(f"{directory}: cannot load the policy ({str(error).splitlines()[0]})") from None
    count_read(sum(p.stat().st_size for p in directory.glob("model*.safetensors")), started)
    if tokenizer.pad_token_id is None:
        raise OarError(f"{directory}: tokenizer has no pad token")
    return model.to(device), tokenizer


def read_scalars(directory: Path) -> dict:
    """optimizer.json: {"PARAMETER::step": number}."""
    try:
        scalars = json.loads((directory / OPTIMIZER_STATE).read_text())
    except (OSError, ValueError) as error:
        raise OarError(f"{directory}: cannot read the optimizer state ({str(error).splitlines()[0]})") from None
    if not (isinstance(scalars, dict) and all(isinstance(v, (int, float)) for v in scalars.values())):
        raise OarError(f"{directory}: {OPTIMIZER_STATE} is not a mapping of names to numbers")
    return scalars


def save_optimizer(optimizer: torch.optim.Optimizer | dict, names: list[str], directory: Path) -> None:
    """AdamW moments as safetensors (keyed by parameter name) plus the scalar state as JSON.

    `optimizer` may be an optimizer's `state_dict()` already taken (under accelerate, on every rank), or
    one of that form built from FSDP's gathered full state: {"state": {parameter index: {key: value}}}.
    """
    tensors, scalars = {}, {}
    state = (optimizer if isinstance(optimizer, dict) else optimizer.state_dict())["state"]
    for index, name in enumerate(names):
        for key, value in state.get(index, {}).items():
            if torch.is_tensor(value) and value.dim() > 0:
                tensors[f"{name}::{key}"] = value.detach().cpu().contiguous()
            else:
                scalars[f"{name}::{key}"] = float(value)
    save_file(tensors, directory / OPTIMIZER_TENSORS)
    (directory / OPTIMIZER_STATE).write_text(json.dumps(scalars, sort_keys=True))


def read_optimizer_state(directory: Path, shapes: dict[str, torch.Size]) -> dict[str, dict] | None:
    """The state written by `save_optimizer` keyed by parameter name, e.g. {"exp_avg": ..., "step": ...};
    None when the directory has none. `shapes` (name -> parameter shape) refuses another model's state.
    A state FSDP ranks wrote in shards (optimizer/) is read whole (resharded to one process)."""
    if (directory / SHARDED_OPTIMIZER).is_dir():
        verify_checkpoint(directory, lambda name: name == OPTIMIZER_STATE)
        state = read_full_state(directory, shapes)
        for key, value in read_scalars(directory).items():
            name, _, field = key.partition("::")
            state.setdefault(name, {})[field] = torch.tensor(value)
        return state
    if not (directory / OPTIMIZER_TENSORS).exists():
        return None
    verify_checkpoint(directory, lambda name: name in (OPTIMIZER_TENSORS, OPTIMIZER_STATE))
    started = time.perf_counter()
    try:
        tensors = load_file(directory / OPTIMIZER_TENSORS)
    except (OSError, ValueError, SafetensorError) as error:
        raise OarError(f"{directory}: cannot read the optimizer state ({str(error).splitlines()[0]})") from None
    count_read((directory / OPTIMIZER_TENSORS).stat().st_size, started)
    scalars = read_scalars(directory)
    state: dict[str, dict] = {}
    for key, value in [*tensors.items(), *((k, torch.tensor(v)) for k, v in scalars.items())]:
        name, _, field = key.partition("::")
        if name not in shapes:
            raise OarError(f"{directory}: optimizer state for {name!r}, which is not a parameter of this policy")
        if value.dim() > 0 and value.shape != shapes[name]:
            raise OarError(f"{directory}: optimizer {field} of {name} has shape {tuple(value.shape)}, "
                           f"the parameter {tuple(shapes[name])}")
        state.setdefault(name, {})[field] = value
    return state


def load_optimizer(optimizer: torch.optim.Optimizer, names: list[str], directory: Path) -> bool:
    """Restore AdamW state written by `save_optimizer`; False when the directory has none."""
    parameters = [p for group in optimizer.param_groups for p in group["params"]]
    state = read_optimizer_state(directory, {name: p.shape for name, p in zip(names, parameters)})
    if state is None:
        return False
    state_dict = optimizer.state_dict()
    for index, name in enumerate(names):
        if name in state:
            state_dict["state"][index] = state[name]
    optimizer.load_state_dict(state_dict)
    return True


def save_master(model, directory: Path) -> None:
    """The fp32 parameters (tied ones once: named_parameters() lists them once) as master.safetensors."""
    save_file({name: p.detach().float().cpu().contiguous() for name, p in model.named_parameters()},
              directory / MASTER_WEIGHTS)


def _read_master(directory: Path, shapes: dict) -> dict | None:
    """{parameter: fp32 tensor} from master.safetensors or the FSDP shards; None when neither has it."""
    if (directory / SHARDED_OPTIMIZER).is_dir():
        if not has_master(directory):
            return None
        return {name: entry[MASTER] for name, entry in read_full_state(directory, shapes, (MASTER,)).items()}
    if not (directory / MASTER_WEIGHTS).exists():
        return None
    verify_checkpoint(directory, lambda name: name == MASTER_WEIGHTS)
    started = time.perf_counter()
    try:
        master = load_file(directory / MASTER_WEIGHTS)
    except (OSError, SafetensorError) as error:
        raise OarError(f"{directory / MASTER_WEIGHTS}: cannot read the fp32 weights ({str(error).splitlines()[0]})") from None
    count_read((directory / MASTER_WEIGHTS).stat().st_size, started)
    return master


def load_master(model, directory: Path, shards: bool = True) -> bool:
    """Put the checkpoint's fp32 weights into the model's parameters (a model loaded from a 16-bit
    model.safetensors), from master.safetensors or, with `shards`, the FSDP ranks' shards read whole;
    False when the checkpoint has none (its model.safetensors is the fp32 weights)."""
    parameters = dict(model.named_parameters())
    if not shards and (directory / SHARDED_OPTIMIZER).is_dir():
        return False
    master = _read_master(directory, {name: p.shape for name, p in parameters.items()})
    if master is None:
        return False
    if master.keys() != parameters.keys() or any(master[n].shape != parameters[n].shape for n in master):
        raise OarError(f"{directory / MASTER_WEIGHTS}: its tensors are not this policy's parameters")
    with torch.no_grad():
        for name, parameter in parameters.items():
            parameter.copy_(master[name])
    return True


def save_training_state(directory: Path, model=None, optimizer=None, parameter_names=None,
                        prewritten: dict[str, str] | None = None, scalars: dict | None = None) -> dict[str, str]:
    """Write the training state into `directory` (a temporary folder) and seal it: the fp32 weights of
    `model` (master.safetensors, when the policy's weights are 16-bit), the AdamW state of `optimizer`
    (or, from FSDP ranks that wrote their shards there already, its step counts `scalars`)."""
    directory.mkdir(parents=True, exist_ok=True)
    if model is not None:
        save_master(model, directory)
    if optimizer is not None:
        save_optimizer(optimizer, parameter_names, directory)
    if scalars is not None:
        (directory / OPTIMIZER_STATE).write_text(json.dumps(scalars, sort_keys=True))
    return seal(directory, prewritten)


def save_policy(model, tokenizer, directory: Path, optimizer=None, parameter_names=None, extra_files=(),
                prewritten: dict[str, str] | None = None, save_dtype: str = "float32", master: bool = True,
                max_file_mb: float = UpdateConfig.weight_file_mb, weights_written: bool = False) -> str:
    """Write a complete checkpoint into `directory` (a temporary folder) and its hash manifest.
    `prewritten`: {relative path: sha256} of the weight files and their index that FSDP ranks already
    wrote there (with `weights_written`: then only the configs are written here).
    `save_dtype` other than float32: the weights in that dtype (the model is cast in place), and the
    fp32 weights in training_state/master.safetensors unless `master` is False (FSDP ranks write them
    in their shards). `optimizer`: its state in training_state/ (None: the ranks write it there later).
    Weights go in files of at most `max_file_mb` (update.weight_file_mb), so loaders hash them in threads."""
    from transformers.utils import logging as transformers_logging

    from oarctl.distributed import quiet_deepspeed_without_gpus

    quiet_deepspeed_without_gpus()  # save_pretrained imports DeepSpeed where it is installed
    transformers_logging.disable_progress_bar()
    directory.mkdir(parents=True, exist_ok=True)
    keeps_master = save_dtype != "float32" and master
    if optimizer is not None or keeps_master:  # before the cast below
        save_training_state(directory / TRAINING_STATE, model if keeps_master else None, optimizer, parameter_names)
    if save_dtype != "float32":
        model.to(getattr(torch, save_dtype))
    if weights_written:  # as save_pretrained records them
        model.config.dtype, model.config.architectures = save_dtype, [type(model).__name__]
        model.config.save_pretrained(directory)
        if model.can_generate():
            model.generation_config.save_pretrained(directory)
    else:
        model.save_pretrained(directory, safe_serialization=True, max_shard_size=int(max_file_mb * 1e6))
    tokenizer.save_pretrained(directory)
    for writer in extra_files:
        writer(directory)
    seal(directory, prewritten)
    return policy_identity(directory)


def weight_file_plan(sizes: dict[str, int], max_file_mb: float) -> dict[str, list[str]]:
    """{file name: tensor names}: the tensors in name order, a new file whenever the next one would take the
    current file past `max_file_mb`; one file is model.safetensors, N are model-0000i-of-0000N.safetensors
    (the names transformers gives, so every loader reads them through the index)."""
    groups, size = [[]], 0
    for name in sorted(sizes):
        if groups[-1] and size + sizes[name] > max_file_mb * 1e6:
            groups.append([])
            size = 0
        groups[-1].append(name)
        size += sizes[name]
    if len(groups) == 1:
        return {WEIGHTS: groups[0]}
    return {f"model-{i + 1:05d}-of-{len(groups):05d}.safetensors": names for i, names in enumerate(groups)}


def write_weight_files(state: dict, plan: dict[str, list[str]], files: list[str], directory: Path,
                       dtype: str) -> dict:
    """Write `files` of the plan from the full weights `state` in `dtype`, then hash them (in threads).
    FSDP ranks each call it with their own files, at the same time. Returns {"digests": {file: sha256},
    "io": bytes, write and hash seconds}, the form sharded_state.save_shards returns."""
    started = time.perf_counter()
    for name in files:
        tensors = {key: state[key].detach().to("cpu", getattr(torch, dtype)).contiguous() for key in plan[name]}
        save_file(tensors, directory / name, metadata={"format": "pt"})
    hashing = time.perf_counter()
    digests = dict(zip(files, sha256_files([directory / name for name in files], WRITE_HASHING)))
    io = {"bytes": sum((directory / name).stat().st_size for name in files), "write_seconds": hashing - started,
          "hash_seconds": time.perf_counter() - hashing}
    return {"digests": digests, "io": io}


def read_weights(directory: str | Path) -> dict[str, torch.Tensor]:
    """Every tensor of a checkpoint's weights, from model.safetensors or its several files (no check)."""
    return {name: tensor for path in sorted(Path(directory).glob("model*.safetensors"))
            for name, tensor in load_file(path).items()}


def write_weight_index(plan: dict[str, list[str]], sizes: dict[str, int], directory: Path) -> None:
    if len(plan) > 1:
        weight_map = {key: name for name, keys in plan.items() for key in keys}
        index = {"metadata": {"total_size": sum(sizes.values())}, "weight_map": dict(sorted(weight_map.items()))}
        (directory / WEIGHTS_INDEX).write_text(json.dumps(index, indent=2))


def replace_directory(temporary: Path, final: Path) -> None:
    """Move a finished folder into place; a stale one at `final` is removed first."""
    for path in temporary.rglob("*"):
        if path.is_file():
            with open(path, "rb") as handle:
                os.fsync(handle.fileno())
    if final.exists():
        shutil.rmtree(final)
    os.replace(temporary, final)


def prune(directory: Path) -> None:
    """Drop a checkpoint's weights but keep checkpoint.json, so its identity stays known."""
    for path in directory.iterdir():
        if path.is_dir():
            shutil.rmtree(path)  # the AdamW shards
        elif path.name != MANIFEST:
            path.unlink()
    (directory / PRUNED).write_text("weights pruned by run.keep_checkpoints\n")
