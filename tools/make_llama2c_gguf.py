#!/usr/bin/env python3
"""make_llama2c_gguf.py - a llama2.c checkpoint and tokenizer to a GGUF, as llama.cpp's
examples/convert-llama2c-to-ggml (convert-llama2c-to-ggml.cpp) writes it. Python 3 and struct only.

    python3 tools/make_llama2c_gguf.py stories260K.bin tok512.bin tests/data/stories260K.gguf

What the converter does, step for step:
  - the checkpoint: 7 int32 (dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size, seq_len;
    a negative vocab_size means an unshared classifier follows), then float32 tok_embeddings,
    rms_att, wq, wk, wv, wo, rms_ffn, w1, w2, w3, rms_final, the RoPE tables (skipped), [wcls].
    Every matrix is copied as it is, row-major (out, in) = ggml ne [in, out]; q and k are not
    permuted: llama2.c rotates interleaved pairs, as llama.cpp's LLAMA rope does.
  - the vocabulary from the llama2.c tokenizer .bin (max_token_length, then per token: float score,
    int32 length, bytes): id 0 is "<unk>" (type 2 unknown), 1 "<s>" and 2 "</s>" (3 control), an
    empty text is control, a text that sscanf("<0x%02hhX>") reads is a byte token (6), the rest are
    normal (1); spaces become U+2581.
  - keys, in its order: tokenizer.ggml.tokens / scores / token_type, tokenizer.ggml.model "llama",
    general.architecture "llama", general.name "llama", unknown/bos/eos ids 0/1/2, separator and
    padding -1 (as u32), llama.context_length (its n_ctx parameter, 128 by default), embedding_length,
    feed_forward_length, attention.head_count, head_count_kv, block_count, rope.dimension_count
    (min(64, dim / n_heads)), attention.layer_norm_rms_epsilon 1e-5.
  - tensors (F32): token_embd, output_norm, output (the embedding again when shared), then per layer
    attn_q, attn_k, attn_v, attn_output, attn_norm, ffn_gate (w1), ffn_down (w2), ffn_up (w3), ffn_norm.
GGUF v3, alignment 32.
"""
import argparse
import re
import struct
import sys

GGUF_U32, GGUF_I32, GGUF_F32, GGUF_STRING, GGUF_ARRAY = 4, 5, 6, 8, 9
ALIGN = 32


def read_checkpoint(path):
    data = open(path, "rb").read()
    dim, hidden, n_layers, n_heads, n_kv_heads, vocab, seq_len = struct.unpack_from("<7i", data, 0)
    shared = vocab > 0
    vocab = abs(vocab)
    head_size = dim // n_heads
    kv_dim = dim * n_kv_heads // n_heads if 0 < n_kv_heads < n_heads else dim
    off = 28

    def take(n):  # n float32, as raw little-endian bytes
        nonlocal off
        b = data[off:off + 4 * n]
        if len(b) != 4 * n:
            sys.exit(f"{path}: ends early at byte {off}")
        off += 4 * n
        return b

    w = {"emb": take(vocab * dim), "rms_att": take(n_layers * dim), "wq": take(n_layers * dim * dim),
         "wk": take(n_layers * kv_dim * dim), "wv": take(n_layers * kv_dim * dim), "wo": take(n_layers * dim * dim),
         "rms_ffn": take(n_layers * dim), "w1": take(n_layers * hidden * dim), "w2": take(n_layers * dim * hidden),
         "w3": take(n_layers * hidden * dim), "rms_final": take(dim)}
    off += seq_len * head_size * 4  # freq_cis_real and freq_cis_imag (seq_len x head_size / 2 each)
    w["wcls"] = w["emb"] if shared else take(vocab * dim)
    if off != len(data):
        sys.exit(f"{path}: {len(data)} bytes, but the header's shapes end at {off}")
    cfg = dict(dim=dim, hidden=hidden, n_layers=n_layers, n_heads=n_heads, n_kv_heads=n_kv_heads,
               vocab=vocab, seq_len=seq_len, kv_dim=kv_dim)
    return cfg, w


def read_vocab(path, n_vocab):
    data = open(path, "rb").read()
    off = 4  # max_token_length, unused
    tokens = []
    for i in range(n_vocab):
        score, n = struct.unpack_from("<fI", data, off)
        off += 8
        text = data[off:off + n]
        off += n
        if i == 0:
            text, ty = b"<unk>", 2
        elif i == 1:
            text, ty = b"<s>", 3
        elif i == 2:
            text, ty = b"</s>", 3
        elif not text:
            ty = 3
        elif re.match(rb"<0x[0-9A-Fa-f]", text):  # sscanf("<0x%02hhX>") == 1
            ty = 6
        else:
            ty = 1
        tokens.append((text.replace(b" ", "\u2581".encode()), score, ty))
    return tokens


def gguf_str(s):
    if isinstance(s, str):
        s = s.encode()
    return struct.pack("<Q", len(s)) + s


def kv_u32(k, v):
    return gguf_str(k) + struct.pack("<II", GGUF_U32, v & 0xFFFFFFFF)


def kv_f32(k, v):
    return gguf_str(k) + struct.pack("<If", GGUF_F32, v)


def kv_str(k, v):
    return gguf_str(k) + struct.pack("<I", GGUF_STRING) + gguf_str(v)


def kv_arr(k, ty, items):
    out = gguf_str(k) + struct.pack("<IIQ", GGUF_ARRAY, ty, len(items))
    if ty == GGUF_STRING:
        return out + b"".join(gguf_str(x) for x in items)
    fmt = {GGUF_F32: "<f", GGUF_I32: "<i"}[ty]
    return out + b"".join(struct.pack(fmt, x) for x in items)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("checkpoint", help="llama2.c model .bin (e.g. stories260K.bin)")
    ap.add_argument("vocab", help="llama2.c tokenizer .bin (e.g. tok512.bin)")
    ap.add_argument("output", help="the GGUF to write")
    ap.add_argument("--ctx", type=int, default=128, help="llama.context_length (the converter's n_ctx, default 128)")
    a = ap.parse_args()
    c, w = read_checkpoint(a.checkpoint)
    toks = read_vocab(a.vocab, c["vocab"])
    dim, ff, L = c["dim"], c["hidden"], c["n_layers"]
    kv = [
        kv_arr("tokenizer.ggml.tokens", GGUF_STRING, [t for t, _, _ in toks]),
        kv_arr("tokenizer.ggml.scores", GGUF_F32, [s for _, s, _ in toks]),
        kv_arr("tokenizer.ggml.token_type", GGUF_I32, [ty for _, _, ty in toks]),
        kv_str("tokenizer.ggml.model", "llama"),
        kv_str("general.architecture", "llama"),
        kv_str("general.name", "llama"),
        kv_u32("tokenizer.ggml.unknown_token_id", 0),
        kv_u32("tokenizer.ggml.bos_token_id", 1),
        kv_u32("tokenizer.ggml.eos_token_id", 2),
        kv_u32("tokenizer.ggml.seperator_token_id", -1),  # sic, the converter's key
        kv_u32("tokenizer.ggml.padding_token_id", -1),
        kv_u32("llama.context_length", a.ctx),
        kv_u32("llama.embedding_length", dim),
        kv_u32("llama.feed_forward_length", ff),
        kv_u32("llama.attention.head_count", c["n_heads"]),
        kv_u32("llama.attention.head_count_kv", c["n_kv_heads"]),
        kv_u32("llama.block_count", L),
        kv_u32("llama.rope.dimension_count", min(64, dim // c["n_heads"])),
        kv_f32("llama.attention.layer_norm_rms_epsilon", 1e-5),
    ]

    def layer(key, i, n):  # the i-th of L equal slices
        return w[key][i * n * 4:(i + 1) * n * 4]

    kvd = c["kv_dim"]
    tensors = [("token_embd.weight", [dim, c["vocab"]], w["emb"]), ("output_norm.weight", [dim], w["rms_final"]),
               ("output.weight", [dim, c["vocab"]], w["wcls"])]
    for i in range(L):
        tensors += [(f"blk.{i}.attn_q.weight", [dim, dim], layer("wq", i, dim * dim)),
                    (f"blk.{i}.attn_k.weight", [dim, kvd], layer("wk", i, dim * kvd)),
                    (f"blk.{i}.attn_v.weight", [dim, kvd], layer("wv", i, dim * kvd)),
                    (f"blk.{i}.attn_output.weight", [dim, dim], layer("wo", i, dim * dim)),
                    (f"blk.{i}.attn_norm.weight", [dim], layer("rms_att", i, dim)),
                    (f"blk.{i}.ffn_gate.weight", [dim, ff], layer("w1", i, dim * ff)),
                    (f"blk.{i}.ffn_down.weight", [ff, dim], layer("w2", i, ff * dim)),
                    (f"blk.{i}.ffn_up.weight", [dim, ff], layer("w3", i, dim * ff)),
                    (f"blk.{i}.ffn_norm.weight", [dim], layer("rms_ffn", i, dim))]
    infos, blobs, off = [], [], 0
    for name, ne, blob in tensors:
        infos.append(gguf_str(name) + struct.pack("<I", len(ne)) + b"".join(struct.pack("<Q", x) for x in ne) +
                     struct.pack("<IQ", 0, off))  # type 0: F32
        pad = (-len(blob)) % ALIGN
        blobs.append(blob + b"\0" * pad)
        off += len(blob) + pad
    head = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(kv)) + b"".join(kv) + b"".join(infos)
    head += b"\0" * ((-len(head)) % ALIGN)
    with open(a.output, "wb") as f:
        f.write(head)
        for b in blobs:
            f.write(b)
    print(f"{a.output}: {len(head) + off} bytes, {len(tensors)} tensors, {len(toks)} tokens")


if __name__ == "__main__":
    main()
