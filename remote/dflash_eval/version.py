"""The harness's identity: a content hash of its source files (stdlib only, so that the
workstation computes the same hash before deploying as the harness reports in results), and
its numerics version.

The content hash changes with every edit, a log line's included: it says which code ran.
The numerics version changes only when a number the harness writes can change for the same
inputs: the metric definitions (τ and its conventions, acceptance, DDTree, intervals,
sampled expectations), the drafter's maths (masks, RoPE, norms, the batched forward), the
completion rules (greedy or sampled reference, stops, the extension past the completion)
and the feature rules (which hidden states, in which dtype and kernel). Results of equal
numerics versions are comparable however their content hashes differ; the golden test
(tests/harness/test_golden.py) fails when a number moves and the version did not.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent

# Raise by one whenever the golden test's numbers move (docs/contributing.md).
NUMERICS_VERSION = 1

# Content hashes of harnesses that wrote results before the numerics version was recorded,
# and whose numbers are version 1's: checked by running each one on the golden fixture.
NUMERICS_OF_UNVERSIONED = {
    "290a8384bd73a2cc7698f5b97a4bc89275b9b6ec709b56e9fc269927ed5750ca": 1,
}


def harness_files(package_dir: Path = PACKAGE_DIR) -> list[str]:
    """The *.py files as sorted POSIX paths relative to the package directory."""
    return sorted(
        path.relative_to(package_dir).as_posix()
        for path in package_dir.rglob("*.py")
        if "__pycache__" not in path.parts and path.is_file()
    )


def harness_hash(package_dir: Path = PACKAGE_DIR) -> str:
    """sha256 over `relative path NUL contents NUL` of every file, in that order: two hosts
    running the same harness code report the same hash."""
    digest = hashlib.sha256()
    for relative in harness_files(package_dir):
        digest.update(relative.encode() + b"\0" + (package_dir / relative).read_bytes() + b"\0")
    return digest.hexdigest()
