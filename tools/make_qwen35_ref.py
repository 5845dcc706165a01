#!/usr/bin/env python3
"""make_qwen35_ref.py - a second, differently shaped Qwen3.5 test model and its HF reference.

Builds a random Qwen3_5ForCausalLM (HF transformers 5.17, model_type qwen3_5_text) whose shapes differ
from tiny-qwen35 in every dimension the kernels care about:
  - gated attention: head_dim 256 (n_rot 64), 4 q heads over 1 KV head (GQA 4), two attention layers
    at places the default interval would not give (layer_types [lin, full, lin, full, lin]), rope_theta 1e6, untied lm_head;
  - Gated DeltaNet: key/value heads of dim 128 (as Qwen3.5-27B), 2 key heads and 6 value heads
    (3 value heads per key head), conv kernel 4;
  - every RMSNorm weight, dt_bias, A_log and the gated-norm weight random (HF's init leaves the
    (1 + w) norms at w = 0, which would not test the offset);
  - an MTP layer's weights (mtp.*, random; HF ignores them) for the loader, mtp_num_hidden_layers 1.
The checkpoint is float32 (model.safetensors, about 2.8 MB). The reference has the format of
/work/shared/reference/<model>: reference.json (cases: input_ids, greedy_ids by `generate`, 16 new
tokens, no EOS; logits_rows; top5_last) and reference_logits.bin (float32 LE [rows, vocab], cases in
order), computed in float32 with TF32 off and eager attention.

Usage (on the machine with torch + transformers 5.17; a GPU is used when present):
    python3 tools/make_qwen35_ref.py --out tests/data/qwen35
writes tests/data/qwen35/random-qwen35/ and tests/data/qwen35/ref/random-qwen35/.
"""
import argparse
import json
import os
import sys

import torch


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="tests/data/qwen35")
    ap.add_argument("--name", default="random-qwen35")
    ap.add_argument("--seed", type=int, default=35)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = ap.parse_args()

    import transformers
    from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig
    from safetensors.torch import load_file, save_file

    print("transformers", transformers.__version__, "torch", torch.__version__, "device", args.device)
    if not transformers.__version__.startswith("5.17"):
        print("warning: the references elsewhere come from transformers 5.17", file=sys.stderr)
    try:
        from transformers.utils import is_flash_linear_attention_available
        print("flash-linear-attention available:", is_flash_linear_attention_available())
    except Exception:
        pass
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.manual_seed(args.seed)

    cfg = Qwen3_5TextConfig(
        vocab_size=512,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=5,
        num_attention_heads=4,
        num_key_value_heads=1,
        head_dim=256,
        hidden_act="silu",
        max_position_embeddings=1024,
        initializer_range=0.08,
        rms_norm_eps=1e-6,
        tie_word_embeddings=False,
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0, "partial_rotary_factor": 0.25},
        attention_bias=False,
        linear_conv_kernel_dim=4,
        linear_key_head_dim=128,
        linear_value_head_dim=128,
        linear_num_key_heads=2,
        linear_num_value_heads=6,
        layer_types=["linear_attention", "full_attention", "linear_attention", "full_attention", "linear_attention"],
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
    )
    model = Qwen3_5ForCausalLM(cfg).float()
    try:  # eager attention, as the other references (sdpa would differ only by rounding)
        model.set_attn_implementation("eager")
    except Exception as ex:
        print("note: eager attention not set:", ex, file=sys.stderr)
    print("attention implementation:", getattr(model.config, "_attn_implementation", "?"))
    with torch.no_grad():  # randomise what HF initialises to constants
        for name, p in model.named_parameters():
            if name.endswith("linear_attn.norm.weight"):
                p.copy_(1.0 + 0.2 * torch.randn_like(p))        # Qwen3_5RMSNormGated: w
            elif name.endswith("norm.weight"):
                p.copy_(0.2 * torch.randn_like(p))              # Qwen3_5RMSNorm: 1 + w
            elif name.endswith("dt_bias"):
                p.copy_(torch.randn_like(p))
            elif name.endswith("A_log"):
                p.copy_(torch.empty_like(p).uniform_(0.01, 16).log())
    model.to(args.device).eval()

    mdir = os.path.join(args.out, args.name)
    rdir = os.path.join(args.out, "ref", args.name)
    os.makedirs(mdir, exist_ok=True)
    os.makedirs(rdir, exist_ok=True)
    model.save_pretrained(mdir)  # safetensors (transformers 5 writes no other format)
    # MTP weights (Qwen3.5 checkpoints carry them beside the model; HF's model class ignores mtp.*):
    # mtp.fc [hidden, 2 hidden], three norms, and one full-attention decoder layer shaped like layer 1.
    st_path = os.path.join(mdir, "model.safetensors")
    tensors = load_file(st_path)
    g = torch.Generator().manual_seed(args.seed + 1)
    h = cfg.hidden_size
    tensors["mtp.fc.weight"] = 0.08 * torch.randn(h, 2 * h, generator=g)
    for n in ("mtp.pre_fc_norm_embedding.weight", "mtp.pre_fc_norm_hidden.weight", "mtp.norm.weight"):
        tensors[n] = 0.2 * torch.randn(h, generator=g)
    for n, t in list(tensors.items()):
        if n.startswith("model.layers.1."):
            tensors["mtp.layers.0." + n[len("model.layers.1."):]] = 0.08 * torch.randn(t.shape, generator=g)
    save_file({k: v.contiguous().float() for k, v in tensors.items()}, st_path, metadata={"format": "pt"})
    with open(os.path.join(mdir, "config.json")) as f:
        cj = json.load(f)
    cj["mtp_num_hidden_layers"] = 1
    with open(os.path.join(mdir, "config.json"), "w") as f:
        json.dump(cj, f, indent=2)

    # cases: short prompts, one across the 64-token chunk boundary, one of several chunks
    lengths = [12, 12, 70, 200]
    cases, rows = [], []
    with torch.no_grad():
        for i, n in enumerate(lengths):
            ids = torch.randint(0, cfg.vocab_size, (1, n), generator=g).to(args.device)
            logits = model(ids, use_cache=False).logits[0].float()
            out = model.generate(ids, max_new_tokens=16, do_sample=False, eos_token_id=None, pad_token_id=0,
                                 min_new_tokens=16)
            greedy = out[0, n:].tolist()
            # cross-check generate's cached decode (recurrent form) with full forwards (chunked form)
            cur = ids
            for k in range(4):
                nxt = int(model(cur, use_cache=False).logits[0, -1].argmax())
                if nxt != greedy[k]:
                    print(f"note: case {i}: generate token {k} = {greedy[k]}, full forward gives {nxt}", file=sys.stderr)
                cur = torch.cat([cur, torch.tensor([[nxt]], device=cur.device)], dim=1)
            rows.append(logits.cpu())
            cases.append({
                "prompt": None,
                "input_ids": ids[0].tolist(),
                "greedy_ids": greedy,
                "logits_rows": n,
                "top5_last": torch.topk(logits[-1], 5).indices.tolist(),
            })
    with open(os.path.join(rdir, "reference.json"), "w") as f:
        json.dump({"model": args.name, "dtype": "float32", "cases": cases}, f, indent=1)
    allrows = torch.cat(rows, 0).contiguous().numpy().astype("<f4")
    with open(os.path.join(rdir, "reference_logits.bin"), "wb") as f:
        f.write(allrows.tobytes())
    size = sum(os.path.getsize(os.path.join(mdir, x)) for x in os.listdir(mdir))
    nparam = sum(p.numel() for p in model.parameters())
    print(f"wrote {mdir} ({size / 1e6:.2f} MB, {nparam} params + MTP) and {rdir} ({allrows.shape[0]} rows)")


if __name__ == "__main__":
    main()
