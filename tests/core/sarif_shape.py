"""What SARIF 2.1.0 requires of a log, checked by hand from the specification (OASIS SARIF
2.1.0, section 3: sarifLog, run, tool, toolComponent, reportingDescriptor, result, message,
location, physicalLocation, artifactLocation, region), plus what GitHub code scanning needs
to place an annotation (a ruleId, and a physical location with a start line per result)."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlparse

LEVELS = {"none", "note", "warning", "error"}


def _message(m: Any, where: str) -> None:
    assert isinstance(m, dict) and isinstance(m.get("text"), str) and m["text"], \
        f"{where}: a message needs text"


def _physical(p: Any, where: str) -> None:
    assert isinstance(p, dict) and "artifactLocation" in p, f"{where}: no artifactLocation"
    a = p["artifactLocation"]
    uri = a["uri"]
    assert isinstance(uri, str) and uri, f"{where}: empty uri"
    parsed = urlparse(uri)
    if parsed.scheme:
        assert parsed.scheme == "file" and parsed.path.startswith("/"), f"{where}: {uri}"
    else:
        assert not uri.startswith("/") and " " not in uri, f"{where}: bad relative uri {uri}"
        assert isinstance(a.get("uriBaseId"), str), f"{where}: relative uri without base"
    region = p["region"]
    assert isinstance(region.get("startLine"), int) and region["startLine"] >= 1, where


def assert_sarif(doc: Any) -> None:
    """Fail with the path of the first thing SARIF 2.1.0 (or code scanning) rejects."""
    assert doc["version"] == "2.1.0"
    assert doc["$schema"].endswith("sarif-schema-2.1.0.json")
    assert isinstance(doc["runs"], list) and doc["runs"]
    for r, run in enumerate(doc["runs"]):
        driver = run["tool"]["driver"]
        assert isinstance(driver["name"], str) and driver["name"]
        rules = driver.get("rules", [])
        ids = [rule["id"] for rule in rules]
        assert len(ids) == len(set(ids)), "rule ids must be unique"
        for rule in rules:
            for key in ("shortDescription", "fullDescription", "help"):
                if key in rule:
                    _message(rule[key], f"rule {rule['id']}.{key}")
            level = rule.get("defaultConfiguration", {}).get("level", "warning")
            assert level in LEVELS
        for base, loc in run.get("originalUriBaseIds", {}).items():
            assert loc["uri"].endswith("/"), f"base {base} must end with a slash"
        for i, res in enumerate(run.get("results", [])):
            where = f"runs[{r}].results[{i}]"
            _message(res["message"], where)
            assert res.get("level", "warning") in LEVELS, where
            assert res["ruleId"] in ids, f"{where}: ruleId not among the rules"
            if "ruleIndex" in res:
                assert ids[res["ruleIndex"]] == res["ruleId"], where
            assert res["locations"], f"{where}: code scanning needs a location"
            for loc in res["locations"] + res.get("relatedLocations", []):
                _physical(loc["physicalLocation"], where)
        for inv in run.get("invocations", []):
            assert isinstance(inv["executionSuccessful"], bool)
