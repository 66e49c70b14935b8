// emu.cpp — the host side of the CUDA emulator (tests/cuda_emu): kernel launches, device
// memory, the runtime calls and a reference cuBLAS/cuBLASLt, linked with cuda/*.cu compiled
// as C++ into build/cuda-emu/libortmod_cuda_emu.so, which the engine loads in place of the
// real provider (ORTMOD_CUDA_LIBRARY). tests/test_cuda_emulated.py drives it.
//
// What it checks beyond "the numbers match the CPU provider":
//  - launches: CUDA's configuration limits; a __syncthreads that not every thread of the block
//    reaches, or a shuffle whose mask names an absent lane, deadlocks here and is reported
//    (undefined behaviour on a GPU). Blocks run in a shuffled order, and the threads of a
//    block are resumed in a shuffled order after every barrier, so code that silently relies
//    on an execution order (a missing __syncthreads, one block reading another's output)
//    has a chance to show.
//  - memory: every allocation gets its own pages, fenced by inaccessible guard pages right at
//    its end (it is 16-byte aligned, so that a read 16 bytes past its end faults; cudaMalloc
//    aligns to 256) and at its start, and is filled with 0xff bytes (NaN in every float format,
//    -1 in integers; allocations over 16 MiB stay zero) so reading what nobody wrote shows in
//    the results. A kernel
//    touching a guard page or freed memory (kept inaccessible for a while) fails its launch
//    with the kernel's name, block, thread and the address relative to the allocation. Device
//    memory is inaccessible to the host except inside the runtime calls and launches, so host
//    code dereferencing a device pointer crashes with a diagnosis instead of "working".
//  - warp matrix functions (include/mma.h, nvcuda::wmma): every lane of a full warp must make
//    the same call with the same arguments and fragment values; pointers must be 32-byte
//    aligned as GPU addresses (emu_gpu_address) and ldm a multiple of 16 bytes.
//  - runtime/cuBLAS arguments: a copy or memset range must lie inside one allocation, copy
//    kinds must match the pointers, every matrix a GEMM's dims, leading dimensions and batch
//    strides describe must lie inside one allocation, type combinations must be ones cuBLAS
//    supports, a cuBLASLt attribute must be set with its size. Errors the provider may handle
//    by design (a status it falls back on) are still logged: emu_take_errors() hands the log
//    to the test, which fails on any entry.
//  - what a step costs the host: every call that would make the host wait for the device on a
//    GPU (synchronizations, blocking copies, cudaMalloc/cudaFree, handle creation) is counted,
//    and every kernel, async copy, memset, GEMM and pool allocation or free is recorded with the
//    stream it was enqueued on; a stream that cudaStreamCreate did not hand out is an error.
//    emu_take_counters() hands both to the test (the harness's "streams" group).
//
// What it cannot check: real concurrency (threads run one at a time between synchronization
// points; blocks never overlap; streams are synchronous, so a missing stream dependency or
// event is invisible); performance (coalescing, bank conflicts, occupancy, register spills);
// out-of-bounds accesses inside one allocation (the engine's arena holds many tensors);
// bit-exact device math (host libm and no FMA contraction instead of libdevice and nvcc's
// fused multiply-adds; the reference GEMM accumulates in double, not in cuBLAS's order);
// errors a GPU reports asynchronously and stickily are reported here at the launch that
// caused them and are not sticky.
#include <cublasLt.h>
#include <execinfo.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>

#include <deque>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#define EMU_API extern "C" __attribute__((visibility("default")))

thread_local uint3 threadIdx, blockIdx;
thread_local dim3 blockDim, gridDim;

// One emulated device: launches and runtime calls from any host thread take turns.
static std::recursive_mutex g_device;

// ---- errors ------------------------------------------------------------------------------------
// Every problem is printed (stderr), appended to the log the test collects and, for runtime
// calls, returned as the call's error (cudaGetLastError for launches).

static std::string g_log;                  // since the last emu_take_errors()
static cudaError_t g_last = cudaSuccess;   // cudaGetLastError's
static std::string g_last_msg;

static void emu_vlog(const char *fmt, va_list ap) {
    char buf[2048];
    vsnprintf(buf, sizeof buf, fmt, ap);
    fprintf(stderr, "emu: %s\n", buf);
    g_log += buf;
    g_log += '\n';
    g_last_msg = buf;
}

static void emu_log(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    emu_vlog(fmt, ap);
    va_end(ap);
}

static cudaError_t emu_fail(cudaError_t e, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    emu_vlog(fmt, ap);
    va_end(ap);
    g_last = e;
    return e;
}

// The problems logged since the previous call ("" if none); the caller copies the string.
EMU_API const char *emu_take_errors(void) {
    std::lock_guard<std::recursive_mutex> lock(g_device);
    static std::string taken;
    taken.swap(g_log);
    g_log.clear();
    return taken.c_str();
}

// ---- streams, and what the host waits for ------------------------------------------------------
// Work runs at once here, so a stream cannot show a missing dependency; what can be seen is the
// stream every operation was enqueued on and every call that blocks the host on a GPU.

struct emu_stream {
    int unused;   // a handle: only its address matters
};
static std::set<cudaStream_t> g_streams;   // created and not destroyed
// CUDA's special handles: cudaStreamLegacy (the same as 0) and cudaStreamPerThread
static const uintptr_t STREAM_LEGACY = 1, STREAM_PER_THREAD = 2;

// Since the last emu_take_counters(): host-blocking calls by what they were, and per stream
// (0: the legacy default stream) the operations enqueued on it by what they were.
static std::map<std::string, uint64_t> g_syncs;
static std::map<uintptr_t, std::map<std::string, uint64_t>> g_enqueued;

static void note_sync(const std::string &what) {
    std::lock_guard<std::recursive_mutex> lock(g_device);
    g_syncs[what]++;
}

static bool stream_known(cudaStream_t s) {
    uintptr_t v = (uintptr_t)s;
    return v == 0 || v == STREAM_LEGACY || v == STREAM_PER_THREAD || g_streams.count(s);
}

static void note_enqueue(cudaStream_t s, const std::string &what) {
    std::lock_guard<std::recursive_mutex> lock(g_device);
    if (!stream_known(s))
        emu_log("%s: enqueued on stream %p, which cudaStreamCreate did not create", what.c_str(), (void *)s);
    g_enqueued[(uintptr_t)s == STREAM_LEGACY ? 0 : (uintptr_t)s][what]++;
}

static void json_string(std::string &out, const std::string &s) {
    out += '"';
    for (char c : s) {
        if (c == '"' || c == '\\') out += '\\';
        if ((unsigned char)c < 0x20) c = ' ';
        out += c;
    }
    out += '"';
}

static void json_counts(std::string &out, const std::map<std::string, uint64_t> &m) {
    out += '{';
    for (auto &kv : m) {
        if (out.back() != '{') out += ", ";
        json_string(out, kv.first);
        out += ": " + std::to_string(kv.second);
    }
    out += '}';
}

// The counters since the previous call, as JSON, and resets them:
//   {"syncs": {call: count}, "streams": {"<stream as a decimal integer>": {operation: count}}}
EMU_API const char *emu_take_counters(void) {
    std::lock_guard<std::recursive_mutex> lock(g_device);
    static std::string taken;
    taken = "{\"syncs\": ";
    json_counts(taken, g_syncs);
    taken += ", \"streams\": {";
    for (auto &kv : g_enqueued) {
        if (taken.back() != '{') taken += ", ";
        json_string(taken, std::to_string(kv.first));
        taken += ": ";
        json_counts(taken, kv.second);
    }
    taken += "}}";
    g_syncs.clear();
    g_enqueued.clear();
    return taken.c_str();
}

// ---- device memory -----------------------------------------------------------------------------

struct allocation {
    char *map;        // the whole mapping: guard page, data pages, guard page
    size_t map_len;
    char *user;       // what cudaMalloc returned: ends 0..15 bytes before the upper guard page
    size_t n;
};
static std::map<uintptr_t, allocation> g_live;   // by user address
static std::deque<allocation> g_freed;           // inaccessible until recycled (use after free)
static size_t g_freed_bytes;
static const size_t FREED_KEEP = (size_t)1 << 30;   // address space kept for freed allocations
static size_t g_page;
// Larger allocations (cuBLASLt's workspace) are left as the zero pages the kernel maps on first
// use: filling them would make every protection change walk all their pages.
static const size_t FILL_MAX = (size_t)16 << 20;
static int g_open;   // nesting depth of runtime calls/launches: device memory is accessible

static size_t round_up(size_t n, size_t m) { return (n + m - 1) / m * m; }

static void protect(const allocation &a, int prot) {
    mprotect(a.map + g_page, a.map_len - 2 * g_page, prot);
}

// Runtime calls and launches hold the device and open its memory to the host while they run.
struct device_scope {
    std::lock_guard<std::recursive_mutex> lock{g_device};
    device_scope() {
        if (g_open++ == 0)
            for (auto &kv : g_live) protect(kv.second, PROT_READ | PROT_WRITE);
    }
    ~device_scope() {
        if (--g_open == 0)
            for (auto &kv : g_live) protect(kv.second, PROT_NONE);
    }
};

static void install_fault_handler();

static void *dev_alloc(size_t n) {
    install_fault_handler();
    size_t data = round_up(n, g_page);
    size_t len = data + 2 * g_page;
    void *m = mmap(NULL, len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (m == MAP_FAILED) return NULL;
    allocation a;
    a.map = (char *)m;
    a.map_len = len;
    a.user = a.map + g_page + data - round_up(n, 16);
    a.n = n;
    protect(a, PROT_READ | PROT_WRITE);
    if (n <= FILL_MAX) memset(a.map + g_page, 0xff, data);
    if (!g_open) protect(a, PROT_NONE);
    g_live[(uintptr_t)a.user] = a;
    return a.user;
}

static cudaError_t dev_free(void *p, const char *api) {
    if (!p) return cudaSuccess;
    auto it = g_live.find((uintptr_t)p);
    if (it == g_live.end())
        return emu_fail(cudaErrorInvalidValue, "%s(%p): not the start of a live device allocation (double free?)", api, p);
    allocation a = it->second;
    g_live.erase(it);
    protect(a, PROT_NONE);
    madvise(a.map, a.map_len, MADV_DONTNEED);
    g_freed.push_back(a);
    g_freed_bytes += a.map_len;
    while (g_freed_bytes > FREED_KEEP) {
        munmap(g_freed.front().map, g_freed.front().map_len);
        g_freed_bytes -= g_freed.front().map_len;
        g_freed.pop_front();
    }
    return cudaSuccess;
}

// The live allocation holding byte p, or NULL.
static const allocation *find_live(const void *p) {
    auto it = g_live.upper_bound((uintptr_t)p);
    if (it == g_live.begin()) return NULL;
    --it;
    const allocation &a = it->second;
    return (const char *)p >= a.user && (const char *)p < a.user + (a.n ? a.n : 1) ? &a : NULL;
}
static bool is_device(const void *p) { return find_live(p) != NULL; }

// Where addr is relative to the emulated device memory (for fault messages); false if not ours.
static bool describe(const void *addr, char *out, size_t len) {
    const char *p = (const char *)addr;
    for (auto &kv : g_live) {
        const allocation &a = kv.second;
        if (p < a.map || p >= a.map + a.map_len) continue;
        if (p >= a.user + a.n)
            snprintf(out, len, "%zu bytes past the end of a %zu-byte device allocation at %p", (size_t)(p - a.user - a.n),
                     a.n, (void *)a.user);
        else if (p < a.user)
            snprintf(out, len, "%zu bytes before the start of a %zu-byte device allocation at %p", (size_t)(a.user - p),
                     a.n, (void *)a.user);
        else
            snprintf(out, len, "byte %zu of a %zu-byte device allocation at %p", (size_t)(p - a.user), a.n,
                     (void *)a.user);
        return true;
    }
    for (auto &a : g_freed)
        if (p >= a.map && p < a.map + a.map_len) {
            snprintf(out, len, "inside a freed %zu-byte device allocation at %p (use after free)", a.n, (void *)a.user);
            return true;
        }
    return false;
}

// [p, p + n) inside one live allocation; otherwise logs why and returns false.
static bool check_range(const void *p, size_t n, const char *what) {
    if (n == 0) return true;
    const allocation *a = find_live(p);
    if (a && (const char *)p + n <= a->user + a->n) return true;
    char where[256] = "not device memory";
    if (a)
        snprintf(where, sizeof where, "runs %zu bytes past the end of a %zu-byte allocation at %p",
                 (size_t)((const char *)p + n - (a->user + a->n)), a->n, (void *)a->user);
    emu_log("%s: [%p, +%zu bytes) is not inside one device allocation: %s", what, p, n, where);
    return false;
}

// ---- launches: blocks in turn, a block's threads as fibers ---------------------------------------

static const size_t FIBER_STACK = 256 << 10;

// ---- switching between fibers: on x86-64 a few instructions that swap the callee-saved registers
// and the stack pointer (a launch switches millions of times; swapcontext makes a system call
// each time to save the signal mask, which fibers never change); ucontext elsewhere.
#if defined(__x86_64__)
extern "C" void emu_switch_stack(void **save_sp, void *load_sp);
__asm__(".text\n"
        ".globl emu_switch_stack\n"
        ".hidden emu_switch_stack\n"
        ".type emu_switch_stack,@function\n"
        "emu_switch_stack:\n"
        "  pushq %rbp\n  pushq %rbx\n  pushq %r12\n  pushq %r13\n  pushq %r14\n  pushq %r15\n"
        "  movq %rsp, (%rdi)\n"
        "  movq %rsi, %rsp\n"
        "  popq %r15\n  popq %r14\n  popq %r13\n  popq %r12\n  popq %rbx\n  popq %rbp\n"
        "  ret\n"
        ".size emu_switch_stack,.-emu_switch_stack\n");
struct fiber_context {
    void *sp;
};
// A fresh context that starts entry() on the stack [base, base + size) (entry must not return).
static void context_init(fiber_context *c, char *base, size_t size, void (*entry)()) {
    uintptr_t top = ((uintptr_t)base + size) & ~(uintptr_t)15;
    void **sp = (void **)(top - 16);   // entry sees rsp = top - 8, as after a call
    *sp = (void *)entry;               // where emu_switch_stack's ret goes
    sp -= 6;                           // rbp, rbx, r12..r15: zero
    memset(sp, 0, 6 * sizeof *sp);
    c->sp = sp;
}
static void context_switch(fiber_context *from, fiber_context *to) { emu_switch_stack(&from->sp, to->sp); }
#else
struct fiber_context {
    ucontext_t uc;
};
static void context_init(fiber_context *c, char *base, size_t size, void (*entry)()) {
    getcontext(&c->uc);
    c->uc.uc_stack.ss_sp = base;
    c->uc.uc_stack.ss_size = size;
    c->uc.uc_link = NULL;
    makecontext(&c->uc, entry, 0);
}
static void context_switch(fiber_context *from, fiber_context *to) { swapcontext(&from->uc, &to->uc); }
#endif

enum fiber_state { READY, AT_BARRIER, AT_WARP, DONE };
struct fiber {
    fiber_context ctx;
    char *stack;
    fiber_state state;
    unsigned long gen;   // the barrier generation it waits for to end
};
struct warp_exchange {
    unsigned arrived, mask;
    unsigned long gen;
    size_t size;
    unsigned char val[32][8];
    int src[32];
    void *out[32];
};
struct launch {
    const char *kernel;
    dim3 grid, block;
    unsigned nt;
    void (*body)(void *);
    void *arg;
    std::vector<fiber> fibers;
    warp_exchange warps[32];
    std::vector<const void *> slots;   // emu_warp_slots(): 32 per warp
    unsigned bar_arrived;
    unsigned long bar_gen;
    unsigned cur;              // the running fiber
    bool in_fiber;
    fiber_context sched;
    sigjmp_buf on_fault;
    std::string error;         // set by a fiber: ends the launch
};
static thread_local launch *t_launch;
static thread_local std::vector<char *> t_stacks;   // reused across launches
static uint64_t g_launches, g_seed;

EMU_API unsigned long long emu_launch_count(void) { return g_launches; }

static uint64_t splitmix(uint64_t *s) {
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
static uint64_t gcd(uint64_t a, uint64_t b) {
    while (b) { uint64_t t = a % b; a = b; b = t; }
    return a;
}
// A permutation of [0, n) as k -> (a k + c) mod n with a coprime to n: no table needed.
struct shuffle {
    uint64_t n, a, c;
    shuffle(uint64_t n_, uint64_t *rng) : n(n_), a(1), c(0) {
        if (n < 2) return;
        a = splitmix(rng) % n;
        while (gcd(a, n) != 1) a = (a + 1) % n;
        c = splitmix(rng) % n;
    }
    uint64_t operator()(uint64_t k) const { return (uint64_t)(((unsigned __int128)a * k + c) % n); }
};

static void fail_in_fiber(const char *fmt, ...) {
    launch *L = t_launch;
    char buf[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    if (L->error.empty()) {
        char where[200];
        snprintf(where, sizeof where, "kernel %s, block (%u,%u,%u), thread (%u,%u,%u): ", L->kernel, blockIdx.x,
                 blockIdx.y, blockIdx.z, threadIdx.x, threadIdx.y, threadIdx.z);
        L->error = std::string(where) + buf;
    }
    L->fibers[L->cur].state = DONE;   // never resumed: the launch ends
    context_switch(&L->fibers[L->cur].ctx, &L->sched);
}

static void yield_to_scheduler() {
    launch *L = t_launch;
    context_switch(&L->fibers[L->cur].ctx, &L->sched);
}

static void fiber_main() {
    launch *L = t_launch;
    L->body(L->arg);
    L->fibers[L->cur].state = DONE;
    yield_to_scheduler();   // never resumed
    __builtin_unreachable();
}

void __syncthreads() {
    launch *L = t_launch;
    fiber &f = L->fibers[L->cur];
    f.state = AT_BARRIER;
    f.gen = L->bar_gen;
    if (++L->bar_arrived == L->nt) {
        L->bar_arrived = 0;
        L->bar_gen++;
    }
    yield_to_scheduler();   // (also when it completed the barrier: the others may go first)
}

int emu_lane() { return (int)(t_launch->cur & 31); }

void emu_kernel_error(const char *fmt, ...) {
    char buf[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    if (!t_launch || !t_launch->in_fiber) {   // a device function called by host code
        fprintf(stderr, "emu: %s (outside a kernel)\n", buf);
        abort();
    }
    fail_in_fiber("%s", buf);
    __builtin_unreachable();
}

uintptr_t emu_gpu_address(const void *p) {
    // the allocation whose mapping (guard pages included) holds p: the last one starting at or
    // before p, or the next one (p in its lower guard page or before its 16-byte-aligned start)
    auto it = g_live.upper_bound((uintptr_t)p);
    const char *c = (const char *)p;
    if (it != g_live.end() && c >= it->second.map) return (uintptr_t)(c - it->second.user);
    if (it != g_live.begin()) {
        const allocation &a = (--it)->second;
        if (c < a.map + a.map_len) return (uintptr_t)(c - a.user);
    }
    if ((uintptr_t)p % 256)   // (rarely: a freed allocation's, so that its use shows as use after free)
        for (auto &a : g_freed)
            if (c >= a.map && c < a.map + a.map_len) return (uintptr_t)(c - a.user);
    return (uintptr_t)p;
}

const void **emu_warp_slots() {
    launch *L = t_launch;
    return &L->slots[L->cur & ~31u];
}

// Publishes the caller's value, waits for every lane of mask; the last lane to arrive hands each
// lane the value of the lane it asked for.
void emu_shfl(unsigned mask, const void *v, void *out, size_t n, int src) {
    launch *L = t_launch;
    unsigned t = L->cur, lane = t & 31, w = t >> 5;
    unsigned lanes_here = L->nt - 32 * w >= 32 ? 32 : L->nt - 32 * w;
    unsigned exist = lanes_here == 32 ? 0xffffffffu : (1u << lanes_here) - 1;
    if (!(mask >> lane & 1)) fail_in_fiber("warp exchange with mask 0x%08x, which leaves out the calling lane %u", mask, lane);
    if (mask & ~exist)
        fail_in_fiber("warp exchange with mask 0x%08x names lanes that do not exist (warp %u has %u lanes; block of %u threads)",
                      mask, w, lanes_here, L->nt);
    warp_exchange &X = L->warps[w];
    if (X.arrived == 0) {
        X.mask = mask;
        X.size = n;
    } else if (X.mask != mask || X.size != n) {
        fail_in_fiber("lanes of warp %u meet in one exchange with different masks (0x%08x, 0x%08x) or value sizes", w,
                      X.mask, mask);
    }
    if (n) memcpy(X.val[lane], v, n);
    X.src[lane] = src;
    X.out[lane] = out;
    X.arrived |= 1u << lane;
    if (X.arrived == X.mask) {
        for (unsigned l = 0; l < 32; l++) {
            if (!(X.mask >> l & 1) || !n) continue;
            int s = X.src[l];
            if (s < 0 || s > 31 || !(X.mask >> s & 1))
                fail_in_fiber("lane %u reads lane %d, which is not in the exchange's mask 0x%08x (undefined value)", l, s,
                              X.mask);
            memcpy(X.out[l], X.val[s], n);
        }
        X.arrived = 0;
        X.gen++;
        return;
    }
    fiber &f = L->fibers[t];
    f.state = AT_WARP;
    f.gen = X.gen;
    yield_to_scheduler();
}

void __syncwarp(unsigned mask) { emu_shfl(mask, NULL, NULL, 0, 0); }

static bool runnable(const launch *L, unsigned t) {
    const fiber &f = L->fibers[t];
    switch (f.state) {
    case READY: return true;
    case AT_BARRIER: return f.gen != L->bar_gen;
    case AT_WARP: return f.gen != L->warps[t >> 5].gen;
    default: return false;
    }
}

static std::string deadlock_report(const launch *L) {
    unsigned at_bar = 0, at_warp = 0, done = 0;
    for (unsigned t = 0; t < L->nt; t++) {
        fiber_state s = L->fibers[t].state;
        at_bar += s == AT_BARRIER;
        at_warp += s == AT_WARP;
        done += s == DONE;
    }
    char buf[400];
    snprintf(buf, sizeof buf,
             "kernel %s, block (%u,%u,%u): deadlock: of %u threads, %u wait at __syncthreads, %u wait in a warp "
             "exchange and %u returned (a barrier or shuffle not every named thread reaches: undefined on a GPU)",
             L->kernel, blockIdx.x, blockIdx.y, blockIdx.z, L->nt, at_bar, at_warp, done);
    return buf;
}

static char *new_stack() {
    // a guard page below the stack: an overflow faults instead of corrupting a neighbour
    size_t len = FIBER_STACK + g_page;
    void *m = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (m == MAP_FAILED) return NULL;
    mprotect(m, g_page, PROT_NONE);
    return (char *)m + g_page;
}

// Runs one block to completion; returns false (with L->error set) when it failed.
static bool run_block(launch *L, uint64_t *rng) {
    for (unsigned t = 0; t < L->nt; t++) {
        fiber &f = L->fibers[t];
        context_init(&f.ctx, f.stack, FIBER_STACK, fiber_main);
        f.state = READY;
    }
    L->bar_arrived = 0;
    memset(L->warps, 0, sizeof L->warps);
    L->slots.assign((L->nt + 31) & ~31u, NULL);
    unsigned alive = L->nt;
    while (alive) {
        shuffle order(L->nt, rng);
        bool progressed = false;
        for (unsigned k = 0; k < L->nt; k++) {
            unsigned t = (unsigned)order(k);
            if (!runnable(L, t)) continue;
            L->cur = t;
            threadIdx = {t % L->block.x, t / L->block.x % L->block.y, t / (L->block.x * L->block.y)};
            L->in_fiber = true;
            context_switch(&L->sched, &L->fibers[t].ctx);
            L->in_fiber = false;
            progressed = true;
            if (!L->error.empty()) return false;
            if (L->fibers[t].state == DONE) alive--;
        }
        if (alive && !progressed) {
            L->error = deadlock_report(L);
            return false;
        }
    }
    return true;
}

static bool valid_config(dim3 g, dim3 b, size_t shmem, char *why, size_t len) {
    unsigned long long nt = (unsigned long long)b.x * b.y * b.z;
    if (!g.x || !g.y || !g.z || !b.x || !b.y || !b.z) snprintf(why, len, "a zero grid or block dimension");
    else if (nt > 1024) snprintf(why, len, "%llu threads per block (at most 1024)", nt);
    else if (b.x > 1024 || b.y > 1024 || b.z > 64) snprintf(why, len, "block dims beyond (1024, 1024, 64)");
    else if (g.x > 2147483647u || g.y > 65535 || g.z > 65535) snprintf(why, len, "grid dims beyond (2^31-1, 65535, 65535)");
    else if (shmem) snprintf(why, len, "%zu bytes of dynamic shared memory (not emulated)", shmem);
    else return true;
    return false;
}

void emu_launch_impl(const char *kernel, dim3 g, dim3 b, size_t shmem, cudaStream_t stream, void (*body)(void *),
                     void *arg) {
    device_scope scope;
    note_enqueue(stream, std::string("kernel ") + kernel);
    char why[200];
    if (!valid_config(g, b, shmem, why, sizeof why)) {
        emu_fail(cudaErrorInvalidConfiguration, "kernel %s: invalid launch: grid (%u,%u,%u), block (%u,%u,%u): %s",
                 kernel, g.x, g.y, g.z, b.x, b.y, b.z, why);
        return;
    }
    install_fault_handler();
    launch L;
    L.kernel = kernel;
    L.grid = g;
    L.block = b;
    L.nt = b.x * b.y * b.z;
    L.body = body;
    L.arg = arg;
    L.in_fiber = false;
    L.fibers.resize(L.nt);
    while (t_stacks.size() < L.nt) {
        char *s = new_stack();
        if (!s) {
            emu_fail(cudaErrorMemoryAllocation, "kernel %s: cannot map fiber stacks", kernel);
            return;
        }
        t_stacks.push_back(s);
    }
    for (unsigned t = 0; t < L.nt; t++) L.fibers[t].stack = t_stacks[t];
    launch *outer = t_launch;
    t_launch = &L;
    blockDim = b;
    gridDim = g;
    uint64_t rng = g_seed ^ (++g_launches * 0xD1B54A32D192ED03ull);
    uint64_t nblocks = (uint64_t)g.x * g.y * g.z;
    shuffle order(nblocks, &rng);
    if (sigsetjmp(L.on_fault, 1) == 0) {
        for (uint64_t k = 0; k < nblocks; k++) {
            uint64_t i = order(k);
            blockIdx = {(unsigned)(i % g.x), (unsigned)(i / g.x % g.y), (unsigned)(i / ((uint64_t)g.x * g.y))};
            if (!run_block(&L, &rng)) break;
        }
    }
    L.in_fiber = false;
    t_launch = outer;
    if (!L.error.empty()) emu_fail(cudaErrorLaunchFailure, "%s", L.error.c_str());
}

// ---- faults --------------------------------------------------------------------------------------
// In a kernel: the launch fails with where and what. Elsewhere on device memory: host code
// dereferenced a device pointer; the diagnosis is printed and the process dies as it would.

static struct sigaction g_old_segv, g_old_bus;

static void on_fault(int sig, siginfo_t *si, void *) {
    char where[300];
    bool ours = describe(si->si_addr, where, sizeof where);
    launch *L = t_launch;
    if (L && L->in_fiber) {
        if (!ours) {
            char *s = L->fibers[L->cur].stack;
            if ((char *)si->si_addr < s && (char *)si->si_addr >= s - g_page)
                snprintf(where, sizeof where, "the thread's %zu KiB stack overflowed", FIBER_STACK >> 10);
            else
                snprintf(where, sizeof where, "not device memory (a host pointer, or garbage)");
        }
        char buf[600];
        snprintf(buf, sizeof buf, "kernel %s, block (%u,%u,%u), thread (%u,%u,%u): invalid memory access at %p: %s",
                 L->kernel, blockIdx.x, blockIdx.y, blockIdx.z, threadIdx.x, threadIdx.y, threadIdx.z, si->si_addr,
                 where);
        L->error = buf;
        siglongjmp(L->on_fault, 1);
    }
    if (ours) {
        char buf[600];
        int n = snprintf(buf, sizeof buf,
                         "emu: %s at %p outside any runtime call or kernel: %s (host code dereferenced a device "
                         "pointer; on a GPU this reads garbage or crashes)\n",
                         sig == SIGSEGV ? "SIGSEGV" : "SIGBUS", si->si_addr, where);
        if (write(2, buf, (size_t)n) < 0) {}
        void *frames[32];
        backtrace_symbols_fd(frames, backtrace(frames, 32), 2);
    }
    sigaction(sig, sig == SIGSEGV ? &g_old_segv : &g_old_bus, NULL);   // the fault repeats: Python's faulthandler, then death
}

static void install_alt_stack() {
    static thread_local bool done;
    if (done) return;
    done = true;
    stack_t cur;
    if (sigaltstack(NULL, &cur) == 0 && !(cur.ss_flags & SS_DISABLE)) return;   // the thread has one
    stack_t st;
    st.ss_size = 64 << 10;
    st.ss_sp = malloc(st.ss_size);
    st.ss_flags = 0;
    if (st.ss_sp) sigaltstack(&st, NULL);
}

static void install_fault_handler() {
    static std::once_flag once;
    std::call_once(once, [] {
        g_page = (size_t)sysconf(_SC_PAGESIZE);
        const char *seed = getenv("ORTMOD_EMU_SEED");
        g_seed = seed ? strtoull(seed, NULL, 0) : 1;
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_sigaction = on_fault;
        sa.sa_flags = SA_SIGINFO | SA_ONSTACK | SA_NODEFER;
        sigemptyset(&sa.sa_mask);
        sigaction(SIGSEGV, &sa, &g_old_segv);
        sigaction(SIGBUS, &sa, &g_old_bus);
    });
    install_alt_stack();
}

// ---- runtime -------------------------------------------------------------------------------------

static int g_current_device;

cudaError_t cudaGetLastError(void) {
    std::lock_guard<std::recursive_mutex> lock(g_device);
    cudaError_t e = g_last;
    g_last = cudaSuccess;
    return e;
}
cudaError_t cudaPeekAtLastError(void) { return g_last; }
const char *cudaGetErrorString(cudaError_t e) {
    if (e == cudaSuccess) return "no error";
    static thread_local std::string s;
    s = "(emulated) " + g_last_msg;
    return s.c_str();
}
cudaError_t cudaGetDevice(int *d) { *d = g_current_device; return cudaSuccess; }
cudaError_t cudaSetDevice(int d) {
    if (d != 0) return emu_fail(cudaErrorInvalidDevice, "cudaSetDevice(%d): the emulator has one device", d);
    g_current_device = d;
    return cudaSuccess;
}
cudaError_t cudaGetDeviceCount(int *n) { *n = 1; return cudaSuccess; }

// Streams: created handles are remembered so that work enqueued on anything else is reported.
cudaError_t cudaStreamCreate(cudaStream_t *s) {
    std::lock_guard<std::recursive_mutex> lock(g_device);
    if (!s) return emu_fail(cudaErrorInvalidValue, "cudaStreamCreate: NULL");
    *s = new emu_stream{0};
    g_streams.insert(*s);
    return cudaSuccess;
}
cudaError_t cudaStreamDestroy(cudaStream_t s) {
    std::lock_guard<std::recursive_mutex> lock(g_device);
    if (!g_streams.erase(s))
        return emu_fail(cudaErrorInvalidValue, "cudaStreamDestroy(%p): not a stream cudaStreamCreate made", (void *)s);
    delete s;
    return cudaSuccess;
}
static cudaError_t check_stream(cudaStream_t s, const char *api) {
    std::lock_guard<std::recursive_mutex> lock(g_device);
    if (stream_known(s)) return cudaSuccess;
    return emu_fail(cudaErrorInvalidValue, "%s(%p): not a stream cudaStreamCreate made", api, (void *)s);
}

// Everything is complete when a call returns, so these only count: on a GPU each one makes the
// host wait (a cudaStreamQuery poll is a wait spelled as a loop).
cudaError_t cudaDeviceSynchronize(void) {
    note_sync("cudaDeviceSynchronize");
    return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t s) {
    note_sync("cudaStreamSynchronize");
    return check_stream(s, "cudaStreamSynchronize");
}
cudaError_t cudaStreamQuery(cudaStream_t s) {
    note_sync("cudaStreamQuery");
    return check_stream(s, "cudaStreamQuery");
}

static cudaError_t device_malloc(void **p, size_t n, const char *api) {
    device_scope scope;
    *p = n ? dev_alloc(n) : NULL;
    return *p || !n ? cudaSuccess : emu_fail(cudaErrorMemoryAllocation, "%s(%zu): out of memory", api, n);
}
// cudaMalloc and cudaFree synchronize the device on a GPU (the stream-ordered pool does not).
cudaError_t cudaMalloc(void **p, size_t n) {
    note_sync("cudaMalloc");
    return device_malloc(p, n, "cudaMalloc");
}
cudaError_t cudaFree(void *p) {
    device_scope scope;
    note_sync("cudaFree");
    return dev_free(p, "cudaFree");
}

// The kind must say where the pointers are (cudaMemcpyDefault: whatever they are).
static cudaError_t check_copy(void *dst, const void *src, size_t n, cudaMemcpyKind kind, const char *api) {
    bool ddev = is_device(dst), sdev = is_device(src);
    if (kind != cudaMemcpyDefault) {
        bool want_d = kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice;
        bool want_s = kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice;
        if (ddev != want_d || sdev != want_s)
            return emu_fail(cudaErrorInvalidValue, "%s(%p <- %p, %zu bytes): kind %d, but dst is %s memory and src %s", api,
                            dst, src, n, (int)kind, ddev ? "device" : "host", sdev ? "device" : "host");
    }
    if ((ddev && !check_range(dst, n, api)) || (sdev && !check_range(src, n, api))) return g_last = cudaErrorInvalidValue;
    return cudaSuccess;
}

// Which way a copy goes, from where its pointers are.
static std::string direction(const void *dst, const void *src) {
    bool d = is_device(dst), s = is_device(src);
    return d && s ? "device to device" : d ? "host to device" : s ? "device to host" : "host to host";
}

// Records a copy on stream: every copy that touches host memory blocks the host. There is no
// pinned host memory here (no cudaMallocHost), and with pageable memory an async copy to the
// host waits for the stream, one from the host may wait to stage it.
static void note_copy(const char *api, const void *dst, const void *src, cudaStream_t stream, bool blocking) {
    std::string what = std::string(api) + " " + direction(dst, src);
    note_enqueue(stream, what);
    if (blocking || what.find("host") != std::string::npos) note_sync(what);
}

static cudaError_t copy(void *dst, const void *src, size_t n, cudaMemcpyKind kind, const char *api) {
    if (!n) return cudaSuccess;
    cudaError_t e = check_copy(dst, src, n, kind, api);
    if (e) return e;
    memmove(dst, src, n);
    return cudaSuccess;
}
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t n, cudaMemcpyKind kind, cudaStream_t stream) {
    device_scope scope;
    note_copy("cudaMemcpyAsync", dst, src, stream, false);
    return copy(dst, src, n, kind, "cudaMemcpyAsync");
}
// On the legacy default stream, and the host waits for it (also device to device: it returns
// once the copy is enqueued there, but that stream waits for every other blocking stream).
cudaError_t cudaMemcpy(void *dst, const void *src, size_t n, cudaMemcpyKind kind) {
    device_scope scope;
    note_copy("cudaMemcpy", dst, src, 0, true);
    return copy(dst, src, n, kind, "cudaMemcpy");
}
cudaError_t cudaMemsetAsync(void *dst, int v, size_t n, cudaStream_t stream) {
    device_scope scope;
    note_enqueue(stream, "cudaMemsetAsync");
    if (!n) return cudaSuccess;
    if (!check_range(dst, n, "cudaMemsetAsync")) return g_last = cudaErrorInvalidValue;
    memset(dst, v, n);
    return cudaSuccess;
}
// (on the legacy default stream: recorded as enqueued there)
cudaError_t cudaMemset(void *dst, int v, size_t n) { return cudaMemsetAsync(dst, v, n, 0); }

// The bytes a pitched 2-D region spans: height rows of width bytes, pitch apart.
static size_t span_2d(size_t pitch, size_t width, size_t height) { return height ? pitch * (height - 1) + width : 0; }

cudaError_t cudaMemset2DAsync(void *dst, size_t pitch, int v, size_t width, size_t height, cudaStream_t stream) {
    device_scope scope;
    note_enqueue(stream, "cudaMemset2DAsync");
    if (!width || !height) return cudaSuccess;
    if (width > pitch && height > 1)
        return emu_fail(cudaErrorInvalidValue, "cudaMemset2DAsync: width %zu > pitch %zu", width, pitch);
    if (!check_range(dst, span_2d(pitch, width, height), "cudaMemset2DAsync")) return g_last = cudaErrorInvalidValue;
    for (size_t r = 0; r < height; r++) memset((char *)dst + r * pitch, v, width);
    return cudaSuccess;
}
cudaError_t cudaMemcpy2DAsync(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width, size_t height,
                              cudaMemcpyKind kind, cudaStream_t stream) {
    device_scope scope;
    note_copy("cudaMemcpy2DAsync", dst, src, stream, false);
    if (!width || !height) return cudaSuccess;
    if ((width > dpitch || width > spitch) && height > 1)
        return emu_fail(cudaErrorInvalidValue, "cudaMemcpy2DAsync: width %zu exceeds a pitch (%zu, %zu)", width, dpitch,
                        spitch);
    bool ddev = is_device(dst), sdev = is_device(src);
    cudaError_t e = check_copy(dst, src, 1, kind, "cudaMemcpy2DAsync");
    if (e) return e;
    if ((ddev && !check_range(dst, span_2d(dpitch, width, height), "cudaMemcpy2DAsync (dst)")) ||
        (sdev && !check_range(src, span_2d(spitch, width, height), "cudaMemcpy2DAsync (src)")))
        return g_last = cudaErrorInvalidValue;
    for (size_t r = 0; r < height; r++) memmove((char *)dst + r * dpitch, (const char *)src + r * spitch, width);
    return cudaSuccess;
}

struct emu_mem_pool {
    int device;
};
cudaError_t cudaMemPoolCreate(cudaMemPool_t *pool, const cudaMemPoolProps *props) {
    if (!props || props->allocType != cudaMemAllocationTypePinned || props->location.type != cudaMemLocationTypeDevice ||
        props->location.id != 0)
        return emu_fail(cudaErrorInvalidValue, "cudaMemPoolCreate: props must ask for pinned memory on device 0");
    *pool = new emu_mem_pool{0};
    return cudaSuccess;
}
cudaError_t cudaMemPoolSetAttribute(cudaMemPool_t pool, cudaMemPoolAttr attr, void *value) {
    if (!pool || !value || attr != cudaMemPoolAttrReleaseThreshold)
        return emu_fail(cudaErrorInvalidValue, "cudaMemPoolSetAttribute: unexpected arguments");
    return cudaSuccess;
}
// Pooled memory is fresh (0xff-filled, guarded) memory each time: what a pool hands back after
// reuse is garbage on a GPU too.
cudaError_t cudaMallocFromPoolAsync(void **p, size_t n, cudaMemPool_t pool, cudaStream_t stream) {
    note_enqueue(stream, "cudaMallocFromPoolAsync");
    if (!pool) return emu_fail(cudaErrorInvalidValue, "cudaMallocFromPoolAsync: no pool");
    return device_malloc(p, n, "cudaMallocFromPoolAsync");
}
cudaError_t cudaFreeAsync(void *p, cudaStream_t stream) {
    device_scope scope;
    note_enqueue(stream, "cudaFreeAsync");
    return dev_free(p, "cudaFreeAsync");
}

// ---- cuBLAS: column-major reference GEMMs ------------------------------------------------------

struct emu_blas_handle {
    int magic;
    cudaStream_t stream;   // cublasSetStream's: where its GEMMs are enqueued
};
static const int BLAS_MAGIC = 0x0b1a5;

// Creating and destroying a handle allocates and frees device memory: the host waits.
cublasStatus_t cublasCreate(cublasHandle_t *h) {
    note_sync("cublasCreate");
    *h = new emu_blas_handle{BLAS_MAGIC, 0};
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasDestroy(cublasHandle_t h) {
    note_sync("cublasDestroy");
    delete h;
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasSetStream(cublasHandle_t h, cudaStream_t s) {
    if (!h || h->magic != BLAS_MAGIC) return CUBLAS_STATUS_NOT_INITIALIZED;
    if (check_stream(s, "cublasSetStream")) return CUBLAS_STATUS_INVALID_VALUE;
    h->stream = s;
    return CUBLAS_STATUS_SUCCESS;
}

static size_t type_size(cudaDataType t) {
    switch (t) {
    case CUDA_R_64F: return 8;
    case CUDA_R_32F: return 4;
    case CUDA_R_16F: case CUDA_R_16BF: return 2;
    default: return 0;
    }
}
static double load(const void *p, cudaDataType t, long long i) {
    switch (t) {
    case CUDA_R_32F: return ((const float *)p)[i];
    case CUDA_R_64F: return ((const double *)p)[i];
    case CUDA_R_16F: return __half2float(((const __half *)p)[i]);
    default: return __bfloat162float(((const __nv_bfloat16 *)p)[i]);
    }
}
// A 32F-compute result is fp32 before it is stored to a 16-bit C.
static void store(void *p, cudaDataType t, long long i, double v) {
    switch (t) {
    case CUDA_R_32F: ((float *)p)[i] = (float)v; break;
    case CUDA_R_64F: ((double *)p)[i] = v; break;
    case CUDA_R_16F: ((__half *)p)[i] = __float2half_rn((float)v); break;
    default: ((__nv_bfloat16 *)p)[i] = __float2bfloat16_rn((float)v); break;
    }
}

// The (A/B, C) type combinations cuBLAS's GemmEx takes for a compute type (the ones the
// provider could use; anything else is a provider bug here).
static bool types_supported(cublasComputeType_t ct, cudaDataType ab, cudaDataType c) {
    switch (ct) {
    case CUBLAS_COMPUTE_64F: return ab == CUDA_R_64F && c == CUDA_R_64F;
    case CUBLAS_COMPUTE_32F:
        return (ab == CUDA_R_32F && c == CUDA_R_32F) || ((ab == CUDA_R_16F || ab == CUDA_R_16BF) && (c == ab || c == CUDA_R_32F));
    case CUBLAS_COMPUTE_32F_FAST_TF32: return ab == CUDA_R_32F && c == CUDA_R_32F;
    case CUBLAS_COMPUTE_16F: return ab == CUDA_R_16F && c == CUDA_R_16F;
    default: return false;
    }
}
static double scalar(const void *p, cublasComputeType_t ct) {
    if (ct == CUBLAS_COMPUTE_64F) return *(const double *)p;
    if (ct == CUBLAS_COMPUTE_16F) return __half2float(*(const __half *)p);
    return *(const float *)p;
}

struct gemm_problem {
    const char *api;
    int ta, tb;
    long long m, n, k;
    double alpha, beta;
    const void *A, *B, *C;
    void *D;
    cudaDataType ab_type, c_type;
    long long lda, ldb, ldc, ldd;
    long long sa, sb, sc, sd;   // batch strides in elements
    long long batch;
    const void *bias;           // cuBLASLt's bias epilogue: m values added to every column
    cudaDataType bias_type;
    bool gelu;                  // cuBLASLt's GELU epilogue (the tanh approximation), after the bias
    bool dgelu;                 // DGELU: D = (the product) * gelu_tanh'(aux), aux read
    void *aux;                  // GELU_AUX: the GELU's input, D's type and layout with leading dim aux_ld
    long long aux_ld;
};

// The elements a column-major (rows, cols) matrix with leading dimension ld spans, over batch
// copies stride apart.
static size_t matrix_span(long long rows, long long cols, long long ld, long long stride, long long batch) {
    if (!rows || !cols || !batch) return 0;
    return (size_t)((rows - 1) + (cols - 1) * ld + 1 + (batch - 1) * stride);
}

static bool gemm_memory_ok(const gemm_problem &p) {
    size_t es = type_size(p.ab_type), ec = type_size(p.c_type);
    char what[120];
    long long ar = p.ta ? p.k : p.m, ac = p.ta ? p.m : p.k, br = p.tb ? p.n : p.k, bc = p.tb ? p.k : p.n;
    bool ok = true;
    snprintf(what, sizeof what, "%s: A (%lld x %lld, lda %lld)", p.api, ar, ac, p.lda);
    if (p.k) ok &= check_range(p.A, matrix_span(ar, ac, p.lda, p.sa, p.batch) * es, what);
    snprintf(what, sizeof what, "%s: B (%lld x %lld, ldb %lld)", p.api, br, bc, p.ldb);
    if (p.k) ok &= check_range(p.B, matrix_span(br, bc, p.ldb, p.sb, p.batch) * es, what);
    if (p.beta != 0 && p.C != p.D) {
        snprintf(what, sizeof what, "%s: C (%lld x %lld, ldc %lld)", p.api, p.m, p.n, p.ldc);
        ok &= check_range(p.C, matrix_span(p.m, p.n, p.ldc, p.sc, p.batch) * ec, what);
    }
    snprintf(what, sizeof what, "%s: %s (%lld x %lld, ld %lld)", p.api, p.C == p.D ? "C" : "D", p.m, p.n, p.ldd);
    ok &= check_range(p.D, matrix_span(p.m, p.n, p.ldd, p.sd, p.batch) * ec, what);
    if (p.bias) {
        snprintf(what, sizeof what, "%s: bias (%lld values)", p.api, p.m);
        ok &= check_range(p.bias, (size_t)p.m * type_size(p.bias_type), what);
    }
    if (p.aux) {
        snprintf(what, sizeof what, "%s: epilogue aux (%lld x %lld, ld %lld)", p.api, p.m, p.n, p.aux_ld);
        ok &= check_range(p.aux, matrix_span(p.m, p.n, p.aux_ld, 0, 1) * ec, what);
    }
    return ok;
}

// cuBLASLt's GELU epilogue, as documented: the tanh approximation
static double gelu_tanh(double v) {
    return 0.5 * v * (1.0 + tanh(0.7978845608028654 * (v + 0.044715 * v * v * v)));
}

static double gelu_tanh_deriv(double v) {
    const double t = tanh(0.7978845608028654 * (v + 0.044715 * v * v * v));
    return 0.5 * (1.0 + t) + 0.5 * v * (1.0 - t * t) * 0.7978845608028654 * (1.0 + 3 * 0.044715 * v * v);
}

// D = alpha op(A) op(B) + beta C (+ bias per row) (then GELU, its input kept in aux; or times
// GELU's derivative at aux, DGELU), accumulated
// in double. beta 0: C is not read.
static void gemm_compute(const gemm_problem &p) {
    std::vector<double> a((size_t)(p.m * p.k)), b((size_t)(p.k * p.n));
    for (long long bi = 0; bi < p.batch; bi++) {
        const void *A = (const char *)p.A + (size_t)(bi * p.sa) * type_size(p.ab_type);
        const void *B = (const char *)p.B + (size_t)(bi * p.sb) * type_size(p.ab_type);
        const void *C = (const char *)p.C + (size_t)(bi * p.sc) * type_size(p.c_type);
        void *D = (char *)p.D + (size_t)(bi * p.sd) * type_size(p.c_type);
        for (long long i = 0; i < p.m; i++)   // a[i][l] = op(A)(i, l)
            for (long long l = 0; l < p.k; l++)
                a[(size_t)(i * p.k + l)] = load(A, p.ab_type, p.ta ? l + i * p.lda : i + l * p.lda);
        for (long long j = 0; j < p.n; j++)   // b[j][l] = op(B)(l, j)
            for (long long l = 0; l < p.k; l++)
                b[(size_t)(j * p.k + l)] = load(B, p.ab_type, p.tb ? j + l * p.ldb : l + j * p.ldb);
        for (long long j = 0; j < p.n; j++)
            for (long long i = 0; i < p.m; i++) {
                double s = 0;
                const double *ai = &a[(size_t)(i * p.k)], *bj = &b[(size_t)(j * p.k)];
                for (long long l = 0; l < p.k; l++) s += ai[l] * bj[l];
                double v = p.alpha * s;
                if (p.beta != 0) v += p.beta * load(C, p.c_type, i + j * p.ldc);
                if (p.bias) v += load(p.bias, p.bias_type, i);
                if (p.dgelu) v *= gelu_tanh_deriv(load(p.aux, p.c_type, i + j * p.aux_ld));
                else if (p.aux) store(p.aux, p.c_type, i + j * p.aux_ld, v);
                if (p.gelu) v = gelu_tanh(v);
                store(D, p.c_type, i + j * p.ldd, v);
            }
    }
}

static bool op_ok(int op) { return op == CUBLAS_OP_N || op == CUBLAS_OP_T; }

static cublasStatus_t gemm_ex(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                              const void *alpha, const void *A, cudaDataType at, int lda, long long sa, const void *B,
                              cudaDataType bt, int ldb, long long sb, const void *beta, void *C, cudaDataType ct,
                              int ldc, long long sc, int batch, cublasComputeType_t compute, const char *api) {
    device_scope scope;
    if (!h || h->magic != BLAS_MAGIC) {
        emu_log("%s: not a cuBLAS handle", api);
        return CUBLAS_STATUS_NOT_INITIALIZED;
    }
    note_enqueue(h->stream, api);
    int arows = ta == CUBLAS_OP_N ? m : k, brows = tb == CUBLAS_OP_N ? k : n;
    if (!op_ok(ta) || !op_ok(tb) || m < 0 || n < 0 || k < 0 || batch < 0 || lda < std::max(1, arows) ||
        ldb < std::max(1, brows) || ldc < std::max(1, m) || sa < 0 || sb < 0 || sc < 0) {
        emu_log("%s: invalid value: trans %d %d, m %d n %d k %d, lda %d ldb %d ldc %d, strides %lld %lld %lld, batch %d",
                api, ta, tb, m, n, k, lda, ldb, ldc, sa, sb, sc, batch);
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    if (at != bt || !types_supported(compute, at, ct)) {
        emu_log("%s: unsupported types A %d, B %d, C %d with compute type %d", api, at, bt, ct, compute);
        return CUBLAS_STATUS_NOT_SUPPORTED;
    }
    if (is_device(alpha) || is_device(beta)) {
        emu_log("%s: alpha/beta are device pointers, but the pointer mode is host", api);
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    if (!m || !n || !batch) return CUBLAS_STATUS_SUCCESS;
    gemm_problem p = {api, ta == CUBLAS_OP_T, tb == CUBLAS_OP_T, m, n, k, scalar(alpha, compute), scalar(beta, compute),
                      A, B, C, C, at, ct, lda, ldb, ldc, ldc, sa, sb, sc, sc, batch, NULL, CUDA_R_32F, false,
                      NULL, 0};
    if (!gemm_memory_ok(p)) return CUBLAS_STATUS_INVALID_VALUE;
    gemm_compute(p);
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasGemmEx(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                            const void *alpha, const void *A, cudaDataType at, int lda, const void *B, cudaDataType bt,
                            int ldb, const void *beta, void *C, cudaDataType ct, int ldc, cublasComputeType_t compute,
                            cublasGemmAlgo_t) {
    return gemm_ex(h, ta, tb, m, n, k, alpha, A, at, lda, 0, B, bt, ldb, 0, beta, C, ct, ldc, 0, 1, compute,
                   "cublasGemmEx");
}

cublasStatus_t cublasGemmStridedBatchedEx(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n,
                                          int k, const void *alpha, const void *A, cudaDataType at, int lda,
                                          long long sa, const void *B, cudaDataType bt, int ldb, long long sb,
                                          const void *beta, void *C, cudaDataType ct, int ldc, long long sc,
                                          int batch, cublasComputeType_t compute, cublasGemmAlgo_t) {
    return gemm_ex(h, ta, tb, m, n, k, alpha, A, at, lda, sa, B, bt, ldb, sb, beta, C, ct, ldc, sc, batch, compute,
                   "cublasGemmStridedBatchedEx");
}

// ---- cuBLASLt --------------------------------------------------------------------------------------

struct emu_lt_handle {
    int magic;
};
struct emu_lt_matmul_desc {
    cublasComputeType_t compute;
    cudaDataType scale;
    int32_t ta, tb;
    uint32_t epilogue;
    const void *bias;
    int32_t bias_type;   // -1: D's type
    void *aux;           // EPILOGUE_AUX_POINTER / _LD (GELU_AUX epilogues)
    int64_t aux_ld;
};
struct emu_lt_layout {
    cudaDataType type;
    uint64_t rows, cols;
    int64_t ld;
};
struct emu_lt_preference {
    uint64_t max_workspace;
};

cublasStatus_t cublasLtCreate(cublasLtHandle_t *h) {
    note_sync("cublasLtCreate");   // (counted as cublasCreate: setup, never inside a step)
    *h = new emu_lt_handle{BLAS_MAGIC};
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t *d, cublasComputeType_t compute, cudaDataType scale) {
    bool ok = (compute == CUBLAS_COMPUTE_64F && scale == CUDA_R_64F) ||
              ((compute == CUBLAS_COMPUTE_32F || compute == CUBLAS_COMPUTE_32F_FAST_TF32) && scale == CUDA_R_32F) ||
              (compute == CUBLAS_COMPUTE_16F && scale == CUDA_R_16F);
    if (!ok) {
        emu_log("cublasLtMatmulDescCreate: compute type %d with scale type %d", compute, scale);
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    *d = new emu_lt_matmul_desc{compute, scale, CUBLAS_OP_N, CUBLAS_OP_N, CUBLASLT_EPILOGUE_DEFAULT, NULL, -1, NULL, 0};
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t d) {
    delete d;
    return CUBLAS_STATUS_SUCCESS;
}

static cublasStatus_t set_attr(void *field, size_t field_size, const void *buf, size_t size, const char *name) {
    if (size != field_size || !buf) {
        emu_log("cublasLt set attribute %s: %zu bytes given, the attribute has %zu", name, size, field_size);
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    memcpy(field, buf, size);
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t attr,
                                              const void *buf, size_t size) {
    switch (attr) {
    case CUBLASLT_MATMUL_DESC_TRANSA: return set_attr(&d->ta, sizeof d->ta, buf, size, "TRANSA");
    case CUBLASLT_MATMUL_DESC_TRANSB: return set_attr(&d->tb, sizeof d->tb, buf, size, "TRANSB");
    case CUBLASLT_MATMUL_DESC_EPILOGUE: return set_attr(&d->epilogue, sizeof d->epilogue, buf, size, "EPILOGUE");
    case CUBLASLT_MATMUL_DESC_BIAS_POINTER: return set_attr(&d->bias, sizeof d->bias, buf, size, "BIAS_POINTER");
    case CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE:
        return set_attr(&d->bias_type, sizeof d->bias_type, buf, size, "BIAS_DATA_TYPE");
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER:
        return set_attr(&d->aux, sizeof d->aux, buf, size, "EPILOGUE_AUX_POINTER");
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD: return set_attr(&d->aux_ld, sizeof d->aux_ld, buf, size, "EPILOGUE_AUX_LD");
    }
    emu_log("cublasLtMatmulDescSetAttribute: attribute %d is not emulated", (int)attr);
    return CUBLAS_STATUS_NOT_SUPPORTED;
}
cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t *l, cudaDataType type, uint64_t rows, uint64_t cols,
                                          int64_t ld) {
    if (!type_size(type) || ld < (int64_t)std::max<uint64_t>(1, rows)) {
        emu_log("cublasLtMatrixLayoutCreate: type %d, %llu x %llu, ld %lld", type, (unsigned long long)rows,
                (unsigned long long)cols, (long long)ld);
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    *l = new emu_lt_layout{type, rows, cols, ld};
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t l) {
    delete l;
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t *p) {
    *p = new emu_lt_preference{0};
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t p,
                                                    cublasLtMatmulPreferenceAttributes_t attr, const void *buf,
                                                    size_t size) {
    if (attr != CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES) {
        emu_log("cublasLtMatmulPreferenceSetAttribute: attribute %d is not emulated", (int)attr);
        return CUBLAS_STATUS_NOT_SUPPORTED;
    }
    return set_attr(&p->max_workspace, sizeof p->max_workspace, buf, size, "MAX_WORKSPACE_BYTES");
}
cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t p) {
    delete p;
    return CUBLAS_STATUS_SUCCESS;
}

// The problem the descriptor and layouts describe, or false (logged) when they do not fit together.
static bool lt_problem(const emu_lt_matmul_desc *d, const emu_lt_layout *a, const emu_lt_layout *b,
                       const emu_lt_layout *c, const emu_lt_layout *dl, const char *api, gemm_problem *p) {
    if (!d || !a || !b || !c || !dl) {
        emu_log("%s: a NULL descriptor or layout", api);
        return false;
    }
    uint64_t m = d->ta ? a->cols : a->rows, k = d->ta ? a->rows : a->cols;
    uint64_t kb = d->tb ? b->cols : b->rows, n = d->tb ? b->rows : b->cols;
    if (!op_ok(d->ta) || !op_ok(d->tb) || k != kb || c->rows != m || c->cols != n || dl->rows != m || dl->cols != n) {
        emu_log("%s: shapes do not fit: op(A) %llu x %llu, op(B) %llu x %llu, C %llu x %llu, D %llu x %llu", api,
                (unsigned long long)m, (unsigned long long)k, (unsigned long long)kb, (unsigned long long)n,
                (unsigned long long)c->rows, (unsigned long long)c->cols, (unsigned long long)dl->rows,
                (unsigned long long)dl->cols);
        return false;
    }
    if (a->type != b->type || c->type != dl->type || !types_supported(d->compute, a->type, c->type)) {
        emu_log("%s: unsupported types A %d, B %d, C %d, D %d with compute type %d", api, a->type, b->type, c->type,
                dl->type, d->compute);
        return false;
    }
    switch (d->epilogue) {
    case CUBLASLT_EPILOGUE_DEFAULT: case CUBLASLT_EPILOGUE_BIAS: case CUBLASLT_EPILOGUE_GELU:
    case CUBLASLT_EPILOGUE_GELU_BIAS: case CUBLASLT_EPILOGUE_GELU_AUX: case CUBLASLT_EPILOGUE_GELU_AUX_BIAS:
    case CUBLASLT_EPILOGUE_DGELU: break;
    default: emu_log("%s: epilogue %u is not emulated", api, d->epilogue); return false;
    }
    // cuBLASLt's rule for the GELU input matrix: a leading dim divisible by 8, no less than m
    if ((d->epilogue & 128) && (d->aux_ld % 8 || d->aux_ld < (int64_t)m)) {
        emu_log("%s: GELU aux leading dimension %lld (m %llu): must be divisible by 8 and >= m", api,
                (long long)d->aux_ld, (unsigned long long)m);
        return false;
    }
    memset(p, 0, sizeof *p);
    p->api = api;
    p->ta = d->ta == CUBLAS_OP_T;
    p->tb = d->tb == CUBLAS_OP_T;
    p->m = (long long)m;
    p->n = (long long)n;
    p->k = (long long)k;
    p->ab_type = a->type;
    p->c_type = c->type;
    p->lda = a->ld;
    p->ldb = b->ld;
    p->ldc = c->ld;
    p->ldd = dl->ld;
    p->batch = 1;
    p->bias_type = d->bias_type < 0 ? dl->type : (cudaDataType)d->bias_type;
    return true;
}

cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t h, cublasLtMatmulDesc_t d, cublasLtMatrixLayout_t a,
                                              cublasLtMatrixLayout_t b, cublasLtMatrixLayout_t c,
                                              cublasLtMatrixLayout_t dl, cublasLtMatmulPreference_t,
                                              int requested, cublasLtMatmulHeuristicResult_t *res, int *returned) {
    std::lock_guard<std::recursive_mutex> lock(g_device);
    gemm_problem p;
    *returned = 0;
    if (!h || h->magic != BLAS_MAGIC || requested < 1 || !res) {
        emu_log("cublasLtMatmulAlgoGetHeuristic: bad handle, count or result pointer");
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    if (!lt_problem(d, a, b, c, dl, "cublasLtMatmulAlgoGetHeuristic", &p)) return CUBLAS_STATUS_INVALID_VALUE;
    memset(res, 0, sizeof *res);
    res->algo.data[0] = 0xe5u;   // the one "algorithm": cublasLtMatmul checks it was handed this
    res->state = CUBLAS_STATUS_SUCCESS;
    res->wavesCount = 1;
    *returned = 1;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmul(cublasLtHandle_t h, cublasLtMatmulDesc_t d, const void *alpha, const void *A,
                              cublasLtMatrixLayout_t a, const void *B, cublasLtMatrixLayout_t b, const void *beta,
                              const void *C, cublasLtMatrixLayout_t c, void *D, cublasLtMatrixLayout_t dl,
                              const cublasLtMatmulAlgo_t *algo, void *workspace, size_t workspace_size,
                              cudaStream_t stream) {
    device_scope scope;
    const char *api = "cublasLtMatmul";
    note_enqueue(stream, api);
    gemm_problem p;
    if (!h || h->magic != BLAS_MAGIC || !algo || algo->data[0] != 0xe5u) {
        emu_log("%s: bad handle or an algorithm the heuristic did not return", api);
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    if (!lt_problem(d, a, b, c, dl, api, &p)) return CUBLAS_STATUS_INVALID_VALUE;
    if (is_device(alpha) || is_device(beta)) {
        emu_log("%s: alpha/beta are device pointers, but the pointer mode is host", api);
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    if ((d->epilogue & CUBLASLT_EPILOGUE_BIAS) && !d->bias) {
        emu_log("%s: bias epilogue without a bias pointer", api);
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    if ((d->epilogue & 128) && !d->aux) {
        emu_log("%s: GELU_AUX epilogue without an aux pointer", api);
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    if (workspace_size && !check_range(workspace, workspace_size, "cublasLtMatmul workspace"))
        return CUBLAS_STATUS_INVALID_VALUE;
    p.alpha = d->scale == CUDA_R_64F ? *(const double *)alpha : *(const float *)alpha;
    p.beta = d->scale == CUDA_R_64F ? *(const double *)beta : *(const float *)beta;
    p.A = A;
    p.B = B;
    p.C = C;
    p.D = D;
    p.bias = (d->epilogue & CUBLASLT_EPILOGUE_BIAS) ? d->bias : NULL;
    p.gelu = (d->epilogue & CUBLASLT_EPILOGUE_GELU) != 0;
    p.dgelu = d->epilogue == CUBLASLT_EPILOGUE_DGELU;
    p.aux = (d->epilogue & 128) ? d->aux : NULL;
    p.aux_ld = d->aux_ld;
    if (!gemm_memory_ok(p)) return CUBLAS_STATUS_INVALID_VALUE;
    gemm_compute(p);
    return CUBLAS_STATUS_SUCCESS;
}
