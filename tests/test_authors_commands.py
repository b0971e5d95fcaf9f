"""Every training command of the authors' README runs as written from simulate_training/ (DRY_RUN).

The list is the authors' README (gensyn-ai/CheckFree, "All training scripts"), each distinct line once. The launchers
themselves run twice (run.sh and run_2.sh, one process each); every command's resolution (setting, swaps, config,
world size, rate, start iteration) then runs in this process, as ``_launch.sh`` passes it on.
"""

from __future__ import annotations

import os
import shlex
import subprocess

import pytest

from helpers import ROOT
from helpers.cli import run_cli

SIM = ROOT / "simulate_training"

AUTHORS_COMMANDS = """
./run.sh no_failure 4 10 500M_config_gpt.json 0
./run.sh no_failure 2 10 124M_config.json 0
./run.sh ours-grad-avg 4 16 500M_config_gpt.json 0
./run.sh no_failure 8 16 1_5B_config.json 100
./run.sh ours-naive 4 10 500M_config.json 0
./run.sh ours-random 4 10 500M_config.json 0
./run.sh ours-grad-avg 2 10 124M_config.json 0
./run.sh ours-grad-avg 8 16 1_5B_config.json 0
./run.sh ours-grad-avg 4 33 500M_config.json 0
./run.sh ours-grad-avg 4 10 500M_config.json 0
./run.sh ours-grad-avg 4 16 500M_config.json 0
./run.sh ours-grad-avg 4 5 500M_config.json 0
./run.sh ours-grad-avg-regularize 4 16 500M_config.json 0
./run.sh ours-zero 4 16 500M_config.json 0
./run_2.sh ours-grad-avg 4 5 500M_config.json 0
./run_2.sh ours-grad-avg 4 10 500M_config.json 0
./run_2.sh ours-grad-avg 4 16 500M_config.json 0
./run_2.sh ours-grad-avg 2 10 124M_config.json 0
""".strip().splitlines()

LAYOUT = {  # config → the resolved line the dry run prints
    "124M_config.json": "LLaMa d=512 heads=8 4 stages × 3 layers",
    "500M_config.json": "LLaMa d=1024 heads=16 12 stages × 2 layers",
    "500M_config_gpt.json": "GPT d=1024 heads=16 6 stages × 4 layers",
    "1_5B_config.json": "LLaMa d=2048 heads=16 12 stages × 2 layers",
}
STRATEGY = {
    ("no_failure", True): "no_failure",
    ("ours-naive", True): "copy",
    ("ours-random", True): "random",
    ("ours-zero", True): "zero",
    ("ours-grad-avg", True): "checkfree_plus",
    ("ours-grad-avg-regularize", True): "checkfree_plus",
    ("ours-grad-avg", False): "checkfree",
}


def test_the_authors_list_has_18_distinct_commands() -> None:
    assert len(AUTHORS_COMMANDS) == len(set(AUTHORS_COMMANDS)) == 18


def _argv(line: str) -> tuple[list[str], str, str, str]:
    launcher, setting, world, rate, config, start = shlex.split(line)
    swaps = "--swaps" if launcher == "./run.sh" else "--no-swaps"
    argv = ["simulate", "--setting", setting, "--world-size", world, "--rate", rate, "--config", config]
    return [*argv, "--start-iter", start, swaps, "--dry-run"], setting, config, start


@pytest.mark.parametrize("line", AUTHORS_COMMANDS)
def test_each_authors_command_resolves(line: str, capsys, monkeypatch) -> None:
    monkeypatch.chdir(SIM)
    before = sorted(p.name for p in SIM.iterdir())
    argv, setting, config, start = _argv(line)
    rc, out, err = run_cli(argv, capsys)
    assert sorted(p.name for p in SIM.iterdir()) == before  # a dry run writes nothing
    if start != "0":  # the authors' resume of the 1.5B run: no checkpoint at iteration 100 here
        assert rc == 2 and err.count("\n") == 1 and "Traceback" not in err
        assert "checkpoints/iter_0000100 does not exist" in err
        return
    assert rc == 0, err
    assert f"config {config}: {LAYOUT[config]}" in out
    assert f"strategy {STRATEGY[(setting, '--swaps' in argv)]} (setting {setting!r})" in out


@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.parametrize(
    "line",
    ["./run.sh ours-grad-avg 8 16 1_5B_config.json 0", "./run_2.sh ours-grad-avg 2 10 124M_config.json 0"],
)
def test_the_launchers_run_the_authors_commands_as_written(line: str) -> None:
    env = {**os.environ, "DRY_RUN": "1"}
    r = subprocess.run(shlex.split(line), cwd=SIM, env=env, capture_output=True, text=True, timeout=200)
    assert r.returncode == 0, r.stderr
    config = shlex.split(line)[4]
    assert f"config {config}: {LAYOUT[config]}" in r.stdout
