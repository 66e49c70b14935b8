/* runner_io.c — files, the record framing of shards and checkpoints, crc32c, clocks. */
#include "runner/runner_internal.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

om_status *rn_read_file(const char *path, uint8_t **buf, size_t *n) {
    *buf = NULL;
    *n = 0;
    FILE *f = fopen(path, "rb");
    if (!f) return om_error(OM_INVALID_ARGUMENT, "cannot open '%s': %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fileno(f), &sb) != 0 || !S_ISREG(sb.st_mode)) {
        fclose(f);
        return om_error(OM_INVALID_ARGUMENT, "'%s' is not a regular file", path);
    }
    size_t size = (size_t)sb.st_size;
    uint8_t *b = malloc(size ? size : 1);
    if (!b) {
        fclose(f);
        return om_error(OM_OUT_OF_MEMORY, "out of memory reading '%s' (%zu bytes)", path, size);
    }
    size_t got = size ? fread(b, 1, size, f) : 0;
    int bad = ferror(f);
    fclose(f);
    if (bad || got != size) {
        free(b);
        return om_error(OM_RUNTIME, "cannot read '%s': short read", path);
    }
    *buf = b;
    *n = size;
    return NULL;
}

int rn_is_dir(const char *path) {
    struct stat sb;
    return path && stat(path, &sb) == 0 && S_ISDIR(sb.st_mode);
}

om_status *rn_mkdirs(const char *path) {
    if (!path || !*path) return om_error(OM_INVALID_ARGUMENT, "empty directory path");
    char *p = om_strdup(path);
    if (!p) return om_error(OM_OUT_OF_MEMORY, "out of memory");
    for (char *s = p + 1;; s++) {
        if (*s == '/' || *s == 0) {
            char c = *s;
            *s = 0;
            if (mkdir(p, 0777) != 0 && errno != EEXIST) {
                om_status *st = om_error(OM_RUNTIME, "cannot create directory '%s': %s", p, strerror(errno));
                free(p);
                return st;
            }
            *s = c;
            if (!c) break;
        }
    }
    free(p);
    if (!rn_is_dir(path)) return om_error(OM_RUNTIME, "'%s' exists and is not a directory", path);
    return NULL;
}

om_status *rn_fsync_dir(const char *dir) {
    int fd = open(dir, O_RDONLY | O_DIRECTORY);
    if (fd < 0) return om_error(OM_RUNTIME, "cannot open directory '%s': %s", dir, strerror(errno));
    int rc = fsync(fd);
    int e = errno;
    close(fd);
    if (rc != 0 && e != EINVAL) return om_error(OM_RUNTIME, "cannot fsync directory '%s': %s", dir, strerror(e));
    return NULL;
}

static void dir_of(const char *path, char *out, size_t n) {
    snprintf(out, n, "%s", path);
    char *s = strrchr(out, '/');
    if (!s) snprintf(out, n, ".");
    else if (s == out) out[1] = 0;
    else *s = 0;
}

om_status *rn_write_file_atomic(const char *path, const void *buf, size_t n) {
    char tmp[4096], dir[4096];
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid());
    FILE *f = fopen(tmp, "wb");
    if (!f) return om_error(OM_RUNTIME, "cannot create '%s': %s", tmp, strerror(errno));
    int ok = fwrite(buf, 1, n, f) == n && fflush(f) == 0 && fsync(fileno(f)) == 0;
    int e = errno;
    ok = (fclose(f) == 0) && ok;
    if (!ok || rename(tmp, path) != 0) {
        if (ok) e = errno;
        unlink(tmp);
        return om_error(OM_RUNTIME, "cannot write '%s': %s", path, strerror(e));
    }
    dir_of(path, dir, sizeof dir);
    return rn_fsync_dir(dir);
}

void rn_remove_dir(const char *path) {
    DIR *d = opendir(path);
    if (d) {
        struct dirent *de;
        char p[4096];
        while ((de = readdir(d))) {
            if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, "..")) continue;
            snprintf(p, sizeof p, "%s/%s", path, de->d_name);
            unlink(p);
        }
        closedir(d);
    }
    rmdir(path);
}

om_status *rn_write_tensor_record(FILE *f, const char *path, const char *name, const om_tensor *t, uint32_t *crc) {
    Onnx__TensorProto tp = ONNX__TENSOR_PROTO__INIT;
    int64_t dims[OM_MAX_RANK];
    for (int i = 0; i < t->rank; i++) dims[i] = t->dims[i];
    tp.name = (char *)name;
    tp.has_data_type = 1;
    tp.data_type = (int32_t)t->dtype;
    tp.n_dims = (size_t)t->rank;
    tp.dims = dims;
    tp.has_raw_data = 1;
    tp.raw_data.len = om_tensor_nbytes(t);
    tp.raw_data.data = t->data;
    size_t len = onnx__tensor_proto__get_packed_size(&tp);
    if (len > 0xffffffffu) return om_error(OM_INVALID_ARGUMENT, "tensor '%s' is too large for a record", name);
    uint8_t *buf = malloc(len + 4);
    if (!buf) return om_error(OM_OUT_OF_MEMORY, "out of memory");
    uint32_t l32 = (uint32_t)len;
    buf[0] = l32 & 0xff; buf[1] = (l32 >> 8) & 0xff; buf[2] = (l32 >> 16) & 0xff; buf[3] = l32 >> 24;
    onnx__tensor_proto__pack(&tp, buf + 4);
    int ok = fwrite(buf, 1, len + 4, f) == len + 4;
    if (crc) *crc = rn_crc32c(*crc, buf, len + 4);
    free(buf);
    if (!ok) return om_error(OM_RUNTIME, "cannot write '%s': %s", path, strerror(errno));
    return NULL;
}

int rn_record_next(rn_record_iter *it, Onnx__TensorProto **tp, om_status **err) {
    *tp = NULL;
    *err = NULL;
    if (it->pos == it->n) return 0;
    if (it->n - it->pos < 4) {
        *err = om_error(OM_INVALID_ARGUMENT, "'%s' is truncated: %zu stray bytes at offset %zu after record %lld",
                        it->path, it->n - it->pos, it->pos, (long long)it->index);
        return 0;
    }
    const uint8_t *b = it->buf + it->pos;
    size_t len = (size_t)b[0] | (size_t)b[1] << 8 | (size_t)b[2] << 16 | (size_t)b[3] << 24;
    if (len > it->n - it->pos - 4) {
        *err = om_error(OM_INVALID_ARGUMENT,
                        "'%s' is truncated or not a shard file: record %lld at offset %zu says %zu bytes but %zu remain",
                        it->path, (long long)it->index, it->pos, len, it->n - it->pos - 4);
        return 0;
    }
    Onnx__TensorProto *t = onnx__tensor_proto__unpack(NULL, len, b + 4);
    if (!t) {
        *err = om_error(OM_INVALID_ARGUMENT, "'%s': record %lld at offset %zu is not a TensorProto", it->path,
                        (long long)it->index, it->pos);
        return 0;
    }
    it->pos += 4 + len;
    it->index++;
    *tp = t;
    return 1;
}

/* CRC-32C (Castagnoli), reflected, as TFRecord uses it. */
uint32_t rn_crc32c(uint32_t crc, const void *data, size_t n) {
    static uint32_t table[256];
    static int ready;
    if (!ready) {
        for (uint32_t i = 0; i < 256; i++) {
            uint32_t c = i;
            for (int k = 0; k < 8; k++) c = c & 1 ? (c >> 1) ^ 0x82F63B78u : c >> 1;
            table[i] = c;
        }
        ready = 1;
    }
    const uint8_t *p = data;
    crc = ~crc;
    for (size_t i = 0; i < n; i++) crc = table[(crc ^ p[i]) & 0xff] ^ (crc >> 8);
    return ~crc;
}

double rn_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

double rn_wall_time(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

void rn_json_string(FILE *f, const char *s) {
    fputc('"', f);
    for (; s && *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') fprintf(f, "\\%c", c);
        else if (c < 0x20) fprintf(f, "\\u%04x", c);
        else fputc(c, f);
    }
    fputc('"', f);
}
