"""Fabric's remote runner, made fit for large captured output.

invoke's Runner reads a command's output 1000 bytes at a time and, after every read, joins
everything captured so far to offer it to stream watchers, even when there are none: the
cost grows with the square of the output (8 MB from `find` took 18 s of CPU, 1 MB 0.1 s). It
also decodes each read on its own, so a UTF-8 character split between two reads came back
as two replacement characters. This runner reads 64 KiB at a time, offers the stream only
to watchers that exist (we use none), and decodes incrementally.
"""

from __future__ import annotations

import codecs
from collections.abc import Callable, Iterator

from fabric.runners import Remote


class CapturingRemote(Remote):
    read_chunk_size = 64 * 1024

    def respond(self, buffer_: list[str]) -> None:
        if self.watchers:
            super().respond(buffer_)

    def read_proc_output(self, reader: Callable) -> Iterator[str]:
        decoder = codecs.getincrementaldecoder(self.encoding)("replace")
        while data := reader(self.read_chunk_size):
            if text := decoder.decode(data):
                yield text
        if rest := decoder.decode(b"", final=True):
            yield rest
