#!/usr/bin/env python3
"""cubin_text.py - which kernels two cubins compile differently.

    scripts/cubin_text.py OLD.cubin NEW.cubin

Reads each kernel's machine code (the ELF section .text.<mangled name>)
from both files and prints one line a kernel whose bytes differ or that
only one file has: its instructions in each (16 bytes an instruction on
sm_70 and later; 0 where absent) and its name. Nothing printed: every
kernel's code is byte for byte the same (how a change is shown to leave
the default kernels as a GPU last ran them: scripts/sass_same.sh)."""
import struct
import sys


def kernels(path):
    b = open(path, "rb").read()
    if b[:4] != b"\x7fELF" or b[4] != 2:
        sys.exit(f"cubin_text: {path}: not a 64-bit ELF file")
    shoff = struct.unpack_from("<Q", b, 0x28)[0]
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", b, 0x3A)
    secs = [struct.unpack_from("<IIQQQQ", b, shoff + i * shentsize) for i in range(shnum)]
    strtab = secs[shstrndx][4]
    out = {}
    for name, _typ, _flags, _addr, off, size in secs:
        n = b[strtab + name:b.index(b"\0", strtab + name)].decode()
        if n.startswith(".text."):
            out[n[6:]] = b[off:off + size]
    return out


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    a, c = kernels(sys.argv[1]), kernels(sys.argv[2])
    for k in sorted(set(a) | set(c)):
        x, y = a.get(k, b""), c.get(k, b"")
        if x != y:
            print(f"{len(x) // 16:6d} -> {len(y) // 16:6d} instructions  {k}")


if __name__ == "__main__":
    main()
