/* ortmod.h — the engine's public API: the one interface both clients use
 * (the CPython binding in python/ and the native runner in csrc/runner/).
 *
 * Worked example: compile an ONNX model once, then take one training step. The text between
 * the "example" marks is compiled and run by tests/test_runner.py (test_header_example).
 *
 * example begin
 *     void *onnx = NULL;
 *     size_t onnx_len = 0;
 *     om_status *st = om_onnx_read_model_file(path, &onnx, &onnx_len);
 *     om_engine *eng = NULL;
 *     om_engine_options opt = om_engine_default_options();
 *     opt.grad_inputs = needs_grad;             // bool per graph input
 *     opt.n_grad_inputs = n_inputs;
 *     if (!st) st = om_engine_create(onnx, onnx_len, &opt, &eng);
 *     om_free(onnx);
 *     if (st) { fprintf(stderr, "%s\n", om_status_message(st)); om_status_free(st); return 1; }
 *
 *     om_tensor out[N_OUT];                     // filled by the engine; data is om_alloc'd
 *     om_stash *stash = NULL;                   // what backward needs from this forward
 *     st = om_engine_forward(eng, inputs, n_inputs, true, out, &stash, NULL, NULL);
 *     // ... a loss from out[] gives dout[], one per output ...
 *     om_tensor grads[N_IN];                    // filled where needs_grad is set
 *     if (!st) st = om_engine_backward(eng, stash, dout, grads);
 *     om_stash_free(stash);
 *     om_engine_free(eng);
 *     if (st) { fprintf(stderr, "%s\n", om_status_message(st)); om_status_free(st); return 1; }
 * example end
 *
 * Ownership: every function that creates something documents who frees it.
 * Errors: every fallible function returns om_status* — NULL on success, otherwise an
 * error the caller owns (om_status_free). Nothing here exits or aborts.
 *
 * Public and internal: the headers in csrc/include/ (this one, ortmod_optim.h,
 * ortmod_runner.h) are the whole interface a client sees; each compiles alone as C11 and as
 * C++. Every other header (those under csrc/<layer>/) is the engine's own and may change
 * with any commit. The clients (the binding in python/, the runner's front end
 * csrc/runner/main.c) include nothing else of the engine: tests/test_public_api.py fails
 * when one does.
 */
#ifndef ORTMOD_H
#define ORTMOD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define OM_MAX_RANK 8

/* ---- status ---------------------------------------------------------------------- */
typedef enum om_code {
    OM_OK = 0,
    OM_INVALID_ARGUMENT,   /* bad input from the caller: dtype, shape, count */
    OM_INVALID_MODEL,      /* the ONNX bytes cannot be parsed or are inconsistent */
    OM_UNSUPPORTED_OP,     /* an op (or an op's attribute value) the engine lacks */
    OM_NO_GRADIENT,        /* an op has no gradient rule but its gradient is needed */
    OM_OUT_OF_MEMORY,
    OM_RUNTIME,            /* a kernel failed at run time (e.g. index out of range) */
    OM_INTERNAL,           /* a bug in the engine: please report */
} om_code;

typedef struct om_status om_status;
om_code     om_status_code(const om_status *st);
const char *om_status_message(const om_status *st);
void        om_status_free(om_status *st);

/* ---- tensors --------------------------------------------------------------------- */
/* Values match ONNX TensorProto.DataType so that Cast and import need no table. */
typedef enum om_dtype {
    OM_UNDEFINED = 0,
    OM_F32 = 1, OM_U8 = 2, OM_I8 = 3, OM_I32 = 6, OM_I64 = 7,
    OM_BOOL = 9, OM_F16 = 10, OM_F64 = 11, OM_BF16 = 16,
} om_dtype;

size_t      om_dtype_size(om_dtype dt);      /* 0 for unknown */
const char *om_dtype_name(om_dtype dt);      /* "float32", ... */

typedef enum om_device_type { OM_CPU = 0, OM_CUDA = 1 } om_device_type;

/* A dense, row-major view. It never owns its data. */
typedef struct om_tensor {
    om_dtype dtype;
    int rank;
    int64_t dims[OM_MAX_RANK];
    void *data;
    om_device_type device;
    int device_id;
} om_tensor;

int64_t om_tensor_numel(const om_tensor *t);
size_t  om_tensor_nbytes(const om_tensor *t);

/* Aligned host memory; what the engine hands out (outputs, gradients) is freed with om_free. */
void *om_alloc(size_t nbytes);
void  om_free(void *p);
/* Running totals of om_alloc calls and bytes since the process started (all threads):
 * a test reads them around a training step to prove the steady state allocates nothing
 * but the outputs and gradients it hands out. Either pointer may be NULL. */
void  om_alloc_stats(size_t *calls, size_t *bytes);

/* ---- threads --------------------------------------------------------------------- */
/* Threads the CPU kernels use, the calling thread included; n < 1 restores the default
 * (om_options.num_threads, i.e. OMP_NUM_THREADS, else the CPUs this process may run on). Also sets OpenBLAS's count,
 * so BLAS and the kernels share one budget. The binding calls it with
 * torch.get_num_threads() so that torch, BLAS and the engine agree. */
void om_set_num_threads(int n);
int  om_get_num_threads(void);

/* GNU OpenMP's region entry point, GOMP_parallel(fn, data, num_threads, flags), which Intel's
 * and LLVM's runtimes export too. Given one (the binding passes the runtime torch is built
 * with), every parallel job runs as a region on that runtime's threads and the engine's own
 * workers stop: the engine and torch then share one team instead of two fighting for the
 * cores. NULL goes back to the engine's own workers; a forked child goes back by itself.
 * om_pool_uses_openmp: 1 while jobs run on an OpenMP runtime. */
typedef void (*om_openmp_parallel_fn)(void (*fn)(void *), void *data, unsigned num_threads, unsigned flags);
void om_pool_use_openmp(om_openmp_parallel_fn parallel);
int  om_pool_uses_openmp(void);

/* ---- engine ---------------------------------------------------------------------- */
typedef enum om_log_level {
    OM_LOG_VERBOSE = 0, OM_LOG_INFO = 1, OM_LOG_WARNING = 2, OM_LOG_ERROR = 3, OM_LOG_FATAL = 4,
} om_log_level;

typedef void (*om_log_fn)(void *user, om_log_level level, const char *message);

/* Ops the client computes (ortmod.PythonOp: a torch.autograd.Function under ORTModule, run in
 * PyTorch with the user's own forward and backward). The engine calls back, on the calling
 * thread, for one node's
 *   OM_CALLBACK_INFER    (plan time) in: the inputs' shapes (data may be NULL); out: dtypes
 *                        preset from the node, the callback sets rank and dims;
 *   OM_CALLBACK_FORWARD  in: the inputs; out: allocated, the callback fills them;
 *   OM_CALLBACK_BACKWARD in: the output gradients (dtype OM_UNDEFINED where none flows);
 *                        out: one per forward input, data NULL where no gradient is wanted.
 * function_id is the node's attribute: the client's own name for what to run. Tensors are on
 * the plan's device (CUDA: device pointers, in order on the stream the call was given). The
 * callback returns NULL or an error it made with om_status_new or om_status_newf. */
typedef enum om_callback_phase {
    OM_CALLBACK_INFER = 0, OM_CALLBACK_FORWARD = 1, OM_CALLBACK_BACKWARD = 2,
} om_callback_phase;
typedef om_status *(*om_callback_fn)(void *user, om_callback_phase phase, int64_t function_id,
                                     const om_tensor *in, int n_in, om_tensor *out, int n_out);
/* A new error status (for callbacks); the message is copied. */
om_status *om_status_new(om_code code, const char *message);
#if defined(__GNUC__) || defined(__clang__)
#define OM_PRINTF_FORMAT(f, a) __attribute__((format(printf, f, a)))
#else
#define OM_PRINTF_FORMAT(f, a)
#endif
/* The same, the message printf-formatted (in full: no length limit). The engine's own errors
 * (om_error, core/core.h) are made by the same code. */
om_status *om_status_newf(om_code code, const char *fmt, ...) OM_PRINTF_FORMAT(2, 3);

typedef struct om_engine_options {
    const bool *grad_inputs;    /* per graph input: compute its gradient (NULL: none → inference only) */
    int n_grad_inputs;
    om_log_level log_level;
    om_log_fn log;              /* NULL: silent */
    void *log_user;
    uint64_t seed;              /* for random ops (Dropout) */
    int memory_opt_level;       /* 0 stash all, 1 recompute cheap activations, 2 recompute layers;
                                   -1 (the default): om_options.memory_opt_level (ORTMODULE_MEMORY_OPT_LEVEL) */
    int max_plans;              /* plans (one per input shape set) kept, least recently used evicted;
                                   0 (the default): om_options.max_cached_plans (ORTMOD_MAX_CACHED_PLANS) */
    om_callback_fn callback;    /* runs PythonOp nodes; NULL: a model holding one is refused */
    void *callback_user;
} om_engine_options;

om_engine_options om_engine_default_options(void);

typedef struct om_engine om_engine;   /* a compiled model: forward + backward graphs, plans per shape */
typedef struct om_stash om_stash;     /* what one forward leaves for its backward */

/* Reads an ONNX file and the external data its tensors name (torch.onnx.export's default
 * for models it exports to a file), returning bytes that hold everything, for om_engine_create.
 * External data is read only from files inside the model's directory: a location that is
 * absolute, holds '..' or resolves outside it, or bytes past a file's end, are refused by name.
 * *bytes is om_alloc'd; the caller om_frees it. */
om_status *om_onnx_read_model_file(const char *path, void **bytes, size_t *n);

/* Parses, optimizes and differentiates. On success *out is owned by the caller (om_engine_free). */
om_status *om_engine_create(const void *onnx_bytes, size_t nbytes, const om_engine_options *opt,
                            om_engine **out);
void om_engine_free(om_engine *eng);

int         om_engine_num_inputs(const om_engine *eng);
int         om_engine_num_outputs(const om_engine *eng);
const char *om_engine_input_name(const om_engine *eng, int i);
const char *om_engine_output_name(const om_engine *eng, int i);
om_dtype    om_engine_input_dtype(const om_engine *eng, int i);
om_dtype    om_engine_output_dtype(const om_engine *eng, int i);
/* 1 when output i carries a gradient back (float output reachable from a grad input). */
int         om_engine_output_differentiable(const om_engine *eng, int i);

/* A JSON report of what compilation and planning did: node counts before and after the
 * passes, what each pass did and where, op counts by kind, and per planned shape set the
 * kernel counts, arena/stash/peak bytes and the largest buffers. The string belongs to
 * the engine and stays valid until the next call or om_engine_free. NULL if out of memory. */
const char *om_engine_report_json(om_engine *eng);

/* Per-op wall time of the CPU kernels (forward and backward apart), reported under
 * "profile" in the JSON report. Turning it on (again) resets the counters; off by default,
 * on at creation when om_options.profile is (ORTMOD_PROFILE=1, ortmod_options.h). */
void om_engine_set_profiling(om_engine *eng, bool on);

/* Random ops draw from a stream keyed by (seed, forward-call counter, node): saving the
 * counter with a checkpoint and restoring it makes a resumed run draw the same masks. */
uint64_t om_engine_rng_offset(const om_engine *eng);
void     om_engine_set_rng_offset(om_engine *eng, uint64_t offset);

/* Serialized ONNX of a stage: "optimized" (forward after passes) or "execution"
 * (forward + backward as the engine runs it). *bytes is om_alloc'd; caller om_frees it. */
om_status *om_engine_export_onnx(const om_engine *eng, const char *stage, void **bytes, size_t *n);

/* Runs the forward. inputs: n_inputs tensors in graph-input order (read in place; they
 * must stay alive until the stash is freed when training). outputs: filled with
 * om_alloc'd data the caller owns. When training and the engine has grad inputs,
 * *stash receives what backward needs (caller frees with om_stash_free); otherwise NULL.
 * inputs_keepalive (may be NULL): per input, an opaque pointer stored in the stash and
 * passed to release() when the stash is freed (the binding keeps DLPack tensors alive). */
typedef void (*om_release_fn)(void *p);
om_status *om_engine_forward(om_engine *eng, const om_tensor *inputs, int n_inputs, bool training,
                             om_tensor *outputs, om_stash **stash,
                             void **inputs_keepalive, om_release_fn release);

/* Runs the backward of one forward. grad_outputs: one per graph output; data NULL means
 * zero. input_grads: one per graph input, filled with om_alloc'd gradients for the grad
 * inputs (data NULL for the others). A stash may be used by one backward only. */
om_status *om_engine_backward(om_engine *eng, om_stash *stash, const om_tensor *grad_outputs,
                              om_tensor *input_grads);
void om_stash_free(om_stash *stash);

/* ---- CUDA streams ---------------------------------------------------------------- */
/* om_engine_forward and om_engine_backward for CUDA tensors, with the stream (a cudaStream_t,
 * as torch.cuda.current_stream().cuda_stream gives it; NULL: the legacy default stream) that
 * the kernels are enqueued on. The host never waits for the device within a step; outputs and
 * gradients are ready in order on that stream. For CPU tensors the stream is ignored.
 * om_engine_backward without a stream enqueues on the stream of the stash's forward; with one,
 * the stash is also freed in order on it. */
om_status *om_engine_forward_stream(om_engine *eng, const om_tensor *inputs, int n_inputs, bool training,
                                    om_tensor *outputs, om_stash **stash, void **inputs_keepalive,
                                    om_release_fn release, void *stream);
om_status *om_engine_backward_stream(om_engine *eng, om_stash *stash, const om_tensor *grad_outputs,
                                     om_tensor *input_grads, void *stream);

/* Frees data the engine handed out (an output's or gradient's om_tensor.data) wherever it
 * lives: om_free for CPU memory, the CUDA provider's pool for device memory, in order on
 * stream (the one it was produced on; ignored for the CPU). NULL data does nothing. */
void om_device_free_data(om_device_type device, int device_id, void *data, void *stream);

/* ---- introspection: the op table, for docs and tests ------------------------------ */
/* Ops the engine implements, 0 <= i < om_op_table_size(). Entry i gives the op's name, its
 * domain ("" for the ONNX default domain), whether it has a gradient rule, and the attributes
 * it implements ("name:type[=v1|v2]", space-separated; "" for none). Any out pointer may be
 * NULL; the strings are static. Returns false, touching nothing, when i is out of range. */
int  om_op_table_size(void);
bool om_op_table_entry(int i, const char **name, const char **domain, bool *has_gradient, const char **attrs);

/* ---- testing: counters the test suite reads (not for applications) --------------- */
/* How many float32 products ran on the bf16 GEMM kernel in this process: a test proves the
 * path ran with it on a CPU that has AVX512-BF16. */
int64_t om_gemm_bf16_count(void);
/* How many float32 products ran on the engine's AVX-512 GEMM kernel (ops/gemm_f32.c). */
int64_t om_gemm_f32_count(void);

#ifdef __cplusplus
}
#endif
#endif /* ORTMOD_H */
