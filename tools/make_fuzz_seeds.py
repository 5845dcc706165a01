#!/usr/bin/env python3
"""Write the small hand-built seed corpora for the fuzzers (fuzz/corpus/{gguf,safetensors}).

Each seed is a valid file exercising a different part of the format (GGUF spec, ggml/docs/gguf.md;
huggingface/safetensors README). Deterministic; total well under 50 KB. Run from the repo root:
    python3 tools/make_fuzz_seeds.py
"""
import json
import os
import struct

# ggml type number -> (block elements, block bytes)
TYPES = {0: (1, 4), 1: (1, 2), 2: (32, 18), 3: (32, 20), 6: (32, 22), 7: (32, 24), 8: (32, 34),
         12: (256, 144), 13: (256, 176), 14: (256, 210), 30: (1, 2)}
U8, I8, U16, I16, U32, I32, F32, BOOL, STR, ARR, U64, I64, F64 = range(13)
SCALAR = {U8: "<B", I8: "<b", U16: "<H", I16: "<h", U32: "<I", I32: "<i", F32: "<f", BOOL: "<?",
          U64: "<Q", I64: "<q", F64: "<d"}


def gstr(s):
    b = s.encode() if isinstance(s, str) else s
    return struct.pack("<Q", len(b)) + b


def gval(t, v):
    if t == STR:
        return gstr(v)
    if t == ARR:
        et, items = v
        out = struct.pack("<IQ", et, len(items))
        return out + b"".join(gval(et, x) for x in items)
    return struct.pack(SCALAR[t], v)


def gguf(kvs, tensors, version=3, alignment=32):
    """kvs: [(key, type, value)]; tensors: [(name, type, ne list)]"""
    out = b"GGUF" + struct.pack("<IQQ", version, len(tensors), len(kvs))
    for k, t, v in kvs:
        out += gstr(k) + struct.pack("<I", t) + gval(t, v)
    offs, o, blobs = [], 0, []
    for i, (name, ty, ne) in enumerate(tensors):
        be, bb = TYPES[ty]
        n = 1
        for d in ne:
            n *= d
        nbytes = n // be * bb
        blob = bytearray((k * 31 + i * 7) & 255 for k in range(nbytes))
        if ty not in (0, 1, 30):  # keep f16 scales finite: a fixed 1.0 (0x3c00) at each scale spot
            for b in range(0, nbytes, bb):
                spots = {14: [bb - 2]}.get(ty, [0, 2] if ty in (3, 7, 12, 13) else [0])
                for s in spots:
                    blob[b + s:b + s + 2] = b"\x00\x3c"
        if ty == 0:
            blob = bytearray(struct.pack("<%df" % n, *[(k % 17) * 0.25 - 2 for k in range(n)]))
        offs.append(o)
        blobs.append(bytes(blob))
        o = (o + nbytes + alignment - 1) // alignment * alignment
    for (name, ty, ne), off in zip(tensors, offs):
        out += gstr(name) + struct.pack("<I", len(ne)) + b"".join(struct.pack("<Q", d) for d in ne)
        out += struct.pack("<IQ", ty, off)
    out += b"\0" * (-len(out) % alignment)
    data = b""
    for off, blob in zip(offs, blobs):
        data += b"\0" * (off - len(data)) + blob
    return out + data


def safetensors(entries, metadata=None, pad=0):
    """entries: [(name, dtype, shape, raw bytes)]"""
    header, data = {}, b""
    if metadata is not None:
        header["__metadata__"] = metadata
    for name, dt, shape, raw in entries:
        header[name] = {"dtype": dt, "shape": shape, "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    h = json.dumps(header, separators=(",", ":")).encode() + b" " * pad
    return struct.pack("<Q", len(h)) + h + data


def main():
    g = "fuzz/corpus/gguf"
    s = "fuzz/corpus/safetensors"
    os.makedirs(g, exist_ok=True)
    os.makedirs(s, exist_ok=True)
    every_type = [("general.architecture", STR, "qwen3"), ("general.alignment", U32, 32),
                  ("t.u8", U8, 200), ("t.i8", I8, -5), ("t.u16", U16, 60000), ("t.i16", I16, -300),
                  ("t.u32", U32, 4000000000), ("t.i32", I32, -7), ("t.f32", F32, 1.5), ("t.bool", BOOL, True),
                  ("t.str", STR, "hi\n\"there\" \xe2\x82\xac"), ("t.u64", U64, 1 << 40), ("t.i64", I64, -(1 << 40)),
                  ("t.f64", F64, 0.25), ("t.arr_i32", ARR, (I32, [1, 2, 3])),
                  ("t.arr_str", ARR, (STR, ["a", "bc", ""])), ("t.arr_f32", ARR, (F32, [0.5, -1.0])),
                  ("t.nested", ARR, (ARR, [(U8, [1, 2]), (U8, [3])])), ("t.empty", ARR, (U8, []))]
    seeds = {
        f"{g}/all_kv_types.gguf": gguf(every_type, [("a", 0, [4, 2]), ("b", 8, [32, 2]), ("c", 12, [256])]),
        f"{g}/v2_align64.gguf": gguf([("general.alignment", U32, 64), ("general.architecture", STR, "qwen3")],
                                     [("f16", 1, [8]), ("bf16", 30, [4, 2]), ("q4_0", 2, [32]), ("q4_1", 3, [32]),
                                      ("q5_0", 6, [64]), ("q5_1", 7, [32]), ("q5_K", 13, [256]), ("q6_K", 14, [256, 1, 1, 1])],
                                     version=2, alignment=64),
        f"{g}/tokenizer_only.gguf": gguf([("general.architecture", STR, "qwen3"),
                                          ("tokenizer.ggml.model", STR, "gpt2"),
                                          ("tokenizer.ggml.tokens", ARR, (STR, ["!", "\"", "#", "Ġthe", "<|im_end|>"] * 8)),
                                          ("tokenizer.ggml.token_type", ARR, (I32, [1] * 40)),
                                          ("tokenizer.ggml.merges", ARR, (STR, ["Ġ t", "h e"])),
                                          ("tokenizer.ggml.eos_token_id", U32, 4)], []),
        f"{g}/qwen3_shapes.gguf": gguf([("general.architecture", STR, "qwen3"), ("qwen3.block_count", U32, 1),
                                        ("qwen3.embedding_length", U32, 64), ("qwen3.rope.freq_base", F32, 1e4)],
                                       [("token_embd.weight", 8, [64, 4]), ("output_norm.weight", 0, [64]),
                                        ("blk.0.attn_q.weight", 2, [64, 2]), ("blk.0.ffn_down.weight", 14, [256, 1])]),
        f"{g}/align1_empty.gguf": gguf([("general.alignment", U8, 1)], [("x", 0, [3]), ("y", 1, [1])], alignment=1),
        f"{s}/three_dtypes.safetensors": safetensors(
            [("model.embed_tokens.weight", "BF16", [4, 8], bytes(range(64))),
             ("model.norm.weight", "F32", [8], struct.pack("<8f", *[1.0] * 8)),
             ("lm_head.weight", "F16", [2, 8], bytes(range(32)))], metadata={"format": "pt"}),
        f"{s}/scalar_zero_4d.safetensors": safetensors(
            [("s", "F32", [], struct.pack("<f", 3.0)), ("z", "F16", [0, 3], b""),
             ("q", "BF16", [1, 1, 2, 3], bytes(12))], pad=5),
        f"{s}/empty.safetensors": safetensors([]),
        f"{s}/i64.safetensors": safetensors([("ids", "I64", [2], bytes(16))]),
    }
    total = 0
    for path, blob in seeds.items():
        with open(path, "wb") as f:
            f.write(blob)
        total += len(blob)
        print(f"{path}: {len(blob)} bytes")
    print(f"total {total} bytes")


if __name__ == "__main__":
    main()
