/* File checks that fail with a function's error. Apart from file.c, which
 * uses no error state: a program that links file.c alone (kiln-cache's
 * store, tests beside libkiln) then takes no copy of error.c, whose
 * kiln_last_error would interpose on libkiln's and read another message. */
#include <errno.h>
#include <string.h>
#include <sys/stat.h>

#include "core/core.h"

int core_check_writable(const char *fn, const char *path)
{
    struct stat st;
    if (lstat(path, &st) < 0 || S_ISREG(st.st_mode) || S_ISLNK(st.st_mode))
        return 0;
    core_fail(CORE_IO, fn, "'%s' is %s, not a file kiln may write over", path, core_file_kind(st.st_mode));
    return -1;
}

int core_open_regular_for(const char *fn, const char *path, struct stat *st)
{
    int fd = core_open_regular(path, st);
    if (fd >= 0)
        return fd;
    if (st->st_mode)
        core_fail(CORE_IO, fn, "'%s' is %s, not a regular file", path, core_file_kind(st->st_mode));
    else
        core_fail(CORE_IO, fn, "cannot open '%s': %s", path, strerror(errno));
    return -1;
}
