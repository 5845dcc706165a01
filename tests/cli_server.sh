#!/bin/sh
# pxq serve end to end, with node clients in tests/server/: the official openai SDK (sdk.js; tool
# calls and reasoning with the test-only fixed-output mode, tools.js; structured output, 100 seeded
# samples of five schemas that must all validate, forced tool calls, structured.js), 16
# concurrent greedy requests == 16 alone (equivalence.js), 64 streaming clients (load.js), 1,000
# hostile requests (abuse.js), SIGTERM with requests in flight (sigterm.js), the access log and the
# drain count (accesslog.js), speculative decoding == plain (spec.js) and the decided edges of
# seed, chat messages and stop (validation.js). Each script starts
# its own server on a free port and kills it at the end. Under AddressSanitizer:
#   make test-asan && BUILD=build-asan sh tests/cli_server.sh
set -u
BUILD=${BUILD:-build}
export BUILD
export LOAD_SECONDS=${LOAD_SECONDS:-10}
if ! command -v node >/dev/null 2>&1; then
    echo "SKIP tests/server: node not found"
    exit 0
fi
fail=0
for t in sdk tools structured validation equivalence prefix spec load abuse sigterm accesslog; do
    if { [ $t = sdk ] || [ $t = tools ] || [ $t = structured ]; } && [ ! -d tests/server/node_modules/openai ]; then
        echo "FAIL sdk.js: the openai package is missing (cd tests/server && npm install)"
        fail=1
        continue
    fi
    echo "-- tests/server/$t.js"
    if ! timeout 300 node tests/server/$t.js; then echo "FAIL tests/server/$t.js"; fail=1; fi
done
exit $fail
