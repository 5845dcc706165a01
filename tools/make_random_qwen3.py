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
weights, most of the 41M). The tokenizer directory holds tokenizer.json or tokenizer.json.xz and
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
    a = ap.parse_args()
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

    header, blobs, off = {}, [], 0
    for name, shape, kind in tensors:
        n = 1
        for d in shape:
            n *= d
        data = bf16_random(rng, n) if kind == "rand" else struct.pack("<H", 0x3F80) * n
        header[name] = {"dtype": "BF16", "shape": shape, "data_offsets": [off, off + len(data)]}
        blobs.append(data)
        off += len(data)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(os.path.join(a.out, "model.safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)

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
