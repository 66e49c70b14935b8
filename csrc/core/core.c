/* core.c — status objects, aligned memory, dtype facts, small utilities. */
#include "core/core.h"
#include "core/half.h"

#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#if defined(__linux__)
#include <sys/mman.h>
#include <unistd.h>
#endif

struct om_status {
    om_code code;
    char *msg;
};

static char *vformat(const char *fmt, va_list ap) {
    va_list ap2;
    va_copy(ap2, ap);
    int n = vsnprintf(NULL, 0, fmt, ap2);
    va_end(ap2);
    if (n < 0) n = 0;
    char *s = malloc((size_t)n + 1);
    if (s) vsnprintf(s, (size_t)n + 1, fmt, ap);
    return s;
}

/* Out of memory while reporting an error must still report something. */
static om_status oom_status = {OM_OUT_OF_MEMORY, "out of memory"};

/* om_error and om_status_newf: one constructor under the engine's name and the public one */
static om_status *status_vnew(om_code code, const char *fmt, va_list ap) {
    om_status *st = malloc(sizeof(*st));
    if (!st) return &oom_status;
    st->code = code;
    st->msg = vformat(fmt, ap);
    if (!st->msg) { free(st); return &oom_status; }
    return st;
}

om_status *om_error(om_code code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    om_status *st = status_vnew(code, fmt, ap);
    va_end(ap);
    return st;
}

om_status *om_status_newf(om_code code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    om_status *st = status_vnew(code, fmt, ap);
    va_end(ap);
    return st;
}

om_status *om_status_new(om_code code, const char *message) {
    return om_status_newf(code, "%s", message ? message : "");
}

om_status *om_error_context(om_status *st, const char *fmt, ...) {
    if (!st || st == &oom_status) return st;
    va_list ap;
    va_start(ap, fmt);
    char *ctx = vformat(fmt, ap);
    va_end(ap);
    if (!ctx) return st;
    const size_t c = strlen(ctx);
    if (!strncmp(st->msg, ctx, c) && st->msg[c] == ':') {   /* the message already says it (a kernel named its node) */
        free(ctx);
        return st;
    }
    size_t n = c + strlen(st->msg) + 3;
    char *m = malloc(n);
    if (m) {
        snprintf(m, n, "%s: %s", ctx, st->msg);
        free(st->msg);
        st->msg = m;
    }
    free(ctx);
    return st;
}

om_code om_status_code(const om_status *st) { return st ? st->code : OM_OK; }
const char *om_status_message(const om_status *st) { return st ? st->msg : "ok"; }
void om_status_free(om_status *st) {
    if (!st || st == &oom_status) return;
    free(st->msg);
    free(st);
}

size_t om_dtype_size(om_dtype dt) {
    switch (dt) {
    case OM_F32: case OM_I32: return 4;
    case OM_F64: case OM_I64: return 8;
    case OM_F16: case OM_BF16: return 2;
    case OM_U8: case OM_I8: case OM_BOOL: return 1;
    default: return 0;
    }
}

const char *om_dtype_name(om_dtype dt) {
    switch (dt) {
    case OM_F32: return "float32";
    case OM_F64: return "float64";
    case OM_F16: return "float16";
    case OM_BF16: return "bfloat16";
    case OM_I32: return "int32";
    case OM_I64: return "int64";
    case OM_U8: return "uint8";
    case OM_I8: return "int8";
    case OM_BOOL: return "bool";
    default: return "undefined";
    }
}

int om_scalar_get(const om_tensor *t, double *v) {
    if (!t->data || om_tensor_numel(t) < 1) return -1;
    const void *p = t->data;
    switch (t->dtype) {
    case OM_F32: *v = *(const float *)p; return 0;
    case OM_F64: *v = *(const double *)p; return 0;
    case OM_F16: *v = om_f16_to_f32(*(const uint16_t *)p); return 0;
    case OM_BF16: *v = om_bf16_to_f32(*(const uint16_t *)p); return 0;
    case OM_I64: *v = (double)*(const int64_t *)p; return 0;
    case OM_I32: *v = *(const int32_t *)p; return 0;
    case OM_I8: *v = *(const int8_t *)p; return 0;
    case OM_U8: case OM_BOOL: *v = *(const uint8_t *)p; return 0;
    default: return -1;
    }
}

int om_scalar_set(om_dtype dt, void *p, double v) {
    switch (dt) {
    case OM_F32: *(float *)p = (float)v; return 0;
    case OM_F64: *(double *)p = v; return 0;
    case OM_F16: *(uint16_t *)p = om_f32_to_f16((float)v); return 0;
    case OM_BF16: *(uint16_t *)p = om_f32_to_bf16((float)v); return 0;
    case OM_I64: *(int64_t *)p = (int64_t)v; return 0;
    case OM_I32: *(int32_t *)p = (int32_t)v; return 0;
    case OM_I8: *(int8_t *)p = (int8_t)v; return 0;
    case OM_U8: *(uint8_t *)p = (uint8_t)v; return 0;
    case OM_BOOL: *(uint8_t *)p = v != 0; return 0;
    default: return -1;
    }
}

int64_t om_tensor_numel(const om_tensor *t) {
    int64_t n = 1;
    for (int i = 0; i < t->rank; i++) n *= t->dims[i];
    return n;
}

size_t om_tensor_nbytes(const om_tensor *t) {
    return (size_t)om_tensor_numel(t) * om_dtype_size(t->dtype);
}

int om_shape_size(const int64_t *dims, int rank, size_t esize, int64_t *numel, size_t *nbytes) {
    /* bound is the product with every 0 taken as 1: kernels multiply any subset of the dims
     * (rows = dims[0..axis), inner = dims[axis+1..]), and [0, 2^40, 2^40] has no elements but
     * an inner size of 2^80 */
    int64_t n = 1, bound = (int64_t)(esize ? esize : 1);
    if (rank < 0 || rank > OM_MAX_RANK) return -1;
    for (int i = 0; i < rank; i++) {
        if (dims[i] < 0) return -1;
        if (dims[i] > 1 && (__builtin_mul_overflow(bound, dims[i], &bound) || bound > OM_MAX_TENSOR_BYTES)) return -1;
        n *= dims[i];   /* n <= bound now: no overflow */
    }
    if (bound > OM_MAX_TENSOR_BYTES) return -1;
    if (numel) *numel = n;
    if (nbytes) *nbytes = (size_t)n * esize;
    return 0;
}

/* 64-byte alignment: a cache line, and enough for any vector ISA the kernels use. */
/* Counted so that a test can prove the steady state allocates nothing it should not. */
static atomic_size_t alloc_calls, alloc_bytes;

void *om_alloc(size_t nbytes) {
    void *p = NULL;
    if (nbytes > SIZE_MAX - 64) return NULL;   /* the rounding below would wrap to a tiny block */
    if (posix_memalign(&p, 64, nbytes ? (nbytes + 63) & ~(size_t)63 : 64) != 0) return NULL;
    atomic_fetch_add_explicit(&alloc_calls, 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&alloc_bytes, nbytes, memory_order_relaxed);
    return p;
}

/* default visibility: tests reach it through ctypes before the binding exposes it */
__attribute__((visibility("default"))) void om_alloc_stats(size_t *calls, size_t *bytes) {
    if (calls) *calls = atomic_load_explicit(&alloc_calls, memory_order_relaxed);
    if (bytes) *bytes = atomic_load_explicit(&alloc_bytes, memory_order_relaxed);
}

void om_free(void *p) { free(p); }

/* Frames of at least this size sit on huge pages: the rounding up to a whole one then wastes
 * at most an eighth of the block's address space, and none of its resident memory. */
#define HUGE_FRAME_MIN ((size_t)16 << 20)
#define HUGE_PAGE ((size_t)2 << 20)

static size_t system_page(void) {
#if defined(__linux__)
    static size_t page;
    if (!page) {
        long ps = sysconf(_SC_PAGESIZE);
        page = ps > 0 ? (size_t)ps : 4096;
    }
    return page;
#else
    return 4096;
#endif
}

/* Transparent huge pages that a block can ask for: "always" or "madvise" in the system's
 * setting (read once; "never", or no such file, means no). */
static int huge_pages_available(void) {
#if defined(__linux__) && defined(MADV_HUGEPAGE)
    static atomic_int known;   /* 0 unknown, 1 no, 2 yes */
    int k = atomic_load_explicit(&known, memory_order_relaxed);
    if (!k) {
        char buf[128] = {0};
        FILE *f = fopen("/sys/kernel/mm/transparent_hugepage/enabled", "r");
        size_t n = f ? fread(buf, 1, sizeof buf - 1, f) : 0;
        if (f) fclose(f);
        buf[n] = 0;
        k = n && !strstr(buf, "[never]") ? 2 : 1;
        atomic_store_explicit(&known, k, memory_order_relaxed);
    }
    return k == 2;
#else
    return 0;
#endif
}

size_t om_frame_page(size_t nbytes) {
    return nbytes >= HUGE_FRAME_MIN && huge_pages_available() ? HUGE_PAGE : system_page();
}

void *om_alloc_frame(size_t nbytes) {
    size_t page = om_frame_page(nbytes);
    if (page != HUGE_PAGE) return om_alloc(nbytes);
    if (nbytes > SIZE_MAX - HUGE_PAGE) return NULL;
    void *p = NULL;
    if (posix_memalign(&p, HUGE_PAGE, (nbytes + HUGE_PAGE - 1) & ~(HUGE_PAGE - 1)) != 0) return NULL;
#if defined(__linux__) && defined(MADV_HUGEPAGE)
    (void)madvise(p, (nbytes + HUGE_PAGE - 1) & ~(HUGE_PAGE - 1), MADV_HUGEPAGE);   /* a hint: failure costs speed only */
#endif
    atomic_fetch_add_explicit(&alloc_calls, 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&alloc_bytes, nbytes, memory_order_relaxed);
    return p;
}

/* Tests set it through ctypes (default visibility, as om_alloc_stats): released bytes are then
 * filled with 0xff (NaN in every float type) and stay mapped, so that a release schedule that
 * frees a buffer something still reads shows as NaN, not as the stale value it would often keep. */
__attribute__((visibility("default"))) atomic_int om_release_poison;

void om_release_pages(void *p, size_t nbytes, int now) {
    if (p && nbytes && atomic_load_explicit(&om_release_poison, memory_order_relaxed)) {
        memset(p, 0xff, nbytes);
        return;
    }
#if defined(__linux__)
    const size_t page = system_page();
    uintptr_t lo = ((uintptr_t)p + page - 1) & ~(uintptr_t)(page - 1);
    uintptr_t hi = ((uintptr_t)p + nbytes) & ~(uintptr_t)(page - 1);
    if (!p || hi <= lo) return;
    /* MADV_DONTNEED: the pages leave the resident set now, and each later touch faults a
     * zeroed page in (100 MiB re-faulted costs several times writing it). MADV_FREE: the system
     * takes them only when it needs memory; until then a touch finds them mapped, at no cost.
     * Failure only means the memory stays resident (MADV_FREE is Linux 4.5+: DONTNEED then) */
#ifdef MADV_FREE
    if (!now && madvise((void *)lo, hi - lo, MADV_FREE) == 0) return;
#endif
    (void)madvise((void *)lo, hi - lo, MADV_DONTNEED);
#else
    (void)p;
    (void)nbytes;
    (void)now;
#endif
}

char *om_strdup(const char *s) {
    if (!s) return NULL;
    size_t n = strlen(s) + 1;
    char *d = malloc(n);
    if (d) memcpy(d, s, n);
    return d;
}

int om_grow(void **arr, int *cap, int n, size_t elem) {
    if (n < *cap) return 0;
    int nc = *cap ? *cap : 8;
    while (nc <= n) nc *= 2;
    void *p = realloc(*arr, (size_t)nc * elem);
    if (!p) return -1;
    memset((char *)p + (size_t)*cap * elem, 0, (size_t)(nc - *cap) * elem);
    *arr = p;
    *cap = nc;
    return 0;
}

int om_shape_equal(const om_tensor *a, const om_tensor *b) {
    if (a->rank != b->rank) return 0;
    for (int i = 0; i < a->rank; i++)
        if (a->dims[i] != b->dims[i]) return 0;
    return 1;
}

void om_shape_str(const om_tensor *t, char *buf, size_t n) {
    size_t used = 0;
    used += (size_t)snprintf(buf + used, n - used, "[");
    for (int i = 0; i < t->rank && used < n; i++)
        used += (size_t)snprintf(buf + used, n - used, i ? ", %lld" : "%lld", (long long)t->dims[i]);
    if (used < n) snprintf(buf + used, n - used, "] %s", om_dtype_name(t->dtype));
}

uint64_t om_rand_u64(uint64_t seed, uint64_t index) {
    /* splitmix64 of (seed, index): counter-based, so any thread may draw any element. */
    uint64_t z = seed * 0x9E3779B97F4A7C15ull + index + 0x632BE59BD9B4E019ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

float om_rand_uniform(uint64_t seed, uint64_t index) {
    return (float)(om_rand_u64(seed, index) >> 40) * (1.0f / 16777216.0f);
}
