/* runner_log.c — the runner's messages: a line to params.print when the client set one, else
 * stdout (progress) or stderr (warnings). Its own file so that the checkpoint code, which
 * warns, and runner.c, which calls the checkpoint code, do not call into each other. */
#include "runner/runner_internal.h"

#include <stdarg.h>
#include <stdio.h>

/* One message at `level`: to the client's print callback, else progress to stdout and
 * warnings to stderr (stdout flushed first, so the two streams interleave in order). */
static void rn_message(const om_runner *r, int level, const char *fmt, va_list ap) {
    char buf[4096];
    vsnprintf(buf, sizeof buf, fmt, ap);
    if (r->p.print) r->p.print(r->p.print_user, level, buf);
    else if (level == OM_LOG_INFO) {
        fputs(buf, stdout);
        fputc('\n', stdout);
        fflush(stdout);
    } else {
        fflush(stdout);
        fprintf(stderr, "ortmod-train: warning: %s\n", buf);
    }
}

void rn_print(const om_runner *r, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    rn_message(r, OM_LOG_INFO, fmt, ap);
    va_end(ap);
}

void rn_warn(const om_runner *r, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    rn_message(r, OM_LOG_WARNING, fmt, ap);
    va_end(ap);
}
