"""Small GGUF v3 writer for BitNet b1.58 models in the official layout (arch `bitnet-b1.58`).

Shared by make_tiny_model.py (random weights) and train_kjv.py (the trained default model).
Only what those two need: u32/f32/bool/string scalars, arrays, I2_S / F16 / F32 / Q8_0 tensors.
"""
import struct

import numpy as np
from gguf import GGUFValueType as VT

ARCH = "bitnet-b1.58"
ALIGN = 32
I2_S = 36  # the GGML type id bitnet.cpp gave I2_S


def gguf_str(s):
    b = s.encode() if isinstance(s, str) else s
    return struct.pack("<Q", len(b)) + b


def kv(key, vtype, payload):
    """One key/value record: name, type id, payload bytes."""
    return gguf_str(key) + struct.pack("<I", vtype) + payload


def scalar(vtype, value):
    fmt = {VT.UINT32: "<I", VT.INT32: "<i", VT.FLOAT32: "<f", VT.BOOL: "<?"}[vtype]
    return struct.pack(fmt, value)


def kv_u32(key, value):
    return kv(key, VT.UINT32, scalar(VT.UINT32, value))


def kv_f32(key, value):
    return kv(key, VT.FLOAT32, scalar(VT.FLOAT32, value))


def kv_bool(key, value):
    return kv(key, VT.BOOL, scalar(VT.BOOL, value))


def kv_string(key, value):
    return kv(key, VT.STRING, gguf_str(value))


def kv_array(key, elem_type, items):
    """An array of strings (elem_type STRING) or of fixed-size scalars (numpy-convertible)."""
    if elem_type == VT.STRING:
        body = b"".join(gguf_str(s) for s in items)
    else:
        dtype = {VT.FLOAT32: "<f4", VT.INT32: "<i4", VT.UINT32: "<u4"}[elem_type]
        body = np.asarray(items, dtype=dtype).tobytes()
    return kv(key, VT.ARRAY, struct.pack("<IQ", elem_type, len(items)) + body)


def i2s(t, beta):
    """I2_S bytes of a ternary matrix t (out, in): 128-groups, MSB-first crumbs, f32 beta, 32-byte trailer."""
    codes = (np.asarray(t).reshape(-1) + 1).astype(np.uint8).reshape(-1, 4, 32)
    packed = (codes[:, 0] << 6) | (codes[:, 1] << 4) | (codes[:, 2] << 2) | codes[:, 3]
    return packed.tobytes() + np.float32(beta).tobytes() + bytes(28)


def write(path, kvs, tensors):
    """Writes a GGUF v3 file. tensors: (name, ne (innermost first), GGML type id, bytes)."""
    info, offset = b"", 0
    for name, ne, ty, data in tensors:
        info += gguf_str(name) + struct.pack("<I", len(ne)) + b"".join(struct.pack("<Q", d) for d in ne)
        info += struct.pack("<IQ", ty, offset)
        offset += -(-len(data) // ALIGN) * ALIGN
    head = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(kvs)) + b"".join(kvs) + info
    with open(path, "wb") as f:
        f.write(head + bytes(-len(head) % ALIGN))
        for _, _, _, data in tensors:
            f.write(data + bytes(-len(data) % ALIGN))
