"""Every command in the README's ```bash blocks runs as written, so the README cannot drift from the code.

The commands run with bash in a scratch copy of the repository layout (nothing is written into the checkout).
Launchers that would train for minutes or hours run with ``DRY_RUN=1``, which validates everything a real run
validates and prints the plan; ``./setup.sh`` (it installs packages) is syntax-checked; the test command
collects this file; ``tensorboard --logdir`` (a server) becomes ``tensorboard --version``. ``report``, ``export`` and ``generate`` run for real on two tiny runs made here.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from cli_helpers import CACHE, ROOT, simulate_argv

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

LINKED = ("checkfree", "configs", "simulate_training", "communication", "benchmarks", "tests", ".venv")
LINKED_FILES = ("setup.sh", "failure_generator.py", "pyproject.toml", "requirements.txt")
DRY = re.compile(
    r"(simulate_training/run(_2)?\.sh|communication/run_throughput\.sh|paper_comparison\.sh|fig2_probe\.sh)"
)


def readme_commands() -> list[str]:
    """Each command of the README's ```bash blocks (``a && b`` counts as two), without comments, once each."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    lines = [line for block in re.findall(r"```bash\n(.*?)```", text, re.S) for line in block.splitlines()]
    commands = [re.sub(r"\s+#\s.*$", "", line).strip() for line in lines if line.strip()]
    return list(dict.fromkeys(part for c in commands for part in c.split(" && ")))


def runnable(command: str) -> str:
    """The command as the test runs it: DRY_RUN=1 for the launchers, setup.sh syntax-checked, tests collected."""
    if command == "./setup.sh":
        return "bash -n setup.sh"
    if DRY.search(command) and "DRY_RUN=" not in command:
        return "DRY_RUN=1 " + command
    if " -m pytest" in command:  # the suite running this test is the rest of the proof
        return command + " --collect-only -p no:cacheprovider tests/test_readme_commands.py"
    if (
        "tensorboard --logdir" in command
    ):  # a server that runs until stopped: check that the viewer is installed
        return command.split(" --logdir")[0] + " --version"
    return command


def test_every_readme_block_command_is_covered():
    commands = readme_commands()
    assert len(commands) >= 12
    assert any(
        "swarm_tiny_16.json" in c for c in commands
    )  # the tiny swarm's example has a schedule that fits
    assert not any("..." in c for c in commands)  # placeholders cannot run


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory) -> Path:
    """The repository layout (links), its own failure_p_configs/, two tiny finished runs and a swarm result."""
    from checkfree.cli import main
    from checkfree.swarm.cli import TABLE_KEYS

    box = tmp_path_factory.mktemp("readme")
    for name in LINKED + LINKED_FILES:
        (box / name).symlink_to(ROOT / name)
    shutil.copytree(ROOT / "failure_p_configs", box / "failure_p_configs")
    for name, setting in (("a", "no_failure"), ("b", "checkfree")):
        assert main(simulate_argv(box / "runs" / name, setting=setting, iterations=4)) == 0
    (
        box / "runs" / "sw-earlier"
    ).mkdir()  # the README first runs the swarm into runs/sw, then tables runs/sw*
    result = {k: 0 for k in TABLE_KEYS} | {"setting": "checkpoint", "loss_curve": [[0, 8.3], [99, 5.1]]}
    (box / "runs" / "sw-earlier" / "throughput.json").write_text(json.dumps(result))
    return box


def _run(command: str, cwd: Path) -> tuple[str, subprocess.CompletedProcess]:
    env = dict(os.environ, CHECKFREE_CACHE=str(CACHE), PATH=f"{cwd / '.venv' / 'bin'}:{os.environ['PATH']}")
    env.pop("DRY_RUN", None)
    proc = subprocess.run(
        ["bash", "-c", command], cwd=cwd, env=env, capture_output=True, text=True, timeout=200
    )
    return command, proc


def test_every_readme_command_runs_as_written(sandbox):
    commands = list(dict.fromkeys(runnable(c) for c in readme_commands()))
    later = [c for c in commands if " generate " in c]  # needs export's output
    first = [c for c in commands if c not in later]
    with ThreadPoolExecutor(max_workers=3) as pool:
        results = list(pool.map(lambda c: _run(c, sandbox), first))
    results += [_run(c, sandbox) for c in later]
    for command, proc in results:
        assert proc.returncode == 0 and "Traceback" not in proc.stderr, (command, proc.stderr[-2000:])
    assert (sandbox / "report" / "report.md").is_file()
    assert (sandbox / "hf_model" / "checkfree_export.json").is_file()
    generated = (sandbox / "failure_p_configs" / "16.json").read_bytes()
    assert generated == (ROOT / "failure_p_configs" / "16.json").read_bytes()
    assert not (sandbox / "runs" / "x").exists()  # DRY_RUN wrote nothing
