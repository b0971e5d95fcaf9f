"""benchmarks/gpu_check.sh: it skips only where there is no GPU and fails where torch cannot see the GPU that
nvidia-smi lists; ``--plan`` builds every section's inputs at full size on the CPU and fails with one sentence on
what would fail on the GPU; a section stops at its budget; SIGTERM ends the whole check at once (exit 143, the
swarm's processes too) with every row written; SMOKE runs every section's logic on the CPU."""

from __future__ import annotations

import importlib
import os
import queue
import re
import signal
import subprocess
import sys
import tarfile
import threading
import time
from pathlib import Path

import pytest
import torch

from helpers import ROOT, strict_json

SCRIPT = ROOT / "benchmarks" / "gpu_check.sh"
TITLES = {
    1: "124M throughput, bf16 on/off",
    2: "Table 2 model, W=1",
    3: "1.5B, activation checkpointing",
    4: "recovery on the device vs CPU",
    5: "swarm on the device",
    6: "124M with --compile",
    7: "convergence under failures",
    8: "124M compiled with CUDA graphs",
}
no_cuda = pytest.mark.skipif(
    torch.cuda.is_available(), reason="this machine has CUDA: the check would run for real"
)


def _path_without_nvidia_smi(extra: Path | None = None) -> str:
    dirs = [d for d in os.environ["PATH"].split(os.pathsep) if d and not (Path(d) / "nvidia-smi").exists()]
    return os.pathsep.join(([str(extra)] if extra else []) + dirs)


def _fake_nvidia_smi(tmp_path: Path, listing: str) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "nvidia-smi"
    fake.write_text(f"#!/bin/sh\n[ \"$1\" = -L ] || exit 9\nprintf '%s\\n' '{listing}'\n")
    fake.chmod(0o755)
    return bin_dir


def _run(timeout: float, *args: str, **env: str) -> subprocess.CompletedProcess:
    """The script in a session of its own: on a timeout its whole process group (the swarm too) is killed."""
    proc = subprocess.Popen(
        [str(SCRIPT), *args],
        env={**os.environ, **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # the group this test started, by its id
        proc.communicate(timeout=30)
        raise
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


class _Check:
    """A SMOKE check running in its own session, its output read line by line in a thread."""

    def __init__(self, tmp_path: Path, *args: str):
        self.out = tmp_path / "out"
        env = {"SMOKE": "1", "DEVICE": "cpu", "OUT_DIR": str(self.out), "TMPDIR": str(tmp_path)}
        self.proc = subprocess.Popen(
            [str(SCRIPT), *args],
            env={**os.environ, **env},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        self.lines: list[str] = []
        self.children: set[int] = set()
        """Every process seen below the check while it ran (the swarm's launcher, forkserver, nodes)."""
        self._queue: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        threading.Thread(target=self._watch, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self._queue.put(line)
        self._queue.put(None)

    def _watch(self) -> None:
        while self.proc.poll() is None:
            self.children |= _descendants(self.proc.pid)
            time.sleep(0.1)

    def wait_for(self, pattern: str, timeout: float) -> str:
        """The first line (from now on) that matches ``pattern``; fails after ``timeout`` seconds or at EOF."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                line = self._queue.get(timeout=max(0.01, deadline - time.monotonic()))
            except queue.Empty:
                break
            if line is None:
                break
            self.lines.append(line)
            if re.search(pattern, line):
                return line
        raise AssertionError(f"no line matching {pattern!r}:\n" + "".join(self.lines[-40:]))

    def finish(self, timeout: float) -> int:
        """Wait for the exit (every line read); the exit code."""
        code = self.proc.wait(timeout=timeout)
        while (line := self._queue.get(timeout=30)) is not None:
            self.lines.append(line)
        return code

    def kill(self) -> None:
        """SIGKILL the session's process group, which this test made: the check, and whatever it left behind."""
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:  # nothing is left in it
            pass
        self.proc.wait(timeout=30)

    def scratch(self) -> Path:
        first = next(line for line in self.lines if line.startswith("gpu_check on "))
        return Path(re.search(r"runs in (\S+);", first)[1])


def _descendants(pid: int) -> set[int]:
    """Every live process below ``pid`` (from /proc's parent links)."""
    parents: dict[int, list[int]] = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            parents.setdefault(ppid, []).append(int(d.name))
    out, todo = set(), [pid]
    while todo:
        for child in parents.get(todo.pop(), []):
            out.add(child)
            todo.append(child)
    return out


def _alive(pid: int) -> bool:
    """A process that exists and is not a zombie."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def _wait_gone(pids: set[int], timeout: float) -> set[int]:
    deadline = time.monotonic() + timeout
    while (alive := {p for p in pids if _alive(p)}) and time.monotonic() < deadline:
        time.sleep(0.2)
    return alive


# ------------------------------------------------------------------------------------------------ the device


@pytest.mark.timeout(60)
@no_cuda
def test_without_nvidia_smi_or_a_listed_gpu_the_check_is_skipped_and_succeeds(tmp_path):
    r = _run(50, PATH=_path_without_nvidia_smi())
    assert r.returncode == 0 and r.stdout.strip() == "no GPU: skipped (no nvidia-smi)", r.stderr
    bin_dir = _fake_nvidia_smi(tmp_path, "No devices were found")
    r = _run(50, PATH=_path_without_nvidia_smi(bin_dir))
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "no GPU: skipped (nvidia-smi -L lists none: No devices were found)"
    bad = _run(50, DEVICE="tpu")
    assert bad.returncode == 2 and "DEVICE is 'tpu'" in bad.stderr


@pytest.mark.timeout(60)
@no_cuda
def test_a_gpu_that_torch_cannot_see_fails_with_torchs_version_and_cuda_build(tmp_path):
    """The borrowed machine's first question: nvidia-smi lists an H100, so "skipped" would hide a wrong torch."""
    bin_dir = _fake_nvidia_smi(tmp_path, "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-0)")
    r = _run(50, PATH=_path_without_nvidia_smi(bin_dir), OUT_DIR=str(tmp_path / "out"))
    assert r.returncode == 1, r.stdout + r.stderr
    assert "skipped" not in r.stdout and "gpu_check on" not in r.stdout  # nothing ran
    build = f"a CUDA {torch.version.cuda} build" if torch.version.cuda else "a CPU-only build"
    assert f"torch {torch.__version__}, {build}, sees none" in r.stderr
    assert "nvidia-smi lists 1 GPU(s) (GPU 0: NVIDIA H100 80GB HBM3" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()


# ------------------------------------------------------------------------------------------------ user mistakes


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    ("args", "env", "message"),
    [
        (
            ["--sections", "1,9"],
            {},
            "--sections is '1,9'; expected distinct section numbers from 1 to 8, comma-separated, e.g. 1,3,5.",
        ),
        (
            [],
            {"SECTIONS": "3,3"},
            "--sections is '3,3'; expected distinct section numbers from 1 to 8, comma-separated, e.g. 1,3,5.",
        ),
        (
            ["--budgets", "5=0"],
            {},
            "--budgets is '5=0'; expected SECTION=SECONDS pairs, comma-separated, with sections from 1 to 8 and "
            "positive seconds, e.g. 1=60,5=200.",
        ),
        (
            ["--plan"],
            {"SMOKE": "1"},
            "--plan builds the full-size inputs and SMOKE=1 runs micro sizes; expected one of them.",
        ),
    ],
)
def test_a_wrong_option_is_one_sentence_exit_2_and_nothing_written(tmp_path, args, env, message):
    out = tmp_path / "out"
    r = _run(100, *args, DEVICE="cpu", OUT_DIR=str(out), TMPDIR=str(tmp_path), **env)
    assert r.returncode == 2 and r.stderr == f"gpu_check: {message}\n", r.stdout + r.stderr
    assert r.stdout == "" and not out.exists()


@pytest.mark.timeout(60)
def test_an_out_dir_that_holds_a_report_is_refused_and_left_as_it_was(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "gpu_check.json").write_text('{"earlier": true}')
    r = _run(50, SMOKE="1", DEVICE="cpu", OUT_DIR=str(out), TMPDIR=str(tmp_path))
    assert r.returncode == 2, r.stdout + r.stderr
    assert (
        r.stderr.strip()
        == f"gpu_check: OUT_DIR {out} already holds gpu_check.json; expected a new or empty directory."
    )
    assert sorted(p.name for p in out.iterdir()) == ["gpu_check.json"]
    assert (out / "gpu_check.json").read_text() == '{"earlier": true}'


def test_a_section_runs_with_its_budget_or_what_is_left_and_one_that_needs_time_is_skipped_without_it():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        gpu_check = importlib.import_module("gpu_check")
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    by = {s.number: s for s in gpu_check.SECTIONS}
    assert gpu_check.schedule(by[1], 90, None) == (90, None)
    assert gpu_check.schedule(by[1], 90, 40) == (40, None)  # the deadline comes first
    assert gpu_check.schedule(by[1], None, None) == (None, None)  # SMOKE: no budget
    assert gpu_check.schedule(by[1], 90, 0) == (None, "skipped: the deadline has passed")
    needs = by[6].if_time_remains
    assert gpu_check.schedule(by[6], 240, needs + 10) == (needs + 10, None)
    assert gpu_check.schedule(by[6], 240, needs - 1) == (
        None,
        f"skipped: {needs - 1:.0f} s left before the deadline, it needs {needs:.0f} s",
    )
    always = sum(s.budget_s for s in gpu_check.SECTIONS if s.if_time_remains is None)
    assert always + gpu_check.CHECK_STARTUP_S <= gpu_check.DEADLINE_S == 480


# ------------------------------------------------------------------------------------------------ --plan


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_plan_builds_every_section_at_full_size_within_the_deadline_and_names_what_would_fail(tmp_path):
    """The whole default check, planned on this CPU with fresh token caches: the 124M config's sizes, the 1.5B
    config's memory, every budget; then the 124M validation size of the configs (--config-validation), which
    the default corpus cannot hold out: one sentence, exit 1, as the GPU run would fail."""
    env = {"CHECKFREE_CACHE": str(tmp_path / "cache"), "TMPDIR": str(tmp_path), "DEVICE": "cuda"}
    r = _run(880, "--plan", **env)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert r.stderr == ""
    rows = [line for line in r.stdout.splitlines() if re.match(r"\| \d\. ", line)]
    assert [int(line[2]) for line in rows] == list(TITLES)
    for number, line in zip(TITLES, rows, strict=True):
        title, builds, mem, expected, budget = (c.strip() for c in line.strip("|").split(" | "))
        assert title.startswith(f"{number}. {TITLES[number]}"), title
        assert float(expected) <= float(budget) and mem.endswith("fits"), line
    assert "124M_config.json: 83.1 M params, 4 × 64 × 512 tokens/it., 20 it." in rows[0]
    assert "validation 2 × 64 seq." in rows[0] and "vocab 32000 (bpe)" in rows[0]
    assert "500M_config_6x4.json: 468.2 M params" in rows[1]
    assert (
        "1_5B_config.json: 1,741.8 M params, 2 × 8 × 4096 tokens/it., 3 it." in rows[2]
        and "act. ckpt" in rows[2]
    )
    assert "swarm run --dry-run passed" in rows[4]
    total = next(line for line in r.stdout.splitlines() if line.startswith("| total |"))
    expected, budget = re.search(r"\| (\d+) \| (\d+) of the 480 s deadline", total).groups()
    assert int(expected) <= 480 and int(budget) <= 480, total
    assert r.stdout.rstrip().splitlines()[-1].startswith("plan passed: 8 section(s) planned")
    assert (
        len(list((tmp_path / "cache").glob("shakespeare-*/meta.json"))) >= 5
    )  # the caches really were built

    old = _run(300, "--plan", "--sections", "1", "--config-validation", **env)
    assert old.returncode == 1, old.stdout + old.stderr
    assert len(old.stderr.splitlines()) == 1, old.stderr
    assert old.stderr.startswith(
        "gpu_check --plan: section 1 (124M throughput, bf16 on/off) would fail on the GPU: dataset 'Shakespeare' "
        "is too small"
    )
    assert (
        "fewer than the 1641600 validation tokens (validation_sequences × (seq_len + 1) = 3200 × 513)"
        in old.stderr
    )


@pytest.mark.timeout(120)
def test_plan_names_a_package_the_gpu_run_would_miss(tmp_path):
    fake = tmp_path / "site" / "zmq"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text('raise ImportError("no zmq here (a stand-in)")\n')
    r = _run(100, "--plan", "--sections", "5", PYTHONPATH=str(tmp_path / "site"), TMPDIR=str(tmp_path))
    assert r.returncode == 1, r.stdout + r.stderr
    assert r.stderr == (
        "gpu_check --plan: section 5 (swarm on the device) needs the package pyzmq (import zmq: no zmq here (a "
        "stand-in)); run ./setup.sh (on a GPU machine: ./setup.sh --system-torch --wheelhouse "
        ".cache/device_bundle).\n"
    )


# ------------------------------------------------------------------------------------------------ budgets, signals


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_section_stops_at_its_budget_with_a_row_saying_so_and_the_next_one_runs(tmp_path):
    """The swarm (section 5) gets 2 s: it is stopped, its processes end, a row says so; section 7 still runs."""
    check = _Check(tmp_path, "--sections", "5,7", "--budgets", "5=2")
    try:
        check.wait_for(r"^5\. swarm on the device \(budget 2 s\)", 120)
        code = check.finish(200)
    finally:
        check.kill()
    text = "".join(check.lines)
    assert code == 1, text[-3000:]
    assert re.search(r"5\. swarm on the device\s+stopped\s+at its budget of 2 s;", text), text[-3000:]
    # section 7 ran, to its end (its row in the closing table)
    assert re.search(r"finished, finite, falling\s+\| yes", text), text[-3000:]
    report = strict_json((check.out / "gpu_check.json").read_text())
    assert report["status"] == "failed"
    assert [(s["number"], s["ended"], s["ok"]) for s in report["sections"]] == [
        (5, "budget", False),
        (7, "finished", True),
    ]
    assert report["sections"][0]["budget_s"] == 2
    assert not (check.scratch() / "runs" / "swarm" / "throughput.json").exists()  # it did not run to its end
    assert check.children and not _wait_gone(check.children, 30), "the swarm's processes outlived its section"


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_sigterm_ends_the_whole_check_at_once_with_the_swarm_and_every_row_written(tmp_path):
    """SIGTERM while the swarm runs: no later section starts, the swarm's processes end, exit code 143, the rows
    of the sections before and a "terminated" row are in both files, and the logs archive is written."""
    check = _Check(tmp_path, "--sections", "4,5,7")
    try:
        check.wait_for(r"^5\. swarm on the device", 120)
        deadline = time.monotonic() + 90
        while len(check.children) < 5 and time.monotonic() < deadline:
            time.sleep(0.2)  # the launcher, the forkserver and the nodes it forks
        assert len(check.children) >= 5, check.children
        # the check's own process (gpu_check.sh execs python), by its id
        check.proc.send_signal(signal.SIGTERM)
        code = check.finish(90)
    finally:
        check.kill()
    text = "".join(check.lines)
    assert code == 143, text[-3000:]
    assert not any(line.startswith("7.") for line in check.lines), text[-3000:]
    assert not _wait_gone(check.children, 30), "the swarm's processes outlived the check"
    report = strict_json((check.out / "gpu_check.json").read_text())
    assert report["status"] == "terminated"
    assert [(s["number"], s["ended"]) for s in report["sections"]] == [(4, "finished"), (5, "terminated")]
    metrics = [(r["section"], r["metric"]) for r in report["rows"]]
    assert ("recovery checkfree stage 2", "cpu vs cpu max |diff|") in metrics
    assert metrics[-1] == ("5. swarm on the device", "terminated")
    md = (check.out / "gpu_check.md").read_text()
    assert "| 5. swarm on the device | terminated | by SIGTERM after" in md
    assert md.rstrip().endswith("TERMINATED by SIGTERM: the rows above are what was measured")
    assert (check.out / "gpu_check_logs.tar.gz").stat().st_size > 0


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_sigterm_during_a_simulator_run_ends_the_check_not_just_the_run(tmp_path):
    """SIGTERM once section 1's first run is training (a simulator run turns Ctrl-C into an error of its own,
    which a check that caught errors per section would have recorded before starting section 2)."""
    check = _Check(tmp_path, "--sections", "1,2")
    try:
        check.wait_for(r"^1\. 124M throughput", 120)
        metrics = check.scratch() / "runs" / "micro_124M_bf16" / "metrics.jsonl"
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and (not metrics.exists() or '"train"' not in metrics.read_text()):
            time.sleep(0.01)
        check.proc.send_signal(signal.SIGTERM)
        code = check.finish(90)
    finally:
        check.kill()
    text = "".join(check.lines)
    assert code == 143, text[-3000:]
    assert not any(line.startswith("2.") for line in check.lines), text[-3000:]
    report = strict_json((check.out / "gpu_check.json").read_text())
    assert report["status"] == "terminated"
    assert [(s["number"], s["ended"]) for s in report["sections"]] == [(1, "terminated")]
    assert "error" not in [r["metric"] for r in report["rows"]]


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_run_cut_short_keeps_the_rows_it_measured(tmp_path):
    """SIGKILL (the device's hard limit) once section 2 starts: section 1's rows are already in both files."""
    check = _Check(tmp_path, "--sections", "1,2")
    try:
        check.wait_for(r"^2\. Table 2 model", 100)
    finally:
        check.kill()
    report = strict_json((check.out / "gpu_check.json").read_text())
    assert (
        report["status"] == "running" and report["device"] == "cpu" and report["torch"] == torch.__version__
    )
    metrics = [(r["section"], r["metric"]) for r in report["rows"]]
    assert ("micro W=1, bf16 autocast", "tokens/s (mean, it. 2..N)") in metrics
    assert ("micro W=1, bf16 autocast", "staged ÷ plain step") in metrics
    assert ("micro W=1, autocast off", "tokens/s bf16 ÷ fp32") in metrics
    assert [s["number"] for s in report["sections"]] == [1] and report["sections"][0]["seconds"] > 0
    md = (check.out / "gpu_check.md").read_text()
    assert "| micro W=1, bf16 autocast | staged ÷ plain step |" in md
    assert "| 1. 124M throughput, bf16 on/off | section seconds |" in md


# ------------------------------------------------------------------------------------------------ SMOKE


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_smoke_runs_every_section_on_the_cpu_and_writes_its_report(tmp_path):
    out = tmp_path / "out"
    r = _run(290, SMOKE="1", DEVICE="cpu", TMPDIR=str(tmp_path), OUT_DIR=str(out))
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    text = r.stdout
    for number, title in TITLES.items():
        assert f"\n{number}. {title}\n" in text
    table = text[text.index("\nsection ") + 1 :]  # the closing table, after the rows printed as they came
    for run in ("micro W=1, bf16 autocast", "micro W=1, autocast off", "micro W=1 --compile"):
        assert f"{run:<41}| tokens/s (mean, it. 2..N)" in table and f"{run:<41}| MFU" in table, run
    assert "autocast                           | bf16 on (fp32 master weights)" in table
    assert "autocast                           | off: fp32 (TF32 matmuls on CUDA)" in table
    assert "tokens/s bf16 ÷ fp32" in table and table.count("staged ÷ plain step") == 2
    # a CPU: every run on the plain loss, the baseline too, and the comparison skipped (not failed) here
    assert (
        table.count("| loss                               | plain cross-entropy over fp32 logits (no CUDA)")
        == 6
    )
    assert "| plain cross-entropy over fp32 logits (--fused-loss off)" in table
    assert "| skipped: loss: plain cross-entropy over fp32 logits (no CUDA)" in table
    assert "micro_config W=1 (Table 2)" in table and "peak memory, act. ckpt" in table
    assert "finished, finite, falling          | yes" in table
    assert table.count("cpu vs cpu max |diff|              | 0.00e+00") == 4
    swarm = [line for line in table.splitlines() if line.startswith("swarm micro: ours, stage 2 lost")]
    assert len(swarm) == 4 and "| cpu (12 nodes)" in swarm[0], swarm  # 10 nodes + 2 replacements
    assert swarm[-1].endswith("| 2/2, yes")
    assert text.rstrip().endswith("all checks passed")

    report = strict_json((out / "gpu_check.json").read_text())
    assert report["status"] == "passed" and report["smoke"] is True
    assert [s["number"] for s in report["sections"]] == list(TITLES)
    assert all(
        s["ok"] is True and s["ended"] == "finished" and s["seconds"] > 0 and s["budget_s"] is None
        for s in report["sections"]
    )
    printed = [line for line in table.splitlines()[2:] if line.count(" | ") == 2]
    assert len(report["rows"]) == len(printed) > 30
    md = (out / "gpu_check.md").read_text().splitlines()
    assert sum(line.startswith("| ") for line in md) == len(report["rows"]) + 1  # + the header line
    assert md[-1] == "all checks passed"
    assert sorted(p.name for p in out.iterdir()) == [
        "gpu_check.json",
        "gpu_check.md",
        "gpu_check_logs.tar.gz",
    ]
    scratch = Path(re.search(r"runs in (\S+);", text)[1])
    simulator_runs = [d for d in (scratch / "runs").iterdir() if d.name != "swarm"]
    assert len(simulator_runs) == 8 and not any(any(d.glob("checkpoints/*")) for d in simulator_runs)  # none
    with tarfile.open(out / "gpu_check_logs.tar.gz") as tar:
        names = tar.getnames()
    assert any(n.endswith("swarm/supervisor.log") for n in names)
    assert not [n for n in names if "/keys/" in n or "join_tokens" in n or n.endswith("journal.json")], names


@pytest.mark.timeout(60)
def test_the_logs_archive_leaves_out_the_swarms_secrets_checkpoints_and_caches(tmp_path):
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        report_module = importlib.import_module("gpu_check_report")
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    scratch = tmp_path / "scratch"
    kept = [
        "runs/swarm/supervisor.log",
        "runs/swarm/throughput.json",
        "runs/a/metrics.jsonl",
        "runs/a/summary.json",
    ]
    secret = ["runs/swarm/keys/node0.json", "runs/swarm/join_tokens/machine5.json", "runs/swarm/journal.json"]
    other = ["runs/a/checkpoints/iter_3.safetensors", "cache/tokens.json", "corpus/train.txt"]
    for name in kept + secret + other:
        (scratch / name).parent.mkdir(parents=True, exist_ok=True)
        (scratch / name).write_text("{}")
    report = report_module.Report(tmp_path / "out", {"started": "now"})
    with tarfile.open(report.archive_logs(scratch)) as tar:
        assert sorted(tar.getnames()) == sorted(f"scratch/{n}" for n in kept)


# ------------------------------------------------------------------------------------------------ the fused loss


@pytest.mark.timeout(120)
def test_the_fused_vs_plain_comparison_passes_the_same_loss_and_fails_a_wrong_one(tmp_path, monkeypatch):
    """Section 1's comparison on the micro config, on this CPU, with a stand-in for Liger's loss (exact torch
    math): within tolerance; then with a fused loss 10 % too large: missed (the loss and the gradients); then
    0.01 nats too large (the same gradients), and with gradients 10 % too large (the same loss): missed."""
    from checkfree.loss import LossPath

    from helpers.liger import install_fake_liger

    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    sections = importlib.import_module("gpu_check_sections")
    fake = install_fake_liger(monkeypatch)
    monkeypatch.setattr(sections, "loss_path", lambda ctx, choice="auto": LossPath(True, "a stand-in"))
    rows: list[tuple[str, str, str]] = []
    ctx = sections.CheckContext(
        "cpu", True, tmp_path, tmp_path / "cache", 1, 1, False, lambda *row: rows.append(row)
    )
    ctx.micro_config = sections.smoke_setup(tmp_path)
    run = sections.throughput_runs(ctx)[0]
    assert sections.fused_vs_plain(ctx, run) is True
    assert len(fake.calls) == 1
    got = {metric: value for _, metric, value in rows}
    assert got["target |Δloss| ≤ 0.001 nats, gradients within 1%"] == "met", rows
    assert float(got["|loss fused − plain|"].split()[0]) <= 1e-3

    wrong = fake.module.LigerFusedLinearCrossEntropyLoss

    class TooLarge(wrong):
        def __call__(self, *args, **kwargs):
            return 1.1 * super().__call__(*args, **kwargs)

    monkeypatch.setattr(fake.module, "LigerFusedLinearCrossEntropyLoss", TooLarge)
    rows.clear()
    assert sections.fused_vs_plain(ctx, run) is False
    got = {metric: value for _, metric, value in rows}
    assert got["target |Δloss| ≤ 0.001 nats, gradients within 1%"] == "missed"
    assert float(got["gradients ‖fused − plain‖ ÷ ‖plain‖"]) > 0.05

    class Shifted(wrong):  # the same gradients, a loss 0.01 nats off: missed on the loss alone
        def __call__(self, *args, **kwargs):
            return super().__call__(*args, **kwargs) + 0.01

    monkeypatch.setattr(fake.module, "LigerFusedLinearCrossEntropyLoss", Shifted)
    rows.clear()
    assert sections.fused_vs_plain(ctx, run) is False
    got = {metric: value for _, metric, value in rows}
    assert float(got["gradients ‖fused − plain‖ ÷ ‖plain‖"]) < 1e-5

    class Steeper(wrong):  # the same loss, gradients 10 % too large: missed on the gradients alone
        def __call__(self, *args, **kwargs):
            loss = super().__call__(*args, **kwargs)
            return loss + 0.1 * (loss - loss.detach())

    monkeypatch.setattr(fake.module, "LigerFusedLinearCrossEntropyLoss", Steeper)
    rows.clear()
    assert sections.fused_vs_plain(ctx, run) is False
    got = {metric: value for _, metric, value in rows}
    assert float(got["|loss fused − plain|"].split()[0]) < 1e-5


def test_the_comparison_is_skipped_on_a_cpu_and_fails_on_cuda_without_the_fused_path(tmp_path, monkeypatch):
    from checkfree.loss import LossPath

    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    sections = importlib.import_module("gpu_check_sections")
    rows: list[tuple[str, str, str]] = []
    for device, passed in (("cpu", True), ("cuda", False)):
        why = "no CUDA" if device == "cpu" else "liger-kernel not installed"
        monkeypatch.setattr(sections, "loss_path", lambda ctx, choice="auto", w=why: LossPath(False, w))
        ctx = sections.CheckContext(device, False, tmp_path, None, 1, 1, False, lambda *row: rows.append(row))
        run = sections.throughput_runs(ctx)[0]
        assert sections.fused_vs_plain(ctx, run) is passed
        assert rows[-1][2] == f"skipped: loss: plain cross-entropy over fp32 logits ({why})"
