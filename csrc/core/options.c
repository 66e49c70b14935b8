/* options.c — the engine's configuration (ortmod_options.h): the one file of the engine that
 * reads the environment.
 *
 * Fields are parsed by one function per field that serves both the environment (the error
 * names the variable) and om_options_set (it names the field), so that the two accept the same
 * values. The options live behind one mutex: readers copy them out, so a value never changes
 * under a running compile. Validating pass names needs the pass list (passes/pass.h); that is
 * the one dependency of core/ on a later layer, the price of checking a name when it is set
 * rather than when a compile happens to look for it.
 */
#include "core/options.h"

#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "core/core.h"
#include "passes/pass.h"

#define MAX_CACHED_PLANS (1 << 20)
#define MAX_THREADS_OPTION 1024

/* Who follows num_threads (the thread pool registers itself: core/threadpool.c), told after the
 * options' lock is released. A hook rather than a call, so that the options do not include the
 * pool that reads them. */
static _Atomic(om_options_watcher) threads_watcher;

void om_options_watch_num_threads(om_options_watcher fn) { atomic_store(&threads_watcher, fn); }

static void num_threads_changed(void) {
    om_options_watcher fn = atomic_load(&threads_watcher);
    if (fn) fn();
}

enum { N_FIELDS = 8 };

typedef struct field_info {
    unsigned bit;
    const char *field;      /* the struct member, named in om_options_set's errors */
    const char *variable;   /* the environment variable, named in its errors */
} field_info;

/* Order: the bits' order. tests/test_options.py reads the variable names from here. */
static const field_info FIELDS[N_FIELDS] = {
    {OM_OPT_MAX_CACHED_PLANS, "max_cached_plans", "ORTMOD_MAX_CACHED_PLANS"},
    {OM_OPT_MEMORY_OPT_LEVEL, "memory_opt_level", "ORTMODULE_MEMORY_OPT_LEVEL"},
    {OM_OPT_PROFILE, "profile", "ORTMOD_PROFILE"},
    {OM_OPT_DISABLE_PASSES, "disable_passes", "ORTMOD_DISABLE_PASSES"},
    {OM_OPT_OPTIM_NUM_THREADS, "optim_num_threads", "ORTMOD_NUM_THREADS"},
    {OM_OPT_NUM_THREADS, "num_threads", "OMP_NUM_THREADS"},
    {OM_OPT_CUDA_LIBRARY, "cuda_library", "ORTMOD_CUDA_LIBRARY"},
    {OM_OPT_CUDA_ATTENTION, "cuda_attention", "ORTMOD_CUDA_ATTENTION"},
};

static pthread_once_t once = PTHREAD_ONCE_INIT;
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static om_options current;
static char env_error[N_FIELDS][512];   /* per field: why the environment's value was refused, or "" */
static bool cuda_loaded;

om_options om_options_defaults(void) {
    om_options o;
    memset(&o, 0, sizeof o);
    o.max_cached_plans = 32;
    o.memory_opt_level = 0;
    o.profile = false;
    o.cuda_attention = OM_CUDA_ATTENTION_FLASH;
    return o;
}

/* ---- checks shared by the environment and om_options_set ------------------------------- */

static om_status *check_int(const char *who, long v, long lo, long hi, const char *what) {
    if (v < lo || v > hi) return om_error(OM_INVALID_ARGUMENT, "%s: %ld is not %s in %ld..%ld", who, v, what, lo, hi);
    return NULL;
}

static om_status *check_memory_opt_level(const char *who, long v) {
    if (v < 0 || v > 2) return om_error(OM_INVALID_ARGUMENT, "%s: memory optimization level %ld is not 0, 1 or 2", who, v);
    return NULL;
}

static om_status *check_disable_passes(const char *who, const char *text, size_t cap) {
    if (!memchr(text, '\0', cap))
        return om_error(OM_INVALID_ARGUMENT, "%s: longer than %zu characters", who, cap - 1);
    for (const char *p = text; *p;) {
        while (*p == ',' || *p == ' ') p++;
        const char *e = p;
        while (*e && *e != ',' && *e != ' ') e++;
        size_t len = (size_t)(e - p);
        if (len && !(len == 3 && strncmp(p, "all", 3) == 0) && !om_pass_known(p, len)) {
            char names[1024];
            om_pass_list(names, sizeof names);
            return om_error(OM_INVALID_ARGUMENT, "%s: unknown pass '%.*s' (the passes: %s; or all)", who, (int)len, p,
                            names);
        }
        p = e;
    }
    return NULL;
}

static om_status *check_path(const char *who, const char *text, size_t cap) {
    if (!memchr(text, '\0', cap)) return om_error(OM_INVALID_ARGUMENT, "%s: longer than %zu characters", who, cap - 1);
    return NULL;
}

/* ---- the environment ------------------------------------------------------------------- */

/* A whole number with nothing else but surrounding spaces; 0 when text is not one. */
static int parse_long(const char *text, long *out) {
    while (*text == ' ') text++;
    if (!*text) return 0;
    errno = 0;
    char *end = NULL;
    long v = strtol(text, &end, 10);
    while (*end == ' ') end++;
    if (errno || *end) return 0;
    *out = v;
    return 1;
}

static int is_word(const char *text, const char *const *words) {
    while (*text == ' ') text++;
    size_t n = strlen(text);
    while (n && text[n - 1] == ' ') n--;
    for (int i = 0; words[i]; i++)
        if (strlen(words[i]) == n && strncasecmp(text, words[i], n) == 0) return 1;
    return 0;
}

static om_status *bad_value(const char *var, const char *text, const char *expected) {
    return om_error(OM_INVALID_ARGUMENT, "%s: '%s' is not %s", var, text, expected);
}

/* Parses the variable of field i into *o; an error names the variable (o keeps the default). */
static om_status *read_variable(int i, om_options *o) {
    const char *var = FIELDS[i].variable;
    const char *text = getenv(var);
    if (!text || !*text) return NULL;
    long v = 0;
    switch (FIELDS[i].bit) {
    case OM_OPT_MAX_CACHED_PLANS:
        if (!parse_long(text, &v) || v < 1 || v > MAX_CACHED_PLANS)
            return om_error(OM_INVALID_ARGUMENT, "%s: '%s' is not a number of plans in 1..%d", var, text, MAX_CACHED_PLANS);
        o->max_cached_plans = (int)v;
        return NULL;
    case OM_OPT_MEMORY_OPT_LEVEL:
        if (!parse_long(text, &v)) return bad_value(var, text, "a memory optimization level (0, 1 or 2)");
        OM_TRY(check_memory_opt_level(var, v));
        o->memory_opt_level = (int)v;
        return NULL;
    case OM_OPT_PROFILE: {
        static const char *const on[] = {"1", "true", "yes", "on", NULL}, *const off[] = {"0", "false", "no", "off", NULL};
        if (is_word(text, on)) o->profile = true;
        else if (!is_word(text, off)) return bad_value(var, text, "on or off (1/true/yes/on, 0/false/no/off)");
        return NULL;
    }
    case OM_OPT_DISABLE_PASSES:
        if (strlen(text) >= sizeof o->disable_passes)
            return om_error(OM_INVALID_ARGUMENT, "%s: longer than %zu characters", var, sizeof o->disable_passes - 1);
        OM_TRY(check_disable_passes(var, text, strlen(text) + 1));
        snprintf(o->disable_passes, sizeof o->disable_passes, "%s", text);
        return NULL;
    case OM_OPT_OPTIM_NUM_THREADS:
        if (!parse_long(text, &v) || v < 0 || v > MAX_THREADS_OPTION)
            return om_error(OM_INVALID_ARGUMENT, "%s: '%s' is not a number of threads in 0..%d (0: no cap)", var, text,
                            MAX_THREADS_OPTION);
        o->optim_num_threads = (int)v;
        return NULL;
    case OM_OPT_NUM_THREADS:
        /* OpenMP's variable, read as libgomp reads its first level ("4" or "4,2"); a value it
         * would warn about and ignore is ignored here too, since torch accepted it. */
        v = atol(text);
        if (v > 0) o->num_threads = v < MAX_THREADS_OPTION ? (int)v : MAX_THREADS_OPTION;
        return NULL;
    case OM_OPT_CUDA_LIBRARY:
        if (strlen(text) >= sizeof o->cuda_library)
            return om_error(OM_INVALID_ARGUMENT, "%s: longer than %zu characters", var, sizeof o->cuda_library - 1);
        snprintf(o->cuda_library, sizeof o->cuda_library, "%s", text);
        return NULL;
    case OM_OPT_CUDA_ATTENTION: {
        static const char *const flash[] = {"flash", NULL}, *const mat[] = {"materialized", NULL};
        if (is_word(text, mat)) o->cuda_attention = OM_CUDA_ATTENTION_MATERIALIZED;
        else if (!is_word(text, flash)) return bad_value(var, text, "flash or materialized");
        return NULL;
    }
    }
    return NULL;
}

/* Called with mu held. */
static void read_environment(void) {
    om_options o = om_options_defaults();
    for (int i = 0; i < N_FIELDS; i++) {
        om_status *st = read_variable(i, &o);
        env_error[i][0] = '\0';
        if (st) {
            snprintf(env_error[i], sizeof env_error[i], "%s", om_status_message(st));
            om_status_free(st);
        }
    }
    current = o;
}

static void lock(void) { pthread_mutex_lock(&mu); }
static void unlock(void) { pthread_mutex_unlock(&mu); }

static void first_read(void) {
    /* a fork while another thread copies the options must not leave the child's lock held */
    pthread_atfork(lock, unlock, unlock);
    lock();
    read_environment();
    unlock();
}

/* Called with mu held: the environment's errors still standing for fields, or NULL. */
static om_status *standing_errors(unsigned fields) {
    char msg[N_FIELDS * 520];
    size_t used = 0;
    msg[0] = '\0';
    for (int i = 0; i < N_FIELDS; i++) {
        if (!(fields & FIELDS[i].bit) || !env_error[i][0]) continue;
        used += (size_t)snprintf(msg + used, sizeof msg - used, "%s%s", used ? "; " : "", env_error[i]);
        if (used >= sizeof msg) break;
    }
    return used ? om_error(OM_INVALID_ARGUMENT, "%s", msg) : NULL;
}

om_status *om_options_get(om_options *out) {
    pthread_once(&once, first_read);
    lock();
    *out = current;
    om_status *st = standing_errors(OM_OPT_ALL);
    unlock();
    return st;
}

om_status *om_options_check(unsigned fields) {
    pthread_once(&once, first_read);
    lock();
    om_status *st = standing_errors(fields);
    unlock();
    return st;
}

om_status *om_options_set(const om_options *opt, unsigned fields) {
    if (fields & ~(unsigned)OM_OPT_ALL)
        return om_error(OM_INVALID_ARGUMENT, "om_options_set: unknown field bits 0x%x", fields & ~(unsigned)OM_OPT_ALL);
    if (fields & OM_OPT_MAX_CACHED_PLANS)
        OM_TRY(check_int("max_cached_plans", opt->max_cached_plans, 1, MAX_CACHED_PLANS, "a number of plans"));
    if (fields & OM_OPT_MEMORY_OPT_LEVEL) OM_TRY(check_memory_opt_level("memory_opt_level", opt->memory_opt_level));
    if (fields & OM_OPT_DISABLE_PASSES)
        OM_TRY(check_disable_passes("disable_passes", opt->disable_passes, sizeof opt->disable_passes));
    if (fields & OM_OPT_OPTIM_NUM_THREADS)
        OM_TRY(check_int("optim_num_threads", opt->optim_num_threads, 0, MAX_THREADS_OPTION, "a number of threads"));
    if (fields & OM_OPT_NUM_THREADS)
        OM_TRY(check_int("num_threads", opt->num_threads, 0, MAX_THREADS_OPTION, "a number of threads"));
    if (fields & OM_OPT_CUDA_LIBRARY) OM_TRY(check_path("cuda_library", opt->cuda_library, sizeof opt->cuda_library));
    if ((fields & OM_OPT_CUDA_ATTENTION) && opt->cuda_attention != OM_CUDA_ATTENTION_FLASH &&
        opt->cuda_attention != OM_CUDA_ATTENTION_MATERIALIZED)
        return om_error(OM_INVALID_ARGUMENT, "cuda_attention: %d is not OM_CUDA_ATTENTION_FLASH or _MATERIALIZED",
                        (int)opt->cuda_attention);
    pthread_once(&once, first_read);
    lock();
    if ((fields & OM_OPT_CUDA_LIBRARY) && cuda_loaded && strcmp(opt->cuda_library, current.cuda_library) != 0) {
        om_status *st = om_error(OM_INVALID_ARGUMENT,
                                 "cuda_library: the CUDA provider was already loaded (from '%s'); it is loaded once "
                                 "per process, so set the library before the first CUDA tensor",
                                 current.cuda_library[0] ? current.cuda_library : "libortmod_cuda.so next to the engine");
        unlock();
        return st;
    }
    const int threads_before = current.num_threads;
    for (int i = 0; i < N_FIELDS; i++) {
        if (!(fields & FIELDS[i].bit)) continue;
        env_error[i][0] = '\0';
        switch (FIELDS[i].bit) {
        case OM_OPT_MAX_CACHED_PLANS: current.max_cached_plans = opt->max_cached_plans; break;
        case OM_OPT_MEMORY_OPT_LEVEL: current.memory_opt_level = opt->memory_opt_level; break;
        case OM_OPT_PROFILE: current.profile = opt->profile; break;
        case OM_OPT_DISABLE_PASSES: memcpy(current.disable_passes, opt->disable_passes, sizeof current.disable_passes); break;
        case OM_OPT_OPTIM_NUM_THREADS: current.optim_num_threads = opt->optim_num_threads; break;
        case OM_OPT_NUM_THREADS: current.num_threads = opt->num_threads; break;
        case OM_OPT_CUDA_LIBRARY: memcpy(current.cuda_library, opt->cuda_library, sizeof current.cuda_library); break;
        case OM_OPT_CUDA_ATTENTION: current.cuda_attention = opt->cuda_attention; break;
        }
    }
    const int threads_after = current.num_threads;
    unlock();
    if (threads_after != threads_before) num_threads_changed();
    return NULL;
}

om_status *om_options_reload(void) {
    pthread_once(&once, first_read);
    lock();
    const int threads_before = current.num_threads;
    char library[sizeof current.cuda_library];
    memcpy(library, current.cuda_library, sizeof library);
    read_environment();
    if (cuda_loaded) memcpy(current.cuda_library, library, sizeof library);   /* what was loaded stays true */
    const int threads_after = current.num_threads;
    om_status *st = standing_errors(OM_OPT_ALL);
    unlock();
    if (threads_after != threads_before) num_threads_changed();
    return st;
}

void om_options_note_cuda_loaded(void) {
    pthread_once(&once, first_read);
    lock();
    cuda_loaded = true;
    unlock();
}

int om_options_num_threads(void) {
    om_options o;
    om_status *st = om_options_get(&o);   /* a bad variable is reported by om_engine_create */
    om_status_free(st);
    return o.num_threads;
}

int om_options_optim_num_threads(void) {
    om_options o;
    om_status_free(om_options_get(&o));
    return o.optim_num_threads;
}

void om_options_set_optim_num_threads(int n) {
    om_options o = om_options_defaults();
    o.optim_num_threads = n < 0 ? 0 : n > MAX_THREADS_OPTION ? MAX_THREADS_OPTION : n;
    om_status_free(om_options_set(&o, OM_OPT_OPTIM_NUM_THREADS));   /* in range: cannot fail */
}

int om_options_cuda_attention_materialized(void) {
    om_options o;
    om_status_free(om_options_get(&o));
    return o.cuda_attention == OM_CUDA_ATTENTION_MATERIALIZED;
}
