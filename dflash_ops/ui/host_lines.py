"""One progress line per host while several hosts work at once (`fab setup-eval-host`).

In a terminal each host keeps one line, rewritten with its latest message (rich Live);
a warning, and whatever else is printed meanwhile (a host's summary), goes above the lines,
which go once all are done. Written to a pipe or a log, every message is a line of its own, as
it comes: nothing is rewritten where nothing can be.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from rich.console import Console, Group
from rich.live import Live

Say = Callable[[str], None]


class HostLines:
    def __init__(self, console: Console) -> None:
        self.console = console
        self.latest: dict[str, str] = {}  # host → its latest message, in the order they began
        self.live: Live | None = None
        self.lock = threading.Lock()  # each host's thread writes its line

    def says(self, name: str) -> Say:
        """Where the host `name`'s progress goes."""
        with self.lock:
            self.latest.setdefault(name, f"{name}: starting")

        def say(message: str) -> None:
            if self.live is None:
                self.console.print(message)
                return
            if "warning:" in message:  # a warning must stay on the screen, not be rewritten
                self.console.print(message)
            with self.lock:
                self.latest[name] = message
                self.live.update(self._lines())

        return say

    def _lines(self) -> Group:
        lines = []
        for message in self.latest.values():
            line = self.console.render_str(message)
            line.no_wrap, line.overflow = True, "ellipsis"  # one screen line each
            lines.append(line)
        return Group(*lines)

    @contextmanager
    def shown(self) -> Iterator[HostLines]:
        if not self.console.is_terminal:
            yield self
            return
        self.live = Live(self._lines(), console=self.console, refresh_per_second=4, transient=True)
        with self.live:
            yield self
        self.live = None
