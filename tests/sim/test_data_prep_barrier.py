"""With W > 1, ranks 1..W−1 wait for rank 0's data preparation longer than the process group's timeout
(checkfree/sim/launch.py, ``rank0_first``): two real gloo processes on 127.0.0.1."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from helpers import ROOT
from helpers.net import free_port

WORKER = r"""
import datetime, logging, os, sys, time
from pathlib import Path
import torch.distributed as dist
from checkfree.sim import launch

logging.basicConfig(level=logging.INFO, stream=sys.stderr)
rank, out = int(os.environ["RANK"]), Path(sys.argv[1])
# the default group's timeout, as PROCESS_GROUP_TIMEOUT but shorter than rank 0's preparation below
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=2))

def prepare():
    if rank == 0:
        time.sleep(6)  # a preparation three times longer than the default group's timeout
        (out / "cache").write_text("tokens")
    return (out / "cache").read_text()  # the other ranks find what rank 0 made

got = launch.rank0_first(prepare, rank, 2, what="the test's cache", log_every=1.0)
(out / f"rank{rank}").write_text(got)
dist.barrier()
dist.destroy_process_group()
"""


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_other_ranks_wait_for_rank0_beyond_the_default_group_timeout(tmp_path):
    port = free_port()
    procs = []
    for rank in range(2):
        env = dict(
            os.environ,
            PYTHONPATH=str(ROOT),
            OMP_NUM_THREADS="1",
            RANK=str(rank),
            WORLD_SIZE="2",
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
        )
        cmd = [sys.executable, "-c", WORKER, str(tmp_path)]
        procs.append(
            subprocess.Popen(cmd, env=env, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        )
    try:
        errors = [p.communicate(timeout=150)[1].decode() for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(timeout=30)
    assert [p.returncode for p in procs] == [0, 0], [e[-3000:] for e in errors]
    assert (tmp_path / "rank0").read_text() == (tmp_path / "rank1").read_text() == "tokens"
    assert "waiting for rank 0: the test's cache" in errors[1]  # the waiting rank's progress line
