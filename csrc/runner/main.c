/* main.c — ortmod-train: the command line of the native training runner.
 * Exit status: 0 success, 1 a failure (message on stderr), 2 bad command line. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "ortmod_runner.h"

#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

enum {
    O_MODEL = 256, O_TRAIN_DIR, O_TEST_DIR, O_OUTPUT_DIR, O_OPTIMIZER, O_LR, O_WARMUP_RATIO, O_WARMUP_MODE,
    O_STEPS, O_BATCH, O_EVAL_BATCH, O_ACCUM, O_MIXED, O_MIXED_TYPE, O_BF16, O_LOSS_SCALE, O_CKPT_DIR, O_CKPT_PERIOD,
    O_MAX_CKPT, O_EVAL_PERIOD, O_DISPLAY, O_PROFILER, O_LOG_DIR, O_SEED, O_LOSS, O_LOSS_INPUT, O_LABEL, O_BETA1,
    O_BETA2, O_EPS, O_WD, O_ADAM_MODE, O_NO_BIAS_CORR, O_MOMENTUM, O_MAX_NORM, O_NO_CLIP, O_SHUFFLE, O_TRAIN_W,
    O_NOT_TRAIN_W, O_INIT_SCALE, O_SCALE_WINDOW, O_POLY_POWER, O_VERBOSE, O_HELP,
};

static const struct option options[] = {
    {"model", required_argument, 0, O_MODEL},
    {"model_name", required_argument, 0, O_MODEL},
    {"train_data_dir", required_argument, 0, O_TRAIN_DIR},
    {"test_data_dir", required_argument, 0, O_TEST_DIR},
    {"output_dir", required_argument, 0, O_OUTPUT_DIR},
    {"optimizer", required_argument, 0, O_OPTIMIZER},
    {"learning_rate", required_argument, 0, O_LR},
    {"warmup_ratio", required_argument, 0, O_WARMUP_RATIO},
    {"warmup_mode", required_argument, 0, O_WARMUP_MODE},
    {"num_train_steps", required_argument, 0, O_STEPS},
    {"train_batch_size", required_argument, 0, O_BATCH},
    {"eval_batch_size", required_argument, 0, O_EVAL_BATCH},
    {"gradient_accumulation_steps", required_argument, 0, O_ACCUM},
    {"use_mixed_precision", no_argument, 0, O_MIXED},
    {"mixed_precision_type", required_argument, 0, O_MIXED_TYPE},
    {"use_bfloat16", no_argument, 0, O_BF16},
    {"loss_scale", required_argument, 0, O_LOSS_SCALE},
    {"initial_loss_scale", required_argument, 0, O_INIT_SCALE},
    {"loss_scale_window", required_argument, 0, O_SCALE_WINDOW},
    {"checkpoints_dir", required_argument, 0, O_CKPT_DIR},
    {"checkpoint_period", required_argument, 0, O_CKPT_PERIOD},
    {"max_num_checkpoints", required_argument, 0, O_MAX_CKPT},
    {"evaluation_period", required_argument, 0, O_EVAL_PERIOD},
    {"display_loss_steps", required_argument, 0, O_DISPLAY},
    {"use_profiler", no_argument, 0, O_PROFILER},
    {"log_dir", required_argument, 0, O_LOG_DIR},
    {"seed", required_argument, 0, O_SEED},
    {"loss", required_argument, 0, O_LOSS},
    {"loss_input", required_argument, 0, O_LOSS_INPUT},
    {"label_name", required_argument, 0, O_LABEL},
    {"beta1", required_argument, 0, O_BETA1},
    {"beta2", required_argument, 0, O_BETA2},
    {"epsilon", required_argument, 0, O_EPS},
    {"weight_decay", required_argument, 0, O_WD},
    {"adam_mode", required_argument, 0, O_ADAM_MODE},
    {"no_bias_correction", no_argument, 0, O_NO_BIAS_CORR},
    {"momentum", required_argument, 0, O_MOMENTUM},
    {"max_grad_norm", required_argument, 0, O_MAX_NORM},
    {"no_grad_clipping", no_argument, 0, O_NO_CLIP},
    {"shuffle", no_argument, 0, O_SHUFFLE},
    {"weights_to_train", required_argument, 0, O_TRAIN_W},
    {"weights_not_to_train", required_argument, 0, O_NOT_TRAIN_W},
    {"poly_power", required_argument, 0, O_POLY_POWER},
    {"verbose", no_argument, 0, O_VERBOSE},
    {"help", no_argument, 0, O_HELP},
    {0, 0, 0, 0},
};

static const char usage[] =
    "usage: ortmod-train --model FILE --train_data_dir DIR [options]\n"
    "\n"
    "Trains an ONNX model with ortmod's C engine, no Python. The trained weights are written back\n"
    "into the model's initializers (OUTPUT_DIR/trained_model.onnx), which ONNX Runtime loads.\n"
    "\n"
    "model and loss\n"
    "  --model FILE                 the ONNX model to train (its float initializers are the weights)\n"
    "  --loss NAME                  softmax_cross_entropy (default; int labels or float one-hot rows),\n"
    "                               mse, or none (the model already outputs the scalar loss)\n"
    "  --loss_input NAME            the value the loss applies to (default: the model's first output)\n"
    "  --label_name NAME            the data feature holding the labels (default: labels)\n"
    "  --weights_to_train A,B       train only these initializers (default: all float ones)\n"
    "  --weights_not_to_train A,B   train all float initializers but these\n"
    "\n"
    "data (directories of shards; see ortmod.runner.write_shards)\n"
    "  --train_data_dir DIR         training shards (required)\n"
    "  --test_data_dir DIR          held-out shards for evaluation (loss, and accuracy for classification)\n"
    "  --shuffle                    shuffle the training samples every epoch (seeded)\n"
    "\n"
    "optimizer\n"
    "  --optimizer NAME             SGD, Adam, AdamW or Lamb, any letter case (default: Adam)\n"
    "  --learning_rate LR           peak learning rate (default: 0.001)\n"
    "  --warmup_mode MODE           None, Constant, Cosine, Linear or Poly (default: None)\n"
    "  --warmup_ratio R             fraction of the updates spent in linear warmup (default: 0)\n"
    "  --poly_power P               power of the Poly decay (default: 1)\n"
    "  --beta1 B --beta2 B          Adam/Lamb moments (default: 0.9, 0.999)\n"
    "  --epsilon E                  Adam/Lamb epsilon (default: 1e-8; Lamb 1e-6)\n"
    "  --weight_decay W             (default: 0)\n"
    "  --adam_mode M                0: L2 regularization (Adam's default), 1: decoupled decay after the\n"
    "                               update as HF transformers (AdamW's default), 2: decoupled decay\n"
    "                               before the update as torch.optim.AdamW\n"
    "  --no_bias_correction         Adam/Lamb without bias correction\n"
    "  --momentum M                 SGD momentum (default: 0)\n"
    "  --max_grad_norm N            global gradient-norm clipping threshold (default: 1.0)\n"
    "  --no_grad_clipping           turn clipping off\n"
    "\n"
    "steps\n"
    "  --num_train_steps N          micro-steps (forward+backward of one batch) (default: 100)\n"
    "  --train_batch_size N         (default: 32)\n"
    "  --eval_batch_size N          (default: the train batch size)\n"
    "  --gradient_accumulation_steps N   update the weights every N micro-steps (default: 1);\n"
    "                               num_train_steps must be a multiple of it\n"
    "  --seed N                     shuffling and random ops such as Dropout (default: 42)\n"
    "\n"
    "mixed precision (fp32 master weights; the graph computes in the half type; see docs/runner.md)\n"
    "  --use_mixed_precision        compute forward and backward in fp16 (or bf16)\n"
    "  --mixed_precision_type T     fp16 (default) or bf16\n"
    "  --use_bfloat16               same as --mixed_precision_type bf16\n"
    "  --loss_scale S               static loss scale; 0 (default): dynamic for fp16, none for bf16\n"
    "  --initial_loss_scale S       dynamic scale's start (default: 65536)\n"
    "  --loss_scale_window N        good updates before the dynamic scale doubles (default: 2000)\n"
    "\n"
    "checkpoints, evaluation, output (periods count weight updates)\n"
    "  --checkpoints_dir DIR        write checkpoints here; a run resumes from the highest one\n"
    "  --checkpoint_period N        (default: 100)\n"
    "  --max_num_checkpoints N      keep the newest N (default: 3)\n"
    "  --evaluation_period N        (default: 100; the run also evaluates at the end)\n"
    "  --display_loss_steps N       print a line every N updates (default: 10)\n"
    "  --output_dir DIR             trained_model.onnx, summary.json (and profile.json)\n"
    "  --log_dir DIR                TensorBoard event file of scalar summaries\n"
    "  --use_profiler               Chrome-trace profile (chrome://tracing, Perfetto) to\n"
    "                               OUTPUT_DIR/profile.json (or LOG_DIR)\n"
    "  --verbose                    the engine's own log messages\n"
    "  --help                       this text\n";

static int bad_number(const char *flag, const char *v) {
    fprintf(stderr, "ortmod-train: error: --%s: '%s' is not a valid number\n", flag, v);
    return 2;
}

static int parse_i64(const char *flag, const char *v, int64_t *out) {
    char *end;
    errno = 0;
    long long x = strtoll(v, &end, 10);
    if (errno || end == v || *end) return bad_number(flag, v);
    *out = x;
    return 0;
}

static int parse_f(const char *flag, const char *v, float *out) {
    char *end;
    errno = 0;
    double x = strtod(v, &end);
    if (errno || end == v || *end) return bad_number(flag, v);
    *out = (float)x;
    return 0;
}

/* "a,b,c" -> a NULL-terminated array of strings (the input is modified in place). */
static const char **split_list(char *s, int *n) {
    int cnt = 1;
    for (char *c = s; *c; c++) cnt += *c == ',';
    const char **out = calloc((size_t)cnt + 1, sizeof(char *));
    *n = 0;
    if (!out) return NULL;
    for (char *tok = strtok(s, ","); tok; tok = strtok(NULL, ","))
        if (*tok) out[(*n)++] = tok;
    return out;
}

int main(int argc, char **argv) {
    om_runner_params p;
    om_runner_params_init(&p);
    const char **wt = NULL, **wnt = NULL;
    int rc = 0, c;
    int64_t i64;
    opterr = 0;
    while ((c = getopt_long(argc, argv, "h", options, NULL)) != -1) {
        const char *flag = NULL;
        for (const struct option *o = options; o->name; o++)
            if (o->val == c) { flag = o->name; break; }
        switch (c) {
        case O_MODEL: p.model_path = optarg; break;
        case O_TRAIN_DIR: p.train_data_dir = optarg; break;
        case O_TEST_DIR: p.test_data_dir = optarg; break;
        case O_OUTPUT_DIR: p.output_dir = optarg; break;
        case O_OPTIMIZER: p.optimizer = optarg; break;
        case O_LR: rc = parse_f(flag, optarg, &p.learning_rate); break;
        case O_WARMUP_RATIO: rc = parse_f(flag, optarg, &p.warmup_ratio); break;
        case O_WARMUP_MODE: {
            om_status *st = om_lr_warmup_mode_parse(optarg, &p.warmup_mode);
            if (st) {
                fprintf(stderr, "ortmod-train: error: --%s\n", om_status_message(st));
                om_status_free(st);
                rc = 2;
            }
            break;
        }
        case O_STEPS: rc = parse_i64(flag, optarg, &p.num_train_steps); break;
        case O_BATCH: rc = parse_i64(flag, optarg, &p.train_batch_size); break;
        case O_EVAL_BATCH: rc = parse_i64(flag, optarg, &p.eval_batch_size); break;
        case O_ACCUM: rc = parse_i64(flag, optarg, &p.gradient_accumulation_steps); break;
        case O_MIXED: p.use_mixed_precision = 1; break;
        case O_MIXED_TYPE:
            if (!strcasecmp(optarg, "fp16") || !strcasecmp(optarg, "float16")) p.mixed_precision_type = OM_F16;
            else if (!strcasecmp(optarg, "bf16") || !strcasecmp(optarg, "bfloat16")) p.mixed_precision_type = OM_BF16;
            else {
                fprintf(stderr, "ortmod-train: error: --mixed_precision_type: '%s' is not fp16 or bf16\n", optarg);
                rc = 2;
            }
            break;
        case O_BF16: p.mixed_precision_type = OM_BF16; p.use_mixed_precision = 1; break;
        case O_LOSS_SCALE: rc = parse_f(flag, optarg, &p.loss_scale); break;
        case O_INIT_SCALE: rc = parse_f(flag, optarg, &p.initial_loss_scale); break;
        case O_SCALE_WINDOW: rc = parse_i64(flag, optarg, &p.loss_scale_window); break;
        case O_CKPT_DIR: p.checkpoints_dir = optarg; break;
        case O_CKPT_PERIOD: rc = parse_i64(flag, optarg, &p.checkpoint_period); break;
        case O_MAX_CKPT: rc = parse_i64(flag, optarg, &i64); p.max_num_checkpoints = (int)i64; break;
        case O_EVAL_PERIOD: rc = parse_i64(flag, optarg, &p.evaluation_period); break;
        case O_DISPLAY: rc = parse_i64(flag, optarg, &p.display_loss_steps); break;
        case O_PROFILER: p.use_profiler = 1; break;
        case O_LOG_DIR: p.log_dir = optarg; break;
        case O_SEED: rc = parse_i64(flag, optarg, &i64); p.seed = (uint64_t)i64; break;
        case O_LOSS:
            if (!strcasecmp(optarg, "softmax_cross_entropy") || !strcasecmp(optarg, "sce")) p.loss = OM_LOSS_SOFTMAX_CROSS_ENTROPY;
            else if (!strcasecmp(optarg, "mse")) p.loss = OM_LOSS_MSE;
            else if (!strcasecmp(optarg, "none")) p.loss = OM_LOSS_NONE;
            else {
                fprintf(stderr, "ortmod-train: error: --loss: '%s' is not softmax_cross_entropy, mse or none\n", optarg);
                rc = 2;
            }
            break;
        case O_LOSS_INPUT: p.loss_input = optarg; break;
        case O_LABEL: p.label_name = optarg; break;
        case O_BETA1: rc = parse_f(flag, optarg, &p.beta1); break;
        case O_BETA2: rc = parse_f(flag, optarg, &p.beta2); break;
        case O_EPS: rc = parse_f(flag, optarg, &p.epsilon); break;
        case O_WD: rc = parse_f(flag, optarg, &p.weight_decay); break;
        case O_ADAM_MODE: rc = parse_i64(flag, optarg, &i64); p.adam_mode = (int)i64; break;
        case O_NO_BIAS_CORR: p.bias_correction = 0; break;
        case O_MOMENTUM: rc = parse_f(flag, optarg, &p.momentum); break;
        case O_MAX_NORM: rc = parse_f(flag, optarg, &p.max_grad_norm); break;
        case O_NO_CLIP: p.clip_grad_norm = 0; break;
        case O_SHUFFLE: p.shuffle = 1; break;
        case O_TRAIN_W: free(wt); wt = split_list(optarg, &p.n_weights_to_train); p.weights_to_train = wt; break;
        case O_NOT_TRAIN_W:
            free(wnt);
            wnt = split_list(optarg, &p.n_weights_not_to_train);
            p.weights_not_to_train = wnt;
            break;
        case O_POLY_POWER: rc = parse_f(flag, optarg, &p.poly_power); break;
        case O_VERBOSE: p.engine_log_level = OM_LOG_INFO; break;
        case O_HELP: case 'h': fputs(usage, stdout); free(wt); free(wnt); return 0;
        default:
            if (optopt && optopt >= O_MODEL)
                fprintf(stderr, "ortmod-train: error: --%s needs a value\n", argv[optind - 1] + 2);
            else
                fprintf(stderr, "ortmod-train: error: unknown option '%s' (see --help)\n", argv[optind - 1]);
            rc = 2;
        }
        if (rc) break;
    }
    if (!rc && optind < argc) {
        fprintf(stderr, "ortmod-train: error: unexpected argument '%s' (see --help)\n", argv[optind]);
        rc = 2;
    }
    if (!rc && !p.model_path) {
        fprintf(stderr, "ortmod-train: error: --model is required (see --help)\n");
        rc = 2;
    }
    /* A testing aid of this program's own (the SIGKILL-and-resume test), read here like its
     * command line rather than through om_options: the engine library never sees it. */
    const char *delay = getenv("ORTMOD_RUNNER_DEBUG_STEP_DELAY_MS");
    if (!rc && delay && *delay) {
        char *end = NULL;
        long ms = strtol(delay, &end, 10);
        if (*end || ms < 0 || ms > 3600000) {
            fprintf(stderr, "ortmod-train: error: ORTMOD_RUNNER_DEBUG_STEP_DELAY_MS: '%s' is not milliseconds in "
                    "0..3600000\n", delay);
            rc = 2;
        } else {
            p.debug_step_delay_ms = (int)ms;
        }
    }
    if (rc) {
        free(wt);
        free(wnt);
        return rc;
    }

    om_runner *r = NULL;
    om_status *st = om_runner_create(&p, &r);
    if (!st) st = om_runner_initialize(r);
    if (!st) st = om_runner_run(r);
    if (st) {
        fprintf(stderr, "ortmod-train: error: %s\n", om_status_message(st));
        om_status_free(st);
        rc = 1;
    }
    om_runner_free(r);
    free(wt);
    free(wnt);
    return rc;
}
