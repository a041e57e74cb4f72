#!/usr/bin/env python3
"""gguf_u32.py - print, or set in place, one u32 key of a GGUF header.

    gguf_u32.py FILE KEY          prints the value, or "absent"
    gguf_u32.py FILE KEY VALUE    overwrites the value (the key must exist
                                  and be a u32, so the file's size and
                                  layout do not change)

Used by bench/vs_llamacpp.sh to read and zero deepseek4.nextn_predict_layers
in a benchmark copy. Reads only the key/value section (GGUF v2/v3).
"""
import struct
import sys

SIZES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}


def find(f, key):
    """Offset and type of KEY's value, or None."""
    if f.read(4) != b"GGUF":
        sys.exit("gguf_u32: not a GGUF file")
    version, _n_tensors, n_kv = struct.unpack("<IQQ", f.read(20))
    if version not in (2, 3):
        sys.exit("gguf_u32: GGUF version %d not supported" % version)

    def string():
        (n,) = struct.unpack("<Q", f.read(8))
        if n > 1 << 20:
            sys.exit("gguf_u32: implausible string length %d" % n)
        return f.read(n)

    def skip(t):
        if t in SIZES:
            f.seek(SIZES[t], 1)
        elif t == 8:
            string()
        elif t == 9:
            et, n = struct.unpack("<IQ", f.read(12))
            if et in SIZES:
                f.seek(SIZES[et] * n, 1)
            else:
                for _ in range(n):
                    skip(et)
        else:
            sys.exit("gguf_u32: unknown value type %d" % t)

    want = key.encode()
    for _ in range(n_kv):
        k = string()
        (t,) = struct.unpack("<I", f.read(4))
        if k == want:
            return f.tell(), t
        skip(t)
    return None


def main():
    if len(sys.argv) not in (3, 4):
        sys.exit(__doc__)
    path, key = sys.argv[1], sys.argv[2]
    with open(path, "r+b" if len(sys.argv) == 4 else "rb") as f:
        at = find(f, key)
        if at is None:
            if len(sys.argv) == 4:
                sys.exit("gguf_u32: %s has no key %s" % (path, key))
            print("absent")
            return
        off, t = at
        if t != 4:
            sys.exit("gguf_u32: %s is of type %d, not u32" % (key, t))
        f.seek(off)
        if len(sys.argv) == 3:
            print(struct.unpack("<I", f.read(4))[0])
        else:
            f.write(struct.pack("<I", int(sys.argv[3])))


main()
