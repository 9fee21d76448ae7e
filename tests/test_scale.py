"""bench/scale.py, the 7B arithmetic (bench/scaling/): its formulas agree with what torch measures on a tiny
Qwen2, its copies of the code's batching rules agree with the code, and it runs on the shipped configs."""
from __future__ import annotations

import copy
import math
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "bench" / "scale.py"
sys.path.insert(0, str(ROOT))

from bench.scaling.attribute import attribute_stage  # noqa: E402
from bench.scaling.batching_rules import (batches_within, chunk_rows, local_chunks, perturbation_chunks,  # noqa: E402
                                          screened_count, windows)
from bench.scaling.calibration import TINY, autograd_saved_bytes, suffix_tokens, tiny_items, tiny_model  # noqa: E402
from bench.scaling.checkpoint_io import FILES_PER_RANK, checkpoint_io  # noqa: E402
from bench.scaling.formulas import (activation_bytes_per_token_layer, checkpoint_bytes_per_token_layer,  # noqa: E402
                                    forward_flops, parameters, trl_attribution_weight_bytes,
                                    update_logits_bytes_per_token)
from bench.scaling.lengths import reasoning_tokens, response_lengths  # noqa: E402
from bench.scaling.measured import against_measured, measured_rows  # noqa: E402
from bench.scaling.model import (ANSWER_TOKENS, CONCLUDE_TOKENS, GB, METHODS, NOT_MODELLED, SHAPES,  # noqa: E402
                                 Hardware)
from bench.scaling.report import evaluate_setting  # noqa: E402
from bench.scaling.setting import load_setting  # noqa: E402
from bench.scaling.stages import update_stage  # noqa: E402


class _Args:
    prompt_tokens, mean_response, sigma = 150, 700.0, 0.75


HW = Hardware(8, 989.0, 67.0, 80.0, 3.35, 450.0, 0.4, 3.0)


def _setting(path: str, *overrides: str):
    return load_setting(ROOT / path, None, _Args, 0.5, overrides)


def test_forward_flops_formula_matches_flop_counter_on_a_tiny_qwen2():
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    model = tiny_model(2, attention="eager")  # FlopCounterMode does not count CPU SDPA kernels
    batch, length = 2, 96
    ids = torch.randint(1, TINY.vocab, (batch, length), generator=torch.Generator().manual_seed(0))
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        model(input_ids=ids)
    # eager attention multiplies the full score matrix: length^2 (query, key) pairs per row
    predicted = forward_flops(TINY, batch * length, batch * length * length, batch * length)
    assert counter.get_total_flops() == pytest.approx(predicted, rel=0.02)
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        model(input_ids=ids, logits_to_keep=1)
    predicted = forward_flops(TINY, batch * length, batch * length * length, batch)
    assert counter.get_total_flops() == pytest.approx(predicted, rel=0.02)


@pytest.mark.parametrize("checkpointing", [False, True], ids=["kept", "checkpointed"])
def test_oar_g_kept_bytes_per_token_per_layer_match_saved_tensors(checkpointing):
    items = tiny_items(16, [60, 50, 40])
    saved = {layers: autograd_saved_bytes(tiny_model(layers), items, checkpointing)[0] for layers in (2, 4)}
    measured = (saved[4] - saved[2]) / 2 / suffix_tokens(items)
    formula = checkpoint_bytes_per_token_layer if checkpointing else activation_bytes_per_token_layer
    assert measured == pytest.approx(formula(TINY, 4), rel=0.05)


def test_the_mirrored_batching_rules_are_the_code_s():
    from oarctl.attribution import ATTRIBUTION_METHODS, oar, oar_p_cheap
    from oarctl.config import AttributeConfig

    assert set(METHODS) == set(ATTRIBUTION_METHODS.names()) - set(NOT_MODELLED)
    widths = [900, 3222, 400, 1500, 700, 3000, 250, 820]
    for batch_size, budget in ((8, 0), (8, 4096), (3, 4096), (32, 16384)):
        assert batches_within(list(range(8)), widths, batch_size, budget) == \
            oar.batches_within(list(range(8)), widths, batch_size, budget)
    for first, end, chunk, budget in ((150, 850, 256, 4096), (150, 3200, 8, 0), (3000, 3200, 256, 4096)):
        assert chunk_rows(first, end, chunk, budget) == oar.chunk_rows(first, end, chunk, budget)
    starts = np.arange(150, 840, 32)
    spans = [(int(a), int(a) + 32) for a in starts]
    assert [rows for _, rows in perturbation_chunks(starts, 850, 256, 4096)] == \
        [len(c) for c in oar._perturbation_chunks(spans, 850, 256, 4096)]
    for length, span, cap in ((690, 32, 256), (3060, 16, 128), (10, 32, 256)):
        assert list(windows(150, 150 + length, span, cap)) == \
            [a for a, _ in oar_p_cheap.windows((150, 150 + length), span, cap)]
    from oarctl.attribution import flow_local

    for reasoning, horizon, chunk, budget in ((690, 16, 8, 0), (3060, 16, 8, 16384), (40, 16, 8, 4096)):
        config = AttributeConfig(chunk_size=chunk, flow_horizon=horizon)
        per_call, rows, code = flow_local.local_rows_per_call(config, reasoning), 0, []
        while rows < reasoning:
            code.append(flow_local.local_rows(reasoning - rows, 150 + rows, horizon, per_call, budget))
            rows += code[-1]
        assert [k for _, k in local_chunks(150, reasoning, horizon, chunk, budget)] == code
    config = AttributeConfig(screen_fraction=0.1, audit_fraction=0.02, max_perturbations=256)
    for length in (5, 690, 3060):
        top, audit = oar_p_cheap.screened_positions(np.random.default_rng(0).random(length), config, 0)
        assert screened_count(length, 0.1, 0.02, 256) == len(top) + len(audit)


def test_response_lengths_have_the_stated_mean_and_cap():
    lengths = response_lengths(1024, 8, 150, 700.0, 3072, 0.75)
    assert lengths.mean == pytest.approx(700, rel=1e-6)
    assert lengths.responses.mean() == pytest.approx(700, rel=0.02)
    assert lengths.responses.max() == 3072 and 0 < lengths.at_cap < 0.05
    assert (lengths.responses.astype(float) ** 2).mean() == pytest.approx(lengths.second, rel=0.05)
    assert math.sqrt(lengths.second) > lengths.mean  # a spread, so E[R^2] > E[R]^2


def test_the_old_7b_oar_g_settings_do_not_fit_and_the_budget_makes_them_fit():
    # as the 7B oar-g config was before issue 14: fp32, 8 responses of up to 3,072 tokens, no budget,
    # no checkpointing, on one GPU
    old = _setting("configs/qwen2.5-7b/oar-g.yaml", "attribute.dtype=float32", "attribute.accelerate_config=''",
                   "attribute.max_batch_tokens=0", "attribute.gradient_checkpointing=false", "attribute.batch_size=8",
                   "attribute.skip_uniform_groups=false")
    cost = attribute_stage(old, HW, "oar_g")
    assert cost.held_bytes > 80e9
    assert cost.held["activations"] > 8 * 3000 * 28 * activation_bytes_per_token_layer(old.shape, 4)
    fixed = _setting("configs/qwen2.5-7b/oar-g.yaml", "attribute.dtype=float32", "attribute.max_batch_tokens=4096",
                     "attribute.gradient_checkpointing=true")
    assert attribute_stage(fixed, HW, "oar_g").held_bytes < 80e9
    old_update = _setting("configs/qwen2.5-7b/grpo.yaml", "update.micro_batch_tokens=0", "update.micro_batch_size=8",
                          "update.logit_chunk_tokens=0")
    assert update_stage(old_update, HW).held["logits_chunk"] > 80e9  # 8 x 3,222 tokens x 3.65 MB
    chunked = _setting("configs/qwen2.5-7b/grpo.yaml", "update.micro_batch_tokens=0", "update.micro_batch_size=8",
                       "update.logit_chunk_tokens=2048")
    assert update_stage(chunked, HW).held["logits_chunk"] == 2048 * update_logits_bytes_per_token(old.shape)


def test_exact_oar_p_costs_about_r_squared_over_two_token_forwards():
    setting = _setting("configs/qwen2.5-7b/oar-p.yaml", "attribute.skip_uniform_groups=false", "attribute.chunk_size=1")
    cost = attribute_stage(setting, HW, "oar_p")
    reasoning = reasoning_tokens(setting.lengths.responses).astype(float)
    tail = CONCLUDE_TOKENS + ANSWER_TOKENS - 1  # suffix tokens after the reasoning
    expected = float(np.sum(reasoning * (reasoning + 1) / 2 + reasoning * tail))
    assert cost.token_forwards == pytest.approx(expected, rel=1e-9)
    span = attribute_stage(setting, HW, "oar_p_span")
    assert span.token_forwards < cost.token_forwards / 10


def test_quick_run_on_the_shipped_configs_prints_every_stage_and_passes():
    result = subprocess.run([sys.executable, str(SCRIPT), "--quick"], capture_output=True, text=True, timeout=300,
                            cwd=ROOT)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    reports = re.split(r"^== ", out, flags=re.MULTILINE)[1:]
    assert len(reports) == 6
    for report in reports:
        for stage in ("sample", "attribute (", "update"):
            assert re.search(rf"^   {re.escape(stage)}.*\s\d+\.\d+\s+\d+\.\d+%$", report, re.MULTILINE), stage
        for method in METHODS:
            assert re.search(rf"^   [* ] {method}\s", report, re.MULTILINE), method
    assert "PREDICTED" in out and "predicted s" in out
    verdicts = re.findall(r"^  (PASS|FAIL) \((a|b|c)\)", out, re.MULTILINE)
    assert {criterion for _, criterion in verdicts} == {"a", "b", "c"}
    assert [line for line in out.splitlines() if line.startswith("  FAIL")] == []


def test_every_method_prints_its_credit_seconds_against_the_rollout_seconds(capsys):
    """credit / rollout = t_attribute(method) / t_sample, each predicted by its stage's formulas (a few cheap
    methods: the table of every method is the quick run's)."""
    from bench.scaling.report import COST_BAR, Report, _print_methods
    from bench.scaling.stages import sample_stage

    setting = _setting("configs/qwen2.5-7b/oar-g.yaml")
    rollout = sample_stage(setting, HW)
    credit = {method: attribute_stage(setting, HW, method) for method in ("uniform", "entropy", "oar_g")}
    _print_methods(Report(setting, {"sample": rollout}, credit, {}, {}), HW, rest=1.0)
    out = capsys.readouterr().out
    assert f"credit / rollout = t_attribute(method) / t_sample, t_sample = {rollout.seconds:.1f} s" in out
    for method, cost in credit.items():
        price = cost.seconds / rollout.seconds
        row = re.search(rf"^   [* ] {method}\s.*\s(\d+\.\d{{3}})\s+\d+\.\d{{3}}(  <= {COST_BAR}x)?$", out, re.MULTILINE)
        assert row and float(row[1]) == pytest.approx(price, abs=6e-4), method
        assert bool(row[2]) == (0 < price <= COST_BAR), method
    assert re.search(r"^   [* ] uniform\s.*\s0\.000\s+0\.000$", out, re.MULTILINE)  # no credit to pay for


def test_a_gpu_check_log_is_read_and_set_beside_the_prediction(tmp_path):
    log = tmp_path / "gpu_check.txt"
    log.write_text("stage  seconds  peak GiB  notes\n"
                   "long_verify                 5.5      0.00  \n"
                   "long_attribute_oar_g       16.9      6.65  16 responses, 1.06 s each\n"
                   "long_attribute_oar_p       47.7      8.72  2 responses, 23.83 s each\n"
                   "long_attribute_oar_g vs oar_p  nan  nan  top-20% recall 0.58, Spearman 0.39 on 2 responses\n")
    assert measured_rows(log) == {"long_attribute_oar_g": (16.9, 6.65, 16),
                                        "long_attribute_oar_p": (47.7, 8.72, 2)}
    header, oar_g, oar_p = against_measured(log, HW, 12, 2036)
    assert header.split()[0] == "row"
    # exact OAR-P on 2 responses: ~R^2/2 token-forwards each, so the prediction is FLOP-bound and the
    # efficiency the measurement implies is (prediction at efficiency 1) / measured
    fields = oar_p.split()
    measured, predicted, ratio, reached = map(float, fields[2:6])
    assert measured == 47.7 and ratio == pytest.approx(measured / predicted, abs=0.01)
    assert reached == pytest.approx(HW.efficiency * predicted / measured, abs=0.01)
    flops = 2 * forward_flops(SHAPES["1.5b"], 2036 ** 2 / 2, 0, 1)  # lower bound: matmuls only
    assert predicted >= flops / (HW.tflops * 1e12 * HW.efficiency) * 0.9


def test_checkpoint_io_counts_every_loading_process():
    from oarctl import sharded_state

    assert FILES_PER_RANK == sharded_state.FILES_PER_RANK
    setting = _setting("configs/qwen2.5-7b/oar-g.yaml")  # FSDP over 8 ranks, model.safetensors in bfloat16
    P = parameters(setting.shape)
    idle = {"attribute": 0.0, "update": 0.0}  # no compute to hide the ranks' checks behind
    terms = {name: (size, seconds) for name, size, seconds in checkpoint_io(setting, HW, 3.0, 1.0, idle)}
    state = 8 * P + 4 * P  # AdamW moments and the fp32 weights, each rank writing an eighth
    # written and hashed (8 files, 8 threads) after the commit, beside the engines' reload of 2P from disk
    written = ("AdamW + fp32 weights: 8 ranks write and hash their share once the policy is committed, beside "
               "the engines' reload (only what outlasts it)")
    state_seconds = state / 8 / (3.0 * GB) + state / 8 / (8 * GB)
    reload = 2 * P / (3.0 * GB)
    assert state_seconds > reload and terms[written] == (state, pytest.approx(state_seconds - reload))
    slow_hashing = {name: seconds for name, _, seconds in checkpoint_io(setting, HW, 3.0, 0.1, idle)}
    assert slow_hashing[written] == pytest.approx(state / 8 / (3.0 * GB) + state / 8 / (0.8 * GB) - reload)
    fast_hashing = {name: seconds for name, _, seconds in checkpoint_io(setting, HW, 3.0, 100.0, idle)}
    assert fast_hashing[written] == 0.0  # all of it hidden behind the reload
    size = setting.config.update.weight_file_mb * 1e6
    files = math.ceil(2 * P / size)  # 31 files of 500 MB: the 8 ranks write and hash 4 each, at once
    assert (files, math.ceil(files / 8)) == (31, 4)
    assert terms["weights (bfloat16, 31 files): 8 rank(s) write them in turn"] == (
        2 * P, pytest.approx(4 * 2 * P / files / (3.0 * GB)))
    assert terms["weights: each writer hashes its files (up to 4)"][1] == pytest.approx(4 * 2 * P / files / (4 * GB))
    # the attribute ranks share the hashing out: 4 of the 31 files each, hashed in 4 threads
    checked = "8 attribute ranks verify the weights shared out, beside their scoring"
    assert terms[checked] == (2 * P, pytest.approx(4 * 2 * P / files / (4 * GB)))
    # the 7B configs' persistent update worker keeps the model and AdamW in memory: it reads nothing, and
    # its shards (fp32 weights and two moments, 12P/8 per GPU) are held beside the engines and attribution
    assert setting.config.update.persistent
    report = evaluate_setting(setting, HW)
    assert report.stages["sample"].held["update_resident"] == pytest.approx(12 * P / 8)
    assert report.stages["attribute (oar_g)"].held["update_resident"] == pytest.approx(12 * P / 8)
    kept = "8 update ranks keep the model and AdamW + fp32 weights in memory (update.persistent): nothing read"
    assert terms[kept] == (0.0, 0.0)
    # one launch per step: the ranks' 4 weight files and an eighth of the state in 8 files, hashed in threads
    per_step = copy.deepcopy(setting)
    per_step.config.update.persistent = False
    terms = {name: (size, seconds) for name, size, seconds in checkpoint_io(per_step, HW, 3.0, 1.0, idle)}
    update_check = 4 * 2 * P / files / (4 * GB) + state / 8 / (8 * GB)
    checked_update = "8 update ranks verify the weights and AdamW + fp32 weights shared out, beside their training"
    assert kept not in terms and terms[checked_update] == (2 * P + state, pytest.approx(update_check))
    # beside compute, only what outlasts it is on the critical path
    busy = {name: (size, seconds) for name, size, seconds in checkpoint_io(
        per_step, HW, 3.0, 1.0, {"attribute": 0.25, "update": 60.0})}
    assert busy[checked][1] == pytest.approx(terms[checked][1] - 0.25) and busy[checked_update][1] == 0.0
    # the engines' load from disk (2P / 3 GB/s) outlasts the check beside it (2P / (8 x 1 GB/s)): 0 s
    assert terms["the sampling process verifies them for its 8 engine(s), beside the load"] == (2 * P, 0.0)
    uniform = _setting("configs/qwen2.5-7b/grpo.yaml")
    assert not any("attribute" in name for name, _, _ in checkpoint_io(uniform, HW, 3.0, 1.0, idle))

def test_trl_attribution_memory_per_mode_follows_the_parameter_count():
    """OARGRPOTrainer's modes (docs/trl.md): on the shards a 7B fits 80 GB where DDP does not; the
    gathered modes add a full copy of the weights (fp32 under FSDP1's summon_full_params, bf16 under ZeRO-3)."""
    shape = SHAPES["7b"]
    params = parameters(shape)
    held = trl_attribution_weight_bytes(shape, 8)
    assert held["ddp"] == 16 * params > 80e9 > held["sharded"]
    assert held["fsdp_gathered"] - held["zero3_gathered"] == 2 * params
    assert held["zero3_gathered"] - 16 * params / 8 == 2 * params
    shards_only = 16 * params / 8
    assert 0 < held["sharded"] - shards_only < 2 * params / 2  # a few units: under half a bf16 copy
