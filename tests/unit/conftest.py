"""The unit tier: no sshd, no lab (tests/README.md). A test here that asks for a lab fails
at once, saying where it belongs; `fab` runs in-process against inventory files alone.
`make test-fast` runs this tier alone in under 2 minutes: a module marked `long` (tens of
seconds or more) fails here too, saying it belongs in tests/long."""

from __future__ import annotations

import pytest

from dflash_lab import lab as labs

WRONG_TIER = "a unit or long-tier test uses no lab: move it to tests/lab (real sshd) or tests/e2e"
LONG_TIER = "a unit module takes seconds: one marked long belongs in tests/long"


@pytest.fixture
def lab():
    pytest.fail(WRONG_TIER)


@pytest.fixture
def make_lab():
    pytest.fail(WRONG_TIER)


@pytest.fixture(autouse=True)
def _no_lab_hosts(monkeypatch):
    """A lab built by hand (`labs.up`) starts sshd hosts as surely as the fixtures do."""

    def refuse(*args, **kwargs):
        pytest.fail(WRONG_TIER)

    monkeypatch.setattr(labs, "up", refuse)


@pytest.fixture(autouse=True)
def _not_long(request: pytest.FixtureRequest) -> None:
    if request.node.get_closest_marker("long") is not None:
        pytest.fail(LONG_TIER)
