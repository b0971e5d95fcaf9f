"""Setting a run up (checkfree/sim/launch.py): the strategy preflight builds and validates is the one that runs."""

from __future__ import annotations

from checkfree.recovery import registry
from checkfree.recovery.neighbours import CheckFree

from helpers.cli import run_cli, simulate_argv


def test_the_strategy_is_built_once_and_preflights_instance_trains(tmp_path, capsys, monkeypatch):
    built: list[CheckFree] = []
    bound: list[CheckFree] = []

    class Counted(CheckFree):
        def __init__(self, cfg, seed: int = 0):
            super().__init__(cfg, seed)
            built.append(self)

        def bind(self, ctx) -> None:
            super().bind(ctx)
            bound.append(self)

    monkeypatch.setitem(registry.REGISTRY, "checkfree", Counted)
    rc, _, err = run_cli(simulate_argv(tmp_path / "run", setting="checkfree", iterations=2), capsys)
    assert rc == 0, err
    assert len(built) == 1 and bound == built
