"""Pausable warm starts: the training state of `oarctl.toy.pretrain` saved when it pauses, so the
same command run again continues where it stopped and ends with the checkpoint an uninterrupted run
gives (training draws no random numbers, evaluations are seeded, AdamW and the schedule are restored).

A state folder holds `model.safetensors` (current weights), `best.safetensors` (the evaluated
weights closest to the band so far, once there was an evaluation), `optimizer.safetensors` (AdamW
moments and step counts, by parameter index) and `state.json` (step, schedule position, the best evaluation's metrics).
Safetensors only: nothing is unpickled.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file


def _tensors(state_dict: dict) -> dict[str, torch.Tensor]:
    """Independent contiguous copies (tied weights share storage, which safetensors refuses)."""
    return {name: tensor.detach().clone().contiguous() for name, tensor in state_dict.items()}


def _optimizer_tensors(optimizer) -> dict[str, torch.Tensor]:
    state = optimizer.state_dict()["state"]
    return {f"{index}.{key}": torch.as_tensor(value).clone() for index, moments in state.items()
            for key, value in moments.items()}


def _restore_optimizer(optimizer, tensors: dict[str, torch.Tensor]) -> None:
    state: dict[int, dict] = {}
    for name, tensor in tensors.items():
        index, key = name.split(".", 1)
        state.setdefault(int(index), {})[key] = tensor
    document = optimizer.state_dict()
    document["state"] = state
    optimizer.load_state_dict(document)


def save_state(folder: Path, model, optimizer, schedule, step: int, best: tuple[dict, dict] | None,
               seconds: float) -> None:
    """Write the state, state.json last (a folder without it is not a state)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "state.json").unlink(missing_ok=True)
    save_file(_tensors(model.state_dict()), str(folder / "model.safetensors"))
    if best is not None:  # none before the first evaluation
        save_file(_tensors(best[1]), str(folder / "best.safetensors"))
    save_file(_optimizer_tensors(optimizer), str(folder / "optimizer.safetensors"))
    document = {"step": step, "schedule": schedule.last_epoch, "best": best and best[0], "seconds": seconds}
    (folder / "state.json").write_text(json.dumps(document))


def load_state(folder: Path, model, optimizer, schedule) -> tuple[int, tuple[dict, dict], float] | None:
    """(step, best, seconds trained so far) after restoring model, optimizer and schedule; None when
    there is no state."""
    if not (folder / "state.json").is_file():
        return None
    document = json.loads((folder / "state.json").read_text())
    model.load_state_dict(load_file(str(folder / "model.safetensors")))
    _restore_optimizer(optimizer, load_file(str(folder / "optimizer.safetensors")))
    schedule.last_epoch = document["schedule"]  # LambdaLR: lr = base x lambda(steps taken)
    for group, base, factor in zip(optimizer.param_groups, schedule.base_lrs, schedule.lr_lambdas):
        group["lr"] = base * factor(schedule.last_epoch)
    best = None if document["best"] is None else (document["best"], load_file(str(folder / "best.safetensors")))
    return document["step"], best, document["seconds"]
