#!/usr/bin/env python3
"""loadgen.py - streaming load against a running `pxq serve`, for machines without Node.js (the
GPU machine). The same protocol as tests/server/load.js: CLIENTS threads each loop over 8 prompts
cut from tests/data/frankenstein.txt (4..40 words), sending streamed greedy /v1/completions with
max_tokens MAX_TOKENS and stream_options.include_usage, for SECONDS. Each stream must end with
[DONE] and carry usage (else it counts as broken); its text should equal the text of the same
request sent alone (else it counts as differing: a backend that is not batch-invariant).
Prints requests/s, generated tokens/s and p50/p99 time to first token (first content chunk).

Usage: python3 tools/loadgen.py --port PORT [--clients 64] [--seconds 10] [--max-tokens 32]
Standard library only.
"""
import argparse
import http.client
import json
import threading
import time


def prompts(root, n=8, lo=4, hi=40):
    words = open(f"{root}/tests/data/frankenstein.txt", encoding="utf-8").read().split()
    out = []
    for i in range(n):
        k = round(lo + (hi - lo) * i / max(1, n - 1))
        s = (i * 977) % (len(words) - k - 1)
        out.append(" ".join(words[s:s + k]))
    return out


def complete(port, prompt, max_tokens, stream):
    """One request; returns (text, completion_tokens, ttft_seconds or None, done_seen, status)."""
    body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0}
    if stream:
        body.update(stream=True, stream_options={"include_usage": True})
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
    t0 = time.monotonic()
    c.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
    r = c.getresponse()
    if not stream:
        d = json.loads(r.read())
        c.close()
        return d["choices"][0]["text"], d["usage"]["completion_tokens"], None, True, r.status
    text, ntok, ttft, done = [], 0, None, False
    for raw in r:
        line = raw.decode("utf-8").rstrip("\r\n")
        if not line.startswith("data: "):
            continue
        data = line[6:]
        if data == "[DONE]":
            done = True
            break
        ev = json.loads(data)
        if ev.get("choices") and ev["choices"][0].get("text"):
            if ttft is None:
                ttft = time.monotonic() - t0
            text.append(ev["choices"][0]["text"])
        if ev.get("usage"):
            ntok = ev["usage"]["completion_tokens"]
    c.close()
    return "".join(text), ntok, ttft, done, r.status


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))] if xs else float("nan")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--clients", type=int, default=64)
    ap.add_argument("--seconds", type=float, default=10)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--root", default=".")
    a = ap.parse_args()
    ps = prompts(a.root)
    expected = [complete(a.port, p, a.max_tokens, False)[0] for p in ps]
    lock = threading.Lock()
    stats = {"req": 0, "tok": 0, "broken": 0, "differ": 0, "ttft": []}
    deadline = time.monotonic() + a.seconds

    def client(k):
        j = 0
        while time.monotonic() < deadline:
            i = (k + j) % len(ps)
            j += 1
            text, ntok, ttft, done, status = complete(a.port, ps[i], a.max_tokens, True)
            intact = status == 200 and done and ntok > 0
            with lock:
                stats["req"] += 1
                stats["tok"] += ntok
                stats["broken"] += 0 if intact else 1
                stats["differ"] += 1 if intact and text != expected[i] else 0
                if ttft is not None:
                    stats["ttft"].append(ttft)

    t0 = time.monotonic()
    th = [threading.Thread(target=client, args=(k,)) for k in range(a.clients)]
    for t in th:
        t.start()
    for t in th:
        t.join()
    dt = time.monotonic() - t0
    print(f"load: clients {a.clients}, {dt:.1f} s, {stats['req']} requests ({stats['broken']} broken: no 200, [DONE] "
          f"or usage; {stats['differ']} intact but with text unlike the request sent alone), "
          f"{stats['req'] / dt:.2f} requests/s, {stats['tok'] / dt:.1f} generated tokens/s, "
          f"TTFT p50 {1000 * pct(stats['ttft'], 50):.1f} ms, p99 {1000 * pct(stats['ttft'], 99):.1f} ms")
    return 1 if stats["broken"] or stats["differ"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
