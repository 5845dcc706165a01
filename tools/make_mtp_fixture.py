#!/usr/bin/env python3
"""make_mtp_fixture.py - a trained MTP (multi-token prediction) head for tiny-qwen35, and its reference.

Real Qwen3.5 checkpoints carry one MTP layer beside the model (vLLM qwen3_next_mtp.py /
qwen3_5_mtp.py). This trains one for tests/data/qwen35/tiny-qwen35 (main model frozen) with the
same tensor names, so that PXQ can test MTP drafting against a head whose drafts are accepted.

Tensors (HF names; d = hidden_size = 288; all RMSNorms are Qwen3_5RMSNorm: x_hat * (1 + w)):
  mtp.pre_fc_norm_embedding.weight [d]
  mtp.pre_fc_norm_hidden.weight    [d]
  mtp.fc.weight                    [d, 2d]  Linear 2d -> d, no bias; input columns 0..d-1 take the
                                            embedding, d..2d-1 the hidden state
  mtp.layers.0.*                   one Qwen3_5DecoderLayer of type full_attention, the tensor names
                                   of a main full-attention layer: input_layernorm,
                                   self_attn.{q_proj (gated, 2 x heads x head_dim out), k_proj,
                                   v_proj, o_proj, q_norm, k_norm}, post_attention_layernorm,
                                   mlp.{gate_proj, up_proj, down_proj}
  mtp.norm.weight                  [d]

Contract (what PXQ implements). For the main model's input tokens t_0..t_{n-1}, h_i is the main
model's final hidden state at position i AFTER its final norm (HF Qwen3_5TextModel
last_hidden_state; lm_head(h_i) are the main logits). MTP row i (i = 0..n-2) takes token t_{i+1}
and h_i, at position i:
    e   = pre_fc_norm_embedding(embed_tokens(t_{i+1}))
    g   = pre_fc_norm_hidden(h_i)
    x   = fc(cat([e, g], -1))                      (embedding half first)
    x   = decoder_layer(x)                         causal attention over MTP rows 0..i, RoPE (the
                                                   model's partial rotary, theta 1e4) at position i
    m_i = mtp.norm(x)
    logits_i = lm_head(m_i)                        (lm_head = embed_tokens, tied) predicts t_{i+2}
Chained drafting (k > 1): the next MTP row, at position i+1, takes the drafted token and m_i (the
MTP's own normed output) as its hidden input, and attends over all MTP rows before it.

Training: main model frozen (float32 from its bf16 weights), its h precomputed on 512-token windows
of --train-text (tinyshakespeare, four window offsets); the MTP layer starts from the main model's
last full-attention layer (a copy of layer 7), fc = [0.5 I | 0.5 I] + noise, pre-fc norms 0, mtp.norm
from the main final norm. Loss: 0.5 cross-entropy on t_{i+2} + 0.5 KL(main's distribution at
position i+1 || MTP row i). AdamW; early stop on the held-out loss of --heldout-text (frankenstein).
The weights are rounded to bf16 before the final evaluation and the reference.

Reference (float32, TF32 off, eager attention, the bf16 weights upcast): 3 prompts of frankenstein
text; for each, the teacher-forced MTP logits rows i = 0..n-2, then 3 chained greedy drafts from the
last prompt position (row n-1 takes the main model's greedy token t_n and h_{n-1}; rows n, n+1 take
the previous draft and the previous row's m). Layout in reference.json.

Output:
  --out     tests/data/qwen35/tiny-qwen35-mtp/: config.json (tiny-qwen35's + mtp_num_hidden_layers 1),
            relative symlinks to ../tiny-qwen35's shards, tokenizer and templates, mtp.safetensors
            (mtp.* in bf16), model.safetensors.index.json (the original + mtp.* -> mtp.safetensors)
  --ref-out tests/data/qwen35/ref/tiny-qwen35-mtp/: reference.json, mtp_logits.bin

Usage (on the machine with torch + transformers 5.17, a GPU):
    python3 tools/make_mtp_fixture.py --train-text tinyshakespeare.txt
"""
import argparse
import copy
import json
import math
import os
import sys
import time

import torch
import torch.nn.functional as F


def log(*a):
    print("[mtp %6.1fs]" % (time.time() - T0), *a, flush=True)


def die(msg):
    log("FAIL:", msg)
    sys.exit(2)


T0 = time.time()


def causal_mask(n, device):
    """Additive causal mask [1, 1, n, n] for HF's eager attention (0 on and below the diagonal)."""
    m = torch.full((n, n), torch.finfo(torch.float32).min, device=device, dtype=torch.float32)
    return m.triu(1)[None, None]


class MTP(torch.nn.Module):
    """The MTP layer; state_dict keys are the HF names less the leading "mtp."."""

    def __init__(self, model, layer_idx):
        super().__init__()
        cfg = model.config
        d = cfg.hidden_size
        norm_cls = type(model.model.norm)  # Qwen3_5RMSNorm: x_hat * (1 + w)
        self.pre_fc_norm_embedding = norm_cls(d, eps=cfg.rms_norm_eps)
        self.pre_fc_norm_hidden = norm_cls(d, eps=cfg.rms_norm_eps)
        torch.nn.init.zeros_(self.pre_fc_norm_embedding.weight)
        torch.nn.init.zeros_(self.pre_fc_norm_hidden.weight)
        self.fc = torch.nn.Linear(2 * d, d, bias=False)
        # a Qwen3_5DecoderLayer of type full_attention, initialised from the main model's last one
        self.layers = torch.nn.ModuleList([copy.deepcopy(model.model.layers[layer_idx])])
        self.norm = copy.deepcopy(model.model.norm)

    def forward(self, emb, hid, cos, sin, mask):
        """emb: embed_tokens(t_{i+1}) [B, R, d]; hid: h_i or the previous m [B, R, d];
        cos, sin: [1, R, n_rot] at positions 0..R-1; mask: [1, 1, R, R]. Returns m [B, R, d]."""
        x = self.fc(torch.cat([self.pre_fc_norm_embedding(emb), self.pre_fc_norm_hidden(hid)], dim=-1))
        x = self.layers[0](x, position_embeddings=(cos, sin), attention_mask=mask)
        if isinstance(x, tuple):
            x = x[0]
        return self.norm(x)


def windows(ids, seq, offsets):
    starts = []
    for o in offsets:
        starts += list(range(o, len(ids) - seq + 1, seq))
    return torch.stack([ids[s:s + seq] for s in starts])


@torch.no_grad()
def hidden_states(model, wins, bs, dtype):
    """Main model's post-norm hidden states for each window: [N, S, d] in dtype."""
    out = torch.empty(wins.shape[0], wins.shape[1], model.config.hidden_size, dtype=dtype, device=wins.device)
    for i in range(0, wins.shape[0], bs):
        out[i:i + bs] = model.model(input_ids=wins[i:i + bs], use_cache=False).last_hidden_state.to(dtype)
    return out


@torch.no_grad()
def evaluate(model, mtp, wins, H, rope, bs=16):
    """On windows [N, S] with their h [N, S, d]: MTP row i (i = 0..S-3) against t_{i+2}: mean
    cross-entropy, top-1 accuracy, agreement with the main model's argmax at position i+1; and the
    main model's own top-1 accuracy of t_{i+1}."""
    cos, sin = rope
    S = wins.shape[1]
    mask = causal_mask(S - 1, wins.device)
    tot = {"loss": 0.0, "acc": 0.0, "agree": 0.0, "main_acc": 0.0}
    n = 0
    emb_fn = model.model.embed_tokens
    for i in range(0, wins.shape[0], bs):
        ids = wins[i:i + bs]
        h = H[i:i + bs].float()
        m = mtp(emb_fn(ids[:, 1:]), h[:, :-1], cos[:, :S - 1], sin[:, :S - 1], mask)
        lg = model.lm_head(m[:, :S - 2]).float()
        tgt = ids[:, 2:]
        main_next = model.lm_head(h[:, 1:S - 1]).argmax(-1)
        main_pred = model.lm_head(h[:, :S - 1]).argmax(-1)
        tot["loss"] += F.cross_entropy(lg.reshape(-1, lg.shape[-1]), tgt.reshape(-1), reduction="sum").item()
        am = lg.argmax(-1)
        tot["acc"] += (am == tgt).sum().item()
        tot["agree"] += (am == main_next).sum().item()
        tot["main_acc"] += (main_pred == ids[:, 1:]).sum().item()
        n += tgt.numel()
    return {k: v / n for k, v in tot.items()} | {"rows": n}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="tests/data/qwen35/tiny-qwen35")
    ap.add_argument("--out", default="tests/data/qwen35/tiny-qwen35-mtp")
    ap.add_argument("--ref-out", default="tests/data/qwen35/ref/tiny-qwen35-mtp")
    ap.add_argument("--train-text", required=True)
    ap.add_argument("--heldout-text", default="tests/data/frankenstein.txt")
    ap.add_argument("--seq-len", type=int, default=512)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--lr", type=float, default=5e-4)
    ap.add_argument("--max-steps", type=int, default=4000)
    ap.add_argument("--time-limit", type=float, default=170.0, help="seconds of training")
    ap.add_argument("--eval-every", type=int, default=100)
    ap.add_argument("--patience", type=int, default=8, help="evaluations without a better held-out loss")
    ap.add_argument("--ref-lengths", default="12,40,80")
    ap.add_argument("--chain", type=int, default=3)
    ap.add_argument("--seed", type=int, default=35)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = ap.parse_args()

    import transformers
    from transformers import AutoModelForCausalLM
    from tokenizers import Tokenizer
    from safetensors.torch import save_file, load_file

    log("transformers", transformers.__version__, "torch", torch.__version__, "device", args.device,
        torch.cuda.get_device_name() if args.device == "cuda" else "")
    torch.manual_seed(args.seed)
    dev = torch.device(args.device)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False

    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32, attn_implementation="eager")
    model.to(dev).eval()
    model.requires_grad_(False)
    cfg = model.config
    log("model", type(model).__name__, "attention", getattr(cfg, "_attn_implementation", "?"),
        "layer_types", cfg.layer_types)
    full = [i for i, t in enumerate(cfg.layer_types) if t == "full_attention"]
    li = full[-1]
    tok = Tokenizer.from_file(os.path.join(args.model, "tokenizer.json"))

    def encode(s):
        return tok.encode(s, add_special_tokens=False).ids

    held_text = open(args.heldout_text, encoding="utf-8").read()
    held_ids = torch.tensor(encode(held_text), dtype=torch.long, device=dev)
    train_ids = torch.tensor(encode(open(args.train_text, encoding="utf-8").read()), dtype=torch.long, device=dev)
    log("tokens: train %d, held-out %d" % (len(train_ids), len(held_ids)))

    # RoPE cos/sin as the model computes them, and a check that our call of the decoder layer (mask,
    # position embeddings) reproduces the main model's layer li: capture its inputs and output.
    P = max(args.seq_len, max(int(x) for x in args.ref_lengths.split(",")) + args.chain) + 8
    store = {}
    layer = model.model.layers[li]

    def pre(mod, a, kw):
        store["x"] = (a[0] if a else kw["hidden_states"]).detach().clone()
        store["pe"] = kw["position_embeddings"] if "position_embeddings" in kw else a[1]

    def post(mod, a, kw, out):
        store["y"] = (out[0] if isinstance(out, tuple) else out).detach().clone()

    h1 = layer.register_forward_pre_hook(pre, with_kwargs=True)
    h2 = layer.register_forward_hook(post, with_kwargs=True)
    with torch.no_grad():
        probe = held_ids[:P][None]
        out = model(input_ids=probe, use_cache=False, output_hidden_states=True)
    h1.remove()
    h2.remove()
    cos, sin = (t.float() for t in store["pe"])
    log("rope cos", tuple(cos.shape), "sin", tuple(sin.shape))
    if cos.dim() != 3 or cos.shape[1] != P:
        die("unexpected position_embeddings shape %s" % (tuple(cos.shape),))
    rope = (cos, sin)
    with torch.no_grad():
        y2 = layer(store["x"], position_embeddings=(cos, sin), attention_mask=causal_mask(P, dev))
        y2 = y2[0] if isinstance(y2, tuple) else y2
        err = (y2 - store["y"]).abs().max().item()
        last = model.model(input_ids=probe, use_cache=False).last_hidden_state
        lerr = (model.lm_head(last) - out.logits).abs().max().item()
        hs_err = (out.hidden_states[-1] - last).abs().max().item()
    log("layer %d re-run vs captured: max |diff| %.3g; lm_head(last_hidden_state) vs logits %.3g; "
        "hidden_states[-1] vs last_hidden_state %.3g" % (li, err, lerr, hs_err))
    if err > 1e-4 or lerr > 1e-4:
        die("the decoder layer call or the post-norm hidden state does not reproduce the model")

    # data: main model h on windows (train: 4 offsets, bf16; held-out: non-overlapping, float32)
    S = args.seq_len
    hw = windows(held_ids, S, [0])
    HH = hidden_states(model, hw, 64, torch.float32)  # TF32 off: the final evaluation uses these
    torch.backends.cuda.matmul.allow_tf32 = True  # training only
    tw = windows(train_ids, S, [0, S // 4, S // 2, 3 * S // 4])
    TH = hidden_states(model, tw, 64, torch.bfloat16)
    ev_idx = torch.arange(0, hw.shape[0], max(1, hw.shape[0] // 48), device=dev)[:48]
    log("windows: train %d, held-out %d (early-stop subset %d)" % (tw.shape[0], hw.shape[0], len(ev_idx)))

    mtp = MTP(model, li).to(dev)
    d = cfg.hidden_size
    with torch.no_grad():
        eye = torch.eye(d, device=dev)
        mtp.fc.weight.copy_(torch.cat([0.5 * eye, 0.5 * eye], dim=1) + 0.01 * torch.randn(d, 2 * d, device=dev))
    mtp.requires_grad_(True)
    nparam = sum(p.numel() for p in mtp.parameters())
    e0 = evaluate(model, mtp, hw[ev_idx], HH[ev_idx], rope)
    log("MTP %d params; before training: held-out %s" % (nparam, json.dumps({k: round(v, 4) for k, v in e0.items()})))

    opt = torch.optim.AdamW(mtp.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.01)
    mask = causal_mask(S - 1, dev)
    emb_fn = model.model.embed_tokens
    best, best_state, best_step, bad, lr = float("inf"), None, 0, 0, args.lr
    t_train = time.time()
    step = 0
    g = torch.Generator(device=dev).manual_seed(args.seed)
    while step < args.max_steps and time.time() - t_train < args.time_limit:
        mtp.train()
        for pg in opt.param_groups:
            pg["lr"] = lr * min(1.0, (step + 1) / 100)
        idx = torch.randint(0, tw.shape[0], (args.batch,), device=dev, generator=g)
        ids = tw[idx]
        h = TH[idx].float()
        m = mtp(emb_fn(ids[:, 1:]), h[:, :-1], cos[:, :S - 1], sin[:, :S - 1], mask)
        lg = model.lm_head(m[:, :S - 2]).float()
        ce = F.cross_entropy(lg.reshape(-1, lg.shape[-1]), ids[:, 2:].reshape(-1))
        with torch.no_grad():
            teacher = F.log_softmax(model.lm_head(h[:, 1:S - 1]).float(), -1)
        kl = F.kl_div(F.log_softmax(lg, -1), teacher, log_target=True, reduction="none").sum(-1).mean()
        loss = 0.5 * ce + 0.5 * kl
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(mtp.parameters(), 1.0)
        opt.step()
        step += 1
        if step % args.eval_every == 0:
            mtp.eval()
            e = evaluate(model, mtp, hw[ev_idx], HH[ev_idx], rope)
            better = e["loss"] < best - 1e-4
            if better:
                best, best_step, bad = e["loss"], step, 0
                best_state = {k: v.detach().clone() for k, v in mtp.state_dict().items()}
            else:
                bad += 1
                if bad % 3 == 0:
                    lr *= 0.5
            log("step %5d train ce %.3f kl %.3f | held-out loss %.4f acc %.4f agree %.4f%s lr %.2g" %
                (step, ce.item(), kl.item(), e["loss"], e["acc"], e["agree"], " *" if better else "", lr))
            if bad >= args.patience:
                log("early stop: no better held-out loss for %d evaluations" % bad)
                break
    train_s = time.time() - t_train
    log("trained %d steps in %.0f s (%.1f steps/s); best held-out loss %.4f at step %d" %
        (step, train_s, step / max(train_s, 1e-9), best, best_step))
    if best_state is not None:
        mtp.load_state_dict(best_state)
    mtp.eval()
    mtp.requires_grad_(False)
    with torch.no_grad():  # the weights as saved: bf16
        for p in mtp.parameters():
            p.copy_(p.to(torch.bfloat16).float())
    torch.backends.cuda.matmul.allow_tf32 = False
    final = evaluate(model, mtp, hw, HH, rope)
    log("FINAL held-out (frankenstein, %d rows, bf16 weights, fp32): loss %.4f, MTP top-1 of t_{i+2} %.4f, "
        "agreement with main argmax at i+1 %.4f; main top-1 of t_{i+1} %.4f" %
        (final["rows"], final["loss"], final["acc"], final["agree"], final["main_acc"]))

    # ---- outputs: the checkpoint directory
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.model, "config.json")) as f:
        cj = json.load(f)
    cj["mtp_num_hidden_layers"] = 1
    with open(os.path.join(args.out, "config.json"), "w") as f:
        json.dump(cj, f, indent=2)
        f.write("\n")
    with open(os.path.join(args.model, "model.safetensors.index.json")) as f:
        index = json.load(f)
    links = sorted(set(index["weight_map"].values())) + [
        "tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json"]
    for name in links:
        dst = os.path.join(args.out, name)
        if os.path.lexists(dst):
            os.remove(dst)
        os.symlink(os.path.relpath(os.path.join(args.model, name), args.out), dst)
    tensors = {"mtp." + k: v.detach().to(torch.bfloat16).contiguous().cpu() for k, v in mtp.state_dict().items()}
    want = {"mtp.pre_fc_norm_embedding.weight", "mtp.pre_fc_norm_hidden.weight", "mtp.fc.weight", "mtp.norm.weight"}
    main_l = {"mtp.layers.0." + k[len("model.layers.%d." % li):] for k in index["weight_map"]
              if k.startswith("model.layers.%d." % li)}
    if set(tensors) != want | main_l:
        die("MTP tensor names differ: extra %s, missing %s" % (sorted(set(tensors) - want - main_l),
                                                            sorted((want | main_l) - set(tensors))))
    save_file(tensors, os.path.join(args.out, "mtp.safetensors"), metadata={"format": "pt"})
    nbytes = sum(t.numel() * 2 for t in tensors.values())
    for k in tensors:
        index["weight_map"][k] = "mtp.safetensors"
    md = index.setdefault("metadata", {})
    if "total_size" in md:
        md["total_size"] += nbytes
    if "total_parameters" in md:
        md["total_parameters"] += sum(t.numel() for t in tensors.values())
    with open(os.path.join(args.out, "model.safetensors.index.json"), "w") as f:
        json.dump(index, f, indent=2)
        f.write("\n")
    back = load_file(os.path.join(args.out, "mtp.safetensors"))
    assert all(torch.equal(back[k], tensors[k]) for k in tensors)
    log("wrote %s: mtp.safetensors %d tensors, %.2f MB" % (args.out, len(tensors),
                                                          os.path.getsize(os.path.join(args.out, "mtp.safetensors")) / 1e6))

    # ---- the reference
    lengths = [int(x) for x in args.ref_lengths.split(",")]
    cuts = [i for i in range(len(held_text) - 1) if held_text[i:i + 2] == "\n\n"]
    cases, rows, row = [], [], 0
    with torch.no_grad():
        for ci, n in enumerate(lengths):
            frac = (0.1, 0.4, 0.7, 0.55, 0.85)[ci % 5]
            c = min(cuts, key=lambda x: abs(x - frac * len(held_text)))
            ids = encode(held_text[c + 2:c + 2 + 20 * n])[:n]
            assert len(ids) == n
            x = torch.tensor([ids], device=dev)
            h = model.model(input_ids=x, use_cache=False).last_hidden_state  # [1, n, d]
            main_logits = model.lm_head(h)[0]
            t_n = int(main_logits[-1].argmax())
            tf = model.lm_head(mtp(emb_fn(x[:, 1:]), h[:, :n - 1], cos[:, :n - 1], sin[:, :n - 1],
                                   causal_mask(n - 1, dev)))[0]  # [n-1, V]
            toks = ids[1:] + [t_n]
            hids = [h[0, i] for i in range(n)]
            drafts, chain_rows = [], []
            for k in range(args.chain):
                r = len(toks)
                m = mtp(emb_fn(torch.tensor([toks], device=dev)), torch.stack(hids)[None],
                        cos[:, :r], sin[:, :r], causal_mask(r, dev))
                lg = model.lm_head(m[:, -1])[0]
                if k == 0:
                    chk = model.lm_head(m[0, :n - 1])
                    if (chk - tf).abs().max().item() > 1e-3:
                        die("chained run's teacher-forced rows differ from the teacher-forced run")
                dk = int(lg.argmax())
                drafts.append(dk)
                chain_rows.append(lg)
                toks.append(dk)
                hids.append(m[0, -1])
            rows += [tf.float().cpu(), torch.stack(chain_rows).float().cpu()]
            case = {
                "text": tok.decode(ids),
                "input_ids": ids,
                "n": n,
                "row_offset": row,
                "mtp_rows": n - 1,
                "main_greedy_next": t_n,
                "top5_last": torch.topk(main_logits[-1], 5).indices.tolist(),
                "mtp_top5_last": torch.topk(tf[-1], 5).indices.tolist(),
                "chain": {
                    "row_offset": row + n - 1,
                    "rows": args.chain,
                    "positions": list(range(n - 1, n - 1 + args.chain)),
                    "input_tokens": [t_n] + drafts[:-1],
                    "drafts": drafts,
                },
            }
            row += n - 1 + args.chain
            cases.append(case)
            log("case %d: n %d, main greedy %d, chained drafts %s; MTP top-1 of the teacher-forced rows %d/%d" %
                (ci, n, t_n, drafts, sum(int(tf[i].argmax()) == ids[i + 2] for i in range(n - 2)), n - 2))
    allrows = torch.cat(rows, 0).contiguous()
    assert allrows.shape[0] == row
    os.makedirs(args.ref_out, exist_ok=True)
    allrows.numpy().astype("<f4").tofile(os.path.join(args.ref_out, "mtp_logits.bin"))
    ref = {
        "model": "tiny-qwen35-mtp",
        "dtype": "float32",
        "computed": "float32 from the bf16 weights upcast, TF32 off, eager attention; transformers %s, torch %s" %
                    (transformers.__version__, torch.__version__),
        "logits_file": "mtp_logits.bin",
        "layout": "float32 little-endian [rows][vocab], rows of the cases in order; a case's rows start at "
                  "row_offset: first its mtp_rows = n-1 teacher-forced rows (row i: token input_ids[i+1], hidden "
                  "h_i = the main model's post-final-norm hidden state at position i, RoPE position i, causal "
                  "attention over MTP rows 0..i; predicts input_ids[i+2]), then chain.rows chained rows at "
                  "chain.row_offset (= row_offset + n-1): chain row k is at position n-1+k, takes token "
                  "chain.input_tokens[k] (k = 0: main_greedy_next, the main model's greedy token after the prompt; "
                  "then the previous draft) and hidden h_{n-1} (k = 0) or the previous chain row's m (mtp.norm "
                  "output), attends over all MTP rows 0..n-1+k, and drafts[k] is the argmax of its logits",
        "vocab": cfg.vocab_size,
        "rows": row,
        "cases": cases,
        "training": {
            "train_text": os.path.basename(args.train_text),
            "heldout_text": os.path.basename(args.heldout_text),
            "seq_len": S, "batch": args.batch, "steps": step, "best_step": best_step, "seconds": round(train_s, 1),
            "heldout_before": {k: round(v, 4) for k, v in e0.items()},
            "heldout_final": {k: round(v, 4) for k, v in final.items()},
        },
    }
    with open(os.path.join(args.ref_out, "reference.json"), "w") as f:
        json.dump(ref, f, indent=1)
        f.write("\n")
    log("wrote %s (%d rows, %.2f MB)" % (args.ref_out, row, allrows.numel() * 4 / 1e6))

    # the directory loads in HF (which ignores mtp.*) and gives the main model's logits
    try:
        m2 = AutoModelForCausalLM.from_pretrained(args.out, dtype=torch.float32, attn_implementation="eager").to(dev)
        with torch.no_grad():
            x = torch.tensor([cases[0]["input_ids"]], device=dev)
            e = (m2(input_ids=x).logits - model(input_ids=x).logits).abs().max().item()
        log("reload of %s: logits max |diff| %.3g" % (args.out, e))
    except Exception as ex:  # the files are written; say so and go on
        log("note: reload of %s failed: %r" % (args.out, ex))
    log("SUMMARY " + json.dumps({"mtp_final": ref["training"]["heldout_final"], "steps": step,
                                 "chains": [c["chain"]["drafts"] for c in cases]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
