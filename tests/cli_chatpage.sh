#!/bin/sh
# The chat page of pxq serve (GET /) in headless Chromium: tests/server/chatpage.js, driven over the
# DevTools protocol (tests/server/cdp.js). Prints SKIP without Node.js or Chromium, unless
# PXQ_TEST_REQUIRE_CHROMIUM=1 (.ci/run sets it: tools/install-deps.sh installs Debian's chromium).
set -u
BUILD=${BUILD:-build}
export BUILD
if ! command -v node >/dev/null 2>&1; then
    echo "SKIP tests/server/chatpage.js: node not found"
    [ "${PXQ_TEST_REQUIRE_CHROMIUM:-0}" = 1 ] && exit 1
    exit 0
fi
timeout 120 node tests/server/chatpage.js
