"""Trainer.step on the meta device: no CPU tensor mixed into device math, and exactly the documented host syncs.

A meta tensor has shapes and dtypes but no data, so on ``torch.device("meta")`` every op of the step runs (fast)
and two classes of GPU-path bugs raise instead of passing silently on a CPU:

* a CPU tensor created inside the step or the recovery math and mixed with the stages' tensors ("Tensor on
  device cpu is not on the expected device meta");
* a read of a device value by the host (``.item()``, ``float()``, ``bool()``, ``.tolist()``: a device → host
  sync on CUDA). :class:`HostReads` intercepts these on meta tensors, counts them by the ``checkfree/`` file that
  asked, and answers with a stand-in, so the counts can be held to the ones the trainer's docstring documents
  (checkfree/sim/trainer.py, "Host syncs"): one per iteration, in the trainer.

Every registered strategy (checkfree/recovery/registry.py) runs under scripted failures of a middle stage,
stage 1 and stage S, two adjacent stages and, where the strategy recovers it, stage 0; LLaMa and GPT. Not covered,
because they copy state to host memory or disk by design and a meta tensor has no data to copy:
:data:`HOST_BY_DESIGN`. The ladder runs with its device-resident rungs only (``redundant,neighbour,random``).
Waits that read nothing are not counted (the trainer's docstring lists them): the ``random`` rule's CPU draws
copied in from pageable memory, ``redundant``'s timed forward between ``torch.cuda.synchronize`` calls.
"""

from __future__ import annotations

import traceback
import warnings
from collections import Counter
from pathlib import Path

import pytest
import torch
from torch.overrides import TorchFunctionMode

import checkfree
import checkfree.sim.trainer as trainer_module
from checkfree.model import build_stages
from checkfree.recovery.registry import STRATEGY_CLASSES, make_strategy
from checkfree.sim.trainer import RunContext, Trainer
from checkfree.telemetry.metrics import MetricsSink

from helpers import VOCAB, RandomBatches, ScriptedFailures, tiny_config

META = torch.device("meta")
PACKAGE = Path(checkfree.__file__).resolve().parent
HOST_READS = {
    "item",
    "tolist",
    "__bool__",
    "__float__",
    "__int__",
    "__index__",
    "__complex__",
    "equal",
    "allclose",
}
"""Tensor methods and torch functions that hand a device value to the host (a sync on CUDA)."""

HOST_BY_DESIGN = {
    "checkpoint": "its checkpoints are copies in host memory or on disk (the paper's baseline; DataStates, Gemini)",
    "one": "its checkpoints are copies in host memory or on disk, like checkpoint's",
    "ec_snapshot": "its REFT snapshots and parity are flattened into host memory",
}
"""Strategies not run on meta, and why."""

LADDER_DEVICE_RUNGS = "redundant,neighbour,random"
"""The ladder's rungs that live on the device (its ec_snapshot rung is host memory, as ec_snapshot)."""

S = 4
SCRIPT = {0: [2], 1: [1, S], 2: [2, 3]}
"""Iteration → stages lost: a middle stage; stage 1 and stage S (not adjacent: each recovers as if alone); two
adjacent stages."""
STAGE0_ITERATION = 3


class HostReads(TorchFunctionMode):
    """Counts every host read of a meta tensor by the checkfree/ file that asked, answering with a stand-in."""

    def __init__(self) -> None:
        super().__init__()
        self.sites: Counter[str] = Counter()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        tensors = [a for a in args if isinstance(a, torch.Tensor)]
        if name not in HOST_READS or not any(t.device.type == "meta" for t in tensors):
            return func(*args, **kwargs)
        self.sites[_asking_file()] += 1
        if name == "tolist":
            return torch.ones(tensors[0].shape).tolist()
        return {"__bool__": True, "equal": True, "allclose": True, "__int__": 1, "__index__": 1}.get(
            name, 1.0
        )


def _asking_file() -> str:
    """The innermost file of the checkfree package on the stack ("elsewhere" when none: a library on its own)."""
    for frame in reversed(traceback.extract_stack()):
        path = Path(frame.filename)
        if path.is_relative_to(PACKAGE):
            return (Path("checkfree") / path.relative_to(PACKAGE)).as_posix()
    return "elsewhere"


class ListSink(MetricsSink):
    def __init__(self) -> None:
        super().__init__(None)
        self.records: list[dict] = []

    def write(self, kind, **fields):
        record = super().write(kind, **fields)
        self.records.append(record)
        return record


def _trainer(name: str, arch: str, script: dict[int, list[int]], accounting: bool = False):
    cfg = tiny_config(
        architecture=arch, n_stages=S, dmodel=16, seq_l=8, batch_size=1, ladder_rungs=LADDER_DEVICE_RUNGS
    )
    with torch.device("meta"):
        stages = build_stages(cfg, VOCAB, seed=0)
    sink = ListSink()
    ctx = RunContext(sink=sink, device=META, recovery_accounting=accounting)
    val = [RandomBatches(cfg, seed=99).batch(0)]
    strategy = make_strategy(name, cfg, swaps=True)
    trainer = Trainer(
        cfg, stages, RandomBatches(cfg), val, strategy, ScriptedFailures(script), ctx, swaps=True
    )
    return trainer, sink


def _run(trainer: Trainer, iterations: int) -> list[Counter[str]]:
    """Host reads per iteration of ``iterations`` steps (setup's reads, if any, in the first)."""
    per_iteration = []
    with warnings.catch_warnings():
        # the random rule's CPU draws loaded into meta parameters: a no-op copy torch warns about
        warnings.filterwarnings("ignore", message=".*copying from a non-meta parameter.*")
        for it in range(iterations):
            with HostReads() as reads:
                if it == 0:
                    trainer.strategy.setup(trainer.state)
                trainer.step()
            per_iteration.append(reads.sites)
    return per_iteration


@pytest.fixture(autouse=True)
def _no_autocast_on_meta(monkeypatch):
    """torch.autocast has no meta device type; bf16 autocast changes dtypes, not where the step syncs."""
    monkeypatch.setattr(
        trainer_module, "autocast_context", lambda device, mode: torch.autocast("cpu", enabled=False)
    )


COVERED = [cls.name for cls in STRATEGY_CLASSES if cls.name not in HOST_BY_DESIGN]


def test_every_registered_strategy_is_covered_or_listed_with_a_reason():
    assert set(COVERED) | set(HOST_BY_DESIGN) == {cls.name for cls in STRATEGY_CLASSES}
    assert len(COVERED) >= 9


@pytest.mark.timeout(120)
@pytest.mark.parametrize("arch", ["LLaMa", "GPT"])
@pytest.mark.parametrize("name", COVERED)
def test_step_on_meta_mixes_no_cpu_tensor_and_syncs_once_per_iteration(name, arch):
    cls = next(c for c in STRATEGY_CLASSES if c.name == name)
    script = dict(SCRIPT)
    if cls.recovers_stage0:
        script[STAGE0_ITERATION] = [0]
    trainer, sink = _trainer(name, arch, script)
    reads = _run(trainer, max(script) + 1)

    trainer_file = "checkfree/sim/trainer.py"
    assert reads == [Counter({trainer_file: 1})] * len(reads), reads  # the documented one, nothing else
    lost = sum(len(v) for v in script.values())
    recoveries = [r for r in sink.records if r["kind"] == "recovery"]
    assert len(recoveries) == (lost if cls.loses_state else 0)  # the recoveries ran, on meta
    assert all(p.device == META for s in trainer.state.stages for p in s.parameters())


@pytest.mark.timeout(120)
def test_recovery_accounting_reads_twice_plus_four_per_tensor_in_failure_iterations_only():
    trainer, sink = _trainer("checkfree_plus", "LLaMa", {1: [2, 3]}, accounting=True)
    reads = _run(trainer, 3)
    floats = sum(v.is_floating_point() for v in trainer.state.stages[2].state_dict().values())
    accounting = "checkfree/telemetry/recovery_accounting.py"
    assert reads[0] == reads[2] == Counter({"checkfree/sim/trainer.py": 1})
    # the probe loss before and after, and 4 sums per floating-point tensor of each of the 2 rebuilt stages
    assert reads[1] == Counter({"checkfree/sim/trainer.py": 1, accounting: 2 + 4 * floats * 2})
    assert sum(r["kind"] == "recovery" for r in sink.records) == 2
