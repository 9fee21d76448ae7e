"""Config: defaults, YAML + --set precedence, one-line errors naming the option, --explain."""
from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest
import yaml

from oarctl import config as config_module
from oarctl.config import Config, explain, load_config, to_dict
from oarctl.errors import OarError


def write_yaml(tmp_path, document, name="c.yaml"):
    path = tmp_path / name
    path.write_text(document if isinstance(document, str) else yaml.safe_dump(document))
    return path


def test_defaults_load_and_match_the_dataclasses():
    config = load_config()
    assert config == Config()
    assert config.run.seed == 0 and config.sample.group_size == 8 and config.update.clip_high == 0.2
    # defaults are not shared between instances (list options use factories)
    config.data.toy_levels.append(99)
    assert 99 not in Config().data.toy_levels


def test_yaml_then_set_precedence(tmp_path):
    path = write_yaml(tmp_path, {"sample": {"group_size": 4, "temperature": 0.5}, "run": {"steps": 3}})
    config = load_config(path, ["sample.group_size=6", "run.steps=7", "run.steps=9"])
    assert config.sample.group_size == 6          # --set beats the file
    assert config.sample.temperature == 0.5       # the file beats the default
    assert config.run.steps == 9                  # the last --set wins
    assert config.sample.max_new_tokens == Config().sample.max_new_tokens  # untouched default
    assert load_config(path).sample.group_size == 4


def test_set_values_are_parsed_as_yaml():
    config = load_config(None, ["evaluate.pass_k=[1, 2]", "run.progress=false", "data.train=my file.jsonl",
                                "evaluate.samples=2"])
    assert config.evaluate.pass_k == [1, 2]
    assert config.run.progress is False
    assert config.data.train == "my file.jsonl"


def test_ints_accepted_for_floats(tmp_path):
    config = load_config(write_yaml(tmp_path, {"update": {"learning_rate": 1}}), ["sample.temperature=2"])
    assert config.sample.temperature == 2.0 and type(config.sample.temperature) is float
    assert config.update.learning_rate == 1.0 and type(config.update.learning_rate) is float


@pytest.mark.parametrize("source", ["set", "file"])
def test_exponent_floats_without_a_dot_are_floats(tmp_path, source):
    if source == "set":
        config = load_config(None, ["update.learning_rate=1e-5"])
    else:
        config = load_config(write_yaml(tmp_path, "update:\n  learning_rate: 3e-6\n"))
    # PyYAML (YAML 1.1) reads an exponent without a dot as text; float options accept it
    assert config.update.learning_rate == (1e-5 if source == "set" else 3e-6)
    assert type(config.update.learning_rate) is float


@pytest.mark.parametrize("document, names", [
    ({"bogus": {"x": 1}}, ["'bogus'", "unknown section"]),
    ({"sample": {"groupsize": 4}}, ["sample.groupsize", "unknown option"]),
    ({"sample": {"group_size": "four"}}, ["sample.group_size", "expected int", "str"]),
    ({"sample": {"group_size": 2.5}}, ["sample.group_size", "expected int", "float"]),
    ({"run": {"steps": True}}, ["run.steps", "expected int", "bool"]),
    ({"run": {"progress": 1}}, ["run.progress", "expected bool"]),
    ({"sample": {"temperature": "hot"}}, ["sample.temperature", "expected float"]),
    ({"data": {"train": 3}}, ["data.train", "expected str"]),
    ({"evaluate": {"pass_k": 4}}, ["evaluate.pass_k", "expected list"]),
    ({"sample": 3}, ["'sample'", "mapping"]),
])
def test_file_errors_name_the_file_and_the_option(tmp_path, document, names):
    path = write_yaml(tmp_path, document)
    with pytest.raises(OarError) as error:
        load_config(path)
    message = str(error.value)
    assert str(path) in message
    for name in names:
        assert name in message
    assert "\n" not in message


@pytest.mark.parametrize("override, names", [
    ("bogus.x=1", ["--set bogus.x=1", "unknown section"]),
    ("sample.nope=1", ["sample.nope", "unknown option"]),
    ("sample.group_size=many", ["sample.group_size", "expected int"]),
    ("sample.group_size", ["expected section.key=value"]),
    ("group_size=3", ["expected section.key=value"]),
    ("sample.=3", ["expected section.key=value"]),
])
def test_set_errors_name_the_override(override, names):
    with pytest.raises(OarError) as error:
        load_config(None, [override])
    for name in names:
        assert name in str(error.value)


@pytest.mark.parametrize("override, option", [
    ("run.steps=-1", "run.steps"),
    ("run.keep_checkpoints=0", "run.keep_checkpoints"),
    ("sample.group_size=0", "sample.group_size"),
    ("sample.prompts_per_step=0", "sample.prompts_per_step"),
    ("sample.temperature=0", "sample.temperature"),
    ("sample.top_p=0", "sample.top_p"),
    ("sample.top_p=1.5", "sample.top_p"),
    ("sample.max_new_tokens=0", "sample.max_new_tokens"),
    ("update.micro_batch_size=0", "update.micro_batch_size"),
    ("update.mini_batch_size=2", "update.mini_batch_size"),  # below the default micro batch
    ("update.epochs=0", "update.epochs"),
    ("update.learning_rate=-0.1", "update.learning_rate"),
    ("reshape.quantile=1", "reshape.quantile"),
    ("reshape.quantile=0", "reshape.quantile"),
    ("evaluate.samples=0", "evaluate.samples"),
    ("evaluate.pass_k=[1, 8]", "evaluate.pass_k"),  # 8 > evaluate.samples (4)
    ("policy.backend=tensorrt", "policy.backend"),
    ("verify.extraction=loose", "verify.extraction"),
    ("evaluate.extraction=fuzzy", "evaluate.extraction"),
    ("vllm.gpu_memory_utilization=1.5", "vllm.gpu_memory_utilization"),
])
def test_out_of_range_values_name_the_option(override, option):
    with pytest.raises(OarError) as error:
        load_config(None, [override])
    assert option in str(error.value)


def test_range_checks_see_the_merged_config(tmp_path):
    # pass_k = [1, 8] is fine once the file raises samples to 8, whatever the order of sources
    path = write_yaml(tmp_path, {"evaluate": {"samples": 8}})
    assert load_config(path, ["evaluate.pass_k=[1, 8]"]).evaluate.pass_k == [1, 8]


@pytest.mark.parametrize("override", ["sample.batch_size=0", "evaluate.batch_size=0", "run.seed=-1"])
def test_values_that_would_crash_a_stage_are_rejected_when_loaded(override):
    with pytest.raises(OarError, match=re.escape(override.split("=")[0])):
        load_config(None, [override])


@pytest.mark.parametrize("override", ["attribute.method=bogus", "reshape.estimator=bogus",
                                      "update.loss_aggregation=bogus", "verify.method=bogus"])
def test_registry_names_are_checked_when_loaded(override):
    with pytest.raises(OarError, match=f"{re.escape(override.split('=')[0])}.*bogus"):
        load_config(None, [override])


def test_missing_and_invalid_files(tmp_path):
    with pytest.raises(OarError, match="config file not found"):
        load_config(tmp_path / "absent.yaml")
    with pytest.raises(OarError, match="not valid YAML"):
        load_config(write_yaml(tmp_path, "run: {steps: [1,\n"))
    with pytest.raises(OarError, match="mapping of sections"):
        load_config(write_yaml(tmp_path, "- 1\n- 2\n"))
    assert load_config(write_yaml(tmp_path, "")) == Config()  # an empty file is all defaults


def test_resolved_config_round_trips_through_yaml(tmp_path):
    """`oarctl run` records config.yaml and `oarctl status` reloads it: a dump must load back."""
    config = load_config(None, ["sample.temperature=0.7", "reshape.eps=0.001", "evaluate.pass_k=[1, 2]"])
    path = write_yaml(tmp_path, yaml.safe_dump(to_dict(config), sort_keys=False))
    assert load_config(path) == config
    default_dump = write_yaml(tmp_path, yaml.safe_dump(to_dict(Config()), sort_keys=False), "d.yaml")
    assert load_config(default_dump) == Config()  # eps=1e-6 and friends survive the dump


def test_explain_lists_every_field_under_its_section():
    text = explain()
    section = None
    seen = set()
    for line in text.splitlines():
        if not line.startswith(" "):
            section = line.rstrip(":")
            continue
        name = line.strip().split(":", 1)[0]
        assert "#" in line and line.split("#", 1)[1].strip(), f"no help text: {line!r}"
        seen.add((section, name))
    expected = {(s, f.name) for s, cls in [(s, type(getattr(Config(), s))) for s in config_module.SECTIONS]
                for f in dataclasses.fields(cls)}
    assert seen == expected


def test_cli_config_explain_and_resolved(cli, tmp_path):
    result = cli("config", "--explain")
    assert result.exit_code == 0, result.output
    for section in config_module.SECTIONS:
        part = getattr(Config(), section)
        for field in dataclasses.fields(part):
            assert f"  {field.name}: " in result.stdout
    path = write_yaml(tmp_path, {"sample": {"group_size": 3}})
    result = cli("config", "-c", path, "--set", "run.steps=5")
    assert result.exit_code == 0, result.output
    resolved = yaml.safe_load(result.stdout)
    assert resolved["sample"]["group_size"] == 3 and resolved["run"]["steps"] == 5
    assert resolved == to_dict(load_config(path, ["run.steps=5"]))


@pytest.mark.parametrize("path", sorted((Path(__file__).parent.parent / "configs").glob("*.yaml")),
                         ids=lambda p: p.name)
def test_every_shipped_config_loads(path):
    config = load_config(path)
    assert config.run.steps >= 1
    assert path.read_text().startswith("#"), "each config starts with the command that runs it"


def test_explain_names_each_deviation_beside_an_existing_option():
    lines, section = {}, None
    for line in explain().splitlines():
        if not line.startswith(" "):
            section = line.rstrip(":")
        else:
            lines[f"{section}.{line.split(':', 1)[0].strip()}"] = line
    for name, deviation in config_module.DEVIATIONS.items():
        assert name in lines, f"{name}: no such option"
        assert deviation in lines[name] and "docs/method.md" in lines[name]
    assert "reproduces the released code, not the paper's text" in lines["reshape.quantile_carry"]


def test_quantile_carry_joins_the_reshape_key_only_when_on():
    """Runs made before the option existed keep their reshape cache keys."""
    from oarctl.config import KEYED_WHEN_SET
    from oarctl.pipeline import key_section

    default = key_section(load_config(), "reshape")
    assert "quantile_carry" not in default
    assert default == {k: v for k, v in to_dict(Config())["reshape"].items() if k not in KEYED_WHEN_SET["reshape"]}
    assert key_section(load_config(overrides=["reshape.quantile_carry=true"]), "reshape")["quantile_carry"] is True
