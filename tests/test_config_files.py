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


# --- issue 37: YAML without bombs, every file bounded before it is parsed (checkfree.schemas.limits) ---


def _bomb(levels: int = 9) -> str:
    """A "billion laughs": ``lr`` refers to 9**levels strings through aliases."""
    lines = ['a0: &a0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    lines += [f"a{i}: &a{i} [{','.join([f'*a{i - 1}'] * 9)}]" for i in range(1, levels)]
    return "\n".join([*lines, f"lr: *a{levels - 1}", "n_stages: 4"]) + "\n"


@pytest.mark.timeout(30)
@pytest.mark.parametrize(
    "text, line",
    [
        (_bomb(), 1),  # refused at its first anchor, before anything expands
        (
            "n_stages: 4\nlr: &x 0.001\nlr_scale: *x\n",
            2,
        ),  # a harmless anchor is refused too: configs need none
        ("n_stages: 4\nbase: &b {dmodel: 64}\n<<: *b\n", 2),  # a merge is built on an alias
        ("n_stages: 4\nlr_scale: *x\n", 2),  # an alias without its anchor
    ],
)
def test_yaml_anchors_and_aliases_are_refused_before_anything_is_constructed(tmp_path, text, line):
    path = tmp_path / "c.yaml"
    path.write_text(text)
    with pytest.raises(ConfigFileError) as e:
        read_mapping(path)
    assert f"uses a YAML anchor or alias at line {line}" in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("key", ["yes", "no", "on", "off", "true", "~", "null"])
def test_a_yaml_key_that_yaml_reads_as_a_boolean_or_null_is_refused(tmp_path, key):
    """``yes: 1`` would be the key True (YAML 1.1): refused, never compared with the names of the config."""
    path = tmp_path / "c.yaml"
    path.write_text(f"n_stages: 4\n{key}: 1\n")
    with pytest.raises(
        ConfigFileError, match=r"at line 2 is not a name or a number; expected a name \(YAML reads"
    ):
        read_mapping(path)
    path.write_text(f"n_stages: 4\n'{key}': 1\n")  # quoted, it is the name
    assert read_mapping(path)[key] == 1


@pytest.mark.parametrize("suffix", [".YAML", ".Yml", ".yaml"])
def test_a_yaml_suffix_in_any_case_is_read_as_yaml(tmp_path, suffix):
    path = tmp_path / f"c{suffix}"
    path.write_text("n_stages: 4\nlr: 3e-4\n")  # not JSON: read as JSON it would be "not valid JSON"
    assert read_mapping(path) == {"n_stages": 4, "lr": 3e-4}


@pytest.mark.parametrize("suffix", [".json", ".yaml"])
def test_nesting_is_bounded_at_32_before_parsing(tmp_path, suffix):
    """32 levels (the top mapping and 31 lists inside it) read; 33 refused in one sentence, before a parser recurses;
    100,000 refused as fast (json raises RecursionError near 1,000)."""
    path = tmp_path / f"c{suffix}"
    key = '"x": ' if suffix == ".json" else "x: "

    def nested(depth: int) -> str:
        body = key + "[" * (depth - 1) + "]" * (depth - 1)
        return "{" + body + "}" if suffix == ".json" else body + "\n"

    path.write_text(nested(32))
    assert "x" in read_mapping(path)
    for depth in (33, 100_000):
        path.write_text(nested(depth))
        with pytest.raises(ConfigFileError, match="is nested deeper than 32"):
            read_mapping(path)


def test_a_json_string_holding_brackets_does_not_count_as_nesting(tmp_path):
    path = tmp_path / "c.json"
    path.write_text(json.dumps({"n_stages": 4, "dataset": "[" * 100 + '\\"{' * 50}))
    assert read_mapping(path)["n_stages"] == 4


@pytest.mark.parametrize("suffix", [".json", ".yaml"])
def test_a_file_above_1_mib_is_refused_unread(tmp_path, suffix):
    from checkfree.schemas.limits import MAX_FILE_BYTES

    path = tmp_path / f"c{suffix}"
    head = '{"n_stages": 4, "dataset": "' if suffix == ".json" else "n_stages: 4\ndataset: "
    tail = '"}' if suffix == ".json" else "\n"
    fill = MAX_FILE_BYTES - len(head) - len(tail)
    path.write_text(head + "x" * fill + tail)  # exactly 1 MiB: read
    assert read_mapping(path)["n_stages"] == 4
    path.write_text(head + "x" * (fill + 1) + tail)
    with pytest.raises(ConfigFileError, match="is larger than 1,048,576 bytes"):
        read_mapping(path)
