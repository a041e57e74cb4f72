#!/usr/bin/env python3
"""sass_loops.py - a kernel's loops in a cubin, and their instructions by opcode.

    scripts/sass_loops.py FILE.cubin NAME_PART [NAME_PART ...]

For each kernel whose mangled name contains a NAME_PART: its instruction
count, every backward branch as a loop (first, last, length), and for the
loops of over 100 instructions the most frequent opcodes. How a change's
instructions a unit are estimated where no disassembler is installed
(docs/CUDA.md "One token's gate+up on 256-byte grid rows").

The opcode names (the low 12 bits of an sm_90 instruction) were read off
ncu's SASS listing of ds4_gb_kernel<24, 2, 1> (forty-eighth session's
call 53) set against the cubin of the build it ran (59412ed), instruction
by instruction; 0x816 does not occur there and is taken as PRMT's form
with an immediate selector (the 0x2xx / 0x8xx pairs of the other opcodes
name the same instruction). A branch's offset is bits 16-23 and 34 on
(in 4-byte units, signed), found the same way. Other opcodes print as
'?xxx'."""
import collections
import importlib.util
import os
import sys

OPS = {
    0x207: 'SEL', 0x208: 'FSEL', 0x20b: 'FSETP', 0x20c: 'ISETP', 0x210: 'IADD3', 0x211: 'LEA',
    0x212: 'LOP3', 0x219: 'SHF', 0x220: 'FMUL', 0x221: 'FADD', 0x223: 'FFMA', 0x224: 'IMAD',
    0x226: 'IDP', 0x227: 'IMAD', 0x230: 'HADD2', 0x245: 'I2FP', 0x28c: 'UISETP', 0x290: 'UIADD3',
    0x291: 'ULEA', 0x292: 'ULOP3', 0x2bf: 'UPOPC', 0x302: 'FCHK', 0x305: 'F2I', 0x306: 'I2F',
    0x308: 'MUFU', 0x309: 'POPC', 0x348: 'WARPSYNC', 0x388: 'STS', 0x389: 'SHFL', 0x416: 'PRMT',
    0x421: 'FADD', 0x423: 'FFMA', 0x424: 'IMAD', 0x589: 'SHFL', 0x802: 'MOV', 0x805: 'CS2R',
    0x807: 'SEL', 0x808: 'FSEL', 0x80b: 'FSETP', 0x80c: 'ISETP', 0x810: 'IADD3', 0x811: 'LEA',
    0x812: 'LOP3', 0x816: 'PRMT', 0x819: 'SHF', 0x81c: 'PLOP3', 0x820: 'FMUL', 0x823: 'FFMA',
    0x824: 'IMAD', 0x825: 'IMAD', 0x82d: 'PREEXIT', 0x82e: 'ACQBULK', 0x836: 'VIADD',
    0x848: 'VIMNMX', 0x882: 'UMOV', 0x886: 'VOTEU', 0x890: 'UIADD3', 0x892: 'ULOP3', 0x899: 'USHF',
    0x8a4: 'UIMAD', 0x8a5: 'UIMAD', 0x908: 'MUFU', 0x918: 'NOP', 0x919: 'S2R', 0x91a: 'DEPBAR',
    0x91b: 'ENDCOLLECTIVE', 0x941: 'BSYNC', 0x944: 'CALL', 0x945: 'BSSY', 0x947: 'BRA',
    0x948: 'WARPSYNC', 0x94d: 'EXIT', 0x950: 'RET', 0x981: 'LDG', 0x984: 'LDS', 0x986: 'STG',
    0x9a8: 'ATOMG', 0x9af: 'LDGDEPBAR', 0x9c3: 'S2UR', 0xab9: 'ULDC', 0xb1d: 'BAR', 0xb82: 'LDC',
    0xc0c: 'ISETP', 0xc10: 'IADD3', 0xc11: 'LEA', 0xc12: 'LOP3', 0xc24: 'IMAD', 0xc25: 'IMAD',
    0xc27: 'IMAD', 0xc36: 'VIADD', 0xc82: 'UMOV', 0xd00: 'FLO', 0xd06: 'I2F', 0xe24: 'IMAD',
    0xf89: 'SHFL', 0xfae: 'LDGSTS',
}


def sx(v, n):
    return v - (1 << n) if v >> (n - 1) else v


def analyze(code):
    ws = [int.from_bytes(code[16 * i:16 * i + 16], "little") for i in range(len(code) // 16)]
    names = [OPS.get(w & 0xFFF, "?%03x" % (w & 0xFFF)) for w in ws]
    loops = []
    for i, w in enumerate(ws):
        if names[i] == "BRA":
            off = sx(((w >> 16) & 0xFF) | (((w >> 34) & ((1 << 40) - 1)) << 8), 48) * 4
            t = i + 1 + off // 16
            if t < i:  # (a branch to itself is the trap after a kernel's last EXIT)
                loops.append((t, i))
    return names, loops


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    here = os.path.dirname(os.path.abspath(__file__))
    spec = importlib.util.spec_from_file_location("cubin_text", os.path.join(here, "cubin_text.py"))
    ct = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ct)
    kernels = ct.kernels(sys.argv[1])
    for part in sys.argv[2:]:
        for name, code in sorted(kernels.items()):
            if part not in name:
                continue
            names, loops = analyze(code)
            print(f"{name}: {len(names)} instructions; loops (first, last, length): "
                  + " ".join(f"({a},{b},{b - a + 1})" for a, b in loops))
            for a, b in loops:
                if b - a >= 100:
                    c = collections.Counter(names[a:b + 1])
                    print(f"  loop {a}-{b} ({b - a + 1}): " + ", ".join(f"{k} {v}" for k, v in c.most_common(16)))


if __name__ == "__main__":
    main()
