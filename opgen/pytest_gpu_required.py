"""A pytest plugin `opgen test` loads: a run in which the generated GPU tests all skipped for want
of CUDA fails, saying so, instead of passing on the few CPU tests (`opgen test --allow-skip`
accepts such a run)."""

import pytest

# The reason the generated tests' `requires_cuda` mark gives (templates/_base/test_op.py.jinja).
NO_CUDA = "needs a CUDA GPU"


class NoGpuTestRan:
    def __init__(self):
        self.skipped_for_cuda = 0

    def pytest_runtest_logreport(self, report):
        if report.skipped and NO_CUDA in str(report.longrepr):
            self.skipped_for_cuda += 1

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session, exitstatus):
        if self.skipped_for_cuda and exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def pytest_terminal_summary(self, terminalreporter):
        if self.skipped_for_cuda:
            terminalreporter.write_line(
                f"opgen test: no GPU test ran ({self.skipped_for_cuda} skipped: {NO_CUDA}); run it on "
                "a machine with CUDA, or pass --allow-skip to accept a CPU-only run",
                red=True,
            )


def pytest_configure(config):
    config.pluginmanager.register(NoGpuTestRan(), "opgen-gpu-required")
