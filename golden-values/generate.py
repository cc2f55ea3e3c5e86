#!/usr/bin/env python3
"""Golden values for hesper-rs: tiny synthetic BitNet b1.58 GGUF models and reference outputs.

Everything here is generated from fixed seeds, so running the script again reproduces the
committed files byte for byte (models) and to within floating-point reproducibility of the
reference implementation (outputs).

Steps (positional arguments; default = all three, in this order):

  models     Write the tiny GGUF models to models/ and check them:
               * mainline llama.cpp arch ``bitnet``: tiny-f32, tiny-f32-scale, tiny-tq2_0,
                 tiny-tq1_0, tiny-tq2_0-f16emb;
               * official bitnet.cpp arch ``bitnet-b1.58`` with I2_S (type 36) weights: tiny-i2s.
             Checks: our TQ1_0/TQ2_0 packers are byte-identical to gguf-py's quantizer, every
             mainline file reads back through gguf-py with exactly the intended values, and
             tiny-i2s reads back through our own parser (gguf-py cannot read type 36).
  llama      Run llama.cpp (through llama-cpp-python's low-level API) on the five mainline
             models: logits for every position and the residual stream after every layer
             (graph tensors ``l_out-<il>``), flash attention off, F32 KV cache, one ubatch.
             For sequence s1 it also captures every per-op tensor of every layer
             (out/<stem>.ops.json + .ops.f32, see "Per-op reference tensors" below).
  reference  Run our float64 NumPy reference of the BitNet b1.58 semantics on tiny-i2s
             (ReLU^2, per-token int8 activation quantization), including its per-op tensors
             for s1. Then validate the reference by running it in SiLU /
             no-activation-quantization mode on tiny-f32 and tiny-f32-scale and comparing with
             llama.cpp (needs the ``llama`` outputs). The comparison is printed and written to
             out/reference-validation.txt. Finally every stored op tensor of the six models is
             recomputed from its stored inputs (out/ops-validation.txt).

  geometry   (not in the default run) Write a 2-layer model with 2B4T's attention geometry
             (20 query heads, 5 KV heads, head width 128, n_embd 2560, n_ff 6912, TQ2_0, F16 tied
             embedding, n_ctx 1056) to --geo-dir (38.6 MB, not committed: its bytes come from a
             counter-based generator that tests/src/geometry.rs reproduces in memory, checked by
             the SHA-256 in the manifest). Run llama.cpp on a 16-token sequence (logits + hidden)
             and on one of 1056 tokens that fills the context (logits), and record two controls on
             the long one: the float64 reference with an exact emulation of llama.cpp's Q8_K
             activations (what a correct engine reaches) and with per-token int8 (known wrong).
             The float64 controls take most of its time.
  control    (not in the default run) tiny-tq2_0's logits computed by the float64 reference
             with per-token int8 activations where llama.cpp uses Q8_K blocks: a known-wrong
             scheme that the tests' model-level bound for quantized files must reject.

Optional:

  --geo-dir DIR      Where the geometry step writes its model (default /tmp/hesper-geo).
  --bench-2b4t DIR   Write three synthetic models with the exact shape of BitNet b1.58 2B4T into
                     DIR: bench-2b4t-i2s.gguf (official arch, I2_S, f32 beta), bench-2b4t-tq2_0.gguf
                     and bench-2b4t-tq1_0.gguf (mainline arch, the same ternary codes as TQ2_0 and
                     TQ1_0, beta rounded to f16), for speed measurements (e.g. llama.cpp's
                     llama-bench on the TQ files). The files are ~1.1-1.2 GB each and are written
                     tensor by tensor, so memory stays small.
                     Given alone, only this step runs.
  --bench-layers N   The --bench-2b4t models with their first N layers only (default 30): a
                     smaller file of the same shape, for benchmarks that try every split of a
                     ring (benches/ring_plan.sh).

Output format (read by the Rust tests), per model ``out/<stem>.json``::

  {"model": "models/<stem>.gguf", "reference": "...", "activation": "silu"|"relu2",
   "act_quant": "none"|"q8_k"|"per_token_i8", "n_vocab": 512, "n_embd": 256, "n_layer": 2,
   "sequences": [{"tokens": [...], "logits": "<stem>.s0.logits.f32",
                  "hidden": "<stem>.s0.hidden.f32"}, ...]}

``*.logits.f32`` is float32 little-endian [n_tokens][n_vocab] (row i = logits after token i);
``*.hidden.f32`` is float32 little-endian [n_layer][n_tokens][n_embd] (residual stream after each
layer, i.e. llama.cpp's ``l_out-<il>``).

Per-op tensors (sequence s1 only), per model ``out/<stem>.ops.json``::

  {"model": ..., "reference": ..., "activation": ..., "act_quant": ..., "sequence": 1,
   "tokens": [...], "n_tokens": 16,
   "ops": {"attn_norm-0": {"file": "<stem>.ops.f32", "offset": 0, "shape": [16, 256]}, ...,
           "result_norm": {...}}}

All ops live in one float32 little-endian blob ``<stem>.ops.f32``; each is [n_tokens][width] at
a byte offset. Op names: OP_NAMES + "-<il>" for every layer, then "result_norm".

Requirements: numpy, gguf==0.19.0; the ``llama`` step also needs llama-cpp-python==0.3.36
(see README.md and requirements.txt).
"""
from __future__ import annotations

import argparse
import ctypes
import json
import struct
import sys
import time
import zlib
import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent          # golden-values/
MODELS_DIR = ROOT / "models"
OUT_DIR = ROOT / "out"

SEED = 20261122                 # master seed; every tensor derives its own stream from it
TOKEN_SEED = 7                  # seed of the token sequences
SEQ_LENGTHS = (7, 16, 33)       # every sequence starts with token id 1
LLAMA_CPP_COMMIT = "0c1e57098"  # llama.cpp vendored by llama-cpp-python 0.3.36
LLAMA_CPP_PYTHON_VERSION = "0.3.36"


# ============================================================================================
# Hyper-parameters
# ============================================================================================

@dataclass(frozen=True)
class HParams:
    n_vocab: int
    n_embd: int
    n_ff: int
    n_head: int
    n_head_kv: int
    n_layer: int
    n_ctx: int
    rope_base: float = 500000.0
    eps: float = 1e-5

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head

    @property
    def n_embd_kv(self) -> int:
        return self.n_head_kv * self.head_dim

    @property
    def emb_std(self) -> float:
        """Embedding std 4/sqrt(n_embd) (0.25 for n_embd = 256): logits then have std ~4 and
        |max| ~15, and the token's own embedding does not dominate the final residual stream."""
        return 4.0 / np.sqrt(self.n_embd)

    def projections(self) -> list[tuple[str, int, int]]:
        """(name, rows = out features, cols = in features) of the 7 ternary projections."""
        E, KV, F = self.n_embd, self.n_embd_kv, self.n_ff
        return [("attn_q", E, E), ("attn_k", KV, E), ("attn_v", KV, E), ("attn_output", E, E),
                ("ffn_gate", F, E), ("ffn_up", F, E), ("ffn_down", E, F)]


TINY = HParams(n_vocab=512, n_embd=256, n_ff=512, n_head=4, n_head_kv=2, n_layer=2, n_ctx=256)
BITNET_2B4T = HParams(n_vocab=128256, n_embd=2560, n_ff=6912, n_head=20, n_head_kv=5, n_layer=30,
                      n_ctx=4096)

NORMS = ("attn_norm", "attn_sub_norm", "ffn_norm", "ffn_sub_norm")


# ============================================================================================
# Ternary block formats (packers work from codes c = t + 1 in {0, 1, 2})
# ============================================================================================

GGML_F32, GGML_F16, GGML_Q8_0, GGML_TQ1_0, GGML_TQ2_0, GGML_I2_S = 0, 1, 8, 34, 35, 36
TYPE_NAMES = {GGML_F32: "F32", GGML_F16: "F16", GGML_Q8_0: "Q8_0", GGML_TQ1_0: "TQ1_0",
              GGML_TQ2_0: "TQ2_0",
              GGML_I2_S: "I2_S"}


def tensor_nbytes(ggml_type: int, ne: list[int]) -> int:
    """Byte size of a tensor blob (before alignment padding)."""
    n = int(np.prod(ne))
    if ggml_type == GGML_F32:
        return 4 * n
    if ggml_type == GGML_F16:
        return 2 * n
    if ggml_type == GGML_Q8_0:          # blocks of 32: f16 scale + 32 int8
        assert ne[0] % 32 == 0, "Q8_0 row length must be a multiple of 32"
        return n // 32 * 34
    if ggml_type in (GGML_TQ1_0, GGML_TQ2_0):
        assert ne[0] % 256 == 0, "TQ row length must be a multiple of 256"
        return n // 256 * (54 if ggml_type == GGML_TQ1_0 else 66)
    if ggml_type == GGML_I2_S:          # bitnet.cpp: codes of the whole tensor + 32-byte trailer
        assert n % 128 == 0
        return n // 4 + 32
    raise ValueError(f"unsupported ggml type {ggml_type}")


def f16_bytes(d: float) -> np.ndarray:
    return np.frombuffer(np.float16(d).tobytes(), np.uint8)


def pack_tq2_0(codes: np.ndarray, d: float) -> bytes:
    """TQ2_0 (66-byte blocks of 256): qs[64] then f16 d.  Element e of a block lives in byte
    32*(e//128) + e%32 at bit 2*((e%128)//32) (LSB first)."""
    c = codes.reshape(-1, 2, 4, 32)                           # block, half, crumb, byte-in-half
    qs = c[:, :, 0] | (c[:, :, 1] << 2) | (c[:, :, 2] << 4) | (c[:, :, 3] << 6)
    out = np.empty((c.shape[0], 66), np.uint8)
    out[:, :64] = qs.reshape(-1, 64)
    out[:, 64:] = f16_bytes(d)
    return out.tobytes()


def pack_tq1_0(codes: np.ndarray, d: float) -> bytes:
    """TQ1_0 (54-byte blocks of 256): qs[48] (5 trits/byte), qh[4] (4 trits/byte), f16 d.
    A byte holding trits (c0 most significant ...) stores ceil(q * 256 / 243)."""
    c = codes.reshape(-1, 256).astype(np.uint16)
    p5 = np.array([81, 27, 9, 3, 1], np.uint16)
    q_a = np.einsum("bnm,n->bm", c[:, :160].reshape(-1, 5, 32), p5)         # elements 0..159
    q_b = np.einsum("bnm,n->bm", c[:, 160:240].reshape(-1, 5, 16), p5)      # elements 160..239
    q_h = np.einsum("bnm,n->bm", c[:, 240:].reshape(-1, 4, 4), p5[1:]) * 3  # elements 240..255
    q = np.concatenate([q_a, q_b, q_h], axis=1).astype(np.uint32)
    out = np.empty((c.shape[0], 54), np.uint8)
    out[:, :52] = (q * 256 + 242) // 243
    out[:, 52:] = f16_bytes(d)
    return out.tobytes()


def pack_i2s(codes: np.ndarray, beta: float) -> bytes:
    """bitnet.cpp I2_S, x86 "128-group" layout: element j of flat group g (128 elements) lives in
    byte 32*g + j%32 at bit 6 - 2*(j//32) (MSB first); then f32 beta and 28 zero bytes."""
    c = codes.reshape(-1, 4, 32)
    packed = (c[:, 0] << 6) | (c[:, 1] << 4) | (c[:, 2] << 2) | c[:, 3]
    return packed.tobytes() + np.float32(beta).tobytes() + bytes(28)


def pack_q8_0(w: np.ndarray) -> bytes:
    """Q8_0 (34-byte blocks of 32): f16 d = amax / 127, then 32 int8 round(x / d), halves away
    from zero as C's roundf (ggml's reference quantizer; computed in f32 as it is)."""
    x = w.astype(np.float32).reshape(-1, 32)
    d = np.abs(x).max(axis=1, keepdims=True) / np.float32(127)
    with np.errstate(divide="ignore"):
        inv = np.where(d == 0, np.float32(0), np.float32(1) / d).astype(np.float32)
    a = np.abs(x * inv)
    whole = np.floor(a)
    q = np.sign(x) * (whole + (a - whole >= np.float32(0.5)))
    out = np.empty((x.shape[0], 34), np.uint8)
    out[:, :2] = d.astype(np.float16).view(np.uint8)
    out[:, 2:] = q.astype(np.int8).view(np.uint8)
    return out.tobytes()


def unpack_i2s(blob: bytes | np.ndarray, n: int) -> tuple[np.ndarray, np.float32]:
    """Inverse of pack_i2s: flat ternary values int8 in {-1,0,1} and the f32 beta."""
    b = np.frombuffer(blob, np.uint8, count=n // 4).reshape(-1, 32)
    codes = np.stack([(b >> 6) & 3, (b >> 4) & 3, (b >> 2) & 3, b & 3], axis=1).reshape(-1)
    assert codes.max() <= 2, "I2_S code 3 is invalid"
    beta = np.frombuffer(blob, np.float32, count=1, offset=n // 4)[0]
    return codes.astype(np.int8) - 1, beta


# ============================================================================================
# GGUF v3 writer (streaming) and reader (type-36 aware)
# ============================================================================================

GGUF_U8, GGUF_I8, GGUF_U16, GGUF_I16, GGUF_U32, GGUF_I32, GGUF_F32, GGUF_BOOL, GGUF_STR, \
    GGUF_ARR, GGUF_U64, GGUF_I64, GGUF_F64 = range(13)
_SCALAR_FMT = {GGUF_U8: "<B", GGUF_I8: "<b", GGUF_U16: "<H", GGUF_I16: "<h", GGUF_U32: "<I",
               GGUF_I32: "<i", GGUF_F32: "<f", GGUF_BOOL: "<?", GGUF_U64: "<Q", GGUF_I64: "<q",
               GGUF_F64: "<d"}


def _gguf_str(s: str) -> bytes:
    b = s.encode("utf-8")
    return struct.pack("<Q", len(b)) + b


@dataclass(frozen=True)
class KV:
    key: str
    vtype: int
    value: object

    def encode(self) -> bytes:
        head = _gguf_str(self.key) + struct.pack("<I", self.vtype)
        if self.vtype == GGUF_STR:
            return head + _gguf_str(self.value)
        if self.vtype == GGUF_ARR:              # value: (element type, list of values)
            etype, items = self.value
            body = (_gguf_str(x) if etype == GGUF_STR else struct.pack(_SCALAR_FMT[etype], x)
                    for x in items)
            return head + struct.pack("<IQ", etype, len(items)) + b"".join(body)
        return head + struct.pack(_SCALAR_FMT[self.vtype], self.value)


def kv_u32(k, v): return KV(k, GGUF_U32, int(v))
def kv_f32(k, v): return KV(k, GGUF_F32, float(v))
def kv_str(k, v): return KV(k, GGUF_STR, str(v))
def kv_bool(k, v): return KV(k, GGUF_BOOL, bool(v))
def kv_arr(k, etype, items): return KV(k, GGUF_ARR, (etype, list(items)))


@dataclass(frozen=True)
class TensorInfo:
    name: str
    ne: tuple[int, ...]         # ggml order: ne[0] = row length (contiguous)
    ggml_type: int

    @property
    def nbytes(self) -> int:
        return tensor_nbytes(self.ggml_type, list(self.ne))


class GGUFStreamWriter:
    """Writes a GGUF v3 file whose tensor list is known up front; tensor data is then appended
    in tensor-info order, in as many chunks as convenient. Offsets follow ggml's rule: each blob
    starts at the previous one's end rounded up to ALIGN, data section aligned, zero padding."""

    ALIGN = 32

    def __init__(self, path: Path, kvs: list[KV], tensors: list[TensorInfo]):
        self.path, self.tensors = Path(path), tensors
        self.f = open(self.path, "wb")
        header = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(kvs))
        header += b"".join(kv.encode() for kv in kvs)
        offset = 0
        for t in tensors:
            header += _gguf_str(t.name) + struct.pack("<I", len(t.ne))
            header += b"".join(struct.pack("<Q", d) for d in t.ne)
            header += struct.pack("<IQ", t.ggml_type, offset)
            offset += self._padded(t.nbytes)
        self.f.write(header + bytes(self._padded(len(header)) - len(header)))
        self.index, self.written = 0, 0

    @classmethod
    def _padded(cls, n: int) -> int:
        return (n + cls.ALIGN - 1) // cls.ALIGN * cls.ALIGN

    def write(self, name: str, data: bytes | np.ndarray) -> None:
        t = self.tensors[self.index]
        assert name == t.name, f"expected data of {t.name}, got {name}"
        data = data.tobytes() if isinstance(data, np.ndarray) else data
        assert self.written + len(data) <= t.nbytes, f"too much data for {name}"
        self.f.write(data)
        self.written += len(data)
        if self.written == t.nbytes:                 # tensor complete: pad, go to the next one
            self.f.write(bytes(self._padded(t.nbytes) - t.nbytes))
            self.index, self.written = self.index + 1, 0

    def close(self) -> None:
        assert self.index == len(self.tensors), "not all tensors were written"
        self.f.close()


@dataclass
class GGUFTensor:
    name: str
    ne: tuple[int, ...]
    ggml_type: int
    offset: int                 # absolute file offset
    nbytes: int


class GGUFFile:
    """Minimal GGUF v3 reader: all metadata value types, tensor infos, ggml's offset rules, and
    decoders for F32, F16 and bitnet.cpp's I2_S (type 36)."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.raw = np.memmap(self.path, np.uint8, mode="r")
        self.pos = 0
        assert bytes(self.raw[:4]) == b"GGUF", "not a GGUF file"
        self.pos = 4
        version, n_tensors, n_kv = self._unpack("<IQQ")
        assert version == 3, f"GGUF version {version}"
        self.kv: dict[str, object] = {}
        for _ in range(n_kv):
            key = self._string()
            (vtype,) = self._unpack("<I")
            assert key not in self.kv, f"duplicate key {key}"
            self.kv[key] = self._value(vtype)
        align = int(self.kv.get("general.alignment", 32))
        infos = []
        for _ in range(n_tensors):
            name = self._string()
            (n_dims,) = self._unpack("<I")
            ne = tuple(self._unpack(f"<{n_dims}Q"))
            ggml_type, rel = self._unpack("<IQ")
            infos.append((name, ne, ggml_type, rel))
        data_start = (self.pos + align - 1) // align * align
        self.tensors: dict[str, GGUFTensor] = {}
        expected = 0
        for name, ne, ggml_type, rel in infos:      # ggml requires in-order, gap-free blobs
            assert rel == expected, f"{name}: offset {rel} != expected {expected}"
            nbytes = tensor_nbytes(ggml_type, list(ne))
            self.tensors[name] = GGUFTensor(name, ne, ggml_type, data_start + rel, nbytes)
            expected = rel + (nbytes + align - 1) // align * align
        assert not infos or data_start + expected <= len(self.raw), "file truncated"

    def _unpack(self, fmt: str):
        vals = struct.unpack_from(fmt, self.raw, self.pos)
        self.pos += struct.calcsize(fmt)
        return vals

    def _string(self) -> str:
        (n,) = self._unpack("<Q")
        s = bytes(self.raw[self.pos:self.pos + n]).decode("utf-8")
        self.pos += n
        return s

    def _value(self, vtype: int):
        if vtype == GGUF_STR:
            return self._string()
        if vtype == GGUF_ARR:
            etype, count = self._unpack("<IQ")
            return [self._value(etype) for _ in range(count)]
        return self._unpack(_SCALAR_FMT[vtype])[0]

    def blob(self, name: str) -> np.ndarray:
        t = self.tensors[name]
        return self.raw[t.offset:t.offset + t.nbytes]

    def array(self, name: str) -> np.ndarray:
        """F32/F16 tensor as a float64 array in numpy order (shape = reversed ne)."""
        t = self.tensors[name]
        dtype = {GGML_F32: "<f4", GGML_F16: "<f2"}.get(t.ggml_type)
        if dtype is None:
            raise NotImplementedError(f"{name}: type {TYPE_NAMES.get(t.ggml_type, t.ggml_type)}")
        return np.frombuffer(self.blob(name), dtype).astype(np.float64).reshape(t.ne[::-1])

    def ternary_i2s(self, name: str) -> tuple[np.ndarray, float]:
        """I2_S tensor as (ternary int8 matrix [rows, cols], f32 beta)."""
        t = self.tensors[name]
        assert t.ggml_type == GGML_I2_S
        tern, beta = unpack_i2s(self.blob(name), int(np.prod(t.ne)))
        return tern.reshape(t.ne[::-1]), beta

    def ternary_tq2_0(self, name: str) -> tuple[np.ndarray, float]:
        """TQ2_0 tensor whose blocks share one scale as (ternary int8 [rows, cols], d)."""
        t = self.tensors[name]
        assert t.ggml_type == GGML_TQ2_0
        raw = np.asarray(self.blob(name)).reshape(-1, 66)
        qs = raw[:, :64].reshape(-1, 2, 1, 32)
        codes = (qs >> (2 * np.arange(4, dtype=np.uint8))[None, None, :, None]) & 3
        d = np.frombuffer(raw[:, 64:].tobytes(), "<f2")
        assert np.all(d == d[0]), f"{name}: blocks with different scales"
        return (codes.reshape(-1).astype(np.int8) - 1).reshape(t.ne[::-1]), float(d[0])

    def hparam(self, key: str):
        return self.kv[f"{self.kv['general.architecture']}.{key}"]


# ============================================================================================
# Synthetic model content (shared by all variants)
# ============================================================================================
#
# Every tensor draws from its own random stream keyed by (seed, tensor name), so the tiny models
# can be built in memory and the 2B4T-shaped one tensor by tensor with the same code.
#
#   token_embd : N(0, emb_std) rounded to f16 (identical values in F32 and F16 files);
#                generated in chunks of EMB_CHUNK rows (chunk k uses stream "token_embd.<k>")
#   norm gains : 1 + 0.1 N(0, 1), f32
#   projection : codes uniform in {0,1,2} (t = code - 1), beta ~ U(1, 2) * sqrt(1.5 / n_in)
#                (so y = beta t.x has std 1..2 for unit-RMS x: attention scores with std ~1..4,
#                residual stream RMS ~2.4 / 3.3 after layers 0 / 1, argmax of the logits set by
#                the layers, not by the input token); beta32 = f32(beta) is used by the
#                I2_S files, beta16 = f16(beta32) (what an I2_S -> TQ2_0 conversion keeps) by the
#                mainline files. beta32 is never f16-exact.

EMB_CHUNK = 4096


def tensor_rng(seed: int, name: str) -> np.random.Generator:
    return np.random.default_rng([seed, zlib.crc32(name.encode())])


def gen_norm(seed: int, name: str, n: int) -> np.ndarray:
    return (1.0 + 0.1 * tensor_rng(seed, name).standard_normal(n)).astype(np.float32)


def gen_embedding_chunk(seed: int, hp: HParams, chunk: int) -> np.ndarray:
    rows = min(EMB_CHUNK, hp.n_vocab - chunk * EMB_CHUNK)
    rng = tensor_rng(seed, f"token_embd.{chunk}")
    return (hp.emb_std * rng.standard_normal((rows, hp.n_embd))).astype(np.float16)


@dataclass
class Projection:
    codes: np.ndarray           # uint8 [rows=out, cols=in], values 0, 1, 2 (t = code - 1)
    beta32: float               # f32 scale (I2_S files)
    beta16: float               # f16(beta32) (mainline files)

    @property
    def ternary(self) -> np.ndarray:
        return self.codes.astype(np.int8) - 1


def gen_projection(seed: int, name: str, rows: int, cols: int) -> Projection:
    rng = tensor_rng(seed, name)
    codes = rng.integers(0, 3, size=(rows, cols), dtype=np.uint8)
    beta32 = np.float32(rng.uniform(1.0, 2.0) * np.sqrt(1.5 / cols))
    while float(np.float16(beta32)) == float(beta32):      # keep beta32 off the f16 grid
        beta32 = np.nextafter(beta32, np.float32(1.0))
    return Projection(codes, float(beta32), float(np.float16(beta32)))


@dataclass
class SyntheticModel:
    hp: HParams
    token_embd: np.ndarray      # float16 [n_vocab, n_embd]
    output_norm: np.ndarray     # float32 [n_embd]
    norms: list[dict[str, np.ndarray]] = field(default_factory=list)     # per layer
    proj: list[dict[str, Projection]] = field(default_factory=list)      # per layer


def make_synthetic(hp: HParams, seed: int) -> SyntheticModel:
    n_chunks = (hp.n_vocab + EMB_CHUNK - 1) // EMB_CHUNK
    emb = np.concatenate([gen_embedding_chunk(seed, hp, k) for k in range(n_chunks)])
    m = SyntheticModel(hp, emb, gen_norm(seed, "output_norm.weight", hp.n_embd))
    for il in range(hp.n_layer):
        m.norms.append({nm: gen_norm(seed, f"blk.{il}.{nm}.weight",
                                     hp.n_ff if nm == "ffn_sub_norm" else hp.n_embd)
                        for nm in NORMS})
        m.proj.append({nm: gen_projection(seed, f"blk.{il}.{nm}.weight", r, c)
                       for nm, r, c in hp.projections()})
    return m


def layer_tensor_order(il: int, with_scales: bool) -> list[tuple[str, str]]:
    """(tensor name, role) of one block, in file order; role is a norm name, a projection
    name, or "<proj>.scale"."""
    p = f"blk.{il}."
    names = [(p + "attn_norm.weight", "attn_norm")]
    for proj in ("attn_q", "attn_k", "attn_v", "attn_output"):
        names.append((p + proj + ".weight", proj))
        if with_scales:
            names.append((p + proj + ".scale", proj + ".scale"))
    names += [(p + "attn_sub_norm.weight", "attn_sub_norm"), (p + "ffn_norm.weight", "ffn_norm")]
    for proj in ("ffn_gate", "ffn_up", "ffn_down"):
        names.append((p + proj + ".weight", proj))
        if with_scales:
            names.append((p + proj + ".scale", proj + ".scale"))
    names.append((p + "ffn_sub_norm.weight", "ffn_sub_norm"))
    return names


# ============================================================================================
# Model files
# ============================================================================================

@dataclass(frozen=True)
class Variant:
    stem: str
    arch: str                   # "bitnet" (mainline llama.cpp) or "bitnet-b1.58" (official)
    weight_type: int            # GGML_F32 / GGML_TQ2_0 / GGML_TQ1_0 / GGML_I2_S
    scale_tensors: bool         # pure {-1,0,1} weights + blk.N.<proj>.scale F32 [1]
    embd_type: int              # GGML_F32 / GGML_F16
    activation: str             # what the reference outputs use: "silu" | "relu2"
    act_quant: str              # "none" | "q8_k" | "per_token_i8"

    @property
    def path(self) -> Path:
        return MODELS_DIR / f"{self.stem}.gguf"

    @property
    def file_type(self) -> int:  # llama_ftype
        return {GGML_F32: 0, GGML_TQ1_0: 36, GGML_TQ2_0: 37, GGML_I2_S: 40}[self.weight_type]


MAINLINE_VARIANTS = [
    Variant("tiny-f32", "bitnet", GGML_F32, False, GGML_F32, "silu", "none"),
    Variant("tiny-f32-scale", "bitnet", GGML_F32, True, GGML_F32, "silu", "none"),
    Variant("tiny-tq2_0", "bitnet", GGML_TQ2_0, False, GGML_F32, "silu", "q8_k"),
    Variant("tiny-tq1_0", "bitnet", GGML_TQ1_0, True, GGML_F32, "silu", "q8_k"),
    Variant("tiny-tq2_0-f16emb", "bitnet", GGML_TQ2_0, False, GGML_F16, "silu", "q8_k"),
]
I2S_VARIANT = Variant("tiny-i2s", "bitnet-b1.58", GGML_I2_S, False, GGML_F16, "relu2",
                      "per_token_i8")


def shape_kvs(arch: str, hp: HParams, name: str, rope_dim: int) -> list[KV]:
    """`general.architecture`, `general.name` and the shape keys of `arch`, in gguf-py's order."""
    A = arch
    return [kv_str("general.architecture", A), kv_str("general.name", name),
            kv_u32(f"{A}.vocab_size", hp.n_vocab), kv_u32(f"{A}.context_length", hp.n_ctx),
            kv_u32(f"{A}.embedding_length", hp.n_embd), kv_u32(f"{A}.block_count", hp.n_layer),
            kv_u32(f"{A}.feed_forward_length", hp.n_ff),
            kv_u32(f"{A}.attention.head_count", hp.n_head),
            kv_u32(f"{A}.attention.head_count_kv", hp.n_head_kv),
            kv_f32(f"{A}.attention.layer_norm_rms_epsilon", hp.eps),
            kv_f32(f"{A}.rope.freq_base", hp.rope_base),
            kv_u32(f"{A}.rope.dimension_count", rope_dim)]


def mainline_kvs(hp: HParams, name: str, file_type: int) -> list[KV]:
    """Keys of llama.cpp's `bitnet` arch (as gguf-py would write them); no text vocabulary:
    tokenizer.ggml.model = "none" + bitnet.vocab_size, token ids are fed directly."""
    return shape_kvs("bitnet", hp, name, hp.head_dim) + [
        kv_u32("general.file_type", file_type), kv_u32("general.quantization_version", 2),
        kv_str("tokenizer.ggml.model", "none")]


def official_kvs(hp: HParams, name: str) -> list[KV]:
    """The metadata of microsoft/bitnet-b1.58-2B-4T-gguf (spec §3.1), same keys, types and order,
    minus the text-vocabulary arrays and chat template (tokenizer.ggml.model = "none")."""
    A = "bitnet-b1.58"
    return [kv_str("general.architecture", A), kv_str("general.name", name),
            kv_u32(f"{A}.vocab_size", hp.n_vocab), kv_u32(f"{A}.context_length", hp.n_ctx),
            kv_u32(f"{A}.embedding_length", hp.n_embd), kv_u32(f"{A}.block_count", hp.n_layer),
            kv_u32(f"{A}.feed_forward_length", hp.n_ff),
            kv_u32(f"{A}.rope.dimension_count", hp.head_dim),
            kv_u32(f"{A}.attention.head_count", hp.n_head),
            kv_u32(f"{A}.attention.head_count_kv", hp.n_head_kv),
            kv_bool("tokenizer.ggml.add_bos_token", True),
            kv_f32(f"{A}.attention.layer_norm_rms_epsilon", hp.eps),
            kv_f32(f"{A}.rope.freq_base", hp.rope_base),
            kv_u32("general.file_type", 40),
            kv_str("tokenizer.ggml.model", "none"),
            kv_u32("tokenizer.ggml.bos_token_id", 1), kv_u32("tokenizer.ggml.eos_token_id", 2),
            kv_u32("tokenizer.ggml.padding_token_id", 2),
            kv_u32("general.quantization_version", 2)]


def variant_tensor_infos(v: Variant, hp: HParams) -> list[TensorInfo]:
    shapes = {nm: (c, r) for nm, r, c in hp.projections()}
    infos = [TensorInfo("token_embd.weight", (hp.n_embd, hp.n_vocab), v.embd_type),
             TensorInfo("output_norm.weight", (hp.n_embd,), GGML_F32)]
    for il in range(hp.n_layer):
        for name, role in layer_tensor_order(il, v.scale_tensors):
            if role in NORMS:
                infos.append(TensorInfo(name, (hp.n_ff if role == "ffn_sub_norm" else hp.n_embd,),
                                        GGML_F32))
            elif role.endswith(".scale"):
                infos.append(TensorInfo(name, (1,), GGML_F32))
            else:
                infos.append(TensorInfo(name, shapes[role], v.weight_type))
    return infos


def encode_projection(v: Variant, p: Projection) -> bytes:
    """Blob of one projection weight in the variant's format."""
    if v.weight_type == GGML_I2_S:
        return pack_i2s(p.codes, p.beta32)
    d = 1.0 if v.scale_tensors else p.beta16          # with .scale tensors: pure {-1, 0, 1}
    if v.weight_type == GGML_F32:
        return (p.ternary.astype(np.float32) * np.float32(d)).tobytes()
    if v.weight_type == GGML_TQ2_0:
        return pack_tq2_0(p.codes, d)
    if v.weight_type == GGML_TQ1_0:
        return pack_tq1_0(p.codes, d)
    raise ValueError(v.weight_type)


def write_variant(v: Variant, m: SyntheticModel) -> None:
    hp = m.hp
    kvs = (official_kvs(hp, "tiny-bitnet-b1.58") if v.arch == "bitnet-b1.58"
           else mainline_kvs(hp, f"hesper-rs {v.stem}", v.file_type))
    w = GGUFStreamWriter(v.path, kvs, variant_tensor_infos(v, hp))
    w.write("token_embd.weight", m.token_embd.astype(np.float32 if v.embd_type == GGML_F32
                                                     else np.float16))
    w.write("output_norm.weight", m.output_norm)
    for il in range(hp.n_layer):
        for name, role in layer_tensor_order(il, v.scale_tensors):
            if role in NORMS:
                w.write(name, m.norms[il][role])
            elif role.endswith(".scale"):
                w.write(name, np.array([m.proj[il][role[:-6]].beta16], np.float32))
            else:
                w.write(name, encode_projection(v, m.proj[il][role]))
    w.close()


# ---------------------------------------------------------------------------- model checks

def check_packers_against_gguf_py(m: SyntheticModel) -> None:
    """Our TQ1_0/TQ2_0/Q8_0 packers must be byte-identical to gguf-py's reference quantizer."""
    from gguf import GGMLQuantizationType as QT
    from gguf.quants import quantize
    for name, p in m.proj[0].items():
        t = p.ternary.astype(np.float32)
        assert pack_tq2_0(p.codes, p.beta16) == quantize(t * np.float32(p.beta16), QT.TQ2_0).tobytes(), name
        assert pack_tq1_0(p.codes, 1.0) == quantize(t, QT.TQ1_0).tobytes(), name
        assert pack_tq1_0(p.codes, p.beta16) == quantize(t * np.float32(p.beta16), QT.TQ1_0).tobytes(), name
        w = t * np.float32(p.beta16) + np.linspace(-0.02, 0.02, t.size, dtype=np.float32).reshape(t.shape)
        assert pack_q8_0(w) == quantize(w, QT.Q8_0).tobytes(), name


def check_mainline_file(v: Variant, m: SyntheticModel) -> None:
    """Read the file back with gguf-py and compare every tensor with the intended values."""
    from gguf import GGUFReader
    from gguf.quants import dequantize
    r = GGUFReader(v.path)
    got = {t.name: dequantize(t.data, t.tensor_type).reshape(-1) for t in r.tensors}
    want = {"token_embd.weight": m.token_embd, "output_norm.weight": m.output_norm}
    for il in range(m.hp.n_layer):
        for name, role in layer_tensor_order(il, v.scale_tensors):
            if role in NORMS:
                want[name] = m.norms[il][role]
            elif role.endswith(".scale"):
                want[name] = np.array([m.proj[il][role[:-6]].beta16])
            else:
                p = m.proj[il][role]
                want[name] = p.ternary * (1.0 if v.scale_tensors else p.beta16)
    assert list(got) == list(want), "tensor list mismatch"
    for name, w in want.items():
        assert np.array_equal(got[name].astype(np.float64), np.asarray(w, np.float64).reshape(-1)), name
    assert r.fields["general.architecture"].contents() == "bitnet"


def check_i2s_file(v: Variant, m: SyntheticModel) -> None:
    """Read tiny-i2s back with our parser; additionally decode a sample of weights with the
    per-element formula of the spec (independent of the vectorized unpacker)."""
    g = GGUFFile(v.path)
    assert g.kv["general.architecture"] == "bitnet-b1.58"
    assert np.array_equal(g.array("token_embd.weight"), m.token_embd.astype(np.float64))
    rng = np.random.default_rng(0)
    for il in range(m.hp.n_layer):
        for nm, p in m.proj[il].items():
            name = f"blk.{il}.{nm}.weight"
            tern, beta = g.ternary_i2s(name)
            assert np.array_equal(tern, p.ternary) and beta == np.float32(p.beta32), name
            blob, flat = g.blob(name), p.ternary.reshape(-1)
            for k in rng.integers(0, flat.size, 64):
                grp, j = divmod(int(k), 128)
                code = (int(blob[32 * grp + j % 32]) >> (6 - 2 * (j // 32))) & 3
                assert code - 1 == flat[k], (name, k)
        for nm in NORMS:
            assert np.array_equal(g.array(f"blk.{il}.{nm}.weight"), m.norms[il][nm]), nm


def step_models(seed: int) -> None:
    MODELS_DIR.mkdir(parents=True, exist_ok=True)
    m = make_synthetic(TINY, seed)
    check_packers_against_gguf_py(m)
    print("TQ1_0/TQ2_0 packers == gguf-py quantize (byte-identical)")
    for v in MAINLINE_VARIANTS + [I2S_VARIANT]:
        write_variant(v, m)
        (check_i2s_file if v.weight_type == GGML_I2_S else check_mainline_file)(v, m)
        print(f"wrote {v.path.relative_to(ROOT)}  {v.path.stat().st_size:>9,d} B  (read back OK)")


# ============================================================================================
# Token sequences and output files
# ============================================================================================

def token_sequences(hp: HParams) -> list[list[int]]:
    """The same three sequences for every tiny model: first id 1, then uniform ids."""
    rng = np.random.default_rng(TOKEN_SEED)
    return [[1] + rng.integers(0, hp.n_vocab, n - 1).tolist() for n in SEQ_LENGTHS]


def write_outputs(v: Variant, hp: HParams, reference: str,
                  results: list[tuple[list[int], np.ndarray, np.ndarray]],
                  extras: list[dict] | None = None) -> None:
    """results: (tokens, logits [n_tok, n_vocab], hidden [n_layer, n_tok, n_embd]) per sequence;
    extras: per sequence, keys recorded before its tokens (a text the reference tokenized)."""
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    seqs = []
    for i, (tokens, logits, hidden) in enumerate(results):
        n = len(tokens)
        assert logits.shape == (n, hp.n_vocab) and hidden.shape == (hp.n_layer, n, hp.n_embd)
        assert np.isfinite(logits).all() and np.isfinite(hidden).all()
        lf, hf = f"{v.stem}.s{i}.logits.f32", f"{v.stem}.s{i}.hidden.f32"
        np.ascontiguousarray(logits, "<f4").tofile(OUT_DIR / lf)
        np.ascontiguousarray(hidden, "<f4").tofile(OUT_DIR / hf)
        extra = extras[i] if extras else {}
        seqs.append({**extra, "tokens": [int(t) for t in tokens], "logits": lf, "hidden": hf})
    manifest = {"model": f"models/{v.stem}.gguf", "reference": reference,
                "activation": v.activation, "act_quant": v.act_quant, "n_vocab": hp.n_vocab,
                "n_embd": hp.n_embd, "n_layer": hp.n_layer, "sequences": seqs}
    (OUT_DIR / f"{v.stem}.json").write_text(format_manifest(manifest))
    print(f"wrote out/{v.stem}.json (+{2 * len(seqs)} .f32 files)")


def format_manifest(manifest: dict) -> str:
    """Plain JSON, one key per line and one line per sequence (diff-friendly)."""
    head = {k: v for k, v in manifest.items() if k != "sequences"}
    lines = [f" {json.dumps(k)}: {json.dumps(v)}," for k, v in head.items()]
    seqs = ",\n".join("  " + json.dumps(s) for s in manifest["sequences"])
    return "{\n" + "\n".join(lines) + '\n "sequences": [\n' + seqs + "\n ]\n}\n"


def read_outputs(stem: str) -> tuple[dict, list[tuple[np.ndarray, np.ndarray]]]:
    man = json.loads((OUT_DIR / f"{stem}.json").read_text())
    L, V, E = man["n_layer"], man["n_vocab"], man["n_embd"]
    data = []
    for s in man["sequences"]:
        n = len(s["tokens"])
        data.append((np.fromfile(OUT_DIR / s["logits"], "<f4").reshape(n, V),
                     np.fromfile(OUT_DIR / s["hidden"], "<f4").reshape(L, n, E)))
    return man, data


# ============================================================================================
# llama.cpp reference (llama-cpp-python low-level API)
# ============================================================================================

class LlamaCpp:
    """Runs a GGUF through llama.cpp and captures logits + every layer's `l_out-<il>`.

    Settings: CPU only, flash attention disabled, K and V cache F32, n_ctx = n_batch = n_ubatch
    = 256 (the whole sequence in one ubatch, so each graph tensor is computed exactly once), logits
    requested for every position (so the last layer keeps all rows: llama.cpp's `inp_out_ids`
    selects the output rows before the last FFN)."""

    def __init__(self, threads: int):
        import llama_cpp
        from llama_cpp import llama_cpp as C
        self.C, self.threads, self.version = C, threads, llama_cpp.__version__
        if self.version != LLAMA_CPP_PYTHON_VERSION:
            print(f"WARNING: llama-cpp-python {self.version}, the golden values were made with "
                  f"{LLAMA_CPP_PYTHON_VERSION} (llama.cpp {LLAMA_CPP_COMMIT})", file=sys.stderr)
        lib = Path(llama_cpp.__file__).parent / "lib" / "libggml-base.so"
        g = self.ggml = ctypes.CDLL(str(lib))
        g.ggml_get_name.restype, g.ggml_get_name.argtypes = ctypes.c_char_p, [ctypes.c_void_p]
        g.ggml_nbytes.restype, g.ggml_nbytes.argtypes = ctypes.c_size_t, [ctypes.c_void_p]
        g.ggml_is_contiguous.restype, g.ggml_is_contiguous.argtypes = ctypes.c_bool, [ctypes.c_void_p]
        g.ggml_op_desc.restype, g.ggml_op_desc.argtypes = ctypes.c_char_p, [ctypes.c_void_p]
        g.ggml_backend_tensor_get.restype = None
        g.ggml_backend_tensor_get.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t,
                                              ctypes.c_size_t]

        @C.llama_log_callback
        def log(level, text, _user):            # keep warnings (3) and errors (4) only
            if level in (3, 4):
                sys.stderr.write("llama.cpp: " + text.decode(errors="replace"))
        self._log = log
        C.llama_log_set(log, None)
        C.llama_backend_init()

    class _TensorHead(ctypes.Structure):       # leading fields of struct ggml_tensor (ggml.h)
        _fields_ = [("type", ctypes.c_int), ("buffer", ctypes.c_void_p), ("ne", ctypes.c_int64 * 4)]

    def run(self, path: Path, hp: HParams, tokens: list[int], capture_ops: bool = False
            ) -> tuple[np.ndarray, np.ndarray, list[tuple[str, str, tuple, np.ndarray]] | None]:
        """Logits [n, n_vocab], hidden [n_layer, n, n_embd] and, with capture_ops, every graph
        tensor whose name is in llama_op_graph_names() as (name, ggml op, ne, values), in graph
        order (several tensors can carry the same name, e.g. Qcur-<il>)."""
        C, g, n = self.C, self.ggml, len(tokens)
        captured: dict[int, np.ndarray] = {}
        op_names = llama_op_graph_names(hp) if capture_ops else set()
        op_tensors: list[tuple[str, str, tuple, np.ndarray]] = []

        @C.ggml_backend_sched_eval_callback
        def on_tensor(t, ask, _user):
            name = g.ggml_get_name(t).decode()
            if not name.startswith("l_out-") and name not in op_names:
                return False if ask else True
            if ask:
                return True
            head = ctypes.cast(t, ctypes.POINTER(self._TensorHead)).contents
            ne = tuple(head.ne)
            assert head.type == GGML_F32 and g.ggml_is_contiguous(t), name
            assert ne[1:] in ((n, 1, 1), (ne[1], n, 1)), (name, ne)    # token-major rows
            buf = np.empty(int(np.prod(ne)), np.float32)
            g.ggml_backend_tensor_get(t, buf.ctypes.data, 0, g.ggml_nbytes(t))
            if name in op_names:
                op_tensors.append((name, g.ggml_op_desc(t).decode(), ne, buf.reshape(n, -1)))
            if name.startswith("l_out-"):
                assert ne == (hp.n_embd, n, 1, 1), (name, ne)
                captured[int(name[len("l_out-"):])] = buf.reshape(n, hp.n_embd)
            return True

        mp = C.llama_model_default_params()
        mp.n_gpu_layers = 0
        model = C.llama_model_load_from_file(str(path).encode(), mp)
        assert model, f"llama.cpp refused {path}"
        try:
            vocab = C.llama_model_get_vocab(model)
            assert C.llama_vocab_n_tokens(vocab) == hp.n_vocab
            cp = C.llama_context_default_params()
            cp.n_ctx = cp.n_batch = cp.n_ubatch = hp.n_ctx
            cp.n_seq_max = 1
            cp.n_threads = cp.n_threads_batch = self.threads
            cp.flash_attn_type = 0                  # LLAMA_FLASH_ATTN_TYPE_DISABLED
            cp.type_k = cp.type_v = GGML_F32        # F32 KV cache
            cp.cb_eval, cp.cb_eval_user_data = on_tensor, None
            ctx = C.llama_init_from_model(model, cp)
            assert ctx, "llama_init_from_model failed"
            batch = C.llama_batch_init(n, 0, 1)
            try:
                for i, tok in enumerate(tokens):
                    batch.token[i], batch.pos[i] = tok, i
                    batch.n_seq_id[i], batch.seq_id[i][0], batch.logits[i] = 1, 0, 1
                batch.n_tokens = n
                rc = C.llama_decode(ctx, batch)
                assert rc == 0, f"llama_decode returned {rc}"
                logits = np.stack([np.ctypeslib.as_array(C.llama_get_logits_ith(ctx, i),
                                                         shape=(hp.n_vocab,)).copy()
                                   for i in range(n)])
            finally:
                C.llama_batch_free(batch)
                C.llama_free(ctx)
        finally:
            C.llama_model_free(model)
        assert sorted(captured) == list(range(hp.n_layer)), sorted(captured)
        return (logits, np.stack([captured[il] for il in range(hp.n_layer)]),
                op_tensors if capture_ops else None)

    def tokenize(self, path: Path, text: str) -> tuple[list[int], str]:
        """`text` as llama.cpp tokenizes a prompt with the vocabulary of `path` (BOS added as the
        file says, special tokens not parsed), and what llama.cpp detokenizes the ids after BOS
        into."""
        C = self.C
        mp = C.llama_model_default_params()
        mp.n_gpu_layers, mp.vocab_only = 0, True
        model = C.llama_model_load_from_file(str(path).encode(), mp)
        assert model, f"llama.cpp refused {path}"
        try:
            vocab, raw = C.llama_model_get_vocab(model), text.encode()
            ids = (C.llama_token * (len(raw) + 8))()
            n = C.llama_tokenize(vocab, raw, len(raw), ids, len(ids), True, False)
            assert n > 0, f"llama_tokenize returned {n}"
            out = ctypes.create_string_buffer(4 * len(raw) + 64)
            after_bos = (C.llama_token * (n - 1))(*ids[1:n])
            m = C.llama_detokenize(vocab, after_bos, n - 1, out, len(out), False, False)
            assert m >= 0, f"llama_detokenize returned {m}"
            return [int(t) for t in ids[:n]], out.raw[:m].decode()
        finally:
            C.llama_model_free(model)

    def description(self) -> str:
        return (f"llama.cpp {LLAMA_CPP_COMMIT} via llama-cpp-python {self.version}, CPU, "
                f"flash attention off, KV cache F32, n_threads {self.threads}, one ubatch, "
                f"logits for all positions; hidden = l_out-<il>")


def step_llama(threads: int) -> None:
    llama = LlamaCpp(threads)
    seqs = token_sequences(TINY)
    for v in MAINLINE_VARIANTS:
        t0 = time.time()
        results = [(toks, *llama.run(v.path, TINY, toks)[:2]) for toks in seqs]
        write_outputs(v, TINY, llama.description(), results)
        # per-op tensors of sequence OPS_SEQUENCE, from a second run that also captures them
        toks = seqs[OPS_SEQUENCE]
        logits, hidden, op_tensors = llama.run(v.path, TINY, toks, capture_ops=True)
        _, logits0, hidden0 = results[OPS_SEQUENCE]
        assert np.array_equal(logits, logits0) and np.array_equal(hidden, hidden0), \
            f"{v.stem}: capturing the op tensors changed llama.cpp's results"
        ops = llama_ops_from_capture(op_tensors, TINY, len(toks))
        assert all(np.array_equal(ops[f"l_out-{il}"], hidden0[il]) for il in range(TINY.n_layer))
        write_ops(v, TINY, llama.description(), toks, ops)
        print(f"  {v.stem}: llama.cpp {time.time() - t0:.1f} s")


# ============================================================================================
# float64 NumPy reference of the BitNet b1.58 forward pass (spec §4.1)
# ============================================================================================

REFERENCE_LABEL = ("hesper-rs float64 NumPy reference (transformers unavailable: PyPI torch needs "
                   "CUDA wheels); golden-values/generate.py, numpy {np}")


@dataclass
class RefLinear:
    weight: np.ndarray          # float64 [out, in]: ternary (I2_S, .scale variants) or t*beta
    scale: float                # beta applied after the product (1.0 if folded into weight)


@dataclass
class RefModel:
    hp: HParams
    token_embd: np.ndarray      # float64 [n_vocab, n_embd] (also the tied LM head)
    output_norm: np.ndarray
    layers: list[dict]          # norm name -> gains, projection name -> RefLinear


def load_ref_model(path: Path) -> RefModel:
    """Read a model for the reference from a GGUF (F32/F16 tensors, I2_S, TQ2_0 with one block
    scale per tensor, optional .scale)."""
    g = GGUFFile(path)
    hp = HParams(n_vocab=int(g.hparam("vocab_size")), n_embd=int(g.hparam("embedding_length")),
                 n_ff=int(g.hparam("feed_forward_length")), n_head=int(g.hparam("attention.head_count")),
                 n_head_kv=int(g.hparam("attention.head_count_kv")), n_layer=int(g.hparam("block_count")),
                 n_ctx=int(g.hparam("context_length")), rope_base=float(g.hparam("rope.freq_base")),
                 eps=float(g.hparam("attention.layer_norm_rms_epsilon")))
    layers = []
    for il in range(hp.n_layer):
        p, layer = f"blk.{il}.", {}
        for nm in NORMS:
            layer[nm] = g.array(p + nm + ".weight")
        for nm, _, _ in hp.projections():
            if g.tensors[p + nm + ".weight"].ggml_type == GGML_I2_S:
                tern, beta = g.ternary_i2s(p + nm + ".weight")
                layer[nm] = RefLinear(tern.astype(np.float64), float(beta))
            elif g.tensors[p + nm + ".weight"].ggml_type == GGML_TQ2_0:
                tern, d = g.ternary_tq2_0(p + nm + ".weight")
                layer[nm] = RefLinear(tern.astype(np.float64), float(d))
            else:
                scale = (float(g.array(p + nm + ".scale")[0]) if p + nm + ".scale" in g.tensors
                         else 1.0)
                layer[nm] = RefLinear(g.array(p + nm + ".weight"), scale)
        layers.append(layer)
    return RefModel(hp, g.array("token_embd.weight"), g.array("output_norm.weight"), layers)


def ref_model_as(m: RefModel, dtype) -> RefModel:
    """The same model with every array in another float type (all reference functions keep the
    dtype of their inputs), used to estimate how much an f32 implementation deviates."""
    c = lambda a: a.astype(dtype)
    layers = [{k: (RefLinear(c(v.weight), dtype(v.scale)) if isinstance(v, RefLinear) else c(v))
               for k, v in L.items()} for L in m.layers]
    return RefModel(m.hp, c(m.token_embd), c(m.output_norm), layers)


def rms_norm(x: np.ndarray, gain: np.ndarray, eps: float) -> np.ndarray:
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * gain


def bit_linear(x: np.ndarray, lin: RefLinear, act_quant: str) -> np.ndarray:
    """y = beta * W x.  With per_token_i8 (the model's W1.58A8 semantics), each row x is first
    quantized: s = 127 / max(max|x|, 1e-5), q = clamp(round_half_even(x*s), -128, 127), and
    y = beta * (W q) / s (integer dot product, exact in float64). With q8_k, ggml's Q8_K blocks
    of the f32-rounded input (bit_linear_q8k), as llama.cpp does for TQ weights."""
    if act_quant == "none":
        return (x @ lin.weight.T) * lin.scale
    if act_quant == "per_token_i8":
        s = 127.0 / np.maximum(np.abs(x).max(axis=-1, keepdims=True), 1e-5)
        q = np.clip(np.rint(x * s), -128, 127)
        return (q @ lin.weight.T) / s * lin.scale
    if act_quant == "q8_k":
        return bit_linear_q8k(x.astype(np.float32), lin)
    raise ValueError(f"reference has no act_quant mode {act_quant!r}")


def rope_neox(x: np.ndarray, base: float) -> np.ndarray:
    """NeoX ("rotate half") RoPE on x [n_tok, n_heads, head_dim], positions 0..n_tok-1:
    pairs (i, i + d/2) rotated by pos * base^(-2i/d)."""
    n, _, d = x.shape
    theta = np.arange(n)[:, None] * base ** (-2.0 * np.arange(d // 2) / d)   # [n_tok, d/2]
    cos, sin = (np.cos(theta)[:, None, :].astype(x.dtype), np.sin(theta)[:, None, :].astype(x.dtype))
    x0, x1 = x[..., :d // 2], x[..., d // 2:]
    return np.concatenate([x0 * cos - x1 * sin, x0 * sin + x1 * cos], axis=-1)


def attention(q: np.ndarray, k: np.ndarray, v: np.ndarray) -> np.ndarray:
    """Causal softmax attention with GQA (query head h uses kv head h // (n_head / n_head_kv))."""
    n, n_head, d = q.shape
    group = n_head // k.shape[1]
    k, v = np.repeat(k, group, axis=1), np.repeat(v, group, axis=1)
    scores = np.einsum("ihd,jhd->hij", q, k) * (1.0 / d ** 0.5)
    scores = np.where(np.tril(np.ones((n, n), bool)), scores, -np.inf)
    p = np.exp(scores - scores.max(axis=-1, keepdims=True))
    p /= p.sum(axis=-1, keepdims=True)
    return np.einsum("hij,jhd->ihd", p, v).reshape(n, n_head * d)


ACTIVATIONS = {"relu2": lambda g: np.square(np.maximum(g, 0.0)),
               "silu": lambda g: g / (1.0 + np.exp(-g))}


def reference_forward(m: RefModel, tokens: list[int], activation: str, act_quant: str,
                      ops: dict[str, np.ndarray] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Returns logits [n_tok, n_vocab] and the residual stream after each layer
    [n_layer, n_tok, n_embd] (float64). If `ops` is a dict, every per-op tensor (OP_NAMES,
    "<op>-<il>", and "result_norm") is also stored in it as [n_tok, width]."""
    hp, n = m.hp, len(tokens)
    act = ACTIVATIONS[activation]
    rec = (lambda name, a: ops.__setitem__(name, a.reshape(n, -1))) if ops is not None else \
        (lambda name, a: None)
    x = m.token_embd[np.asarray(tokens)]
    hidden = []
    for il, L in enumerate(m.layers):
        h = rms_norm(x, L["attn_norm"], hp.eps)
        q = bit_linear(h, L["attn_q"], act_quant).reshape(n, hp.n_head, hp.head_dim)
        k = bit_linear(h, L["attn_k"], act_quant).reshape(n, hp.n_head_kv, hp.head_dim)
        v = bit_linear(h, L["attn_v"], act_quant).reshape(n, hp.n_head_kv, hp.head_dim)
        qr, kr = rope_neox(q, hp.rope_base), rope_neox(k, hp.rope_base)
        o = attention(qr, kr, v)
        for name, a in (("attn_norm", h), ("q_proj", q), ("k_proj", k), ("v_proj", v),
                        ("q_rope", qr), ("k_rope", kr), ("kqv_out", o)):
            rec(f"{name}-{il}", a)
        o = rms_norm(o, L["attn_sub_norm"], hp.eps)
        ao = bit_linear(o, L["attn_output"], act_quant)
        x = x + ao
        rec(f"attn_sub_norm-{il}", o), rec(f"attn_out-{il}", ao), rec(f"ffn_inp-{il}", x)
        h = rms_norm(x, L["ffn_norm"], hp.eps)
        gate, up = bit_linear(h, L["ffn_gate"], act_quant), bit_linear(h, L["ffn_up"], act_quant)
        a = act(gate) * up
        rec(f"ffn_norm-{il}", h), rec(f"ffn_gate-{il}", gate), rec(f"ffn_up-{il}", up)
        rec(f"ffn_act-{il}", a)
        a = rms_norm(a, L["ffn_sub_norm"], hp.eps)
        d = bit_linear(a, L["ffn_down"], act_quant)
        x = x + d
        rec(f"ffn_sub_norm-{il}", a), rec(f"ffn_down-{il}", d), rec(f"l_out-{il}", x)
        hidden.append(x)
    xn = rms_norm(x, m.output_norm, hp.eps)
    rec("result_norm", xn)
    logits = xn @ m.token_embd.T                                        # tied LM head
    return logits, np.stack(hidden)


def lm_head_from_hidden(m: RefModel, hidden_last: np.ndarray) -> np.ndarray:
    return rms_norm(hidden_last.astype(np.float64), m.output_norm, m.hp.eps) @ m.token_embd.T


def max_abs(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.max(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64))))


def validation_report() -> list[str]:
    """Compare the reference (SiLU, no activation quantization) with llama.cpp on the F32 models,
    and report a few other differences that help choosing test tolerances."""
    lines = ["# float64 NumPy reference vs llama.cpp " + LLAMA_CPP_COMMIT +
             " (FA off, KV F32, 2 threads), same token sequences (lengths "
             + ", ".join(map(str, SEQ_LENGTHS)) + ")", ""]
    row = "{:<52} {:>12} {:>11} {:>12} {:>11}"
    lines.append(row.format("comparison (max over all sequences and positions)", "max|dlogits|",
                            "max|logits|", "max|dhidden|", "max|hidden|"))

    def add(label, pairs_logits, pairs_hidden):
        dl = max(max_abs(a, b) for a, b in pairs_logits)
        ml = max(float(np.abs(b).max()) for _, b in pairs_logits)
        dh = f"{max(max_abs(a, b) for a, b in pairs_hidden):.3e}" if pairs_hidden else "-"
        mh = f"{max(float(np.abs(b).max()) for _, b in pairs_hidden):.2f}" if pairs_hidden else "-"
        lines.append(row.format(label, f"{dl:.3e}", f"{ml:.2f}", dh, mh))

    outs = {}
    for v in MAINLINE_VARIANTS:
        if not (OUT_DIR / f"{v.stem}.json").exists():
            return lines + ["", "llama.cpp outputs missing: run the `llama` step first"]
        outs[v.stem] = read_outputs(v.stem)
    seqs = token_sequences(TINY)
    for stem in ("tiny-f32", "tiny-f32-scale"):
        m = load_ref_model(MODELS_DIR / f"{stem}.gguf")
        refs = [reference_forward(m, t, "silu", "none") for t in seqs]
        gold = outs[stem][1]
        add(f"reference(silu,none) vs llama {stem}", [(r[0], g[0]) for r, g in zip(refs, gold)],
            [(r[1], g[1]) for r, g in zip(refs, gold)])
    lines.append("")
    lines.append("# consistency of llama.cpp's own outputs (row order of the last layer's l_out):")
    lines.append("# logits recomputed in float64 from hidden[n_layer-1] vs llama.cpp logits")
    for v in MAINLINE_VARIANTS:
        m = load_ref_model(MODELS_DIR / "tiny-f32.gguf")  # same norms/embedding in all variants
        gold = outs[v.stem][1]
        add(f"lm_head(hidden[-1]) vs logits {v.stem}",
            [(lm_head_from_hidden(m, g[1][-1]), g[0]) for g in gold], [])
    lines.append("")
    lines.append("# differences between storage formats of the same ternary model (llama.cpp):")
    for a, b in (("tiny-f32-scale", "tiny-f32"), ("tiny-tq1_0", "tiny-tq2_0"),
                 ("tiny-tq2_0", "tiny-f32"), ("tiny-tq2_0-f16emb", "tiny-tq2_0")):
        ga, gb = outs[a][1], outs[b][1]
        add(f"{a} vs {b}", [(x[0], y[0]) for x, y in zip(ga, gb)],
            [(x[1], y[1]) for x, y in zip(ga, gb)])
    lines.append("")
    lines.append("# effect of the model semantics on tiny-i2s (float64 reference only):")
    m = load_ref_model(I2S_VARIANT.path)
    base = [reference_forward(m, t, "relu2", "per_token_i8") for t in seqs]
    for act, aq in (("relu2", "none"), ("silu", "per_token_i8")):
        alt = [reference_forward(m, t, act, aq) for t in seqs]
        add(f"reference({act},{aq}) vs (relu2,per_token_i8)",
            [(x[0], y[0]) for x, y in zip(alt, base)], [(x[1], y[1]) for x, y in zip(alt, base)])
    m32 = ref_model_as(m, np.float32)
    alt = [reference_forward(m32, t, "relu2", "per_token_i8") for t in seqs]
    add("same in float32 arithmetic vs float64 (golden)",
        [(x[0], y[0]) for x, y in zip(alt, base)], [(x[1], y[1]) for x, y in zip(alt, base)])
    return lines


def step_reference() -> None:
    m = load_ref_model(I2S_VARIANT.path)
    results = []
    for toks in token_sequences(m.hp):
        logits, hidden = reference_forward(m, toks, I2S_VARIANT.activation, I2S_VARIANT.act_quant)
        results.append((toks, logits, hidden))
    write_outputs(I2S_VARIANT, m.hp, REFERENCE_LABEL.format(np=np.__version__), results)
    toks, ops64 = token_sequences(m.hp)[OPS_SEQUENCE], {}
    logits, hidden = reference_forward(m, toks, I2S_VARIANT.activation, I2S_VARIANT.act_quant,
                                       ops=ops64)
    assert np.array_equal(hidden, results[OPS_SEQUENCE][2])
    write_ops(I2S_VARIANT, m.hp, REFERENCE_LABEL.format(np=np.__version__), toks, ops64)
    report = validation_report()
    print("\n".join(report))
    (OUT_DIR / "reference-validation.txt").write_text("\n".join(report) + "\n")
    print("wrote out/reference-validation.txt")
    report = ops_validation_report(ops64)
    print("\n".join(report))
    (OUT_DIR / "ops-validation.txt").write_text("\n".join(report) + "\n")
    print("wrote out/ops-validation.txt")


# ============================================================================================
# Per-op reference tensors (sequence s1, every layer)
# ============================================================================================
#
# For per-op tests with teacher forcing: each op of the engine can be fed the reference's own
# input tensor, so one flipped int8 activation code upstream cannot hide or fake an error.
#
# out/<stem>.ops.json + out/<stem>.ops.f32 (one float32 LE blob; every op is [n_tokens][width]
# at a byte offset). Op names (per layer il, "<op>-<il>"), in graph order:
#   attn_norm       RMSNorm(residual) * attn_norm gain               (llama.cpp attn_norm-il, MUL)
#   q_proj, k_proj, v_proj   projections incl. their scale, before RoPE  (first Qcur/Kcur/Vcur-il)
#   q_rope, k_rope  after NeoX RoPE, heads concatenated                 (Qcur/Kcur-il, ROPE)
#   kqv_out         attention output, heads concatenated, before attn_sub_norm
#   attn_sub_norm   RMSNorm(kqv_out) * gain
#   attn_out        wo projection incl. scale
#   ffn_inp         residual + attn_out
#   ffn_norm        RMSNorm(ffn_inp) * gain
#   ffn_gate, ffn_up   projections incl. scale                         (ffn_gate_s/ffn_up_s if any)
#   ffn_act         act(ffn_gate) * ffn_up                              (llama.cpp ffn_sub_out-il)
#   ffn_sub_norm    RMSNorm(ffn_act) * gain
#   ffn_down        down projection incl. scale
#   l_out           ffn_inp + ffn_down
# and "result_norm" = RMSNorm(l_out-<last>) * output_norm (no layer suffix).

OPS_SEQUENCE = 1                # index of the token sequence (16 tokens)
OP_NAMES = ("attn_norm", "q_proj", "k_proj", "v_proj", "q_rope", "k_rope", "kqv_out",
            "attn_sub_norm", "attn_out", "ffn_inp", "ffn_norm", "ffn_gate", "ffn_up", "ffn_act",
            "ffn_sub_norm", "ffn_down", "l_out")
# llama.cpp graph names (cb() names, "<name>-<il>") that hold the ops above
_LLAMA_LAYER_NAMES = ("attn_norm", "Qcur", "Kcur", "Vcur", "kqv_out", "attn_sub_norm",
                      "attn_out", "ffn_inp", "ffn_norm", "ffn_gate", "ffn_gate_s", "ffn_up",
                      "ffn_up_s", "ffn_sub_out", "ffn_sub_norm", "ffn_down", "l_out")


def op_keys(hp: HParams) -> list[str]:
    return [f"{op}-{il}" for il in range(hp.n_layer) for op in OP_NAMES] + ["result_norm"]


def op_width(hp: HParams, key: str) -> int:
    op = key.rsplit("-", 1)[0]
    if op in ("k_proj", "v_proj", "k_rope"):
        return hp.n_embd_kv
    if op in ("ffn_gate", "ffn_up", "ffn_act", "ffn_sub_norm"):
        return hp.n_ff
    return hp.n_embd


def llama_op_graph_names(hp: HParams) -> set[str]:
    return {f"{nm}-{il}" for il in range(hp.n_layer) for nm in _LLAMA_LAYER_NAMES} | {"result_norm"}


def llama_ops_from_capture(captured: list[tuple[str, str, tuple, np.ndarray]], hp: HParams,
                           n: int) -> dict[str, np.ndarray]:
    """Map the captured llama.cpp graph tensors (name, op, ne, [n, -1] values, graph order) to
    OP_NAMES. Qcur/Kcur/Vcur-<il> name up to three tensors: the projection (MUL_MAT, or MUL
    when a .scale tensor exists), its RESHAPE to [head_dim, n_head, n] (same values) and, for
    Q and K, the ROPE output. ffn_gate/ffn_up: with a .scale tensor, ffn_<x>-<il> is the bare
    MUL_MAT and ffn_<x>_s-<il> the scaled result, which is the one kept. The SiLU gate product is
    ggml's fused SWIGLU, renamed ffn_sub_out-<il> by the bitnet graph."""
    by_name: dict[str, list[tuple[str, tuple, np.ndarray]]] = {}
    for name, op, ne, a in captured:
        by_name.setdefault(name, []).append((op, ne, a))

    def one(name: str, ops: tuple[str, ...]) -> np.ndarray:
        hits = [a for op, _, a in by_name.get(name, []) if op in ops]
        assert len(hits) == 1, f"{name}: {len(hits)} tensors with op in {ops}: {by_name.get(name)}"
        return hits[0]

    out = {}
    for il in range(hp.n_layer):
        for x in ("q", "k", "v"):
            nm = f"{x.upper()}cur-{il}"
            assert {op for op, _, _ in by_name[nm]} <= {"MUL_MAT", "MUL", "RESHAPE", "ROPE"}, nm
            out[f"{x}_proj-{il}"] = one(nm, ("MUL_MAT", "MUL"))
            if x != "v":
                out[f"{x}_rope-{il}"] = one(nm, ("ROPE",))
            else:
                assert not [op for op, _, _ in by_name[nm] if op == "ROPE"], nm
        for op, nm, kinds in (("attn_norm", "attn_norm", ("MUL",)), ("kqv_out", "kqv_out", ("CONT",)),
                              ("attn_sub_norm", "attn_sub_norm", ("MUL",)),
                              ("attn_out", "attn_out", ("MUL_MAT", "MUL")),
                              ("ffn_inp", "ffn_inp", ("ADD",)), ("ffn_norm", "ffn_norm", ("MUL",)),
                              ("ffn_act", "ffn_sub_out", ("SWIGLU",)),
                              ("ffn_sub_norm", "ffn_sub_norm", ("MUL",)),
                              ("ffn_down", "ffn_down", ("MUL_MAT", "MUL")), ("l_out", "l_out", ("ADD",))):
            out[f"{op}-{il}"] = one(f"{nm}-{il}", kinds)
        for x in ("gate", "up"):
            scaled = f"ffn_{x}_s-{il}" in by_name
            out[f"ffn_{x}-{il}"] = (one(f"ffn_{x}_s-{il}", ("MUL",)) if scaled
                                    else one(f"ffn_{x}-{il}", ("MUL_MAT",)))
    out["result_norm"] = one("result_norm", ("MUL",))
    for key in op_keys(hp):
        assert out[key].shape == (n, op_width(hp, key)), (key, out[key].shape)
        assert np.isfinite(out[key]).all(), key
    return {key: out[key] for key in op_keys(hp)}


def write_ops(v: Variant, hp: HParams, reference: str, tokens: list[int],
              ops: dict[str, np.ndarray]) -> None:
    """out/<stem>.ops.f32 (all ops, float32 LE, concatenated in op_keys order) + .ops.json."""
    n, blob_name, offset, entries, blobs = len(tokens), f"{v.stem}.ops.f32", 0, {}, []
    for key in op_keys(hp):
        a = np.ascontiguousarray(ops[key], "<f4")
        assert a.shape == (n, op_width(hp, key)) and np.isfinite(a).all(), key
        entries[key] = {"file": blob_name, "offset": offset, "shape": [n, a.shape[1]]}
        blobs.append(a.tobytes())
        offset += a.nbytes
    (OUT_DIR / blob_name).write_bytes(b"".join(blobs))
    head = {"model": f"models/{v.stem}.gguf", "reference": reference, "activation": v.activation,
            "act_quant": v.act_quant, "sequence": OPS_SEQUENCE, "tokens": [int(t) for t in tokens],
            "n_tokens": n}
    lines = [f" {json.dumps(k)}: {json.dumps(val)}," for k, val in head.items()]
    ops_lines = ",\n".join(f"  {json.dumps(k)}: {json.dumps(e)}" for k, e in entries.items())
    (OUT_DIR / f"{v.stem}.ops.json").write_text("{\n" + "\n".join(lines) + '\n "ops": {\n'
                                                + ops_lines + "\n }\n}\n")
    print(f"wrote out/{v.stem}.ops.json + {blob_name} ({offset:,d} B, {len(entries)} tensors)")


def read_ops(stem: str) -> tuple[dict, dict[str, np.ndarray]]:
    man = json.loads((OUT_DIR / f"{stem}.ops.json").read_text())
    blobs: dict[str, bytes] = {}
    ops = {}
    for key, e in man["ops"].items():
        if e["file"] not in blobs:
            blobs[e["file"]] = (OUT_DIR / e["file"]).read_bytes()
        rows, cols = e["shape"]
        ops[key] = np.frombuffer(blobs[e["file"]], "<f4", rows * cols, e["offset"]).reshape(rows, cols)
    return man, ops


def q8k_quantize(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """ggml's quantize_row_q8_K_ref (used by the x86 CPU backend) on float32 rows [n, K]:
    per block of 256, max = the first element of largest |x|, iscale = f32(-127 / max),
    q = min(127, round_half_even(f32(iscale * x))), d = f32(1 / iscale).
    Returns q [n, K/256, 256] (int64) and d [n, K/256] (float32)."""
    x = np.asarray(x, np.float32)
    xb = x.reshape(x.shape[0], -1, 256)
    idx = np.abs(xb).argmax(axis=-1)[..., None]
    mx = np.take_along_axis(xb, idx, axis=-1)                          # signed, [n, nb, 1]
    zero = mx == 0
    with np.errstate(divide="ignore", invalid="ignore"):
        iscale = np.where(zero, np.float32(0), np.float32(-127.0) / mx).astype(np.float32)
        d = np.where(zero, np.float32(0), np.float32(1.0) / iscale).astype(np.float32)
    q = np.minimum(np.rint((iscale * xb).astype(np.float32)), 127).astype(np.int64)
    return q, d[..., 0]


def bit_linear_q8k(x: np.ndarray, lin: RefLinear) -> np.ndarray:
    """What llama.cpp's CPU mat-mul computes for a TQ1_0/TQ2_0 weight (ternary t, scale beta in
    the block d and/or a .scale tensor): y = beta * sum_blocks d_x * (t . q_x), evaluated in
    float64 from the exact int8 codes (llama.cpp rounds the products to f32)."""
    q, d = q8k_quantize(x)
    t = lin.weight.reshape(lin.weight.shape[0], -1, 256).astype(np.float64)
    out = np.zeros((q.shape[0], t.shape[0]))
    for b in range(q.shape[1]):   # |block sum| <= 127 * 256: exact in float64, so BLAS is exact
        out += (q[:, b].astype(np.float64) @ t[:, b].T) * d[:, b:b + 1].astype(np.float64)
    return out * lin.scale


def per_op_recompute(m: RefModel, tokens: list[int], ops: dict[str, np.ndarray],
                     activation: str, act_quant: str) -> dict[str, np.ndarray]:
    """Each op recomputed in float64 from the STORED (float32) tensors of its inputs, i.e.
    what a per-op test with teacher forcing does. m: ternary weights + beta as RefLinear.scale."""
    hp, n = m.hp, len(tokens)
    act = ACTIVATIONS[activation]
    o = {k: np.asarray(a, np.float64) for k, a in ops.items()}

    def mm(x, lin):
        return bit_linear_q8k(x.astype(np.float32), lin) if act_quant == "q8_k" else \
            bit_linear(x, lin, act_quant)

    def heads(a, h):
        return a.reshape(n, h, hp.head_dim)

    exp = {}
    for il, L in enumerate(m.layers):
        prev = m.token_embd[np.asarray(tokens)] if il == 0 else o[f"l_out-{il - 1}"]
        g = lambda op: o[f"{op}-{il}"]
        exp[f"attn_norm-{il}"] = rms_norm(prev, L["attn_norm"], hp.eps)
        for x, w in (("q", "attn_q"), ("k", "attn_k"), ("v", "attn_v")):
            exp[f"{x}_proj-{il}"] = mm(g("attn_norm"), L[w])
        exp[f"q_rope-{il}"] = rope_neox(heads(g("q_proj"), hp.n_head), hp.rope_base).reshape(n, -1)
        exp[f"k_rope-{il}"] = rope_neox(heads(g("k_proj"), hp.n_head_kv), hp.rope_base).reshape(n, -1)
        exp[f"kqv_out-{il}"] = attention(heads(g("q_rope"), hp.n_head), heads(g("k_rope"), hp.n_head_kv),
                                         heads(g("v_proj"), hp.n_head_kv))
        exp[f"attn_sub_norm-{il}"] = rms_norm(g("kqv_out"), L["attn_sub_norm"], hp.eps)
        exp[f"attn_out-{il}"] = mm(g("attn_sub_norm"), L["attn_output"])
        exp[f"ffn_inp-{il}"] = prev + g("attn_out")
        exp[f"ffn_norm-{il}"] = rms_norm(g("ffn_inp"), L["ffn_norm"], hp.eps)
        exp[f"ffn_gate-{il}"] = mm(g("ffn_norm"), L["ffn_gate"])
        exp[f"ffn_up-{il}"] = mm(g("ffn_norm"), L["ffn_up"])
        exp[f"ffn_act-{il}"] = act(g("ffn_gate")) * g("ffn_up")
        exp[f"ffn_sub_norm-{il}"] = rms_norm(g("ffn_act"), L["ffn_sub_norm"], hp.eps)
        exp[f"ffn_down-{il}"] = mm(g("ffn_sub_norm"), L["ffn_down"])
        exp[f"l_out-{il}"] = g("ffn_inp") + g("ffn_down")
    exp["result_norm"] = rms_norm(o[f"l_out-{hp.n_layer - 1}"], m.output_norm, hp.eps)
    return exp


def i8_code_flips(x64: np.ndarray) -> int:
    """How many per-token int8 codes change when the float64 input is stored as float32 first."""
    def codes(x):
        s = 127.0 / np.maximum(np.abs(x).max(axis=-1, keepdims=True), 1e-5)
        return np.clip(np.rint(x * s), -128, 127)
    return int((codes(x64) != codes(x64.astype(np.float32).astype(np.float64))).sum())


def ops_validation_report(i2s_ops64: dict[str, np.ndarray]) -> list[str]:
    """Per-op consistency of the stored op tensors of all six models (see per_op_recompute):
    max |stored - recomputed| per op kind (max over layers and tokens). Mainline files must agree
    to f32 rounding (asserted); for tiny-i2s, int8 code flips caused by the f32 storage of the
    BitLinear inputs are counted."""
    hp = TINY
    stems = [v.stem for v in MAINLINE_VARIANTS] + [I2S_VARIANT.stem]
    missing = [s for s in stems if not (OUT_DIR / f"{s}.ops.json").exists()]
    if missing:
        return [f"op tensors missing for {', '.join(missing)}: run the `llama` step first"]
    m_main = load_ref_model(MODELS_DIR / "tiny-f32-scale.gguf")   # ternary + beta16 as .scale
    m_i2s = load_ref_model(I2S_VARIANT.path)
    tokens = token_sequences(hp)[OPS_SEQUENCE]
    lines = ["# per-op consistency of out/<stem>.ops.f32 (sequence s%d, %d tokens): each op "
             "recomputed in float64 from the stored" % (OPS_SEQUENCE, len(tokens)),
             "# float32 tensors of its inputs (teacher forcing per op). max|stored - recomputed| "
             "over both layers and all tokens;",
             "# last column: max|stored value| over all models. Matmuls: f32 models plain, TQ "
             "models via an exact emulation of ggml's Q8_K", "# activation quantization, "
             "tiny-i2s per-token int8 (from the f32-stored input).", ""]
    row = "{:<14}" + " {:>10}" * len(stems) + " {:>9}"
    lines.append(row.format("op", *[s.replace("tiny-", "") for s in stems], "max|val|"))
    diffs, vmax = {}, {}
    for stem in stems:
        v = next(x for x in MAINLINE_VARIANTS + [I2S_VARIANT] if x.stem == stem)
        man, ops = read_ops(stem)
        assert man["tokens"] == tokens and list(man["ops"]) == op_keys(hp), stem
        _, gold = read_outputs(stem)
        assert np.array_equal(np.stack([ops[f"l_out-{il}"] for il in range(hp.n_layer)]),
                              gold[OPS_SEQUENCE][1]), f"{stem}: l_out != golden hidden"
        exp = per_op_recompute(m_i2s if stem == I2S_VARIANT.stem else m_main, tokens, ops,
                               v.activation, v.act_quant)
        for key in op_keys(hp):
            op = key.rsplit("-", 1)[0] if key != "result_norm" else key
            diffs.setdefault(op, {})[stem] = max(diffs.get(op, {}).get(stem, 0.0),
                                                 max_abs(ops[key], exp[key]))
            vmax[op] = max(vmax.get(op, 0.0), float(np.abs(ops[key]).max()))
    for op in list(OP_NAMES) + ["result_norm"]:
        lines.append(row.format(op, *[f"{diffs[op][s]:.2e}" for s in stems], f"{vmax[op]:.2f}"))
        for s in stems[:-1]:                    # llama.cpp: every op at f32 rounding level
            assert diffs[op][s] <= 2e-5 * max(1.0, vmax[op]), (s, op, diffs[op][s])
    lines.append("")
    flips = {nm: sum(i8_code_flips(i2s_ops64[f"{nm}-{il}"]) for il in range(hp.n_layer))
             for nm in ("attn_norm", "attn_sub_norm", "ffn_norm", "ffn_sub_norm")}
    total = {nm: hp.n_layer * len(tokens) * op_width(hp, f"{nm}-0") for nm in flips}
    lines.append("# tiny-i2s: per-token int8 codes that change when a BitLinear input is taken "
                 "from the f32 file instead of")
    lines.append("# the float64 reference: " + ", ".join(f"{nm} {flips[nm]}/{total[nm]}"
                                                          for nm in flips))
    return lines


# ============================================================================================
# The 2B4T-geometry golden model: real head shapes, a 1056-position context
# ============================================================================================
#
# Attention exactly as BitNet b1.58 2B4T (20 query heads, 5 KV heads, head width 128, so
# n_embd 2560), FFN 6912 (ratio 2.7), 2 layers, vocabulary 512, context 1056, TQ2_0 weights
# with an F16 embedding (what a conversion of the official file to mainline keeps). The file is
# ~38 MB, too big to commit: its content comes from a counter-based generator simple enough to
# restate in Rust (tests/src/geometry.rs), and the tests rebuild the same bytes and check them
# against the SHA-256 recorded here before comparing with llama.cpp.
#
#   value(tensor t, element i) = mix64(GEO_SEED ^ (t << 40 | i))      (SplitMix64's finalizer)
#   unit = (value >> 40) / 2^24                                        (exact in f32)
#   token_embd[i] = f16((unit - 0.5) * 0.25)      norm gain[i] = 0.875 + 0.25 * unit  (f32)
#   projection code[i] = value % 3 (t = code - 1); its TQ2_0 block scale d = f16((1 + unit) *
#   2^-5) (2^-6 for ffn_down), unit of element 0 of stream t + BETA_STREAM
# where t is the tensor's index in the file.

GEO = HParams(n_vocab=512, n_embd=2560, n_ff=6912, n_head=20, n_head_kv=5, n_layer=2, n_ctx=1056)
GEO_VARIANT = Variant("geo-2b4t-tq2_0", "bitnet", GGML_TQ2_0, False, GGML_F16, "silu", "q8_k")
GEO_SEED = 0x2B4_7E57_9E0D
GEO_BETA_STREAM = 1000
GEO_SHORT = 16                   # tokens of the short sequence (hidden states recorded)


def mix64(z: np.ndarray) -> np.ndarray:
    """SplitMix64's output function on uint64 (wrapping arithmetic)."""
    z = z + np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def geo_values(tensor: int, n: int) -> np.ndarray:
    with np.errstate(over="ignore"):
        return mix64(np.uint64(GEO_SEED) ^ ((np.uint64(tensor) << np.uint64(40))
                                            | np.arange(n, dtype=np.uint64)))


def geo_unit(values: np.ndarray) -> np.ndarray:
    return (values >> np.uint64(40)).astype(np.float32) * np.float32(2.0 ** -24)


def geo_tensor_bytes(index: int, info: TensorInfo) -> bytes:
    n = int(np.prod(info.ne))
    v = geo_values(index, n)
    if info.name == "token_embd.weight":
        return ((geo_unit(v) - np.float32(0.5)) * np.float32(0.25)).astype("<f2").tobytes()
    if info.ggml_type == GGML_F32:                            # norm gains
        return (np.float32(0.875) + np.float32(0.25) * geo_unit(v)).astype("<f4").tobytes()
    codes = (v % np.uint64(3)).astype(np.uint8)
    step = np.float32(2.0 ** (-6 if ".ffn_down." in info.name else -5))
    d = np.float16((np.float32(1) + geo_unit(geo_values(index + GEO_BETA_STREAM, 1))[0]) * step)
    return pack_tq2_0(codes, d)


def write_geo_model(path: Path) -> str:
    """Writes the geometry model; returns its SHA-256 (hex)."""
    import hashlib
    infos = variant_tensor_infos(GEO_VARIANT, GEO)
    w = GGUFStreamWriter(path, mainline_kvs(GEO, "geo-2b4t (synthetic, hesper-rs)", 37), infos)
    for index, info in enumerate(infos):
        w.write(info.name, geo_tensor_bytes(index, info))
    w.close()
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def agreement(ours: np.ndarray, reference: np.ndarray) -> dict:
    """What tests/src/lib.rs's Agreement measures, for the manifest."""
    a, b = np.asarray(ours, np.float64), np.asarray(reference, np.float64)
    cos = (a * b).sum(-1) / np.linalg.norm(a, axis=-1) / np.linalg.norm(b, axis=-1)
    return {"min_cosine": round(float(cos.min()), 7),
            "same_argmax": int((a.argmax(-1) == b.argmax(-1)).sum()), "positions": len(a)}


def geo_controls(path: Path, tokens: list[int], llama_logits: np.ndarray) -> dict:
    """The long sequence through the float64 reference with two activation schemes, each
    compared with llama.cpp: an exact emulation of llama.cpp's own Q8_K scheme (what a correct
    engine can reach: only f32 rounding differs, and it moves int8 codes) and per-token int8 (a
    known-wrong scheme). The tests check that their bound accepts the first and rejects the
    second."""
    m = load_ref_model(path)
    out = {}
    for name, aq in (("exact_q8_k_emulation", "q8_k"), ("per_token_i8", "per_token_i8")):
        t0 = time.time()
        logits, _ = reference_forward(m, tokens, GEO_VARIANT.activation, aq)
        out[name] = agreement(logits, llama_logits)
        print(f"  control {name}: {out[name]} ({time.time() - t0:.0f} s)")
    return out


def step_geometry(threads: int, model_dir: Path) -> None:
    """Writes the geometry model to model_dir (not committed), runs llama.cpp on a short
    sequence (logits + hidden states) and on one that fills the context (logits only), and writes
    out/geo-2b4t-tq2_0.json with the model's SHA-256."""
    model_dir.mkdir(parents=True, exist_ok=True)
    path = model_dir / f"{GEO_VARIANT.stem}.gguf"
    t0 = time.time()
    sha = write_geo_model(path)
    print(f"wrote {path} {path.stat().st_size:,d} B sha256 {sha} ({time.time() - t0:.0f} s)")
    rng = np.random.default_rng(TOKEN_SEED + 1)
    seqs = [[1] + rng.integers(0, GEO.n_vocab, n - 1).tolist() for n in (GEO_SHORT, GEO.n_ctx)]
    llama = LlamaCpp(threads)
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    entries = []
    for i, toks in enumerate(seqs):
        t0 = time.time()
        logits, hidden, _ = llama.run(path, GEO, toks)
        lf = f"{GEO_VARIANT.stem}.s{i}.logits.f32"
        np.ascontiguousarray(logits, "<f4").tofile(OUT_DIR / lf)
        entry = {"tokens": [int(t) for t in toks], "logits": lf}
        if len(toks) == GEO_SHORT:
            hf = f"{GEO_VARIANT.stem}.s{i}.hidden.f32"
            np.ascontiguousarray(hidden, "<f4").tofile(OUT_DIR / hf)
            entry["hidden"] = hf
        entries.append(entry)
        print(f"  {len(toks)} tokens: llama.cpp {time.time() - t0:.1f} s")
        if len(toks) == GEO.n_ctx:
            controls = geo_controls(path, toks, logits)
    manifest = {"model": f"generated: {GEO_VARIANT.stem}.gguf", "model_sha256": sha,
                "reference": llama.description(), "activation": GEO_VARIANT.activation,
                "act_quant": GEO_VARIANT.act_quant, "n_vocab": GEO.n_vocab,
                "n_embd": GEO.n_embd, "n_layer": GEO.n_layer, "n_ctx": GEO.n_ctx,
                "controls": controls, "sequences": entries}
    (OUT_DIR / f"{GEO_VARIANT.stem}.json").write_text(format_manifest(manifest))
    print(f"wrote out/{GEO_VARIANT.stem}.json")


# ============================================================================================
# A known-wrong control for the model-level bound of quantized files
# ============================================================================================

CONTROL_STEM = "tiny-tq2_0.per-token-i8"


def step_control() -> None:
    """tiny-tq2_0's logits with per-token int8 activations where llama.cpp quantizes to Q8_K
    blocks of 256 (everything else exact: float64 reference, SiLU, the file's ternary weights
    and f16 scales). The tests assert that their model-level bound for quantized files rejects
    these logits against llama.cpp's: a bound that passes them cannot tell the schemes apart."""
    m = load_ref_model(MODELS_DIR / "tiny-f32-scale.gguf")     # tiny-tq2_0's values, as F32
    seqs = []
    for i, toks in enumerate(token_sequences(TINY)):
        logits, _ = reference_forward(m, toks, "silu", "per_token_i8")
        lf = f"{CONTROL_STEM}.s{i}.logits.f32"
        np.ascontiguousarray(logits, "<f4").tofile(OUT_DIR / lf)
        seqs.append({"tokens": [int(t) for t in toks], "logits": lf})
    manifest = {"model": "models/tiny-tq2_0.gguf",
                "reference": "known-wrong control: " + REFERENCE_LABEL.format(np=np.__version__)
                + ", per-token int8 activations where llama.cpp uses Q8_K",
                "activation": "silu", "act_quant": "per_token_i8", "n_vocab": TINY.n_vocab,
                "n_embd": TINY.n_embd, "n_layer": TINY.n_layer, "sequences": seqs}
    (OUT_DIR / f"{CONTROL_STEM}.json").write_text(format_manifest(manifest))
    print(f"wrote out/{CONTROL_STEM}.json (+{len(seqs)} .f32 files)")


# ============================================================================================
# Synthetic 2B4T-shaped models for benchmarks (streamed, not committed)
# ============================================================================================

def step_bench_2b4t(out_dir: Path, seed: int, n_layer: int = BITNET_2B4T.n_layer) -> None:
    """Same generator as the tiny models, one tensor at a time into three files at once; with
    `n_layer` below 30, the first layers of the same weights (a ring's splits are tried on it)."""
    hp = dataclasses.replace(BITNET_2B4T, n_layer=n_layer)
    out_dir.mkdir(parents=True, exist_ok=True)
    i2s = Variant("bench-2b4t-i2s", "bitnet-b1.58", GGML_I2_S, False, GGML_F16, "relu2",
                  "per_token_i8")
    tq2 = Variant("bench-2b4t-tq2_0", "bitnet", GGML_TQ2_0, False, GGML_F16, "silu", "q8_k")
    tq1 = Variant("bench-2b4t-tq1_0", "bitnet", GGML_TQ1_0, False, GGML_F16, "silu", "q8_k")
    writers = [(v, GGUFStreamWriter(out_dir / f"{v.stem}.gguf",
                                    official_kvs(hp, "bench-2b4t (synthetic, hesper-rs)")
                                    if v.arch == "bitnet-b1.58"
                                    else mainline_kvs(hp, "bench-2b4t (synthetic, hesper-rs)",
                                                      v.file_type),
                                    variant_tensor_infos(v, hp))) for v in (i2s, tq2, tq1)]

    def emit(name: str, data_for) -> None:
        for v, w in writers:
            w.write(name, data_for(v))

    t0 = time.time()
    for k in range((hp.n_vocab + EMB_CHUNK - 1) // EMB_CHUNK):
        chunk = gen_embedding_chunk(seed, hp, k)
        emit("token_embd.weight", lambda v: chunk)
    norm = gen_norm(seed, "output_norm.weight", hp.n_embd)
    emit("output_norm.weight", lambda v: norm)
    shapes = {nm: (r, c) for nm, r, c in hp.projections()}
    for il in range(hp.n_layer):
        for name, role in layer_tensor_order(il, False):
            if role in NORMS:
                g = gen_norm(seed, name, hp.n_ff if role == "ffn_sub_norm" else hp.n_embd)
                emit(name, lambda v: g)
            else:
                p = gen_projection(seed, name, *shapes[role])
                emit(name, lambda v: encode_projection(v, p))
        print(f"  layer {il + 1}/{hp.n_layer} ({time.time() - t0:.0f} s)", flush=True)
    for v, w in writers:
        w.close()
        print(f"wrote {w.path}  {w.path.stat().st_size:,d} B")


# ============================================================================================
# CLI
# ============================================================================================

def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("steps", nargs="*", metavar="STEP",
                    help="models, llama, reference (default: all three), geometry, control")
    ap.add_argument("--seed", type=int, default=SEED, help=f"model seed (default {SEED})")
    ap.add_argument("--threads", type=int, default=2, help="llama.cpp threads (default 2)")
    ap.add_argument("--geo-dir", metavar="DIR", type=Path, default=Path("/tmp/hesper-geo"),
                    help="where the geometry step writes its model (default /tmp/hesper-geo)")
    ap.add_argument("--bench-2b4t", metavar="DIR", type=Path,
                    help="write the 2B4T-shaped benchmark models (I2_S + TQ2_0) into DIR")
    ap.add_argument("--bench-layers", metavar="N", type=int, default=BITNET_2B4T.n_layer,
                    help="layers of the --bench-2b4t models (default 30, the model's)")
    a = ap.parse_args()
    steps = a.steps or ([] if a.bench_2b4t else ["models", "llama", "reference"])
    unknown = set(steps) - {"models", "llama", "reference", "geometry", "control"}
    if unknown:
        ap.error(f"unknown step(s): {', '.join(sorted(unknown))}")
    for step in ("models", "llama", "reference", "geometry", "control"):
        if step in steps:
            print(f"== {step}")
            {"models": lambda: step_models(a.seed), "llama": lambda: step_llama(a.threads),
             "reference": step_reference, "geometry": lambda: step_geometry(a.threads, a.geo_dir),
             "control": step_control}[step]()
    if a.bench_2b4t:
        print("== bench-2b4t")
        step_bench_2b4t(a.bench_2b4t, a.seed, a.bench_layers)


if __name__ == "__main__":
    main()
