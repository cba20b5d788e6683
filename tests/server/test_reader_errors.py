"""One malformed line, told the same way by every reader: ``check``, ``replay``, ``serve
--import`` and the import route name the file, the line and the field in plain words."""

from __future__ import annotations

from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from gradwatch import check, replay
from gradwatch.server import cli as serve
from tests.core.logs import clean_log, write
from tests.core.test_validation import INTERNALS

BAD = [
    ('"step":1,', '"step":"one",',
     "field 'step' of the 'step' record is \"one\": it must be a valid integer"),
    ('"type":"step"', '"type":"stepp"',
     "the record has the unknown type 'stepp' (known: header, optimizer, site, step, stats, "
     "end, unowned, holding, scalars)"),
    ('"type":"step",', "", "the record has no 'type' field saying which kind of record it is"),
]


def _bad_log(tmp_path: Path, old: str, new: str) -> tuple[Path, int]:
    path = write(tmp_path / "bad.jsonl", clean_log(3))
    lines = path.read_text().splitlines()
    n = next(i for i, line in enumerate(lines) if old in line and '"step":1,' in line)
    lines[n] = lines[n].replace(old, new)
    path.write_text("\n".join(lines) + "\n")
    return path, n + 1


@pytest.mark.parametrize("old, new, sentence", BAD)
def test_every_reader_names_file_line_and_field_in_the_same_words(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], client: TestClient,
        old: str, new: str, sentence: str) -> None:
    path, line = _bad_log(tmp_path, old, new)
    where = f"{path}:{line}: {sentence}"

    assert check.main([str(path)]) == 2
    assert capsys.readouterr().err == f"gradwatch check: {where}\n"

    assert replay.main([str(path), "--server", "ws://127.0.0.1:9"]) == 2
    assert capsys.readouterr().err == f"gradwatch replay: {where}\n"

    assert serve.main(["--data", str(tmp_path / "data"), "--import", str(path),
                       "--import-only"]) == 2
    assert capsys.readouterr().err == f"gradwatch serve: cannot import {where}\n"

    r = client.post("/api/runs/import", content=path.read_bytes(),
                    headers={"content-type": "application/x-ndjson"})
    assert r.status_code == 400
    assert r.json()["detail"] == f"upload:{line}: {sentence}"
    assert not [w for w in INTERNALS if w in r.text]
