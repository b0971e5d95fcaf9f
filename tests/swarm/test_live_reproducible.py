"""Two uninterrupted live swarms with the same options and seed train bit-identically (issue 39 point 2): the same
training loss and gradient norms at every iteration, the same validation losses, the same weights in
``<run_dir>/model/``. CheckFree+ (``ours-plus``: odd microbatches take swapped stages, so a node's backward passes
come from two neighbours in an order that varies run to run) with two replicas per stage; before the gradients
were summed in microbatch order (checkfree.swarm.node.compute.OrderedGradients) the runs drifted apart in the last
bits within a few iterations.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from checkfree.swarm.supervisor.supervisor import Supervisor

from helpers.swarm import live_config


def _run(tmp: Path) -> tuple[dict, dict[str, torch.Tensor]]:
    tmp.mkdir()
    cfg = live_config(tmp, replicas=2, model={"n_stages": 4}, microbatches=6, in_flight=3)
    out = Supervisor(cfg, "ours-plus", {}, iterations=4, run_dir=tmp / "run", vocab_size=300).run()
    (model,) = (tmp / "run" / "model").glob("iter_*")
    weights = {
        f"{f.name}:{k}": v for f in sorted(model.glob("*.safetensors")) for k, v in load_file(f).items()
    }
    return out, weights


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_two_uninterrupted_runs_with_the_same_seed_are_bit_identical(tmp_path: Path) -> None:
    (a, wa), (b, wb) = _run(tmp_path / "a"), _run(tmp_path / "b")
    assert a["iterations_completed"] == b["iterations_completed"] == 4 and a["crashes_count"] == 0
    for key in ("loss", "grad_norms"):
        assert [r[key] for r in a["iterations"]] == [r[key] for r in b["iterations"]], key
    assert [v["val_loss"] for v in a["validation"]] == [v["val_loss"] for v in b["validation"]]
    assert len(a["validation"]) >= 2 and wa.keys() == wb.keys() and len(wa) > 0
    differ = [k for k in wa if not torch.equal(wa[k], wb[k])]
    assert not differ, f"{len(differ)} of {len(wa)} tensors differ, e.g. {differ[:3]}"
