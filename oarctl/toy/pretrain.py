"""Supervised warm start of the embedded toy base policy.

GRPO needs a base policy that is right sometimes: sampled (T=1) accuracy well inside (0, 1), with
easy and hard prompts mixed. Supervised training on this task goes from 0% to ~100% in a few
minutes, so the band is narrow in steps: we evaluate sampled accuracy on held-out problems every
`eval_every` steps and keep the first checkpoint inside `target_band`, not a wall-time budget.
Accuracy jumps ~20 points in ~100 steps once the model "gets" carries, so a jump over the whole
band ends training too, keeping the evaluated checkpoint closest to the band centre.
Constant LR (after warmup), so where the band is hit does not depend on `max_steps`.

    python -m oarctl.toy.pretrain --out oarctl/toy/base_policy --seed 0
    python -m oarctl.toy.pretrain --family chains --out oarctl/toy/chains_policy ...   (see its base_policy.json)

`--family` picks the task family (oarctl/toy/families.py); `--levels` its levels (chains: chain
lengths), `--hidden`/`--layers` the model size.
"""
from __future__ import annotations

import argparse
import copy
import json
import os
import shutil
import time
from pathlib import Path

import torch

from oarctl.policy.transformers_backend import generate
from oarctl.toy.families import DEFAULT_LEVELS, iter_problems
from oarctl.toy.model import build_model, parameter_count
from oarctl.toy.resume import load_state, save_state
from oarctl.toy.task import generate_problems, is_reserved
from oarctl.toy.tokenizer import build_tokenizer, format_prompt
from oarctl.verify.boxed import score

# The settings each shipped policy was built with (`oarctl toy build --family F` uses them; the
# exact command is also in the folder's base_policy.json).
RECIPES = {
    "arithmetic": {},
    "chains": {"max_steps": 4000, "eval_every": 100, "target_band": (0.1, 0.3), "lr": 3e-3, "batch_size": 32,
               "hidden_size": 96, "num_layers": 3, "n_heldout": 128, "eval_samples": 2, "threads": 1},
}
RECIPES["chains_wide"] = RECIPES["chains"]  # the same model and schedule, on the wide world's problems
LOG_EVERY = 25  # training loss lines between evaluations
HELDOUT_SEED_OFFSET = 1_000  # held-out problems come from seed + this, minus the train problems
MAX_NEW_TOKENS = {"arithmetic": 48, "chains": 224, "chains_wide": 224}  # longest solution + eos: ~40 / ~190 / ~210
MAX_POSITIONS = {"arithmetic": 256, "chains": 384, "chains_wide": 384}  # prompt + longest solution fits


def _encode(tokenizer, item: dict) -> tuple[list[int], list[int]]:
    """(prompt ids, response ids) for one problem; the response ends with eos."""
    prompt = tokenizer(format_prompt(tokenizer, item["problem"]), add_special_tokens=False)
    response = tokenizer(item["solution"], add_special_tokens=False)
    return prompt["input_ids"], response["input_ids"] + [tokenizer.eos_token_id]


def _batch(pairs: list[tuple[list[int], list[int]]], pad_id: int) -> dict[str, torch.Tensor]:
    """Right-padded batch; labels are -100 on prompt and padding, so loss is on responses only."""
    width = max(len(p) + len(r) for p, r in pairs)
    input_ids = torch.full((len(pairs), width), pad_id, dtype=torch.long)
    labels = torch.full((len(pairs), width), -100, dtype=torch.long)
    mask = torch.zeros((len(pairs), width), dtype=torch.long)
    for row, (prompt, response) in enumerate(pairs):
        ids = prompt + response
        input_ids[row, :len(ids)] = torch.tensor(ids)
        labels[row, len(prompt):len(ids)] = torch.tensor(response)
        mask[row, :len(ids)] = 1
    return {"input_ids": input_ids, "attention_mask": mask, "labels": labels}


def train_stream(seed: int, levels: tuple[int, ...], n: int, family: str = "arithmetic") -> list[dict]:
    """The first n pretraining problems: the seeded stream minus the reserved (held-out) bucket."""
    out = []
    for item in iter_problems(family, seed, levels):
        if not is_reserved(item["problem"]):
            out.append(item)
            if len(out) == n:
                return out
    return out


def heldout_problems(family: str, seed: int, levels: tuple[int, ...], n: int, exclude: set[str]) -> list[dict]:
    """n distinct problems of the family's stream for `seed`, none of them in `exclude` (the train set)."""
    out, seen = [], set()
    for item in iter_problems(family, seed, levels):
        if item["problem"] not in seen and item["problem"] not in exclude:
            seen.add(item["problem"])
            out.append(item)
            if len(out) == n:
                return out


@torch.no_grad()
def evaluate(model, tokenizer, problems: list[dict], *, temperature: float, samples: int = 1,
             seed: int = 0, max_new_tokens: int = MAX_NEW_TOKENS["arithmetic"]) -> dict:
    """Mean reward over `samples` responses per problem, overall and per level."""
    prompts = [_encode(tokenizer, p)[0] for p in problems for _ in range(samples)]
    gens = generate(model, tokenizer, prompts, temperature=temperature, top_p=1.0,
                    max_new_tokens=max_new_tokens, seed=seed, batch_size=128)
    rewards = [score(tokenizer.decode(g.token_ids, skip_special_tokens=True), problems[i // samples]["answer"])[1]
               for i, g in enumerate(gens)]
    by_level: dict[int, list[float]] = {}
    for i, reward in enumerate(rewards):
        by_level.setdefault(problems[i // samples]["level"], []).append(reward)
    return {"accuracy": sum(rewards) / len(rewards), "rewards": rewards,
            "by_level": {lv: round(sum(r) / len(r), 3) for lv, r in sorted(by_level.items())}}


def _save_atomic(out_dir: Path, model, tokenizer, meta: dict) -> None:
    """Write into a temporary sibling, then swap it into place: readers never see a half write."""
    out_dir = Path(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = out_dir.parent / f".oarctl-tmp-{out_dir.name}-{os.getpid()}"
    old = out_dir.parent / f".oarctl-tmp-{out_dir.name}-{os.getpid()}-old"
    shutil.rmtree(tmp, ignore_errors=True)
    from oarctl.distributed import quiet_deepspeed_without_gpus

    quiet_deepspeed_without_gpus()  # save_pretrained imports DeepSpeed where it is installed
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    (tmp / "base_policy.json").write_text(json.dumps(meta, indent=2) + "\n")
    for path in tmp.iterdir():
        path.chmod(0o644)  # safetensors writes 0600; the checkpoint ships inside the package
    if out_dir.exists():
        os.replace(out_dir, old)
    os.replace(tmp, out_dir)
    shutil.rmtree(old, ignore_errors=True)


def _command(out_dir, seed, max_steps, eval_every, target_band, lr, batch_size, shape: dict) -> str:
    """The command that rebuilds the checkpoint; the chains-only flags appear only for chains."""
    lo, hi = target_band
    command = (f"python -m oarctl.toy.pretrain --out {out_dir} --seed {seed} --max-steps {max_steps} "
               f"--eval-every {eval_every} --band {lo} {hi} --lr {lr} --batch-size {batch_size}")
    if shape["family"] != "arithmetic":
        command += (f" --family {shape['family']} --levels {' '.join(map(str, shape['levels']))} "
                    f"--hidden {shape['hidden_size']} --layers {shape['num_layers']} "
                    f"--heldout {shape['n_heldout']} --eval-samples {shape['eval_samples']} "
                    f"--threads {shape['threads']}")
    return command


def _train_step(model, tokenizer, optimizer, schedule, chunk: list[dict]) -> float:
    """One AdamW step on a batch, response-token loss (token mean), grad-norm clipped at 1."""
    model.train()
    loss = model(**_batch([_encode(tokenizer, it) for it in chunk], tokenizer.pad_token_id)).loss
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    schedule.step()
    optimizer.zero_grad(set_to_none=True)
    return loss.item()


def _metadata(chosen: dict, **fields) -> dict:
    """base_policy.json: how the checkpoint was chosen, how good it is, how to rebuild it."""
    return {
        "seed": fields.pop("seed"), "steps": chosen["step"], **fields,
        "sampled_accuracy": round(chosen["sampled"]["accuracy"], 4),
        "greedy_accuracy": round(chosen["greedy"]["accuracy"], 4),
        "sampled_by_level": chosen["sampled"]["by_level"], "greedy_by_level": chosen["greedy"]["by_level"],
    }


def _heldout(family: str, seed: int, levels, n: int, train: list[dict]) -> list[dict]:
    exclude = {item["problem"] for item in train}
    if family == "arithmetic":  # as the shipped base policy was built
        return generate_problems(n, seed + HELDOUT_SEED_OFFSET, levels, exclude=exclude)
    return heldout_problems(family, seed + HELDOUT_SEED_OFFSET, levels, n, exclude)


def _optimizer(model, lr: float, warmup: int):
    """AdamW with a linear warmup to a constant learning rate."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.98), weight_decay=0.01)
    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / warmup))


def _evaluate(model, tokenizer, heldout: list[dict], samples: int, seed: int, budget: int) -> tuple[dict, dict]:
    """Held-out accuracy, sampled (T=1, `samples` per problem) and greedy."""
    sampled = evaluate(model, tokenizer, heldout, temperature=1.0, samples=samples, seed=seed, max_new_tokens=budget)
    greedy = evaluate(model, tokenizer, heldout, temperature=0.0, seed=seed, max_new_tokens=budget)
    return sampled, greedy


def _keep_chosen(model, best, target_band: tuple[float, float], step: int, log) -> tuple[bool, str]:
    """(in band, note) of the chosen evaluation; outside the band the model goes back to the evaluated
    weights closest to the band centre (the last evaluation may have jumped past it)."""
    in_band = target_band[0] <= best[0]["sampled"]["accuracy"] <= target_band[1]
    if in_band:
        return in_band, "first evaluation inside the target band"
    note = (f"no evaluation inside band {target_band} ({step} steps run); saved step "
            f"{best[0]['step']}, the sampled accuracy closest to {sum(target_band) / 2:.2f}")
    log(f"WARNING: {note}")
    model.load_state_dict(best[1])
    return in_band, note


def pretrain(out_dir: Path, seed: int = 0, max_steps: int = 3000, eval_every: int = 25,
             target_band: tuple[float, float] = (0.30, 0.40), log=print, *, lr: float = 1e-3,
             batch_size: int = 64, warmup: int = 50, n_heldout: int = 128, eval_samples: int = 4,
             levels: tuple[int, ...] | None = None, threads: int = 2, family: str = "arithmetic",
             hidden_size: int = 128, num_layers: int = 4, state_dir: Path | None = None,
             time_limit: float | None = None) -> dict:
    """Train until held-out sampled accuracy reaches `target_band`; save that checkpoint + json.

    With `state_dir` and `time_limit` (seconds), the run pauses after the first training step past
    the limit, saves its training state there (oarctl/toy/resume.py) and returns {"paused": True, ...}
    without writing `out_dir`; the same call again resumes and ends as one uninterrupted run would."""
    torch.set_num_threads(threads)
    started = time.time()
    levels = tuple(levels or DEFAULT_LEVELS[family])
    tokenizer = build_tokenizer()
    model = build_model(tokenizer, hidden_size=hidden_size, num_layers=num_layers,
                        intermediate_size=3 * hidden_size, max_positions=MAX_POSITIONS[family], seed=seed)
    train = train_stream(seed, levels, max_steps * batch_size, family)
    heldout = _heldout(family, seed, levels, n_heldout, train)
    optimizer, schedule = _optimizer(model, lr, warmup)
    log(f"toy pretrain ({family}): {parameter_count(model):,} params, vocab {len(tokenizer)}, levels {levels}, "
        f"{n_heldout} held-out x {eval_samples} samples, band {target_band}")
    centre, best, step, before = sum(target_band) / 2, None, 0, 0.0
    resumed = load_state(Path(state_dir), model, optimizer, schedule) if state_dir else None
    if resumed:
        step, best, before = resumed
        log(f"resumed from {state_dir} at step {step}")
    while step < max_steps:
        step += 1
        loss = _train_step(model, tokenizer, optimizer, schedule, train[(step - 1) * batch_size:step * batch_size])
        if step % eval_every == 0 or step == max_steps:
            sampled, greedy = _evaluate(model, tokenizer, heldout, eval_samples, seed, MAX_NEW_TOKENS[family])
            log(f"step {step:5d}  loss {loss:.4f}  sampled {sampled['accuracy']:.3f} "
                f"{sampled['by_level']}  greedy {greedy['accuracy']:.3f}  {time.time() - started:.0f}s")
            if best is None or abs(sampled["accuracy"] - centre) < abs(best[0]["sampled"]["accuracy"] - centre):
                best = ({"step": step, "sampled": sampled, "greedy": greedy}, copy.deepcopy(model.state_dict()))
            if sampled["accuracy"] >= target_band[0]:
                break  # in the band, or jumped past it: SFT accuracy only rises, so stop either way
        elif step % LOG_EVERY == 0:
            log(f"step {step:5d}  loss {loss:.4f}  {time.time() - started:.0f}s")
        if state_dir and time_limit and time.time() - started > time_limit and step < max_steps:
            save_state(Path(state_dir), model, optimizer, schedule, step, best, before + time.time() - started)
            log(f"paused at step {step} (time limit {time_limit:.0f}s); run the same command to resume")
            return {"paused": True, "step": step}
    in_band, note = _keep_chosen(model, best, target_band, step, log)
    shape = {"family": family, "levels": list(levels), "hidden_size": hidden_size, "num_layers": num_layers,
             "n_heldout": n_heldout, "eval_samples": eval_samples, "threads": threads}
    extra = {} if family == "arithmetic" else {"family": family, "hidden_size": hidden_size, "num_layers": num_layers}
    meta = _metadata(
        best[0], seed=seed, steps_run=step, wall_seconds=round(before + time.time() - started, 1),
        in_band=in_band, note=note, target_band=list(target_band), n_heldout=n_heldout,
        eval_samples_per_problem=eval_samples, heldout_seed=seed + HELDOUT_SEED_OFFSET,
        levels=list(levels), parameters=parameter_count(model), vocab_size=len(tokenizer),
        torch_threads=threads, **extra,
        command=_command(out_dir, seed, max_steps, eval_every, target_band, lr, batch_size, shape))
    _save_atomic(Path(out_dir), model, tokenizer, meta)
    log(f"saved {out_dir}: step {meta['steps']}, sampled {meta['sampled_accuracy']:.3f}, "
        f"greedy {meta['greedy_accuracy']:.3f}, {meta['wall_seconds']}s")
    return meta


def main(argv: list[str] | None = None) -> dict:
    """CLI entry: `python -m oarctl.toy.pretrain --out DIR --seed N`."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-steps", type=int, default=3000)
    parser.add_argument("--eval-every", type=int, default=25)
    parser.add_argument("--band", type=float, nargs=2, default=(0.30, 0.40), metavar=("LO", "HI"))
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--family", choices=sorted(DEFAULT_LEVELS), default="arithmetic")
    parser.add_argument("--levels", type=int, nargs="+", default=None, help="default: the family's levels")
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--heldout", type=int, default=128, help="held-out problems per evaluation")
    parser.add_argument("--eval-samples", type=int, default=4, help="sampled responses per held-out problem")
    parser.add_argument("--threads", type=int, default=2, help="torch threads (1 on a busy machine: much faster)")
    parser.add_argument("--state", type=Path, default=None, help="save the training state here; resume from it")
    parser.add_argument("--time-limit", type=float, default=None, help="pause (with --state) after N seconds")
    args = parser.parse_args(argv)
    return pretrain(args.out, seed=args.seed, max_steps=args.max_steps, eval_every=args.eval_every,
                    target_band=tuple(args.band), lr=args.lr, batch_size=args.batch_size, family=args.family,
                    levels=args.levels, hidden_size=args.hidden, num_layers=args.layers, n_heldout=args.heldout,
                    eval_samples=args.eval_samples, threads=args.threads, state_dir=args.state,
                    time_limit=args.time_limit)


if __name__ == "__main__":
    main()
