#!/usr/bin/env bash
# Checks the arrows inside the server crate point one way: the modules the shared state
# holds (the parts) never import the state or what reads it (handlers, middleware, workers,
# the server's assembly). Exits non-zero, naming the line, when one does.
set -euo pipefail
cd "$(dirname "$0")/../crates/server/src"

readers='state|routes|middleware|workers|serve|openapi|openapi_extra'
parts=$(ls -d */ *.rs | sed 's|/$||; s|\.rs$||' | grep -Ev "^(lib|${readers})$")

status=0
for part in $parts; do
    files=$( { ls "$part".rs 2>/dev/null; find "$part" -name '*.rs' 2>/dev/null; } || true)
    for f in $files; do
        if grep -nE "crate::(${readers})\b|\bAppState\b" "$f" | grep -vE '^\s*[0-9]+:\s*//'; then
            echo "layering: $f (a part the state holds) imports what reads the state" >&2
            status=1
        fi
    done
done
[ "$status" -eq 0 ] && echo "layering: ok (parts: $(echo $parts | tr '\n' ' '))"
exit "$status"
