#!/bin/sh
# Writes a C header defining MACRO as the first 16 hex digits of a SHA-256
# over the given source files, so that a code generator's version changes
# whenever the sources that decide its code do (a cache key component).
#
#     source-hash.sh OUTPUT MACRO FILE...
set -eu
output=$1 macro=$2
shift 2
if command -v sha256sum >/dev/null 2>&1; then
    digest=$(cat "$@" | sha256sum)
else
    digest=$(cat "$@" | shasum -a 256)
fi
printf '#define %s "%s"\n' "$macro" "$(printf '%s' "$digest" | cut -c1-16)" >"$output"
