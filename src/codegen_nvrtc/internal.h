/* What the files of src/codegen_nvrtc share. */
#ifndef KILN_CODEGEN_NVRTC_INTERNAL_H
#define KILN_CODEGEN_NVRTC_INTERNAL_H

#include "codegen_nvrtc/nvrtc.h"

enum { NVRTC_BLOCK = 256 }; /* threads per block, a multiple of the warp */

/* k as a CUDA C translation unit whose kernel is the extern "C" name,
 * malloc'd; NULL with the reason in err. */
char *nvrtc_source(const kx_kernel *k, const char *name, char *err, size_t err_size);

#endif
