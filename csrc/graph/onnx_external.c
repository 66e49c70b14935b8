/* onnx_external.c — reading an ONNX file together with its external data.
 *
 * ONNX lets a tensor keep its bytes in another file beside the model (TensorProto
 * data_location EXTERNAL, with "location", "offset" and "length" entries); torch.onnx.export
 * writes models that way by default. om_onnx_read_model_file reads the model and every such
 * tensor's bytes into raw_data, so the importer and everything after it see one self-contained
 * ModelProto and never touch the file system.
 *
 * The names come from the model, and a model may come from anyone: a location must be a
 * relative path that stays inside the model's directory — no absolute path, no '..'
 * component, no symlink that resolves outside it — and offset and length must lie inside the
 * file they name. Each refusal says which tensor and why.
 */
#include "graph/ir.h"
#include "onnx.pb-c.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Reads all of an open regular file; *buf is om_alloc'd (at least one byte). */
static om_status *read_all(int fd, const char *path, void **buf, size_t *n) {
    struct stat sb;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) return om_error(OM_INVALID_ARGUMENT, "'%s' is not a regular file", path);
    size_t size = (size_t)sb.st_size;
    uint8_t *b = om_alloc(size ? size : 1);
    if (!b) return om_error(OM_OUT_OF_MEMORY, "out of memory reading '%s' (%zu bytes)", path, size);
    size_t got = 0;
    while (got < size) {
        ssize_t r = pread(fd, b + got, size - got, (off_t)got);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) {
            om_free(b);
            return om_error(OM_RUNTIME, "cannot read '%s': %s", path, r < 0 ? strerror(errno) : "short read");
        }
        got += (size_t)r;
    }
    *buf = b;
    *n = size;
    return NULL;
}

/* A decimal that ONNX's writers put in "offset"/"length": digits only, no sign, fits int64. */
static int parse_size(const char *s, uint64_t *out) {
    if (!s || !*s) return -1;
    uint64_t v = 0;
    for (; *s; s++) {
        if (*s < '0' || *s > '9') return -1;
        if (v > ((uint64_t)INT64_MAX - (uint64_t)(*s - '0')) / 10) return -1;
        v = v * 10 + (uint64_t)(*s - '0');
    }
    *out = v;
    return 0;
}

/* A location stays inside the model's directory by its spelling (relative, no '..') and by
 * where it resolves (realpath under the directory's realpath: a symlink may not lead out). */
static om_status *open_location(const char *dir_real, const char *dir, const char *loc, const char *name, int *fd) {
    if (!*loc) return om_error(OM_INVALID_MODEL, "tensor '%s': its external data location is empty", name);
    if (loc[0] == '/')
        return om_error(OM_INVALID_MODEL, "tensor '%s': external data location '%s' is an absolute path; "
                        "ortmod reads external data only from the model's directory", name, loc);
    for (const char *p = loc; *p;) {
        const char *end = strchr(p, '/');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        if (len == 2 && p[0] == '.' && p[1] == '.')
            return om_error(OM_INVALID_MODEL, "tensor '%s': external data location '%s' leaves the model's "
                            "directory ('..')", name, loc);
        p += len + (end != NULL);
    }
    char joined[PATH_MAX], real[PATH_MAX];
    if ((size_t)snprintf(joined, sizeof joined, "%s/%s", dir, loc) >= sizeof joined)
        return om_error(OM_INVALID_MODEL, "tensor '%s': external data location '%s' is too long", name, loc);
    if (!realpath(joined, real))
        return om_error(OM_INVALID_MODEL, "tensor '%s': cannot open its external data '%s': %s", name, joined,
                        strerror(errno));
    size_t dl = strlen(dir_real);
    int inside = strncmp(real, dir_real, dl) == 0 && (real[dl] == '/' || (dl == 1 && dir_real[0] == '/'));
    if (!inside)
        return om_error(OM_INVALID_MODEL, "tensor '%s': external data '%s' resolves to '%s', outside the model's "
                        "directory '%s'", name, loc, real, dir_real);
    *fd = open(real, O_RDONLY | O_CLOEXEC);
    if (*fd < 0)
        return om_error(OM_INVALID_MODEL, "tensor '%s': cannot open its external data '%s': %s", name, joined,
                        strerror(errno));
    return NULL;
}

/* Reads tp's external bytes into raw_data and makes it an ordinary tensor. */
static om_status *inline_tensor(Onnx__TensorProto *tp, const char *dir_real, const char *dir) {
    const char *name = tp->name ? tp->name : "";
    const char *loc = NULL, *off_s = NULL, *len_s = NULL;
    for (size_t i = 0; i < tp->n_external_data; i++) {
        const Onnx__StringStringEntryProto *e = tp->external_data[i];
        const char *k = e->key ? e->key : "";
        if (!strcmp(k, "location")) loc = e->value;
        else if (!strcmp(k, "offset")) off_s = e->value;
        else if (!strcmp(k, "length")) len_s = e->value;
        else if (strcmp(k, "checksum") != 0)   /* (a SHA-1 that no writer fills and nothing here checks) */
            return om_error(OM_INVALID_MODEL, "tensor '%s': external data key '%s' is not one ortmod knows "
                            "(location, offset, length, checksum)", name, k);
    }
    if (!loc) return om_error(OM_INVALID_MODEL, "tensor '%s' uses external data but names no location", name);
    uint64_t offset = 0, length = 0;
    if (off_s && parse_size(off_s, &offset))
        return om_error(OM_INVALID_MODEL, "tensor '%s': external data offset '%s' is not a size", name, off_s);
    if (len_s && parse_size(len_s, &length))
        return om_error(OM_INVALID_MODEL, "tensor '%s': external data length '%s' is not a size", name, len_s);
    if (tp->has_raw_data && tp->raw_data.len)
        return om_error(OM_INVALID_MODEL, "tensor '%s' holds raw data and names external data too", name);

    int fd;
    OM_TRY(open_location(dir_real, dir, loc, name, &fd));
    struct stat sb;
    om_status *st = NULL;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        st = om_error(OM_INVALID_MODEL, "tensor '%s': external data '%s' is not a regular file", name, loc);
        goto done;
    }
    uint64_t size = (uint64_t)sb.st_size;
    if (!len_s) length = offset <= size ? size - offset : 0;
    if (offset > size || length > size - offset) {
        st = om_error(OM_INVALID_MODEL, "tensor '%s': external data '%s' bytes %llu..%llu lie past its end "
                      "(%llu bytes)", name, loc, (unsigned long long)offset,
                      (unsigned long long)(offset + length), (unsigned long long)size);
        goto done;
    }
    /* protobuf-c frees raw_data with the allocator that unpacked the message: malloc's */
    uint8_t *b = malloc(length ? length : 1);
    if (!b) { st = om_error(OM_OUT_OF_MEMORY, "out of memory reading external data of '%s'", name); goto done; }
    for (uint64_t got = 0; got < length;) {
        ssize_t r = pread(fd, b + got, length - got, (off_t)(offset + got));
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) {
            free(b);
            st = om_error(OM_RUNTIME, "tensor '%s': cannot read external data '%s': %s", name, loc,
                          r < 0 ? strerror(errno) : "short read");
            goto done;
        }
        got += (uint64_t)r;
    }
    free(tp->raw_data.data);
    tp->raw_data.data = b;
    tp->raw_data.len = length;
    tp->has_raw_data = 1;
    for (size_t i = 0; i < tp->n_external_data; i++)
        onnx__string_string_entry_proto__free_unpacked(tp->external_data[i], NULL);
    tp->n_external_data = 0;
    tp->data_location = ONNX__TENSOR_PROTO__DATA_LOCATION__DEFAULT;
    /* (the length is checked against the dims by the importer, as for any raw data) */
done:
    close(fd);
    return st;
}

static int is_external(const Onnx__TensorProto *tp) {
    return tp && tp->data_location == ONNX__TENSOR_PROTO__DATA_LOCATION__EXTERNAL;
}

/* Every tensor of the graph that can name external data: initializers and tensor attributes
 * (a Constant's value). Subgraphs are left: no op ortmod runs has one. fn 0 counts. */
static om_status *each_tensor(Onnx__GraphProto *g, int *count, const char *dir_real, const char *dir) {
    for (size_t i = 0; i < g->n_initializer; i++)
        if (is_external(g->initializer[i])) {
            ++*count;
            if (dir_real) OM_TRY(om_error_context(inline_tensor(g->initializer[i], dir_real, dir), "initializer %zu", i));
        }
    for (size_t k = 0; k < g->n_node; k++)
        for (size_t a = 0; a < g->node[k]->n_attribute; a++) {
            Onnx__AttributeProto *ap = g->node[k]->attribute[a];
            Onnx__TensorProto **ts = ap->t ? &ap->t : ap->tensors;
            size_t nt = ap->t ? 1 : ap->n_tensors;
            for (size_t j = 0; j < nt; j++)
                if (is_external(ts[j])) {
                    ++*count;
                    if (dir_real)
                        OM_TRY(om_error_context(inline_tensor(ts[j], dir_real, dir), "node '%s'",
                                                g->node[k]->name ? g->node[k]->name : ""));
                }
        }
    return NULL;
}

om_status *om_onnx_read_model_file(const char *path, void **bytes, size_t *n) {
    *bytes = NULL;
    *n = 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return om_error(OM_INVALID_ARGUMENT, "cannot open '%s': %s", path, strerror(errno));
    void *buf = NULL;
    size_t len = 0;
    om_status *st = read_all(fd, path, &buf, &len);
    close(fd);
    if (st) return st;
    Onnx__ModelProto *mp = len ? onnx__model_proto__unpack(NULL, len, buf) : NULL;
    int count = 0;
    if (mp && mp->graph) st = each_tensor(mp->graph, &count, NULL, NULL);
    if (!mp || !count) {   /* not ONNX (the importer says so, with the same bytes) or self-contained */
        if (mp) onnx__model_proto__free_unpacked(mp, NULL);
        *bytes = buf, *n = len;
        return NULL;
    }
    om_free(buf);
    char dir[PATH_MAX], dir_real[PATH_MAX];
    const char *slash = strrchr(path, '/');
    if (!slash) snprintf(dir, sizeof dir, ".");
    else if ((size_t)(slash - path) >= sizeof dir) st = om_error(OM_INVALID_ARGUMENT, "path '%s' is too long", path);
    else snprintf(dir, sizeof dir, "%.*s", slash == path ? 1 : (int)(slash - path), path);
    if (!st && !realpath(dir, dir_real))
        st = om_error(OM_INVALID_ARGUMENT, "cannot resolve the directory of '%s': %s", path, strerror(errno));
    if (!st) st = each_tensor(mp->graph, &count, dir_real, dir);
    if (!st) {
        len = onnx__model_proto__get_packed_size(mp);
        buf = om_alloc(len ? len : 1);
        if (!buf) st = om_error(OM_OUT_OF_MEMORY, "out of memory packing '%s' (%zu bytes)", path, len);
        else onnx__model_proto__pack(mp, buf), *bytes = buf, *n = len;
    }
    onnx__model_proto__free_unpacked(mp, NULL);
    return st ? om_error_context(st, "model '%s'", path) : NULL;
}
