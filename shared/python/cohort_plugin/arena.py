"""The rank's parameter arena, as a Python trainer sees it.

The arena is one flat little-endian block in a shared-memory file; its
layout says where each tensor lives. pack() places a model's tensors the
way Go's arena.Pack does (in order, each on a 64-byte boundary), so the
core accepts the layout; Mapping maps the file shared and read-write, so
what the averager writes there is what the model reads. Go's shared/arena
owns the format.
"""

import mmap
import os

from ._pb import arena_pb2

ALIGNMENT = 64
MAX_SIZE = 1 << 40

# DType enum value -> (name, element bytes).
DTYPES = {
    arena_pb2.DTYPE_F32: ("f32", 4),
    arena_pb2.DTYPE_F64: ("f64", 8),
    arena_pb2.DTYPE_BF16: ("bf16", 2),
    arena_pb2.DTYPE_F16: ("f16", 2),
    arena_pb2.DTYPE_I64: ("i64", 8),
    arena_pb2.DTYPE_I32: ("i32", 4),
}

PARAMETER = arena_pb2.TENSOR_ROLE_PARAMETER
BUFFER = arena_pb2.TENSOR_ROLE_BUFFER


class LayoutError(ValueError):
    """A layout or arena file that cannot hold the model."""


class Entry:
    """One tensor of the layout."""

    __slots__ = ("name", "dtype", "shape", "offset", "nbytes", "role")

    def __init__(self, name, dtype, shape, role, offset=0, nbytes=0):
        self.name, self.dtype, self.shape, self.role = name, dtype, tuple(int(d) for d in shape), role
        self.offset, self.nbytes = offset, nbytes

    def elements(self):
        n = 1
        for d in self.shape:
            if d < 0:
                raise LayoutError("tensor %r: negative dimension in shape %s" % (self.name, list(self.shape)))
            n *= d
        return n

    def to_pb(self):
        return arena_pb2.TensorEntry(name=self.name, dtype=self.dtype, shape=list(self.shape),
                                     offset=self.offset, nbytes=self.nbytes, role=self.role)

    @classmethod
    def from_pb(cls, e):
        return cls(e.name, e.dtype, list(e.shape), e.role, e.offset, e.nbytes)

    def key(self):
        return (self.name, self.dtype, self.shape, self.offset, self.nbytes, self.role)


def pack(entries):
    """Places entries in order, each aligned to ALIGNMENT: (entries, size)."""
    off = 0
    seen = set()
    for e in entries:
        if e.dtype not in DTYPES:
            raise LayoutError("tensor %r: unknown dtype %d" % (e.name, e.dtype))
        if not e.name or e.name in seen:
            raise LayoutError("tensor %r: empty or listed twice" % e.name)
        seen.add(e.name)
        off = (off + ALIGNMENT - 1) // ALIGNMENT * ALIGNMENT
        e.offset, e.nbytes = off, e.elements() * DTYPES[e.dtype][1]
        off += e.nbytes
        if off > MAX_SIZE:
            raise LayoutError("layout of %d tensors exceeds the arena limit of %d bytes" % (len(entries), MAX_SIZE))
    return entries, off


def layout_pb(entries, size):
    return arena_pb2.Layout(entries=[e.to_pb() for e in entries], size=size)


def same_layout(entries, size, layout):
    """Whether a descriptor's layout is the one pack made."""
    if layout.size != size or len(layout.entries) != len(entries):
        return False
    return all(Entry.from_pb(g).key() == w.key() for g, w in zip(layout.entries, entries))


class Mapping:
    """An arena file mapped shared and read-write."""

    def __init__(self, path, size):
        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
        try:
            have = os.fstat(fd).st_size
            if have < size:
                raise LayoutError("arena %s holds %d bytes, the layout needs %d" % (path, have, size))
            # mmap refuses a length of 0; an empty layout maps nothing.
            self.buf = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE) if size else bytearray()
        finally:
            os.close(fd)
        self.path, self.size = path, size
