"""Key and join-token files appear whole or not at all (checkfree.swarm.wire.auth): a second machine polls for its
join token and read an empty file when the supervisor created it before writing it (a live test saw "not valid JSON")."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from checkfree.swarm.wire import auth


@pytest.mark.timeout(30)
def test_a_private_file_is_written_beside_its_path_and_renamed_into_it(tmp_path: Path, monkeypatch) -> None:
    path = tmp_path / "join_tokens" / "machine2.json"
    dumps = auth.jsonio.dumps

    def dumps_while_absent(data: object) -> str:
        assert not path.exists()  # nothing is at the path while the content is written
        return dumps(data)

    monkeypatch.setattr(auth.jsonio, "dumps", dumps_while_absent)
    auth._write_private(path, {"a": 1})
    assert path.read_text() == dumps({"a": 1})
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert sorted(p.name for p in path.parent.iterdir()) == ["machine2.json"]  # no temporary file left
    monkeypatch.undo()
    auth._write_private(path, {"a": 2})  # replaced whole
    assert path.read_text() == dumps({"a": 2})
