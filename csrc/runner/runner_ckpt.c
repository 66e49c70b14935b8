/* runner_ckpt.c — checkpoints: <dir>/checkpoint_<update>/state.pb, one per weight update
 * that is saved, written atomically (a temporary directory, fsync of the file and both
 * directories, rename). The newest max_num_checkpoints are kept; resume starts from the
 * highest one that is intact. state.pb is a sequence of [uint32 LE length][TensorProto]
 * records:
 *   meta/format       int64 [1]   2 (1: the same without meta/checksum)
 *   meta/fingerprint  int64 [1]   model structure hash (runner_model.c)
 *   meta/counters     int64 [8]   step, update, data cursor, optimizer step, good updates
 *                                  (loss scaler), skipped updates, optimizer kind, #weights
 *   meta/loss_scale   float [1]
 *   weight/<name>, state_m/<name>, state_v/<name>   float, the weight's shape
 *   meta/end          int64 [1]   number of records before it (a truncation check)
 *   meta/checksum     int64 [1]   CRC-32C of every byte of the file before this record
 *
 * A checkpoint is read whole and checked before anything of it is used: the checksum first
 * (CRC-32C catches every 1-, 2- and 3-bit error and every burst up to 32 bits; other damage
 * passes with probability 2^-32), then the header: counters in range and consistent with one
 * another and with the directory's name, weights and optimizer state of the model's names,
 * shapes and dtype. A damaged checkpoint is named and resume falls back to the one before it.
 * A format-1 file (written before checksums) is accepted with a warning that its damage
 * cannot be detected. */
#include "graph/onnx_tensor.h"
#include "runner/runner_internal.h"

#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#define CKPT_PREFIX "checkpoint_"
#define CKPT_FORMAT 2          /* what save writes */
#define CKPT_FORMAT_NO_CHECKSUM 1

static const char *opt_name(int kind) { return kind == RN_SGD ? "SGD" : kind == RN_ADAM ? "Adam" : "Lamb"; }

static int has_state(const om_runner *r, int which) {   /* which: 0 m, 1 v */
    if (r->opt == RN_SGD) return which == 0 && r->p.momentum != 0;
    return 1;
}

static om_tensor scalar_i64(int64_t *v, int n) {
    om_tensor t;
    memset(&t, 0, sizeof t);
    t.dtype = OM_I64;
    t.rank = 1;
    t.dims[0] = n;
    t.data = v;
    return t;
}

/* Lists checkpoint_<N> directories: fills updates (malloc'd, ascending). */
static om_status *list_checkpoints(const char *dir, int64_t **updates, int *n_out) {
    *updates = NULL;
    *n_out = 0;
    DIR *d = opendir(dir);
    if (!d) return NULL;
    int64_t *u = NULL;
    int n = 0, cap = 0;
    struct dirent *de;
    while ((de = readdir(d))) {
        const char *s = de->d_name;
        if (strncmp(s, CKPT_PREFIX, strlen(CKPT_PREFIX)) != 0) continue;
        char *end;
        long long v = strtoll(s + strlen(CKPT_PREFIX), &end, 10);
        if (*end || end == s + strlen(CKPT_PREFIX) || v < 0) continue;
        if (om_grow((void **)&u, &cap, n, sizeof(int64_t))) {
            closedir(d);
            free(u);
            return om_error(OM_OUT_OF_MEMORY, "out of memory");
        }
        u[n++] = v;
    }
    closedir(d);
    for (int i = 1; i < n; i++)   /* insertion sort: a handful of entries */
        for (int j = i; j > 0 && u[j - 1] > u[j]; j--) { int64_t t = u[j]; u[j] = u[j - 1]; u[j - 1] = t; }
    *updates = u;
    *n_out = n;
    return NULL;
}

/* Removes temporary directories a killed run left behind. */
static void remove_stale_tmp(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *de;
    char p[4096];
    while ((de = readdir(d))) {
        if (strncmp(de->d_name, ".tmp_" CKPT_PREFIX, strlen(".tmp_" CKPT_PREFIX)) != 0) continue;
        snprintf(p, sizeof p, "%s/%s", dir, de->d_name);
        rn_remove_dir(p);
    }
    closedir(d);
}

om_status *rn_checkpoint_save(om_runner *r) {
    const char *dir = r->p.checkpoints_dir;
    if (!dir) return om_error(OM_INVALID_ARGUMENT, "checkpoints_dir is not set");
    OM_TRY(rn_mkdirs(dir));
    char tmp[4096], final[4096], file[4200];
    snprintf(tmp, sizeof tmp, "%s/.tmp_" CKPT_PREFIX "%lld.%ld", dir, (long long)r->update, (long)getpid());
    snprintf(final, sizeof final, "%s/" CKPT_PREFIX "%lld", dir, (long long)r->update);
    rn_remove_dir(tmp);
    if (mkdir(tmp, 0777) != 0) return om_error(OM_RUNTIME, "cannot create '%s': %s", tmp, strerror(errno));
    snprintf(file, sizeof file, "%s/state.pb", tmp);
    FILE *f = fopen(file, "wb");
    if (!f) return om_error(OM_RUNTIME, "cannot create '%s': %s", file, strerror(errno));
    om_status *st = NULL;
    int64_t records = 0;
    uint32_t crc = 0;
    int64_t fmt = CKPT_FORMAT, fp = (int64_t)r->fingerprint;
    int64_t counters[8] = {r->step, r->update, r->cursor, r->opt_step, r->good_updates, r->skipped_total, r->opt,
                           r->n_weights};
    float scale = r->loss_scale;
    om_tensor t = scalar_i64(&fmt, 1);
    if (!st) st = rn_write_tensor_record(f, file, "meta/format", &t, &crc), records++;
    t = scalar_i64(&fp, 1);
    if (!st) st = rn_write_tensor_record(f, file, "meta/fingerprint", &t, &crc), records++;
    t = scalar_i64(counters, 8);
    if (!st) st = rn_write_tensor_record(f, file, "meta/counters", &t, &crc), records++;
    t.dtype = OM_F32;
    t.dims[0] = 1;
    t.data = &scale;
    if (!st) st = rn_write_tensor_record(f, file, "meta/loss_scale", &t, &crc), records++;
    char name[4096];
    for (int i = 0; i < r->n_weights && !st; i++) {
        snprintf(name, sizeof name, "weight/%s", r->w[i].name);
        st = rn_write_tensor_record(f, file, name, &r->w[i].value, &crc), records++;
        if (!st && has_state(r, 0)) {
            snprintf(name, sizeof name, "state_m/%s", r->w[i].name);
            st = rn_write_tensor_record(f, file, name, &r->w[i].m, &crc), records++;
        }
        if (!st && has_state(r, 1)) {
            snprintf(name, sizeof name, "state_v/%s", r->w[i].name);
            st = rn_write_tensor_record(f, file, name, &r->w[i].v, &crc), records++;
        }
    }
    t = scalar_i64(&records, 1);
    if (!st) st = rn_write_tensor_record(f, file, "meta/end", &t, &crc);
    int64_t sum = (int64_t)crc;   /* of every byte before the checksum's own record */
    t = scalar_i64(&sum, 1);
    if (!st) st = rn_write_tensor_record(f, file, "meta/checksum", &t, NULL);
    if (!st && (fflush(f) != 0 || fsync(fileno(f)) != 0))
        st = om_error(OM_RUNTIME, "cannot write '%s': %s", file, strerror(errno));
    if (fclose(f) != 0 && !st) st = om_error(OM_RUNTIME, "cannot write '%s': %s", file, strerror(errno));
    if (!st) st = rn_fsync_dir(tmp);
    if (!st) {
        if (rn_is_dir(final)) rn_remove_dir(final);   /* the same update saved again */
        if (rename(tmp, final) != 0)
            st = om_error(OM_RUNTIME, "cannot rename '%s' to '%s': %s", tmp, final, strerror(errno));
    }
    if (!st) st = rn_fsync_dir(dir);
    if (st) {
        rn_remove_dir(tmp);
        return om_error_context(st, "checkpoint");
    }
    /* keep the newest max_num_checkpoints */
    int64_t *u;
    int n;
    OM_TRY(list_checkpoints(dir, &u, &n));
    for (int i = 0; i + r->p.max_num_checkpoints < n; i++) {
        snprintf(final, sizeof final, "%s/" CKPT_PREFIX "%lld", dir, (long long)u[i]);
        rn_remove_dir(final);
    }
    free(u);
    r->last_ckpt_update = r->update;
    return NULL;
}

/* ---- loading ------------------------------------------------------------------------ */

typedef struct ckpt_entry {
    char *name;
    om_tensor t;
    size_t offset;              /* where its record starts in the file */
} ckpt_entry;

static ckpt_entry *find_entry(ckpt_entry *e, int n, const char *name) {
    for (int i = 0; i < n; i++)
        if (!strcmp(e[i].name, name)) return &e[i];
    return NULL;
}

static int is_scalar(const ckpt_entry *x, om_dtype dt) {
    return x && x->t.dtype == dt && om_tensor_numel(&x->t) == 1;
}

/* An error that says the file is damaged: resume may fall back to an older checkpoint. */
#define DAMAGED(...) (*damaged = 1, om_error(OM_INVALID_ARGUMENT, __VA_ARGS__))

static om_status *expect_tensor(const char *path, ckpt_entry *e, const char *what, om_dtype dt, int64_t numel,
                                int *damaged) {
    if (!e) return DAMAGED("checkpoint '%s' is damaged: it lacks '%s'", path, what);
    if (e->t.dtype != dt || om_tensor_numel(&e->t) != numel)
        return DAMAGED("checkpoint '%s' is damaged: '%s' has the wrong type or size", path, what);
    return NULL;
}

static om_status *check_checkpoint(om_runner *r, const char *path, const uint8_t *buf, size_t n, ckpt_entry *e,
                                   int ne, int64_t expect_update, int *damaged) {
    /* the checksum first: a damaged file says nothing reliable about itself */
    ckpt_entry *x = find_entry(e, ne, "meta/format");
    const int64_t format = is_scalar(x, OM_I64) ? ((int64_t *)x->t.data)[0] : -1;
    ckpt_entry *sum = ne ? &e[ne - 1] : NULL;
    if (sum && !strcmp(sum->name, "meta/checksum")) {
        if (!is_scalar(sum, OM_I64)) return DAMAGED("checkpoint '%s' is damaged: its checksum record is malformed", path);
        const uint32_t want = rn_crc32c(0, buf, sum->offset);
        const int64_t got = ((int64_t *)sum->t.data)[0];
        if (got != (int64_t)want)
            return DAMAGED("checkpoint '%s' is damaged: its checksum is 0x%08llx but its contents sum to 0x%08x", path,
                           (unsigned long long)got, want);
        if (format != CKPT_FORMAT)   /* intact, but not ours to read */
            return om_error(OM_INVALID_ARGUMENT, "checkpoint '%s' has format %lld; this ortmod reads formats %d and %d",
                            path, (long long)format, CKPT_FORMAT_NO_CHECKSUM, CKPT_FORMAT);
    } else if (format == CKPT_FORMAT_NO_CHECKSUM) {
        rn_warn(r, "checkpoint '%s' has no checksum (format %d, written by an older ortmod): damage to it cannot be "
                "detected; the next checkpoint saved will have one", path, CKPT_FORMAT_NO_CHECKSUM);
        sum = NULL;
    } else if (format == CKPT_FORMAT) {
        return DAMAGED("checkpoint '%s' is damaged: its checksum record is missing (truncated?)", path);
    } else {
        return DAMAGED("'%s' is not an ortmod checkpoint (or is damaged): no format %d or %d record", path,
                       CKPT_FORMAT_NO_CHECKSUM, CKPT_FORMAT);
    }
    const int n_body = sum ? ne - 1 : ne;   /* records up to meta/end */
    x = n_body ? &e[n_body - 1] : NULL;
    if (!x || strcmp(x->name, "meta/end") != 0 || !is_scalar(x, OM_I64) || ((int64_t *)x->t.data)[0] != n_body - 1)
        return DAMAGED("checkpoint '%s' is truncated", path);
    /* names are unique: two records of one name would leave the second unread */
    for (int i = 0; i < ne; i++)
        for (int j = 0; j < i; j++)
            if (!strcmp(e[i].name, e[j].name))
                return DAMAGED("checkpoint '%s' is damaged: it holds '%s' twice", path, e[i].name);
    /* another model? name the first weight that differs, then compare the fingerprint */
    for (int i = 0; i < ne; i++) {
        if (strncmp(e[i].name, "weight/", 7) != 0) continue;
        const char *wn = e[i].name + 7;
        int found = 0;
        for (int w = 0; w < r->n_weights && !found; w++) {
            if (strcmp(r->w[w].name, wn) != 0) continue;
            found = 1;
            if (!om_shape_equal(&e[i].t, &r->w[w].value) || e[i].t.dtype != OM_F32) {
                char a[128], b[128];
                om_shape_str(&e[i].t, a, sizeof a);
                om_shape_str(&r->w[w].value, b, sizeof b);
                return om_error(OM_INVALID_ARGUMENT,
                                "checkpoint '%s' was written for another model: weight '%s' is %s there but %s in this "
                                "model", path, wn, a, b);
            }
        }
        if (!found)
            return om_error(OM_INVALID_ARGUMENT,
                            "checkpoint '%s' was written for another model: it holds weight '%s', which this model does "
                            "not train", path, wn);
    }
    for (int w = 0; w < r->n_weights; w++) {
        char name[4096];
        snprintf(name, sizeof name, "weight/%s", r->w[w].name);
        if (!find_entry(e, ne, name))
            return om_error(OM_INVALID_ARGUMENT,
                            "checkpoint '%s' was written for another model (or other weights_to_train): it lacks weight "
                            "'%s'", path, r->w[w].name);
        for (int which = 0; which < 2; which++) {
            if (!has_state(r, which)) continue;
            snprintf(name, sizeof name, "%s/%s", which ? "state_v" : "state_m", r->w[w].name);
            OM_TRY(expect_tensor(path, find_entry(e, ne, name), name, OM_F32, om_tensor_numel(&r->w[w].value),
                                 damaged));
        }
    }
    x = find_entry(e, ne, "meta/fingerprint");
    OM_TRY(expect_tensor(path, x, "meta/fingerprint", OM_I64, 1, damaged));
    if ((uint64_t)((int64_t *)x->t.data)[0] != r->fingerprint)
        return om_error(OM_INVALID_ARGUMENT,
                        "checkpoint '%s' was written for another model: the weights match but the graph differs", path);
    x = find_entry(e, ne, "meta/counters");
    OM_TRY(expect_tensor(path, x, "meta/counters", OM_I64, 8, damaged));
    const int64_t *c = x->t.data;
    /* counters index data and schedules: a negative or absurd one (a corrupt or crafted
     * file) would read before the data buffer or overflow the cursor arithmetic */
    static const char *const counter_names[6] = {"step", "update", "data cursor", "optimizer step", "good updates",
                                                 "skipped updates"};
    for (int i = 0; i < 6; i++)
        if (c[i] < 0 || c[i] > RN_MAX_COUNTER)
            return DAMAGED("checkpoint '%s' is corrupt: its %s counter is %lld (expected 0..%lld)", path,
                           counter_names[i], (long long)c[i], (long long)RN_MAX_COUNTER);
    /* and they hang together: an update takes one or more steps, a step one or more samples,
     * the optimizer steps once per update that is not skipped */
    if (c[1] > c[0])
        return DAMAGED("checkpoint '%s' is corrupt: it counts %lld updates in %lld steps", path, (long long)c[1],
                       (long long)c[0]);
    if (c[2] < c[0])
        return DAMAGED("checkpoint '%s' is corrupt: its data cursor (%lld samples) is behind its %lld steps", path,
                       (long long)c[2], (long long)c[0]);
    if (c[3] > c[1] || c[5] > c[1])
        return DAMAGED("checkpoint '%s' is corrupt: %lld optimizer steps and %lld skipped updates in %lld updates",
                       path, (long long)c[3], (long long)c[5], (long long)c[1]);
    if (expect_update >= 0 && c[1] != expect_update)
        return DAMAGED("checkpoint '%s' is corrupt: its update counter is %lld but its directory says %lld", path,
                       (long long)c[1], (long long)expect_update);
    if (c[7] != r->n_weights)
        return DAMAGED("checkpoint '%s' is corrupt: it counts %lld weights but holds %d", path, (long long)c[7],
                       r->n_weights);
    if (c[6] != r->opt) {
        if (c[6] != RN_SGD && c[6] != RN_ADAM && c[6] != RN_LAMB)
            return DAMAGED("checkpoint '%s' is corrupt: its optimizer kind is %lld", path, (long long)c[6]);
        return om_error(OM_INVALID_ARGUMENT, "checkpoint '%s' holds %s optimizer state but the optimizer is %s", path,
                        opt_name((int)c[6]), opt_name(r->opt));
    }
    ckpt_entry *ls = find_entry(e, ne, "meta/loss_scale");
    OM_TRY(expect_tensor(path, ls, "meta/loss_scale", OM_F32, 1, damaged));
    const float scale = ((float *)ls->t.data)[0];
    if (!(scale > 0) || !isfinite(scale))
        return DAMAGED("checkpoint '%s' is corrupt: its loss scale is %g", path, (double)scale);
    return NULL;
}

om_status *rn_checkpoint_load_buffer(om_runner *r, const char *path, const uint8_t *buf, size_t n,
                                     int64_t expect_update, int *damaged) {
    *damaged = 0;
    ckpt_entry *e = NULL;
    int ne = 0, cap = 0;
    rn_record_iter it = {.buf = buf, .n = n, .pos = 0, .path = path, .index = 0};
    Onnx__TensorProto *tp;
    om_status *st = NULL;
    size_t at = 0;
    while (!st && rn_record_next(&it, &tp, &st)) {
        if (om_grow((void **)&e, &cap, ne, sizeof(ckpt_entry))) st = om_error(OM_OUT_OF_MEMORY, "out of memory");
        else {
            e[ne].name = om_strdup(tp->name ? tp->name : "");
            e[ne].offset = at;
            st = e[ne].name ? om_tensor_from_proto(tp, &e[ne].t) : om_error(OM_OUT_OF_MEMORY, "out of memory");
            if (!st) ne++;
            else free(e[ne].name);
        }
        at = it.pos;
        onnx__tensor_proto__free_unpacked(tp, NULL);
    }
    if (st) {
        if (om_status_code(st) != OM_OUT_OF_MEMORY) {
            *damaged = 1;
            st = om_error_context(st, "checkpoint '%s' is damaged", path);
        }
        goto done;
    }
    if ((st = check_checkpoint(r, path, buf, n, e, ne, expect_update, damaged))) goto done;
    /* everything checked: copy in */
    for (int w = 0; w < r->n_weights; w++) {
        char name[4096];
        const size_t nb = om_tensor_nbytes(&r->w[w].value);
        snprintf(name, sizeof name, "weight/%s", r->w[w].name);
        memcpy(r->w[w].value.data, find_entry(e, ne, name)->t.data, nb);
        for (int which = 0; which < 2; which++) {
            if (!has_state(r, which)) continue;
            snprintf(name, sizeof name, "%s/%s", which ? "state_v" : "state_m", r->w[w].name);
            memcpy(which ? r->w[w].v.data : r->w[w].m.data, find_entry(e, ne, name)->t.data, nb);
        }
    }
    const int64_t *c = find_entry(e, ne, "meta/counters")->t.data;
    r->step = c[0];
    r->update = c[1];
    r->cursor = c[2];
    r->opt_step = c[3];
    r->good_updates = c[4];
    r->skipped_total = c[5];
    r->loss_scale = ((float *)find_entry(e, ne, "meta/loss_scale")->t.data)[0];
done:
    for (int i = 0; i < ne; i++) {
        free(e[i].name);
        om_free(e[i].t.data);
    }
    free(e);
    return st;
}

static om_status *load_checkpoint(om_runner *r, const char *path, int64_t update, int *damaged) {
    uint8_t *buf;
    size_t n;
    *damaged = 0;
    om_status *st = rn_read_file(path, &buf, &n);
    if (st) {   /* a checkpoint directory without a readable state.pb: damage too */
        *damaged = om_status_code(st) != OM_OUT_OF_MEMORY;
        return st;
    }
    st = rn_checkpoint_load_buffer(r, path, buf, n, update, damaged);
    free(buf);
    return st;
}

om_status *rn_checkpoint_resume(om_runner *r) {
    const char *dir = r->p.checkpoints_dir;
    if (!dir || !rn_is_dir(dir)) return NULL;
    remove_stale_tmp(dir);
    int64_t *u;
    int n;
    OM_TRY(list_checkpoints(dir, &u, &n));
    om_status **bad = calloc((size_t)n + 1, sizeof *bad);   /* why each newer one was not used */
    if (!bad) { free(u); return om_error(OM_OUT_OF_MEMORY, "out of memory"); }
    om_status *st = NULL;
    char path[4096];
    int i, n_bad = 0;
    for (i = n - 1; i >= 0; i--) {
        snprintf(path, sizeof path, "%s/" CKPT_PREFIX "%lld/state.pb", dir, (long long)u[i]);
        int damaged = 0;
        st = load_checkpoint(r, path, u[i], &damaged);
        if (!st || !damaged) break;   /* loaded, or intact but not for this run: falling back would not help */
        bad[n_bad++] = st;
        st = NULL;
    }
    if (!st && i >= 0) {
        for (int k = 0; k < n_bad; k++)
            rn_warn(r, "%s; resuming from the previous checkpoint, '%s' (update %lld), instead",
                    om_status_message(bad[k]), path, (long long)u[i]);
        r->last_ckpt_update = r->update;
        rn_print(r, "resumed from %s (update %lld, step %lld)", path, (long long)r->update, (long long)r->step);
    } else if (!st && n_bad) {   /* every one damaged */
        size_t len = 1;
        for (int k = 0; k < n_bad; k++) len += strlen(om_status_message(bad[k])) + 4;
        char *all = malloc(len);
        if (all) {
            all[0] = 0;
            for (int k = 1; k < n_bad; k++) {
                strcat(all, k > 1 ? "; " : "");
                strcat(all, om_status_message(bad[k]));
            }
            st = om_error(OM_INVALID_ARGUMENT, "%s; no older checkpoint in '%s' is intact either%s%s%s: remove the "
                          "damaged ones to train from the start", om_status_message(bad[0]), dir, n_bad > 1 ? " (" : "",
                          all, n_bad > 1 ? ")" : "");
            free(all);
        } else {
            st = om_error(OM_OUT_OF_MEMORY, "out of memory");
        }
    }
    for (int k = 0; k < n_bad; k++) om_status_free(bad[k]);
    free(bad);
    free(u);
    return st;
}
