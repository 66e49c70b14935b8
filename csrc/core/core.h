/* core.h — what every engine file uses: errors, memory, small growable arrays. */
#ifndef OM_CORE_H
#define OM_CORE_H

#include "ortmod.h"
#include <stdarg.h>
#include <string.h>

/* Creates an error; the message is printf-formatted. Returns a new status the caller owns. The
 * engine's name for ortmod.h's om_status_newf (the same code; the CUDA provider gets it as its
 * host table's error). */
om_status *om_error(om_code code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Prefixes context to an existing error ("in node 'x': ..."), returns the same status; a message
 * that already starts with the same context is left as it is. */
om_status *om_error_context(om_status *st, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#define OM_TRY(expr)                        \
    do {                                    \
        om_status *om_try_st_ = (expr);     \
        if (om_try_st_) return om_try_st_;  \
    } while (0)

/* calloc that reports failure as a status. */
#define OM_NEW(ptr, count)                                                             \
    do {                                                                               \
        (ptr) = calloc((size_t)(count) ? (size_t)(count) : 1, sizeof(*(ptr)));         \
        if (!(ptr)) return om_error(OM_OUT_OF_MEMORY, "out of memory (%s:%d)", __FILE__, __LINE__); \
    } while (0)

char *om_strdup(const char *s);                 /* NULL-safe; caller frees */

/* Grows *arr (element size elem) so that index n fits; doubles capacity. 0 on success. */
int om_grow(void **arr, int *cap, int n, size_t elem);

/* Hands the pages that lie wholly inside [p, p + nbytes) of a host block back to the system
 * (their contents are undefined after it): the block stays allocated and usable. now: its
 * resident size shrinks at once, and the next touch of each page faults a zeroed one in; else
 * the system reclaims them when it needs memory, and a touch before that costs nothing. A
 * no-op where the system has no such call. */
void om_release_pages(void *p, size_t nbytes, int now);

/* The host block of a CPU frame, whose dead pages om_release_pages hands back as a call runs.
 * om_frame_page(nbytes) is the page such a block is made of: 2 MiB (a transparent huge page,
 * where the system lends them) for a large block, else the system's page; a fault then maps a
 * whole huge page at once, and touching released memory again costs a fifth of what it does
 * on 4 KiB pages. om_alloc_frame aligns the block to that page; om_free frees it. */
size_t om_frame_page(size_t nbytes);
void *om_alloc_frame(size_t nbytes);

/* Shapes */
/* The largest tensor the engine takes, in bytes: every element index and byte offset a
 * kernel computes from dims then fits an int64_t (and a size_t), with room for a stride. */
#define OM_MAX_TENSOR_BYTES ((int64_t)1 << 60)
/* Element count and byte size of dims[0..rank) for elements of esize bytes, checked: every
 * dim >= 0, and the product of the dims (zeros taken as ones, so that every partial product
 * a kernel forms fits too) times esize is at most OM_MAX_TENSOR_BYTES. Returns 0, or -1
 * (numel and nbytes untouched) for a shape no buffer can hold. Either may be NULL. */
int om_shape_size(const int64_t *dims, int rank, size_t esize, int64_t *numel, size_t *nbytes);
int  om_shape_equal(const om_tensor *a, const om_tensor *b);
void om_shape_str(const om_tensor *t, char *buf, size_t n);   /* "[2, 3] float32" */

/* Element 0 of a tensor of any numeric dtype (fp16/bf16 included) as a double: the scalar
 * constants that rules and passes read (a dropout ratio, an attention scale, 0.5 in a GELU
 * pattern). Returns 0, or -1 when t has no data, no elements or a non-numeric dtype. */
int om_scalar_get(const om_tensor *t, double *v);
/* Stores v at p as one element of dtype dt (floats rounded to nearest even, integers
 * truncated); returns 0, or -1 for a dtype that cannot hold a number. */
int om_scalar_set(om_dtype dt, void *p, double v);

/* Deterministic counter-based random numbers (splitmix64): the same seed and offset give
 * the same stream on every machine and thread split. */
uint64_t om_rand_u64(uint64_t seed, uint64_t index);
float    om_rand_uniform(uint64_t seed, uint64_t index);        /* [0, 1) */

#endif
