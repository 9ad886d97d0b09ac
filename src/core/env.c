/* Environment options read by every module. */
#include <errno.h>

#include "core/core.h"

int64_t core_env_int(const char *name, int64_t fallback)
{
    const char *text = getenv(name);
    if (!text || !*text)
        return fallback;
    char *end;
    errno = 0;
    long long value = strtoll(text, &end, 10);
    if (errno || *end)
        return fallback;
    return value;
}
