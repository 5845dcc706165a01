#!/usr/bin/python3
"""train_mtp_cpu.py - train tiny-qwen35's MTP head on the CPU and write its PyTorch reference.

The CPU stand-in for tools/make_mtp_fixture.py (which uses HF transformers on a GPU machine): the same
head, tensor names and contract (that script's docstring), with the MTP decoder layer written here in
plain PyTorch (Qwen3_5DecoderLayer of type full_attention: RMSNorm x_hat * (1 + w); q_proj giving
[query | gate] per head; q/k RMSNorm; partial NeoX RoPE on the first partial_rotary_factor * head_dim
dims; causal softmax attention, GQA; output * sigmoid(gate); o_proj; SwiGLU MLP). The main model's
hidden states h_i (after its final norm) come from PXQ (tools/dump_hidden.c), whose main-model logits
match HF transformers' (tests/test_qwen35.c); the head's own arithmetic here is independent of PXQ's.

Loss: half the cross-entropy of the true token at i + 2, half the KL divergence from the main model's
own distribution at position i + 1 (lm_head(h_{i+1}); greedy drafts are accepted where the argmaxes
agree, which the held-out figure reports).

    /usr/bin/python3 tools/train_mtp_cpu.py --init DIR_WITH_UNTRAINED_MTP --train h_train.bin \\
        --val h_val.bin --ref h_ref.bin --out tests/data/qwen35/tiny-qwen35-mtp \\
        --ref-out tests/data/qwen35/ref/tiny-qwen35-mtp [--minutes 6]

h_*.bin: tools/dump_hidden.c's output. The reference (written as tests/test_mtp.c reads it):
reference.json (cases: input_ids, row_offset, main_greedy_next, chain {row_offset, rows, drafts})
and reference_logits.bin, float32 [rows][vocab]: per case the teacher-forced rows i = 0..n-2, then 3
chained greedy rows from position n-1. Computed in float32 from the bf16-rounded weights.
"""
import argparse
import json
import os
import struct
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

from make_untrained_mtp import read_tensors, write_tensors  # the same directory


def read_st(path):
    """{name: float32 tensor} of a bf16 safetensors file."""
    out = {}
    for k, (dt, shape, raw) in read_tensors(path).items():
        assert dt == "BF16", (k, dt)
        u = np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16
        out[k] = torch.from_numpy(u.view(np.float32).reshape(shape).copy())
    return out


def to_bf16_bytes(t):
    u = t.detach().float().contiguous().numpy().view(np.uint32)
    r = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype("<u2")  # round to nearest even
    return r.tobytes()


def bf16_round(t):
    u = t.detach().float().contiguous().numpy().view(np.uint32)
    r = (((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16).astype(np.uint32)
    return torch.from_numpy(r.view(np.float32).copy()).reshape(t.shape)


def read_h(path):
    with open(path, "rb") as f:
        nw, w, d = struct.unpack("<3i", f.read(12))
        toks, hs = [], []
        for _ in range(nw):
            toks.append(np.frombuffer(f.read(4 * w), dtype="<i4").copy())
            hs.append(np.frombuffer(f.read(4 * w * d), dtype="<f4").reshape(w, d).copy())
    return torch.from_numpy(np.stack(toks)).long(), torch.from_numpy(np.stack(hs))


def rms(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * (1.0 + w)


class MTP(torch.nn.Module):
    def __init__(self, cfg, t):
        super().__init__()
        self.d, self.nh, self.nkv, self.hd = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
        self.eps = cfg["rms_norm_eps"]
        rp = cfg.get("rope_parameters", {})
        self.n_rot = int(self.hd * rp.get("partial_rotary_factor", cfg.get("partial_rotary_factor", 1.0)))
        self.theta = rp.get("rope_theta", cfg.get("rope_theta", 10000.0))
        self.p = torch.nn.ParameterDict({k.replace(".", "__"): torch.nn.Parameter(v.clone()) for k, v in t.items()})

    def w(self, name):
        return self.p[name.replace(".", "__")]

    def rope(self, x, pos):
        half = self.n_rot // 2
        inv = 1.0 / (self.theta ** (torch.arange(0, half, dtype=torch.float32) * 2.0 / self.n_rot))
        ang = pos[:, None].float() * inv[None, :]
        cos, sin = torch.cos(ang)[None, :, None, :], torch.sin(ang)[None, :, None, :]
        r, rest = x[..., :self.n_rot], x[..., self.n_rot:]
        x1, x2 = r[..., :half], r[..., half:]
        return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin, rest], dim=-1)

    def forward(self, emb_rows, h, pos):
        """emb_rows, h: [B, S, d] (the next tokens' embeddings and the hidden states); pos: [S]. Returns m [B, S, d]."""
        B, S, d = h.shape
        L = "mtp.layers.0."
        x = F.linear(torch.cat([rms(emb_rows, self.w("mtp.pre_fc_norm_embedding.weight"), self.eps),
                                rms(h, self.w("mtp.pre_fc_norm_hidden.weight"), self.eps)], -1), self.w("mtp.fc.weight"))
        xn = rms(x, self.w(L + "input_layernorm.weight"), self.eps)
        qg = F.linear(xn, self.w(L + "self_attn.q_proj.weight")).view(B, S, self.nh, 2 * self.hd)
        q, gate = qg[..., :self.hd], qg[..., self.hd:]
        k = F.linear(xn, self.w(L + "self_attn.k_proj.weight")).view(B, S, self.nkv, self.hd)
        v = F.linear(xn, self.w(L + "self_attn.v_proj.weight")).view(B, S, self.nkv, self.hd)
        q = self.rope(rms(q, self.w(L + "self_attn.q_norm.weight"), self.eps), pos)
        k = self.rope(rms(k, self.w(L + "self_attn.k_norm.weight"), self.eps), pos)
        rep = self.nh // self.nkv
        k, v = k.repeat_interleave(rep, dim=2), v.repeat_interleave(rep, dim=2)
        att = torch.einsum("bqhd,bkhd->bhqk", q, k) / (self.hd ** 0.5)
        mask = torch.triu(torch.ones(S, S, dtype=torch.bool), 1)
        att = att.masked_fill(mask, float("-inf")).softmax(-1)
        o = torch.einsum("bhqk,bkhd->bqhd", att, v) * torch.sigmoid(gate)
        x = x + F.linear(o.reshape(B, S, self.nh * self.hd), self.w(L + "self_attn.o_proj.weight"))
        xn = rms(x, self.w(L + "post_attention_layernorm.weight"), self.eps)
        x = x + F.linear(F.silu(F.linear(xn, self.w(L + "mlp.gate_proj.weight"))) * F.linear(xn, self.w(L + "mlp.up_proj.weight")),
                         self.w(L + "mlp.down_proj.weight"))
        return rms(x, self.w("mtp.norm.weight"), self.eps)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--init", required=True)
    ap.add_argument("--train", required=True)
    ap.add_argument("--val", required=True)
    ap.add_argument("--ref", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--ref-out", required=True)
    ap.add_argument("--minutes", type=float, default=6.0)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--batch", type=int, default=16)
    a = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    cfg = json.load(open(os.path.join(a.init, "config.json")))
    index = json.load(open(os.path.join(a.init, "model.safetensors.index.json")))
    weights = {}
    for f in sorted(set(index["weight_map"].values())):
        weights.update(read_st(os.path.join(a.init, f)))
    emb = weights["model.embed_tokens.weight"]  # tied lm_head
    mtp = MTP(cfg, {k: v for k, v in weights.items() if k.startswith("mtp.")})
    d = cfg["hidden_size"]
    with torch.no_grad():  # fc starts as the mean of the two halves
        mtp.w("mtp.fc.weight").copy_(torch.cat([0.5 * torch.eye(d), 0.5 * torch.eye(d)], 1) + 0.01 * torch.randn(d, 2 * d))
    tt, th = read_h(a.train)
    vt, vh = read_h(a.val)

    def batch_loss(toks, hs, train):
        S = toks.shape[1]
        pos = torch.arange(S - 2)
        m = mtp(F.embedding(toks[:, 1:S - 1], emb), hs[:, :S - 2], pos)
        logits = m @ emb.t()
        # the main model's distribution at position i + 1 is the target: greedy drafts are accepted when
        # their argmax is the main model's (knowledge distillation; half the loss is the true token's CE)
        with torch.no_grad():
            teacher = (hs[:, 1:S - 1] @ emb.t()).log_softmax(-1)
        lp = logits.log_softmax(-1)
        kl = (teacher.exp() * (teacher - lp)).sum(-1).mean()
        tgt = toks[:, 2:S]
        loss = 0.5 * F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tgt.reshape(-1)) + 0.5 * kl
        acc = (logits.argmax(-1) == teacher.argmax(-1)).float().mean().item()  # the greedy acceptance
        return loss, acc

    def evaluate():
        with torch.no_grad():
            ls, accs = [], []
            for i in range(0, vt.shape[0], 4):
                l, c = batch_loss(vt[i:i + 4], vh[i:i + 4], False)
                ls.append(l.item()), accs.append(c)
        return sum(ls) / len(ls), sum(accs) / len(accs)

    l0, a0 = evaluate()
    print("held-out before: loss %.4f, agreement with the main model's argmax %.4f" % (l0, a0), flush=True)
    opt = torch.optim.AdamW(mtp.parameters(), lr=3e-3, weight_decay=0.01)
    t0, step, W, S = time.time(), 0, tt.shape[1], a.seq
    while time.time() - t0 < a.minutes * 60:
        wi = torch.randint(0, tt.shape[0], (a.batch,))
        off = torch.randint(0, W - S + 1, (a.batch,))
        toks = torch.stack([tt[w, o:o + S] for w, o in zip(wi.tolist(), off.tolist())])
        hs = torch.stack([th[w, o:o + S] for w, o in zip(wi.tolist(), off.tolist())])
        loss, acc = batch_loss(toks, hs, True)
        opt.zero_grad()
        loss.backward()
        opt.step()
        step += 1
        if step % 50 == 0:
            print("step %d (%.0f s): loss %.4f, top-1 %.3f" % (step, time.time() - t0, loss.item(), acc), flush=True)
    with torch.no_grad():
        for p in mtp.parameters():
            p.copy_(bf16_round(p))
    l1, a1 = evaluate()
    print("held-out after %d steps (bf16 weights): loss %.4f, agreement %.4f" % (step, l1, a1), flush=True)
    # the fixture: the untrained directory's layout, this head's weights
    os.makedirs(a.out, exist_ok=True)
    write_tensors(os.path.join(a.out, "mtp.safetensors"),
                  {k: ("BF16", mtp.w(k).shape, to_bf16_bytes(mtp.w(k))) for k in weights if k.startswith("mtp.")})
    # the reference
    rt, rh = read_h(a.ref)
    rows, cases, row = [], [], 0
    with torch.no_grad():
        for ci, n in enumerate((12, 40, 80)):
            toks, hs = rt[ci, :n], rh[ci, :n]
            tf = mtp(F.embedding(toks[1:n][None], emb), hs[:n - 1][None], torch.arange(n - 1))[0] @ emb.t()
            t_n = int((hs[n - 1] @ emb.t()).argmax())
            seq_t, seq_h, drafts, chain = list(toks[1:].tolist()) + [t_n], [hs[i] for i in range(n)], [], []
            for k in range(3):
                r = len(seq_h)
                m = mtp(F.embedding(torch.tensor(seq_t[:r])[None], emb), torch.stack(seq_h)[None], torch.arange(r))[0]
                lg = m[-1] @ emb.t()
                dk = int(lg.argmax())
                drafts.append(dk), chain.append(lg)
                seq_t.append(dk), seq_h.append(m[-1])
            rows += [tf, torch.stack(chain)]
            cases.append({"input_ids": toks.tolist(), "n": n, "row_offset": row, "mtp_rows": n - 1, "main_greedy_next": t_n,
                          "chain": {"row_offset": row + n - 1, "rows": 3, "positions": [n - 1, n, n + 1],
                                    "input_tokens": [t_n] + drafts[:-1], "drafts": drafts}})
            row += n - 1 + 3
    os.makedirs(a.ref_out, exist_ok=True)
    torch.cat(rows).float().numpy().astype("<f4").tofile(os.path.join(a.ref_out, "reference_logits.bin"))
    ref = {"model": "tiny-qwen35-mtp", "computed": "float32 in PyTorch %s (tools/train_mtp_cpu.py) from the bf16 weights; "
           "h from PXQ (tools/dump_hidden.c)" % torch.__version__,
           "layout": "float32 LE [rows][vocab]: per case mtp_rows teacher-forced rows (row i: token input_ids[i+1], h_i, "
                     "position i; predicts input_ids[i+2]) at row_offset, then chain.rows chained rows at chain.row_offset "
                     "(row k at position n-1+k takes chain.input_tokens[k] and h_{n-1} (k = 0) or the previous row's m)",
           "vocab": int(emb.shape[0]), "rows": row, "cases": cases,
           "training": {"steps": step, "seq": S, "batch": a.batch, "minutes": a.minutes,
                        "heldout_before": {"loss": round(l0, 4), "agreement": round(a0, 4)},
                        "heldout_after": {"loss": round(l1, 4), "agreement": round(a1, 4)}}}
    with open(os.path.join(a.ref_out, "reference.json"), "w") as f:
        json.dump(ref, f, indent=1)
        f.write("\n")
    print("wrote %s and %s (%d reference rows)" % (a.out, a.ref_out, row), flush=True)


if __name__ == "__main__":
    sys.exit(main())
