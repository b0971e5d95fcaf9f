"""Export: a run's checkpoint becomes a Hugging Face model directory with the staged model's logits."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from checkfree.checkpoint.store import capture, write_snapshot
from checkfree.config import Config
from checkfree.export import export_run, generate, staged_logits
from checkfree.model import build_hf_model, split_model
from checkfree.training_state import TrainingState, make_adam

pytestmark = pytest.mark.timeout(120)

CORPUS = (
    "To be, or not to be, that is the question: whether 'tis nobler in the mind to suffer the slings and "
    "arrows of outrageous fortune, or to take arms against a sea of troubles. "
) * 20


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory) -> Path:
    from checkfree.data.tokenizer import train_bpe

    out = tmp_path_factory.mktemp("tok")
    train_bpe([CORPUS[i : i + 200] for i in range(0, len(CORPUS), 200)], 300, out)
    return out


def make_trained_run(
    root: Path, tokenizer_dir: Path, arch: str
) -> tuple[Path, list[torch.nn.Module], Config]:
    """A finished run directory whose final checkpoint holds weights no fresh init would give."""
    from transformers import AutoTokenizer

    vocab = len(AutoTokenizer.from_pretrained(str(tokenizer_dir)))
    cfg = Config(
        architecture=arch,
        dmodel=32,
        num_heads=2,
        n_layers_per_stage=1,
        n_stages=4,
        seq_l=16,
        vocab_size=300,
        tokenizer=str(tokenizer_dir),
        seed=1,
    )
    stages = split_model(build_hf_model(cfg, vocab, seed=1), cfg)
    with torch.no_grad():  # "training": move every weight away from any seed's init
        gen = torch.Generator().manual_seed(3)
        for s in stages:
            for p in s.parameters():
                p.add_(0.05 * torch.randn(p.shape, generator=gen))
    state = TrainingState(
        stages, [make_adam(s, 1e-3) for s in stages], base_lr=1e-3, iteration=7, effective_iteration=7
    )
    run = root / f"run-{arch}"
    write_snapshot(
        capture(state, cfg.n_layers_per_stage, cfg.to_json(), strategy="checkfree"), run / "checkpoints"
    )
    (run / "config.json").write_text(json.dumps(cfg.to_json()))
    (run / "summary.json").write_text(
        json.dumps(
            {
                "iterations": 7,
                "strategy": "checkfree",
                "tokenizer_dir": str(tokenizer_dir),
                "vocab_size": vocab,
                "final_eval": {"iteration": 7, "val_loss": 5.0, "perplexity": 148.4},
            }
        )
    )
    return run, stages, cfg


@pytest.mark.parametrize("arch", ["LLaMa", "GPT"])
def test_export_loads_with_automodel_and_gives_the_staged_logits(tmp_path, tokenizer_dir, arch):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    run, stages, cfg = make_trained_run(tmp_path, tokenizer_dir, arch)
    out = tmp_path / "hf"
    info = export_run(run, out)
    assert {"config.json", "model.safetensors", "tokenizer.json", "checkfree_export.json"} <= {
        p.name for p in out.iterdir()
    }
    assert info["iteration"] == 7 and info["verify_max_abs_logit_diff"] <= 1e-5
    model = AutoModelForCausalLM.from_pretrained(str(out)).eval()
    ids = torch.randint(0, 300, (3, 16), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        hf = model(input_ids=ids).logits
    staged = staged_logits(stages, ids)
    assert (hf - staged).abs().max().item() <= 1e-6
    tok = AutoTokenizer.from_pretrained(str(out))
    assert tok.decode(tok("to be or not").input_ids) == "to be or not"


def test_generate_prints_a_continuation(tmp_path, tokenizer_dir):
    run, _, _ = make_trained_run(tmp_path, tokenizer_dir, "LLaMa")
    export_run(run, tmp_path / "hf", verify=False)
    text = generate(tmp_path / "hf", "To be", max_new_tokens=5, temperature=0.0)
    assert text.startswith("To be") and len(text) > len("To be")
    assert generate(tmp_path / "hf", "To be", max_new_tokens=5, seed=4) == generate(
        tmp_path / "hf", "To be", max_new_tokens=5, seed=4
    )  # seeded sampling repeats


def test_export_errors_are_one_sentence(tmp_path, tokenizer_dir, capsys):
    from checkfree.cli import main

    (tmp_path / "norun").mkdir()
    (tmp_path / "norun" / "summary.json").write_text("{}")
    assert main(["export", str(tmp_path / "norun"), "--out", str(tmp_path / "o")]) == 2
    assert "has no checkpoint under checkpoints/" in capsys.readouterr().err
    run, _, _ = make_trained_run(tmp_path, tokenizer_dir, "LLaMa")
    summary = json.loads((run / "summary.json").read_text())
    summary["tokenizer_dir"] = str(tmp_path / "gone")
    (run / "summary.json").write_text(json.dumps(summary))
    assert main(["export", str(run), "--out", str(tmp_path / "o")]) == 2
    assert "--tokenizer DIR" in capsys.readouterr().err
    assert main(["generate", str(tmp_path / "nothing"), "--prompt", "x"]) == 2
    assert "has no config.json" in capsys.readouterr().err


@pytest.mark.parametrize("arch", ["LLaMa", "GPT"])
def test_exported_model_stops_at_end_of_text_and_keeps_its_eos_row_trainable(tmp_path, tokenizer_dir, arch):
    """EOS is the model's end-of-sequence (generation stops there) but not a padding row: fine-tuning the
    export must not freeze it, and the exported weights keep the trained (non-zero) EOS row."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    run, stages, _ = make_trained_run(tmp_path, tokenizer_dir, arch)
    export_run(run, tmp_path / "hf", verify=False)
    tok = AutoTokenizer.from_pretrained(str(tmp_path / "hf"))
    eos = tok.eos_token_id
    model = AutoModelForCausalLM.from_pretrained(str(tmp_path / "hf")).eval()
    assert model.config.eos_token_id == eos and model.generation_config.eos_token_id == eos
    assert model.generation_config.pad_token_id == eos  # batched generation pads with EOS
    table = model.get_input_embeddings()
    assert table.padding_idx is None
    assert torch.equal(table.weight[eos], stages[0].embed_tokens.weight[eos])

    calls = [0]

    def eos_wins(module, inputs, logits):  # the third generated token onwards: EOS is the greedy choice
        calls[0] += 1
        if calls[0] < 3:
            return logits
        logits = logits.clone()
        logits[..., eos] = 1e4
        return logits

    model.lm_head.register_forward_hook(eos_wins)
    prompt = tok("To be", return_tensors="pt", add_special_tokens=False).input_ids
    out = model.generate(input_ids=prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=20)
    new = out[0, prompt.shape[1] :].tolist()
    assert new[-1] == eos and eos not in new[:-1] and len(new) <= 3  # stopped at the first EOS
