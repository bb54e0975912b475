"""Reading a file oracle did not write: regular files only, never more than a stated size.

Every file a user or another machine hands oracle (a config, a report.json, a golden file, a prompts
file, an example database's entry, a shard's results) is read through `open_regular` or
`read_regular`. A FIFO nobody writes to would block `open()` forever, `/dev/zero` would fill memory
and a 50 GB file named as a config would take minutes to be refused: each is a ConfigError (exit 2)
within a second, one line naming the file and the bound.

The file is opened with O_NONBLOCK (so opening a FIFO returns at once), checked with `fstat` on the
open descriptor (so a file swapped after a check is still the file checked), and read up to the
bound plus one byte (so a file that grows while it is read is still caught).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import BinaryIO

from oracle.errors import ConfigError

KIB, MIB, GIB = 1 << 10, 1 << 20, 1 << 30

_KINDS = ((stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


def size_text(n: int) -> str:
    """`8 MiB`, `1 GiB`, `512 KiB`, `100 bytes`: a bound as the error states it."""
    for unit, name in ((GIB, "GiB"), (MIB, "MiB"), (KIB, "KiB")):
        if n >= unit and n % unit == 0:
            return f"{n // unit} {name}"
    return f"{n:,} bytes"


def _kind(mode: int) -> str:
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


def open_regular(path: Path, limit: int, what: str) -> BinaryIO:
    """`path` opened for reading in binary, when it is a regular file of at most `limit` bytes; else
    ConfigError naming `what` (`config file`, `report`, ...), the file and the bound. A symlink to a
    regular file is read as that file."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0))
    except FileNotFoundError:
        raise ConfigError(f"{path}: {what} not found") from None
    except IsADirectoryError:
        raise ConfigError(f"{path}: is a folder, not a {what}") from None
    except OSError as e:
        raise ConfigError(f"{path}: cannot read the {what} ({e.strerror or e})") from e
    try:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            raise ConfigError(f"{path}: is a folder, not a {what}")
        if not stat.S_ISREG(st.st_mode):
            raise ConfigError(f"{path}: is {_kind(st.st_mode)}, not a regular file; a {what} is read only "
                              "from a regular file")
        if st.st_size > limit:
            raise ConfigError(f"{path}: {what} is {st.st_size:,} bytes, over the bound of {size_text(limit)}")
        if hasattr(os, "set_blocking"):
            os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_regular(path: Path, limit: int, what: str) -> bytes:
    """The bytes of `path` (see `open_regular`); ConfigError when it is not a regular file or holds more
    than `limit` bytes, counted as they are read."""
    with open_regular(path, limit, what) as f:
        try:
            data = f.read(limit + 1)
        except OSError as e:
            raise ConfigError(f"{path}: cannot read the {what} ({e.strerror or e})") from e
    if len(data) > limit:
        raise ConfigError(f"{path}: {what} is over the bound of {size_text(limit)} (it grew while read)")
    return data
