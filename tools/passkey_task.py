#!/usr/bin/env python3
"""passkey_task.py - the passkey-retrieval task, defined once for the trainer
(tools/make_passkey_model.py), the recall harness (tools/passkey_recall.py) and tests/cli_passkey.sh.

A sample is filler sentences (drawn at random from FILLERS, so the text is not periodic) with the
needle " The pass key is NNNNN. Remember it. NNNNN is the pass key." between two of them at a
depth in [0, 1] (0: before the first filler sentence, 1: after the last), then QUESTION
" What is the pass key? The pass key is"; the answer is " NNNNN" (5 random digits; the tiny
byte-level BPE tokenizer makes it 6 tokens: " " and one token a digit).

Every piece starts with a space followed by a letter (or is " " + digits), so with the Qwen
pre-tokenizer regex no token crosses a piece boundary: the token ids of the text are the
concatenation of the ids of its pieces. The trainer checks this against the tokenizer; it lets
the task count tokens with an encoder called once per distinct piece.

Pure Python, no dependencies. As a program it writes one prompt for PXQ:
    python3 tools/passkey_task.py --len 1500 --depth 0.5 --seed 1 --out prompt.txt
prints "KEY PROMPT_TOKENS NEEDLE_START NEEDLE_END" (token indices of the needle's first token and
one past its last) and writes the prompt text (no answer) to --out; it tokenizes with
`pxq tokenize` (--pxq, -m).
"""
import argparse
import json
import random
import subprocess
import sys

FILLERS = (
    " The grass is green.",
    " The sky is blue.",
    " The sun is yellow.",
    " Here we go.",
    " There and back again.",
    " The river runs to the sea.",
    " The wind is calm today.",
    " Birds sing in the old tree.",
)
QUESTION = " What is the pass key? The pass key is"


def needle_text(key):
    return " The pass key is %s. Remember it. %s is the pass key." % (key, key)


def answer_text(key):
    return " " + key


def random_key(rng):
    return "%05d" % rng.randrange(100000)


class PasskeyTask:
    """encode: str -> list of token ids (the model's tokenizer, no special tokens added)."""

    def __init__(self, encode):
        self.encode = encode
        self.filler_ids = [list(encode(s)) for s in FILLERS]
        self.question_ids = list(encode(QUESTION))

    def sample(self, n_tokens, depth, rng, key=None):
        """A sample of at most n_tokens tokens, prompt and answer together (at least n_tokens - 7:
        the filler stops before the sentence that would not fit). depth in [0, 1]: where the needle
        goes among the filler sentences. Returns a dict: key, text (prompt, no answer),
        answer_text, prompt_ids, answer_ids, needle_start (token index), needle_ids."""
        if key is None:
            key = random_key(rng)
        needle_ids = list(self.encode(needle_text(key)))
        answer_ids = list(self.encode(answer_text(key)))
        budget = n_tokens - len(needle_ids) - len(self.question_ids) - len(answer_ids)
        if budget < 0:
            raise ValueError("n_tokens %d is too short for the needle and the question" % n_tokens)
        picks, used = [], 0
        while True:
            j = rng.randrange(len(FILLERS))
            if used + len(self.filler_ids[j]) > budget:
                break
            picks.append(j)
            used += len(self.filler_ids[j])
        k = int(round(min(max(depth, 0.0), 1.0) * len(picks)))
        before, after = picks[:k], picks[k:]
        ids, text = [], []
        for j in before:
            ids += self.filler_ids[j]
            text.append(FILLERS[j])
        needle_start = len(ids)
        ids += needle_ids
        text.append(needle_text(key))
        for j in after:
            ids += self.filler_ids[j]
            text.append(FILLERS[j])
        ids += self.question_ids
        text.append(QUESTION)
        return {
            "key": key,
            "text": "".join(text),
            "answer_text": answer_text(key),
            "prompt_ids": ids,
            "answer_ids": answer_ids,
            "needle_start": needle_start,
            "needle_ids": needle_ids,
        }


def recall_depth(seed, n_seeds):
    """The needle depth of seed s of N in the recall harness and the CI test: spread evenly over
    0.05 .. 0.95 (one seed: 0.5)."""
    if n_seeds <= 1:
        return 0.5
    return 0.05 + 0.9 * seed / (n_seeds - 1)


def pxq_encoder(pxq, model):
    """An encode function that runs `pxq tokenize -m MODEL TEXT` (a few ms a call), cached."""
    cache = {}

    def encode(text):
        if text not in cache:
            out = subprocess.run([pxq, "tokenize", "-m", model, "--no-parse-special", "-p", text],
                                 check=True, capture_output=True, text=True).stdout
            cache[text] = json.loads(out)
        return cache[text]
    return encode


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--len", type=int, required=True, help="tokens, prompt and answer together (at most)")
    ap.add_argument("--depth", type=float, default=0.5)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", required=True, help="file for the prompt text")
    ap.add_argument("--pxq", default="./pxq")
    ap.add_argument("-m", "--model", default="tests/data/passkey")
    ap.add_argument("--calib", type=int, default=0,
                    help="write instead a JSON list of N prompts (KV calibration text): prompt i at a depth from "
                         "random.Random(9000 + i), its key and filler from random.Random(9100 + i)")
    args = ap.parse_args()
    task = PasskeyTask(pxq_encoder(args.pxq, args.model))
    if args.calib > 0:
        texts = [task.sample(args.len, random.Random(9000 + i).random(), random.Random(9100 + i))["text"]
                 for i in range(args.calib)]
        with open(args.out, "w") as f:
            json.dump(texts, f)
        return 0
    s = task.sample(args.len, args.depth, random.Random(args.seed))
    with open(args.out, "w") as f:
        f.write(s["text"])
    print(s["key"], len(s["prompt_ids"]), s["needle_start"], s["needle_start"] + len(s["needle_ids"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
