#!/usr/bin/env python3
"""make_random_qwen3.py - a Qwen3 HF directory with random BF16 weights and a real tokenizer.

For timing what scales with the vocabulary (the structured-output mask, the LM head, the sampler)
with Qwen3's 151,936-entry vocabulary without a download: `pxq serve -m OUT` runs it like any HF
directory. The weights are random BF16 of magnitude 2^-7 .. 2^-6 (norms 1), so the model writes
noise: for timing, never for quality. Pure Python (no numpy or torch), a few seconds.

Usage:
    python3 tools/make_random_qwen3.py --out /tmp/random-qwen3-151k \
        [--tokenizer tests/data/qwen3-tokenizer] [--hidden 256 --layers 4 --heads 4 --kv-heads 2 \
         --head-dim 64 --ff 512 --vocab 151936 --seed 0]
The defaults are tests/data/dummy-tiny.json's shape with Qwen3's vocabulary (an LM head of 39M
weights, most of the 41M). Qwen3-0.6B's shape, as tools/peer-bench.sh makes it (weights N(0, 0.02)):
    --hidden 1024 --layers 28 --heads 16 --kv-heads 8 --head-dim 128 --ff 3072 --std 0.02 The tokenizer directory holds tokenizer.json or tokenizer.json.xz and
tokenizer_config.json (chat template, eos token).
"""
import argparse
import json
import lzma
import os
import random
import shutil
import struct


def bf16_random(rng, n):
    """n random BF16 values of magnitude in [2^-7, 2^-6) and random sign, as little-endian bytes."""
    hi = bytes(0x3C | (b & 0x80) for b in range(256))  # sign | the exponent's top bits (2^-7 .. 2^-6)
    lo = bytes(b & 0x7F for b in range(256))           # the exponent's low bit 0, 7 mantissa bits
    out = bytearray(2 * n)
    out[1::2] = rng.randbytes(n).translate(hi)
    out[0::2] = rng.randbytes(n).translate(lo)
    return bytes(out)


def bf16_normal_table(std):
    """Byte -> (low byte, high byte) of a BF16 value: bit 7 the sign, bits 0-6 one of 128 quantiles
    of |N(0, std)| (the midpoints of 128 equal-probability bins), rescaled so the 256 values have
    standard deviation std exactly. A random byte through the table is a 256-level normal sample."""
    from statistics import NormalDist
    nd = NormalDist()
    mag = [nd.inv_cdf(0.5 + (i + 0.5) / 256) for i in range(128)]
    rms = (sum(m * m for m in mag) / 128) ** 0.5
    lo, hi = bytearray(256), bytearray(256)
    for b in range(256):
        v = mag[b & 0x7F] * std / rms * (-1 if b & 0x80 else 1)
        u = struct.unpack("<I", struct.pack("<f", v))[0]
        u = (u + 0x7FFF + ((u >> 16) & 1)) >> 16  # round to nearest even
        lo[b], hi[b] = u & 0xFF, u >> 8
    return bytes(lo), bytes(hi)


def bf16_normal(rng, n, table):
    """n BF16 values of about N(0, std) (bf16_normal_table), as little-endian bytes."""
    r = rng.randbytes(n)
    out = bytearray(2 * n)
    out[0::2] = r.translate(table[0])
    out[1::2] = r.translate(table[1])
    return bytes(out)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--tokenizer", default="tests/data/qwen3-tokenizer")
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--ff", type=int, default=512)
    ap.add_argument("--vocab", type=int, default=151936)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--std", type=float, default=0,
                    help="weights of about N(0, STD) (256 levels) instead of magnitudes 2^-7..2^-6")
    a = ap.parse_args()
    table = bf16_normal_table(a.std) if a.std > 0 else None
    rng = random.Random(a.seed)
    os.makedirs(a.out, exist_ok=True)

    tensors = [("model.embed_tokens.weight", [a.vocab, a.hidden], "rand")]
    for i in range(a.layers):
        p = f"model.layers.{i}."
        tensors += [
            (p + "input_layernorm.weight", [a.hidden], "one"),
            (p + "post_attention_layernorm.weight", [a.hidden], "one"),
            (p + "self_attn.q_proj.weight", [a.heads * a.head_dim, a.hidden], "rand"),
            (p + "self_attn.k_proj.weight", [a.kv_heads * a.head_dim, a.hidden], "rand"),
            (p + "self_attn.v_proj.weight", [a.kv_heads * a.head_dim, a.hidden], "rand"),
            (p + "self_attn.o_proj.weight", [a.hidden, a.heads * a.head_dim], "rand"),
            (p + "self_attn.q_norm.weight", [a.head_dim], "one"),
            (p + "self_attn.k_norm.weight", [a.head_dim], "one"),
            (p + "mlp.gate_proj.weight", [a.ff, a.hidden], "rand"),
            (p + "mlp.up_proj.weight", [a.ff, a.hidden], "rand"),
            (p + "mlp.down_proj.weight", [a.hidden, a.ff], "rand"),
        ]
    tensors.append(("model.norm.weight", [a.hidden], "one"))

    header, off = {}, 0
    for name, shape, kind in tensors:
        n = 1
        for d in shape:
            n *= d
        header[name] = {"dtype": "BF16", "shape": shape, "data_offsets": [off, off + 2 * n]}
        off += 2 * n
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(os.path.join(a.out, "model.safetensors"), "wb") as f:  # a tensor at a time: 0.6B fits in memory once
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for name, shape, kind in tensors:
            n = 1
            for d in shape:
                n *= d
            if kind != "rand":
                f.write(struct.pack("<H", 0x3F80) * n)
            else:
                f.write(bf16_normal(rng, n, table) if table else bf16_random(rng, n))

    config = {
        "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": a.hidden,
        "intermediate_size": a.ff, "num_hidden_layers": a.layers, "num_attention_heads": a.heads,
        "num_key_value_heads": a.kv_heads, "head_dim": a.head_dim, "vocab_size": a.vocab,
        "max_position_embeddings": 40960, "rms_norm_eps": 1e-6, "rope_theta": 1000000,
        "tie_word_embeddings": True, "hidden_act": "silu", "attention_bias": False,
        "bos_token_id": 151643, "eos_token_id": 151645, "torch_dtype": "bfloat16",
    }
    with open(os.path.join(a.out, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    with open(os.path.join(a.out, "generation_config.json"), "w") as f:
        json.dump({"bos_token_id": 151643, "eos_token_id": [151645, 151643]}, f, indent=2)
    tj = os.path.join(a.tokenizer, "tokenizer.json")
    if os.path.exists(tj):
        shutil.copy(tj, os.path.join(a.out, "tokenizer.json"))
    else:
        with lzma.open(tj + ".xz") as src, open(os.path.join(a.out, "tokenizer.json"), "wb") as dst:
            shutil.copyfileobj(src, dst)
    shutil.copy(os.path.join(a.tokenizer, "tokenizer_config.json"), os.path.join(a.out, "tokenizer_config.json"))
    print(f"{a.out}: {off / 2 / 1e6:.1f}M BF16 weights, vocab {a.vocab}")


if __name__ == "__main__":
    main()
