"""Every command in the ```bash blocks of README.md and docs/*.md runs as written, so the docs cannot drift from the code.

The commands run with bash in a scratch copy of the repository layout (nothing is written into the checkout).
Launchers that would train for minutes or hours run with ``DRY_RUN=1``, which validates everything a real run
validates and prints the plan; ``./setup.sh`` (it installs packages) is syntax-checked; the test command
collects this file; ``tensorboard --logdir`` (a server) becomes ``tensorboard --version``. ``report``, ``export`` and ``generate`` run for real on two tiny runs made here.
The pages themselves are checked too: every docs/ page is linked from the README, every relative link (and its
``#anchor``) resolves, and docs/architecture.md's tree names every file of the ``checkfree`` package.
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

from helpers import ROOT
from helpers.cli import CACHE, simulate_argv

pytestmark = [pytest.mark.slow, pytest.mark.timeout(480)]

LINKED = (
    "checkfree",
    "configs",
    "simulate_training",
    "communication",
    "benchmarks",
    "tests",
    "failure_traces",
    ".venv",
)
LINKED_FILES = ("setup.sh", "failure_generator.py", "pyproject.toml", "requirements.txt")
DRY = re.compile(
    r"(simulate_training/run(_2)?\.sh|communication/run_throughput\.sh|paper_comparison\.sh|fig2_probe\.sh"
    r"|trace_replay(_swarm)?\.sh)"
)


DOC_PAGES = (ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")))
"""The pages whose ```bash blocks must run: the README and every page under docs/."""
LINKED_PAGES = (*DOC_PAGES, ROOT / "benchmarks" / "results" / "README.md")
"""The pages whose relative links must resolve."""


def readme_commands() -> list[str]:
    """Each command of the ```bash blocks of README.md and docs/*.md (``a && b`` counts as two), without comments,
    once each."""
    text = "\n".join(page.read_text(encoding="utf-8") for page in DOC_PAGES)
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
    assert len(DOC_PAGES) >= 8  # the README and the docs/ pages it links
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
    (box / "runs" / "sw-earlier").mkdir()  # the docs first run the swarm into runs/sw, then table runs/sw*
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
    # these read what an earlier command writes: export's model, the mapped trace schedules
    outs = {path for c in commands for path in re.findall(r"--out (runs/\S+\.json)", c)}
    later = [c for c in commands if " generate " in c or any(o in c and f"--out {o}" not in c for o in outs)]
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


def _slug(heading: str) -> str:
    """GitHub's anchor of a Markdown heading: lower case, punctuation dropped, spaces → hyphens."""
    text = re.sub(r"[`*_]", "", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", page.read_text(encoding="utf-8"), flags=re.S)
    return {_slug(h) for h in re.findall(r"^#+\s+(.*)$", text, re.M)}


def _links(page: Path) -> list[str]:
    """Relative link targets of a page (outside code blocks and spans), e.g. ``docs/swarm.md#outputs``."""
    text = re.sub(r"```.*?```", "", page.read_text(encoding="utf-8"), flags=re.S)
    text = re.sub(r"`[^`\n]*`", "", text)
    return [t for t in re.findall(r"\]\(([^)\s]+)\)", text) if not re.match(r"[a-z]+:", t)]


def test_every_docs_page_is_linked_from_the_readme():
    linked = {(ROOT / t.split("#")[0]).resolve() for t in _links(ROOT / "README.md")}
    pages = sorted((ROOT / "docs").glob("*.md"))
    assert pages and not [p.name for p in pages if p.resolve() not in linked]


@pytest.mark.parametrize("page", LINKED_PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(page):
    broken = []
    for target in _links(page):
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if ROOT.resolve() not in (dest, *dest.parents) or not dest.exists():
            broken.append(target)
        elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
            broken.append(target)
    assert not broken, broken


def _architecture_tree() -> set[str]:
    """The files under checkfree/ that docs/architecture.md's tree names (two spaces of indent per level)."""
    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    block = re.search(r"## The tree.*?```\n(.*?)```", text, re.S).group(1)
    named, stack = set(), []
    for line in block.splitlines():
        depth = (len(line) - len(line.lstrip(" "))) // 2
        entry = re.split(r"\s{2,}", line.strip())[0]
        del stack[depth:]
        for name in entry.split(", "):
            if name.endswith("/"):
                stack.append(name.rstrip("/"))
            elif stack and stack[0] == "checkfree":
                named.add("/".join([*stack, name]))
    return named


def test_architecture_tree_names_every_package_file():
    files = {
        str(p.relative_to(ROOT))
        for p in (ROOT / "checkfree").rglob("*")
        if p.suffix in (".py", ".json") and p.name != "__init__.py" and "__pycache__" not in p.parts
    }
    named = _architecture_tree()
    assert not files - named, f"docs/architecture.md does not name {sorted(files - named)}"
    assert not named - files, f"docs/architecture.md names missing files {sorted(named - files)}"


TEST_PATH = re.compile(r"\btests/[A-Za-z0-9_/]+\.py\b")


def test_every_test_file_named_in_the_docs_and_the_code_exists():
    """A doc page or a docstring that sends the reader to a test file names one that exists (tests move with the
    package's layout)."""
    sources = [
        *LINKED_PAGES,
        ROOT / "configs" / "README.md",
        *sorted((ROOT / "checkfree").rglob("*.py")),
        *sorted((ROOT / "benchmarks").glob("*.py")),
        *sorted((ROOT / "benchmarks").glob("*.sh")),
    ]
    missing = sorted(
        f"{src.relative_to(ROOT)}: {name}"
        for src in sources
        for name in set(TEST_PATH.findall(src.read_text(encoding="utf-8")))
        if not (ROOT / name).is_file()
    )
    assert not missing, missing
