/* What the files of src/device share: the driver's own allocation calls,
 * which only the allocator makes. */
#ifndef KILN_DEVICE_INTERNAL_H
#define KILN_DEVICE_INTERNAL_H

#include "device/device.h"

/* cuMemAlloc and cuMemFree; *out_of_memory tells a full device apart. */
int driver_alloc(void **p, size_t bytes, bool *out_of_memory, char *err, size_t err_size);
void driver_free(void *p);

#endif
