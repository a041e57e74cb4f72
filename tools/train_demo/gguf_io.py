"""Minimal GGUF v3 reading and writing for the demo-model tools (no numpy
needed beyond torch): metadata, tensor table, and dequantisation of the
types the demo model uses (F32, F16, Q8_0, MXFP4, I32)."""
import struct

import torch

F32, F16, Q8_0, I32, MXFP4 = 0, 1, 8, 26, 39
KV_MXFP4 = [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12]  # doubled E2M1 values


class Reader:
    def __init__(self, path):
        self.data = open(path, "rb").read()
        self.off = 0
        if self._take(4) != b"GGUF":
            raise ValueError(f"{path}: not a GGUF file")
        ver, = self._u("<I")
        if ver != 3:
            raise ValueError(f"{path}: GGUF version {ver}")
        n_t, n_kv = self._u("<QQ")
        self.meta = {}
        for _ in range(n_kv):
            k = self._str()
            t, = self._u("<I")
            self.meta[k] = self._val(t)
        self.tensors = {}
        for _ in range(n_t):
            name = self._str()
            nd, = self._u("<I")
            ne = list(self._u("<%dQ" % nd))
            t, off = self._u("<IQ")
            self.tensors[name] = (ne, t, off)
        align = int(self.meta.get("general.alignment", 32))
        self.base = (self.off + align - 1) // align * align

    def _take(self, n):
        b = self.data[self.off:self.off + n]
        self.off += n
        return b

    def _u(self, fmt):
        v = struct.unpack_from(fmt, self.data, self.off)
        self.off += struct.calcsize(fmt)
        return v

    def _str(self):
        n, = self._u("<Q")
        return self._take(n).decode("utf-8")

    def _val(self, t):
        fmts = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
        if t in fmts:
            return self._u(fmts[t])[0]
        if t == 8:
            return self._str()
        if t == 9:
            et, n = self._u("<IQ")
            return [self._val(et) for _ in range(n)]
        raise ValueError(f"GGUF value type {t}")

    def tensor(self, name):
        """Dequantised float32 tensor in torch order (ne reversed)."""
        ne, t, off = self.tensors[name]
        n = 1
        for x in ne:
            n *= x
        start = self.base + off
        shape = list(reversed(ne))
        if t == F32:
            return torch.frombuffer(bytearray(self.data[start:start + 4 * n]), dtype=torch.float32).reshape(shape)
        if t == F16:
            return torch.frombuffer(bytearray(self.data[start:start + 2 * n]), dtype=torch.float16).float().reshape(shape)
        if t == I32:
            return torch.frombuffer(bytearray(self.data[start:start + 4 * n]), dtype=torch.int32).reshape(shape)
        if t == Q8_0:
            nb = n // 32
            raw = torch.frombuffer(bytearray(self.data[start:start + 34 * nb]), dtype=torch.uint8).reshape(nb, 34)
            d = raw[:, :2].contiguous().view(torch.float16).float()
            q = raw[:, 2:].contiguous().view(torch.int8).float()
            return (q * d).reshape(shape)
        if t == MXFP4:
            nb = n // 32
            raw = torch.frombuffer(bytearray(self.data[start:start + 17 * nb]), dtype=torch.uint8).reshape(nb, 17)
            e = raw[:, 0].to(torch.int64)
            # 2^(e-128): half the E8M0 scale, the value table being doubled
            d = torch.where(e < 2, torch.tensor(2.0 ** -127) * (2.0 ** (e.float() - 1)), torch.pow(2.0, e.float() - 128))
            kv = torch.tensor(KV_MXFP4, dtype=torch.float32)
            qs = raw[:, 1:].to(torch.int64)
            lo, hi = kv[qs & 15], kv[qs >> 4]
            return (torch.cat([lo, hi], dim=1) * d[:, None]).reshape(shape)
        raise ValueError(f"{name}: GGUF type {t} not handled here")


def write(path, tensors, meta=None):
    """tensors: list of (name, float32 tensor) written as F32 (ne = reversed shape)."""
    meta = meta or {}
    out = bytearray(b"GGUF")
    out += struct.pack("<IQQ", 3, len(tensors), len(meta))

    def s(x):
        b = x.encode("utf-8")
        return struct.pack("<Q", len(b)) + b

    for k, v in meta.items():
        out += s(k)
        if isinstance(v, str):
            out += struct.pack("<I", 8) + s(v)
        else:
            out += struct.pack("<II", 4, int(v))
    off = 0
    blobs = []
    for name, t in tensors:
        t = t.detach().float().contiguous().cpu()
        ne = list(reversed(t.shape))
        out += s(name) + struct.pack("<I", len(ne)) + struct.pack("<%dQ" % len(ne), *ne) + struct.pack("<IQ", F32, off)
        b = t.numpy().tobytes() if hasattr(t, "numpy") else bytes(t.untyped_storage())
        blobs.append(b)
        off += (len(b) + 31) // 32 * 32
    out += b"\0" * ((32 - len(out) % 32) % 32)
    for b in blobs:
        out += b + b"\0" * ((32 - len(b) % 32) % 32)
    with open(path + ".tmp", "wb") as f:
        f.write(out)
    import os
    os.replace(path + ".tmp", path)
