"""The report reads run results through their schemas (checkfree.schemas.run_files, issue 37): a summary.json or a
throughput.json whose fields are of the wrong type, or that is too deep to parse, is one sentence naming the file,
the field and the value (RunDirError), never a TypeError deep in a table."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from checkfree.report.runs import RunDirError, load_run


def _run(tmp_path: Path, summary: str) -> Path:
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text(json.dumps({"kind": "eval", "iteration": 0, "val_loss": 5.0}) + "\n")
    (run / "summary.json").write_text(summary)
    return run


@pytest.mark.parametrize(
    "summary, says",
    [
        ('{"status": 5}', "summary.json: 'status' is 5; expected a valid string."),
        ('{"final_eval": "good"}', "'final_eval' is 'good'"),
        ('{"final_eval": {"val_loss": "low"}}', "'final_eval.val_loss' is 'low'"),
        ('{"iterations": -1}', "'iterations' is -1"),
        ('{"world_size": 0}', "'world_size' is 0"),
        ('{"failures": true}', "'failures' is True"),
        ("[]", "summary.json: the file holds []; expected a JSON object."),
        ("[" * 40 + "]" * 40, "is nested deeper than 32"),
    ],
)
def test_a_summary_off_its_schema_is_one_sentence(tmp_path: Path, summary: str, says: str) -> None:
    with pytest.raises(RunDirError) as e:
        load_run(_run(tmp_path, summary))
    assert says in str(e.value) and "\n" not in str(e.value)


def test_a_summary_on_its_schema_is_read(tmp_path: Path) -> None:
    summary = {
        "status": "completed",
        "iterations": 1,
        "final_eval": {"val_loss": 4.0, "iteration": 0},
        "x": [1],
    }
    run = load_run(_run(tmp_path, json.dumps(summary)))
    assert run.final_eval["val_loss"] == 4.0 and run.iterations == 1


def test_a_throughput_json_off_its_schema_is_one_sentence(tmp_path: Path) -> None:
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "throughput.json").write_text(json.dumps({"setting": "ours", "loss_curve": "down"}))
    with pytest.raises(RunDirError, match="throughput.json: 'loss_curve' is 'down'; expected a valid list."):
        load_run(tmp_path / "run")


def test_a_metrics_line_nested_deep_is_one_sentence(tmp_path: Path) -> None:
    run = _run(tmp_path, '{"status": "completed"}')
    good = (run / "metrics.jsonl").read_text()
    (run / "metrics.jsonl").write_text("[" * 100_000 + "]" * 100_000 + "\n" + good)
    with pytest.raises(RunDirError, match="metrics.jsonl: line 1 is nested deeper than 32"):
        load_run(run)
