/* sort_order.h — the order in which eager torch.topk and torch.sort (CPU) leave equal values.
 *
 *     int64_t p[n];                                  // p[i] = i on entry
 *     om_so_topk_f32(v, p, n, k, largest, sorted);   // p[0..k) = torch.topk(v, k).indices
 *     om_so_sort_f32(v, p, n, descending);           // p = torch.sort(v).indices
 *
 * Values never depend on the tie order, but indices do, and so does where a gradient lands.
 * Eager torch does not break ties by index (ONNX's TopK rule): aten's CPU kernels run
 * libstdc++'s std::partial_sort (k * 64 <= n) or std::nth_element then std::sort of the first
 * k - 1 (topk), std::sort (sort) or std::stable_sort (sort with stable=True) over (value,
 * index) pairs, with NaN greater than every number (aten/src/ATen/native/TopKImpl.h,
 * SortingKernel.cpp). Those algorithms are deterministic, so their exact steps are replayed
 * here on a permutation p of the row (comparing v[p[i]]): introsort / introselect with the
 * median-of-three pivot, heap select and heap sort, and the 16-element insertion sort, as in
 * bits/stl_algo.h and bits/stl_heap.h. The same ties come out in the same places.
 * (tests/test_ops_topk.py checks this against torch on rows full of ties and NaNs.)
 *
 * Plain C that nvcc also compiles (cuda/topk.cu runs one row per thread): the functions are
 * generated per value type by OM_SORT_ORDER_DEFINE(SFX, T, QUAL). The ranges pending in the
 * introsort are kept on a small explicit stack instead of recursion: the sub-ranges are
 * disjoint, so the order they are finished in changes nothing.
 */
#ifndef OM_SORT_ORDER_H
#define OM_SORT_ORDER_H

#include <stdint.h>

#define OM_SO_THRESHOLD 16   /* libstdc++'s _S_threshold */
#define OM_SO_STACK 132      /* pending introsort ranges: at most 2 * log2(n) + 1 */

#define OM_SORT_ORDER_DEFINE(SFX, T, QUAL)                                                        \
    /* floor(log2(n)) for n >= 1: libstdc++'s std::__lg */                                        \
    QUAL int64_t om_so_lg_##SFX(int64_t n) {                                                      \
        int64_t lg = 0;                                                                           \
        while ((n >> (lg + 1)) != 0) lg++;                                                        \
        return lg;                                                                                \
    }                                                                                             \
    /* does a go before b? torch's comparators: NaN is the largest value */                       \
    QUAL int om_so_less_##SFX(T a, T b, int desc) {                                               \
        return desc ? ((a != a && b == b) || a > b) : ((a == a && b != b) || a < b);              \
    }                                                                                             \
    QUAL void om_so_push_heap_##SFX(const T *v, int64_t *p, int64_t first, int64_t hole,         \
                                    int64_t top, int64_t value, int desc) {                       \
        int64_t parent = (hole - 1) / 2;                                                          \
        while (hole > top && om_so_less_##SFX(v[p[first + parent]], v[value], desc)) {            \
            p[first + hole] = p[first + parent];                                                  \
            hole = parent;                                                                        \
            parent = (hole - 1) / 2;                                                              \
        }                                                                                         \
        p[first + hole] = value;                                                                  \
    }                                                                                             \
    QUAL void om_so_adjust_heap_##SFX(const T *v, int64_t *p, int64_t first, int64_t hole,       \
                                      int64_t len, int64_t value, int desc) {                     \
        const int64_t top = hole;                                                                 \
        int64_t child = hole;                                                                     \
        while (child < (len - 1) / 2) {                                                           \
            child = 2 * (child + 1);                                                              \
            if (om_so_less_##SFX(v[p[first + child]], v[p[first + child - 1]], desc)) child--;    \
            p[first + hole] = p[first + child];                                                   \
            hole = child;                                                                         \
        }                                                                                         \
        if ((len & 1) == 0 && child == (len - 2) / 2) {                                           \
            child = 2 * (child + 1);                                                              \
            p[first + hole] = p[first + child - 1];                                               \
            hole = child - 1;                                                                     \
        }                                                                                         \
        om_so_push_heap_##SFX(v, p, first, hole, top, value, desc);                               \
    }                                                                                             \
    QUAL void om_so_pop_heap_##SFX(const T *v, int64_t *p, int64_t first, int64_t last,          \
                                   int64_t result, int desc) {                                    \
        const int64_t value = p[result];                                                          \
        p[result] = p[first];                                                                     \
        om_so_adjust_heap_##SFX(v, p, first, 0, last - first, value, desc);                       \
    }                                                                                             \
    /* std::__heap_select: the smallest (middle - first) of [first, last) into a heap */          \
    QUAL void om_so_heap_select_##SFX(const T *v, int64_t *p, int64_t first, int64_t middle,     \
                                      int64_t last, int desc) {                                   \
        const int64_t len = middle - first;                                                       \
        if (len >= 2)                                                                             \
            for (int64_t parent = (len - 2) / 2;; parent--) {                                     \
                om_so_adjust_heap_##SFX(v, p, first, parent, len, p[first + parent], desc);       \
                if (parent == 0) break;                                                           \
            }                                                                                     \
        for (int64_t i = middle; i < last; i++)                                                   \
            if (om_so_less_##SFX(v[p[i]], v[p[first]], desc)) om_so_pop_heap_##SFX(v, p, first, middle, i, desc); \
    }                                                                                             \
    QUAL void om_so_sort_heap_##SFX(const T *v, int64_t *p, int64_t first, int64_t last, int desc) { \
        while (last - first > 1) {                                                                \
            --last;                                                                               \
            om_so_pop_heap_##SFX(v, p, first, last, last, desc);                                  \
        }                                                                                         \
    }                                                                                             \
    QUAL void om_so_linear_insert_##SFX(const T *v, int64_t *p, int64_t last, int desc) {        \
        const int64_t val = p[last];                                                              \
        int64_t next = last - 1;                                                                  \
        while (om_so_less_##SFX(v[val], v[p[next]], desc)) {                                      \
            p[last] = p[next];                                                                    \
            last = next--;                                                                        \
        }                                                                                         \
        p[last] = val;                                                                            \
    }                                                                                             \
    QUAL void om_so_insertion_sort_##SFX(const T *v, int64_t *p, int64_t first, int64_t last,    \
                                         int desc) {                                              \
        if (first == last) return;                                                                \
        for (int64_t i = first + 1; i < last; i++) {                                              \
            if (om_so_less_##SFX(v[p[i]], v[p[first]], desc)) {                                   \
                const int64_t val = p[i];                                                         \
                for (int64_t j = i; j > first; j--) p[j] = p[j - 1];                              \
                p[first] = val;                                                                   \
            } else {                                                                              \
                om_so_linear_insert_##SFX(v, p, i, desc);                                         \
            }                                                                                     \
        }                                                                                         \
    }                                                                                             \
    QUAL void om_so_swap_##SFX(int64_t *p, int64_t a, int64_t b) {                                \
        const int64_t t = p[a];                                                                   \
        p[a] = p[b];                                                                              \
        p[b] = t;                                                                                 \
    }                                                                                             \
    /* std::__unguarded_partition_pivot: median of (first + 1, mid, last - 1) to first, then     \
     * Hoare's partition of [first + 1, last) around it */                                        \
    QUAL int64_t om_so_partition_##SFX(const T *v, int64_t *p, int64_t first, int64_t last,      \
                                       int desc) {                                                \
        const int64_t a = first + 1, b = first + (last - first) / 2, c = last - 1;                \
        int64_t m;                                                                                \
        if (om_so_less_##SFX(v[p[a]], v[p[b]], desc)) {                                           \
            if (om_so_less_##SFX(v[p[b]], v[p[c]], desc)) m = b;                                  \
            else if (om_so_less_##SFX(v[p[a]], v[p[c]], desc)) m = c;                             \
            else m = a;                                                                           \
        } else if (om_so_less_##SFX(v[p[a]], v[p[c]], desc)) m = a;                               \
        else if (om_so_less_##SFX(v[p[b]], v[p[c]], desc)) m = c;                                 \
        else m = b;                                                                               \
        om_so_swap_##SFX(p, first, m);                                                            \
        int64_t lo = first + 1, hi = last;                                                        \
        for (;;) {                                                                                \
            while (om_so_less_##SFX(v[p[lo]], v[p[first]], desc)) ++lo;                           \
            --hi;                                                                                 \
            while (om_so_less_##SFX(v[p[first]], v[p[hi]], desc)) --hi;                           \
            if (!(lo < hi)) return lo;                                                            \
            om_so_swap_##SFX(p, lo, hi);                                                          \
            ++lo;                                                                                 \
        }                                                                                         \
    }                                                                                             \
    /* std::sort of p[0, n): introsort, then the final insertion sort */                          \
    QUAL void om_so_sort_##SFX(const T *v, int64_t *p, int64_t n, int desc) {                     \
        if (n < 2) return;                                                                        \
        int64_t st_first[OM_SO_STACK], st_last[OM_SO_STACK], st_depth[OM_SO_STACK];               \
        int top = 0;                                                                              \
        st_first[0] = 0, st_last[0] = n, st_depth[0] = 2 * om_so_lg_##SFX(n), top = 1;                  \
        while (top > 0) {                                                                         \
            top--;                                                                                \
            const int64_t first = st_first[top];                                                  \
            int64_t last = st_last[top], depth = st_depth[top];                                   \
            while (last - first > OM_SO_THRESHOLD) {                                              \
                if (depth == 0) { /* std::__partial_sort(first, last, last): heap sort */         \
                    om_so_heap_select_##SFX(v, p, first, last, last, desc);                       \
                    om_so_sort_heap_##SFX(v, p, first, last, desc);                               \
                    break;                                                                        \
                }                                                                                 \
                --depth;                                                                          \
                const int64_t cut = om_so_partition_##SFX(v, p, first, last, desc);               \
                st_first[top] = cut, st_last[top] = last, st_depth[top] = depth, top++;           \
                last = cut;                                                                       \
            }                                                                                     \
        }                                                                                         \
        if (n > OM_SO_THRESHOLD) {                                                                \
            om_so_insertion_sort_##SFX(v, p, 0, OM_SO_THRESHOLD, desc);                           \
            for (int64_t i = OM_SO_THRESHOLD; i < n; i++) om_so_linear_insert_##SFX(v, p, i, desc); \
        } else {                                                                                  \
            om_so_insertion_sort_##SFX(v, p, 0, n, desc);                                         \
        }                                                                                         \
    }                                                                                             \
    /* std::nth_element(p, p + nth, p + n): introselect */                                        \
    QUAL void om_so_nth_element_##SFX(const T *v, int64_t *p, int64_t nth, int64_t n, int desc) { \
        if (n == 0 || nth == n) return;                                                           \
        int64_t first = 0, last = n, depth = 2 * om_so_lg_##SFX(n);                                     \
        while (last - first > 3) {                                                                \
            if (depth == 0) {                                                                     \
                om_so_heap_select_##SFX(v, p, first, nth + 1, last, desc);                        \
                om_so_swap_##SFX(p, first, nth);                                                  \
                return;                                                                           \
            }                                                                                     \
            --depth;                                                                              \
            const int64_t cut = om_so_partition_##SFX(v, p, first, last, desc);                   \
            if (cut <= nth) first = cut;                                                          \
            else last = cut;                                                                      \
        }                                                                                         \
        om_so_insertion_sort_##SFX(v, p, first, last, desc);                                      \
    }                                                                                             \
    /* torch.topk's CPU loop (k >= 1) */                                                          \
    QUAL void om_so_topk_##SFX(const T *v, int64_t *p, int64_t n, int64_t k, int largest,         \
                               int sorted) {                                                      \
        if (k * 64 <= n) {                                                                        \
            om_so_heap_select_##SFX(v, p, 0, k, n, largest);                                      \
            om_so_sort_heap_##SFX(v, p, 0, k, largest);                                           \
        } else {                                                                                  \
            om_so_nth_element_##SFX(v, p, k - 1, n, largest);                                     \
            if (sorted) om_so_sort_##SFX(v, p, k - 1, largest);                                   \
        }                                                                                         \
    }                                                                                             \
    /* std::stable_sort's result: equal values keep their order (insertion sort into runs,     \
     * then merges through tmp, n entries) */                                                     \
    QUAL void om_so_stable_sort_##SFX(const T *v, int64_t *p, int64_t *tmp, int64_t n, int desc) { \
        const int64_t run = 16;                                                                   \
        for (int64_t s = 0; s < n; s += run) {                                                    \
            const int64_t e = s + run < n ? s + run : n;                                          \
            for (int64_t i = s + 1; i < e; i++) {                                                 \
                const int64_t val = p[i];                                                         \
                int64_t j = i;                                                                    \
                while (j > s && om_so_less_##SFX(v[val], v[p[j - 1]], desc)) { p[j] = p[j - 1]; j--; } \
                p[j] = val;                                                                       \
            }                                                                                     \
        }                                                                                         \
        for (int64_t w = run; w < n; w *= 2) {                                                    \
            for (int64_t s = 0; s < n; s += 2 * w) {                                              \
                const int64_t m = s + w < n ? s + w : n, e = s + 2 * w < n ? s + 2 * w : n;       \
                int64_t i = s, j = m, o = s;                                                      \
                while (i < m && j < e) tmp[o++] = om_so_less_##SFX(v[p[j]], v[p[i]], desc) ? p[j++] : p[i++]; \
                while (i < m) tmp[o++] = p[i++];                                                  \
                while (j < e) tmp[o++] = p[j++];                                                  \
            }                                                                                     \
            for (int64_t i = 0; i < n; i++) p[i] = tmp[i];                                        \
        }                                                                                         \
    }

#endif
