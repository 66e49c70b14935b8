/* fuzz_checkpoint.c — libFuzzer target: runner checkpoints and data shards, the files a
 * training run reads back from disk.
 *
 * The first byte picks what the rest is:
 *   0  a checkpoint (state.pb), checked and loaded into a runner of the model in
 *      $FUZZ_RUNNER_DIR (model.onnx, train/), then trained for one update when it loads;
 *   1  the same, after its checksum record is set to the CRC of what precedes it, so that
 *      mutations reach the header checks behind the checksum;
 *   2  a data shard, loaded, then batched at a cursor taken from its last bytes.
 * An error status is the expected answer; a crash, a sanitizer report or a leak is a finding.
 * Built and run by `make fuzz` (tests/fuzz/fuzz.mk), which writes $FUZZ_RUNNER_DIR. */
#include "graph/onnx_tensor.h"
#include "runner/runner_internal.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static om_runner *runner;

static void quiet(void *user, om_log_level level, const char *msg) {}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    const char *dir = getenv("FUZZ_RUNNER_DIR");
    if (!dir) {
        fprintf(stderr, "fuzz_checkpoint: set FUZZ_RUNNER_DIR to a directory with model.onnx and train/\n");
        return 1;
    }
    static char model[4096], train[4096];
    snprintf(model, sizeof model, "%s/model.onnx", dir);
    snprintf(train, sizeof train, "%s/train", dir);
    om_runner_params p;
    om_runner_params_init(&p);
    p.model_path = model;
    p.train_data_dir = train;
    p.train_batch_size = 4;
    p.num_train_steps = 1;
    p.optimizer = getenv("FUZZ_OPTIMIZER") ? getenv("FUZZ_OPTIMIZER") : "AdamW";
    p.print = quiet;
    om_status *st = om_runner_create(&p, &runner);
    if (!st) st = om_runner_initialize(runner);
    if (st) {
        fprintf(stderr, "fuzz_checkpoint: %s\n", om_status_message(st));
        exit(1);
    }
    return 0;
}

/* buf with its last record, when it is meta/checksum, re-packed holding the CRC-32C of the
 * bytes before it. Returns a malloc'd copy (*n_out), or NULL to use buf as it is. */
static uint8_t *fix_checksum(const uint8_t *buf, size_t n, size_t *n_out) {
    rn_record_iter it = {.buf = buf, .n = n, .path = "fuzz"};
    Onnx__TensorProto *tp, *last = NULL;
    om_status *st = NULL;
    size_t last_at = 0, at = 0;
    while (rn_record_next(&it, &tp, &st)) {
        if (last) onnx__tensor_proto__free_unpacked(last, NULL);
        last = tp;
        last_at = at;
        at = it.pos;
    }
    om_status_free(st);
    uint8_t *out = NULL;
    if (last && last->name && !strcmp(last->name, "meta/checksum")) {
        int64_t crc = rn_crc32c(0, buf, last_at);
        const ProtobufCBinaryData raw = last->raw_data;   /* put back before the free */
        last->has_raw_data = 1;
        last->raw_data.data = (uint8_t *)&crc;
        last->raw_data.len = sizeof crc;
        last->n_int64_data = 0;
        size_t len = onnx__tensor_proto__get_packed_size(last);
        out = malloc(last_at + 4 + len);
        if (out) {
            memcpy(out, buf, last_at);
            out[last_at] = len & 0xff; out[last_at + 1] = (len >> 8) & 0xff;
            out[last_at + 2] = (len >> 16) & 0xff; out[last_at + 3] = (len >> 24) & 0xff;
            onnx__tensor_proto__pack(last, out + last_at + 4);
            *n_out = last_at + 4 + len;
        }
        last->raw_data = raw;
    }
    if (last) onnx__tensor_proto__free_unpacked(last, NULL);
    return out;
}

/* FUZZ_VERBOSE=1: one line per input, what it got (tests/test_fuzz_corpus.py reads them) */
static void report(const char *what, om_status *st) {
    if (getenv("FUZZ_VERBOSE")) printf("%s: %s\n", what, st ? om_status_message(st) : "ok");
}

static void checkpoint(const uint8_t *buf, size_t n) {
    int damaged;
    om_status *st = rn_checkpoint_load_buffer(runner, "fuzz/checkpoint_7/state.pb", buf, n, -1, &damaged);
    report(damaged ? "checkpoint (damaged)" : "checkpoint", st);
    if (!st && runner->step < RN_MAX_COUNTER - 1) {
        /* it loaded: train one update from where it says */
        runner->p.num_train_steps = runner->step + 1;
        st = om_runner_run(runner);
        report("train", st);
    }
    om_status_free(st);
}

static void shard(const uint8_t *buf, size_t n) {
    rn_dataset ds;
    memset(&ds, 0, sizeof ds);
    ds.perm_epoch = -1;
    ds.shuffle = n & 1;
    ds.seed = 7;
    ds.dir = om_strdup("fuzz");
    om_status *st = rn_dataset_add_shard(&ds, "fuzz/shard_0.pb", "shard_0.pb", buf, n);
    report("shard", st);
    if (!st && ds.n_samples > 0 && ds.n_features > 0) {
        int64_t cursor = 0;
        memcpy(&cursor, buf + (n >= 8 ? n - 8 : 0), n >= 8 ? 8 : 0);
        void *bufs[256] = {0};
        int ok = 1;
        for (int k = 0; k < ds.n_features && ok; k++) ok = (bufs[k] = malloc(ds.f[k].sample_bytes * 3 + 1)) != NULL;
        if (ok) st = rn_dataset_batch(&ds, cursor, 3, bufs);
        for (int k = 0; k < ds.n_features; k++) free(bufs[k]);
    }
    om_status_free(st);
    rn_dataset_free(&ds);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    const uint8_t mode = data[0] % 3;
    data++, size--;
    if (mode == 2) {
        shard(data, size);
    } else if (mode == 1) {
        size_t n = 0;
        uint8_t *fixed = fix_checksum(data, size, &n);
        checkpoint(fixed ? fixed : data, fixed ? n : size);
        free(fixed);
    } else {
        checkpoint(data, size);
    }
    return 0;
}
