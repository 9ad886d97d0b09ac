/* The CUDA runtime: the driver (opened with dlopen), device 0 through its
 * primary context and one stream, device memory through a caching allocator,
 * copies, loaded kernels and launches. What eager and the code generators'
 * launchers may use of src/device; only this module calls the driver.
 *
 * Every launch and copy goes into the one stream in call order. Device memory
 * is a void * holding the device address. Each call returns 0, or -1 with
 * the driver's reason in err; each starts the driver on first use. */
#ifndef KILN_DEVICE_H
#define KILN_DEVICE_H

#include <stdbool.h>
#include <stddef.h>

#include <kiln/kiln.h>

/* Starts the driver and device 0 (once), and makes its context current on
 * this thread. -1 with "no CUDA driver: ..." or "no CUDA device: ..." in err. */
int device_start(char *err, size_t err_size);
/* The started device's "sm_XX", name and multiprocessor count. */
const char *device_arch(void);
const char *device_name(void);
int device_multiprocessors(void);

/* Copies to the device return once src may be reused; copies to the host
 * once dst holds the data (after all work queued before). */
int device_upload(void *dst, const void *src, size_t bytes, char *err, size_t err_size);
int device_download(void *dst, const void *src, size_t bytes, char *err, size_t err_size);
int device_copy(void *dst, const void *src, size_t bytes, char *err, size_t err_size);
int device_memset(void *dst, int byte, size_t bytes, char *err, size_t err_size);
/* Waits for all queued work; reports an error a kernel raised. */
int device_synchronize(char *err, size_t err_size);

/* A loaded kernel: the function symbol of the first of n images (CUBIN,
 * PTX, ...) that the device runs; the driver's reason for the last one when
 * none does. */
typedef struct device_module device_module;
device_module *device_load(const void *const *images, int n, const char *symbol, char *err, size_t err_size);
void device_unload(device_module *m);
/* Blocks to launch for work of n blocks that a kernel strides over
 * (grid-stride loops): n, but at most 32 a multiprocessor, enough to fill
 * the device and balance it; at least 1. */
unsigned device_grid(int64_t n);
/* Queues m on grid (x, y, z) of block threads; params as cuLaunchKernel's. */
int device_launch(const device_module *m, const unsigned grid[3], unsigned block, void **params, char *err,
                  size_t err_size);
/* device_launch of a kernel that may set n_words 64-bit flag words (its bad
 * indices): params[slot] points at them, zeroed, for the launch (NULL
 * after); they are read back into words. */
int device_launch_flagged(const device_module *m, const unsigned grid[3], unsigned block, void **params, int slot,
                          int64_t *words, int n_words, char *err, size_t err_size);

/* -- Memory (allocator.c): a caching allocator ------------------------------- */

/* At least bytes of device memory; *granted is the block's size, to pass
 * back to device_free. NULL with the reason in err. */
void *device_alloc(size_t bytes, size_t *granted, char *err, size_t err_size);
void device_free(void *at, size_t granted);
/* Returns every cached block to the driver. */
void device_empty_cache(void);
kiln_cuda_memory device_memory(void);

#endif
