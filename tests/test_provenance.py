"""Provenance (oarctl/provenance.py): what a run records about where it ran, that it stays out of cache
keys, and `oarctl compare` refusing runs of different or unknown machines and versions unless --allow-mixed;
beside it, compare's price of credit (attribute seconds over sample seconds)."""
from __future__ import annotations

import copy
import importlib.metadata
import json
import os
import re
from types import SimpleNamespace

import pytest
import torch
import yaml
from test_compare import PROVENANCE, fake_run

from oarctl import provenance
from oarctl.config import load_config
from oarctl.errors import OarError
from oarctl.runner import manifest_path


def test_the_record_names_versions_code_machine_and_threads():
    record = provenance.record()
    assert record["versions"]["torch"] == importlib.metadata.version("torch") == torch.__version__
    assert record["versions"]["transformers"] == importlib.metadata.version("transformers")
    assert record["machine"]["cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    assert record["threads"]["torch"] == torch.get_num_threads()
    assert len(record["oarctl"]["source_sha256"]) == 16 and record["oarctl"]["version"]
    assert set(provenance.fingerprint(record)) == set(provenance.COMPARED)
    assert None not in (record["machine"]["cpu"], record["versions"]["python"])
    torch.set_num_threads(1)  # a stage sets policy.threads: the record says what held when it was written
    try:
        assert provenance.record()["threads"]["torch"] == 1
    finally:
        torch.set_num_threads(record["threads"]["torch"])


def test_the_manifest_records_provenance_outside_the_cache_key(tmp_path, monkeypatch):
    import pyarrow as pa

    from oarctl.contract import StageContext, StageOutput
    from oarctl.runner import run_cached

    calls = []

    def function(inputs, config, context):
        calls.append(1)
        return StageOutput(pa.table({"a": [1]}))

    stage = SimpleNamespace(name="fake", version="1", inputs={}, output_kind="table", function=function)
    output, context = tmp_path / "fake.parquet", StageContext(seed=0, step=0)
    first, ran = run_cached(stage, {"x": 1}, None, {}, output, context, log=lambda *a, **k: None)
    assert ran and first["provenance"] == json.loads(manifest_path(output).read_text())["provenance"]
    assert first["provenance"]["machine"] == provenance.record()["machine"]
    elsewhere = copy.deepcopy(first["provenance"])
    elsewhere["machine"].update(cpu="another CPU", cpu_capability="AVX512", gpu="a GPU", gpus=1)
    elsewhere["versions"]["torch"] = "0.0.1"
    monkeypatch.setattr(provenance, "record", lambda: elsewhere)  # the same stage on another machine: a cache hit
    again, ran = run_cached(stage, {"x": 1}, None, {}, output, context, log=lambda *a, **k: None)
    assert not ran and calls == [1] and again["key"] == first["key"] and again["provenance"] == first["provenance"]
    assert "provenance" not in json.dumps(first["key_parts"])
    _, ran = run_cached(stage, {"x": 2}, None, {}, output, context, log=lambda *a, **k: None)
    assert ran and json.loads(manifest_path(output).read_text())["provenance"] == elsewhere  # where it ran now


def test_a_run_config_with_its_provenance_loads_back(tmp_path):
    from oarctl.loop import prepare_run_dir

    config = load_config(None, ["data.toy_train_size=8", "data.toy_heldout_size=4", "sample.temperature=0.7"])
    prepare_run_dir(tmp_path, config)
    recorded = yaml.safe_load((tmp_path / "config.yaml").read_text())
    assert provenance.fingerprint(recorded["provenance"]) == provenance.fingerprint(provenance.record())
    assert load_config(tmp_path / "config.yaml") == config  # a fact, not a setting: `oarctl status` reloads it


def _runs(tmp_path, other: dict | None = None, method: str = "truth"):
    """uniform and `method` at seeds 0 and 1; the `method` run of seed 1 ran where `other` says (None: unrecorded)."""
    runs = []
    for seed in (0, 1):
        runs.append(fake_run(tmp_path / f"u{seed}", "uniform", seed, [0.3, 0.5], [0.2, 0.3, 0.4], 3.0))
        runs.append(fake_run(tmp_path / f"t{seed}", method, seed, [0.3, 0.6], [0.2, 0.4, 0.5], 6.0))
    changed = runs[-1]
    document = yaml.safe_load((changed / "config.yaml").read_text())
    document["provenance"] = other
    (changed / "config.yaml").write_text(yaml.safe_dump(document))
    for manifest in changed.glob("step_*/*.manifest.json"):
        manifest.write_text(json.dumps({**json.loads(manifest.read_text()), "provenance": other}))
    return runs, changed


def test_compare_names_the_one_machine_every_run_ran_on(cli, tmp_path):
    runs, _ = _runs(tmp_path, PROVENANCE)
    result = cli("compare", *runs, "-o", tmp_path / "compare.html")
    assert result.exit_code == 0, result.output
    assert "provenance: every run on test CPU (AVX2), no GPU; torch 2.13.0" in result.stdout
    assert "provenance: every run on test CPU" in (tmp_path / "compare.html").read_text()


def test_compare_refuses_runs_of_another_machine_unless_allow_mixed(cli, tmp_path):
    other = copy.deepcopy(PROVENANCE)
    other["machine"]["cpu_capability"] = "AVX512"
    runs, changed = _runs(tmp_path, other)
    refused = cli("compare", *runs, "-o", tmp_path / "compare.html")
    assert refused.exit_code == 2 and len(refused.stderr.strip().splitlines()) == 1, refused.output
    assert "cpu_capability AVX2 vs AVX512" in refused.stderr and "--allow-mixed" in refused.stderr
    assert str(changed) in refused.stderr and not (tmp_path / "compare.html").exists()
    mixed = cli("compare", *runs, "-o", tmp_path / "compare.html", "--allow-mixed")
    assert mixed.exit_code == 0, mixed.output
    assert "provenance MIXED (compared anyway, --allow-mixed)" in mixed.stdout and "AVX512" in mixed.stdout


def test_runs_that_recorded_no_provenance_are_unknown(cli, tmp_path):
    runs, changed = _runs(tmp_path, None)
    refused = cli("compare", *runs, "-o", tmp_path / "compare.html")
    assert refused.exit_code == 2 and "recorded no provenance" in refused.stderr, refused.output
    assert str(changed) in refused.stderr
    assert cli("compare", *runs, "-o", tmp_path / "compare.html", "--allow-mixed").exit_code == 0


def test_a_run_resumed_on_another_machine_is_mixed_by_itself(tmp_path):
    runs, _ = _runs(tmp_path, PROVENANCE)
    other = copy.deepcopy(PROVENANCE)
    other["versions"]["torch"] = "2.14.0"
    manifest = runs[0] / "step_0002" / "policy.manifest.json"
    manifest.write_text(json.dumps({**json.loads(manifest.read_text()), "provenance": other}))
    with pytest.raises(OarError, match=re.escape(f"{runs[0]} ran on different machines or versions (torch "
                                                 f"2.13.0 vs 2.14.0)")):
        provenance.check_runs([runs[0]])


def test_compare_prices_credit_against_sampling(cli, tmp_path):
    """credit / sampling = mean attribute seconds / mean sample seconds: oar_g 3 s and 2 s over 2 s and 2 s
    sampled -> 2.5 / 2 = 1.25x; uniform has no attribute manifest here -> a dash."""
    runs, _ = _runs(tmp_path, PROVENANCE, method="oar_g")
    for run, seconds in ((runs[1], 3.0), (runs[3], 2.0)):
        for step in (run / "step_0000", run / "step_0001"):
            (step / "attributions.parquet.manifest.json").write_text(json.dumps({"wall_seconds": seconds,
                                                                                "provenance": PROVENANCE}))
    result = cli("compare", *runs, "-o", tmp_path / "compare.html")
    assert result.exit_code == 0, result.output
    stages = result.stdout.split("Seconds per step by stage")[1]
    assert "| method | sample | attribute | reshape | update | step total | credit / sampling |" in stages
    assert "| oar_g | 2.0 | 2.5 | 2.0 | 2.0 | 8.5 | 1.25x |" in stages
    assert "| uniform | 1.0 | — | 1.0 | 1.0 | 3.0 | — |" in stages


def test_the_gpu_name_comes_from_nvidia_smi_without_initialising_cuda(tmp_path, monkeypatch):
    fake = tmp_path / "nvidia-smi"  # what `nvidia-smi --query-gpu=name --format=csv,noheader` prints on 2 GPUs
    fake.write_text("#!/bin/sh\nprintf 'NVIDIA H100 80GB HBM3\\nNVIDIA H100 80GB HBM3\\n'\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert provenance.gpus() == ("NVIDIA H100 80GB HBM3", 2) and not torch.cuda.is_initialized()
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    assert provenance.gpus() == ("NVIDIA H100 80GB HBM3", 1)
    monkeypatch.setenv("PATH", str(tmp_path / "nowhere"))
    assert provenance.gpus() == (None, 0)


def test_a_folder_that_recorded_nothing_or_garbage_is_unknown(tmp_path):
    (tmp_path / "empty").mkdir()
    (tmp_path / "torn").mkdir()
    (tmp_path / "torn" / "config.yaml").write_text("run: [1,\n")
    (tmp_path / "torn" / "x.parquet.manifest.json").write_text("[1, 2]")
    assert provenance.run_records(tmp_path / "empty") == [None]
    assert provenance.run_records(tmp_path / "torn") == [None, None]
    with pytest.raises(OarError, match="empty and 1 more run"):
        provenance.check_runs([tmp_path / "empty", tmp_path / "torn"])
