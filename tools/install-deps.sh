#!/bin/sh
# Install what PXQ's build and tests need on Debian 12: the compiler, the libraries PXQ builds on
# (PCRE2, cJSON, utf8proc, libmicrohttpd), clang for the fuzzers, and Node.js + the npm packages of
# the server tests. Uses sudo when not run as root.
set -eu
cd "$(dirname "$0")/.."
SUDO=""
[ "$(id -u)" = 0 ] || SUDO=sudo
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends \
    build-essential pkg-config xz-utils ca-certificates curl \
    libpcre2-dev libcjson-dev libutf8proc-dev libmicrohttpd-dev nettle-dev \
    clang libclang-rt-dev nodejs npm >/dev/null
if [ -f tests/server/package.json ]; then
    (cd tests/server && npm install --no-audit --no-fund --silent)
fi
echo "pxq: dependencies installed"
