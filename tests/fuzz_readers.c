/* libFuzzer's entry into the .npy, .safetensors and ONNX readers (tools/fuzz). */
#include <stdint.h>
#include <stdio.h>
#include <sys/mman.h>
#include <unistd.h>

#include <kiln/kiln.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static int fd = -1;
    static char path[64];
    if (fd < 0) { /* the readers take paths: one file in memory, rewritten */
        fd = memfd_create("kiln-fuzz-input", MFD_CLOEXEC);
        snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    }
    if (fd < 0 || ftruncate(fd, 0) < 0 || pwrite(fd, data, size, 0) != (ssize_t)size)
        return 0;
    kiln_release(kiln_load_npy(path));
    kiln_named_tensor *ts;
    int n = kiln_load_safetensors(path, NULL, 0, &ts);
    if (n >= 0)
        kiln_free_named_tensors(ts, n);
    kiln_fn_free(kiln_onnx_load(path, NULL));
    kiln_clear_error();
    return 0;
}
