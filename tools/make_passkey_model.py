#!/usr/bin/env python3
"""make_passkey_model.py - a small Qwen3 trained from scratch at up to 2048 tokens to retrieve a passkey.

For measuring the recall of PXQ's long-context modes (YaRN, window + sink attention, block
selection) with tools/passkey_recall.py and tests/cli_passkey.sh. The task is tools/passkey_task.py:
filler sentences, the needle "The pass key is NNNNN. Remember it. NNNNN is the pass key." at a
uniform random depth, "What is the pass key? The pass key is", answer " NNNNN".

Model: Qwen3ForCausalLM, vocab 8192 (the tiny byte-level BPE tokenizer of tiny-qwen35), hidden 256,
4 layers, 8 heads over 2 KV heads of head_dim 32, intermediate 512, max_position_embeddings 2048,
rope_theta 10000 (small on purpose: without RoPE scaling, recall should fail beyond 2K), tied
embeddings, saved in bf16 (about 8.7 MB).

Training: total lengths (prompt + answer) uniform in [256, 2048] tokens, one length a step, about
--tokens-per-step tokens a step; loss weight 1 on the answer tokens and on the needle's second copy
of the digits (which can be copied from its first), --rest-weight on every other token. AdamW,
bf16 autocast. Stops when the held-out exact-match accuracy of the greedy answer at 2048 tokens
(teacher-forced argmax of all 6 answer tokens, which equals greedy decoding) reaches --target twice
in a row, or at --time-limit. The outputs are written whatever the accuracy; it is printed.

Usage (on the machine with torch + transformers 5.17, a GPU):
    python3 tools/make_passkey_model.py --out tests/data/passkey
"""
import argparse
import json
import os
import random
import shutil
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import passkey_task as pt  # noqa: E402

T0 = time.time()

CONFIG = {
    "architectures": ["Qwen3ForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 8189,
    "eos_token_id": 8189,
    "head_dim": 32,
    "hidden_act": "silu",
    "hidden_size": 256,
    "initializer_range": 0.02,
    "intermediate_size": 512,
    "layer_types": ["full_attention"] * 4,
    "max_position_embeddings": 2048,
    "max_window_layers": 4,
    "model_type": "qwen3",
    "num_attention_heads": 8,
    "num_hidden_layers": 4,
    "num_key_value_heads": 2,
    "pad_token_id": None,
    "rms_norm_eps": 1e-06,
    "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"},
    "sliding_window": None,
    "tie_word_embeddings": True,
    "use_cache": True,
    "use_sliding_window": False,
    "vocab_size": 8192,
}
PAD = 8189


def log(*a):
    print("[passkey %6.1fs]" % (time.time() - T0), *a, flush=True)


def sublist_last(hay, needle):
    for j in range(len(hay) - len(needle), -1, -1):
        if hay[j:j + len(needle)] == needle:
            return j
    return -1


def make_batch(task, rng, n_tokens, bsz, rest_weight, device):
    """Input ids [B, T] (right-padded), per-position loss weights [B, T-1] for predicting token t+1,
    and the samples."""
    samples = [task.sample(n_tokens, rng.random(), rng) for _ in range(bsz)]
    T = max(len(s["prompt_ids"]) + len(s["answer_ids"]) for s in samples)
    x = torch.full((bsz, T), PAD, dtype=torch.long)
    w = torch.zeros((bsz, T - 1))
    for b, s in enumerate(samples):
        ids = s["prompt_ids"] + s["answer_ids"]
        x[b, :len(ids)] = torch.tensor(ids)
        w[b, :len(ids) - 1] = rest_weight
        p = len(s["prompt_ids"])
        w[b, p - 1:p - 1 + len(s["answer_ids"])] = 1.0
        j = sublist_last(s["needle_ids"], s["answer_ids"])  # the second copy of " NNNNN" in the needle
        if j > 0:
            a = s["needle_start"] + j + 1  # its first digit
            w[b, a - 1:a - 1 + len(s["answer_ids"]) - 1] = 1.0
    return x.to(device, non_blocking=True), w.to(device, non_blocking=True), samples


@torch.no_grad()
def evaluate(model, task, n_tokens, n, seed, bs, device, autocast=True):
    """Exact-match accuracy of the answer (all its tokens the argmax, teacher-forced = greedy)."""
    rng = random.Random(seed)
    correct = 0
    model.eval()
    for i in range(0, n, bs):
        x, _, samples = make_batch(task, rng, n_tokens, min(bs, n - i), 0.0, device)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=autocast and device.type == "cuda"):
            logits = model(input_ids=x).logits
        for b, s in enumerate(samples):
            p = len(s["prompt_ids"])
            pred = logits[b, p - 1:p - 1 + len(s["answer_ids"])].argmax(-1).tolist()
            correct += pred == s["answer_ids"]
    model.train()
    return correct / n


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokenizer-dir", default="tests/data/qwen35/tiny-qwen35")
    ap.add_argument("--out", default="tests/data/passkey")
    ap.add_argument("--time-limit", type=float, default=330.0, help="seconds of training")
    ap.add_argument("--tokens-per-step", type=int, default=32768)
    ap.add_argument("--min-len", type=int, default=256)
    ap.add_argument("--max-len", type=int, default=2048)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--rest-weight", type=float, default=0.1)
    ap.add_argument("--target", type=float, default=0.98, help="stop at this accuracy at 2048, twice in a row")
    ap.add_argument("--eval-every", type=int, default=200)
    ap.add_argument("--eval-n", type=int, default=128)
    ap.add_argument("--final-n", type=int, default=500)
    ap.add_argument("--seed", type=int, default=2048)
    ap.add_argument("--summary", default="", help="also write the summary JSON here")
    ap.add_argument("--init", default="", help="start from this saved model (to train on) instead of from scratch")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = ap.parse_args()

    import transformers
    from transformers import Qwen3Config, Qwen3ForCausalLM
    from tokenizers import Tokenizer
    from safetensors.torch import load_file

    dev = torch.device(args.device)
    log("transformers", transformers.__version__, "torch", torch.__version__, "device", args.device,
        torch.cuda.get_device_name() if dev.type == "cuda" else "")
    random.seed(args.seed)
    torch.manual_seed(args.seed)
    rng = random.Random(args.seed)
    tok = Tokenizer.from_file(os.path.join(args.tokenizer_dir, "tokenizer.json"))

    def encode(s):
        return tok.encode(s, add_special_tokens=False).ids

    task = pt.PasskeyTask(encode)
    # the task's ids are the tokenizer's ids of its text (the harness and PXQ see only the text)
    crng = random.Random(1)
    for i in range(40):
        s = task.sample(crng.randint(args.min_len, args.max_len), crng.random(), crng)
        if encode(s["text"] + s["answer_text"]) != s["prompt_ids"] + s["answer_ids"]:
            log("FAIL: the task's token ids differ from the tokenizer's for sample %d: %r" % (i, s["text"][:200]))
            return 2
    log("task ids check: ok; answer ids of 12345:", encode(pt.answer_text("12345")))

    if args.init:
        model = Qwen3ForCausalLM.from_pretrained(args.init, dtype=torch.float32).to(dev)
        log("starting from", args.init)
    else:
        model = Qwen3ForCausalLM(Qwen3Config.from_dict(CONFIG)).to(dev)
    tied = model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    nparam = sum(p.numel() for p in model.parameters())
    log("model: %d params, tied %s, attention %s" % (nparam, tied, getattr(model.config, "_attn_implementation", "?")))
    if not tied:
        log("FAIL: lm_head is not tied to embed_tokens")
        return 2
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.1)
    model.train()
    t_train = time.time()
    step, hits, hist = 0, 0, []
    while True:
        el = time.time() - t_train
        if el > args.time_limit:
            log("time limit reached")
            break
        L = rng.randint(args.min_len, args.max_len)
        bsz = max(1, args.tokens_per_step // L)
        lr = args.lr * min(1.0, (step + 1) / (20 if args.init else 200)) * (0.3 if el > 0.85 * args.time_limit else 1.0)
        for pg in opt.param_groups:
            pg["lr"] = lr
        x, w, _ = make_batch(task, rng, L, bsz, args.rest_weight, dev)
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=dev.type == "cuda"):
            logits = model(input_ids=x).logits
        ce = F.cross_entropy(logits[:, :-1].float().reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1),
                             reduction="none").view_as(w)
        loss = (ce * w).sum() / w.sum()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        if step % 50 == 0:
            with torch.no_grad():
                ans = (w == 1.0).float()
                ans_ce = ((ce * ans).sum() / ans.sum()).item()
            log("step %5d  L %4d  B %3d  loss %.4f  answer+copy CE %.4f  lr %.2g" %
                (step, L, bsz, loss.item(), ans_ce, lr))
        if step % args.eval_every == 0:
            a2 = evaluate(model, task, 2048, args.eval_n, 1000, 32, dev)
            a1 = evaluate(model, task, 1024, args.eval_n, 1001, 32, dev)
            hist.append({"step": step, "s": round(time.time() - t_train, 1), "acc1024": a1, "acc2048": a2})
            log("eval step %d: acc@1024 %.3f  acc@2048 %.3f" % (step, a1, a2))
            hits = hits + 1 if a2 >= args.target else 0
            if hits >= 2:
                log("target %.2f reached twice" % args.target)
                break
    train_s = time.time() - t_train

    # the saved weights: bf16; evaluate them upcast to float32 (as PXQ computes)
    model.to(torch.bfloat16).float()
    final = {}
    for n_tok, seed in ((1024, 2001), (2048, 2002), (4096, 2003)):
        n_eval = args.final_n if n_tok <= 2048 else min(100, args.final_n)
        final["acc%d" % n_tok] = evaluate(model, task, n_tok, n_eval, seed, 16, dev, autocast=False)
    log("FINAL (bf16 weights, float32, %d prompts each; 4096: %d prompts, no RoPE scaling): %s" %
        (args.final_n, min(100, args.final_n), json.dumps(final)))

    os.makedirs(args.out, exist_ok=True)
    model.to(torch.bfloat16)
    model.save_pretrained(args.out)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(args.tokenizer_dir, f), os.path.join(args.out, f))
    st = os.path.join(args.out, "model.safetensors")
    keys = load_file(st)
    log("wrote %s: %s" % (args.out, sorted(os.listdir(args.out))))
    log("model.safetensors %.2f MB, %d tensors, lm_head.weight stored: %s" %
        (os.path.getsize(st) / 1e6, len(keys), "lm_head.weight" in keys))
    try:
        m2 = Qwen3ForCausalLM.from_pretrained(args.out, dtype=torch.float32).to(dev)
        a = evaluate(m2, task, 2048, 64, 2002, 16, dev, autocast=False)
        log("reload check: acc@2048 on 64 prompts %.3f" % a)
    except Exception as ex:
        log("note: reload failed: %r" % (ex,))
    summary = {"steps": step, "train_seconds": round(train_s, 1), "params": nparam, "final": final,
               "history": hist, "args": vars(args)}
    if args.summary:
        with open(args.summary, "w") as f:
            json.dump(summary, f, indent=1)
    log("SUMMARY " + json.dumps({"steps": step, "train_seconds": round(train_s, 1), "final": final}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
