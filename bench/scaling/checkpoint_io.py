"""The checkpoint traffic on one step's critical path: the weights and the training state written,
hashed and verified by every process that loads them, at the run's disk and sha256 rates."""
from __future__ import annotations

import math

from bench.scaling.formulas import parameters
from bench.scaling.model import GB, Hardware, dtype_bytes
from bench.scaling.setting import Setting, accelerate_kind, accelerate_processes

HASH_THREADS = 8  # oarctl.checkpoints.sha256_files: up to 8 files of one checkpoint hashed at once
FILES_PER_RANK = 8  # oarctl.sharded_state.FILES_PER_RANK (not imported here: it would import torch)


def _hash_seconds(size: float, files: int, hash_bytes_per_s: float) -> float:
    """sha256 of `size` bytes spread over `files` files, one thread per file (at most HASH_THREADS)."""
    return size / (min(HASH_THREADS, max(1, files)) * hash_bytes_per_s)


def saved_bytes(setting: Setting) -> tuple[float, float]:
    """(W, O): the weights in update.save_dtype; the training state, AdamW fp32 (8P) plus the fp32 weights
    (4P) when W is 16-bit."""
    P, cfg = parameters(setting.shape), setting.config
    return dtype_bytes(cfg.update.save_dtype) * P, (8 if cfg.update.save_dtype == "float32" else 12) * P


def checkpoint_io(setting: Setting, hw: Hardware, disk_gbps: float, hash_gbps: float,
                  compute: dict[str, float]) -> list[tuple[str, float, float]]:
    """(term, bytes, seconds) of the checkpoint traffic on one step's critical path, as the code is today.

    Saved: weights W = P x bytes of update.save_dtype, in F files of update.weight_file_mb: under FSDP the
    R ranks write and hash them in turn (file i by rank i mod R, so ceil(F/R) files each, hashed in
    threads), else rank 0 writes all F; and AdamW O = 8P, plus the fp32 weights 4P when W is 16-bit: under
    FSDP each of the R ranks writes and hashes its own O/R at once (sharded_state, in FILES_PER_RANK
    files) after the policy folder is committed, while `oarctl run` goes on: the engines reload W in place
    beside it and map their KV cache once the launch has ended (launch.wait_for_gpus), so only what
    outlasts their reload is on the critical path; else rank 0 writes and hashes all of it before the
    commit. Loaded: every process that loads the
    policy verifies the weight files it reads once: the sampling process for its engines (while they
    load them, so only what outlasts the load is on the critical path), and the
    attribute and update ranks shared out (each file hashed by one rank, ceil(F/R) files each; the update
    ranks the AdamW files too), in a background thread beside their own work (distributed.checked_beside:
    only what outlasts `compute[stage]`, the stage's predicted seconds, is on the critical path); the
    engines' first read comes from disk at `disk_gbps`, the others from the page cache.
    The disk is taken as `disk_gbps` per writer: ranks writing at once are not slowed by each other (a
    parallel file system or a disk per GPU pair; a node with one disk for all is slower: see the note).
    The canary needs no copy of the model (its reference travels with the checkpoint) and the engines are
    kept from step to step, so neither is a cost here."""
    cfg = setting.config
    W, O = saved_bytes(setting)
    weight_files = max(1, math.ceil(W / (cfg.update.weight_file_mb * 1e6)))
    disk, hashing = disk_gbps * GB, hash_gbps * GB
    engines = max(1, cfg.vllm.data_parallel_size) if cfg.policy.backend in ("vllm", "auto") else 1
    update_ranks = accelerate_processes(cfg.update.accelerate_config, hw.gpus)
    sharded = accelerate_kind(cfg.update.accelerate_config) == "fsdp"
    writers = update_ranks if sharded else 1
    shard, shard_files = O / writers, FILES_PER_RANK if sharded else 1
    verify_weights = _hash_seconds(W, weight_files, hashing)
    own_files = math.ceil(weight_files / writers)  # the most weight files one writer has
    own_weights = own_files * W / weight_files
    state = "AdamW + fp32 weights" if cfg.update.save_dtype != "float32" else "AdamW"
    write_state, hash_state = shard / disk, _hash_seconds(shard, shard_files, hashing)
    reload = W / disk  # the engines' weights, read in place
    if sharded:  # written after the policy is committed, while the engines reload it (their KV cache waits)
        terms = [(f"{state}: {writers} ranks write and hash their share once the policy is committed, beside "
                  "the engines' reload (only what outlasts it)", O, max(0.0, write_state + hash_state - reload))]
    else:  # rank 0 writes it before the policy is committed
        terms = [(f"{state}: rank 0 writes it", O, write_state), (f"{state}: rank 0 hashes it", O, hash_state)]
    terms += [(f"weights ({cfg.update.save_dtype}, {weight_files} files): {writers} rank(s) write them in turn", W,
               own_weights / disk),
              (f"weights: each writer hashes its files (up to {own_files})", W,
               _hash_seconds(own_weights, own_files, hashing)),
              ("engines reload the weights in place (first read from disk)", engines * W, reload),
             # the sampling process checks them while its engines load them (the same bytes: whichever reads a
             # page first takes it from disk, the other from the page cache): only what outlasts the load counts
              (f"the sampling process verifies them for its {engines} engine(s), beside the load", W,
               max(0.0, verify_weights - reload))]
    return terms + _checked_by_ranks(setting, hw, weight_files, hashing, state, compute)


def _checked_by_ranks(setting: Setting, hw: Hardware, weight_files: int, hashing: float, state: str,
                      compute: dict[str, float]) -> list[tuple[str, float, float]]:
    """checkpoint_io's terms of the attribute and update ranks verifying what they load, beside their
    own work (only what outlasts `compute[stage]` counts)."""
    cfg = setting.config
    W, O = saved_bytes(setting)
    attribute_ranks = (accelerate_processes(cfg.attribute.accelerate_config, hw.gpus)
                       if cfg.attribute.method not in ("uniform", "random") else 0)
    update_ranks = accelerate_processes(cfg.update.accelerate_config, hw.gpus)
    sharded = accelerate_kind(cfg.update.accelerate_config) == "fsdp"
    shard_files = FILES_PER_RANK if sharded else 1
    terms = []

    def shared_out(ranks: int) -> float:  # ranks that all read the weights verify ceil(F / R) files each
        files = math.ceil(weight_files / ranks)
        return _hash_seconds(files * W / weight_files, files, hashing)

    if attribute_ranks:
        terms.append((f"{attribute_ranks} attribute ranks verify the weights shared out, beside their scoring", W,
                      max(0.0, shared_out(attribute_ranks) - compute["attribute"])))
    if sharded and cfg.update.persistent:
        terms.append((f"{update_ranks} update ranks keep the model and {state} in memory (update.persistent): "
                      "nothing read", 0.0, 0.0))
    elif sharded:  # the ranks' share of the weights and the AdamW shards, beside their training
        update_check = shared_out(update_ranks) + _hash_seconds(O / update_ranks, shard_files, hashing)
        terms.append((f"{update_ranks} update ranks verify the weights and {state} shared out, beside their "
                      "training", W + O, max(0.0, update_check - compute["update"])))
    else:  # the weights beside the training; the AdamW state (every rank reads all of it) before it
        terms.append((f"{update_ranks} update ranks verify the weights (shared out, beside their training) "
                      f"and {state} (each rank all of it, before)", W + O,
                      max(0.0, shared_out(update_ranks) - compute["update"]) + _hash_seconds(O, 1, hashing)))
    return terms


def print_checkpoint_io(setting: Setting, hw: Hardware, disk_gbps: float, hash_gbps: float,
                        compute: dict[str, float]) -> str:
    terms = checkpoint_io(setting, hw, disk_gbps, hash_gbps, compute)
    step_seconds = sum(compute.values())
    total = sum(seconds for _, _, seconds in terms)
    print(f"   checkpoint I/O per step (predicted; disk {disk_gbps} GB/s per writer, sha256 {hash_gbps} GB/s per "
          "thread; seconds = bytes on the critical path / rate):")
    for name, size, seconds in terms:
        print(f"     {name:<66} {size / GB:8.1f} GB {seconds:8.1f} s")
    share = total / (total + step_seconds)
    W, O = saved_bytes(setting)
    # One disk for the whole node instead of one per writer: the weights are written (W), then the engines
    # read them while the training state (O) is written beside them, sharing the disk (up to 2W for the read
    # to end); the rest of O is written beside sampling, so the disk keeps up while it is busy less than a step.
    rate = disk_gbps * GB
    one_disk, busy = (W + min(2 * W, W + O)) / rate, (2 * W + O) / rate
    print(f"     {'total':<66} {sum(b for _, b, _ in terms) / GB:8.1f} GB {total:8.1f} s = {share:.0%} of the step "
          f"({step_seconds:.1f} s of compute)")
    print(f"     note: with one {disk_gbps} GB/s disk for the whole node, the weights' write and their read by the "
          f"engines beside the training state's write take (W + 2W) / disk = {one_disk:.0f} s "
          f"= {one_disk / (one_disk + step_seconds):.0%} of the step; the disk is busy (2W + O) / disk = {busy:.0f} s "
          f"a step ({'it keeps up' if busy <= one_disk + step_seconds else 'MORE than the step: it falls behind'})")
    if share <= 0.10:
        return f"PASS (d) {setting.path}: checkpoint I/O {share:.0%} of the step"
    largest = sorted(terms, key=lambda term: -term[2])[:3]
    return (f"OPEN (d) {setting.path}: checkpoint I/O is {share:.0%} of the step (predicted {total:.0f} s beside "
            f"{step_seconds:.0f} s of compute; 10% target not met; largest: "
            + "; ".join(f"{name} {seconds:.0f} s" for name, _, seconds in largest) + ")")
