"""``simulate``'s and ``swarm run``'s flags, generated from their dataclasses (checkfree.cli_flags), are the flags
users typed before they were generated: name, destination, action, default, type, choices, required, nargs and
metavar of each, against the lists captured from the hand-written parsers; and every field meant to be a flag
has one."""

from __future__ import annotations

import argparse
import dataclasses

import pytest

from checkfree.cli import SIMULATE_NOT_FLAGS, build_parser
from checkfree.cli_flags import Flag, add_field_flags, field_docs

SIMULATE = [
    # (option strings, dest, action, default, type, choices, required, nargs, metavar): captured from the
    # hand-written parser before the flags were generated
    (("--setting",), "setting", "_StoreAction", None, None, None, True, None, None),
    (("--config",), "config", "_StoreAction", None, None, None, True, None, None),
    (("--world-size",), "world_size", "_StoreAction", 1, "int", None, False, None, None),
    (("--rate",), "rate", "_StoreAction", 16.0, "float", None, False, None, None),
    (("--start-iter",), "start_iter", "_StoreAction", 0, "int", None, False, None, None),
    (("--swaps",), "swaps", "_StoreTrueAction", True, None, None, False, 0, None),
    (("--no-swaps",), "swaps", "_StoreFalseAction", True, None, None, False, 0, None),
    (("--run-dir",), "run_dir", "_StoreAction", None, "Path", None, False, None, None),
    (("--runs-root",), "runs_root", "_StoreAction", "PosixPath('runs')", "Path", None, False, None, None),
    (("--max-iterations",), "max_iterations", "_StoreAction", None, "int", None, False, None, None),
    (("--eval-interval",), "eval_interval", "_StoreAction", None, "int", None, False, None, None),
    (("--log-interval",), "log_interval", "_StoreAction", None, "int", None, False, None, None),
    (("--checkpoint-interval",), "checkpoint_interval", "_StoreAction", None, "int", None, False, None, None),
    (("--seed",), "seed", "_StoreAction", None, "seed_arg", None, False, None, None),
    (("--failure-seed",), "failure_seed", "_StoreAction", None, "seed_arg", None, False, None, None),
    (
        ("--failure-probability",),
        "failure_probability",
        "_StoreAction",
        None,
        "float",
        None,
        False,
        None,
        None,
    ),
    (("--failure-schedule",), "failure_schedule", "_StoreAction", None, "Path", None, False, None, None),
    (("--schedule-replicas",), "schedule_replicas", "_StoreAction", None, "int", None, False, None, None),
    (("--fail-stage0",), "fail_stage0", "_StoreTrueAction", False, None, None, False, 0, None),
    (
        ("--grad-norm-mode",),
        "grad_norm_mode",
        "_StoreAction",
        None,
        None,
        ["paper", "clipped"],
        False,
        None,
        None,
    ),
    (("--iteration-seconds",), "iteration_seconds", "_StoreAction", None, "float", None, False, None, None),
    (("--resume-from",), "resume_from", "_StoreAction", None, "Path", None, False, None, None),
    (("--allow-data-change",), "allow_data_change", "_StoreTrueAction", False, None, None, False, 0, None),
    (("--overwrite",), "overwrite", "_StoreTrueAction", False, None, None, False, 0, None),
    (
        ("--max-wall-iterations",),
        "max_wall_iterations",
        "_StoreAction",
        None,
        "positive_int",
        None,
        False,
        None,
        None,
    ),
    (("--stop-at-loss",), "stop_at_loss", "_StoreAction", None, "float", None, False, None, "LOSS"),
    (("--no-final-checkpoint",), "final_checkpoint", "_StoreFalseAction", True, None, None, False, 0, None),
    (("--device",), "device", "_StoreAction", "auto", None, ["auto", "cpu", "cuda"], False, None, None),
    (("--cache-dir",), "cache_dir", "_StoreAction", None, "Path", None, False, None, None),
    (("--set",), "set", "_AppendAction", [], None, None, False, None, "KEY=VALUE"),
    (("--no-progress",), "progress", "_StoreFalseAction", True, None, None, False, 0, None),
    (("--max-train-tokens",), "max_train_tokens", "_StoreAction", None, "int", None, False, None, None),
    (("--peak-tflops",), "peak_tflops", "_StoreAction", None, "float", None, False, None, None),
    (("--compile",), "compile", "_StoreTrueAction", False, None, None, False, 0, None),
    (
        ("--compile-mode",),
        "compile_mode",
        "_StoreAction",
        "default",
        None,
        ["default", "reduce-overhead"],
        False,
        None,
        None,
    ),
    (("--fused-loss",), "fused_loss", "_StoreAction", "auto", None, ["auto", "on", "off"], False, None, None),
    (
        ("--activation-checkpointing",),
        "activation_checkpointing",
        "_StoreTrueAction",
        False,
        None,
        None,
        False,
        0,
        None,
    ),
    (("--tensorboard",), "tensorboard", "_StoreTrueAction", False, None, None, False, 0, None),
    (("--autocast",), "autocast", "_StoreAction", "auto", None, ["auto", "bf16", "off"], False, None, None),
    (
        ("--no-recovery-accounting",),
        "recovery_accounting",
        "_StoreFalseAction",
        True,
        None,
        None,
        False,
        0,
        None,
    ),
    (("--dry-run",), "dry_run", "_StoreTrueAction", False, None, None, False, 0, None),
]
SWARM_RUN = [
    (
        ("--setting",),
        "setting",
        "_StoreAction",
        None,
        None,
        ["no_failure", "checkpoint", "ours", "ours-plus", "checkfree", "checkfree_plus", "ladder"],
        False,
        None,
        None,
    ),
    (("--rate",), "rate", "_StoreAction", "16", None, None, False, None, None),
    (("--config",), "config", "_StoreAction", "swarm_paper.json", None, None, False, None, None),
    (("--schedule",), "schedule", "_StoreAction", None, "Path", None, False, None, None),
    (("--no-schedule",), "no_schedule", "_StoreTrueAction", False, None, None, False, 0, None),
    (("--recovery-kills",), "recovery_kills", "_StoreAction", None, "Path", None, False, None, "FILE"),
    (("--start",), "start", "_StoreAction", 0, "int", None, False, None, None),
    (("--end",), "end", "_StoreAction", None, "int", None, False, None, None),
    (("--iterations",), "iterations", "_StoreAction", 500, "int", None, False, None, None),
    (("--run-dir",), "run_dir", "_StoreAction", None, "Path", None, False, None, None),
    (("--overwrite",), "overwrite", "_StoreTrueAction", False, None, None, False, 0, None),
    (("--bind-host",), "bind_host", "_StoreAction", "127.0.0.1", None, None, False, None, None),
    (("--advertise-host",), "advertise_host", "_StoreAction", None, None, None, False, None, None),
    (("--port",), "port", "_StoreAction", 0, "int", None, False, None, None),
    (("--bootstrap",), "bootstrap", "_StoreAction", None, None, None, False, None, None),
    (("--join-token",), "join_token", "_StoreAction", None, "Path", None, False, None, None),
    (("--machines",), "machines", "_StoreAction", None, None, None, False, None, "START:END,..."),
    (("--insecure",), "insecure", "_StoreTrueAction", False, None, None, False, 0, None),
    (("--time-scale",), "time_scale", "_StoreAction", None, "float", None, False, None, None),
    (("--checkpoint-every",), "checkpoint_every", "_StoreAction", None, "int", None, False, None, "K"),
    (("--checkpoint-interval",), "checkpoint_interval", "_StoreAction", None, "int", None, False, None, "K"),
    (("--snapshot-every",), "snapshot_every", "_StoreAction", None, "int", None, False, None, "N"),
    (("--replicas",), "replicas", "_StoreAction", None, "int", None, False, None, None),
    (("--data",), "data", "_StoreAction", None, None, ["corpus", "synthetic"], False, None, None),
    (("--cache-dir",), "cache_dir", "_StoreAction", None, "Path", None, False, None, None),
    (("--set",), "set", "_AppendAction", [], None, None, False, None, "KEY=VALUE"),
    (("--device",), "device", "_StoreAction", "auto", None, ["auto", "cpu", "cuda"], False, None, None),
    (("--gpus",), "gpus", "_StoreAction", None, None, None, False, None, None),
    (("--dry-run",), "dry_run", "_StoreTrueAction", False, None, None, False, 0, None),
    (("--supervisor-grace",), "supervisor_grace", "_StoreAction", None, "float", None, False, None, "S"),
    (("--resume",), "resume", "_StoreAction", None, "Path", None, False, None, "RUN_DIR"),
]


def _subparser(*names: str) -> argparse.ArgumentParser:
    p = build_parser()
    for n in names:
        act = next(a for a in p._actions if isinstance(a, argparse._SubParsersAction))
        p = act.choices[n]
    return p


def _rows(p: argparse.ArgumentParser) -> dict[tuple[str, ...], tuple]:
    out = {}
    for a in p._actions:
        if isinstance(a, argparse._HelpAction):
            continue
        t = None if a.type is None else getattr(a.type, "__name__", repr(a.type))
        d = a.default
        if isinstance(d, list | tuple):
            d = list(d)
        elif d is not None and not isinstance(d, int | float | str | bool):
            d = repr(d)
        choices = list(a.choices) if a.choices else None
        row = (
            tuple(a.option_strings),
            a.dest,
            type(a).__name__,
            d,
            t,
            choices,
            a.required,
            a.nargs,
            a.metavar,
        )
        out[row[0]] = row
    return out


@pytest.mark.parametrize(("names", "frozen"), [(("simulate",), SIMULATE), (("swarm", "run"), SWARM_RUN)])
def test_flags_as_before(names, frozen):
    rows = _rows(_subparser(*names))
    assert sorted(rows) == sorted(r[0] for r in frozen)
    for row in frozen:
        assert rows[row[0]] == row, row[0]


def test_every_flag_has_help():
    for names in (("simulate",), ("swarm", "run")):
        for a in _subparser(*names)._actions:
            assert a.help, a.option_strings


def test_every_simulate_option_is_a_flag():
    """A field added to SimulateOptions gets a flag (or is named in SIMULATE_NOT_FLAGS)."""
    from checkfree.sim.options import SimulateOptions

    dests = {a.dest for a in _subparser("simulate")._actions}
    missing = [
        f.name for f in dataclasses.fields(SimulateOptions) if f.name not in dests | set(SIMULATE_NOT_FLAGS)
    ]
    assert missing == []


def test_every_swarm_field_is_a_flag_or_set_only():
    """A field added to SwarmConfig or RunOptions is a ``swarm run`` flag, or (SwarmConfig) named in SET_ONLY."""
    from checkfree.swarm.cli import SET_ONLY, config_flags
    from checkfree.swarm.config import SwarmConfig
    from checkfree.swarm.options import RunOptions

    dests = {a.dest for a in _subparser("swarm", "run")._actions}
    config = {f.name for f in dataclasses.fields(SwarmConfig)}
    assert set(config_flags()) | set(SET_ONLY) == config
    assert not set(config_flags()) & set(SET_ONLY)
    assert set(config_flags()) <= dests
    assert {f.name for f in dataclasses.fields(RunOptions)} <= dests


def test_defaults_are_the_fields():
    """No default is written twice: each flag's default is its field's (None for a config override)."""
    from checkfree.sim.options import SimulateOptions
    from checkfree.swarm.cli import config_flags
    from checkfree.swarm.options import RunOptions

    for cls, names in ((SimulateOptions, ("simulate",)), (RunOptions, ("swarm", "run"))):
        defaults = vars(
            _subparser(*names).parse_args([] if names[0] == "swarm" else ["--setting", "x", "--config", "y"])
        )
        for f in dataclasses.fields(cls):
            if f.name in defaults and f.default is not dataclasses.MISSING:
                assert defaults[f.name] == f.default, f.name
    run = vars(_subparser("swarm", "run").parse_args([]))
    assert all(run[name] is None for name in config_flags())


def test_swaps_spellings_exclude_each_other(capsys):
    p = _subparser("simulate")
    base = ["--setting", "x", "--config", "y"]
    assert p.parse_args(base).swaps is True
    assert p.parse_args([*base, "--no-swaps"]).swaps is False
    with pytest.raises(SystemExit):
        p.parse_args([*base, "--swaps", "--no-swaps"])


def test_old_name_reads_as_new():
    from checkfree.swarm.cli import _overrides

    args = _subparser("swarm", "run").parse_args(["--checkpoint-interval", "7", "--time-scale", "0"])
    notes: list[str] = []
    out = _overrides(args, notes)
    assert out["checkpoint_every"] == 7 and out["time_scale"] == 0.0 and len(notes) == 1


@dataclasses.dataclass
class _Example:
    count: int = 3
    """How many, in ``units`` (50%)."""
    ratio: float | None = None
    """A ratio."""
    on: bool = True
    """Something on."""
    off: bool = False
    name: str = dataclasses.field(default="a")
    """A name."""
    needed: str = ""


def test_generator():
    p = argparse.ArgumentParser()
    with pytest.raises(ValueError, match="no docstring"):
        add_field_flags(p, _Example, ["off"])
    with pytest.raises(ValueError, match="no field"):
        add_field_flags(p, _Example, ["other"])
    p = argparse.ArgumentParser()
    add_field_flags(p, _Example, ["count", "ratio", "on", "name"], {"name": Flag(choices=("a", "b"))})
    assert vars(p.parse_args([])) == {"count": 3, "ratio": None, "on": True, "name": "a"}
    assert vars(p.parse_args(["--count", "4", "--ratio", "0.5", "--no-on", "--name", "b"])) == {
        "count": 4,
        "ratio": 0.5,
        "on": False,
        "name": "b",
    }
    with pytest.raises(SystemExit):
        p.parse_args(["--name", "c"])
    assert field_docs(_Example)["count"] == "How many, in units (50%%)."
    assert "50%" in p.format_help()
    p = argparse.ArgumentParser()
    add_field_flags(p, _Example, ["count"], overrides=True)
    assert p.parse_args([]).count is None
