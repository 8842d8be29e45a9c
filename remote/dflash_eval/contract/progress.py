"""Progress reporting: JSON lines on stdout for machines, plain text on stderr for people.

Every stdout line is one JSON object with an "event" key (format in docs/results-schema.md),
so the workstation can draw a progress bar from a log that also holds stderr text.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any, TextIO


class Progress:
    """Emits events (stdout JSON lines, optionally mirrored to a file) and human messages."""

    def __init__(
        self,
        events: TextIO | None = None,
        human: TextIO | None = None,
        progress_file: Path | None = None,
        quiet: bool = False,
    ) -> None:
        self._events = events if events is not None else sys.stdout
        self._human = human if human is not None else sys.stderr
        self._file = progress_file.open("a", encoding="utf-8") if progress_file else None
        self._quiet = quiet
        self._last_progress: dict[str, float] = {}

    def event(self, kind: str, **fields: Any) -> None:
        line = json.dumps({"event": kind, "time": round(time.time(), 3), **fields})
        if not self._quiet:
            print(line, file=self._events, flush=True)
        if self._file is not None:
            print(line, file=self._file, flush=True)

    def progress(self, phase: str, done: int, total: int) -> None:
        """A progress event, throttled to ~5 per second per phase (first and last always)."""
        now = time.monotonic()
        last = self._last_progress.get(phase, 0.0)
        if done not in (0, total) and now - last < 0.2:
            return
        self._last_progress[phase] = now
        self.event("progress", phase=phase, done=done, total=total)

    def status(self, message: str) -> None:
        """What the harness is busy with before a phase counts (loading a model): told to
        people, and as an event the workstation shows beside a spinner."""
        self.event("status", message=message)
        self.say(message)

    def say(self, message: str) -> None:
        if not self._quiet:
            print(message, file=self._human, flush=True)

    def warn(self, message: str) -> None:
        """A loud warning: shown to people and recorded as an event."""
        self.event("warning", message=message)
        if not self._quiet:
            print(f"WARNING: {message}", file=self._human, flush=True)

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


class Timer:
    """Wall-clock durations of named phases, in seconds."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    def phase(self, name: str) -> _PhaseTimer:
        return _PhaseTimer(self, name)


class _PhaseTimer:
    def __init__(self, timer: Timer, name: str) -> None:
        self._timer, self._name = timer, name

    def __enter__(self) -> None:
        self._start = time.perf_counter()

    def __exit__(self, *exc: object) -> None:
        elapsed = time.perf_counter() - self._start
        self._timer.seconds[self._name] = self._timer.seconds.get(self._name, 0.0) + elapsed
