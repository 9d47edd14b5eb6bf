"""Data helpers for trainer files: IDX files (MNIST, Fashion-MNIST)."""

import gzip
import struct
import zlib

import torch

# IDX element types: code -> (torch dtype, bytes, big-endian struct char).
_IDX_TYPES = {0x08: (torch.uint8, 1), 0x09: (torch.int8, 1), 0x0B: (torch.int16, 2),
              0x0C: (torch.int32, 4), 0x0D: (torch.float32, 4), 0x0E: (torch.float64, 8)}
MAX_IDX_BYTES = 16 << 30


def load_idx(path):
    """The IDX file at path (gzipped or not, told by its magic) as a tensor
    of its own shape. A header that disagrees with the data, or a gzip
    stream that breaks off, is a ValueError naming the file."""
    try:
        return _load_idx(path)
    except (EOFError, zlib.error, gzip.BadGzipFile, struct.error) as e:
        raise ValueError("%s: %s" % (path, e)) from e


def _load_idx(path):
    with open(path, "rb") as f:
        gz = f.read(2) == b"\x1f\x8b"
    with (gzip.open(path, "rb") if gz else open(path, "rb")) as f:
        head = f.read(4)
        if len(head) != 4 or head[:2] != b"\0\0" or head[2] not in _IDX_TYPES or not 1 <= head[3] <= 8:
            raise ValueError("%s: not an IDX file (magic %r)" % (path, head))
        dtype, size = _IDX_TYPES[head[2]]
        dims = struct.unpack(">%dI" % head[3], f.read(4 * head[3]))
        n = size
        for d in dims:
            n *= d
        if n > MAX_IDX_BYTES:
            raise ValueError("%s: header claims %d bytes, over the limit of %d" % (path, n, MAX_IDX_BYTES))
        body = f.read(n + 1)
    if len(body) != n:
        raise ValueError("%s: header says %d data bytes, the file holds %d%s" % (
            path, n, len(body), " or more" if len(body) > n else ""))
    t = torch.frombuffer(bytearray(body), dtype=torch.uint8)
    if dtype != torch.uint8:
        # IDX is big-endian; the tensor's bytes are read in host order.
        t = t.view(-1, size).flip(1).contiguous().view(dtype) if struct.pack("=H", 1) == b"\1\0" else t.view(dtype)
    return t.view(*dims)
