"""``pytest --gradwatch``: every test becomes a gradient-reset check.

Loaded by pytest through the ``pytest11`` entry point and idle unless ``--gradwatch`` is
given. Then each test gets its own watch session
(:class:`gradwatch.integrations.sessions.AutoWatch`), opened before the test's fixtures and
closed after them, that attaches to every optimizer the test builds or steps; its step log
goes to pytest's temporary directory. A test that passes but stepped on a gradient-reset
bug fails with the finding, its lines and its fix;
a test that fails on its own keeps its error and gets the findings as a report section.
``@pytest.mark.no_gradwatch`` leaves a test unwatched (one that breaks training on purpose).

Thread: pytest's (the one that runs the tests).
"""

from __future__ import annotations

import re
from collections.abc import Generator
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from gradwatch.integrations.sessions import AutoWatch

_SESSION = pytest.StashKey["AutoWatch"]()
_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]")


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("gradwatch", "gradient-reset checks (gradwatch)")
    group.addoption("--gradwatch", action="store_true", default=False,
                    help="watch every optimizer a test creates and fail the test on a "
                         "gradient-reset bug (missed, late or misplaced zero_grad)")
    group.addoption("--gradwatch-server", metavar="URL", default=None,
                    help="with --gradwatch: also stream each test's run to this gradwatch "
                         "server")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "no_gradwatch: leave this test unwatched under "
                                       "pytest --gradwatch")
    if not config.getoption("gradwatch"):
        return
    from gradwatch.extras import TORCH

    if TORCH.missing():
        raise pytest.UsageError(TORCH.sentence("pytest --gradwatch"))
    from gradwatch.probe.watchargs import validate_options

    server = config.getoption("gradwatch_server")
    try:
        validate_options(None, server, None, 1)
    except ValueError as e:
        raise pytest.UsageError(f"--gradwatch-server: {e}") from None
    config.pluginmanager.register(_Watcher(server), "gradwatch-watcher")


class _Watcher:
    """The part that runs under ``--gradwatch``: a session per test, and its verdict."""

    def __init__(self, server: str | None) -> None:
        self.server = server

    @pytest.fixture(autouse=True)
    def _gradwatch_session(self, request: pytest.FixtureRequest,
                           tmp_path_factory: pytest.TempPathFactory) -> Generator[None, None, None]:
        # autouse: set up before the test's own function fixtures, torn down after them
        node = request.node
        if node.get_closest_marker("no_gradwatch"):
            yield
            return
        from gradwatch.integrations.sessions import AutoWatch

        folder = tmp_path_factory.mktemp("gradwatch-" + _UNSAFE.sub("_", node.name)[:40])
        session = AutoWatch(folder / "steps.jsonl", server=self.server,
                            run_name=node.nodeid[:200])
        node.stash[_SESSION] = session
        failed = True
        try:
            yield
            failed = False
        finally:
            session.close("failed" if failed else "finished")
            late = session.since_last()  # steps the fixtures' teardown took
        if late.findings:
            pytest.fail(_report(session, late.findings, "in its fixtures' teardown"),
                        pytrace=False)

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_call(self, item: pytest.Item) -> Generator[None, Any, Any]:
        session = item.stash.get(_SESSION, None)
        try:
            result = yield
        except BaseException:
            if session is not None and (found := session.since_last().findings):
                item.add_report_section("call", "gradwatch", _report(session, found, ""))
            raise
        if session is not None and (found := session.since_last().findings):
            pytest.fail(_report(session, found, ""), pytrace=False)
        return result


def _report(session: AutoWatch, found: list[Any], when: str) -> str:
    from gradwatch.report import finding_lines

    n = len(found)
    lines = [f"gradwatch: this test stepped on {n} gradient-reset bug{'s' * (n != 1)}"
             f"{' ' + when if when else ''} ({session.steps} optimizer steps judged; step "
             f"log: {session.handle.path})"]
    for f, _new in found:
        lines += ["  " + x for x in finding_lines(f)]
    return "\n".join(lines)
