"""What `fab watch` keeps between passes and restarts, without a lab: the interval it is
given, and its state file (round trip, an unreadable or wrongly shaped file refused in one
line). The watch itself runs on a lab in tests/e2e/test_watch.py."""

from __future__ import annotations

import pytest

from dflash_ops.core.errors import WatchError
from dflash_ops.evaluation.watch import WatchState, parse_interval


def test_interval_parsing():
    assert [parse_interval(t) for t in ("90s", "10m", "1h30m", "45", "0s")] == [
        90,
        600,
        5400,
        45,
        0,
    ]
    with pytest.raises(WatchError, match=r"expected e\.g\. 90s, 10m"):
        parse_interval("ten minutes")


def test_state_round_trip_and_an_unreadable_state_file(tmp_path):
    state = WatchState.load(tmp_path, "nightly run")
    state.evaluated[2000] = "run-a"
    state.attempts[4000] = 1
    state.skipped[6000] = "boom"
    state.save()
    assert state.path.name == "watch-state-nightly_run.json"
    again = WatchState.load(tmp_path, "nightly run")
    assert (again.evaluated, again.attempts, again.skipped) == (
        {2000: "run-a"},
        {4000: 1},
        {6000: "boom"},
    )
    assert [p.name for p in tmp_path.iterdir()] == [state.path.name]  # no partial left behind
    state.path.write_text('{"evaluated": [')
    with pytest.raises(WatchError, match="Move it aside"):
        WatchState.load(tmp_path, "nightly run")


@pytest.mark.parametrize(
    ("content", "why"),
    [
        ('{"evaluated": {}, "attempts": {"4000": "two"}, "skipped": {}}', "attempts.4000"),
        ('{"evaluated": {}, "attempts": {"x": 1}, "skipped": {}}', "invalid literal"),
        ('{"evaluated": ' * 200 + "{}" + "}" * 200, "nested deeper than 32"),
    ],
)
def test_a_watch_state_of_the_wrong_shape_is_one_line(tmp_path, content, why):
    path = WatchState.file_for(tmp_path, None)
    path.write_text(content)
    with pytest.raises(WatchError, match="Move it aside") as refused:
        WatchState.load(tmp_path, None)
    assert why in str(refused.value)
