#!/bin/sh
# Install what PXQ's build and tests need on Debian 12: the compiler, the libraries PXQ builds on
# (PCRE2, cJSON, utf8proc, libmicrohttpd, nettle), xz (the tokenizer fixture), clang for the
# fuzzers, Python's Jinja2 (tests/chat_oracle.py runs the real chat templates for test_chat),
# jsonschema (tests/server/structured.js validates structured output with it) and NumPy
# (tools/llama2c_ref.py, llama2.c's forward that made tests/data/llama2c/greedy.jsonl), Chromium
# (tests/server/chatpage.js drives the chat page in it, headless), and Node.js + the npm packages of
# the server tests. Uses sudo when not run as root.
# Node.js and npm come from Debian only when the machine has none: a Node.js from elsewhere (e.g.
# NodeSource, which bundles npm) conflicts with Debian's npm package.
set -eu
cd "$(dirname "$0")/.."
SUDO=""
[ "$(id -u)" = 0 ] || SUDO=sudo
export DEBIAN_FRONTEND=noninteractive
pkgs="build-essential pkg-config xz-utils ca-certificates curl
      libpcre2-dev libcjson-dev libutf8proc-dev libmicrohttpd-dev nettle-dev clang libclang-rt-dev
      python3 python3-jinja2 python3-jsonschema python3-numpy chromium"
command -v node >/dev/null 2>&1 || pkgs="$pkgs nodejs"
command -v npm >/dev/null 2>&1 || pkgs="$pkgs npm"
log=$(mktemp)
if ! { $SUDO apt-get update -qq && $SUDO apt-get install -y -qq --no-install-recommends $pkgs; } >"$log" 2>&1; then
    cat "$log" >&2
    rm -f "$log"
    echo "pxq: installing the Debian packages failed (apt's output above)" >&2
    exit 1
fi
rm -f "$log"
if [ -f tests/server/package.json ]; then
    (cd tests/server && npm install --no-audit --no-fund --silent)
fi
echo "pxq: dependencies installed"
