/* kiln_onnx_load and kiln_onnx_export in a build without protobuf-c: they
 * say so. */
#include "core/core.h"

static const char *const why = "this kiln was built without ONNX support (meson -Donnx needs protobuf-c and "
                               "onnx.proto: Debian libprotobuf-c-dev, protobuf-c-compiler, libonnx-dev)";

kiln_fn *kiln_onnx_load(const char *path, const kiln_jit_options *opts)
{
    (void)path;
    (void)opts;
    core_fail(CORE_UNSUPPORTED, "kiln_onnx_load", "%s", why);
    return NULL;
}

int kiln_onnx_export(kiln_fn *f, const kiln_spec *in, const char *path)
{
    (void)f;
    (void)in;
    (void)path;
    return core_fail(CORE_UNSUPPORTED, "kiln_onnx_export", "%s", why);
}
