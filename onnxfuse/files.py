"""Files a user names (pattern files, --inputs, the decision cache): only regular files are read, never blocking
(a FIFO is opened without waiting for a writer) and never past a bound (/dev/zero never ends)."""

from __future__ import annotations

import os
import stat

__all__ = ["NotRegularFile", "TooLarge", "not_regular", "open_regular", "read_regular"]


class NotRegularFile(OSError):
    """The path names a FIFO, a device, a socket or a directory; `kind` says which."""

    def __init__(self, path: str, kind: str) -> None:
        super().__init__(f"{path}: is {kind}, not a regular file")
        self.kind = kind


class TooLarge(OSError):
    """The file holds more than the bytes a reader accepts (`limit`)."""

    def __init__(self, path: str, limit: int) -> None:
        super().__init__(f"{path}: larger than {limit} bytes")
        self.limit = limit


def not_regular(mode: int) -> str | None:
    """What a non-regular file is ('a FIFO', 'a character device', ...), None for a regular file."""
    for test, kind in ((stat.S_ISREG, None), (stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return kind
    return "not a regular file"


def open_regular(path: str):
    """`path` opened for reading in binary, refused (NotRegularFile) unless it is a regular file. It is opened
    non-blocking, so a FIFO without a writer does not hang, then checked on the open descriptor (no race with
    a file swapped in between). OSError (missing, permissions) passes through."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0))
    try:
        kind = not_regular(os.fstat(fd).st_mode)
        if kind is not None:
            raise NotRegularFile(path, kind)
        if hasattr(os, "set_blocking"):
            os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_regular(path: str, limit: int) -> bytes:
    """The bytes of the regular file `path`; TooLarge when it holds more than `limit` (at most limit + 1 bytes
    are read)."""
    with open_regular(path) as f:
        data = f.read(limit + 1)
    if len(data) > limit:
        raise TooLarge(path, limit)
    return data
