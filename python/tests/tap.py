"""A pytest plugin that reports in TAP, one line per test, so Automake's
tap-driver.sh reads the Python tests: python3 -m pytest -p tap -p no:terminal

Failures print their report as "# " diagnostics; collection errors are
failures of their own; the plan "1..N" comes last.
"""

_count = 0


def _line(ok, name, extra=""):
    global _count
    _count += 1
    print("%s %d - %s%s" % ("ok" if ok else "not ok", _count, name, extra), flush=True)


def _diag(report):
    text = getattr(report, "longreprtext", "") or str(report.longrepr or "")
    for line in text.rstrip().splitlines():
        print("# " + line, flush=True)


def pytest_collectreport(report):
    if report.failed:
        _line(False, "collect %s" % report.nodeid)
        _diag(report)


def pytest_runtest_logreport(report):
    name = report.nodeid
    if report.when == "setup":
        if report.skipped:
            reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else ""
            _line(True, name, " # SKIP %s" % reason.replace("Skipped: ", ""))
        elif report.failed:
            _line(False, name + " (setup)")
            _diag(report)
    elif report.when == "call":
        if report.skipped:
            reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else ""
            _line(True, name, " # SKIP %s" % reason.replace("Skipped: ", ""))
        else:
            _line(report.passed, name)
            if report.failed:
                _diag(report)
    elif report.when == "teardown" and report.failed:
        _line(False, name + " (teardown)")
        _diag(report)


def pytest_sessionfinish(session, exitstatus):
    print("1..%d" % _count, flush=True)
