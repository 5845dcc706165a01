#!/usr/bin/env python3
"""Make tests/data/qwen3_tokenizer_extra.json: what HF `tokenizers` / `transformers` give for
seeded random strings, tokenizer.json variants, id sequences and chat templates.

Run where HF is installed (the H200 test machine), from the repository root:
    python3 tests/data/gen_tokenizer_extra.py [full_output.json]
The committed file is a subset; the optional argument receives every case (for development).

Variants are patches to the real Qwen3 tokenizer.json (tests/data/qwen3-tokenizer/tokenizer.json.xz):
top-level keys replace the file's (normalizer, pre_tokenizer), "model" keys are merged into
model, "added_tokens_extra" is appended to added_tokens. test_tokenizer.c applies the same patches.
    python3 tests/data/gen_tokenizer_extra.py --from-full full_output.json   (only rewrite the subset)
"""
import hashlib, json, lzma, os, random, shutil, struct, sys, tempfile


def write_small(out, path="tests/data/qwen3_tokenizer_extra.json"):
    """The committed subset, one case per line."""
    keep = {"qwen3": 200}
    with open(path, "w", encoding="utf-8") as f:
        f.write('{"variants": {\n')
        for i, (name, v) in enumerate(out["variants"].items()):
            f.write('%s: {"patch": %s, "cases": [\n' % (json.dumps(name), json.dumps(v["patch"], ensure_ascii=False)))
            cases = [c for c in v["cases"] if len(c["text"]) <= 120][:keep.get(name, 40)]
            f.write(",\n".join(json.dumps(c, ensure_ascii=False, separators=(",", ":")) for c in cases))
            f.write("]}%s\n" % ("," if i + 1 < len(out["variants"]) else ""))
        f.write('},\n"decode": [\n')
        f.write(",\n".join(json.dumps(c, ensure_ascii=False, separators=(",", ":")) for c in out["decode"][:100]))
        f.write('],\n"chat": [\n')
        f.write(",\n".join(json.dumps(c, ensure_ascii=False, separators=(",", ":")) for c in out["chat"]))
        f.write('],\n"templates": %s,\n"books": %s}\n' % (json.dumps(out["templates"], ensure_ascii=False),
                                                           json.dumps(out["books"])))


if len(sys.argv) > 2 and sys.argv[1] == "--from-full":
    write_small(json.load(open(sys.argv[2], encoding="utf-8")))
    sys.exit(0)

from tokenizers import Tokenizer  # noqa: E402

BASE = json.loads(lzma.open("tests/data/qwen3-tokenizer/tokenizer.json.xz").read())
QWEN2_RE = BASE["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"]
QWEN35_RE = ("(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?[\\p{L}\\p{M}]+|\\p{N}| ?[^\\s\\p{L}\\p{M}\\p{N}]+"
             "[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+")
BL = lambda prefix, regex: {"type": "ByteLevel", "add_prefix_space": prefix, "trim_offsets": False, "use_regex": regex}
SPLIT = lambda rx: {"type": "Split", "pattern": {"Regex": rx}, "behavior": "Isolated", "invert": False}
VARIANTS = {
    "qwen3": {},
    "qwen35_regex": {"pre_tokenizer": {"type": "Sequence", "pretokenizers": [SPLIT(QWEN35_RE), BL(False, False)]}},
    "gpt2_bytelevel_prefix": {"pre_tokenizer": BL(True, True)},
    "split_then_prefix": {"pre_tokenizer": {"type": "Sequence", "pretokenizers": [SPLIT(QWEN2_RE), BL(True, False)]}},
    "ignore_merges": {"model": {"ignore_merges": True}},
    "no_normalizer": {"normalizer": None},
    "added_options": {"added_tokens_extra": [
        {"id": 151669, "content": "<tag>", "single_word": False, "lstrip": True, "rstrip": True, "normalized": False, "special": False},
        {"id": 151670, "content": "word", "single_word": True, "lstrip": False, "rstrip": False, "normalized": False, "special": False},
        {"id": 151671, "content": "caf\u00e9!", "single_word": False, "lstrip": False, "rstrip": False, "normalized": True, "special": False},
        {"id": 151672, "content": "<|im_start|>sys", "single_word": False, "lstrip": False, "rstrip": False, "normalized": False, "special": True},
        {"id": 151673, "content": "<|im", "single_word": False, "lstrip": False, "rstrip": False, "normalized": False, "special": False},
    ]},
}


def patched(patch):
    d = json.loads(json.dumps(BASE))
    for k, v in patch.items():
        if k == "model":
            d["model"].update(v)
        elif k == "added_tokens_extra":
            d["added_tokens"] += v
        else:
            d[k] = v
    return d


rng = random.Random(1234)
WS = [" ", "  ", "   ", "\t", "\n", "\r\n", "\n\n", " \n ", "\r", "\u00a0", "\u0085", "\u2028", "\u2029", "\u3000",
      "\u200b", "\ufeff", "\u1680", "\u000b", "\u000c", "\u2009", "\u202f", " \t ", "\n   \n", "\t\t"]
WORDS = ["hello", "World", "THE", "don't", "I'll", "we'RE", "they'D", "it's", "'s", "'S", "'ll", "'LL", "'Ve", "o'clock",
         "\u017f", "'\u017f", "\u212a", "'\u212a", "\u0130stanbul", "stra\u00dfe", "na\u00efve", "caf\u00e9", "cafe\u0301",
         "e\u0301", "a\u0308", "\u1100\u1161\u11a8", "\u1112\u1161\u11ab", "\u00c5ngstr\u00f6m", "A\u030a",
         "\u0915\u094d\u0937", "\u0928\u092e\u0938\u094d\u0924\u0947", "\u0e2a\u0e27\u0e31\u0e2a\u0e14\u0e35",
         "\u0645\u0631\u062d\u0628\u0627", "\u05e9\u05dc\u05d5\u05dd", "\u4f60\u597d", "\u4e16\u754c", "\u91cf\u5316",
         "\u65e5\u672c\u8a9e", "\u30c6\u30ad\u30b9\u30c8", "\ud55c\uad6d\uc5b4", "\u0395\u03bb\u03bb\u03ac\u03b4\u03b1",
         "\u0440\u0443\u0441\u0441\u043a\u0438\u0439", "x\u0336y", "\u00bd", "\u00b2", "\u2162", "\u0663\u0664", "\u096b",
         "\U0001f999", "\U0001f44d\U0001f3fd", "\U0001f469\u200d\U0001f4bb", "\U0001f1fa\U0001f1f8", "\u2764\ufe0f",
         "<|im_start|>", "<|im_end|>", "<|endoftext|>", "<think>", "</think>", "<tool_call>", "<|im_", "<|im_start|",
         "<|im_start|>sys", "<tag>", "word", "words", "_word", "caf\u00e9!", "cafe\u0301!", "<", "|", "<|"]
PUNCT = list("!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~") + ["...", "--", "==", "->", "::", "//", "/*", "*/", "\u2014",
                                                      "\u201c", "\u201d", "\u3001", "\u3002", "\uff1a", "\u00bf"]


def rand_piece():
    r = rng.random()
    if r < 0.3:
        return rng.choice(WORDS)
    if r < 0.45:
        return rng.choice(WS)
    if r < 0.6:
        return rng.choice(PUNCT) * rng.choice([1, 1, 1, 2, 3])
    if r < 0.7:
        return "".join(rng.choice("0123456789") for _ in range(rng.randint(1, 7)))
    if r < 0.8:
        return "".join(rng.choice("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ") for _ in range(rng.randint(1, 9)))
    if r < 0.9:  # random code points from assigned-ish blocks
        blocks = [(0x20, 0x7e), (0xa0, 0x24f), (0x300, 0x36f), (0x370, 0x3ff), (0x400, 0x4ff), (0x590, 0x6ff),
                  (0x900, 0x97f), (0xe00, 0xe7f), (0x1100, 0x11ff), (0x2000, 0x206f), (0x2100, 0x22ff),
                  (0x3000, 0x30ff), (0x4e00, 0x9fff), (0xac00, 0xd7a3), (0xff00, 0xffef), (0x1f300, 0x1f6ff)]
        lo, hi = rng.choice(blocks)
        return "".join(chr(rng.randint(lo, hi)) for _ in range(rng.randint(1, 5)))
    return rng.choice(["a", " ", "-", "\n", "\u00e9", "\u4e00", "ab"]) * rng.randint(20, 200)


texts = ["".join(rand_piece() for _ in range(rng.randint(1, 12))) for _ in range(3000)]
out = {"variants": {}, "decode": [], "chat": [], "books": {}}

for name, patch in VARIANTS.items():
    tok = Tokenizer.from_str(json.dumps(patched(patch)))
    sel = texts if name == "qwen3" else texts[:600]
    cases = []
    for t in sel:
        c = {"text": t, "ids": tok.encode(t, add_special_tokens=False).ids}
        if name in ("qwen3", "added_options"):
            tok.encode_special_tokens = True
            c["ids_nospecial"] = tok.encode(t, add_special_tokens=False).ids
            tok.encode_special_tokens = False
        cases.append(c)
    out["variants"][name] = {"patch": patch, "cases": cases}

tok = Tokenizer.from_str(json.dumps(BASE))
for i in range(400):
    if i % 2:
        ids = [rng.randrange(0, 256) for _ in range(rng.randint(1, 12))]
    else:
        ids = [rng.choice([rng.randrange(0, 151669), rng.randrange(0, 256), rng.randrange(151643, 151669)])
               for _ in range(rng.randint(1, 12))]
    out["decode"].append({"ids": ids, "text": tok.decode(ids, skip_special_tokens=False),
                          "text_skip": tok.decode(ids, skip_special_tokens=True)})

for path in ["tests/data/frankenstein.txt"]:
    text = open(path, encoding="utf-8").read()
    ids = tok.encode(text, add_special_tokens=False).ids
    out["books"][os.path.basename(path)] = {"n_ids": len(ids), "sha256_i32le": hashlib.sha256(
        struct.pack("<%di" % len(ids), *ids)).hexdigest()}

# chat templates through transformers' apply_chat_template
from transformers import AutoTokenizer

tmp = tempfile.mkdtemp()
with open(os.path.join(tmp, "tokenizer.json"), "w") as f:
    json.dump(BASE, f)
shutil.copy("tests/data/qwen3-tokenizer/tokenizer_config.json", tmp)
hf = AutoTokenizer.from_pretrained(tmp)
QWEN25_LIKE = ("{%- if messages[0]['role'] == 'system' %}{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}"
               "{%- else %}{{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\\n' }}{%- endif %}"
               "{%- for message in messages %}{%- if (message.role == \"user\") or (message.role == \"system\" and not loop.first) or (message.role == \"assistant\") %}"
               "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}"
               "{%- elif message.role == \"tool\" %}{%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != \"tool\") %}{{- '<|im_start|>user' }}{%- endif %}"
               "{{- '\\n<tool_response>\\n' }}{{- message.content }}{{- '\\n</tool_response>' }}"
               "{%- if loop.last or (messages[loop.index0 + 1].role != \"tool\") %}{{- '<|im_end|>\\n' }}{%- endif %}{%- endif %}{%- endfor %}"
               "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}")
TEMPLATES = {"qwen3": hf.chat_template, "tiny": open("tests/data/tiny-qwen3/chat_template.jinja").read(),
             "qwen25_like": QWEN25_LIKE}
U, A, S, T = (lambda c: {"role": "user", "content": c}), (lambda c: {"role": "assistant", "content": c}), \
    (lambda c: {"role": "system", "content": c}), (lambda c: {"role": "tool", "content": c})
CONVS = [
    [U("What is 2+2?")],
    [S("You are terse."), U("Name a color."), A("Blue."), U("Another?")],
    [U("Hi"), A("Hello")],
    [U("Q1"), A("<think>\nhmm\n</think>\n\nBlue.")],
    [U("Q1"), A("<think>\nr1\n</think>\n\nA1"), U("Q2"), A("Plain"), U("Q3")],
    [U("Q1"), A("<think>\nr1\n</think>\n\nA1"), U("Q2"), A("<think>r2</think>A2")],
    [S("sys"), U("weather?"), A("<think>\nneed tool\n</think>\n\ncalling"), T("{\"t\": 20}"), T("{\"h\": 5}"), A("<think>\ngot it\n</think>\n\nIt is 20."), U("thanks")],
    [U("go"), A("step"), U("<tool_response>\nr\n</tool_response>"), A("<think>x</think>\n\ndone")],
    [U("a"), S("late system"), U("b")],
    [U("a"), {"role": "developer", "content": "dev"}, U("b")],
    [U("a"), A("\n\nAnswer with newlines")],
    [U("a"), A("<think>one</think>two</think>\n\nthree")],
    [U("a"), A("pre<think>\n\nr\n\n</think>\n\n\nans")],
    [T("only tool")],
    [S("sys only")],
]
for tname, tmpl in TEMPLATES.items():
    for conv in CONVS:
        for gen in (True, False):
            try:
                r = hf.apply_chat_template(conv, tokenize=False, add_generation_prompt=gen, chat_template=tmpl)
            except Exception as e:  # noqa: BLE001
                print("skip", tname, conv, gen, e)
                continue
            out["chat"].append({"template": tname, "messages": conv, "add_generation_prompt": gen, "rendered": r})
out["templates"] = {k: v for k, v in TEMPLATES.items() if k != "qwen3"}  # qwen3's is in tokenizer_config.json

if len(sys.argv) > 1:
    json.dump(out, open(sys.argv[1], "w"), ensure_ascii=False)
write_small(out)
print("ok", {k: len(v["cases"]) for k, v in out["variants"].items()}, len(out["chat"]))
