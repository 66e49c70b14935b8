/* ortmod_runner.h — the native training runner: trains an ONNX model file with no Python.
 * The engine's second client beside the CPython binding (its model is ONNX Runtime's
 * TrainingRunner: Parameters → constructor → Initialize() → Run()).
 *
 * Worked example: train a classifier from shards, checkpointing as it goes.
 *
 *     om_runner_params p;
 *     om_runner_params_init(&p);                 // documented defaults, below
 *     p.model_path = "mlp.onnx";                 // logits = model(x)
 *     p.train_data_dir = "data/train";           // shards with features "x" and "labels"
 *     p.test_data_dir = "data/test";
 *     p.optimizer = "AdamW";
 *     p.learning_rate = 1e-3f;
 *     p.num_train_steps = 1000;
 *     p.checkpoints_dir = "ckpt";                // resumes from the highest checkpoint there
 *     p.output_dir = "out";                      // out/trained_model.onnx, out/summary.json
 *
 *     om_runner *r = NULL;
 *     om_status *st = om_runner_create(&p, &r);  // validates p (the message names the field)
 *     if (!st) st = om_runner_initialize(r);     // model + loss + backward + optimizer + resume
 *     if (!st) st = om_runner_run(r);            // the training loop, then saves the model
 *     if (st) { fprintf(stderr, "%s\n", om_status_message(st)); om_status_free(st); }
 *     om_runner_free(r);
 *
 * How the training graph is made: the model's ONNX is edited before the engine sees it.
 * The trained float initializers become graph inputs (their values live in runner-owned
 * buffers fed every step), and a loss is appended to `loss_input` (default: the model's
 * first output) against the data feature `label_name` (default "labels"):
 *   OM_LOSS_SOFTMAX_CROSS_ENTROPY  integer labels (N, d..): SoftmaxCrossEntropyLoss, mean;
 *                                  float one-hot labels shaped like the logits:
 *                                  -mean over positions of sum_c(onehot * LogSoftmax(logits))
 *   OM_LOSS_MSE                    ReduceMean((pred - labels)^2)
 *   OM_LOSS_NONE                   loss_input already is the scalar loss
 * The saved model is the original ONNX with the trained values written back into its
 * initializers, so ONNX Runtime's inference session loads it as it loaded the input.
 *
 * Steps: `num_train_steps` counts micro-steps (forward + backward of one batch);
 * the weights update every `gradient_accumulation_steps` of them. Periods (display,
 * evaluation, checkpoint) count weight updates.
 *
 * Data shards: every regular file in a data directory (sorted by name, hidden files
 * skipped) is a sequence of records [uint32 little-endian length][serialized TensorProto].
 * A sample is a run of records, one per feature, each named after the graph input it
 * feeds; a new sample starts where the first feature's name comes again. A tensor's dims
 * are one sample's (the batch dim is added). ortmod.runner.write_shards writes them.
 *
 * Checkpoints: <checkpoints_dir>/checkpoint_<update>/state.pb, written to a temporary
 * directory, fsync'ed and renamed into place. state.pb uses the shard framing; it holds
 * the weights, the optimizer state, the counters, the data position, the loss-scaler
 * state and a fingerprint of the model.
 *
 * Ownership and errors as in ortmod.h: every fallible function returns om_status*
 * (NULL on success; the caller frees it). Nothing here exits the process.
 */
#ifndef ORTMOD_RUNNER_H
#define ORTMOD_RUNNER_H

#include "ortmod.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum om_runner_loss {
    OM_LOSS_SOFTMAX_CROSS_ENTROPY = 0,
    OM_LOSS_MSE = 1,
    OM_LOSS_NONE = 2,
} om_runner_loss;

typedef enum om_lr_warmup_mode {
    OM_WARMUP_NONE = 0,      /* lr constant, no warmup */
    OM_WARMUP_CONSTANT,      /* linear warmup, then constant */
    OM_WARMUP_COSINE,        /* linear warmup, then 0.5 * (1 + cos(pi * progress)) */
    OM_WARMUP_LINEAR,        /* linear warmup, then linear decay to 0 at the last update */
    OM_WARMUP_POLY,          /* linear warmup, then (1 - progress')^power decay to lr_end */
} om_lr_warmup_mode;

/* Parses "None", "Constant", "Cosine", "Linear", "Poly" (any letter case). */
om_status *om_lr_warmup_mode_parse(const char *name, om_lr_warmup_mode *out);
/* The learning-rate multiplier after `update` of `total` updates (0-based). */
float om_lr_schedule(om_lr_warmup_mode mode, float warmup_ratio, float poly_power, int64_t update, int64_t total);

typedef struct om_runner_params {
    /* model and loss */
    const char *model_path;          /* required */
    om_runner_loss loss;             /* default OM_LOSS_SOFTMAX_CROSS_ENTROPY */
    const char *loss_input;          /* NULL: the model's first output */
    const char *label_name;          /* default "labels" */

    /* optimizer: "SGD", "Adam", "AdamW", "Lamb" (any letter case) */
    const char *optimizer;           /* default "Adam" */
    float learning_rate;             /* default 1e-3 */
    float beta1, beta2, epsilon;     /* Adam/Lamb: 0.9, 0.999, 1e-8 (Lamb 1e-6 when left at 0) */
    float weight_decay;              /* default 0 */
    int adam_mode;                   /* om_adam_mode; -1 (default): 0 for Adam, 1 for AdamW */
    int bias_correction;             /* Adam/Lamb: default 1 */
    float momentum;                  /* SGD: default 0 */

    /* learning-rate schedule, evaluated at every weight update */
    om_lr_warmup_mode warmup_mode;   /* default OM_WARMUP_NONE */
    float warmup_ratio;              /* fraction of the updates spent warming up; default 0 */
    float poly_power;                /* OM_WARMUP_POLY: default 1 */

    /* batches and steps */
    int64_t train_batch_size;        /* default 32 */
    int64_t eval_batch_size;         /* default 0: train_batch_size */
    int64_t num_train_steps;         /* micro-steps; default 100; a multiple of the next */
    int64_t gradient_accumulation_steps; /* default 1 */
    int shuffle;                     /* shuffle samples per epoch (seeded); default 0 */

    /* which float initializers train: all (both lists empty), only a list, or all but a list */
    const char *const *weights_to_train;     int n_weights_to_train;
    const char *const *weights_not_to_train; int n_weights_not_to_train;

    /* mixed precision: fp32 master weights, the graph computes in the half type (each node's fp32 math
     * rounded once, as the CUDA kernels do); docs/runner.md */
    int use_mixed_precision;         /* default 0 */
    om_dtype mixed_precision_type;   /* OM_F16 (default) or OM_BF16 */
    float loss_scale;                /* 0 (default): dynamic when fp16, none otherwise; > 0: static */
    float initial_loss_scale;        /* dynamic: default 65536 (2^16) */
    int64_t loss_scale_window;       /* dynamic: good updates before doubling; default 2000 */

    /* global gradient-norm clipping */
    int clip_grad_norm;              /* default 1 */
    float max_grad_norm;             /* default 1.0 */

    /* data */
    const char *train_data_dir;      /* required for run() */
    const char *test_data_dir;       /* NULL: no evaluation */

    /* checkpoints: NULL dir = none */
    const char *checkpoints_dir;
    int64_t checkpoint_period;       /* updates; default 100; must be > 0 */
    int max_num_checkpoints;         /* default 3; must be > 0 */

    int64_t evaluation_period;       /* updates; default 100; must be > 0 */
    int64_t display_loss_steps;      /* updates; default 10; must be > 0 */

    int use_profiler;                /* Chrome trace in output_dir (or log_dir), default 0 */
    const char *log_dir;             /* TensorBoard event file here; NULL: none */
    const char *output_dir;          /* trained_model.onnx, summary.json; NULL: nothing saved */
    uint64_t seed;                   /* default 42: shuffling and the engine's random ops */

    /* messages (step lines, evaluation, summary); NULL: printed to stdout */
    om_log_fn print;
    void *print_user;
    om_log_level engine_log_level;   /* default OM_LOG_WARNING (engine messages go to print) */

    int debug_step_delay_ms;         /* testing aid: sleep after each update; default 0 */
} om_runner_params;

/* Fills p with the defaults documented above. */
void om_runner_params_init(om_runner_params *p);

typedef struct om_runner om_runner;

/* Validates params (copies every string) and returns a runner in *out (om_runner_free).
 * Errors name the field: empty model path or optimizer, an unknown optimizer,
 * num_train_steps not a multiple of gradient_accumulation_steps, both weight lists given,
 * a zero period, a non-positive batch size. */
om_status *om_runner_create(const om_runner_params *params, om_runner **out);

/* Loads the model and the data, adds the loss, builds the backward graph and the
 * optimizer state, sets up the loss scaler and profiler, plans memory (one warm-up
 * forward + backward), and resumes from the highest checkpoint in checkpoints_dir. */
om_status *om_runner_initialize(om_runner *r);

/* The training loop, from where initialize left it to num_train_steps; evaluates every
 * evaluation_period updates and at the end, checkpoints every checkpoint_period updates
 * and at the end, then saves output_dir/trained_model.onnx and output_dir/summary.json. */
om_status *om_runner_run(om_runner *r);

typedef struct om_runner_eval_result {
    double loss;                     /* sample-weighted mean over the test set */
    double accuracy;                 /* softmax cross-entropy only; -1 otherwise */
    int64_t samples;
} om_runner_eval_result;

/* Runs the test set (dropout off) with the current weights. */
om_status *om_runner_evaluate(om_runner *r, om_runner_eval_result *res);

/* Writes a checkpoint of the current state now (checkpoints_dir must be set). */
om_status *om_runner_save_checkpoint(om_runner *r);

/* Writes the model with the current weights as an ONNX file. */
om_status *om_runner_save_model(om_runner *r, const char *path);

typedef struct om_runner_summary {
    int64_t steps, updates, skipped_updates, samples;   /* this process's run */
    int64_t start_update;            /* the update it resumed from (0: fresh) */
    double last_loss;                /* mean loss of the last update */
    double train_seconds;            /* forward/backward/optimizer time of this run */
    double throughput;               /* samples/s over this run */
    double stabilized_throughput;    /* samples/s over the last half of this run's updates */
    double peak_memory_mb;           /* peak resident set size of the process */
    double loss_scale;               /* current loss scale (1 when none) */
    double eval_loss, eval_accuracy; /* last evaluation; NaN / -1 when none */
} om_runner_summary;

void om_runner_get_summary(const om_runner *r, om_runner_summary *s);

void om_runner_free(om_runner *r);

#ifdef __cplusplus
}
#endif
#endif /* ORTMOD_RUNNER_H */
