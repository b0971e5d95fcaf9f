"""Trained stages → a Hugging Face model directory, and a sampler for it.

``python -m checkfree export RUN_DIR --out DIR`` reads the newest checkpoint of a run (checkfree.checkpoint.store's
per-layer safetensors, checksums verified): a simulator run's ``checkpoints/``, or the model a swarm run gathered
when it ended (``model/``, checkfree.swarm.supervisor.model_io). It puts every stage's weights back into one unsplit
transformers model (stage 0 = embedding + final norm + head, transformer stage s = global blocks (s−1)·L … s·L−1)
and saves it with ``save_pretrained`` (config.json + model.safetensors) next to the run's tokenizer (a swarm run on
synthetic data has none: the model alone is saved). The directory loads with
``AutoModelForCausalLM.from_pretrained(DIR)`` and gives the staged model's logits; export checks that by reloading
it. ``python -m checkfree generate DIR --prompt "..."`` prints a sample.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import re
from pathlib import Path
from typing import Any

import torch

from checkfree import jsonio
from checkfree.checkpoint.store import CheckpointError, Snapshot, list_checkpoints, read_checkpoint
from checkfree.config import Config, config_from_dict
from checkfree.rundir import check_output_dir, claim_output_dir

log = logging.getLogger(__name__)

_LAYER = re.compile(r"^layers\.(\d+)\.(.+)$")
VERIFY_TOLERANCE = 1e-5
"""Largest |logit difference| accepted between the staged model and the reloaded export (fp32)."""
PROVENANCE_FILE = "checkfree_export.json"


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = jsonio.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise ValueError(f"{path} is not valid JSON ({e.msg}); the run directory is damaged.") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path} is not a JSON object; the run directory is damaged.")
    return data


def _run_config(snapshot: Snapshot, run_dir: Path) -> Config:
    """The config that trained the checkpoint: its own copy, else the run's config.json."""
    raw = snapshot.meta.get("config")
    if not isinstance(raw, dict) or not raw:
        if not (run_dir / "config.json").is_file():
            raise ValueError(f"{run_dir} has no config.json and the checkpoint carries no config.")
        raw = _read_json(run_dir / "config.json")
    return config_from_dict(raw, source=f"config of {run_dir}")


def newest_checkpoint(run_dir: Path) -> Path:
    """The newest complete checkpoint directory of a run: a simulator run's ``checkpoints/``, else the model a swarm
    run gathered (``model/``).

    Raises:
        FileNotFoundError: the run has none.
    """
    for folder in ("checkpoints", "model"):
        found = list_checkpoints(Path(run_dir) / folder)
        if found:
            return found[-1]
    raise FileNotFoundError(
        f"{run_dir} has no checkpoint under checkpoints/ nor a model under model/; expected a finished run "
        "(the simulator writes a final checkpoint at the end, a swarm run gathers its model when it ends)."
    )


def run_summary(run_dir: Path) -> dict[str, Any]:
    """What export reads of a run: a simulator run's summary.json, or of a swarm run's throughput.json the setting
    (``strategy``), ``final_eval``, ``vocab_size``, the data source and the tokenizer its model was trained with.

    Raises:
        FileNotFoundError: neither file exists, or the swarm run kept no model (its one sentence why).
        ValueError: the file is not a JSON object.
    """
    run_dir = Path(run_dir)
    if (run_dir / "summary.json").is_file():
        return _read_json(run_dir / "summary.json")
    if not (run_dir / "throughput.json").is_file():
        raise FileNotFoundError(
            f"{run_dir} has no summary.json (a simulator run) nor throughput.json (a swarm run); expected a "
            "finished run directory."
        )
    data = _read_json(run_dir / "throughput.json")
    model = data.get("model") if isinstance(data.get("model"), dict) else {}
    if not model.get("path") and not list_checkpoints(run_dir / "model"):
        why = model.get("why") or "it ended before swarm runs kept their model"
        raise FileNotFoundError(f"the swarm run {run_dir} holds no model: {why}")
    config = data.get("config") if isinstance(data.get("config"), dict) else {}
    return {
        "strategy": data.get("setting"),
        "final_eval": data.get("final_eval"),
        "vocab_size": data.get("vocab_size"),
        "tokenizer_dir": model.get("tokenizer_dir"),
        "data": config.get("data"),
    }


def stages_from_snapshot(snapshot: Snapshot, cfg: Config, vocab_size: int, eos_token_id: int | None = None):
    """An unsplit transformers model and its stages, with the checkpoint's weights loaded.

    Blocks are matched by their global index (``layer_<g>``), so any stage layout with the same number of layers
    loads. Returns ``(model, stages)``; the stages share the model's tensors.

    Raises:
        CheckpointError: a tensor is missing or has another shape.
    """
    from checkfree.model import build_hf_model, split_model

    model = build_hf_model(cfg, vocab_size, seed=0, eos_token_id=eos_token_id)
    stages = split_model(model, cfg)
    L = cfg.n_layers_per_stage
    with torch.no_grad():
        for s, stage in enumerate(stages):
            for name, p in stage.named_parameters():
                if s == 0:
                    fname, local = "stage0", name
                else:
                    m = _LAYER.match(name)
                    fname, local = f"layer_{(s - 1) * L + int(m.group(1)):04d}", m.group(2)
                t = snapshot.files.get(fname, {}).get(f"param/{local}")
                if t is None or t.shape != p.shape:
                    shape = None if t is None else tuple(t.shape)
                    raise CheckpointError(
                        f"checkpoint tensor {fname}/{local} is missing or has shape {shape}; "
                        f"expected {tuple(p.shape)} (stage {s} parameter {name!r})."
                    )
                p.copy_(t)
    return model, stages


@torch.no_grad()
def staged_logits(stages: list[torch.nn.Module], input_ids: torch.Tensor) -> torch.Tensor:
    """Logits (B, T, V) of the stages run in order: E, stage 1 … stage S, E⁻¹."""
    h = stages[0].embed(input_ids)
    for stage in stages[1:]:
        h = stage(h)
    return stages[0].head(h)


def _tokenizer_dir(run_dir: Path, summary: dict[str, Any], given: Path | None) -> Path:
    if given is not None and not Path(given).is_dir():
        raise FileNotFoundError(
            f"--tokenizer {given} does not exist or is not a directory; expected a tokenizer directory "
            "saved by save_pretrained (e.g. the run's tokenizer_dir in summary.json)."
        )
    candidates = [given] if given is not None else []
    if summary.get("tokenizer_dir"):
        candidates.append(Path(summary["tokenizer_dir"]))
    for c in candidates:
        if c is not None and c.is_dir():
            return c
    raise FileNotFoundError(
        f"the tokenizer of {run_dir} was not found (summary.json tokenizer_dir "
        f"{summary.get('tokenizer_dir')!r}); pass --tokenizer DIR (a directory saved by "
        "save_pretrained, e.g. from the data cache)."
    )


def export_run(
    run_dir: Path,
    out: Path,
    checkpoint: Path | None = None,
    tokenizer: Path | None = None,
    verify: bool = True,
) -> dict[str, Any]:
    """Write the trained model of ``run_dir`` as a Hugging Face model directory ``out``.

    Returns the provenance dict written to ``out/checkfree_export.json`` (run, checkpoint, iteration, largest
    logit difference of the reloaded model). That file is also the marker of an export directory: ``out`` must be
    new, empty or an earlier export (checked before anything is read or written).

    Raises:
        DirectoryConflictError: ``out`` is a file, or a non-empty directory that is not an earlier export.
        FileNotFoundError: no checkpoint, no summary.json (throughput.json for a swarm run) or no tokenizer (a swarm
            run on synthetic data needs none).
        CheckpointError: the checkpoint is corrupt or does not fit the config.
        ValueError: the reloaded export's logits differ from the staged model's by more than VERIFY_TOLERANCE.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    run_dir, out = Path(run_dir), Path(out)
    check_output_dir(out, PROVENANCE_FILE, "export")
    summary = run_summary(run_dir)
    ckpt = Path(checkpoint) if checkpoint is not None else newest_checkpoint(run_dir)
    snapshot = read_checkpoint(ckpt)
    cfg = _run_config(snapshot, run_dir)
    tok, tok_dir = None, None
    if tokenizer is not None or summary.get("data") != "synthetic":  # synthetic swarm data: no tokenizer
        tok_dir = _tokenizer_dir(run_dir, summary, tokenizer)
        tok = AutoTokenizer.from_pretrained(str(tok_dir), local_files_only=True)
    emb = snapshot.files.get("stage0", {}).get("param/embed_tokens.weight")
    if emb is None:
        raise CheckpointError(f"checkpoint {ckpt} has no embedding (stage0.safetensors embed_tokens.weight).")
    vocab = int(summary.get("vocab_size") or (len(tok) if tok is not None else emb.shape[0]))
    if emb.shape[0] != vocab:
        raise CheckpointError(
            f"checkpoint {ckpt} has an embedding of {emb.shape[0]} tokens; the run's "
            f"{'summary.json' if (run_dir / 'summary.json').is_file() else 'throughput.json'} says vocab_size {vocab}."
        )
    model, stages = stages_from_snapshot(snapshot, cfg, vocab, tok.eos_token_id if tok is not None else None)
    model.config.use_cache = True  # generation speed; logits are the same
    if tok is not None:
        model.generation_config.pad_token_id = tok.eos_token_id
    claim_output_dir(out, PROVENANCE_FILE, {"run_dir": str(run_dir.resolve()), "complete": False})
    model.save_pretrained(str(out), safe_serialization=True)
    if tok is not None:
        tok.save_pretrained(str(out))
    info: dict[str, Any] = {
        "run_dir": str(run_dir.resolve()),
        "checkpoint": str(Path(ckpt).resolve()),
        "iteration": snapshot.iteration,
        "effective_iteration": snapshot.effective_iteration,
        "strategy": summary.get("strategy"),
        "final_eval": summary.get("final_eval"),
        "architecture": cfg.architecture,
        "n_stages": cfg.n_stages,
        "n_layers_per_stage": cfg.n_layers_per_stage,
        "tokenizer": str(tok_dir) if tok_dir is not None else None,
    }
    if verify:
        model.eval()
        reloaded = AutoModelForCausalLM.from_pretrained(str(out)).eval()
        gen = torch.Generator().manual_seed(0)
        ids = torch.randint(0, vocab, (2, min(cfg.seq_l, 32)), generator=gen)
        with torch.no_grad():
            diff = float((reloaded(input_ids=ids).logits - staged_logits(stages, ids)).abs().max())
        info["verify_max_abs_logit_diff"] = diff
        if not diff <= VERIFY_TOLERANCE:
            raise ValueError(
                f"the exported model's logits differ from the staged model's by {diff:.3g} "
                f"(> {VERIFY_TOLERANCE}); the export in {out} is wrong."
            )
    (out / PROVENANCE_FILE).write_text(jsonio.dumps(info, indent=1, default=str))
    log.debug(
        "exported %s (checkpoint %s, iteration %d) to %s", run_dir, Path(ckpt).name, snapshot.iteration, out
    )
    return info


def generate(
    model_dir: Path,
    prompt: str,
    max_new_tokens: int = 60,
    temperature: float = 0.8,
    top_k: int = 50,
    seed: int = 0,
) -> str:
    """Sample a continuation of ``prompt`` from an exported model directory; returns prompt + continuation.

    Raises:
        FileNotFoundError: ``model_dir`` has no config.json.
        ValueError: a non-positive max_new_tokens or top_k, or a temperature that is negative or not finite.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model_dir = Path(model_dir)
    if not (model_dir / "config.json").is_file():
        raise FileNotFoundError(
            f"{model_dir} has no config.json; expected a directory written by `python -m checkfree export`."
        )
    if max_new_tokens <= 0:
        raise ValueError(f"max_new_tokens is {max_new_tokens}; expected a positive integer.")
    if not (math.isfinite(temperature) and temperature >= 0):
        raise ValueError(f"--temperature is {temperature}; expected a finite number ≥ 0 (0 = greedy).")
    if top_k < 1:
        raise ValueError(f"--top-k is {top_k}; expected a positive integer.")
    tok = AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(str(model_dir)).eval()
    ids = tok(prompt, return_tensors="pt", add_special_tokens=False).input_ids
    if ids.shape[1] == 0:
        ids = torch.tensor([[tok.eos_token_id]])
    limit = int(
        getattr(model.config, "max_position_embeddings", 0) or getattr(model.config, "n_positions", 0)
    )
    if limit:
        ids = ids[:, -max(1, limit - max_new_tokens) :]  # keep within the trained context
        max_new_tokens = min(max_new_tokens, limit - ids.shape[1])
    sample = temperature > 0
    with torch.random.fork_rng(devices=[]):  # generate() samples from the global generator: seed a fork of it
        torch.manual_seed(seed)
        out = model.generate(
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=max_new_tokens,
            do_sample=sample,
            temperature=temperature if sample else None,
            top_k=top_k if sample else None,
            pad_token_id=tok.eos_token_id,
        )
    return tok.decode(out[0], skip_special_tokens=True)


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register the ``export`` and ``generate`` sub-commands."""
    p = sub.add_parser(
        "export",
        help="write a run's trained stages as a Hugging Face model directory",
        description=__doc__.splitlines()[0],
    )
    p.add_argument("run_dir", type=Path, metavar="RUN_DIR")
    p.add_argument("--out", required=True, type=Path, help="output model directory")
    p.add_argument("--checkpoint", type=Path, help="checkpoint directory (default: the run's newest)")
    p.add_argument("--tokenizer", type=Path, help="tokenizer directory (default: summary.json tokenizer_dir)")
    p.add_argument(
        "--no-verify",
        dest="verify",
        action="store_false",
        help="skip reloading the export and comparing its logits with the staged model",
    )
    p.set_defaults(func=cmd_export)
    g = sub.add_parser("generate", help="print a sample from an exported model directory")
    g.add_argument("model_dir", type=Path, metavar="DIR")
    g.add_argument("--prompt", required=True)
    g.add_argument("--max-new-tokens", type=int, default=60)
    g.add_argument("--temperature", type=float, default=0.8, help="0 = greedy")
    g.add_argument("--top-k", type=int, default=50)
    g.add_argument("--seed", type=int, default=0)
    g.set_defaults(func=cmd_generate)


def _quiet_transformers() -> None:
    """No weight-loading progress bars on the console (the CLI owns the output)."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()


def cmd_export(args: argparse.Namespace) -> int:
    _quiet_transformers()
    info = export_run(args.run_dir, args.out, args.checkpoint, args.tokenizer, args.verify)
    diff = info.get("verify_max_abs_logit_diff")
    print(
        f"exported {args.run_dir} (iteration {info['iteration']}) to {args.out}"
        + (f"; reloaded logits match the stages (max |Δ| {diff:.2g})" if diff is not None else "")
    )
    return 0


def cmd_generate(args: argparse.Namespace) -> int:
    _quiet_transformers()
    print(generate(args.model_dir, args.prompt, args.max_new_tokens, args.temperature, args.top_k, args.seed))
    return 0
