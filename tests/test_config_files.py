"""Configs in YAML as well as JSON (checkfree/config_files.py): the same mapping, the same typed validation, the
same one-sentence errors."""

from __future__ import annotations

import json

import pytest

from checkfree.config import ConfigError, load_config
from checkfree.config_files import ConfigFileError, read_mapping
from checkfree.swarm.config import load_swarm_config
from checkfree.swarm.topology import TopologyError, load_locations

from helpers import ROOT
from helpers.cli import assert_user_error, run_cli

TINY_YAML = """\
# configs/tiny_config.json in YAML: unquoted failure keys, scientific notation without a dot
dataset: Shakespeare
architecture: LLaMa
validation: 8
dmodel: 128
num_heads: 4
n_layers_per_stage: 1
n_stages: 4
seq_l: 128
batch_size: 8
mb_count: 4
lr_scale: 1.1
max_iterations: 400
lr: 2e-3
5: 0.003
10: 0.006
16: 0.01
33: 0.02
eval_interval: 50
log_interval: 25
checkpoint_interval: 100
vocab_size: 4096
seed: 0
"""


def test_a_yaml_model_config_is_the_json_one(tmp_path):
    path = tmp_path / "tiny.yaml"
    path.write_text(TINY_YAML)
    assert load_config(path) == load_config(ROOT / "configs" / "tiny_config.json")
    (tmp_path / "tiny.yml").write_text(TINY_YAML)
    assert load_config(tmp_path / "tiny.yml").lr == 2e-3
    assert read_mapping(path)["16"] == 0.01  # the key is the string, as in JSON


def test_a_yaml_swarm_config_and_locations_table_load_like_json(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    raw = json.loads((ROOT / "configs" / "swarm_tiny.json").read_text())
    lines = [f"{k}: {json.dumps(v)}" for k, v in raw.items()]  # JSON values are YAML flow values
    (tmp_path / "swarm.yaml").write_text("\n".join(lines) + "\n")
    assert load_swarm_config("swarm.yaml").to_json() == load_swarm_config("swarm_tiny.json").to_json()
    table = json.loads((ROOT / "checkfree" / "swarm" / "locations.json").read_text())
    (tmp_path / "loc.yaml").write_text(json.dumps(table))  # JSON is YAML
    assert load_locations(tmp_path / "loc.yaml") == load_locations(None)


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("n_stages: 4\nlr:\n\t0.1\n", "indents line 3 with a tab; YAML indents with spaces only"),
        ("- 1\n- 2\n", "expected a YAML mapping of keys at the top level, got a list"),
        ("n_stages: [4\n", "is not valid YAML"),
        ("? [1, 2]\n: 3\n", "is not a name or a number"),
    ],
)
def test_bad_yaml_is_one_sentence(tmp_path, text, fragment):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(ConfigFileError, match=fragment.replace("[", r"\[")):
        read_mapping(path)
    with pytest.raises(ConfigError):
        load_config(path)


def test_a_key_given_twice_is_noted_the_same_way_in_both_formats(tmp_path):
    (tmp_path / "a.json").write_text('{"n_stages": 4, "lr": 0.1, "lr": 0.2}')
    (tmp_path / "a.yaml").write_text("n_stages: 4\nlr: 0.1\nlr: 0.2\n")
    notes = {suffix: [] for suffix in ("json", "yaml")}
    for suffix, found in notes.items():
        assert read_mapping(tmp_path / f"a.{suffix}", "config", found)["lr"] == 0.2
    assert [n.replace("a.yaml", "a.json") for n in notes["yaml"]] == notes["json"]
    assert notes["json"] == [
        f"config {tmp_path / 'a.json'} gives the key 'lr' twice; the last value 0.2 is used."
    ]


def test_the_cli_refuses_a_bad_yaml_config_with_exit_2(tmp_path, capsys):
    (tmp_path / "bad.yaml").write_text("n_stages: 4\n  lr: 0.1\n")
    rc, _, err = run_cli(
        ["simulate", "--setting", "checkfree", "--config", str(tmp_path / "bad.yaml"), "--dry-run"], capsys
    )
    assert_user_error(rc, err, "is not valid YAML", "line 2")
    (tmp_path / "loc.yaml").write_text("- a\n")
    with pytest.raises(TopologyError, match="expected a YAML mapping"):
        load_locations(tmp_path / "loc.yaml")
