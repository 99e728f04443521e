"""The shared libraries an ELF file names as needed (DT_NEEDED), read without any tool.

Used by setup.py (loaded by path, before tcstage is installed) and by the tests, to check that
the native extension links the C++ runtime dynamically: a copy of libstdc++ linked statically
into `_native` (as `-static-libstdc++` in a build environment's LDFLAGS does) runs beside the
shared one that libHalide uses, and the two copies' locale tables get mixed up once another
library puts the shared one in the global symbol scope (PyTorch and the CUDA driver do); the
process then crashes inside `std::ostringstream` in `_native` (seen on an H200 machine whose
image builds extensions that way).
"""

from __future__ import annotations

import struct

_DT_NEEDED, _DT_STRTAB, _DT_NULL = 1, 5, 0
_PT_LOAD, _PT_DYNAMIC = 1, 2


def needed_libraries(path: str) -> list[str]:
    """The DT_NEEDED entries of a 64-bit little-endian ELF file, in order."""
    with open(path, "rb") as f:
        data = f.read()
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        raise ValueError(f"{path}: not a 64-bit little-endian ELF file")
    phoff, = struct.unpack_from("<Q", data, 0x20)
    phentsize, phnum = struct.unpack_from("<HH", data, 0x36)
    loads, dynamic = [], None
    for i in range(phnum):
        kind, _, offset, vaddr, _, filesz, _, _ = struct.unpack_from(
            "<IIQQQQQQ", data, phoff + i * phentsize)
        if kind == _PT_LOAD:
            loads.append((vaddr, offset, filesz))
        elif kind == _PT_DYNAMIC:
            dynamic = (offset, filesz)
    if dynamic is None:
        return []  # statically linked: needs nothing
    entries = [struct.unpack_from("<qQ", data, dynamic[0] + j)
               for j in range(0, dynamic[1], 16)]
    strtab = next(v for tag, v in entries if tag == _DT_STRTAB)  # an address: map it to a file
    base = next(off + strtab - va for va, off, size in loads if va <= strtab < va + size)
    names = []
    for tag, value in entries:
        if tag == _DT_NULL:
            break
        if tag == _DT_NEEDED:
            start = base + value
            names.append(data[start:data.index(b"\0", start)].decode())
    return names
