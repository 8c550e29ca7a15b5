from tests.report.fixtures import browser, offline_browser, recorded_run, shots  # noqa: F401
