"""The memory estimator (checkfree/memory.py) and the checks built on it: simulator preflight and swarm run.

The estimate must be right where it can be measured here: exact parameter counts against the built model, exact
saved-for-backward bytes against what autograd saves (saved_tensors_hooks), and a real training step's peak RSS
within ±25 %. The refusals must be one sentence, fast, and write nothing.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import time

import pytest
import torch

from checkfree import memory as M
from checkfree.config import Config, load_config
from checkfree.model import build_hf_model, build_stages, split_model, stage_parameter_counts
from checkfree.pipeline import forward_loss
from checkfree.sim import preflight as P
from checkfree.sim.options import SimulateOptions

from helpers import ROOT
from helpers.cli import assert_user_error, run_cli, simulate_argv, swarm_argv

PAPER_CONFIGS = (
    "124M_config.json",
    "500M_config.json",
    "500M_config_6x4.json",
    "500M_config_gpt.json",
    "1_5B_config.json",
    "1_5B_config_6x4.json",
)


def _config(name: str, architecture: str) -> Config:
    """A config file with its architecture set (the GPT variants of the tiny and small configs)."""
    return load_config(name, {"architecture": architecture})


# ---------------------------------------------------------------------------------------- (a) parameter counts


@pytest.mark.parametrize("architecture", ["LLaMa", "GPT"])
@pytest.mark.parametrize("name", ["tiny_config.json", "small_config.json"])
def test_parameter_count_is_exactly_that_of_the_built_model(name, architecture) -> None:
    cfg = _config(name, architecture)
    vocab = M.model_vocab_size(cfg)
    stages = build_stages(cfg, vocab, seed=0)
    counts = M.parameter_counts(cfg, vocab)
    built = stage_parameter_counts(stages)
    assert counts.total == sum(p.numel() for s in stages for p in s.parameters()) == sum(built)
    assert counts.stage0 == built[0]
    assert all(counts.transformer_stage(cfg.n_layers_per_stage) == c for c in built[1:])


@pytest.mark.parametrize("name", PAPER_CONFIGS)
def test_parameter_count_of_the_paper_configs_matches_a_meta_model(name) -> None:
    cfg = load_config(name)
    vocab = M.model_vocab_size(cfg)
    with torch.device("meta"):  # shapes only: nothing is allocated
        stages = split_model(build_hf_model(cfg, vocab, seed=0), cfg)
    assert M.parameter_counts(cfg, vocab).total == sum(stage_parameter_counts(stages))


def test_a_model_for_a_hub_tokenizer_gets_that_tokenizers_vocabulary() -> None:
    """One table (checkfree.data.tokenizer.HUB_TOKENIZERS) serves the memory estimate and a dry run's counts."""
    cfg = load_config("tiny_config.json")
    sizes = {t: M.model_vocab_size(dataclasses.replace(cfg, tokenizer=t)) for t in ("llama2", "gpt2", "bpe")}
    assert sizes == {"llama2": 32000, "gpt2": 50257, "bpe": cfg.vocab_size}


# ---------------------------------------------------------------------------------------- activations


def _saved_bytes(cfg: Config, vocab: int, autocast: bool, checkpointing: bool) -> int:
    """Bytes of the distinct storages autograd saves in one microbatch's forward (parameters excluded)."""
    stages = build_stages(cfg, vocab, seed=0)
    for s in stages[1:]:
        s.activation_checkpointing = checkpointing
    params = {p.untyped_storage().data_ptr() for s in stages for p in s.parameters()}
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        if storage.data_ptr() not in params:
            seen[storage.data_ptr()] = storage.nbytes()
        return t

    batch = torch.randint(
        0, vocab, (cfg.batch_size, cfg.seq_l + 1), generator=torch.Generator().manual_seed(0)
    )
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            forward_loss(stages, batch, range(1, cfg.n_stages + 1))
    return sum(seen.values())


@pytest.mark.parametrize("checkpointing", [False, True])
@pytest.mark.parametrize("autocast", [False, True])
@pytest.mark.parametrize("architecture", ["LLaMa", "GPT"])
def test_activation_formula_is_what_autograd_saves(architecture, autocast, checkpointing) -> None:
    """Odd, distinct sizes so that no two terms can stand in for each other; bf16 autocast on the CPU takes
    the casts CUDA's autocast takes (linear, matmul, sdpa in bf16; norms and the loss in fp32)."""
    cfg = Config(
        architecture=architecture,
        dmodel=48,
        num_heads=4,
        n_layers_per_stage=2,
        n_stages=3,
        seq_l=24,
        batch_size=3,
        vocab_size=301,
    )
    vocab = 301
    act = M.activations(cfg, vocab, cfg.batch_size, autocast)
    counts = M.parameter_counts(cfg, vocab)
    loss = 4  # the 0-dim loss
    if checkpointing:
        # each block keeps its input; the head is saved as without checkpointing, and only its bf16 LM head copy
        # (the blocks' copies are recomputed); LLaMa's cos/sin are held by the recomputation, not saved
        want = act.embedding + counts.blocks * act.block_input + act.head + loss
        want += 2 * counts.head_matmul if autocast else 0
    else:
        want = act.embedding + cfg.n_stages * act.rotary + counts.blocks * act.block + act.head + loss
        want += 2 * (counts.blocks * counts.block_matmul + counts.head_matmul) if autocast else 0
    assert _saved_bytes(cfg, vocab, autocast, checkpointing) == want


def test_activation_checkpointing_keeps_the_inputs_and_the_larger_of_head_and_block() -> None:
    cfg = load_config("1_5B_config.json")
    vocab = M.model_vocab_size(cfg)
    act = M.activations(cfg, vocab, cfg.batch_size, autocast=True)
    full = M.simulator_estimate(cfg, vocab, "cuda", True, False)
    ckpt = M.simulator_estimate(cfg, vocab, "cuda", True, True)
    assert full.activations == act.embedding + cfg.n_stages * act.rotary + cfg.n_layers * act.block + act.head
    kept = act.embedding + cfg.n_stages * act.rotary + cfg.n_layers * act.block_input
    assert ckpt.activations == kept + max(act.head, act.block)
    assert ckpt.total < full.total / 2


# ---------------------------------------------------------------------------------------- (b) measured peak


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize(
    "name, checkpointing",
    [("tiny_config.json", False), ("small_config.json", False), ("small_config.json", True)],
)
def test_estimate_is_within_25_percent_of_a_real_steps_peak_rss(name, checkpointing) -> None:
    """tests/memory_worker.py runs two real training steps in a fresh process and reports the peak RSS growth
    (the Linux high-water mark reset after the model is built): what training allocated. The estimate of that
    growth is its total less the weights and the process, which the build already holds. ±25 %: the glibc heap
    term (checkfree.memory.CPU_HEAP_FACTOR) is an average of measurements that vary by ±20 %."""
    r = subprocess.run(
        [sys.executable, str(ROOT / "tests" / "memory_worker.py"), name, "2"]
        + (["--activation-checkpointing"] if checkpointing else []),
        capture_output=True,
        text=True,
        timeout=540,
        cwd=ROOT,
    )
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout.strip().splitlines()[-1])
    measured = out["peak"] - out["rss_before"]
    estimated = out["total"] - out["weights"] - out["runtime"]
    assert 0.75 <= estimated / measured <= 1.25, (name, checkpointing, estimated, measured)


# ---------------------------------------------------------------------------------------- simulator preflight


def _opts(config: str = "tiny_config.json", **kw) -> SimulateOptions:
    return SimulateOptions(setting="checkfree", config=config, swaps=False, **kw)


def test_world_size_ranks_share_host_memory(monkeypatch) -> None:
    cfg = load_config("tiny_config.json")
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    monkeypatch.delenv("NNODES", raising=False)
    one = P.check_memory(_opts(device="cpu"), cfg, "checkfree")
    four = P.check_memory(_opts(device="cpu", world_size=4), cfg, "checkfree")
    assert four.need == 4 * one.need and four.ranks == 4
    monkeypatch.setenv("NNODES", "2")  # two machines: two ranks on this one
    assert P.check_memory(_opts(device="cpu", world_size=4), cfg, "checkfree").ranks == 2


def test_a_cuda_rank_that_fits_only_with_checkpointing_is_told_so(monkeypatch) -> None:
    """No GPU needed: the device and its memory are monkeypatched (an 80 GB H100 reports 81,559 MiB)."""
    monkeypatch.setattr(P.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(M, "gpu_memory", lambda index: 81559 * 2**20)
    monkeypatch.setattr(M, "available_host_memory", lambda: 1024 * M.GIB)
    cfg = load_config("1_5B_config.json")
    check = P.check_memory(_opts("1_5B_config.json"), cfg, "checkfree_plus")
    assert check.where == "cuda:0" and check.estimate.precision == "bf16 autocast" and not check.fits
    assert "--activation-checkpointing" in check.advice
    sentence = check.sentence()
    assert sentence.count(". ") == 0 and sentence.endswith(".") and "cuda:0 has 79.65 GiB" in sentence
    assert P.check_memory(
        _opts("1_5B_config.json", activation_checkpointing=True), cfg, "checkfree_plus"
    ).fits


# ---------------------------------------------------------------------------------------- the fused loss


@pytest.mark.parametrize(
    ("tokens", "dmodel", "vocab", "chunk"),
    [
        (4096 * 4, 4096, 32000, 2048),  # Liger's own example (fused_linear_cross_entropy.py's comment)
        (64 * 512, 512, 32000, 1024),  # the 124M config: inc_factor 63, ceil(32768 / 63) = 521 → 1,024
        (8 * 4096, 2048, 32000, 2048),  # the 1.5B config: inc_factor 16 → 2,048
        (16 * 1024, 1024, 32000, 512),  # the Table 2 model: inc_factor 32 → 512
        (100, 1000, 10, 100),  # one chunk, never more tokens than there are
        (10, 1, 100, 1),
    ],
)
def test_liger_chunk_rule(tokens, dmodel, vocab, chunk) -> None:
    assert M.liger_chunk_tokens(tokens, dmodel, vocab) == chunk


@pytest.mark.parametrize(("checkpointing", "old_total"), [(False, 30106217498), (True, 16983341287)])
def test_the_fused_loss_lowers_the_124m_estimate_and_off_leaves_it_as_it_was(
    checkpointing, old_total
) -> None:
    """``old_total``: the estimate of the 124M config (bf16, CUDA, checkfree_plus) before the fused path existed."""
    cfg = load_config("124M_config.json")
    vocab = M.model_vocab_size(cfg)
    plain = M.simulator_estimate(cfg, vocab, "cuda", True, checkpointing, "checkfree_plus")
    off = M.simulator_estimate(cfg, vocab, "cuda", True, checkpointing, "checkfree_plus", fused_loss=False)
    fused = M.simulator_estimate(cfg, vocab, "cuda", True, checkpointing, "checkfree_plus", fused_loss=True)
    assert plain.total == off.total == old_total
    # no n × V logits (3.9 GiB saved, 7.8 GiB in the backward): at least 10 GiB less
    assert fused.total < plain.total - 10 * M.GIB
    assert fused.weights == plain.weights and fused.autocast_copies == plain.autocast_copies
    assert "fused loss: logits of 1,024 tokens at a time" in fused.describe("124M")


def test_the_fused_head_keeps_its_gradients_and_a_chunk_of_logits() -> None:
    cfg = load_config("124M_config.json")
    n, d, V = cfg.batch_size * cfg.seq_l, cfg.dmodel, 32000
    plain = M.activations(cfg, V, cfg.batch_size, autocast=True)
    fused = M.activations(cfg, V, cfg.batch_size, autocast=True, fused_loss=True)
    norm = 8 * n * d + 4 * n  # the final RMSNorm's input, normalised input and rsqrt
    assert plain.head == norm + 2 * n * d + 4 * n * V + 8 * n
    assert fused.head == norm + 4 * n * d + 4 * V * d + 13 * n
    assert fused.head_backward == 1024 * V * 2 + 3 * 1024 * d * 2  # one chunk's bf16 logits, in place
    fp32 = M.activations(cfg, V, cfg.batch_size, autocast=False, fused_loss=True)
    assert fp32.head_backward == 1024 * V * 4 + 3 * 1024 * d * 4 + 4 * V * d  # + the fp32 V × d product


def test_a_cuda_rank_with_liger_is_estimated_on_the_fused_path(monkeypatch) -> None:
    from helpers.liger import install_fake_liger, remove_liger

    monkeypatch.setattr(P.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(M, "gpu_memory", lambda index: 81559 * 2**20)
    monkeypatch.setattr(M, "available_host_memory", lambda: 1024 * M.GIB)
    cfg = load_config("124M_config.json")
    vocab = M.model_vocab_size(cfg)
    remove_liger(monkeypatch)
    plain = P.check_memory(_opts("124M_config.json"), cfg, "checkfree_plus").estimate
    assert plain.total == M.simulator_estimate(cfg, vocab, "cuda", True, False, "checkfree_plus").total
    install_fake_liger(monkeypatch)
    fused = P.check_memory(_opts("124M_config.json"), cfg, "checkfree_plus").estimate
    assert (
        fused.total
        == M.simulator_estimate(cfg, vocab, "cuda", True, False, "checkfree_plus", None, True).total
    )
    off = P.check_memory(_opts("124M_config.json", fused_loss="off"), cfg, "checkfree_plus").estimate
    assert off.total == plain.total


@pytest.mark.parametrize(
    ("percent", "fits"), [(50, True), (90, True), (91, False), (100, False), (111, False)]
)
def test_a_run_fits_only_within_90_percent_of_its_memory(percent, fits) -> None:
    """The margin is taken off the memory (need ≤ 90 % of it), not off the need: 111 % never fits."""
    assert M.fits(percent * 2**20, 100 * 2**20) is fits


def test_a_simulator_run_needing_111_percent_of_the_host_is_refused(monkeypatch) -> None:
    cfg = load_config("tiny_config.json")
    need = P.check_memory(_opts(device="cpu"), cfg, "checkfree").need
    monkeypatch.setattr(M, "available_host_memory", lambda: int(need / 1.11))
    check = P.check_memory(_opts(device="cpu"), cfg, "checkfree")
    assert not check.fits and "and a run must fit in 90% of it" in check.sentence()


def test_a_smaller_microbatch_is_proposed_when_checkpointing_is_not_enough(monkeypatch) -> None:
    cfg = load_config("small_config.json", {"batch_size": 256})
    vocab = M.model_vocab_size(cfg)
    with_checkpointing = M.simulator_estimate(cfg, vocab, "cpu", False, True, "checkfree").total
    memory = int(with_checkpointing / 1.5)  # checkpointing alone is not enough
    monkeypatch.setattr(M, "available_host_memory", lambda: memory)
    check = P.check_memory(_opts("small_config.json", device="cpu"), cfg, "checkfree")
    assert not check.fits and check.advice.startswith("--set batch_size=")
    batch = int(check.advice.split("batch_size=")[1].split()[0])
    mb = int(check.advice.split("mb_count=")[1].split()[0])
    assert batch < 256 and batch * mb == 256 * cfg.mb_count  # the same sequences per iteration
    smaller = load_config("small_config.json", {"batch_size": batch, "mb_count": mb})
    assert M.fits(M.simulator_estimate(smaller, vocab, "cpu", False, False, "checkfree").total, memory)
    larger = load_config("small_config.json", {"batch_size": 2 * batch})
    assert not M.fits(M.simulator_estimate(larger, vocab, "cpu", False, False, "checkfree").total, memory)


def test_an_absurd_model_is_refused_in_seconds_writing_nothing(tmp_path, capsys) -> None:
    t0 = time.perf_counter()
    # within the config's bounds (issue 37): 10^9 for dmodel is refused by the schema first
    big = ("--set", "dmodel=65536", "--set", "n_layers_per_stage=1024")
    rc, _, err = run_cli(simulate_argv(tmp_path / "run", *big), capsys)
    assert time.perf_counter() - t0 < 10
    assert_user_error(rc, err, "this run needs about", "GiB", "smaller model")
    assert not (tmp_path / "run").exists()


def test_dry_run_prints_the_table_and_does_not_refuse(monkeypatch, tmp_path, capsys) -> None:
    monkeypatch.setattr(M, "available_host_memory", lambda: 10 * 2**20)  # 10 MiB: nothing fits
    argv = simulate_argv(tmp_path / "run", "--device", "cpu")  # the host's memory, on a GPU machine too
    rc, out, err = run_cli([*argv, "--dry-run"], capsys)
    assert rc == 0, err
    assert "memory per rank, estimated from the config's shapes (cpu, fp32" in out
    assert "  total on cpu" in out and "does not fit" in out and "(a real run is refused)" in out
    rc, _, err = run_cli(argv, capsys)
    assert_user_error(rc, err, "of host RAM available")
    assert not (tmp_path / "run").exists()


# ---------------------------------------------------------------------------------------- (d) swarm


def test_swarm_dry_run_adds_up_the_nodes_of_this_machine(tmp_path, capsys) -> None:
    rc, out, err = run_cli(
        swarm_argv(
            tmp_path, "--device", "cpu", "--start", "2", "--end", "5", "--dry-run", setting="ours-plus"
        ),
        capsys,
    )
    assert rc == 0, err
    nodes = [line for line in out.splitlines() if line.startswith("  node ")]
    assert [line.split(" on ")[0].strip() for line in nodes] == [
        "node 2 (stage 1)",
        "node 3 (stage 1)",
        "node 4 (stage 2)",
    ]
    total = next(line for line in out.splitlines() if line.startswith("  host RAM of this machine: "))
    # three nodes, the supervisor and the forkserver: each node's total, plus two processes
    cfg = load_config("tiny_config.json")
    node = M.swarm_node_estimate(cfg, 4096, 1, "cpu", in_flight=2, replicas=2, keeps_stage0_copy=True)
    node2 = M.swarm_node_estimate(cfg, 4096, 2, "cpu", in_flight=2, replicas=2, keeps_stage0_copy=True)
    assert node.copies > 0 and node2.copies == 0  # stage 1 holds the copy of E under ours-plus
    assert f": {M.gib(2 * node.total + node2.total + 2 * M.PROCESS_BYTES)} of " in total
    assert total.endswith("fits (≤ 90%)")


@pytest.mark.parametrize("in_flight", [1, 3])
def test_a_cuda_swarm_node_holds_bf16_weight_copies_for_every_microbatch_in_flight(in_flight) -> None:
    """Under autocast each microbatch's forward casts the stage's matmul weights to bf16 and keeps the copies for
    its backward, so a transformer-stage node holds one set per microbatch in flight; stage 0 casts its head for
    one microbatch at a time (its head runs one microbatch's loss at a time); the CPU runs in fp32 (no casts)."""
    cfg = load_config("500M_config_6x4.json")
    counts = M.parameter_counts(cfg, 32000)
    block = M.swarm_node_estimate(cfg, 32000, 2, "cuda", in_flight, 3, False)
    assert block.autocast_copies == in_flight * 2 * cfg.n_layers_per_stage * counts.block_matmul
    assert M.swarm_node_estimate(cfg, 32000, 0, "cuda", in_flight, 3, False).autocast_copies == (
        2 * counts.head_matmul
    )
    assert M.swarm_node_estimate(cfg, 32000, 2, "cpu", in_flight, 3, False).autocast_copies == 0


def test_swarm_run_that_cannot_fit_is_refused_before_anything_starts(monkeypatch, tmp_path, capsys) -> None:
    monkeypatch.setattr(M, "available_host_memory", lambda: 2 * M.GIB)  # ten tiny nodes need ≈ 4.5 GiB
    rc, out, err = run_cli(swarm_argv(tmp_path, "--device", "cpu", "--dry-run", setting="ours-plus"), capsys)
    assert rc == 0 and "does not fit; it would with --end " in out, err
    rc, _, err = run_cli(swarm_argv(tmp_path, "--device", "cpu", setting="ours-plus"), capsys)
    assert_user_error(rc, err, "the swarm nodes 0..9 this machine hosts need about", "2.00 GiB", "--end ")
    assert not (tmp_path / "run").exists()


def test_swarm_gpus_are_added_up_per_device(monkeypatch) -> None:
    monkeypatch.setattr(M, "gpu_memory", lambda index: 8 * M.GIB)
    monkeypatch.setattr(M, "available_host_memory", lambda: 64 * M.GIB)
    cfg = load_config("500M_config_6x4.json")
    nodes = [(3, 1, "cuda:0"), (4, 1, "cuda:1"), (5, 1, "cuda:0")]
    machine = M.machine_memory(cfg, 32000, nodes, 3, 3, False, [("supervisor", M.PROCESS_BYTES)])
    one = M.swarm_node_estimate(cfg, 32000, 1, "cuda", 3, 3, False)
    assert machine.gpu_need() == {"cuda:0": 2 * one.total, "cuda:1": one.total}
    assert machine.host_need() == 3 * one.host + M.PROCESS_BYTES
    assert machine.short() == ["cuda:0", "cuda:1"]  # a 500M stage with 3 microbatches in flight needs > 8 GiB


@pytest.mark.parametrize("in_flight", [1, 2, 4])
def test_a_swarm_node_counts_the_microbatch_gradients_it_holds_for_the_id_order(in_flight) -> None:
    """A node sums its microbatches' gradients in id order (OrderedGradients), holding up to in_flight − 1 that came
    before their predecessors: 4 bytes per stage parameter each, beside the parameters' own gradients; and the
    last SWARM_UPDATES_KEPT updates a serving node keeps for a replacement catching up (issue 39 point 3)."""
    cfg = load_config("tiny_config.json")
    counts = M.parameter_counts(cfg, 4096)
    for stage, n in ((0, counts.stage0), (1, counts.transformer_stage(cfg.n_layers_per_stage))):
        node = M.swarm_node_estimate(cfg, 4096, stage, "cpu", in_flight, 1, False)
        assert node.gradients == 4 * n * (in_flight + M.SWARM_UPDATES_KEPT)
        assert node.gradients <= node.total - node.weights - node.optimizer - node.activations
