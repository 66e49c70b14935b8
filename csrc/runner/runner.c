/* runner.c — the native training runner: parameters, initialize, the training loop,
 * evaluation and the run's summary. See ortmod_runner.h for the contract. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "runner/runner_internal.h"

#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <time.h>

void om_runner_params_init(om_runner_params *p) {
    memset(p, 0, sizeof *p);
    p->loss = OM_LOSS_SOFTMAX_CROSS_ENTROPY;
    p->label_name = "labels";
    p->optimizer = "Adam";
    p->learning_rate = 1e-3f;
    p->beta1 = 0.9f;
    p->beta2 = 0.999f;
    p->epsilon = 1e-8f;
    p->adam_mode = -1;
    p->bias_correction = 1;
    p->warmup_mode = OM_WARMUP_NONE;
    p->poly_power = 1.0f;
    p->train_batch_size = 32;
    p->num_train_steps = 100;
    p->gradient_accumulation_steps = 1;
    p->mixed_precision_type = OM_F16;
    p->initial_loss_scale = 65536.0f;
    p->loss_scale_window = 2000;
    p->clip_grad_norm = 1;
    p->max_grad_norm = 1.0f;
    p->checkpoint_period = 100;
    p->max_num_checkpoints = 3;
    p->evaluation_period = 100;
    p->display_loss_steps = 10;
    p->seed = 42;
    p->engine_log_level = OM_LOG_WARNING;
}

static void engine_log(void *user, om_log_level level, const char *msg) {
    rn_print((const om_runner *)user, "engine: %s", msg);
}

static om_status *dup_list(const char *const *src, int n, const char *field, char ***out) {
    *out = calloc((size_t)n + 1, sizeof(char *));
    if (!*out) return om_error(OM_OUT_OF_MEMORY, "out of memory");
    for (int i = 0; i < n; i++) {
        if (!src || !src[i] || !*src[i]) return om_error(OM_INVALID_ARGUMENT, "%s: entry %d is empty", field, i);
        if (!((*out)[i] = om_strdup(src[i]))) return om_error(OM_OUT_OF_MEMORY, "out of memory");
    }
    return NULL;
}

static om_status *validate(const om_runner_params *p) {
#define NEED(cond, ...) if (!(cond)) return om_error(OM_INVALID_ARGUMENT, __VA_ARGS__)
    NEED(p->model_path && *p->model_path, "model_path: empty model path");
    NEED(p->optimizer && *p->optimizer, "optimizer: empty optimizer name");
    NEED(p->loss >= OM_LOSS_SOFTMAX_CROSS_ENTROPY && p->loss <= OM_LOSS_NONE, "loss: unknown loss %d", (int)p->loss);
    NEED(p->loss == OM_LOSS_NONE || (p->label_name && *p->label_name), "label_name: empty label name");
    NEED(p->learning_rate >= 0 && isfinite(p->learning_rate), "learning_rate: must be a finite number >= 0");
    NEED(p->warmup_ratio >= 0 && p->warmup_ratio <= 1, "warmup_ratio: must be in [0, 1], got %g", p->warmup_ratio);
    NEED(p->warmup_mode >= OM_WARMUP_NONE && p->warmup_mode <= OM_WARMUP_POLY, "warmup_mode: unknown mode %d",
         (int)p->warmup_mode);
    NEED(p->train_batch_size > 0, "train_batch_size: must be > 0, got %lld", (long long)p->train_batch_size);
    NEED(p->eval_batch_size >= 0, "eval_batch_size: must be >= 0, got %lld", (long long)p->eval_batch_size);
    NEED(p->gradient_accumulation_steps > 0, "gradient_accumulation_steps: must be > 0, got %lld",
         (long long)p->gradient_accumulation_steps);
    /* the sample counters (the data cursor, samples per update) must not overflow in a run */
    int64_t samples;
    NEED(p->eval_batch_size <= RN_MAX_COUNTER, "eval_batch_size: %lld is more than %lld samples",
         (long long)p->eval_batch_size, (long long)RN_MAX_COUNTER);
    NEED(!__builtin_mul_overflow(p->num_train_steps, p->train_batch_size, &samples) && samples <= RN_MAX_COUNTER,
         "num_train_steps x train_batch_size: %lld x %lld samples is more than %lld", (long long)p->num_train_steps,
         (long long)p->train_batch_size, (long long)RN_MAX_COUNTER);
    NEED(p->num_train_steps > 0, "num_train_steps: must be > 0, got %lld", (long long)p->num_train_steps);
    NEED(p->num_train_steps % p->gradient_accumulation_steps == 0,
         "num_train_steps: %lld is not a multiple of gradient_accumulation_steps (%lld)", (long long)p->num_train_steps,
         (long long)p->gradient_accumulation_steps);
    NEED(!(p->n_weights_to_train > 0 && p->n_weights_not_to_train > 0),
         "weights_to_train / weights_not_to_train: give a list of weights to train or a list not to train, not both");
    NEED(p->n_weights_to_train >= 0 && p->n_weights_not_to_train >= 0, "weights_to_train: negative count");
    NEED(p->checkpoint_period > 0, "checkpoint_period: must be > 0, got %lld", (long long)p->checkpoint_period);
    NEED(p->evaluation_period > 0, "evaluation_period: must be > 0, got %lld", (long long)p->evaluation_period);
    NEED(p->display_loss_steps > 0, "display_loss_steps: must be > 0, got %lld", (long long)p->display_loss_steps);
    NEED(p->max_num_checkpoints > 0, "max_num_checkpoints: must be > 0, got %d", p->max_num_checkpoints);
    NEED(!p->use_mixed_precision || p->mixed_precision_type == OM_F16 || p->mixed_precision_type == OM_BF16,
         "mixed_precision_type: must be float16 or bfloat16");
    NEED(p->loss_scale >= 0 && isfinite(p->loss_scale), "loss_scale: must be >= 0 (0: dynamic)");
    NEED(p->initial_loss_scale >= 1, "initial_loss_scale: must be >= 1");
    NEED(p->loss_scale_window > 0, "loss_scale_window: must be > 0");
    NEED(!p->clip_grad_norm || p->max_grad_norm > 0, "max_grad_norm: must be > 0 when clipping");
    NEED(p->adam_mode >= -1 && p->adam_mode <= 2, "adam_mode: must be 0, 1 or 2 (or -1 for the optimizer's default)");
    NEED(p->beta1 >= 0 && p->beta1 < 1 && p->beta2 >= 0 && p->beta2 < 1, "beta1/beta2: must be in [0, 1)");
#undef NEED
    return NULL;
}

om_status *om_runner_create(const om_runner_params *params, om_runner **out) {
    *out = NULL;
    if (!params) return om_error(OM_INVALID_ARGUMENT, "params is NULL");
    OM_TRY(validate(params));
    rn_optimizer opt;
    int mode;
    OM_TRY(rn_optimizer_parse(params->optimizer, &opt, &mode));
    om_runner *r = calloc(1, sizeof *r);
    if (!r) return om_error(OM_OUT_OF_MEMORY, "out of memory");
    r->p = *params;
    r->opt = opt;
    r->adam_mode = params->adam_mode >= 0 ? params->adam_mode : mode;
    if (r->p.eval_batch_size == 0) r->p.eval_batch_size = r->p.train_batch_size;
    if (r->opt == RN_LAMB && params->epsilon == 0) r->p.epsilon = 1e-6f;
    /* own copies of every string */
    const char **fields[] = {&r->p.model_path, &r->p.loss_input, &r->p.label_name, &r->p.optimizer,
                             &r->p.train_data_dir, &r->p.test_data_dir, &r->p.checkpoints_dir, &r->p.log_dir,
                             &r->p.output_dir};
    om_status *st = NULL;
    for (size_t i = 0; i < sizeof fields / sizeof fields[0]; i++)
        if (*fields[i] && !(*fields[i] = om_strdup(*fields[i]))) st = om_error(OM_OUT_OF_MEMORY, "out of memory");
        else if (*fields[i] && !**fields[i] && i >= 4) { free((char *)*fields[i]); *fields[i] = NULL; }
    if (!st) st = dup_list(params->weights_to_train, params->n_weights_to_train, "weights_to_train", &r->wt);
    if (!st) st = dup_list(params->weights_not_to_train, params->n_weights_not_to_train, "weights_not_to_train", &r->wnt);
    r->p.weights_to_train = (const char *const *)r->wt;
    r->p.weights_not_to_train = (const char *const *)r->wnt;
    r->eval_loss = NAN;
    r->eval_accuracy = -1;
    r->last_ckpt_update = -1;
    r->loss_scale = 1.0f;
    if (st) {
        om_runner_free(r);
        return st;
    }
    *out = r;
    return NULL;
}

void om_runner_free(om_runner *r) {
    if (!r) return;
    free((char *)r->p.model_path);
    free((char *)r->p.loss_input);
    free((char *)r->p.label_name);
    free((char *)r->p.optimizer);
    free((char *)r->p.train_data_dir);
    free((char *)r->p.test_data_dir);
    free((char *)r->p.checkpoints_dir);
    free((char *)r->p.log_dir);
    free((char *)r->p.output_dir);
    for (int i = 0; r->wt && i < r->p.n_weights_to_train; i++) free(r->wt[i]);
    for (int i = 0; r->wnt && i < r->p.n_weights_not_to_train; i++) free(r->wnt[i]);
    free(r->wt);
    free(r->wnt);
    for (int i = 0; r->w && i < r->n_weights; i++) {
        free(r->w[i].name);
        om_free(r->w[i].value.data);
        om_free(r->w[i].grad.data);
        om_free(r->w[i].m.data);
        om_free(r->w[i].v.data);
    }
    free(r->w);
    if (r->mp) onnx__model_proto__free_unpacked(r->mp, NULL);
    om_free(r->model_bytes);
    free(r->loss_input);
    om_engine_free(r->eng);
    free(r->feed_kind);
    free(r->feed_index);
    free(r->feeds);
    free(r->grads);
    for (int k = 0; r->batch_bufs && k < r->train.n_features; k++) om_free(r->batch_bufs[k]);
    for (int k = 0; r->eval_bufs && k < r->test.n_features; k++) om_free(r->eval_bufs[k]);
    free(r->batch_bufs);
    free(r->eval_bufs);
    rn_dataset_free(&r->train);
    rn_dataset_free(&r->test);
    free(r->update_secs);
    rn_profiler_free(&r->prof);
    rn_events_close(&r->events);
    free(r);
}

/* ---- initialize --------------------------------------------------------------------- */

static om_tensor f32_like(const om_tensor *t) {
    om_tensor z = *t;
    z.data = om_alloc(om_tensor_nbytes(t) ? om_tensor_nbytes(t) : 1);
    if (z.data) memset(z.data, 0, om_tensor_nbytes(t));
    return z;
}

static const Onnx__TensorProto *is_initializer(const Onnx__GraphProto *g, const char *name) {
    for (size_t i = 0; i < g->n_initializer; i++)
        if (g->initializer[i]->name && !strcmp(g->initializer[i]->name, name)) return g->initializer[i];
    return NULL;
}

static om_status *check_data(om_runner *r) {
    const rn_dataset *ds = &r->train;
    for (int k = 0; k < ds->n_features; k++) OM_TRY(rn_model_check_feature(r, ds, k, ds->dir));
    const Onnx__GraphProto *g = r->mp->graph;
    for (size_t i = 0; i < g->n_input; i++) {
        const char *name = g->input[i]->name;
        if (is_initializer(g, name)) continue;
        if (rn_dataset_find(ds, name) < 0)
            return om_error(OM_INVALID_ARGUMENT, "data '%s': graph input '%s' has no feature of that name in the shards",
                            ds->dir, name);
    }
    r->label_feature = -1;
    if (r->p.loss != OM_LOSS_NONE) {
        r->label_feature = rn_dataset_find(ds, r->p.label_name);
        if (r->label_feature < 0)
            return om_error(OM_INVALID_ARGUMENT,
                            "data '%s': the loss needs labels but the shards have no feature '%s' (label_name)", ds->dir,
                            r->p.label_name);
        r->onehot = r->p.loss == OM_LOSS_SOFTMAX_CROSS_ENTROPY && ds->f[r->label_feature].dtype == OM_F32;
    }
    if (r->have_test) {
        const rn_dataset *ts = &r->test;
        for (int k = 0; k < ds->n_features; k++) {
            int t = rn_dataset_find(ts, ds->f[k].name);
            if (t < 0)
                return om_error(OM_INVALID_ARGUMENT, "test data '%s' lacks feature '%s' of the training data", ts->dir,
                                ds->f[k].name);
            if (ts->f[t].dtype != ds->f[k].dtype || ts->f[t].rank != ds->f[k].rank ||
                memcmp(ts->f[t].dims, ds->f[k].dims, sizeof(int64_t) * (size_t)ds->f[k].rank))
                return om_error(OM_INVALID_ARGUMENT,
                                "test data '%s': feature '%s' differs in type or per-sample shape from the training data",
                                ts->dir, ds->f[k].name);
        }
        if (ts->n_features != ds->n_features)
            return om_error(OM_INVALID_ARGUMENT, "test data '%s' has %d features, the training data %d", ts->dir,
                            ts->n_features, ds->n_features);
    }
    return NULL;
}

/* Bytes of a batch of B samples of feature f: the batch's dims, [B, sample dims...], must
 * make a tensor the engine can hold (overflow-checked), before anything is allocated. */
static om_status *batch_bytes(const rn_feature *f, int64_t B, const char *field, size_t *nbytes) {
    int64_t dims[OM_MAX_RANK];
    dims[0] = B;
    for (int d = 0; d < f->rank && d + 1 < OM_MAX_RANK; d++) dims[d + 1] = f->dims[d];
    if (f->rank + 1 > OM_MAX_RANK || om_shape_size(dims, f->rank + 1, om_dtype_size(f->dtype), NULL, nbytes) != 0)
        return om_error(OM_INVALID_ARGUMENT, "%s: a batch of %lld samples of feature '%s' (%zu bytes each) is larger "
                        "than a tensor can be", field, (long long)B, f->name, f->sample_bytes);
    return NULL;
}

/* Points r->feeds at the weights and at the batch buffers of ds (batch size B). */
static void set_feeds(om_runner *r, const rn_dataset *ds, void **bufs, int64_t B) {
    for (int i = 0; i < r->n_feeds; i++) {
        om_tensor *t = &r->feeds[i];
        if (r->feed_kind[i] == RN_FEED_WEIGHT) {
            *t = r->w[r->feed_index[i]].value;
            continue;
        }
        const rn_feature *f = &r->train.f[r->feed_index[i]];
        int k = ds == &r->train ? r->feed_index[i] : rn_dataset_find(ds, f->name);
        memset(t, 0, sizeof *t);
        t->dtype = f->dtype;
        t->rank = f->rank + 1;
        t->dims[0] = B;
        for (int d = 0; d < f->rank; d++) t->dims[d + 1] = f->dims[d];
        t->data = bufs[k];
        t->device = OM_CPU;
    }
}

om_status *om_runner_initialize(om_runner *r) {
    if (r->initialized) return om_error(OM_INVALID_ARGUMENT, "the runner is initialized already");
    OM_TRY(rn_model_load(r));
    if (!r->p.train_data_dir) return om_error(OM_INVALID_ARGUMENT, "train_data_dir: no training data directory");
    OM_TRY(rn_dataset_load(r->p.train_data_dir, r->p.shuffle, r->p.seed, &r->train));
    if (r->p.test_data_dir) {
        OM_TRY(rn_dataset_load(r->p.test_data_dir, 0, r->p.seed, &r->test));
        r->have_test = 1;
    }
    OM_TRY(check_data(r));

    /* the training graph and the engine */
    const rn_feature *lf = r->label_feature >= 0 ? &r->train.f[r->label_feature] : NULL;
    void *bytes;
    size_t nbytes;
    OM_TRY(rn_model_training_bytes(r, lf ? lf->dtype : OM_UNDEFINED, lf ? lf->rank : 0, lf ? lf->dims : NULL, &bytes,
                                   &nbytes));
    om_engine_options eo = om_engine_default_options();
    eo.seed = r->p.seed;
    eo.log = engine_log;
    eo.log_user = r;
    eo.log_level = r->p.engine_log_level;
    /* grad flags need the input order: a first engine without gradients tells it cheaply */
    om_engine *probe = NULL;
    om_status *st = om_engine_create(bytes, nbytes, &eo, &probe);
    if (st) {
        om_free(bytes);
        return om_error_context(st, "model '%s'", r->p.model_path);
    }
    const int n_in = om_engine_num_inputs(probe);
    r->n_feeds = n_in;
    r->feed_kind = calloc((size_t)n_in + 1, sizeof(rn_feed_kind));
    r->feed_index = calloc((size_t)n_in + 1, sizeof(int));
    r->feeds = calloc((size_t)n_in + 1, sizeof(om_tensor));
    r->grads = calloc((size_t)n_in + 1, sizeof(om_tensor));
    bool *need = calloc((size_t)n_in + 1, sizeof(bool));
    if (!r->feed_kind || !r->feed_index || !r->feeds || !r->grads || !need) st = om_error(OM_OUT_OF_MEMORY, "out of memory");
    for (int i = 0; i < n_in && !st; i++) {
        const char *name = om_engine_input_name(probe, i);
        int found = 0;
        for (int w = 0; w < r->n_weights && !found; w++)
            if (!strcmp(r->w[w].name, name)) {
                r->feed_kind[i] = RN_FEED_WEIGHT;
                r->feed_index[i] = w;
                need[i] = true;
                found = 1;
            }
        int k = found ? -1 : rn_dataset_find(&r->train, name);
        if (k >= 0) {
            r->feed_kind[i] = RN_FEED_FEATURE;
            r->feed_index[i] = k;
            found = 1;
        }
        if (!found) st = om_error(OM_INTERNAL, "training graph input '%s' is neither a weight nor a data feature", name);
    }
    om_engine_free(probe);
    if (!st) {
        eo.grad_inputs = need;
        eo.n_grad_inputs = n_in;
        st = om_engine_create(bytes, nbytes, &eo, &r->eng);
        if (st) st = om_error_context(st, "model '%s' with the loss added", r->p.model_path);
    }
    free(need);
    om_free(bytes);
    if (st) return st;
    if (om_engine_output_dtype(r->eng, 0) != OM_F32)
        return om_error(OM_INVALID_ARGUMENT, "loss_input: '%s' is %s; the loss must be float32", r->loss_input,
                        om_dtype_name(om_engine_output_dtype(r->eng, 0)));
    r->out_pred = r->p.loss == OM_LOSS_NONE ? -1 : 1;

    /* buffers and optimizer state */
    r->batch_bufs = calloc((size_t)r->train.n_features + 1, sizeof(void *));
    if (!r->batch_bufs) return om_error(OM_OUT_OF_MEMORY, "out of memory");
    for (int k = 0; k < r->train.n_features; k++) {
        size_t nb;
        OM_TRY(batch_bytes(&r->train.f[k], r->p.train_batch_size, "train_batch_size", &nb));
        if (!(r->batch_bufs[k] = om_alloc(nb + 1)))
            return om_error(OM_OUT_OF_MEMORY, "out of memory for a batch of feature '%s' (%zu bytes)", r->train.f[k].name,
                            nb);
    }
    if (r->have_test) {
        r->eval_bufs = calloc((size_t)r->test.n_features + 1, sizeof(void *));
        if (!r->eval_bufs) return om_error(OM_OUT_OF_MEMORY, "out of memory");
        for (int k = 0; k < r->test.n_features; k++) {
            size_t nb;
            OM_TRY(batch_bytes(&r->test.f[k], r->p.eval_batch_size, "eval_batch_size", &nb));
            if (!(r->eval_bufs[k] = om_alloc(nb + 1)))
                return om_error(OM_OUT_OF_MEMORY, "out of memory for an evaluation batch of feature '%s' (%zu bytes)",
                                r->test.f[k].name, nb);
        }
    }
    for (int w = 0; w < r->n_weights; w++) {
        rn_weight *x = &r->w[w];
        x->grad = f32_like(&x->value);
        if (!x->grad.data) return om_error(OM_OUT_OF_MEMORY, "out of memory");
        if (r->opt != RN_SGD || r->p.momentum != 0) {
            x->m = f32_like(&x->value);
            if (!x->m.data) return om_error(OM_OUT_OF_MEMORY, "out of memory");
        }
        if (r->opt != RN_SGD) {
            x->v = f32_like(&x->value);
            if (!x->v.data) return om_error(OM_OUT_OF_MEMORY, "out of memory");
        }
    }

    /* loss scaler: fp16 needs one (dynamic unless a static scale is given); bf16 has fp32's range */
    r->dynamic_scale = 0;
    r->loss_scale = 1.0f;
    if (r->p.loss_scale > 0) r->loss_scale = r->p.loss_scale;
    else if (r->p.use_mixed_precision && r->p.mixed_precision_type == OM_F16) {
        r->dynamic_scale = 1;
        r->loss_scale = r->p.initial_loss_scale;
    }

    OM_TRY(rn_checkpoint_resume(r));
    r->start_update = r->update;

    /* plan memory now: one forward on the first batch (also checks the data against the model) */
    OM_TRY(rn_dataset_batch(&r->train, r->cursor, r->p.train_batch_size, r->batch_bufs));
    set_feeds(r, &r->train, r->batch_bufs, r->p.train_batch_size);
    const int n_out = om_engine_num_outputs(r->eng);
    om_tensor outs[4];
    om_stash *stash = NULL;
    st = om_engine_forward(r->eng, r->feeds, r->n_feeds, false, outs, &stash, NULL, NULL);
    if (st) return om_error_context(st, "the model does not run on the data of '%s'", r->p.train_data_dir);
    int64_t loss_numel = om_tensor_numel(&outs[0]);
    for (int i = 0; i < n_out; i++) om_free(outs[i].data);
    om_stash_free(stash);
    if (loss_numel != 1)
        return om_error(OM_INVALID_ARGUMENT, "loss_input: '%s' has %lld elements; with --loss none it must be the scalar loss",
                        r->loss_input, (long long)loss_numel);

    if (r->p.use_profiler) rn_profiler_begin(&r->prof);
    if (r->p.log_dir) OM_TRY(rn_events_open(&r->events, r->p.log_dir));
    if (r->p.output_dir) OM_TRY(rn_mkdirs(r->p.output_dir));
    rn_print(r, "model %s: %d weights train (%lld parameters), optimizer %s, %lld training samples in %d shard(s)%s",
             r->p.model_path, r->n_weights,
             (long long)({ int64_t s = 0; for (int w = 0; w < r->n_weights; w++) s += om_tensor_numel(&r->w[w].value); s; }),
             r->p.optimizer, (long long)r->train.n_samples, r->train.n_shards, r->have_test ? "" : ", no test data");
    r->initialized = 1;
    return NULL;
}

/* ---- evaluation --------------------------------------------------------------------- */

// pred is (N, C, S...) float; labels (N, S...) int or (N, C, S...) one-hot float
static int64_t count_correct(const om_tensor *pred, const rn_feature *lf, const void *labels, int onehot) {
    if (pred->rank < 2) return 0;
    const int64_t N = pred->dims[0], C = pred->dims[1];
    int64_t S = 1, correct = 0;
    for (int d = 2; d < pred->rank; d++) S *= pred->dims[d];
    const float *p = pred->data;
    for (int64_t n = 0; n < N; n++)
        for (int64_t s = 0; s < S; s++) {
            int64_t best = 0, want = 0;
            for (int64_t c = 1; c < C; c++)
                if (p[(n * C + c) * S + s] > p[(n * C + best) * S + s]) best = c;
            if (onehot) {
                const float *y = labels;
                for (int64_t c = 1; c < C; c++)
                    if (y[(n * C + c) * S + s] > y[(n * C + want) * S + s]) want = c;
            } else {
                want = lf->dtype == OM_I64 ? ((const int64_t *)labels)[n * S + s] : ((const int32_t *)labels)[n * S + s];
            }
            correct += best == want;
        }
    return correct;
}

om_status *om_runner_evaluate(om_runner *r, om_runner_eval_result *res) {
    if (!r->initialized) return om_error(OM_INVALID_ARGUMENT, "evaluate: the runner is not initialized");
    if (!r->have_test) return om_error(OM_INVALID_ARGUMENT, "evaluate: no test_data_dir");
    const double t0 = rn_now();
    const int64_t N = r->test.n_samples, EB = r->p.eval_batch_size;
    const int classify = r->p.loss == OM_LOSS_SOFTMAX_CROSS_ENTROPY;
    const int n_out = om_engine_num_outputs(r->eng);
    const int lt = classify ? rn_dataset_find(&r->test, r->p.label_name) : -1;
    double loss_sum = 0;
    int64_t correct = 0, positions = 0;
    for (int64_t start = 0; start < N; start += EB) {
        const int64_t cnt = N - start < EB ? N - start : EB;
        rn_dataset_slice(&r->test, start, cnt, r->eval_bufs);
        set_feeds(r, &r->test, r->eval_bufs, cnt);
        om_tensor outs[4];
        om_stash *stash = NULL;
        OM_TRY(om_engine_forward(r->eng, r->feeds, r->n_feeds, false, outs, &stash, NULL, NULL));
        om_stash_free(stash);
        loss_sum += (double)((float *)outs[0].data)[0] * (double)cnt;
        if (classify && r->out_pred >= 0) {
            const om_tensor *pred = &outs[r->out_pred];
            correct += count_correct(pred, &r->test.f[lt], r->eval_bufs[lt], r->onehot);
            positions += om_tensor_numel(pred) / (pred->rank >= 2 ? pred->dims[1] : 1);
        }
        for (int i = 0; i < n_out; i++) om_free(outs[i].data);
    }
    res->samples = N;
    res->loss = loss_sum / (double)N;
    res->accuracy = classify && positions ? (double)correct / (double)positions : -1;
    r->eval_loss = res->loss;
    r->eval_accuracy = res->accuracy;
    rn_profiler_add(&r->prof, "evaluate", t0, rn_now(), r->update);
    return NULL;
}

static om_status *evaluate_and_report(om_runner *r) {
    om_runner_eval_result ev;
    OM_TRY(om_runner_evaluate(r, &ev));
    if (ev.accuracy >= 0)
        rn_print(r, "eval  update %lld: loss %.6f, accuracy %.4f (%lld samples)", (long long)r->update, ev.loss,
                 ev.accuracy, (long long)ev.samples);
    else
        rn_print(r, "eval  update %lld: loss %.6f (%lld samples)", (long long)r->update, ev.loss, (long long)ev.samples);
    rn_events_scalar(&r->events, "eval/loss", r->update, ev.loss);
    if (ev.accuracy >= 0) rn_events_scalar(&r->events, "eval/accuracy", r->update, ev.accuracy);
    return NULL;
}

/* ---- training ----------------------------------------------------------------------- */

/* Adds the gradients of one micro-step into the accumulators; returns in *fp16_overflow
 * whether any element is beyond fp16's range (what an fp16 gradient could not hold). */
static void accumulate(om_runner *r, int first, int *fp16_overflow) {
    const int check16 = r->p.use_mixed_precision && r->p.mixed_precision_type == OM_F16;
    for (int i = 0; i < r->n_feeds; i++) {
        if (r->feed_kind[i] != RN_FEED_WEIGHT) continue;
        rn_weight *w = &r->w[r->feed_index[i]];
        const float *restrict g = r->grads[i].data;
        float *restrict acc = w->grad.data;
        const int64_t n = om_tensor_numel(&w->value);
        if (!g) {
            if (first) memset(acc, 0, sizeof(float) * (size_t)n);
            continue;
        }
        if (first) memcpy(acc, g, sizeof(float) * (size_t)n);
        else
            for (int64_t k = 0; k < n; k++) acc[k] += g[k];
        if (check16) {
            int over = 0;
            for (int64_t k = 0; k < n; k++) over |= !(fabsf(g[k]) <= 65504.0f);
            *fp16_overflow |= over;
        }
    }
}

static om_status *optimizer_step(om_runner *r, float lr) {
    const int n = r->n_weights;
    om_tensor *params = malloc(sizeof(om_tensor) * (size_t)n * 4 + 1);
    if (!params) return om_error(OM_OUT_OF_MEMORY, "out of memory");
    om_tensor *grads = params + n, *m = params + 2 * n, *v = params + 3 * n;
    for (int i = 0; i < n; i++) {
        params[i] = r->w[i].value;
        grads[i] = r->w[i].grad;
        m[i] = r->w[i].m;
        v[i] = r->w[i].v;
    }
    om_status *st = NULL;
    r->opt_step++;
    if (r->opt == RN_ADAM) {
        om_adam_hparams h = om_adam_default_hparams();
        h.lr = lr;
        h.beta1 = r->p.beta1;
        h.beta2 = r->p.beta2;
        h.eps = r->p.epsilon;
        h.weight_decay = r->p.weight_decay;
        h.bias_correction = r->p.bias_correction;
        h.mode = (om_adam_mode)r->adam_mode;
        h.step = r->opt_step;
        h.grad_scale = 1.0f;
        st = om_adam_step(&h, n, params, grads, m, v);
    } else if (r->opt == RN_LAMB) {
        st = rn_lamb_step(n, params, grads, m, v, lr, r->p.beta1, r->p.beta2, r->p.epsilon, r->p.weight_decay,
                          r->p.bias_correction, r->opt_step);
    } else {
        st = rn_sgd_step(n, params, grads, r->p.momentum != 0 ? m : NULL, lr, r->p.momentum, r->p.weight_decay);
    }
    free(params);
    return st;
}

/* One weight update: gradient_accumulation_steps micro-steps, then the optimizer. */
static om_status *train_update(om_runner *r, int64_t total_updates) {
    const int64_t accum = r->p.gradient_accumulation_steps, B = r->p.train_batch_size;
    const int n_out = om_engine_num_outputs(r->eng);
    double loss_sum = 0;
    int fp16_overflow = 0;
    float scale = r->loss_scale;
    om_tensor dout[4];
    memset(dout, 0, sizeof dout);
    dout[0].dtype = OM_F32;
    dout[0].rank = 0;
    dout[0].data = &scale;
    for (int64_t micro = 0; micro < accum; micro++) {
        const double t0 = rn_now();
        OM_TRY(rn_dataset_batch(&r->train, r->cursor, B, r->batch_bufs));
        set_feeds(r, &r->train, r->batch_bufs, B);
        const double t1 = rn_now();
        om_tensor outs[4];
        om_stash *stash = NULL;
        OM_TRY(om_engine_forward(r->eng, r->feeds, r->n_feeds, true, outs, &stash, NULL, NULL));
        const double t2 = rn_now();
        loss_sum += ((float *)outs[0].data)[0];
        for (int i = 0; i < n_out; i++) om_free(outs[i].data);
        om_status *st = om_engine_backward(r->eng, stash, dout, r->grads);
        om_stash_free(stash);
        if (st) return st;
        const double t3 = rn_now();
        accumulate(r, micro == 0, &fp16_overflow);
        for (int i = 0; i < r->n_feeds; i++) {
            om_free(r->grads[i].data);
            r->grads[i].data = NULL;
        }
        const double t4 = rn_now();
        r->cursor += B;
        r->step++;
        rn_profiler_add(&r->prof, "data", t0, t1, r->step);
        rn_profiler_add(&r->prof, "forward", t1, t2, r->step);
        rn_profiler_add(&r->prof, "backward", t2, t3, r->step);
        rn_profiler_add(&r->prof, "accumulate", t3, t4, r->step);
    }
    const double t5 = rn_now();
    om_tensor *g = malloc(sizeof(om_tensor) * (size_t)r->n_weights + 1);
    if (!g) return om_error(OM_OUT_OF_MEMORY, "out of memory");
    for (int i = 0; i < r->n_weights; i++) g[i] = r->w[i].grad;
    int found_inf = 0;
    double sq = 0;
    const float unscale = scale * (float)accum;
    om_status *st = om_grads_check_and_norm(r->n_weights, g, unscale, &found_inf, &sq);
    found_inf |= fp16_overflow;
    const float lr = r->p.learning_rate *
                     om_lr_schedule(r->p.warmup_mode, r->p.warmup_ratio, r->p.poly_power, r->update, total_updates);
    if (!st && found_inf) {
        r->skipped_total++;
        r->run_skipped++;
        if (r->dynamic_scale) {
            r->loss_scale = r->loss_scale / 2 < 1 ? 1 : r->loss_scale / 2;
            r->good_updates = 0;
        }
        rn_print(r, "step  %lld: gradient overflow at loss scale %g: update skipped%s", (long long)r->step, scale,
                 r->dynamic_scale ? ", scale halved" : "");
    } else if (!st) {
        const double norm = sqrt(sq);
        r->last_grad_norm = norm;
        float factor = 1.0f / unscale;
        if (r->p.clip_grad_norm && norm > r->p.max_grad_norm) factor *= (float)(r->p.max_grad_norm / norm);
        st = om_grads_scale(r->n_weights, g, factor);
        if (!st) st = optimizer_step(r, lr);
        if (!st && r->dynamic_scale && ++r->good_updates >= r->p.loss_scale_window) {
            r->loss_scale = r->loss_scale * 2 > 16777216.0f ? 16777216.0f : r->loss_scale * 2;
            r->good_updates = 0;
        }
    }
    free(g);
    if (st) return st;
    r->update++;
    r->last_loss = loss_sum / (double)accum;
    rn_profiler_add(&r->prof, "optimizer", t5, rn_now(), r->step);
    r->run_samples += B * accum;
    if (r->run_samples && !isfinite(r->last_loss) && !r->p.use_mixed_precision)
        return om_error(OM_RUNTIME, "the loss is %g at step %lld: training diverged", r->last_loss, (long long)r->step);
    (void)lr;
    return NULL;
}

static om_status *write_summary(om_runner *r) {
    if (!r->p.output_dir) return NULL;
    om_runner_summary s;
    om_runner_get_summary(r, &s);
    char path[4096], tmp[4200];
    snprintf(path, sizeof path, "%s/summary.json", r->p.output_dir);
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "w");
    if (!f) return om_error(OM_RUNTIME, "cannot write '%s': %s", tmp, strerror(errno));
    fprintf(f, "{\n  \"model\": ");
    rn_json_string(f, r->p.model_path);
    fprintf(f, ",\n  \"optimizer\": ");
    rn_json_string(f, r->p.optimizer);
    fprintf(f, ",\n  \"train_batch_size\": %lld,\n  \"gradient_accumulation_steps\": %lld,\n",
            (long long)r->p.train_batch_size, (long long)r->p.gradient_accumulation_steps);
    fprintf(f, "  \"num_train_steps\": %lld,\n  \"global_step\": %lld,\n  \"global_update\": %lld,\n",
            (long long)r->p.num_train_steps, (long long)r->step, (long long)r->update);
    fprintf(f, "  \"start_update\": %lld,\n  \"steps\": %lld,\n  \"updates\": %lld,\n  \"skipped_updates\": %lld,\n",
            (long long)s.start_update, (long long)s.steps, (long long)s.updates, (long long)r->skipped_total);
    fprintf(f, "  \"samples\": %lld,\n  \"train_seconds\": %.6f,\n", (long long)s.samples, s.train_seconds);
    fprintf(f, "  \"throughput\": %.3f,\n  \"stabilized_throughput\": %.3f,\n", s.throughput, s.stabilized_throughput);
    fprintf(f, "  \"peak_memory_mb\": %.3f,\n  \"loss_scale\": %.1f,\n", s.peak_memory_mb, s.loss_scale);
    fprintf(f, "  \"mixed_precision\": %s,\n", !r->p.use_mixed_precision ? "null"
                                               : r->p.mixed_precision_type == OM_BF16 ? "\"bf16\"" : "\"fp16\"");
    if (isfinite(s.last_loss)) fprintf(f, "  \"last_loss\": %.9g,\n", s.last_loss);
    else fprintf(f, "  \"last_loss\": null,\n");
    if (isfinite(s.eval_loss)) fprintf(f, "  \"eval_loss\": %.9g,\n", s.eval_loss);
    else fprintf(f, "  \"eval_loss\": null,\n");
    if (s.eval_accuracy >= 0) fprintf(f, "  \"eval_accuracy\": %.9g\n}\n", s.eval_accuracy);
    else fprintf(f, "  \"eval_accuracy\": null\n}\n");
    int bad = ferror(f);
    if (fclose(f) != 0 || bad || rename(tmp, path) != 0) return om_error(OM_RUNTIME, "cannot write '%s'", path);
    return NULL;
}

om_status *om_runner_run(om_runner *r) {
    if (!r->initialized) return om_error(OM_INVALID_ARGUMENT, "run: the runner is not initialized");
    const int64_t total_updates = r->p.num_train_steps / r->p.gradient_accumulation_steps;
    const int64_t per_update = r->p.train_batch_size * r->p.gradient_accumulation_steps;
    if (r->step >= r->p.num_train_steps)
        rn_print(r, "nothing to train: step %lld of %lld reached", (long long)r->step, (long long)r->p.num_train_steps);
    int64_t last_eval = -1;
    while (r->step < r->p.num_train_steps) {
        const double t0 = rn_now();
        OM_TRY(train_update(r, total_updates));
        const double dt = rn_now() - t0;
        r->run_seconds += dt;
        r->run_updates++;
        r->run_steps += r->p.gradient_accumulation_steps;
        if (r->n_update_secs == r->cap_update_secs) {
            int64_t cap = r->cap_update_secs ? r->cap_update_secs * 2 : 1024;
            double *ns = realloc(r->update_secs, sizeof(double) * (size_t)cap);
            if (!ns) return om_error(OM_OUT_OF_MEMORY, "out of memory");
            r->update_secs = ns;
            r->cap_update_secs = cap;
        }
        r->update_secs[r->n_update_secs++] = dt;
        const float lr = r->p.learning_rate * om_lr_schedule(r->p.warmup_mode, r->p.warmup_ratio, r->p.poly_power,
                                                             r->update - 1, total_updates);
        if (r->update % r->p.display_loss_steps == 0 || r->step >= r->p.num_train_steps) {
            rn_print(r, "step  %lld/%lld (update %lld): loss %.6f, lr %.4g, %.3f ms, %.1f samples/s",
                     (long long)r->step, (long long)r->p.num_train_steps, (long long)r->update, r->last_loss, lr,
                     dt * 1e3, (double)per_update / dt);
        }
        rn_events_scalar(&r->events, "train/loss", r->update, r->last_loss);
        rn_events_scalar(&r->events, "train/learning_rate", r->update, lr);
        rn_events_scalar(&r->events, "train/samples_per_sec", r->update, (double)per_update / dt);
        rn_events_scalar(&r->events, "train/grad_norm", r->update, r->last_grad_norm);
        if (r->p.use_mixed_precision) rn_events_scalar(&r->events, "train/loss_scale", r->update, r->loss_scale);
        if (r->have_test && r->update % r->p.evaluation_period == 0) {
            OM_TRY(evaluate_and_report(r));
            last_eval = r->update;
        }
        if (r->p.checkpoints_dir && r->update % r->p.checkpoint_period == 0) {
            const double c0 = rn_now();
            OM_TRY(rn_checkpoint_save(r));
            rn_profiler_add(&r->prof, "checkpoint", c0, rn_now(), r->step);
        }
        if (r->p.debug_step_delay_ms > 0) {
            struct timespec ts = {r->p.debug_step_delay_ms / 1000, (long)(r->p.debug_step_delay_ms % 1000) * 1000000L};
            nanosleep(&ts, NULL);
        }
    }
    if (r->have_test && last_eval != r->update) OM_TRY(evaluate_and_report(r));
    if (r->p.checkpoints_dir && r->last_ckpt_update != r->update) OM_TRY(rn_checkpoint_save(r));
    if (r->p.output_dir) {
        char path[4096];
        snprintf(path, sizeof path, "%s/trained_model.onnx", r->p.output_dir);
        OM_TRY(om_runner_save_model(r, path));
        rn_print(r, "saved the trained model to %s", path);
        OM_TRY(write_summary(r));
    }
    if (r->prof.on) {
        const char *dir = r->p.output_dir ? r->p.output_dir : r->p.log_dir ? r->p.log_dir : ".";
        char path[4096];
        snprintf(path, sizeof path, "%s/profile.json", dir);
        OM_TRY(rn_profiler_write(&r->prof, path));
        rn_print(r, "wrote the Chrome-trace profile to %s", path);
    }
    om_runner_summary s;
    om_runner_get_summary(r, &s);
    rn_print(r, "summary: %lld steps, %lld updates (%lld skipped) in %.3f s; throughput %.1f samples/s, "
                "stabilized %.1f samples/s; peak memory %.1f MB",
             (long long)s.steps, (long long)s.updates, (long long)s.skipped_updates, s.train_seconds, s.throughput,
             s.stabilized_throughput, s.peak_memory_mb);
    return NULL;
}

om_status *om_runner_save_checkpoint(om_runner *r) {
    if (!r->initialized) return om_error(OM_INVALID_ARGUMENT, "save_checkpoint: the runner is not initialized");
    return rn_checkpoint_save(r);
}

om_status *om_runner_save_model(om_runner *r, const char *path) {
    if (!r->mp) return om_error(OM_INVALID_ARGUMENT, "save_model: no model loaded");
    return rn_model_save(r, path);
}

void om_runner_get_summary(const om_runner *r, om_runner_summary *s) {
    memset(s, 0, sizeof *s);
    s->steps = r->run_steps;
    s->updates = r->run_updates;
    s->skipped_updates = r->run_skipped;
    s->samples = r->run_samples;
    s->start_update = r->start_update;
    s->last_loss = r->run_updates ? r->last_loss : NAN;
    s->train_seconds = r->run_seconds;
    s->throughput = r->run_seconds > 0 ? (double)r->run_samples / r->run_seconds : 0;
    const int64_t n = r->n_update_secs, from = n / 2;
    double secs = 0;
    for (int64_t i = from; i < n; i++) secs += r->update_secs[i];
    const int64_t per_update = r->p.train_batch_size * r->p.gradient_accumulation_steps;
    s->stabilized_throughput = secs > 0 ? (double)((n - from) * per_update) / secs : 0;
    struct rusage ru;
    if (getrusage(RUSAGE_SELF, &ru) == 0) s->peak_memory_mb = (double)ru.ru_maxrss / 1024.0;
    s->loss_scale = r->loss_scale;
    s->eval_loss = r->eval_loss;
    s->eval_accuracy = r->eval_accuracy;
}
