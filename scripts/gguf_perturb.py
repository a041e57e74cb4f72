#!/usr/bin/env python3
"""Copy a GGUF file with one F32 tensor moved by one unit in the last place.

    scripts/gguf_perturb.py IN.gguf OUT.gguf TENSOR_NAME

Every value of TENSOR_NAME (an F32 tensor, e.g. blk.0.attn_norm.weight)
gets its lowest mantissa bit flipped: a relative change of ~6e-8, the size
of one float rounding, the kind of difference two summation orders make.
Running the same backend on both files and comparing the logits
(scripts/compare_logits.py) shows how far a model amplifies such a
difference: the floor under any CPU vs CUDA comparison on that model
(docs/CUDA.md, "Exactness on synthetic models").
"""
import shutil
import struct
import sys

# GGUF value types: size in bytes of the fixed-size ones
FIXED = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
STRING, ARRAY = 8, 9
F32 = 0


def read(f, fmt):
    n = struct.calcsize("<" + fmt)
    b = f.read(n)
    if len(b) != n:
        sys.exit("gguf_perturb: the file ends inside its header")
    return struct.unpack("<" + fmt, b)


def skip_value(f, vtype):
    if vtype in FIXED:
        f.seek(FIXED[vtype], 1)
    elif vtype == STRING:
        (n,) = read(f, "Q")
        f.seek(n, 1)
    elif vtype == ARRAY:
        etype, count = read(f, "IQ")
        if etype in FIXED:
            f.seek(FIXED[etype] * count, 1)
        else:
            for _ in range(count):
                skip_value(f, etype)
    else:
        sys.exit(f"gguf_perturb: unknown value type {vtype}")


def main():
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    src, dst, name = sys.argv[1:]
    with open(src, "rb") as f:
        if f.read(4) != b"GGUF":
            sys.exit(f"gguf_perturb: {src} is not a GGUF file")
        version, n_tensors, n_kv = read(f, "IQQ")
        align = 32
        for _ in range(n_kv):
            (klen,) = read(f, "Q")
            key = f.read(klen).decode("utf-8", "replace")
            (vtype,) = read(f, "I")
            if key == "general.alignment" and vtype == 4:
                (align,) = read(f, "I")
            else:
                skip_value(f, vtype)
        found = None
        for _ in range(n_tensors):
            (nlen,) = read(f, "Q")
            tname = f.read(nlen).decode("utf-8", "replace")
            (n_dims,) = read(f, "I")
            dims = read(f, "Q" * n_dims)
            ttype, offset = read(f, "IQ")
            if tname == name:
                count = 1
                for d in dims:
                    count *= d
                found = (ttype, offset, count)
        data = (f.tell() + align - 1) // align * align
    if found is None:
        sys.exit(f"gguf_perturb: no tensor {name} in {src}")
    ttype, offset, count = found
    if ttype != F32:
        sys.exit(f"gguf_perturb: {name} is of type {ttype}, not F32")
    shutil.copyfile(src, dst)
    with open(dst, "r+b") as f:
        f.seek(data + offset)
        raw = bytearray(f.read(4 * count))
        for i in range(0, len(raw), 4):
            raw[i] ^= 1  # little endian: the mantissa's lowest bit
        f.seek(data + offset)
        f.write(raw)
    print(f"{dst}: {name} ({count} values) moved by one ulp (GGUF v{version}, data at {data})")


if __name__ == "__main__":
    main()
