"""Launcher dry runs: positional arguments of the paper, swaps on for run.sh and off for run_2.sh."""

import os
import subprocess

import pytest

from helpers import ROOT


def launch(script, *args, dry=True):
    env = dict(os.environ, DRY_RUN="1" if dry else "0")
    return subprocess.run(
        [str(ROOT / "simulate_training" / script), *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.timeout(150)
def test_run_sh_turns_swaps_on_and_run_2_off():
    on = launch("run.sh", "ours-grad-avg", "2", "16", "tiny_config.json", "0", "--max-iterations", "200")
    off = launch("run_2.sh", "ours-grad-avg", "2", "16", "tiny_config.json", "0")
    assert on.returncode == 0 and off.returncode == 0, on.stderr + off.stderr
    first_on, first_off = on.stdout.splitlines()[0], off.stdout.splitlines()[0]
    assert "--nproc_per_node=2" in first_on and "--swaps" in first_on and "--max-iterations 200" in first_on
    assert "--no-swaps" in first_off
    assert "strategy checkfree_plus" in on.stdout and "strategy checkfree " in off.stdout
    assert 'p_iter 0.01 (config["16"])' in on.stdout
    assert "stage 4: " in on.stdout  # parameter count per stage


@pytest.mark.timeout(60)
def test_launcher_usage_errors():
    r = launch("run.sh", "ours-grad-avg", "2")
    assert r.returncode == 2 and "usage: run.sh SETTING WORLD_SIZE P CONFIG START_ITER" in r.stderr
    r = launch("run.sh", "ours-grad-avg", "two", "16", "tiny_config.json", "0")
    assert r.returncode == 2 and "WORLD_SIZE is 'two'" in r.stderr


@pytest.mark.timeout(60)
def test_unknown_setting_is_one_sentence():
    r = launch("run.sh", "ours-magic", "1", "16", "tiny_config.json", "0", dry=False)
    assert r.returncode == 2
    assert r.stderr.strip().startswith("checkfree simulate: error: unknown setting 'ours-magic'")
    assert "Traceback" not in r.stderr


@pytest.mark.timeout(60)
@pytest.mark.parametrize("script", ["run.sh", "run_2.sh"])
def test_a_config_path_that_does_not_exist_is_said_so(script):
    """A path into a directory is that file or none: the launcher once trained configs/tiny_config.json when handed
    /nonexistent/dir/tiny_config.json (issue 37)."""
    r = launch(script, "checkfree", "1", "16", "/nonexistent/dir/tiny_config.json", "0")
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "Traceback" not in r.stderr
    assert r.stderr.startswith("CONFIG '/nonexistent/dir/tiny_config.json' does not exist;")
    assert r.stdout == ""  # refused before the command line is printed or python starts
