/* runner_monitor.c — what the runner records: a Chrome-trace profile (chrome://tracing,
 * Perfetto) and TensorBoard event files.
 *
 * Event files are written by hand, as TensorFlow's RecordWriter does:
 *   record = uint64 LE length, uint32 masked_crc32c(length), data, uint32 masked_crc32c(data)
 *   masked_crc32c(x) = ((crc >> 15) | (crc << 17)) + 0xa282ead8
 * data is a serialized tensorflow.Event:
 *   Event   { double wall_time = 1; int64 step = 2; string file_version = 3; Summary summary = 5; }
 *   Summary { repeated Value value = 1; }   Value { string tag = 1; float simple_value = 2; }
 * The first record carries file_version "brain.Event:2". */
#include "runner/runner_internal.h"

#include <stdlib.h>
#include <unistd.h>

/* ---- profiler --------------------------------------------------------------------- */

void rn_profiler_begin(rn_profiler *p) {
    p->on = 1;
    p->t0 = rn_now();
}

void rn_profiler_add(rn_profiler *p, const char *name, double t_start, double t_end, int64_t step) {
    if (!p->on || p->n >= 4000000) return;
    if (p->n == p->cap) {
        int64_t cap = p->cap ? p->cap * 2 : 4096;
        rn_trace_event *ne = realloc(p->ev, sizeof(rn_trace_event) * (size_t)cap);
        if (!ne) return;   /* profiling is best effort: drop events rather than fail training */
        p->ev = ne;
        p->cap = cap;
    }
    rn_trace_event *e = &p->ev[p->n++];
    e->name = name;
    e->ts = (t_start - p->t0) * 1e6;
    e->dur = (t_end - t_start) * 1e6;
    e->step = step;
}

om_status *rn_profiler_write(const rn_profiler *p, const char *path) {
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "w");
    if (!f) return om_error(OM_RUNTIME, "cannot write profile '%s': %s", path, strerror(errno));
    fprintf(f, "{\"displayTimeUnit\": \"ms\", \"traceEvents\": [\n");
    fprintf(f, "{\"name\": \"process_name\", \"ph\": \"M\", \"pid\": %ld, \"tid\": 0, \"args\": {\"name\": \"ortmod-train\"}}",
            (long)getpid());
    for (int64_t i = 0; i < p->n; i++) {
        const rn_trace_event *e = &p->ev[i];
        fprintf(f, ",\n{\"name\": \"%s\", \"cat\": \"train\", \"ph\": \"X\", \"ts\": %.3f, \"dur\": %.3f, "
                   "\"pid\": %ld, \"tid\": 0, \"args\": {\"step\": %lld}}",
                e->name, e->ts, e->dur, (long)getpid(), (long long)e->step);
    }
    fprintf(f, "\n]}\n");
    int bad = ferror(f);
    if (fclose(f) != 0 || bad || rename(tmp, path) != 0) {
        unlink(tmp);
        return om_error(OM_RUNTIME, "cannot write profile '%s'", path);
    }
    return NULL;
}

void rn_profiler_free(rn_profiler *p) {
    free(p->ev);
    memset(p, 0, sizeof *p);
}

/* ---- TensorBoard events ----------------------------------------------------------- */

static uint32_t masked_crc(const void *data, size_t n) {
    uint32_t c = rn_crc32c(0, data, n);
    return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

typedef struct pbuf {
    uint8_t b[1024];
    size_t n;
} pbuf;

static void put_byte(pbuf *p, uint8_t v) {
    if (p->n < sizeof p->b) p->b[p->n++] = v;
}
static void put_varint(pbuf *p, uint64_t v) {
    while (v >= 0x80) { put_byte(p, (uint8_t)(v | 0x80)); v >>= 7; }
    put_byte(p, (uint8_t)v);
}
static void put_fixed(pbuf *p, const void *v, int n) {
    for (int i = 0; i < n; i++) put_byte(p, ((const uint8_t *)v)[i]);   /* little-endian host */
}
static void put_bytes(pbuf *p, int field, const void *data, size_t n) {
    put_varint(p, (uint64_t)(field << 3 | 2));
    put_varint(p, n);
    for (size_t i = 0; i < n; i++) put_byte(p, ((const uint8_t *)data)[i]);
}

static void write_record(rn_events *ev, const pbuf *data) {
    uint64_t len = data->n;
    uint32_t lc = masked_crc(&len, 8), dc = masked_crc(data->b, data->n);
    fwrite(&len, 8, 1, ev->f);
    fwrite(&lc, 4, 1, ev->f);
    fwrite(data->b, 1, data->n, ev->f);
    fwrite(&dc, 4, 1, ev->f);
    fflush(ev->f);
}

static void event_head(pbuf *e, int64_t step) {
    double wt = rn_wall_time();
    put_byte(e, 1 << 3 | 1);
    put_fixed(e, &wt, 8);
    put_byte(e, 2 << 3 | 0);
    put_varint(e, (uint64_t)step);
}

om_status *rn_events_open(rn_events *ev, const char *log_dir) {
    memset(ev, 0, sizeof *ev);
    OM_TRY(rn_mkdirs(log_dir));
    char host[256] = "localhost", path[4096];
    gethostname(host, sizeof host - 1);
    snprintf(path, sizeof path, "%s/events.out.tfevents.%lld.%s.%ld.ortmod", log_dir, (long long)rn_wall_time(), host,
             (long)getpid());
    ev->f = fopen(path, "wb");
    if (!ev->f) return om_error(OM_RUNTIME, "cannot create TensorBoard event file '%s': %s", path, strerror(errno));
    ev->path = om_strdup(path);
    pbuf e = {.n = 0};
    event_head(&e, 0);
    static const char version[] = "brain.Event:2";
    put_bytes(&e, 3, version, sizeof version - 1);
    write_record(ev, &e);
    return NULL;
}

void rn_events_scalar(rn_events *ev, const char *tag, int64_t step, double value) {
    if (!ev->f) return;
    pbuf val = {.n = 0}, sum = {.n = 0}, e = {.n = 0};
    size_t tl = strlen(tag);
    put_bytes(&val, 1, tag, tl < 512 ? tl : 512);
    float fv = (float)value;
    put_byte(&val, 2 << 3 | 5);
    put_fixed(&val, &fv, 4);
    put_bytes(&sum, 1, val.b, val.n);
    event_head(&e, step);
    put_bytes(&e, 5, sum.b, sum.n);
    write_record(ev, &e);
}

void rn_events_close(rn_events *ev) {
    if (ev->f) fclose(ev->f);
    free(ev->path);
    memset(ev, 0, sizeof *ev);
}
