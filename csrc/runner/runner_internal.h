/* runner_internal.h — what the runner's files share (not installed; the API is ortmod_runner.h). */
#ifndef OM_RUNNER_INTERNAL_H
#define OM_RUNNER_INTERNAL_H

#include "core/core.h"
#include "onnx.pb-c.h"
#include "ortmod_optim.h"
#include "ortmod_runner.h"

#include <errno.h>
#include <stdio.h>

/* The largest step, update or sample count the runner takes (from its parameters or from a
 * checkpoint): twice it still fits an int64_t, so cursor + batch never overflows. */
#define RN_MAX_COUNTER ((int64_t)1 << 61)

/* ---- files and records (runner_io.c) ------------------------------------------------ */

/* Reads a whole file into a malloc'd buffer (*buf, caller frees). */
om_status *rn_read_file(const char *path, uint8_t **buf, size_t *n);
/* mkdir -p */
om_status *rn_mkdirs(const char *path);
/* Writes buf to path atomically: path.tmp.<pid>, fsync, rename, fsync of the directory. */
om_status *rn_write_file_atomic(const char *path, const void *buf, size_t n);
om_status *rn_fsync_dir(const char *dir);
int rn_is_dir(const char *path);
/* Removes a directory and the regular files in it (one level). */
void rn_remove_dir(const char *path);

/* One record of the shard / checkpoint framing: [uint32 LE length][TensorProto]. When crc
 * is not NULL, the CRC-32C of the bytes written is folded into it. */
om_status *rn_write_tensor_record(FILE *f, const char *path, const char *name, const om_tensor *t, uint32_t *crc);

/* Iterates the records of buf: returns 1 and the next TensorProto (unpacked; caller frees
 * with onnx__tensor_proto__free_unpacked), 0 at the end, or sets *err. */
typedef struct rn_record_iter {
    const uint8_t *buf;
    size_t n, pos;
    const char *path;
    int64_t index;
} rn_record_iter;
int rn_record_next(rn_record_iter *it, Onnx__TensorProto **tp, om_status **err);

uint32_t rn_crc32c(uint32_t crc, const void *data, size_t n);
double rn_now(void);                 /* monotonic seconds */
double rn_wall_time(void);           /* seconds since the epoch */
void rn_json_string(FILE *f, const char *s);

/* ---- data (runner_data.c) ----------------------------------------------------------- */

typedef struct rn_feature {
    char *name;
    om_dtype dtype;
    int rank;                        /* of one sample */
    int64_t dims[OM_MAX_RANK];
    size_t sample_bytes;
    uint8_t *data;                   /* n_samples * sample_bytes */
    size_t cap;
} rn_feature;

typedef struct rn_dataset {
    char *dir;
    int n_features;
    rn_feature *f;
    int64_t n_samples;
    int n_shards;
    int shuffle;
    uint64_t seed;
    int64_t *perm;                   /* order of the epoch perm_epoch (shuffle only) */
    int64_t perm_epoch;
} rn_dataset;

om_status *rn_dataset_load(const char *dir, int shuffle, uint64_t seed, rn_dataset *ds);
/* Adds the samples of one shard held in buf (read from path, file name fname) to ds. */
om_status *rn_dataset_add_shard(rn_dataset *ds, const char *path, const char *fname, const uint8_t *buf, size_t n);
void rn_dataset_free(rn_dataset *ds);
int rn_dataset_find(const rn_dataset *ds, const char *name);
/* Copies `count` samples starting at global position `start` (wrapping around the data,
 * epoch after epoch) into bufs[feature] (count * sample_bytes each). */
om_status *rn_dataset_batch(rn_dataset *ds, int64_t start, int64_t count, void *const *bufs);
/* Copies samples [start, start + count) of the file order (no shuffle, no wrap). */
void rn_dataset_slice(const rn_dataset *ds, int64_t start, int64_t count, void *const *bufs);

/* ---- optimizers and schedules (runner_optim.c) -------------------------------------- */

typedef enum rn_optimizer { RN_SGD, RN_ADAM, RN_LAMB } rn_optimizer;

om_status *rn_optimizer_parse(const char *name, rn_optimizer *opt, int *default_adam_mode);
om_status *rn_sgd_step(int n, om_tensor *params, const om_tensor *grads, om_tensor *momentum_buf, float lr,
                       float momentum, float weight_decay);
om_status *rn_lamb_step(int n, om_tensor *params, const om_tensor *grads, om_tensor *m, om_tensor *v, float lr,
                        float beta1, float beta2, float eps, float weight_decay, int bias_correction, int64_t step);

/* ---- monitoring (runner_monitor.c) -------------------------------------------------- */

typedef struct rn_trace_event {
    const char *name;                /* a string literal */
    double ts, dur;                  /* microseconds since the profiler started */
    int64_t step;
} rn_trace_event;

typedef struct rn_profiler {
    int on;
    double t0;
    rn_trace_event *ev;
    int64_t n, cap;
} rn_profiler;

void rn_profiler_begin(rn_profiler *p);
void rn_profiler_add(rn_profiler *p, const char *name, double t_start, double t_end, int64_t step);
om_status *rn_profiler_write(const rn_profiler *p, const char *path);
void rn_profiler_free(rn_profiler *p);

/* TensorBoard: TFRecord-framed Event protos with scalar summaries. */
typedef struct rn_events {
    FILE *f;
    char *path;
} rn_events;

om_status *rn_events_open(rn_events *ev, const char *log_dir);
void rn_events_scalar(rn_events *ev, const char *tag, int64_t step, double value);
void rn_events_close(rn_events *ev);

/* ---- the runner (runner.c, runner_model.c, runner_ckpt.c) ---------------------------- */

typedef struct rn_weight {
    char *name;
    int init_index;                  /* in the original graph's initializer list */
    om_tensor value;                 /* runner-owned fp32 data, fed every step */
    om_tensor grad;                  /* accumulated over the micro-steps of one update */
    om_tensor m, v;                  /* optimizer state (Adam/Lamb: moments; SGD: m = momentum) */
} rn_weight;

typedef enum rn_feed_kind { RN_FEED_WEIGHT, RN_FEED_FEATURE } rn_feed_kind;

struct om_runner {
    om_runner_params p;              /* strings below are the runner's own copies */
    char **wt, **wnt;

    rn_optimizer opt;
    int adam_mode;

    /* model */
    uint8_t *model_bytes;
    size_t model_len;
    Onnx__ModelProto *mp;            /* the original model, kept for saving */
    char *loss_input;                /* resolved */
    int n_weights;
    rn_weight *w;
    uint64_t fingerprint;
    om_engine *eng;
    int n_feeds;                     /* = engine inputs */
    rn_feed_kind *feed_kind;
    int *feed_index;                 /* weight index or feature index */
    om_tensor *feeds;
    om_tensor *grads;                /* per engine input, from backward */
    int out_pred;                    /* engine output holding the predictions; -1 none */
    int label_feature;               /* in the train set; -1 when the loss takes none */
    int onehot;

    /* data */
    rn_dataset train, test;
    int have_test;
    void **batch_bufs;               /* per train feature: train_batch_size samples */
    void **eval_bufs;                /* per test feature: eval_batch_size samples */

    /* progress (checkpointed) */
    int64_t step, update, cursor, opt_step;
    float loss_scale;
    int dynamic_scale;
    int64_t good_updates, skipped_total;

    /* this run */
    int initialized;
    int64_t start_update, run_steps, run_updates, run_skipped, run_samples;
    double run_seconds, last_loss, last_grad_norm;
    double *update_secs;             /* per update of this run (stabilized throughput) */
    int64_t n_update_secs, cap_update_secs;
    double eval_loss, eval_accuracy;
    int64_t last_ckpt_update;
    rn_profiler prof;
    rn_events events;
};

/* runner_log.c. A progress line: to params.print (OM_LOG_INFO) when set, else stdout. */
void rn_print(const om_runner *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* A warning: to params.print (OM_LOG_WARNING) when set, else "ortmod-train: warning: ..." on stderr. */
void rn_warn(const om_runner *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* runner_model.c */
om_status *rn_model_load(om_runner *r);          /* reads + unpacks the model, picks the weights */
om_status *rn_model_training_bytes(om_runner *r, om_dtype label_dtype, int label_rank, const int64_t *label_dims,
                                   void **bytes, size_t *n);
om_status *rn_model_check_feature(const om_runner *r, const rn_dataset *ds, int k, const char *dir);
om_status *rn_model_save(om_runner *r, const char *path);

/* runner_ckpt.c */
om_status *rn_checkpoint_save(om_runner *r);
/* Loads the highest checkpoint that is intact; a damaged one (checksum, truncation, a
 * header out of range) is named on stderr and the one before it is tried. */
om_status *rn_checkpoint_resume(om_runner *r);
/* Checks and loads one checkpoint held in buf (read from path, whose directory says it is
 * update expect_update, or -1: not known). *damaged is set when the error is damage to the
 * file (resume may then fall back to an older one), cleared when the file is intact but does
 * not fit this run (another model, another optimizer). r is changed only on success. */
om_status *rn_checkpoint_load_buffer(om_runner *r, const char *path, const uint8_t *buf, size_t n,
                                     int64_t expect_update, int *damaged);
#endif
