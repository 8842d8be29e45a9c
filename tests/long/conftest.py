"""The long tier: the unit tier's rules and the harness tests' fixtures (no sshd, no lab; the
lab's tiny models, one torch thread), for modules that compute for tens of seconds or more.
`make test` runs it, `make test-fast` does not (tests/README.md). Every module here carries
`pytestmark = pytest.mark.long(SECONDS)`, so that parallel workers start it first; a test of
a module without one fails, saying it belongs in tests/unit."""

from __future__ import annotations

import pytest

# Imported, not copied: the long tier is the unit tier at another size.
from tests.unit.conftest import _no_lab_hosts, make_lab  # noqa: F401
from tests.unit.harness.conftest import _deterministic_threads, lab  # noqa: F401


@pytest.fixture(autouse=True)
def _marked_long(request: pytest.FixtureRequest) -> None:
    if request.node.get_closest_marker("long") is None:
        pytest.fail(
            "a module in tests/long says how long it takes with "
            "`pytestmark = pytest.mark.long(SECONDS)`; one that takes seconds belongs in tests/unit"
        )
