#!/usr/bin/python3
"""llama2c_ref.py - llama2.c's greedy generation (karpathy/llama2.c run.c), in numpy, on a llama2.c
checkpoint and its tokenizer: the independent reference that PXQ's SPM tokenizer and Llama forward are
checked against (tests/cli_llama2c.sh, tests/data/stories260K.ref.json).

    /usr/bin/python3 tools/llama2c_ref.py CHECKPOINT.bin TOKENIZER.bin -p "Once upon a time" -n 64 [--json]

It follows run.c step by step, not PXQ and not llama.cpp:
  - the checkpoint: 7 int32 (dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size (negative:
    an unshared classifier follows), seq_len), then float32 token_embedding (vocab, dim), rms_att
    (L, dim), wq (L, dim, dim), wk (L, kv_dim, dim), wv (L, kv_dim, dim), wo (L, dim, dim), rms_ffn
    (L, dim), w1 (L, hidden, dim), w2 (L, dim, hidden), w3 (L, hidden, dim), rms_final (dim), the RoPE
    tables (seq_len, head_size / 2) x 2 (unused: run.c recomputes them), [wcls (vocab, dim)].
  - encode (run.c encode): BOS, then " " as a dummy prefix when the text is not empty, each UTF-8
    character looked up (missing: its bytes as tokens id = byte + 3), then merges: repeatedly the
    adjacent pair whose concatenation is in the vocab with the highest score (the first on a tie).
  - forward (run.c forward): rmsnorm (eps 1e-5), q/k/v, RoPE on interleaved pairs (i, i+1) with
    freq 10000^(-(i % head_size) / head_size), grouped-query attention, wo, residual; rmsnorm, w2(silu(w1 x)
    * w3 x), residual; final rmsnorm, logits = wcls x.
  - greedy (temperature 0): argmax; prompt tokens are forced; generation stops after n tokens or at
    BOS (id 1), as run.c does.
  - decode (run.c decode): the piece; after BOS a leading space is dropped; "<0xNN>" is the byte.
Needs numpy (Debian: python3-numpy; tools/install-deps.sh installs it).
"""
import argparse
import json
import struct
import sys

import numpy as np


def load_checkpoint(path):
    with open(path, "rb") as f:
        data = f.read()
    dim, hidden, n_layers, n_heads, n_kv_heads, vocab, seq_len = struct.unpack_from("7i", data, 0)
    shared = vocab > 0
    vocab = abs(vocab)
    w = np.frombuffer(data, dtype=np.float32, offset=28)
    head_size = dim // n_heads
    kv_dim = dim * n_kv_heads // n_heads
    off = 0

    def take(*shape):
        nonlocal off
        n = int(np.prod(shape))
        t = w[off:off + n].reshape(shape)
        off += n
        return t

    p = {"dim": dim, "hidden": hidden, "n_layers": n_layers, "n_heads": n_heads, "n_kv_heads": n_kv_heads,
         "vocab": vocab, "seq_len": seq_len, "head_size": head_size, "kv_dim": kv_dim}
    p["emb"] = take(vocab, dim)
    p["rms_att"] = take(n_layers, dim)
    p["wq"] = take(n_layers, dim, dim)
    p["wk"] = take(n_layers, kv_dim, dim)
    p["wv"] = take(n_layers, kv_dim, dim)
    p["wo"] = take(n_layers, dim, dim)
    p["rms_ffn"] = take(n_layers, dim)
    p["w1"] = take(n_layers, hidden, dim)
    p["w2"] = take(n_layers, dim, hidden)
    p["w3"] = take(n_layers, hidden, dim)
    p["rms_final"] = take(dim)
    take(seq_len, head_size // 2)
    take(seq_len, head_size // 2)
    p["wcls"] = p["emb"] if shared else take(vocab, dim)
    if 28 + 4 * off != len(data):
        sys.exit(f"{path}: {len(data)} bytes, the header's shapes account for {28 + 4 * off}")
    return p


def load_tokenizer(path, vocab_size):
    with open(path, "rb") as f:
        data = f.read()
    off = 4  # max_token_length
    pieces, scores = [], []
    for _ in range(vocab_size):
        score, n = struct.unpack_from("fi", data, off)
        off += 8
        pieces.append(data[off:off + n])
        scores.append(score)
        off += n
    return pieces, scores


def encode(text, pieces, scores):
    lookup = {}
    for i, s in enumerate(pieces):
        lookup.setdefault(s, i)  # run.c: bsearch over sorted pieces; pieces are distinct
    ids = [1]  # BOS
    raw = text.encode("utf-8")
    if raw:
        ids.append(lookup[b" "])
    i = 0
    while i < len(raw):  # one UTF-8 character at a time
        n = 1
        while i + n < len(raw) and (raw[i + n] & 0xC0) == 0x80 and n < 4:
            n += 1
        ch = raw[i:i + n]
        if ch in lookup:
            ids.append(lookup[ch])
        else:
            ids.extend(b + 3 for b in ch)
        i += n
    while True:  # merges, best score first, the leftmost on a tie
        best, best_id, best_at = -1e10, -1, -1
        for k in range(len(ids) - 1):  # BOS too, as run.c: "\n<s>\n" + a piece is never a piece
            cat = pieces[ids[k]] + pieces[ids[k + 1]]
            j = lookup.get(cat, -1)
            if j >= 0 and scores[j] > best:
                best, best_id, best_at = scores[j], j, k
        if best_at < 0:
            break
        ids[best_at:best_at + 2] = [best_id]
    return ids


def rmsnorm(x, w):
    x = x.astype(np.float32)
    ss = np.float32(np.dot(x, x) / np.float32(len(x)) + np.float32(1e-5))
    return (w * (x * np.float32(1.0 / np.sqrt(ss)))).astype(np.float32)


def rope(v, pos, head_size):
    out = v.copy()
    i = np.arange(0, len(v), 2)
    freq = (1.0 / np.power(np.float32(10000.0), (i % head_size).astype(np.float32) / np.float32(head_size))).astype(np.float32)
    ang = (np.float32(pos) * freq).astype(np.float32)
    c, s = np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)
    v0, v1 = v[i], v[i + 1]
    out[i] = v0 * c - v1 * s
    out[i + 1] = v0 * s + v1 * c
    return out


def generate(p, prompt_ids, n_new):
    L, hs, nh, nkv = p["n_layers"], p["head_size"], p["n_heads"], p["n_kv_heads"]
    kc = np.zeros((L, p["seq_len"], p["kv_dim"]), np.float32)
    vc = np.zeros((L, p["seq_len"], p["kv_dim"]), np.float32)
    out, tok, pos = [], prompt_ids[0], 0
    while pos < p["seq_len"]:
        x = p["emb"][tok].copy()
        for l in range(L):
            xb = rmsnorm(x, p["rms_att"][l])
            q = rope(p["wq"][l] @ xb, pos, hs)
            kc[l, pos] = rope(p["wk"][l] @ xb, pos, hs)
            vc[l, pos] = p["wv"][l] @ xb
            att_out = np.zeros(p["dim"], np.float32)
            for h in range(nh):
                kvh = h // (nh // nkv)
                qh = q[h * hs:(h + 1) * hs]
                k = kc[l, :pos + 1, kvh * hs:(kvh + 1) * hs]
                a = (k @ qh) / np.float32(np.sqrt(hs))
                a = np.exp(a - a.max())
                a = a / a.sum()
                att_out[h * hs:(h + 1) * hs] = a @ vc[l, :pos + 1, kvh * hs:(kvh + 1) * hs]
            x = x + p["wo"][l] @ att_out
            xb = rmsnorm(x, p["rms_ffn"][l])
            h1, h3 = p["w1"][l] @ xb, p["w3"][l] @ xb
            x = x + p["w2"][l] @ ((h1 / (np.float32(1.0) + np.exp(-h1))) * h3)
        logits = p["wcls"] @ rmsnorm(x, p["rms_final"])
        if pos + 1 < len(prompt_ids):
            nxt = prompt_ids[pos + 1]
        else:
            nxt = int(np.argmax(logits))
            if nxt == 1 or len(out) == n_new:  # run.c stops at BOS
                break
            out.append(nxt)
        tok, pos = nxt, pos + 1
    return out


def piece_bytes(pieces, prev, tok):
    b = pieces[tok]
    if prev == 1 and b[:1] == b" ":
        b = b[1:]
    if len(b) == 6 and b[:3] == b"<0x" and b[5:] == b">":
        b = bytes([int(b[3:5], 16)])
    return b


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("checkpoint")
    ap.add_argument("tokenizer")
    ap.add_argument("-p", "--prompt", default="")
    ap.add_argument("-n", "--n-predict", type=int, default=64)
    ap.add_argument("--json", action="store_true", help="print prompt ids, generated ids and text as JSON")
    a = ap.parse_args()
    p = load_checkpoint(a.checkpoint)
    pieces, scores = load_tokenizer(a.tokenizer, p["vocab"])
    prompt_ids = encode(a.prompt, pieces, scores)
    gen = generate(p, prompt_ids, a.n_predict)
    seq = prompt_ids + gen
    text = b"".join(piece_bytes(pieces, seq[i - 1], seq[i]) for i in range(len(prompt_ids), len(seq)))
    if a.json:
        print(json.dumps({"prompt": a.prompt, "prompt_ids": prompt_ids, "ids": gen,
                          "text": text.decode("utf-8", "replace")}, ensure_ascii=False))
    else:
        sys.stdout.write(text.decode("utf-8", "replace") + "\n")


if __name__ == "__main__":
    main()
