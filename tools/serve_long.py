#!/usr/bin/env python3
"""serve_long.py - long contexts held at once by a running `pxq serve` (docs/KVCACHE.md, "The host
tier"): SEQS greedy /v1/completions of about TOKENS prompt tokens each, sent together, then each
again alone. Every text sent together must equal its text alone (the batch, the scheduler's prefill
chunks and the host tier change no token). The prompts are cut from tests/data/frankenstein.txt at
SEQS different offsets (wrapping round the text), 0.65 words a token (English runs 0.7-0.8).

Prints each sequence's prompt tokens (the server's usage), the wall time of the concurrent round
and of the alone round, and whether the texts agree; where one differs, the token where they part
and the top-2 logprob margin of each run there (CUDA batches are not bit-identical to a lone
request: docs/SERVER.md, so a near-tie may part them). Exits 1 if any differs or a request fails.

--passkey PXQ: the prompts are passkey prompts instead (tools/passkey_task.py: a 5-digit key hidden
among filler at depths spread over 0.05-0.95, sized with `PXQ tokenize -m --passkey-model`), for a
server running the passkey model (tests/data/passkey): each text must also start with its key. The
model answers with a confident key where it recalls it, not with prose at near-ties.

Usage: python3 tools/serve_long.py --port PORT [--seqs 8] [--tokens 32000] [--max-tokens 16]
           [--passkey build/pxq [--passkey-model tests/data/passkey]]
Standard library only.
"""
import argparse
import http.client
import json
import os
import random
import sys
import time
from concurrent.futures import ThreadPoolExecutor


def prompts(root, n, tokens):
    words = open(os.path.join(root, "tests/data/frankenstein.txt"), encoding="utf-8").read().split()
    k = max(1, int(tokens * 0.65))
    out = []
    for i in range(n):
        s = i * len(words) // n
        out.append(" ".join(words[(s + j) % len(words)] for j in range(k)))
    return out


def complete(port, prompt, max_tokens):
    """One greedy request with the top 2 logprobs; returns (text, prompt_tokens, logprobs) or raises."""
    body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "logprobs": 2}
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=3600)
    c.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
    r = c.getresponse()
    d = json.loads(r.read())
    if r.status != 200:
        raise RuntimeError(f"HTTP {r.status}: {d}")
    return d["choices"][0]["text"], d["usage"]["prompt_tokens"], d["choices"][0]["logprobs"]


def split_at(g, s):
    """Where two runs' tokens first differ, and each run's top-2 logprob margin there."""
    ta, tb = g["tokens"], s["tokens"]
    i = next((k for k in range(min(len(ta), len(tb))) if ta[k] != tb[k]), min(len(ta), len(tb)))
    def margin(lp):
        if i >= len(lp["top_logprobs"]):
            return float("nan")
        v = sorted(lp["top_logprobs"][i].values(), reverse=True)
        return v[0] - v[1] if len(v) > 1 else float("nan")
    return i, margin(g), margin(s)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--seqs", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=32000)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--passkey", metavar="PXQ", help="passkey prompts, sized with this pxq binary's tokenizer")
    ap.add_argument("--passkey-model", default="tests/data/passkey")
    a = ap.parse_args()
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
    keys = [None] * a.seqs
    if a.passkey:
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        import passkey_task as pt
        task = pt.PasskeyTask(pt.pxq_encoder(a.passkey, a.passkey_model))
        smp = [task.sample(a.tokens, pt.recall_depth(i, a.seqs), random.Random(a.tokens * 1000 + i)) for i in range(a.seqs)]
        ps, keys = [x["text"] for x in smp], [x["key"] for x in smp]
    else:
        ps = prompts(root, a.seqs, a.tokens)
    def one(p):
        try:
            return complete(a.port, p, a.max_tokens)
        except Exception as ex:  # reported below, as a failed sequence
            return ex

    t0 = time.monotonic()
    with ThreadPoolExecutor(a.seqs) as pool:
        together = list(pool.map(one, ps))
    t_together = time.monotonic() - t0
    t0 = time.monotonic()
    alone = [one(p) for p in ps]
    t_alone = time.monotonic() - t0
    bad = 0
    for i in range(a.seqs):
        g, s = together[i], alone[i]
        if isinstance(g, Exception) or isinstance(s, Exception):
            print(f"seq {i}: failed: {g if isinstance(g, Exception) else s}")
            bad += 1
            continue
        same = g[0] == s[0]
        hit = keys[i] is None or g[0].strip().startswith(keys[i])
        bad += not same or not hit
        why = ""
        if not same:
            k, mg, ms = split_at(g[2], s[2])
            why = f" vs {s[0]!r}; first differs at token {k}, top-2 logprob margin {mg:.4f} together, {ms:.4f} alone"
        key = "" if keys[i] is None else f" (key {keys[i]}: {'recalled' if hit else 'MISSED'})"
        print(f"seq {i}: {g[1]} prompt tokens, together {'==' if same else '!='} alone: {g[0]!r}{why}{key}")
    print(f"{a.seqs} sequences together: {t_together:.1f} s; each alone: {t_alone:.1f} s in all; "
          f"{a.seqs - bad} of {a.seqs} good (equal alone{', key recalled' if a.passkey else ''})")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
