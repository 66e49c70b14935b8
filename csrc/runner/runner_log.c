/* runner_log.c — the runner's messages: a line to params.print when the client set one, else
 * stdout (progress) or stderr (warnings). Its own file so that the checkpoint code, which
 * warns, and runner.c, which calls the checkpoint code, do not call into each other. */
#include "runner/runner_internal.h"

#include <stdarg.h>
#include <stdio.h>

void rn_print(const om_runner *r, const char *fmt, ...) {
    char buf[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    if (r->p.print) r->p.print(r->p.print_user, OM_LOG_INFO, buf);
    else {
        fputs(buf, stdout);
        fputc('\n', stdout);
        fflush(stdout);
    }
}

void rn_warn(const om_runner *r, const char *fmt, ...) {
    char buf[4096];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    if (r->p.print) r->p.print(r->p.print_user, OM_LOG_WARNING, buf);
    else {
        fflush(stdout);
        fprintf(stderr, "ortmod-train: warning: %s\n", buf);
    }
}
