"""``python -m checkfree swarm run | table``: the decentralized throughput experiment (docs/paper.md §8).

    python -m checkfree swarm run --setting ours --rate 16 --config configs/swarm_paper.json
    python -m checkfree swarm run --setting checkpoint --rate 16 --config configs/swarm_tiny.json \\
        --schedule failure_p_configs/swarm_tiny_16.json --iterations 100 --run-dir runs/sw
    python -m checkfree swarm table runs/sw-*          # the summary table of several runs
    python -m checkfree swarm run --setting ours --config configs/swarm_tiny.json --device cuda --gpus 0,1
    python -m checkfree swarm run --resume runs/sw      # the run whose supervisor died, from its journal
    python -m checkfree swarm revoke runs/sw 4          # shut machine 4 (its join token) out of the running swarm

communication/run_throughput.sh START END SETTING RATE [options] is a thin launcher over ``swarm run``.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from checkfree import PACKAGE_LOG, jsonio
from checkfree.cli_flags import Flag
from checkfree.rundir import apply_run_dir, check_directory_path, holds_something, plan_run_dir

if TYPE_CHECKING:
    from checkfree.failures.traces import DowntimeSchedule
    from checkfree.swarm.config import SwarmConfig

log = logging.getLogger(__name__)


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "swarm",
        help="decentralized swarm: real node processes over an emulated WAN",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    cmds = p.add_subparsers(dest="swarm_command", required=True)
    r = cmds.add_parser(
        "run",
        help="start the swarm's nodes on this machine and train (docs/paper.md §8)",
        description="Start nodes START..END-1 (one stage replica each) plus, for checkpoint, the "
        "storage node; replay the crash schedule; write runs/<name>/throughput.json.",
    )
    _add_run_flags(r)
    r.set_defaults(func=cmd_run)
    global _RUN_PARSER
    _RUN_PARSER = r
    v = cmds.add_parser(
        "revoke",
        help="shut one machine out of a running swarm: its keys are refused everywhere, its nodes replaced",
        description="Ask the supervisor of the run in RUN_DIR to revoke machine START (the one whose join token is "
        "RUN_DIR/join_tokens/machine<START>.json): every key of its nodes and launcher is refused from now on, "
        "and its slots move to the supervisor's machine, their nodes replaced as after an eviction "
        "(checkfree/swarm/supervisor/machines.py).",
    )
    v.add_argument("run_dir", type=Path, help="the run directory of the running supervisor")
    v.add_argument("machine", type=int, metavar="START", help="the machine: the first node id it hosts")
    v.set_defaults(func=cmd_revoke)
    t = cmds.add_parser("table", help="print the summary table of finished runs")
    t.add_argument("run_dirs", nargs="+", type=Path, help="run directories holding throughput.json")
    t.set_defaults(func=cmd_table)


def config_flags() -> dict[str, Flag]:
    """The fields of checkfree.swarm.config.SwarmConfig that ``swarm run`` overrides with a flag of their own (help,
    type from the field, checkfree.cli_flags), with what each flag has beyond its field; :data:`SET_ONLY` are the
    others."""
    from checkfree.swarm.config import DATA_SOURCES

    return {
        "time_scale": Flag(),
        "checkpoint_every": Flag(metavar="K"),
        "snapshot_every": Flag(metavar="N"),
        "replicas": Flag(),
        "data": Flag(choices=DATA_SOURCES),
        "supervisor_grace": Flag(metavar="S"),
    }


SET_ONLY = tuple(
    "model_config microbatches in_flight locations locations_file storage_location crash_point heartbeat_interval "
    "peer_timeout microbatch_timeout iteration_timeout recovery_timeout request_timeout max_attempts fused_loss seed "
    "eval_interval slowdown".split()
)
"""SwarmConfig fields that ``swarm run`` overrides only through ``--set KEY=VALUE``."""


def run_flags() -> dict[str, Flag]:
    """What ``swarm run``'s flags of checkfree.swarm.options.RunOptions have beyond their fields."""
    from checkfree.swarm.config import SETTINGS
    from checkfree.swarm.devices import DEVICE_CHOICES

    return {
        "setting": Flag(choices=SETTINGS),
        "recovery_kills": Flag(metavar="FILE"),
        "machines": Flag(metavar="START:END,..."),
        "device": Flag(choices=DEVICE_CHOICES),
        "resume": Flag(metavar="RUN_DIR"),
    }


def _add_run_flags(r: argparse.ArgumentParser) -> None:
    """``swarm run``'s flags: one per field of RunOptions (its default), one per field of :func:`config_flags`
    (default None: the config file's value), each old name of checkfree.swarm.config.RENAMED among those (read as
    its new one, :func:`_overrides`), and ``--set`` (checkfree.cli_flags)."""
    from checkfree.cli_flags import add_field_flags, flag_name
    from checkfree.swarm.config import RENAMED, SwarmConfig
    from checkfree.swarm.options import RunOptions

    add_field_flags(r, RunOptions, [f.name for f in dataclasses.fields(RunOptions)], run_flags())
    overriding = config_flags()
    actions = {a.dest: a for a in add_field_flags(r, SwarmConfig, overriding, overriding, overrides=True)}
    for old, new in RENAMED.items():
        if new in actions:
            r.add_argument(
                flag_name(old),
                type=actions[new].type,
                metavar=actions[new].metavar,
                help=f"old name of {flag_name(new)}",
            )
    r.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override any swarm config key, e.g. --set in_flight=3 (JSON value)",
    )


_RUN_PARSER: argparse.ArgumentParser | None = None
"""``swarm run``'s parser (its defaults tell which options were given beside ``--resume``)."""
PATH_OPTIONS = ("schedule", "recovery_kills", "run_dir", "cache_dir", "join_token", "resume")
"""``swarm run`` options that are paths (the journal keeps them as absolute paths)."""


def _journaled_options(
    args: argparse.Namespace, schedule_path: str | None, cfg: SwarmConfig
) -> dict[str, Any]:
    """The options ``swarm run`` was started with, as the journal keeps them (paths absolute, the schedule as
    resolved, with its SHA-256: a resumed run replays the same schedule; the config and model config files with
    theirs and the resolved config's: a resumed run trains on the same, checkfree.swarm.supervisor.journal)."""
    import hashlib

    from checkfree.config import resolve_config_path
    from checkfree.swarm.supervisor.journal import started_files

    out = {k: v for k, v in vars(args).items() if k not in ("func", "command", "swarm_command")}
    for key in PATH_OPTIONS:
        if out.get(key) is not None:
            out[key] = str(Path(out[key]).resolve())
    if schedule_path is not None:
        out["schedule"] = str(Path(schedule_path).resolve())
        out["schedule_sha256"] = hashlib.sha256(Path(schedule_path).read_bytes()).hexdigest()
    if args.recovery_kills is not None:
        out["recovery_kills_sha256"] = hashlib.sha256(Path(args.recovery_kills).read_bytes()).hexdigest()
    model_file = resolve_config_path(cfg.model_config)
    return out | started_files(resolve_config_path(args.config), model_file, cfg.to_json())


def _overrides(args: argparse.Namespace, notes: list[str]) -> dict[str, Any]:
    """The config keys the options override; ``notes`` gets a sentence for an option's old name.

    Raises:
        ValueError: --checkpoint-every and its old name --checkpoint-interval disagree.
    """
    every = args.checkpoint_every
    if args.checkpoint_interval is not None:
        if every is not None and every != args.checkpoint_interval:
            raise ValueError(
                f"--checkpoint-every {every} and --checkpoint-interval {args.checkpoint_interval} disagree; "
                "expected only --checkpoint-every (--checkpoint-interval is its old name)."
            )
        every = args.checkpoint_interval
        notes.append(
            f"--checkpoint-interval is now called --checkpoint-every; read as --checkpoint-every {every}."
        )
    out: dict[str, Any] = {name: getattr(args, name) for name in config_flags()}
    out["checkpoint_every"] = every
    from checkfree.config import parse_sets

    out.update(parse_sets(args.set))
    return out


def _schedule(args: argparse.Namespace) -> tuple[dict[int, list[int]] | DowntimeSchedule, str | None]:
    from checkfree.failures.schedules import load_swarm_schedule

    if args.no_schedule:
        return {}, None
    path = args.schedule or Path("failure_p_configs") / f"{args.rate}.json"
    if not path.is_absolute() and not path.exists():
        path = Path(__file__).resolve().parents[2] / path
    return load_swarm_schedule(path), str(path)


def _vocab_size(cfg, cache_dir: Path | None) -> int:
    """The model vocabulary: the corpus tokenizer's (built once here, so nodes only map the cache)."""
    if cfg.data == "synthetic":
        return cfg.model.vocab_size
    from checkfree.data.corpus import DataSpec, prepare_corpus

    m = cfg.model
    spec = DataSpec.from_config(m, max_train_tokens=m.max_train_tokens, cache_dir=cache_dir)
    corpus = prepare_corpus(spec)
    log.info("data: %s", corpus.describe())
    return corpus.vocab_size


def _check_run(
    args: argparse.Namespace,
    cfg,
    schedule: dict[int, list[int]] | DowntimeSchedule,
    schedule_path: str | None,
) -> int:
    """Everything ``swarm run`` can check before it starts or writes anything; returns END.

    Raises:
        ValueError: iterations, node range or schedule do not fit the swarm (one sentence with the way out).
    """
    from checkfree.swarm.config import machines_option, node_range

    if args.iterations < 1:
        raise ValueError(f"--iterations is {args.iterations}; expected a positive number of iterations.")
    end = node_range(cfg.n_nodes, args.start, args.end, args.config)
    if not isinstance(schedule, dict):  # down intervals: their stages × replicas must be the swarm's
        from checkfree.swarm.supervisor.outages import check_schedule

        check_schedule(schedule, cfg, schedule_path, f"the swarm of {args.config}")
    bad = sorted(n for n in schedule if n >= cfg.n_nodes) if isinstance(schedule, dict) else []
    if bad:
        raise ValueError(
            f"the schedule {schedule_path} names nodes {bad[0]}..{bad[-1]}, but the swarm of {args.config} has "
            f"nodes 0..{cfg.n_nodes - 1}; pass --schedule with a schedule for this topology (python "
            f"failure_generator.py --rate {args.rate} --stages {cfg.n_stages} --replicas {cfg.replicas} "
            "--out FILE) or --no-schedule."
        )
    if not 0 <= args.port <= 65535:
        raise ValueError(f"--port is {args.port}; expected a TCP port in 0..65535 (0 = any free port).")
    if args.cache_dir is not None:
        check_directory_path(args.cache_dir, "--cache-dir")
    if args.machines is not None and (args.insecure or args.join_token or args.bootstrap):
        raise ValueError(
            "--machines splits the swarm into machines with their own join tokens; it is for the supervisor's "
            "machine of an authenticated swarm (expected no --insecure, --join-token or --bootstrap with it)."
        )
    if not (args.insecure or args.join_token or args.bootstrap):
        from checkfree.swarm.wire.auth import MachineLayout

        MachineLayout(
            cfg.n_nodes,
            cfg.first_replacement_id,
            (args.start, end),
            machines_option(args.machines, cfg.n_nodes),
        )
    return end


def _token_range(args: argparse.Namespace) -> None:
    """A launcher's nodes are its join token's machine's: START and END default to the token's, and given ones
    must be the same.

    Raises:
        AuthError: the token cannot be read (one sentence). ValueError: START or END is another machine's.
    """
    from checkfree.swarm.wire.auth import read_token

    keys, _ = read_token(args.join_token)  # a missing or damaged token: one sentence, exit 2, nothing written
    machine = keys.machine
    if (args.start, args.end) == (0, None):
        args.start, args.end = machine.start, machine.end
    elif (args.start, args.end if args.end is not None else -1) != (machine.start, machine.end):
        raise ValueError(
            f"the join token {args.join_token} is for {machine.describe()}, not START {args.start} END "
            f"{args.end}; expected START {machine.start} END {machine.end}, or neither (the token's)."
        )


def _memory(args: argparse.Namespace, cfg, policy, end: int, devices):
    """This machine's nodes START..END−1, its supervisor (or launcher), forkserver and, under ``checkpoint``, the
    storage node, against its GPUs and host RAM (checkfree.memory.machine_memory), and what would make them fit:
    fewer microbatches in flight, or fewer nodes here (the rest on other machines). Builds nothing.

    Returns:
        (checkfree.memory.MachineMemory, advice: "" when it fits or when neither helps).
    """
    from checkfree import memory as M
    from checkfree.swarm.storage import KEEP_VERSIONS

    model = cfg.model
    vocab = model.vocab_size if cfg.data == "synthetic" else M.model_vocab_size(model)
    hosts_supervisor = not (args.bootstrap or args.join_token)
    processes = [("supervisor" if hosts_supervisor else "launcher", M.PROCESS_BYTES)]
    processes.append(("forkserver the nodes start from", M.PROCESS_BYTES))
    if hosts_supervisor and policy.rollback_on_stage_loss:  # checkpoint: the storage node runs here
        processes.append(
            (
                f"storage node ({KEEP_VERSIONS} snapshots of every stage)",
                M.storage_node_bytes(model, vocab, KEEP_VERSIONS),
            )
        )

    def machine(in_flight: int, last: int) -> M.MachineMemory:
        nodes = [(n, cfg.stage_of(n), devices.initial(n)) for n in range(args.start, last)]
        return M.machine_memory(
            model, vocab, nodes, in_flight, cfg.replicas, policy.keeps_stage0_copy, processes
        )

    here = machine(cfg.in_flight, end)
    if here.fits:
        return here, ""
    ways = []
    fewer = _largest(1, cfg.in_flight - 1, lambda k: machine(k, end).fits)
    if fewer is not None:
        ways.append(f"--set in_flight={fewer}")
    last = _largest(args.start + 1, end - 1, lambda e: machine(cfg.in_flight, e).fits)
    if last is not None:
        ways.append(f"--end {last} here (nodes {last}..{end - 1} on other machines, docs/swarm.md)")
    return here, ", or with ".join(ways)


def _largest(low: int, high: int, fits: Callable[[int], bool]) -> int | None:
    """The largest n in low..high with ``fits(n)``, for a ``fits`` that holds for every n below one that fits
    (memory grows with the nodes and the microbatches in flight): a bisection, log2(high − low) calls, so a swarm
    of thousands of nodes is planned in seconds (None: none fits)."""
    best = None
    while low <= high:
        mid = (low + high) // 2
        if fits(mid):
            best, low = mid, mid + 1
        else:
            high = mid - 1
    return best


def _default_run_dir(args: argparse.Namespace) -> Path:
    base = Path("runs") / f"swarm-{args.setting}-{args.rate}"
    candidate, n = base, 1
    while not args.overwrite and holds_something(candidate):
        n += 1
        candidate = base.with_name(f"{base.name}-{n}")
    return candidate


@dataclass
class _RunPlan:
    """What ``swarm run`` checked and resolved before it writes or starts anything (:func:`_plan_run`)."""

    cfg: SwarmConfig
    schedule: dict[int, list[int]] | DowntimeSchedule
    schedule_path: str | None
    slowdowns: Any
    """The schedule's slowdown events (checkfree.swarm.slowdown)."""
    end: int
    """One past the last node id this machine starts."""
    recovery_kills: Any
    devices: Any
    """This machine's devices (checkfree.swarm.devices)."""
    memory: Any
    """checkfree.memory.MachineMemory of this machine's processes."""
    advice: str
    run_dir: Path
    plan: Any
    """How the run directory is made (checkfree.rundir.plan_run_dir)."""


def cmd_run(args: argparse.Namespace) -> int:
    """``swarm run``: resume a run (``--resume``), print its plan (``--dry-run``), host nodes for another machine's
    supervisor (``--bootstrap``, ``--join-token``) or supervise a run from here.

    Raises:
        ValueError: an option, the config, the schedule or this machine's memory does not fit (one sentence).
    """
    if args.resume is not None:
        return _cmd_resume(args)
    run = _plan_run(args)
    if args.dry_run:
        return _dry_run(args, run)
    if args.bootstrap and args.join_token is None and not args.insecure:
        raise ValueError(
            "--bootstrap joins an authenticated swarm only with --join-token FILE (or --insecure)."
        )
    if args.bootstrap or args.join_token:
        return _launch(args, run)
    return _run_supervisor(args, run)


def _plan_run(args: argparse.Namespace) -> _RunPlan:
    """Load and check everything a fresh ``swarm run`` needs; writes and starts nothing.

    Raises:
        ValueError: as :func:`cmd_run`.
    """
    from checkfree.loss import resolve_loss_path
    from checkfree.swarm.config import load_swarm_config
    from checkfree.swarm.devices import resolve_devices
    from checkfree.swarm.policies import make_policy
    from checkfree.swarm.slowdown import load_slowdowns

    if args.setting is None:
        raise ValueError(
            "swarm run needs --setting SETTING; expected one of the settings --help lists, or --resume."
        )
    notes: list[str] = []
    cfg = load_swarm_config(args.config, _overrides(args, notes), notes)
    for note in notes:
        log.warning("%s", note)
    policy = make_policy(args.setting)
    if policy.swaps and cfg.n_stages < 4:
        raise ValueError(
            f"ours-plus needs at least 4 transformer stages for its swaps; the config has {cfg.n_stages}."
        )
    schedule, schedule_path = _schedule(args)
    if args.join_token is not None:
        _token_range(args)
    end = _check_run(args, cfg, schedule, schedule_path)
    slowdowns = load_slowdowns(schedule_path, cfg.n_nodes)
    recovery_kills = None
    if args.recovery_kills is not None:
        from checkfree.swarm.supervisor.recovery_kills import load_recovery_kills

        recovery_kills = load_recovery_kills(args.recovery_kills)
    devices = resolve_devices(args.device, args.gpus, args.start)  # before anything is written or started
    resolve_loss_path(
        cfg.fused_loss, devices.kind, option="fused_loss"
    )  # "on" without CUDA or Liger: refused
    memory, advice = _memory(args, cfg, policy, end, devices)
    if not memory.fits and not args.dry_run:
        raise ValueError(memory.sentence(advice))
    run_dir = args.run_dir or _default_run_dir(args)
    plan = plan_run_dir(run_dir, overwrite=args.overwrite)
    return _RunPlan(
        cfg, schedule, schedule_path, slowdowns, end, recovery_kills, devices, memory, advice, run_dir, plan
    )


def _dry_run(args: argparse.Namespace, run: _RunPlan) -> int:
    """``swarm run --dry-run``: print the topology, the node -> device map, the node commands and the memory
    plan; nothing is written or started."""
    from checkfree.swarm.hosts import LocalHost
    from checkfree.swarm.wire.auth import SwarmKeys

    cfg, end, devices, memory = run.cfg, run.end, run.devices, run.memory
    keys = None if args.insecure else SwarmKeys.new()  # only names the key files; nothing is written
    host = LocalHost(
        run.run_dir,
        "tcp://BOOTSTRAP:PORT",
        args.bind_host,
        args.advertise_host,
        args.cache_dir,
        keys=keys,
        devices=devices,
    )
    print(
        f"swarm: {cfg.n_stages + 1} stages x {cfg.replicas} replicas = {cfg.n_nodes} nodes, "
        f"{cfg.mb_count} microbatches/pipeline, {cfg.in_flight} in flight, time_scale {cfg.time_scale}, "
        f"setting {args.setting}, schedule {run.schedule_path}, run dir {run.run_dir}"
    )
    rule = " (replacements: the GPU with the fewest live nodes)" if devices.kind == "cuda" else ""
    print(f"devices: {devices.describe()}{rule}")
    for n in range(args.start, end):
        print(f"node {n} (stage {cfg.stage_of(n)}) -> {host.device_for(n, cfg.stage_of(n), False)}")
    for n in range(args.start, end):
        stage = cfg.stage_of(n)
        print(" ".join(host.command(n, stage, cfg.location_of(n), False, host.device_for(n, stage, False))))
    for line in memory.lines():
        print(line)
    if not memory.fits:
        advice = run.advice
        print(f"memory: does not fit{f'; it would with {advice}' if advice else ''} (a real run is refused)")
    return 0


def _launch(args: argparse.Namespace, run: _RunPlan) -> int:
    """``swarm run --bootstrap`` / ``--join-token``: host nodes START..END-1 for another machine's supervisor
    (checkfree.swarm.launcher)."""
    from checkfree.swarm.launcher import run_launcher

    apply_run_dir(run.plan)
    return run_launcher(
        args.bootstrap,
        args.start,
        run.end,
        run.run_dir,
        args.bind_host,
        args.advertise_host,
        args.cache_dir,
        token=args.join_token,
        devices=run.devices,
        supervisor_grace=run.cfg.supervisor_grace,
    )


def _run_supervisor(args: argparse.Namespace, run: _RunPlan) -> int:
    """``swarm run``: supervise the run from this machine, which hosts nodes START..END-1.

    Raises:
        ValueError: the supervisor cannot listen on --bind-host and --port (one sentence).
    """
    import zmq

    from checkfree.swarm.config import machines_option
    from checkfree.swarm.supervisor.supervisor import Supervisor

    cfg, end, devices, run_dir = run.cfg, run.end, run.devices, run.run_dir
    vocab_size = _vocab_size(cfg, args.cache_dir)
    try:  # binds the bootstrap socket; nothing is written yet
        sup = Supervisor(
            cfg,
            args.setting,
            run.schedule,
            args.iterations,
            run_dir,
            vocab_size,
            start=args.start,
            end=end,
            bind_host=args.bind_host,
            port=args.port,
            advertise_host=args.advertise_host,
            cache_dir=args.cache_dir,
            insecure=args.insecure,
            recovery_kills=run.recovery_kills,
            schedule_path=run.schedule_path,
            options=_journaled_options(args, run.schedule_path, cfg),
            machines=machines_option(args.machines),
            devices=devices,  # this machine's nodes: --device per node (checkfree.swarm.devices)
            slowdowns=run.slowdowns,
        )
    except zmq.ZMQError as exc:
        raise ValueError(
            f"the supervisor cannot listen on --bind-host {args.bind_host} --port {args.port} ({exc}); "
            "expected a local interface and a free port (0 = any free port)."
        ) from None
    apply_run_dir(run.plan)
    _log_to(run_dir)
    (run_dir / "command.txt").write_text(" ".join(sys.argv) + "\n")
    log.info("supervisor: bootstrap address %s (pid %d); logs in %s", sup.address, os.getpid(), run_dir)
    log.info("supervisor: nodes %d..%d compute on %s", args.start, end - 1, devices.describe())
    layout = sup.state.keys.layout if sup.state.keys is not None else None
    for start, path in sup.token_paths().items():
        assert layout is not None
        log.info("supervisor: join token of %s: %s", layout.by_start(start).describe(), path)
    sup.write_config()
    return _supervise(sup, run_dir)


def _log_to(run_dir: Path) -> None:
    """The supervisor's log lines go to ``run_dir/supervisor.log`` too (appended)."""
    handler = logging.FileHandler(run_dir / "supervisor.log")
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    PACKAGE_LOG.addHandler(handler)


def _supervise(sup, run_dir: Path) -> int:
    """Run the supervisor; print the summary (exit 0), or log why it failed (exit 1)."""
    from checkfree.swarm.supervisor.summary_table import summary_table
    from checkfree.swarm.supervisor.supervisor import SwarmError

    try:
        results = sup.run()
    except SwarmError as exc:
        log.error("swarm run failed: %s (logs and throughput.json, status failed, in %s)", exc, run_dir)
        return 1
    print(summary_table([results]))
    print(
        f"bytes sent by message type: {jsonio.dumps({k: v for k, v in results['bytes_sent_by_type'].items() if v})}"
    )
    print(f"results: {run_dir / 'throughput.json'}")
    return 0


def _cmd_resume(args: argparse.Namespace) -> int:
    """``swarm run --resume RUN_DIR``: a supervisor that goes on with the run in RUN_DIR from its journal
    (checkfree.swarm.supervisor.journal, .adoption), every option as the run was started.

    Raises:
        ValueError: another option was given too, the journal is missing or damaged, the run ended, its supervisor
            still runs, the schedule changed, or the address cannot be bound again (one sentence each).
    """
    import hashlib

    from checkfree.swarm.forkserver import warm_forkserver
    from checkfree.swarm.process_identity import running
    from checkfree.swarm.supervisor.journal import (
        check_options,
        check_started_files,
        keys_of,
        read_journal,
    )

    assert _RUN_PARSER is not None
    defaults = vars(_RUN_PARSER.parse_args([]))
    given = [k for k, v in vars(args).items() if k in defaults and k != "resume" and v != defaults[k]]
    if given:
        flag = "--" + given[0].replace("_", "-")
        raise ValueError(
            f"--resume {args.resume} reads every other option from the run's journal, but {flag} was given too; "
            "expected --resume RUN_DIR alone."
        )
    run_dir = Path(args.resume)
    data = read_journal(run_dir)  # private, bounded and of the journal's schema
    check_options(data["options"], _RUN_PARSER, str(run_dir / "journal.json"))
    check_started_files(data, run_dir)  # the config and model files the run started with
    if data["status"] != "running":
        raise ValueError(
            f"the run in {run_dir} ended ({data['status']}) and its nodes were stopped with it; expected a run whose "
            "supervisor died (SIGKILL, a lost machine) while its nodes wait for a resumed one."
        )
    old = data["supervisor"]
    if old.get("started") is not None and running(old["pid"], old["started"]):
        raise ValueError(
            f"the supervisor of the run in {run_dir} still runs (pid {old['pid']}); expected a run whose "
            "supervisor died."
        )
    alive = [n for n, (pid, started) in data["processes"].items() if running(pid, started)]
    if not alive and not data["state"]["roster"]["launchers"]:
        grace = data["state"]["config"].get("supervisor_grace")
        raise ValueError(
            f"no node of the run in {run_dir} is alive (a node waits supervisor_grace = {grace} s for a resumed "
            "supervisor): every stage has no live replica and no snapshot to restore it from, so the run cannot "
            "be resumed; its results so far are in its journal.json."
        )
    warm_forkserver()  # its imports (torch: seconds) beside this process's, which begin here
    import zmq

    from checkfree.loss import resolve_loss_path
    from checkfree.swarm.config import machines_option, node_range, swarm_config_from_dict
    from checkfree.swarm.devices import resolve_devices
    from checkfree.swarm.slowdown import load_slowdowns
    from checkfree.swarm.supervisor.supervisor import Supervisor

    opts = argparse.Namespace(**(defaults | data["options"]))
    for key in PATH_OPTIONS:
        if getattr(opts, key, None) is not None:
            setattr(opts, key, Path(getattr(opts, key)))
    cfg = swarm_config_from_dict(data["state"]["config"], f"the journal of {run_dir}")
    schedule, schedule_path = _schedule(opts)
    if schedule_path is not None and "schedule_sha256" in data["options"]:
        if hashlib.sha256(Path(schedule_path).read_bytes()).hexdigest() != data["options"]["schedule_sha256"]:
            raise ValueError(
                f"the schedule {schedule_path} changed since the run in {run_dir} started; expected the file it "
                "started with."
            )
    recovery_kills = None
    if opts.recovery_kills is not None:
        from checkfree.swarm.supervisor.recovery_kills import load_recovery_kills

        recovery_kills = load_recovery_kills(opts.recovery_kills)
    end = node_range(cfg.n_nodes, opts.start, opts.end, opts.config)
    devices = resolve_devices(opts.device, opts.gpus, opts.start)
    resolve_loss_path(cfg.fused_loss, devices.kind, option="fused_loss")
    try:  # the same address as before: every node and launcher dials it
        sup = Supervisor(
            cfg,
            data["state"]["setting"],
            schedule,
            opts.iterations,
            run_dir,
            data["state"]["vocab_size"],
            start=opts.start,
            end=end,
            bind_host=opts.bind_host,
            port=data["port"],
            advertise_host=opts.advertise_host,
            cache_dir=opts.cache_dir,
            insecure=opts.insecure,
            recovery_kills=recovery_kills,
            schedule_path=schedule_path,
            keys=keys_of(data),
            options=data["options"],
            machines=machines_option(getattr(opts, "machines", None)),
            devices=devices,
            slowdowns=load_slowdowns(schedule_path, cfg.n_nodes),
        )
    except zmq.ZMQError as exc:
        raise ValueError(
            f"the resumed supervisor cannot listen on {data['address']} again ({exc}); expected that port free "
            "(another process holds it: is a supervisor of this run still alive?)."
        ) from None
    sup.restore(data)  # the journal's node devices join the host's (Results.restore)
    _log_to(run_dir)
    with open(run_dir / "command.txt", "a") as f:
        f.write(" ".join(sys.argv) + "\n")
    log.info("supervisor: resumed at %s (pid %d); logs in %s", sup.address, os.getpid(), run_dir)
    return _supervise(sup, run_dir)


def cmd_revoke(args: argparse.Namespace) -> int:
    """``swarm revoke RUN_DIR START``: ask the running supervisor to shut machine START out
    (checkfree.swarm.supervisor.machines).

    Raises:
        ValueError: RUN_DIR holds no run with such a machine, the run ended, its journal cannot be trusted, or its
            supervisor is not running (one sentence).
    """
    from checkfree.swarm.process_identity import running
    from checkfree.swarm.supervisor.journal import JOURNAL_FILE, read_journal
    from checkfree.swarm.supervisor.machines import request_revocation, token_path

    run_dir = Path(args.run_dir)
    if (run_dir / JOURNAL_FILE).exists():  # else a run started before journals: its supervisor still reads it
        data = read_journal(run_dir)  # checked (mode, owner, schema): JournalError, one sentence
        if data["status"] != "running":
            raise ValueError(
                f"the run in {run_dir} ended ({data['status']}); expected the run directory of a running swarm."
            )
        sup = data["supervisor"]
        if sup.get("started") is None or not running(sup["pid"], sup["started"]):
            raise ValueError(
                f"the supervisor of the run in {run_dir} (pid {sup.get('pid')}) is not running, so nothing would "
                f"read the revocation; expected a running swarm (resume it first: python -m checkfree swarm run "
                f"--resume {run_dir})."
            )
    if request_revocation(run_dir, args.machine):
        print(
            f"machine {args.machine}: revocation asked; its supervisor shuts it out within about a second while "
            f"training runs (supervisor.log: 'revoked'; throughput.json: machine_revocations). Its join token "
            f"{token_path(run_dir, args.machine)} admits nothing from then on."
        )
    else:
        print(f"machine {args.machine}: its revocation was asked already.")
    return 0


TABLE_KEYS = (
    "setting",
    "iterations_completed",
    "iterations_executed",
    "crashes_count",
    "recovered_count",
    "mean_iteration_s",
    "mean_iteration_s_without_crashes",
    "mean_crash_to_serving_s",
    "tokens_per_s",
    "loss_curve",
)
"""The fields of throughput.json that ``swarm table`` shows."""


def cmd_table(args: argparse.Namespace) -> int:
    """``swarm table RUN_DIR...``: one row per run's throughput.json (checked: at most 64 MiB and 32 deep, and
    each shown field of its type, checkfree.schemas.run_files.ThroughputRow).

    Raises:
        FileNotFoundError: a run directory holds no throughput.json. ValueError: one is unreadable or malformed
            (one sentence naming the file, the field and the value).
    """
    from checkfree.schemas.errors import validate
    from checkfree.schemas.limits import MAX_RESULT_BYTES, load_json
    from checkfree.schemas.run_files import ThroughputRow
    from checkfree.swarm.supervisor.summary_table import summary_table

    runs = []
    for d in args.run_dirs:
        path = d / "throughput.json"
        if not path.is_file():
            raise FileNotFoundError(f"{path} does not exist; expected a finished swarm run directory.")
        data = load_json(path, "throughput.json", MAX_RESULT_BYTES, jsonio.loads)
        missing = [k for k in TABLE_KEYS if k not in data] if isinstance(data, dict) else list(TABLE_KEYS)
        if missing:
            raise ValueError(f"{path} lacks {missing}; expected the throughput.json of a finished swarm run.")
        validate(ThroughputRow, data, str(path))
        runs.append(data)
    print(summary_table(runs))
    return 0
