/* rowsum.h — sums of the rows of a row-major (M, N) matrix: a bias gradient, or a gradient
 * summed over broadcast leading axes.
 *
 *     om_sum_rows(dt, M, N, src, dst);   // dst[j] = sum over i of src[i * N + j]
 *
 * float32 or float64, on the engine's pool: wide rows are cut into column ranges (each
 * thread sums its columns over every row); narrow ones into row ranges with a partial row
 * per range, added up in range order, so a thread count always gives the same result. */
#ifndef OM_ROWSUM_H
#define OM_ROWSUM_H

#include <stdint.h>

#include "ortmod.h"

/* NULL, or an out-of-memory error for the partial rows. */
om_status *om_sum_rows(om_dtype dt, int64_t M, int64_t N, const void *src, void *dst);

#endif
