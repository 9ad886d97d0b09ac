/* kiln_version: the version this library was built as. */
#include "core/core.h"

const char *kiln_version(void)
{
    return KILN_VERSION_STRING;
}
