#!/usr/bin/env python3
"""Writes a C header defining MACRO as the first 16 hex digits of a SHA-256
over the given source files, so that a code generator's version changes
whenever the sources that decide its code do (a cache key component).

    source-hash.py OUTPUT MACRO FILE...
"""
import hashlib
import sys

output, macro, files = sys.argv[1], sys.argv[2], sys.argv[3:]
digest = hashlib.sha256()
for path in files:
    with open(path, "rb") as f:
        digest.update(f.read())
with open(output, "w") as out:
    out.write('#define %s "%s"\n' % (macro, digest.hexdigest()[:16]))
