#!/usr/bin/env python3
"""make_untrained_mtp.py - an UNTRAINED MTP head for a Qwen3.5 HF checkpoint, for tests of the code
paths that do not need a good head (greedy output with --spec mtp equals plain decoding whatever the
drafts are; the rollbacks, the chain, the server's catch-up, pxq quantize's nextn tensors).

tools/make_mtp_fixture.py trains the real fixture on a GPU machine; this one needs only Python's
standard library and runs in the tests. The head: the MTP decoder layer is a copy of the model's last
full-attention layer, fc = [I | 0] (the embedding half passed through), every MTP RMSNorm weight 0
(Qwen3_5RMSNorm: x_hat * (1 + w), so the identity). Its drafts are almost never right.

Writes OUT/: config.json (the model's + mtp_num_hidden_layers 1), links to the model's shards and
tokenizer files, mtp.safetensors (bf16) and model.safetensors.index.json (the model's + mtp.*).
    usage: tools/make_untrained_mtp.py tests/data/qwen35/tiny-qwen35 OUT
"""
import json
import os
import struct
import sys


def read_tensors(path):
    """{name: (dtype, shape, raw bytes)} of a safetensors file."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        head = json.loads(f.read(n))
        data = f.read()
    out = {}
    for k, v in head.items():
        if k == "__metadata__":
            continue
        a, b = v["data_offsets"]
        out[k] = (v["dtype"], v["shape"], data[a:b])
    return out


def write_tensors(path, t):
    """Write {name: (dtype, shape, raw bytes)} as a safetensors file (names sorted); returns the data bytes."""
    head, off, blobs = {}, 0, []
    for name in sorted(t):
        dt, shape, raw = t[name]
        head[name] = {"dtype": dt, "shape": list(shape), "data_offsets": [off, off + len(raw)]}
        off += len(raw)
        blobs.append(raw)
    hj = json.dumps(head, separators=(",", ":")).encode()
    hj += b" " * (-len(hj) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hj)) + hj + b"".join(blobs))
    return off


def bf16(values):
    """Little-endian bf16 bytes of floats that bf16 holds exactly (0 and 1 here)."""
    return b"".join(struct.pack("<H", struct.unpack("<I", struct.pack("<f", x))[0] >> 16) for x in values)


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    src, out = sys.argv[1], sys.argv[2]
    cfg = json.load(open(os.path.join(src, "config.json")))
    index = json.load(open(os.path.join(src, "model.safetensors.index.json")))
    d = cfg["hidden_size"]
    last = max(i for i, t in enumerate(cfg["layer_types"]) if t == "full_attention")
    files = {}
    for name, f in index["weight_map"].items():
        files.setdefault(f, []).append(name)
    src_t = {}
    for f in files:
        src_t.update(read_tensors(os.path.join(src, f)))
    t = {}
    prefix = "model.layers.%d." % last
    for name, v in src_t.items():
        if name.startswith(prefix):
            rest = name[len(prefix):]
            if rest.endswith("layernorm.weight") or rest.endswith("_norm.weight"):
                v = (v[0], v[1], bf16([0.0] * v[1][0]))  # 1 + 0: the norms start as the identity
            t["mtp.layers.0." + rest] = v
    eye = [0.0] * (d * 2 * d)
    for i in range(d):
        eye[i * 2 * d + i] = 1.0  # the embedding half: the layer sees the next token
    t["mtp.fc.weight"] = ("BF16", [d, 2 * d], bf16(eye))
    for n in ("mtp.pre_fc_norm_embedding.weight", "mtp.pre_fc_norm_hidden.weight", "mtp.norm.weight"):
        t[n] = ("BF16", [d], bf16([0.0] * d))
    os.makedirs(out, exist_ok=True)
    off = write_tensors(os.path.join(out, "mtp.safetensors"), t)
    cfg["mtp_num_hidden_layers"] = 1
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    for name in t:
        index["weight_map"][name] = "mtp.safetensors"
    with open(os.path.join(out, "model.safetensors.index.json"), "w") as f:
        json.dump(index, f, indent=2)
    for fn in os.listdir(src):
        if fn in ("config.json", "model.safetensors.index.json") or os.path.exists(os.path.join(out, fn)):
            continue
        os.symlink(os.path.relpath(os.path.join(src, fn), out), os.path.join(out, fn))
    print("%s: %d mtp.* tensors, %.2f MB" % (out, len(t), off / 1e6))


if __name__ == "__main__":
    main()
