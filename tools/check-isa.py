#!/usr/bin/env python3
"""Checks that libkiln runs on any x86-64 outside the kernels chosen at run time.

    check-isa.py LIBRARY LINK_MAP

objdump disassembles LIBRARY; the linker's map (ld -Map) says which object
each piece of code came from. Code compiled for a higher level
(libkiln_eager_v3.a.p/..., libkiln_eager_v3z.a.p/..., src/eager/isa.h) may use that level; all other code
must stay within x86-64-v2. The check also requires each level's kernels to
use their level, so a build that lost its -march flags fails too.
Exit status 0, or 1 with the offending instructions listed.
"""
import collections
import re
import subprocess
import sys

ALLOWED = 2  # x86-64-v2: SSE3, SSSE3, SSE4.1, SSE4.2, POPCNT

BMI = {"andn", "bextr", "blsi", "blsmsk", "blsr", "bzhi", "mulx", "pdep", "pext",
       "rorx", "sarx", "shlx", "shrx", "lzcnt", "movbe"}
V2 = {"popcnt", "crc32", "lddqu", "haddps", "haddpd", "hsubps", "hsubpd", "addsubps",
      "addsubpd", "movddup", "movshdup", "movsldup", "fisttp", "pshufb", "palignr",
      "pabsb", "pabsw", "pabsd", "phaddw", "phaddd", "phaddsw", "phsubw", "phsubd",
      "phsubsw", "pmaddubsw", "pmulhrsw", "psignb", "psignw", "psignd"}
V2_PREFIXES = ("pcmpestr", "pcmpistr", "pcmpgtq", "blendp", "blendvp", "pblend", "dpp",
               "extractps", "insertps", "pextr", "pinsr", "pmaxs", "pmaxu", "pmins", "pminu",
               "pmovsx", "pmovzx", "pmuldq", "pmulld", "ptest", "round", "packusdw",
               "pcmpeqq", "movntdqa", "mpsadbw", "phminposuw")
# Instructions some CPUs lack that still run everywhere: xgetbv only after
# CPUID says the OS has XSAVE on (CPU detection); tzcnt is "rep bsf", which
# older CPUs run as bsf, and compilers emit it only where the two agree.
EVERYWHERE = {"xgetbv", "tzcnt"}
PREFIXES = {"rep", "repz", "repe", "repnz", "repne", "lock", "bnd", "notrack", "data16",
            "addr32", "cs", "ds", "es", "fs", "gs", "ss"}


def level_of(mnemonic, operands):
    """The lowest x86-64 level that has this instruction."""
    if mnemonic in EVERYWHERE:
        return 1
    if "%zmm" in operands or re.search(r"%k[0-7]", operands) or mnemonic.startswith("k"):
        return 4
    if mnemonic.startswith("v") and mnemonic not in ("verr", "verw"):
        return 4 if "{" in operands else 3
    if "%ymm" in operands or mnemonic in BMI:
        return 3
    if mnemonic in V2 or mnemonic.startswith(V2_PREFIXES):
        return 2
    return 1


def selected_ranges(map_path):
    """[(start, end, level)] of code from the objects compiled per level."""
    ranges, pending = [], None
    entry = re.compile(r"^\s+0x([0-9a-f]+)\s+0x([0-9a-f]+)\s+(\S+)$")
    for line in open(map_path):
        # " .text  0xADDR 0xSIZE object", or a long name alone and the rest below
        name = re.match(r"^ (\.text\S*)(.*)$", line)
        if name and not name.group(2).strip():
            pending = name.group(1)
            continue
        if not name and not pending:
            continue
        pending = None
        m = entry.match(name.group(2) if name else line)
        if not m:
            continue
        level = re.search(r"_v([234])z?\.a\.p/", m.group(3))
        start, size = int(m.group(1), 16), int(m.group(2), 16)
        if level and size:
            ranges.append((start, start + size, int(level.group(1))))
    return ranges


def main():
    library, map_path = sys.argv[1:3]
    ranges = selected_ranges(map_path)
    if not ranges:
        print(f"check-isa: {map_path} names no code compiled per level")
        return 1
    disassembly = subprocess.run(["objdump", "-d", "--no-show-raw-insn", library],
                                 check=True, capture_output=True, text=True).stdout
    function, bad = "?", []
    seen = collections.Counter()  # (selected level or 0, instruction level)
    line_re = re.compile(r"^\s*([0-9a-f]+):\s+(\S.*)$")
    for line in disassembly.splitlines():
        head = re.match(r"^[0-9a-f]+ <(.+)>:$", line)
        if head:
            function = head.group(1)
            continue
        m = line_re.match(line)
        if not m:
            continue
        address, words = int(m.group(1), 16), m.group(2).split(None, 1)
        while len(words) > 1 and words[0] in PREFIXES:
            words = words[1].split(None, 1)
        mnemonic, operands = words[0], words[1] if len(words) > 1 else ""
        level = level_of(mnemonic, operands)
        home = next((r[2] for r in ranges if r[0] <= address < r[1]), 0)
        seen[home, level] += 1
        if level > max(home, ALLOWED):
            bad.append(f"  {address:#x} <{function}>: {mnemonic} {operands}")
    for home in (2, 3, 4):
        if not any(seen[home, level] for level in range(home, 5)):
            bad.append(f"  the x86-64-v{home} kernels use no instruction of their level")
    print(f"check-isa: {library}: instructions by level, outside and inside the run-time-selected kernels:")
    for home in (0, 2, 3, 4):
        where = "elsewhere" if home == 0 else f"x86-64-v{home} kernels"
        counts = ", ".join(f"v{level} {seen[home, level]}" for level in (1, 2, 3, 4))
        print(f"  {where:18} {counts}")
    if bad:
        print(f"check-isa: {len(bad)} problems (at most x86-64-v{ALLOWED} outside the kernels):")
        print("\n".join(bad[:50]))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
