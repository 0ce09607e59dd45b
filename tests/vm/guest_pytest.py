"""Run a pytest selection inside the guest against the project checkout, read back its JUnit XML.

The checkout and its .venv are visible in the guest through the read-only host root, so nothing
may be written next to them: no cache provider, no bytecode, Hypothesis' database in the guest's
/tmp, and the JUnit report in the shared directory.
"""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ElementTree
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from vm.guest_errors import GuestError

if TYPE_CHECKING:
    from vm.guest import GuestKernel, GuestResult

PROJECT_ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class GuestTestCase:
    """One test as the guest's pytest reported it: outcome is passed, failed, error or skipped."""

    nodeid: str
    outcome: str
    message: str


@dataclass(frozen=True)
class GuestPytestRun:
    result: GuestResult
    cases: tuple[GuestTestCase, ...]
    junit_xml: str

    @property
    def returncode(self) -> int:
        return self.result.returncode

    def outcomes(self) -> dict[str, str]:
        return {case.nodeid: case.outcome for case in self.cases}

    def count(self, outcome: str) -> int:
        return sum(case.outcome == outcome for case in self.cases)

    def report(self) -> str:
        """pytest's own output plus the guest console, for assertion messages."""
        return (
            f"guest pytest exited with {self.result.returncode}\n"
            f"--- stdout ---\n{self.result.stdout}\n--- stderr ---\n{self.result.stderr}\n"
            f"--- guest console ---\n{self.result.console_log}"
        )


def run_pytest(
    guest: GuestKernel,
    args: Sequence[str],
    *,
    cwd: str | Path | None = None,
    python: str | None = None,
    timeout: float | None = None,
    env: Mapping[str, str] | None = None,
    disable_plugins: Sequence[str] = ("hypothesispytest",),
) -> GuestPytestRun:
    """Run `python -m pytest ARGS` in the guest from `cwd` (the project root by default).

    `python` defaults to the interpreter running these tests, i.e. the project's venv. Plugins in
    `disable_plugins` are not loaded: Hypothesis' plugin alone costs 7 s of start-up under TCG
    (`@given` tests still run without it). Returns the outcome of every test; raises GuestError
    when pytest produced no report at all.
    """
    report = guest.shared_dir / f"junit-{guest.boots}-{_next_report()}.xml"
    argv = [
        python or sys.executable,
        "-m",
        "pytest",
        "-p",
        "no:cacheprovider",
        f"--junitxml={report}",
        "-o",
        "junit_family=xunit2",
        *(option for plugin in disable_plugins for option in ("-p", f"no:{plugin}")),
        *args,
    ]
    variables = {
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONUNBUFFERED": "1",
        "HYPOTHESIS_STORAGE_DIRECTORY": "/tmp/hypothesis",
        **(env or {}),
    }
    result = guest.run(argv, cwd=cwd or PROJECT_ROOT, timeout=timeout, env=variables)
    try:
        xml = report.read_text()
    except OSError:
        raise GuestError(
            f"pytest in the guest wrote no JUnit report (exit {result.returncode})\n"
            f"stdout:\n{result.stdout}\nstderr:\n{result.stderr}\nconsole:\n{result.console_log}"
        ) from None
    report.unlink()
    return GuestPytestRun(result=result, cases=parse_junit(xml), junit_xml=xml)


def parse_junit(xml: str) -> tuple[GuestTestCase, ...]:
    """The test cases in a pytest JUnit XML report, in report order."""
    cases = []
    for element in ElementTree.fromstring(xml).iter("testcase"):
        classname, name = element.get("classname", ""), element.get("name", "")
        nodeid = f"{classname}::{name}" if classname else name
        outcome, message = "passed", ""
        for child, label in (("failure", "failed"), ("error", "error"), ("skipped", "skipped")):
            found = element.find(child)
            if found is not None:
                outcome = label
                message = found.get("message", "") or (found.text or "")
                break
        cases.append(GuestTestCase(nodeid=nodeid, outcome=outcome, message=message))
    return tuple(cases)


_reports = 0


def _next_report() -> int:
    global _reports
    _reports += 1
    return _reports
