#!/usr/bin/env python3
"""make_yarn_ref.py - HF transformers' reference for RoPE scaling (YaRN, linear, llama3) on the test models.

For each (model, scaling) below, loads the HF checkpoint with its config's rope_parameters replaced
by the scaling (max_position_embeddings set to factor x original_max_position_embeddings, so HF's
two readings of the factor agree), then writes to --out/<case>/:
  reference.json       {"model", "rope_parameters", "inv_freq" (HF's rotary_emb.inv_freq, float32),
                        "attention_scaling", "cases": [{"input_ids", "rows" (positions whose logits
                        are stored), "greedy_ids" (generate, 16 new tokens, no EOS), "top5_last"}]}
  reference_logits.bin float32 LE [sum of len(rows)][vocab], cases in order
and --out/yarn_source.txt, the source of the installed _compute_yarn_parameters (what the C code
follows). float32, TF32 off, eager attention, as the other references.

Usage (on the machine with torch + transformers 5.17):
    python3 tools/make_yarn_ref.py --out tests/data/ref/rope
PXQ's test (tests/test_rope.c) opens the same checkpoints with --rope-scaling overrides equal to the
rope_parameters here and compares.
"""
import argparse
import inspect
import json
import os
import struct
import sys

import torch

CASES = [
    # (case name, model dir, rope_parameters over the model's, token source, lengths)
    ("tiny-qwen3-yarn4", "tests/data/tiny-qwen3",
     {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 512}, "val", [24, 700]),
    ("tiny-qwen3-linear2", "tests/data/tiny-qwen3",
     {"rope_type": "linear", "factor": 2.0}, "val", [24]),
    ("tiny-qwen3-llama3", "tests/data/tiny-qwen3",
     {"rope_type": "llama3", "factor": 8.0, "original_max_position_embeddings": 256, "low_freq_factor": 1.0,
      "high_freq_factor": 4.0}, "val", [24]),
    ("random-qwen35-yarn4", "tests/data/qwen35/random-qwen35",
     {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 128, "beta_fast": 16.0, "beta_slow": 2.0},
     "rand", [20, 300]),
]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="tests/data/ref/rope")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = ap.parse_args()
    import transformers
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers import modeling_rope_utils as mru
    print("transformers", transformers.__version__, "torch", torch.__version__, "device", args.device)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "yarn_source.txt"), "w") as f:
        f.write(inspect.getsource(mru._compute_yarn_parameters))
    val = open("tests/data/ref/tiny-qwen3/val_tokens.bin", "rb").read()
    val = list(struct.unpack("<%di" % (len(val) // 4), val))
    for name, mdir, rope, src, lengths in CASES:
        cfg = AutoConfig.from_pretrained(mdir)
        rp = dict(getattr(cfg, "rope_parameters", None) or {})
        theta = rp.get("rope_theta", getattr(cfg, "rope_theta", 10000.0))
        new = {k: v for k, v in rp.items() if k in ("rope_theta", "partial_rotary_factor")}
        new["rope_theta"] = theta
        new.update(rope)
        cfg.rope_parameters = new
        if "original_max_position_embeddings" in rope:
            cfg.max_position_embeddings = int(rope["factor"] * rope["original_max_position_embeddings"])
        model = AutoModelForCausalLM.from_pretrained(mdir, config=cfg, torch_dtype=torch.float32)
        try:
            model.set_attn_implementation("eager")
        except Exception as ex:
            print("note: eager attention not set:", ex, file=sys.stderr)
        model.to(args.device).eval()
        rot = model.model.rotary_emb
        inv = rot.inv_freq.detach().float().cpu().tolist()
        att = float(getattr(rot, "attention_scaling", 1.0))
        vocab = model.config.vocab_size
        g = torch.Generator().manual_seed(7)
        cases, blobs = [], []
        for n in lengths:
            ids = val[:n] if src == "val" else torch.randint(0, vocab, (n,), generator=g).tolist()
            x = torch.tensor([ids], device=args.device)
            with torch.no_grad():
                logits = model(x).logits[0].float().cpu()
                out = model.generate(x, max_new_tokens=16, do_sample=False, eos_token_id=None, pad_token_id=0)
            rows = sorted(set([0, n // 2, n - 2, n - 1]))
            blobs.append(logits[rows].contiguous().numpy().tobytes())
            cases.append({"input_ids": ids, "rows": rows, "greedy_ids": out[0, n:].tolist(),
                          "top5_last": torch.topk(logits[-1], 5).indices.tolist()})
        d = os.path.join(args.out, name)
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, "reference.json"), "w") as f:
            json.dump({"model": mdir, "rope_parameters": new, "max_position_embeddings": cfg.max_position_embeddings,
                       "inv_freq": inv, "attention_scaling": att, "cases": cases}, f)
        with open(os.path.join(d, "reference_logits.bin"), "wb") as f:
            for b in blobs:
                f.write(b)
        print(name, "attention_scaling", att, "inv_freq[:3]", inv[:3], "greedy", cases[-1]["greedy_ids"][:8])


if __name__ == "__main__":
    main()
