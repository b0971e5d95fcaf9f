"""The authors' JSON config format is accepted unchanged; every invalid value is one clear sentence."""

import json

import pytest

from checkfree.config import CONFIG_DIR, ConfigError, config_from_dict, load_config

PAPER = {
    "124M_config.json": (512, 8, 3, 4, 512, 64, 4, 6e-4, 1.1),
    "500M_config.json": (1024, 16, 2, 12, 1024, 16, 4, 3e-4, 1.2),  # the authors' current 12 × 2 layout
    "1_5B_config.json": (2048, 16, 2, 12, 4096, 8, 2, 3e-4, 1.1),
    "500M_config_gpt.json": (1024, 16, 4, 6, 1024, 8, 8, 1e-4, 1.2),
    "500M_config_6x4.json": (1024, 16, 4, 6, 1024, 16, 4, 3e-4, 1.2),  # the paper's first version
    "1_5B_config_6x4.json": (2048, 16, 4, 6, 4096, 8, 2, 3e-4, 1.1),
}
AUTHORS_FILES = ("124M_config.json", "500M_config.json", "500M_config_gpt.json", "1_5B_config.json")


@pytest.mark.parametrize("name", sorted(PAPER))
def test_paper_configs_load_unchanged(name):
    cfg = load_config(name)
    d, h, layers, stages, seq, batch, mb, lr, lr_scale = PAPER[name]
    assert (cfg.dmodel, cfg.num_heads, cfg.n_layers_per_stage, cfg.n_stages) == (d, h, layers, stages)
    assert (cfg.seq_l, cfg.batch_size, cfg.mb_count, cfg.lr, cfg.lr_scale) == (seq, batch, mb, lr, lr_scale)
    assert cfg.tokenizer_name == "llama2"  # the paper's tokenizer for hub datasets
    raw = json.loads((CONFIG_DIR / name).read_text())
    assert {k: v for k, v in raw.items() if k.replace(".", "").isdigit()} == cfg.failure_probabilities


def test_failure_keys_are_probabilities_not_learning_rates():
    cfg = load_config("500M_config.json")
    assert cfg.failure_probabilities == {"5": 0.0009, "10": 0.002, "16": 0.004, "33": 0.01}
    assert cfg.lr == 3e-4


@pytest.mark.parametrize("name", AUTHORS_FILES)
def test_the_authors_files_copied_into_the_working_directory_load_unchanged(name, tmp_path, monkeypatch):
    """A user copies the authors' simulate_training/*_config.json next to run.sh: accepted as is."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / name).write_bytes((CONFIG_DIR / name).read_bytes())
    notes: list[str] = []
    cfg = load_config(name, None, notes)
    assert (cfg.n_stages, cfg.max_iterations) == {
        "124M_config.json": (4, 100001),
        "500M_config.json": (12, 100001),
        "500M_config_gpt.json": (6, 30001),
        "1_5B_config.json": (12, 36001),
    }[name]
    if name == "1_5B_config.json":  # the authors spell it "RedPyjamas": read as RedPajama, with a note
        assert cfg.dataset == "RedPajama" and cfg.tokenizer_name == "llama2"
        assert notes == ["dataset 'RedPyjamas' is the authors' spelling of 'RedPajama'; training on it."]
    else:
        assert notes == []


@pytest.mark.parametrize(
    ("old", "new"),
    [("1.5B_config.json", "1_5B_config_6x4.json"), ("500M_GPT_config.json", "500M_config_gpt.json")],
)
def test_names_checkfree_shipped_before_load_the_renamed_file_with_a_note(old, new):
    notes: list[str] = []
    assert load_config(old, None, notes) == load_config(new)
    assert notes == [f"config {old!r} is now named {new!r} (configs/README.md); loading {new}."]


def test_config_resolves_cwd_first_then_configs(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert load_config("tiny_config.json").dataset == "Shakespeare"  # from configs/
    (tmp_path / "tiny_config.json").write_text(json.dumps({"dmodel": 64, "num_heads": 2, "n_stages": 4}))
    assert load_config("tiny_config.json").dmodel == 64  # the working directory wins


def test_overrides_win_and_are_validated():
    assert load_config("tiny_config.json", {"max_iterations": 7, "seed": None}).max_iterations == 7
    with pytest.raises(ConfigError, match="'max_iterations' is -1"):
        load_config("tiny_config.json", {"max_iterations": -1})


@pytest.mark.parametrize(
    "raw, fragment",
    [
        ({"dmodel": "big"}, "'dmodel' is 'big'; expected an integer"),
        ({"dmodel": 100, "num_heads": 3}, "not divisible by 'num_heads'"),
        ({"architecture": "Mamba"}, "'architecture' is 'Mamba'; expected one of"),
        ({"lr": 0}, "'lr' is 0.0; expected a positive number"),
        ({"n_stages": 0}, "'n_stages' is 0; expected a positive integer"),
        ({"16": 1.5}, "failure probability '16' is 1.5"),
        ({"16": "often"}, "failure probability '16' is 'often'"),
        ({"grad_norm_mode": "max"}, "'grad_norm_mode' is 'max'"),
        ({"dmdoel": 4}, "unknown key 'dmdoel'"),
        ({"lr": float("nan")}, "expected a finite number"),
    ],
)
def test_bad_values_raise_one_sentence(raw, fragment):
    with pytest.raises(ConfigError) as e:
        config_from_dict(raw)
    assert fragment in str(e.value)
    assert "\n" not in str(e.value)


def test_missing_and_malformed_files(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.json"):
        load_config(tmp_path / "nope.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ConfigError, match="not valid JSON"):
        load_config(bad)


def test_a_config_without_n_stages_is_refused_unless_set(tmp_path):
    """No silent 4 stages: a file without "n_stages" is refused with one sentence; --set n_stages=… gives it."""
    raw = json.loads((CONFIG_DIR / "tiny_config.json").read_text())
    del raw["n_stages"]
    path = tmp_path / "no_stages.json"
    path.write_text(json.dumps(raw))
    with pytest.raises(ConfigError) as e:
        load_config(path)
    assert "'n_stages'" in str(e.value) and '"n_stages": 4' in str(e.value) and "\n" not in str(e.value)
    assert load_config(path, {"n_stages": 6}).n_stages == 6


# --- issue 37: every key typed and bounded by the schema (checkfree.schemas), before anything is sized by it ---


@pytest.mark.parametrize(
    "key, good, bad, says",
    [
        ("n_stages", 1024, 1025, "'n_stages' is 1025; expected a positive integer ≤ 1,024"),
        ("mb_count", 4096, 4097, "'mb_count' is 4097; expected a positive integer ≤ 4,096"),
        ("dmodel", 65_536, 65_537, "'dmodel' is 65537; expected a positive integer ≤ 65,536"),
        ("max_iterations", 0, -1, "'max_iterations' is -1; expected an integer in [0, 100,000,000]"),
        ("max_iterations", 100_000_000, 100_000_001, "'max_iterations' is 100000001"),
        ("seed", 2**63 - 1, 2**63, "'seed' is 9223372036854775808; expected an integer in [0, 2^63)"),
        ("seed", 0, -1, "'seed' is -1; expected an integer in [0, 2^63)"),
        ("lr", 1e6, 1.5e6, "'lr' is 1500000.0; expected a positive number ≤ 1e+06"),
        ("dataset", "x" * 4096, "x" * 4097, "'dataset' is 'xxxxxxxx"),
        ("max_train_tokens", 1, 0, "'max_train_tokens' is 0; expected a positive integer"),
    ],
)
def test_each_key_is_bounded_at_its_edge(key, good, bad, says):
    base = {"dmodel": 128, "num_heads": 4} if key != "dmodel" else {"num_heads": 1}
    assert getattr(config_from_dict(base | {key: good}), key) == good
    with pytest.raises(ConfigError) as e:
        config_from_dict(base | {key: bad}, "config c.json")
    assert str(e.value).startswith("config c.json: ") and says in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("value", [1e29, 10**30, True, "4", [4], None])
def test_n_stages_must_be_a_real_integer_in_range(value):
    """1e29 once reached an OverflowError; a bool, a string or a list is not a count."""
    with pytest.raises(ConfigError, match="'n_stages' is "):
        config_from_dict({"n_stages": value})


def test_a_config_path_into_a_directory_is_that_file_or_none(tmp_path, monkeypatch):
    """A path into another directory never falls back to the shipped config of the same name (run.sh once trained
    configs/tiny_config.json when handed /nonexistent/dir/tiny_config.json); a bare name and configs/NAME do."""
    from checkfree.config import resolve_config_path

    monkeypatch.chdir(tmp_path)
    with pytest.raises(FileNotFoundError, match="the path does not exist"):
        resolve_config_path("/nonexistent/dir/tiny_config.json")
    with pytest.raises(FileNotFoundError, match="the path does not exist"):
        resolve_config_path("elsewhere/tiny_config.json")
    assert resolve_config_path("tiny_config.json") == CONFIG_DIR / "tiny_config.json"
    assert resolve_config_path("configs/tiny_config.json") == CONFIG_DIR / "tiny_config.json"


@pytest.mark.parametrize(
    "item, says",
    [
        ("dmodel=" + "[" * 33 + "]" * 33, "--set dmodel is nested deeper than 32"),
        ("dmodel=" + "[" * 30_000 + "]" * 30_000, "--set dmodel is nested deeper than 32"),
        ("dataset=" + "x" * 65_537, "is 65,537 characters long; expected a value of at most 65,536"),
    ],
)
def test_a_set_value_is_bounded_before_it_is_parsed(item, says):
    from checkfree.config import parse_sets

    with pytest.raises(ValueError, match=says):
        parse_sets([item])
    assert parse_sets(["dataset=" + "x" * 65_536, "dmodel=" + "[" * 32 + "]" * 32])["dataset"] == "x" * 65_536
