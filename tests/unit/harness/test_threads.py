"""The torch threads of a run that is not told (dflash_eval.run.threads): the host's physical
cores less a reserve for SGLang and the system, hyper-threads not counted; the dry run's
estimate assumes the same count (test_plan: the plan and the run agree)."""

from __future__ import annotations

import pytest
from dflash_eval.run.threads import RESERVE, default_threads, physical_cores

# Two sockets, two cores each, two hyper-threads per core: 8 processors, 4 physical cores.
HYPERTHREADED = "\n\n".join(
    f"processor\t: {number}\nphysical id\t: {number // 4}\ncore id\t\t: {number % 2}\n"
    f"flags\t\t: fpu avx2"
    for number in range(8)
)
ARM64 = "processor\t: 0\nFeatures\t: fp asimd\n\nprocessor\t: 1\nFeatures\t: fp asimd\n"


@pytest.mark.parametrize(
    ("cores", "threads"), [(1, 1), (2, 2), (3, 3), (4, 3), (7, 6), (8, 6), (45, 43), (90, 88)]
)
def test_the_reserve_is_two_cores_and_a_quarter_of_a_small_host(cores, threads):
    assert RESERVE == 2
    assert default_threads(cores) == threads


def test_hyper_threads_are_not_counted_and_only_allowed_processors_are():
    assert physical_cores(HYPERTHREADED, set(range(8))) == 4
    assert physical_cores(HYPERTHREADED, {0, 2}) == 1  # siblings: socket 0, core 0
    assert physical_cores(HYPERTHREADED, {0, 1, 4}) == 3


def test_without_core_ids_the_caller_counts_processors():
    assert physical_cores(ARM64, {0, 1}) is None
