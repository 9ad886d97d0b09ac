/* Thread-local error messages: the first failure of an expression stays readable. */
#include <stdarg.h>
#include <string.h>

#include "core/core.h"

static _Thread_local char message[1024];
static _Thread_local bool pending;
static _Thread_local core_status pending_status;

static const char *const status_texts[] = {
#define STATUS(name, text) text,
#include "core/status.def"
#undef STATUS
};

const char *core_status_text(core_status status)
{
    return (unsigned)status < sizeof status_texts / sizeof *status_texts ? status_texts[status] : "unknown status";
}

static _Thread_local int steps_depth; /* calls running their steps, see core_steps_begin */

int core_fail(core_status status, const char *fn, const char *fmt, ...)
{
    char text[sizeof message]; /* an argument may be the message itself (kiln_last_error()) */
    int used = snprintf(text, sizeof text, "%s: ", fn);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text + used, sizeof text - (size_t)used, fmt, ap);
    va_end(ap);
    memcpy(message, text, sizeof message);
    pending = true;
    pending_status = status;
    return -(int)status;
}

int core_fail_status(core_status status, const char *fn)
{
    return core_fail(status, fn, "%s", core_status_text(status));
}

int core_fail_null(const char *fn, const char *what)
{
    if (pending)
        return -(int)CORE_NULL_ARG;
    return core_fail(CORE_NULL_ARG, fn, "%s is NULL", what);
}

bool core_error_pending(void)
{
    return pending;
}

int core_error_status(void)
{
    return pending ? -(int)pending_status : -(int)CORE_STATE;
}

void core_succeeded(void)
{
    if (pending && steps_depth == 0)
        kiln_clear_error();
}

void core_steps_begin(void)
{
    steps_depth++;
}

void core_steps_end(void)
{
    steps_depth--;
}

int core_fail_null_arg(const char *fn, const char *what)
{
    return core_fail(CORE_NULL_ARG, fn, "%s is NULL", what);
}

char *core_shape_str(char buf[CORE_SHAPE_STR_MAX], int ndim, const int64_t *shape)
{
    char *p = buf;
    *p++ = '[';
    for (int i = 0; i < ndim; i++)
        p += sprintf(p, i ? ",%lld" : "%lld", (long long)shape[i]);
    *p++ = ']';
    *p = '\0';
    return buf;
}

const char *kiln_last_error(void)
{
    return message;
}

void kiln_clear_error(void)
{
    message[0] = '\0';
    pending = false;
}
