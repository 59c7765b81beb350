"""A small GGUF v3 writer in pure Python (struct + array), enough for f32 test models.

Layout (GGUF v3, little-endian): magic "GGUF", u32 version, u64 tensor count, u64 metadata
count, metadata (key string, u32 type, value), tensor infos (name, u32 n_dims, u64 dims with
ne[0] -- the contiguous dimension -- first, u32 ggml type, u64 offset into the data section),
padding to the alignment, then tensor data, each tensor starting at an aligned offset.
Strings are u64 length + UTF-8 bytes.
"""
import array
import struct
import sys

GGUF_MAGIC = b"GGUF"
ALIGNMENT = 32
T_UINT32, T_INT32, T_FLOAT32, T_BOOL, T_STRING, T_ARRAY = 4, 5, 6, 7, 8, 9
GGML_F32 = 0


def _string(s):
    b = s.encode("utf-8")
    return struct.pack("<Q", len(b)) + b


def _value(vtype, value):
    if vtype == T_UINT32:
        return struct.pack("<I", value)
    if vtype == T_INT32:
        return struct.pack("<i", value)
    if vtype == T_FLOAT32:
        return struct.pack("<f", value)
    if vtype == T_BOOL:
        return struct.pack("<B", 1 if value else 0)
    if vtype == T_STRING:
        return _string(value)
    raise ValueError("unsupported scalar type %d" % vtype)


class GgufModel:
    def __init__(self):
        self.metadata = []  # (key, type, value) or (key, T_ARRAY, (elem_type, list))
        self.tensors = []   # (name, dims ne0-first, array('f'))

    def add(self, key, vtype, value):
        self.metadata.append((key, vtype, value))

    def add_array(self, key, elem_type, values):
        self.metadata.append((key, T_ARRAY, (elem_type, list(values))))

    def add_tensor_f32(self, name, dims, values):
        """dims: ne[0] first (for a torch [out, in] weight: [in, out]); values row-major."""
        data = array.array("f", values)
        n = 1
        for d in dims:
            n *= d
        if len(data) != n:
            raise ValueError("%s: %d values for dims %s" % (name, len(data), dims))
        self.tensors.append((name, list(dims), data))

    def to_bytes(self):
        out = bytearray()
        out += GGUF_MAGIC + struct.pack("<IQQ", 3, len(self.tensors), len(self.metadata))
        for key, vtype, value in self.metadata:
            out += _string(key) + struct.pack("<I", vtype)
            if vtype == T_ARRAY:
                elem_type, items = value
                out += struct.pack("<IQ", elem_type, len(items))
                for item in items:
                    out += _value(elem_type, item)
            else:
                out += _value(vtype, value)
        offset = 0
        offsets = []
        for name, dims, data in self.tensors:
            offsets.append(offset)
            out += _string(name) + struct.pack("<I", len(dims))
            for d in dims:
                out += struct.pack("<Q", d)
            out += struct.pack("<IQ", GGML_F32, offset)
            offset += len(data) * 4
            offset = (offset + ALIGNMENT - 1) // ALIGNMENT * ALIGNMENT
        out += b"\0" * ((-len(out)) % ALIGNMENT)
        data_start = len(out)
        for (name, dims, data), off in zip(self.tensors, offsets):
            out += b"\0" * (data_start + off - len(out))
            blob = array.array("f", data)
            if sys.byteorder != "little":
                blob.byteswap()
            out += blob.tobytes()
        return bytes(out)


def permute_rows_for_llama(rows, n_head, head_dim):
    """HF stores each head's Q/K rows as [first halves | second halves] (rotate_half RoPE);
    llama.cpp's converter reorders them so each rotated pair is adjacent (its "normal" RoPE):
    new row h*hd + 2i + j = old row h*hd + j*hd/2 + i. rows: list of rows (lists)."""
    out = [None] * len(rows)
    half = head_dim // 2
    for h in range(n_head):
        for i in range(half):
            for j in range(2):
                out[h * head_dim + 2 * i + j] = rows[h * head_dim + j * half + i]
    assert len(rows) == n_head * head_dim
    return out


def byte_level_tokens():
    """The 256 single-byte tokens of a byte-level BPE vocabulary (GPT-2's byte-to-unicode map)."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAC + 1)) + list(range(0xAE, 0xFF + 1))
    mapping = {}
    extra = 0
    for b in range(256):
        if b in printable:
            mapping[b] = chr(b)
        else:
            mapping[b] = chr(256 + extra)
            extra += 1
    return [mapping[b] for b in range(256)]
