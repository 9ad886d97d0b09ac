/* Files kiln writes and reads: written whole under a fresh name and renamed
 * into place, never through a planted link; read only when they are regular
 * files, without blocking on a FIFO or a device. */
#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/random.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "core/core.h"

enum { NAME_ATTEMPTS = 16, TEMP_SUFFIX_MAX = 64 };

/* A name no one can guess ahead: a guessed one could only make O_EXCL fail,
 * but that would stop kiln writing. */
static uint64_t unpredictable(void)
{
    uint64_t r;
    if (getrandom(&r, sizeof r, GRND_NONBLOCK) == (ssize_t)sizeof r)
        return r;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_nsec * 0x9e3779b97f4a7c15u ^ (uint64_t)ts.tv_sec;
}

/* Creates "<path's directory>/.tmp-<pid>-<n>-<random>" exclusively, never
 * following a link: its descriptor, or -1 with errno. */
static int create_temp(const char *path, mode_t mode, char *temp, size_t size)
{
    static unsigned counter;
    const char *slash = strrchr(path, '/');
    int dir_len = slash ? (int)(slash - path + 1) : 0;
    for (int attempt = 0; attempt < NAME_ATTEMPTS; attempt++) {
        int len = snprintf(temp, size, "%.*s.tmp-%ld-%u-%016llx", dir_len, path, (long)getpid(),
                           __atomic_fetch_add(&counter, 1, __ATOMIC_RELAXED), (unsigned long long)unpredictable());
        if (len < 0 || (size_t)len >= size) {
            errno = ENAMETOOLONG;
            return -1;
        }
        int fd = open(temp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, mode);
        if (fd >= 0 || errno != EEXIST)
            return fd;
    }
    return -1;
}

static int write_all(int fd, const void *bytes, size_t size)
{
    for (size_t done = 0; done < size;) {
        ssize_t put = write(fd, (const char *)bytes + done, size - done);
        if (put < 0 && errno == EINTR)
            continue;
        if (put <= 0) {
            if (put == 0)
                errno = ENOSPC;
            return -1;
        }
        done += (size_t)put;
    }
    return 0;
}

/* Whether size bytes fit under the file size limit: writing past it raises
 * SIGXFSZ, which kills the host program unless it handles it. */
static bool fits_size_limit(size_t size)
{
    struct rlimit limit;
    return getrlimit(RLIMIT_FSIZE, &limit) < 0 || limit.rlim_cur == RLIM_INFINITY || (rlim_t)size <= limit.rlim_cur;
}

int core_write_file(const char *path, const void *bytes, size_t size, mode_t mode)
{
    return core_write_parts(path, 1, &bytes, &size, mode);
}

int core_write_parts(const char *path, int n, const void *const *parts, const size_t *sizes, mode_t mode)
{
    size_t size = 0;
    for (int i = 0; i < n; i++)
        size += sizes[i];
    if (!fits_size_limit(size)) {
        errno = EFBIG;
        return -1;
    }
    size_t temp_size = strlen(path) + TEMP_SUFFIX_MAX;
    char *temp = malloc(temp_size);
    if (!temp) {
        errno = ENOMEM;
        return -1;
    }
    int fd = create_temp(path, mode, temp, temp_size);
    int status = fd < 0 ? -1 : 0;
    for (int i = 0; status == 0 && i < n; i++)
        status = write_all(fd, parts[i], sizes[i]);
    int saved = errno;
    if (fd >= 0 && close(fd) < 0 && status == 0) {
        status = -1;
        saved = errno;
    }
    if (status == 0 && rename(temp, path) < 0) {
        status = -1;
        saved = errno;
    }
    if (status < 0 && fd >= 0)
        unlink(temp);
    free(temp);
    errno = saved;
    return status;
}

int core_open_regular(const char *path, struct stat *st)
{
    st->st_mode = 0;
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    if (fstat(fd, st) < 0) {
        int saved = errno;
        st->st_mode = 0;
        close(fd);
        errno = saved;
        return -1;
    }
    if (!S_ISREG(st->st_mode)) {
        close(fd);
        errno = EINVAL;
        return -1;
    }
    return fd;
}

const char *core_file_kind(mode_t mode)
{
    return S_ISREG(mode)    ? "a regular file"
           : S_ISDIR(mode)  ? "a directory"
           : S_ISFIFO(mode) ? "a FIFO"
           : S_ISSOCK(mode) ? "a socket"
           : S_ISCHR(mode)  ? "a character device"
           : S_ISBLK(mode)  ? "a block device"
           : S_ISLNK(mode)  ? "a symbolic link"
                            : "not a regular file";
}

ssize_t core_pread_full(int fd, void *buf, size_t size, off_t at)
{
    size_t done = 0;
    while (done < size) {
        ssize_t got = pread(fd, (char *)buf + done, size - done, at + (off_t)done);
        if (got < 0 && errno == EINTR)
            continue;
        if (got < 0)
            return -1;
        if (got == 0)
            break;
        done += (size_t)got;
    }
    return (ssize_t)done;
}
