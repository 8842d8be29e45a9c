"""Pacing a transfer to a bandwidth limit (`transfer.bwlimit`, `--bwlimit`): a token bucket
the relay asks before each splice how many bytes may go, and what it measured afterwards.

The bucket starts empty, so the average rate of a paced stream never exceeds the limit, from
its first second on; time spent waiting for the source refills it, so a source slower than the
limit is never held back further.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

# A paced splice moves at most this share of a second's worth of bytes at once (within
# [MIN_PIECE, MAX_PIECE]): small enough that the rate is even, large enough to stay cheap.
PIECE_SECONDS = 0.05
MIN_PIECE = 64 * 1024
MAX_PIECE = 1 << 20  # the relay's own chunk


@dataclass(frozen=True)
class Paced:
    """What the pacing of one transfer did: the limit, the bytes it let through, over how
    many seconds, and how long it held the stream back in all."""

    limit: int  # bytes per second
    sent: int
    seconds: float
    waited: float

    @property
    def rate(self) -> float:
        """The average rate, measured over the whole paced stream (waits included)."""
        return self.sent / self.seconds if self.seconds > 0 else 0.0


class Pace:
    """A token bucket of `limit` bytes per second. It starts empty and holds at most one
    piece, so over any stretch since it started no more than `limit` × seconds bytes pass:
    the average never exceeds the limit, not even in the first second."""

    def __init__(
        self,
        limit: int,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.limit = limit
        self.piece = max(MIN_PIECE, min(MAX_PIECE, int(limit * PIECE_SECONDS)))
        self._clock, self._sleep = clock, sleep
        self.started = self._last = clock()
        self._tokens = 0.0
        self.sent = 0
        self.waited = 0.0

    def _refill(self) -> None:
        now = self._clock()
        self._tokens = min(self.piece, self._tokens + (now - self._last) * self.limit)
        self._last = now

    def allowance(self) -> int:
        """Bytes that may go now (≥ 1); first waits until a whole piece is allowed."""
        self._refill()
        while self._tokens < self.piece:
            wait = (self.piece - self._tokens) / self.limit
            self._sleep(wait)
            self.waited += wait
            self._refill()
        return int(self._tokens)

    def spent(self, count: int) -> None:
        self._tokens -= count
        self.sent += count

    def report(self) -> Paced:
        return Paced(self.limit, self.sent, self._clock() - self.started, self.waited)
