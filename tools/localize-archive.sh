#!/bin/sh
# Makes OUTPUT, a static library of one object whose internal symbols are
# local: links the objects of ARCHIVE (thin or not) into one with the C
# compiler's ld -r, makes every hidden symbol (all but KILN_API) local, and
# archives that object. A program linking it statically then cannot clash
# with kiln's internal names.
#
#     localize-archive.sh OBJCOPY AR OUTPUT ARCHIVE CC...
set -eu
objcopy=$1 ar=$2 out=$3 in=$4
shift 4
obj=$out.o
"$@" -r -nostdlib -o "$obj" -Wl,--whole-archive "$in" -Wl,--no-whole-archive
"$objcopy" --localize-hidden "$obj"
rm -f "$out"
"$ar" rcs "$out" "$obj"
rm -f "$obj"
