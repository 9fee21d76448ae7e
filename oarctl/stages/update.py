"""update: advantages + policy -> a new policy checkpoint (+ update.parquet, one row per optimizer step).

PPO-style clipped surrogate on the token advantages, using the stored sampling log-probs as the old
policy, `epochs` passes over the batch in mini-batches, each accumulated over micro-batches (fixed
size, or packed to `micro_batch_tokens`; see oarctl/batching.py for the exact loss shares). AdamW
state travels with the checkpoint, so step k+1 continues the optimizer of step k, as in-process
trainers do. Logged token means (entropy, clip_fraction, ratio_mean, kl) are weighted like the loss:
by sequences in the seq-mean modes, so there they depend a little on how rows are cut.

Training at scale: the stage runs under `accelerate launch`, one config per strategy:
    accelerate launch --config_file configs/accelerate/ddp.yaml -m oarctl.cli update \
        step_0000/advantages.parquet -o step_0000/policy --policy MODEL_DIR -c CONFIG.yaml
with ddp.yaml (whole model per GPU), fsdp.yaml (full shard, one unit per Qwen2DecoderLayer) or
deepspeed_zero3.yaml (ZeRO-3, bf16); `--num_processes N` sets the GPU count, `--set update.bf16=true`
turns on bf16 autocast. cpu-2proc.yaml (DDP) and cpu-fsdp-2proc.yaml (FSDP) run two CPU ranks (gloo), as
the tests do (accelerate would turn FSDP on CPU into DDP; `distributed.keep_fsdp_on_cpu` keeps it FSDP). Every rank reads
the whole batch and takes rows i % ranks of each mini-batch; the ranks average the gradients and
accelerate divides by the accumulation steps, so each loss is multiplied by both and the sum is the
single-process gradient. Ranks pad with zero-weight micro-batches to the same count (FSDP/ZeRO-3
gather parameters in every forward). Only rank 0 writes the checkpoint, update.parquet and the
manifest. Without a launcher (one process, `bf16` off) no Accelerator is made and the bytes are
those of a plain PyTorch loop. Under FSDP/ZeRO-3 the full weights are gathered on rank 0 for the
safetensors save (16-bit under ZeRO-3), into a model built on the meta device that takes the gathered
tensors as they are (no second read of the checkpoint, no second copy); the KL reference model is
replicated, not sharded.
Loading under FSDP with fsdp_cpu_ram_efficient_loading (fsdp.yaml, cpu-fsdp-2proc.yaml): rank 0 reads
the policy, the other ranks build it on the meta device and get rank 0's weights by broadcast (FSDP's
sync_module_states on GPUs; on CPU, where FSDP refuses it, distributed.receive_rank_zero_weights).
AdamW state under FSDP: every rank writes its own shard of the moments (checkpoint/optimizer/, one
safetensors file per rank, oarctl/sharded_state.py) in parallel, into the checkpoint's temporary folder
before rank 0 adds the rest; nothing of it is gathered. Any rank count reads it (DCP reshards), and one
process or DDP reads it whole, so FSDP, DDP and one process continue each other's checkpoints; FSDP
also reads one process's `optimizer.safetensors` (rank 0 reads, torch scatters it into the shards).
Under DeepSpeed ZeRO-3 the partitioned AdamW state is neither saved nor loaded: each step starts a
fresh optimizer there (with a warning when the checkpoint has a state).
In a persistent worker (update.persistent, FSDP; oarctl/update_worker.py) the ranks keep the prepared
model, AdamW and KL reference (`Resident`) for the checkpoint they wrote: the next step, if it starts
from that checkpoint unchanged, trains on from memory and reads nothing (manifest: resident 1).
"""
from __future__ import annotations

import contextlib
import dataclasses
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from tqdm.auto import tqdm

from oarctl import sharded_state
from oarctl.artifacts import make_table, temporary_sibling
from oarctl.batching import loss_share, pad_plan, plan_step
from oarctl.checkpoints import (OPTIMIZER_STATE, OPTIMIZER_TENSORS, SHARDED_OPTIMIZER, TRAINING_STATE, load_master,
                                load_optimizer, load_policy, load_tokenizer, loaded_files, policy_identity,
                                read_optimizer_state,
                                read_scalars, replace_directory, save_training_state, training_state_dir,
                                weight_file_plan, write_weight_files, write_weight_index)
from oarctl.distributed import (checked_beside, deepspeed, every_rank_reads, fsdp, gather_to_rank_zero,
                                loads_on_rank_zero_only, make_accelerator, on_rank_zero, raise_on_every_rank,
                                receive_rank_zero_weights, sharded)
from oarctl.errors import OarError
from oarctl.launch import announce_ready, release_cuda_cache
from oarctl.losses import policy_loss
from oarctl.policy.logprobs import model_device, pad_rows, response_token_stats
from oarctl.runner import StageContext, StageOutput, Trained

VERSION = "3"  # 2: under token-mean, losses and metrics weighted by token share; 3: entropy at the sampling temperature


def _micro_batch_loss(model, reference, batch: dict, config, pad_id: int):
    device = model_device(model)
    mask = pad_rows([[1.0] * len(r) for r in batch["response_token_ids"]], 0.0, torch.float32).to(device)
    stats = dict(prompts=batch["prompt_token_ids"], responses=batch["response_token_ids"], pad_id=pad_id,
                 temperature=batch["temperature"], chunk_tokens=config.logit_chunk_tokens)
    logprobs, entropy = response_token_stats(model, **stats)
    ref_logprobs = None
    if reference is not None:
        with torch.no_grad():
            ref_logprobs, _ = response_token_stats(reference, **stats)

    def padded(name, value):
        return pad_rows(batch[name], value, torch.float32).to(device)

    loss, metrics = policy_loss(
        logprobs, padded("response_logprobs", 0.0), padded("token_advantages", 0.0), mask,
        clip_low=config.clip_low, clip_high=config.clip_high, aggregation=config.loss_aggregation,
        max_length=config.sum_norm_length, ref_logprobs=ref_logprobs, kl_coef=config.kl_coef)
    metrics["entropy"] = float((entropy * mask).sum() / mask.sum())
    metrics["tokens"] = int(mask.sum())
    return loss, metrics


def _accumulating(accelerator, model):
    """accelerate's accumulate: gradients are reduced over ranks on the last micro-batch only."""
    return contextlib.nullcontext() if accelerator is None else accelerator.accumulate(model)


def _backward(loss, micro, accelerator, scale: int) -> None:
    share = loss * micro.numerator / micro.denominator
    if accelerator is None:
        share.backward()
    else:  # accelerate divides by the accumulation steps and the ranks average: `scale` undoes both
        accelerator.backward(share * scale)


def _clip(model, accelerator, max_grad_norm: float) -> float:
    max_norm = max_grad_norm if max_grad_norm > 0 else float("inf")
    if accelerator is None:
        parameters = [p for p in model.parameters() if p.requires_grad]
        return float(torch.nn.utils.clip_grad_norm_(parameters, max_norm))
    norm = accelerator.clip_grad_norm_(model.parameters(), max_norm)  # DeepSpeed clips in its step
    return float("nan") if norm is None else float(norm)


_METRIC_NAMES = ("loss", "pg_loss", "clip_fraction", "kl", "ratio_mean", "entropy")  # policy_loss + entropy


def _summed_metrics(collected: list, accelerator) -> dict:
    """Sum over micro-batches (and ranks) of loss share x metric, plus the token count."""
    if accelerator is None:
        names = [k for k in collected[0][1] if k != "tokens"]
        sums = {k: sum(n * m[k] for n, m in collected) for k in names}
        return {**sums, "tokens": sum(m["tokens"] for _, m in collected)}
    names = list(_METRIC_NAMES)  # fixed, so the reduced vectors line up on every rank
    local = [sum(n * m[k] for n, m in collected) for k in names] + [sum(m["tokens"] for _, m in collected)]
    total = accelerator.reduce(torch.tensor(local, dtype=torch.float64, device=accelerator.device), "sum")
    return {**dict(zip(names, total[:-1].tolist())), "tokens": int(total[-1])}


def _optimizer_step(model, optimizer, reference, rows: list[dict], plan: list, config, pad_id: int,
                    accelerator=None, scale: int = 1) -> dict:
    optimizer.zero_grad(set_to_none=True)
    collected = []
    for micro in plan:
        with _accumulating(accelerator, model):
            batch = {key: [rows[i][key] for i in micro.rows] for key in rows[0]}
            loss, metrics = _micro_batch_loss(model, reference, batch, config, pad_id)
            _backward(loss, micro, accelerator, scale)
        if not micro.filler:
            collected.append((micro.numerator, metrics))
    grad_norm = _clip(model, accelerator, config.max_grad_norm)
    optimizer.step()
    sums = _summed_metrics(collected, accelerator)
    # weighted like the loss, so `loss` is the mini-batch loss however rows were cut or spread
    total = loss_share(rows, [], config.loss_aggregation)[1]
    averaged = {k: v / total for k, v in sums.items() if k != "tokens"}
    return {**averaged, "tokens": sums["tokens"], "grad_norm": grad_norm}


COLUMNS = ["prompt_token_ids", "response_token_ids", "response_logprobs", "token_advantages", "temperature"]


def _mini_batches(rows: list[dict], config, context: StageContext) -> list[tuple[int, list[dict]]]:
    """(epoch, rows) of every optimizer step, a fresh shuffle per pass over the batch."""
    orders = [np.random.default_rng([context.seed, context.step, epoch]).permutation(len(rows))
              for epoch in range(config.epochs)]
    return [(epoch, [rows[i] for i in orders[epoch][start:start + config.mini_batch_size]])
            for epoch in range(config.epochs) for start in range(0, len(rows), config.mini_batch_size)]


def _plans(steps, config, accelerator) -> tuple[list[list], int]:
    """This rank's micro-batches per step, padded so every rank runs the same number; and that number."""
    if accelerator is None:
        return [plan_step(mini, config) for _, mini in steps], 1
    ranks, rank = accelerator.num_processes, accelerator.process_index
    everyone = [[plan_step(mini, config, r, ranks) for r in range(ranks)] for _, mini in steps]
    count = max(len(plan) for per_rank in everyone for plan in per_rank)
    return [pad_plan(per_rank[rank], count) for per_rank in everyone], count


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
    elif deepspeed(accelerator) and (state / OPTIMIZER_TENSORS).exists() and accelerator.is_main_process:
        print("update: DeepSpeed ZeRO-3 run: the saved AdamW state is not loaded (fresh optimizer)", file=sys.stderr)
    return _with_config_rates(optimizer, config)


def _with_config_rates(optimizer, config):
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
    if accelerator.is_main_process:  # keyed by parameter name (FQN), the form torch's full state dict has
        hyperparameters = {k: v for k, v in optimizer.param_groups[0].items() if k != "params"}  # the config's
        full = {"state": state, "param_groups": [{**hyperparameters, "params": names}]}
    set_optimizer_state_dict(model, optimizer.optimizer, optim_state_dict=full,
                             options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True))


def _load_sharded_optimizer(model, optimizer, directory: Path, accelerator) -> None:
    """Every rank reads the slices of its own parameters (the files are checked beside: _checked_inputs)."""
    scalars = on_rank_zero(accelerator, lambda: read_scalars(directory))
    shared = [scalars]
    torch.distributed.broadcast_object_list(shared, src=0)  # numbers only: {"PARAMETER::step": float}
    try:
        sharded_state.load_shards(model, optimizer.optimizer, directory, shared[0])
        problem = None
    except OarError as error:
        problem = str(error)
    raise_on_every_rank(problem, accelerator)


def _staging(target: Path, accelerator) -> Path:
    """`target`'s temporary folder, named by rank 0's process (which writes the rest of it there
    afterwards and moves it into place), on every rank."""
    shared = [str(temporary_sibling(target)) if accelerator.is_main_process else None]
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
    written, scalars = sharded_state.save_shards(model, optimizer.optimizer, staging, accelerator.process_index,
                                                 with_master)
    everyone = gather_to_rank_zero(written, accelerator)
    if not accelerator.is_main_process:
        return {}
    digests, io = _merged(everyone, "optimizer_shard")
    save_training_state(staging, prewritten=digests, scalars=scalars)
    replace_directory(staging, output / TRAINING_STATE)
    return io


def _training_state_after_commit(model, optimizer, config, context: StageContext, accelerator,
                                 keep: Resident | None = None):
    """Under FSDP, what the runner calls on every rank once rank 0 has moved the policy (weights,
    configs, canary) into place: say the policy is ready (`oarctl run` then samples from it while this
    runs), then write the training state, which only the next update reads. `keep`: remember the state
    for the next step of a persistent worker, valid for the checkpoint just written."""
    def write() -> dict:
        accelerator.wait_for_everyone()  # rank 0 has committed the policy folder
        release_cuda_cache()  # the gathered weights are gone: the engines get that memory
        if accelerator.is_main_process:
            announce_ready(context.output)
        started = time.perf_counter()
        io = _write_sharded_training_state(model, optimizer, context.output, accelerator,
                                           config.save_dtype != "float32")
        _RESIDENT.clear()
        if keep is not None:
            accelerator.wait_for_everyone()  # rank 0 has moved training_state/ into place: the checkpoint is whole
            _RESIDENT.append(dataclasses.replace(keep, identity=policy_identity(context.output)))
        return {**io, "training_state_seconds": round(time.perf_counter() - started, 3)} if io else {}
    return write


def _save_weight_files(model, state_dict: dict, config, staging: Path, accelerator) -> tuple[dict, dict]:
    """Every FSDP rank writes its turn of the consolidated weight files (file i by rank i mod R) in
    update.save_dtype and hashes them, all at once, instead of rank 0 writing them all. Returns, on
    rank 0, ({file: sha256}, their I/O) after writing the index that names every file."""
    tied = _tied(accelerator.unwrap_model(model).config)
    itemsize = torch.empty(0, dtype=getattr(torch, config.save_dtype)).element_size()
    sizes = {name: tensor.numel() * itemsize for name, tensor in state_dict.items() if name not in tied}
    plan = weight_file_plan(sizes, config.weight_file_mb)
    mine = [name for i, name in enumerate(plan) if i % accelerator.num_processes == accelerator.process_index]
    written = write_weight_files(state_dict, plan, mine, staging, config.save_dtype)
    everyone = gather_to_rank_zero(written, accelerator)
    if not accelerator.is_main_process:
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


def _trained(model, tokenizer, optimizer, names: list[str], config, context: StageContext,
             accelerator) -> Trained | None:
    """What the runner saves (rank 0 only; None on the other ranks). Under FSDP the ranks have already
    written, each its share, the weight files into the checkpoint's staging folder; they write the
    training state after the runner has committed the rest (_training_state_after_commit)."""
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
    if not accelerator.is_main_process:
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
            if accelerator.is_main_process:  # which wrapper really runs: accelerate can fall back to DDP quietly
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
    on_meta = rank_zero_reads and not accelerator.is_main_process
    if accelerator is None:
        model, tokenizer = policy.load()
    elif on_meta:
        print(f"update: rank {accelerator.process_index} built the policy on the meta device (rank 0 reads the "
              "weights and they are broadcast to the other ranks)", file=sys.stderr)
        model, tokenizer = _meta_model(policy.path), load_tokenizer(policy.path)
    else:  # every rank reads the weights; each hashes its share of the files beside (_checked_inputs)
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


def _checked_inputs(context: StageContext, accelerator):
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
class Resident:
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


_RESIDENT: list[Resident] = []  # at most one, in a persistent worker's ranks


def _resident(context: StageContext) -> Resident | None:
    """The kept state when this step continues from the checkpoint it was kept for (unchanged since),
    taken: training changes it in place, so a step that fails leaves nothing kept (the next loads)."""
    if not _RESIDENT:
        return None
    kept = _RESIDENT.pop()
    path = context.policy.path
    if path.resolve() != kept.output.resolve() or policy_identity(path) != kept.identity:
        return None  # another policy: load it from disk
    return kept


def _loaded(config, context: StageContext, accelerator, accumulation: int):
    """(model, tokenizer, optimizer, names, reference), read from the checkpoint and prepared."""
    model, tokenizer = _load(context.policy, accelerator)
    reference = _load(context.reference, accelerator, trained=False)[0].eval() if context.reference is not None else None
    model, reference, optimizer, names = _prepare(model, reference, config, context, accelerator, accumulation)
    return model, tokenizer, optimizer, names, reference


def _continued(kept: Resident, config, accumulation: int):
    """The kept state, set up for this step as _prepare sets up a loaded one."""
    _with_config_rates(kept.optimizer, config)
    kept.accelerator.gradient_accumulation_steps = accumulation
    kept.accelerator.step = 0  # accelerate counts micro-batches to find the last of each accumulation
    return kept.model, kept.tokenizer, kept.optimizer, kept.names, kept.reference


def _train(rows: list[dict], config, context: StageContext, accelerator, kept: Resident | None = None):
    """(model, tokenizer, optimizer, parameter names, KL reference, one log entry per optimizer step, this
    process's peak host memory once the model and optimizer are loaded and prepared)."""
    steps = _mini_batches(rows, config, context)
    plans, accumulation = _plans(steps, config, accelerator)
    model, tokenizer, optimizer, names, reference = (_continued(kept, config, accumulation) if kept else
                                                     _loaded(config, context, accelerator, accumulation))
    loaded_peak = _peak_rss_mb()
    scale = accumulation * accelerator.num_processes if accelerator is not None else 1
    model.train()
    log = []
    progress = context.progress and (accelerator is None or accelerator.is_main_process)
    for (epoch, mini), plan in tqdm(list(zip(steps, plans)), desc="update", disable=not progress, leave=False):
        log.append({"optimizer_step": len(log), "epoch": epoch,
                    **_optimizer_step(model, optimizer, reference, mini, plan, config, tokenizer.pad_token_id,
                                      accelerator, scale)})
    model.eval()
    optimizer.zero_grad(set_to_none=True)  # the gradients' memory goes back before the checkpoint is written
    return model, tokenizer, optimizer, names, reference, log, loaded_peak


def run(inputs, config, context: StageContext) -> StageOutput:
    rows = inputs["advantages"].select(COLUMNS).to_pylist()
    kept = _resident(context)
    accelerator = kept.accelerator if kept else make_accelerator(config.bf16)
    with contextlib.nullcontext() if kept else _checked_inputs(context, accelerator):  # kept: nothing is read
        model, tokenizer, optimizer, names, reference, log, loaded_peak = _train(rows, config, context, accelerator,
                                                                                 kept)
    table = make_table({key: [entry[key] for entry in log] for key in log[0]}, "update_log")
    metrics = {key: float(np.mean([entry[key] for entry in log])) for key in log[0] if key not in ("optimizer_step", "epoch")}
    metrics["resident"] = int(kept is not None)  # 1: trained on the state a persistent worker kept in memory
    trained = _trained(model, tokenizer, optimizer, names, config, context, accelerator)
    memory = _per_rank({"host_load_peak_rss_mb": loaded_peak, "host_peak_rss_mb": _peak_rss_mb()}, accelerator)
    after_commit = None
    if fsdp(accelerator):
        keep = Resident(accelerator, model, tokenizer, optimizer, names, reference, context.output, "") \
            if config.persistent else None
        after_commit = _training_state_after_commit(model, optimizer, config, context, accelerator, keep)
    return StageOutput(table, {**metrics, **memory}, trained=trained, after_commit=after_commit)


def _peak_rss_mb() -> float:
    """This process's peak resident host memory so far, MB (Linux reports KB)."""
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _per_rank(values: dict[str, float], accelerator) -> dict:
    """{NAME_rank0, NAME_other_ranks (the largest; under a launcher)} of each of this rank's `values` on
    rank 0, {} on the others: what the node's RAM must hold per rank (call on every rank; one gather)."""
    everyone = gather_to_rank_zero(values, accelerator)
    if everyone is None:
        return {}
    summary = {}
    for name in values:
        summary[f"{name}_rank0"] = round(everyone[0][name], 1)
        if len(everyone) > 1:
            summary[f"{name}_other_ranks"] = round(max(peaks[name] for peaks in everyone[1:]), 1)
    return summary
