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
(tests/unit/harness/test_golden.py) fails when a number moves and the version did not.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parents[1]  # dflash_eval/, every package in it

# Raise by one whenever the golden test's numbers move (docs/contributing.md).
NUMERICS_VERSION = 2

# Versions whose greedy (T = 0) numbers are an earlier version's, so greedy runs of the two
# stay comparable: version 2 changed only the sampled estimate (--paths, the t interval), and
# the golden test's greedy numbers did not move (test_golden.py guards them).
GREEDY_NUMERICS_OF = {2: 1}


def compared_numerics(version: int, sampled: bool) -> int:
    """The numerics version under which a run's numbers are compared with others'."""
    return version if sampled else GREEDY_NUMERICS_OF.get(version, version)


# Content hashes of harnesses that wrote results before the numerics version was recorded,
# and whose numbers are version 1's. Each is the harness of a main-line commit from the merge
# of z-lab 07ebd93's maths (859b7e8, schema 3) to the one before the version (94cd53a),
# checked to compute the golden fixture's numbers exactly (greedy and sampled). The fixture
# does not exercise every path (sliding windows, DFlash-2, SGLang); the harness's diff over
# that range is validation, the option table and diagnose, none of them a path that moves a
# number of eval. Any other hash stays a key of its own (reading.numerics).
NUMERICS_OF_UNVERSIONED = {
    "290a8384bd73a2cc7698f5b97a4bc89275b9b6ec709b56e9fc269927ed5750ca": 1,  # 94cd53a
    "1b6011a591825b81c77e51a748842bd6647d59e97bdb2f51433dd2f427bef922": 1,  # 54b2db0
    "9b740fdb0171e317a32cc29a7783cceac0e795ef5989983094679b58938412ec": 1,  # 48ec06b
    "6f9bb5187a1d8d42f61c1ed3e99f4973590da0057555d02cd888a7ce65e7e911": 1,  # 25fd65f
    "43527bdea62ac04ded84aa561b1c8eea86f2d86b757d767618774c73644d7df9": 1,  # 3dbd015
    "8c8b0ae44d884fdef388bb0c72c650117005ac673041dcdaa91b2125d9fa6424": 1,  # 9342f53
    "8523d9f378e20e07219d6029695d65941a90ef974bd202f7e0f23e2040f67e93": 1,  # 859b7e8
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
