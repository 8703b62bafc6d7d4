"""Where the lake's files go: any filesystem PyArrow writes (``pyarrow.fs``), durably.

A file holds the rows of one batch of one queue shard's stream for one UTC day, at
``<root>/date=YYYY-MM-DD/<queue>~<shard>~<first id>~<last id>.parquet``: named by the
stream ids it holds, so that a batch written again after a crash has the same name (it
replaces the file, never adds a second one), and a reader of the name knows which
entries it may hold without opening it.

Readers (PyArrow, Spark, Hadoop) skip a file whose name begins with ``_`` or ``.``, and
queue names may begin with either: such a queue's files begin with one more ``~``
(which no queue name holds), so they are read like the others.

Local files are written to a hidden temporary name, flushed to disk (``fsync``), renamed
and their directory synced: the file is whole or absent. Other filesystems (object
stores) make an object visible only when its upload completes, on ``close``.
"""

from __future__ import annotations

import os
import uuid
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from pyarrow import fs as pafs

from ..engine.urls import redact
from .schema import ARROW_SCHEMA, PARTITION

SUFFIX = ".parquet"
SEP = "~"
NO_SHARD = "x"
#: The first characters of a file name that readers take for hidden.
HIDDEN = (".", "_")


@dataclass(frozen=True)
class FileName:
    """The parts of a lake file's name."""

    queue: str
    shard: int | None
    first: str
    last: str

    @property
    def name(self) -> str:
        shard = NO_SHARD if self.shard is None else str(self.shard)
        name = SEP.join((self.queue, shard, self.first, self.last)) + SUFFIX
        return SEP + name if name.startswith(HIDDEN) else name

    @classmethod
    def parse(cls, name: str) -> FileName | None:
        if not name.endswith(SUFFIX) or name.startswith(HIDDEN):
            return None
        parts = name.removeprefix(SEP)[:-len(SUFFIX)].split(SEP)
        if len(parts) != 4:
            return None
        queue, shard, first, last = parts
        return cls(queue, None if shard == NO_SHARD else int(shard), first, last)


def open_lake(where: str) -> tuple[pafs.FileSystem, str]:
    """The filesystem and root path of a local path or a URL (``s3://``, ``gs://``,
    ``hdfs://``, ``file://``...); raises ValueError for one PyArrow cannot open.

    A URL may carry the store's options (``s3://bucket/lake?endpoint_override=host:9000&
    scheme=http``); messages show it with its credentials hidden (``redact``)."""
    if "://" not in where:
        path = Path(where).expanduser().resolve()
        return pafs.LocalFileSystem(), str(path)
    try:
        filesystem, root = pafs.FileSystem.from_uri(where)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, OSError) as exc:
        shown = redact(where)
        reason = str(exc).replace(where, shown)
        raise ValueError(f"cannot open the lake at {shown!r}: {reason}") from None
    return filesystem, root.rstrip("/")


def is_local(filesystem: pafs.FileSystem) -> bool:
    return isinstance(filesystem, pafs.LocalFileSystem)


def day_dir(root: str, day: str) -> str:
    return f"{root}/{PARTITION}={day}"


def write(filesystem: pafs.FileSystem, root: str, day: str, name: FileName,
          table: pa.Table) -> str:
    """Write ``table`` as one durable file; return its path."""
    directory = day_dir(root, day)
    path = f"{directory}/{name.name}"
    filesystem.create_dir(directory, recursive=True)
    if not is_local(filesystem):
        with filesystem.open_output_stream(path) as out:
            pq.write_table(table, out)
        return path
    temp = f"{directory}/.{name.name}.{uuid.uuid4().hex[:8]}.tmp"
    try:
        with open(temp, "wb") as out:
            pq.write_table(table, out)
            out.flush()
            os.fsync(out.fileno())
        os.replace(temp, path)
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)  # the rename itself survives a power loss
    finally:
        os.close(fd)
    return path


def files_of(filesystem: pafs.FileSystem, root: str, day: str, queue: str,
             shard: int | None) -> list[tuple[str, FileName]]:
    """The files of one queue shard for one day: ``(path, name)`` pairs."""
    selector = pafs.FileSelector(day_dir(root, day), allow_not_found=True)
    found = []
    for info in filesystem.get_file_info(selector):
        name = FileName.parse(info.base_name)
        if name is not None and name.queue == queue and name.shard == shard:
            found.append((info.path, name))
    return found


def stream_ids_in(filesystem: pafs.FileSystem, path: str) -> set[str]:
    """The stream ids a file holds (its one column read)."""
    with filesystem.open_input_file(path) as source:
        column = pq.read_table(source, columns=["stream_id"]).column("stream_id")
    return set(column.to_pylist())


def read_all(where: str) -> pa.Table:
    """The whole lake as one Arrow table (small lakes and tests; Spark reads big ones)."""
    import pyarrow.dataset as ds

    filesystem, root = open_lake(where)
    dataset = ds.dataset(root, filesystem=filesystem, format="parquet", schema=None,
                         partitioning="hive", exclude_invalid_files=False)
    return dataset.to_table()


__all__ = ["ARROW_SCHEMA", "FileName", "files_of", "open_lake", "read_all", "stream_ids_in",
           "write"]
