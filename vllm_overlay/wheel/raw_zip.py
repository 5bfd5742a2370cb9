"""Copy a zip member's compressed bytes into another archive, unchanged.

The wheel builder copies every member it does not patch this way: never
inflated and deflated again, so compiled extensions stay byte-identical by
construction and a build costs about as much as copying the file. zipfile
has no public raw copy, so this is the one module that touches its private
state (`ZipFile.start_dir`, `filelist`, `NameToInfo`, `_didModify`);
tests/tooling/test_wheelbuild.py guards each of them, so a Python release
that changes one fails there, not in a build.
"""

import errno
import os
import struct
import zipfile

from vllm_overlay.common.errors import OverlayError

_LOCAL_HEADER = struct.Struct("<4s2B4HL2L2H")
_LOCAL_HEADER_SIGNATURE = b"PK\x03\x04"
_DATA_DESCRIPTOR_FLAG = 0x08
# copy_file_range is refused across some filesystems and on some kernels.
_NO_COPY_FILE_RANGE = frozenset(
    {errno.EXDEV, errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP}
)


def copy_raw(
    archive: zipfile.ZipFile, info: zipfile.ZipInfo, out: zipfile.ZipFile, name: str
) -> None:
    """Append a member's compressed bytes unchanged, under `name`.

    zipfile has no public raw copy, so this writes the local header through
    `ZipInfo.FileHeader` and registers the entry the way `ZipFile.writestr`
    does; `close()` then writes the central directory from it. The data moves
    file to file inside the kernel (`copy_file_range`), never through Python.
    """
    source = archive.fp
    assert source is not None and out.fp is not None
    source.seek(info.header_offset)
    header = _LOCAL_HEADER.unpack(source.read(_LOCAL_HEADER.size))
    if header[0] != _LOCAL_HEADER_SIGNATURE:
        raise OverlayError(f"corrupted wheel: bad local header for {info.filename}")
    data_offset = info.header_offset + _LOCAL_HEADER.size + header[-2] + header[-1]
    copy = zipfile.ZipInfo(name, date_time=info.date_time)
    copy.compress_type = info.compress_type
    copy.external_attr = info.external_attr
    copy.create_system = info.create_system
    copy.flag_bits = info.flag_bits & ~_DATA_DESCRIPTOR_FLAG
    copy.CRC = info.CRC
    copy.compress_size = info.compress_size
    copy.file_size = info.file_size
    out.fp.seek(out.start_dir)
    copy.header_offset = out.fp.tell()
    local_header = copy.FileHeader(None)
    out.fp.write(local_header)
    _copy_range(source.fileno(), data_offset, out.fp.fileno(), info.compress_size)
    expected_end = copy.header_offset + len(local_header) + info.compress_size
    if out.fp.tell() != expected_end:
        raise OverlayError(f"truncated wheel: {info.filename} is cut short")
    out.filelist.append(copy)
    out.NameToInfo[name] = copy
    out.start_dir = out.fp.tell()
    out._didModify = True


def _copy_range(source_fd: int, offset: int, target_fd: int, size: int) -> None:
    """Copy `size` bytes at `offset` of `source_fd` to `target_fd`'s position.

    Stops early at the end of the source; the caller checks the length.
    """
    while size > 0:
        try:
            copied = os.copy_file_range(source_fd, target_fd, size, offset)
        except OSError as exc:
            if exc.errno not in _NO_COPY_FILE_RANGE:
                raise
            copied = os.write(
                target_fd, os.pread(source_fd, min(size, 1 << 24), offset)
            )
        if copied == 0:
            return
        offset += copied
        size -= copied
