#!/usr/bin/env python3
"""The module graph of docs/architecture.md, checked over the sources.

Each file under src/ may include the headers of its own module and of the
modules its module may use (ALLOWED below, the same table as the document's).
On top of that: only src/codegen_llvm includes llvm-c/, only the CUDA modules
(src/device, src/codegen_nvrtc) name cuda.h or nvrtc.h, and src/eager
includes no cache or code-generator header. Prints each breach; exit 1 on any.
"""
import pathlib
import re
import sys

ALLOWED = {
    "core": set(),
    "ir": {"core"},
    "device": {"core"},
    "cache": {"core"},
    "codegen_llvm": {"ir", "core"},
    "codegen_nvrtc": {"ir", "device", "core"},
    "kernels": {"cache", "ir", "core"},
    "eager": {"kernels", "ir", "device", "core"},
    "trace": {"eager", "kernels", "ir", "core"},
    "onnx": {"trace", "eager", "kernels", "ir", "core"},
}
CUDA_MODULES = {"device", "codegen_nvrtc"}
INCLUDE = re.compile(r'^\s*#\s*include\s*[<"]([^>"]+)[>"]', re.M)


def breaches(src):
    for path in sorted(src.rglob("*.[ch]")):
        module = path.relative_to(src).parts[0]
        if module not in ALLOWED:
            yield f"{path}: module {module} is not in the table"
            continue
        for header in INCLUDE.findall(path.read_text(errors="replace")):
            top = header.split("/")[0]
            if header.startswith("llvm-c/") and module != "codegen_llvm":
                yield f"{path}: includes {header} (only src/codegen_llvm may)"
            elif pathlib.PurePath(header).name in ("cuda.h", "nvrtc.h", "cuda_runtime.h") and module not in CUDA_MODULES:
                yield f"{path}: includes {header} (only the CUDA modules may)"
            elif module == "eager" and top in ("cache", "codegen_llvm", "codegen_nvrtc"):
                yield f"{path}: src/eager includes {header}"
            elif top in ALLOWED and top != module and top not in ALLOWED[module]:
                yield f"{path}: {module} includes {header}, and may use only {', '.join(sorted(ALLOWED[module])) or 'nothing'}"


def main():
    root = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else pathlib.Path(__file__).parent.parent)
    found = list(breaches(root / "src"))
    for line in found:
        print(line)
    print(f"{len(found)} breaches of the module graph")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
