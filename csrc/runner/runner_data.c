/* runner_data.c — data shards: every regular file of a directory, in name order, is a
 * sequence of [uint32 LE length][TensorProto] records; a sample is one record per
 * feature, and a new sample starts where the first feature's name comes again. The whole
 * set is loaded into one buffer per feature; batches wrap around epoch after epoch, in
 * file order or in a seeded per-epoch permutation. */
#include "graph/onnx_tensor.h"
#include "runner/runner_internal.h"

#include <dirent.h>
#include <stdlib.h>

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

static om_status *list_shards(const char *dir, char ***out, int *n_out) {
    *out = NULL;
    *n_out = 0;
    DIR *d = opendir(dir);
    if (!d) return om_error(OM_INVALID_ARGUMENT, "cannot open data directory '%s': %s", dir, strerror(errno));
    char **names = NULL;
    int n = 0, cap = 0;
    struct dirent *de;
    om_status *st = NULL;
    while ((de = readdir(d))) {
        if (de->d_name[0] == '.') continue;
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", dir, de->d_name);
        if (rn_is_dir(path)) continue;
        if (om_grow((void **)&names, &cap, n, sizeof(char *)) || !(names[n] = om_strdup(de->d_name))) {
            st = om_error(OM_OUT_OF_MEMORY, "out of memory");
            break;
        }
        n++;
    }
    closedir(d);
    if (st) {
        for (int i = 0; i < n; i++) free(names[i]);
        free(names);
        return st;
    }
    if (n) qsort(names, (size_t)n, sizeof(char *), cmp_str);
    *out = names;
    *n_out = n;
    return NULL;
}

static void shape_str(om_dtype dt, int rank, const int64_t *dims, char *buf, size_t n) {
    om_tensor t;
    memset(&t, 0, sizeof t);
    t.dtype = dt;
    t.rank = rank;
    for (int i = 0; i < rank; i++) t.dims[i] = dims[i];
    om_shape_str(&t, buf, n);
}

/* Appends one sample's tensor to feature f (first sample: defines dtype and shape). */
static om_status *feature_append(rn_feature *f, const om_tensor *t, int64_t sample, const char *shard) {
    if (sample == 0) {
        f->dtype = t->dtype;
        f->rank = t->rank;
        memcpy(f->dims, t->dims, sizeof f->dims);
        f->sample_bytes = om_tensor_nbytes(t);
    } else if (f->dtype != t->dtype || f->rank != t->rank ||
               memcmp(f->dims, t->dims, sizeof(int64_t) * (size_t)t->rank) != 0) {
        char want[128], got[128];
        shape_str(f->dtype, f->rank, f->dims, want, sizeof want);
        om_shape_str(t, got, sizeof got);
        return om_error(OM_INVALID_ARGUMENT,
                        "shard '%s': feature '%s' of sample %lld is %s but earlier samples are %s", shard, f->name,
                        (long long)sample, got, want);
    }
    size_t need;
    if (__builtin_mul_overflow((size_t)(sample + 1), f->sample_bytes, &need))
        return om_error(OM_INVALID_ARGUMENT, "shard '%s': feature '%s' does not fit in memory", shard, f->name);
    if (need > f->cap) {
        size_t cap = f->cap ? f->cap * 2 : 4096;
        while (cap < need) cap *= 2;
        uint8_t *nd = realloc(f->data, cap);
        if (!nd) return om_error(OM_OUT_OF_MEMORY, "out of memory loading feature '%s'", f->name);
        f->data = nd;
        f->cap = cap;
    }
    if (f->sample_bytes) memcpy(f->data + (size_t)sample * f->sample_bytes, t->data, f->sample_bytes);
    return NULL;
}

static om_status *load_shard(rn_dataset *ds, const char *path, const char *fname) {
    uint8_t *buf;
    size_t n;
    OM_TRY(rn_read_file(path, &buf, &n));
    om_status *st = rn_dataset_add_shard(ds, path, fname, buf, n);
    free(buf);
    return st;
}

/* seen: per feature, whether the current sample has it. */
om_status *rn_dataset_add_shard(rn_dataset *ds, const char *path, const char *fname, const uint8_t *buf, size_t n) {
    if (n == 0) return om_error(OM_INVALID_ARGUMENT, "shard '%s' is empty", path);
    rn_record_iter it = {.buf = buf, .n = n, .pos = 0, .path = path, .index = 0};
    Onnx__TensorProto *tp;
    om_status *st = NULL;
    int in_sample = 0;          /* features of the current sample seen so far */
    char seen[256] = {0};
    while (!st && rn_record_next(&it, &tp, &st)) {
        const char *name = tp->name ? tp->name : "";
        if (!*name) {
            st = om_error(OM_INVALID_ARGUMENT, "shard '%s': record %lld has no name (features are matched to graph inputs by name)",
                          path, (long long)it.index - 1);
        } else {
            int k = rn_dataset_find(ds, name);
            if (k < 0 && ds->n_samples > 0) {
                st = om_error(OM_INVALID_ARGUMENT, "shard '%s' has feature '%s', which earlier samples lack", path, name);
            } else if (k < 0) {
                if (ds->n_features >= 256) {
                    st = om_error(OM_INVALID_ARGUMENT, "shard '%s': more than 256 features per sample", path);
                } else {
                    rn_feature *nf = realloc(ds->f, sizeof(rn_feature) * (size_t)(ds->n_features + 1));
                    if (!nf) st = om_error(OM_OUT_OF_MEMORY, "out of memory");
                    else {
                        ds->f = nf;
                        memset(&ds->f[ds->n_features], 0, sizeof(rn_feature));
                        ds->f[ds->n_features].name = om_strdup(name);
                        k = ds->n_features++;
                    }
                }
            }
            if (!st && k == 0 && in_sample) {
                /* the first feature again: the previous sample is complete */
                if (in_sample != ds->n_features)
                    st = om_error(OM_INVALID_ARGUMENT, "shard '%s': sample %lld has %d of the %d features", path,
                                  (long long)ds->n_samples, in_sample, ds->n_features);
                ds->n_samples++;
                in_sample = 0;
                memset(seen, 0, sizeof seen);
            }
            if (!st && seen[k])
                st = om_error(OM_INVALID_ARGUMENT, "shard '%s': sample %lld has feature '%s' twice", path,
                              (long long)ds->n_samples, name);
            if (!st) {
                om_tensor t;
                st = om_tensor_from_proto(tp, &t);
                if (st) st = om_error_context(st, "shard '%s', sample %lld", path, (long long)ds->n_samples);
                else {
                    st = feature_append(&ds->f[k], &t, ds->n_samples, fname);
                    om_free(t.data);
                }
                seen[k] = 1;
                in_sample++;
            }
        }
        onnx__tensor_proto__free_unpacked(tp, NULL);
    }
    if (!st && in_sample) {
        if (in_sample != ds->n_features)
            st = om_error(OM_INVALID_ARGUMENT, "shard '%s': its last sample has %d of the %d features", path, in_sample,
                          ds->n_features);
        ds->n_samples++;
    }
    return st;
}

om_status *rn_dataset_load(const char *dir, int shuffle, uint64_t seed, rn_dataset *ds) {
    memset(ds, 0, sizeof *ds);
    ds->perm_epoch = -1;
    ds->shuffle = shuffle;
    ds->seed = seed;
    ds->dir = om_strdup(dir);
    char **names;
    int n;
    OM_TRY(list_shards(dir, &names, &n));
    om_status *st = NULL;
    if (n == 0) st = om_error(OM_INVALID_ARGUMENT, "data directory '%s' holds no shard files", dir);
    for (int i = 0; i < n && !st; i++) {
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        st = load_shard(ds, path, names[i]);
    }
    for (int i = 0; i < n; i++) free(names[i]);
    free(names);
    ds->n_shards = n;
    if (!st && ds->n_samples == 0) st = om_error(OM_INVALID_ARGUMENT, "data directory '%s' holds no samples", dir);
    return st;
}

void rn_dataset_free(rn_dataset *ds) {
    for (int i = 0; i < ds->n_features; i++) {
        free(ds->f[i].name);
        free(ds->f[i].data);
    }
    free(ds->f);
    free(ds->perm);
    free(ds->dir);
    memset(ds, 0, sizeof *ds);
}

int rn_dataset_find(const rn_dataset *ds, const char *name) {
    for (int i = 0; i < ds->n_features; i++)
        if (strcmp(ds->f[i].name, name) == 0) return i;
    return -1;
}

static om_status *ensure_perm(rn_dataset *ds, int64_t epoch) {
    if (ds->perm_epoch == epoch) return NULL;
    if (!ds->perm) {
        ds->perm = malloc(sizeof(int64_t) * (size_t)ds->n_samples);
        if (!ds->perm) return om_error(OM_OUT_OF_MEMORY, "out of memory");
    }
    const int64_t n = ds->n_samples;
    for (int64_t i = 0; i < n; i++) ds->perm[i] = i;
    const uint64_t s = om_rand_u64(ds->seed, 0x5eed0000ull + (uint64_t)epoch);
    for (int64_t i = n - 1; i > 0; i--) {   /* Fisher-Yates */
        int64_t j = (int64_t)(om_rand_u64(s, (uint64_t)i) % (uint64_t)(i + 1));
        int64_t t = ds->perm[i];
        ds->perm[i] = ds->perm[j];
        ds->perm[j] = t;
    }
    ds->perm_epoch = epoch;
    return NULL;
}

om_status *rn_dataset_batch(rn_dataset *ds, int64_t start, int64_t count, void *const *bufs) {
    const int64_t n = ds->n_samples;
    /* start comes from a checkpoint too: a negative one would index before the data */
    if (start < 0 || count < 0 || n <= 0 || start > INT64_MAX - count)
        return om_error(OM_INVALID_ARGUMENT, "data '%s': batch of %lld samples at position %lld is out of range", ds->dir,
                        (long long)count, (long long)start);
    for (int64_t b = 0; b < count; b++) {
        const int64_t g = start + b, epoch = g / n;
        int64_t idx = g % n;
        if (ds->shuffle) {
            OM_TRY(ensure_perm(ds, epoch));
            idx = ds->perm[idx];
        }
        for (int k = 0; k < ds->n_features; k++) {
            const rn_feature *f = &ds->f[k];
            if (!f->sample_bytes) continue;   /* a feature with a zero dim: no data, not even a buffer */
            memcpy((uint8_t *)bufs[k] + (size_t)b * f->sample_bytes, f->data + (size_t)idx * f->sample_bytes,
                   f->sample_bytes);
        }
    }
    return NULL;
}

void rn_dataset_slice(const rn_dataset *ds, int64_t start, int64_t count, void *const *bufs) {
    for (int k = 0; k < ds->n_features; k++) {
        const rn_feature *f = &ds->f[k];
        if (f->sample_bytes && count) memcpy(bufs[k], f->data + (size_t)start * f->sample_bytes, (size_t)count * f->sample_bytes);
    }
}
