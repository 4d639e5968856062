// hip_emu.cpp — the emulated GPU's scheduler and runtime (hip_emu.h says what it is for).
//
// A launch runs its blocks one after another on the calling thread, one launch at a time in the
// process. A block's threads are fibers with stacks of their own. A fiber runs until it finishes
// or waits at a barrier (the block's, or its warp's), then hands over to the next fiber in thread
// order that can go on; past the last one, the scheduler starts a new round from the first. The
// last thread to reach a barrier opens it. When a round finds no fiber that can go on and some
// have not finished, the block is stuck (a barrier some threads never reach): the launch fails
// with a DEVICE error, as do the other misuses hip_emu.h lists.
#include <cxxabi.h>
#include <dlfcn.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/sysinfo.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "hip_emu.h"

#if !defined(__x86_64__)
#include <ucontext.h>
#endif

namespace luce_emu {

uint3 thread_idx, block_idx;
dim3 block_dim, grid_dim;
int lane = 0;

namespace {

constexpr int MAX_THREADS = 1024;                  // per block, as on every HIP and CUDA device
constexpr size_t MAX_SHARED = 64 * 1024;           // an AMD workgroup's LDS
constexpr size_t STACK_BYTES = 256 * 1024;         // per fiber: kernels keep their "registers" here
constexpr size_t GUARD_BYTES = 4096;               // below each stack, never mapped readable

// ---- fibers --------------------------------------------------------------------------------------

#if defined(__x86_64__)
// luce_emu_switch(save, load): saves the callee-saved registers on the current stack, stores its
// pointer in *save and resumes the stack at load (System V x86-64). The SSE and x87 control words
// are left alone: nothing here changes the rounding mode, and saving them cost a third of a
// switch.
// luce_emu_enter: a new fiber's first frame; it calls fiber_main(r12), which never returns.
extern "C" void luce_emu_switch(void **save, void *load);
asm(R"(
    .text
    .p2align 4
    .type luce_emu_switch, @function
luce_emu_switch:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
    .size luce_emu_switch, .-luce_emu_switch

    .p2align 4
    .type luce_emu_enter, @function
luce_emu_enter:
    movq %r12, %rdi
    callq *%r13
    ud2
    .size luce_emu_enter, .-luce_emu_enter
)");
extern "C" void luce_emu_enter();
#endif

struct Fiber;
void fiber_main(Fiber *f);

enum class Wait { none, block, warp, done };

struct Fiber {
    uint8_t *stack = nullptr;  // lowest usable byte (the guard page is below it)
#if defined(__x86_64__)
    void *sp = nullptr;
#else
    ucontext_t ctx;
#endif
    uint3 idx{};
    int warp = 0, lane = 0;
    Wait wait = Wait::none;
    uint64_t gen = 0;  // the generation of the barrier it waits at
};

static_assert(warpSize == 32 || warpSize == 64, "the emulated wave width is 32 or 64");

struct Warp {
    uint64_t slots[2][warpSize];  // posted bits, by generation parity and lane
    int size = 0, arrived = 0, finished = 0;
    uint64_t gen = 0;
};

struct Block {
    std::vector<Fiber> fibers;
    std::vector<Warp> warps;
    int n = 0, live = 0, arrived = 0;
    uint64_t gen = 0;
    Fiber *current = nullptr;
    const Grid *grid = nullptr;
    std::vector<uint8_t> shared;
    std::string error;  // set by a fiber that stopped the launch
#if defined(__x86_64__)
    void *scheduler_sp = nullptr;
#else
    ucontext_t scheduler;
#endif
};

Block *running = nullptr;  // the block being run

uint8_t *map_stack() {
    void *p = mmap(nullptr, STACK_BYTES + GUARD_BYTES, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) return nullptr;
    mprotect(p, GUARD_BYTES, PROT_NONE);
    return static_cast<uint8_t *>(p) + GUARD_BYTES;
}

#if !defined(__x86_64__)
void fiber_entry() { fiber_main(running->current); }
#endif

// Makes f start at fiber_main when it is first switched to.
void prepare(Fiber &f) {
#if defined(__x86_64__)
    auto *top = reinterpret_cast<uint64_t *>(f.stack + STACK_BYTES - 64);  // 16-aligned
    uint64_t *sp = top - 7;  // r15 r14 r13 r12 rbx rbp, return address: luce_emu_enter runs at top
    sp[0] = sp[1] = 0;                               // r15 r14
    sp[2] = reinterpret_cast<uint64_t>(&fiber_main);  // r13: what luce_emu_enter calls
    sp[3] = reinterpret_cast<uint64_t>(&f);          // r12: its argument
    sp[4] = sp[5] = 0;                               // rbx rbp
    sp[6] = reinterpret_cast<uint64_t>(&luce_emu_enter);
    f.sp = sp;
#else
    getcontext(&f.ctx);
    f.ctx.uc_stack.ss_sp = f.stack;
    f.ctx.uc_stack.ss_size = STACK_BYTES;
    f.ctx.uc_link = nullptr;
    makecontext(&f.ctx, fiber_entry, 0);
#endif
}

bool can_run(const Block &b, const Fiber &f);

// Saves the running context in *save (the scheduler's or a fiber's) and resumes fiber f.
#if defined(__x86_64__)
void resume(Block &b, Fiber &f, void **save) {
#else
void resume(Block &b, Fiber &f, ucontext_t *save) {
#endif
    f.wait = Wait::none;
    b.current = &f;
    thread_idx = f.idx;
    lane = f.lane;
#if defined(__x86_64__)
    luce_emu_switch(save, f.sp);
#else
    swapcontext(save, &f.ctx);
#endif
}

// The running fiber waits (or has finished): the next fiber after it that can go on runs, else
// the scheduler, which starts the next round.
void hand_over(Block &b) {
    Fiber &f = *b.current;
    const int from = int(&f - b.fibers.data());
    for (int i = from + 1; i < b.n && b.error.empty(); ++i) {
        Fiber &next = b.fibers[size_t(i)];
        if (!can_run(b, next)) continue;
#if defined(__x86_64__)
        resume(b, next, &f.sp);
#else
        resume(b, next, &f.ctx);
#endif
        return;
    }
#if defined(__x86_64__)
    luce_emu_switch(&f.sp, b.scheduler_sp);
#else
    swapcontext(&f.ctx, &b.scheduler);
#endif
}

// The fiber stops here for good: the launch fails with `why` once the scheduler sees it.
[[noreturn]] void stop(Block &b, const std::string &why) {
    if (b.error.empty()) b.error = why;
    b.current->wait = Wait::done;
    hand_over(b);
    std::abort();  // never resumed
}

std::string where(const Block &b, const Fiber &f) {
    char text[160];
    std::snprintf(text, sizeof text, "%s, block (%u,%u,%u), thread (%u,%u,%u)", b.grid->kernel, block_idx.x,
                  block_idx.y, block_idx.z, f.idx.x, f.idx.y, f.idx.z);
    return text;
}

void fiber_main(Fiber *f) {
    Block &b = *running;
    b.grid->body();
    f->wait = Wait::done;
    --b.live;
    ++b.warps[f->warp].finished;
    if (b.arrived > 0 && b.arrived == b.live) {  // the others wait at a block barrier: open it
        b.arrived = 0;
        ++b.gen;
    }
    hand_over(b);
    std::abort();  // never resumed
}

bool can_run(const Block &b, const Fiber &f) {
    switch (f.wait) {
        case Wait::none: return true;
        case Wait::block: return b.gen > f.gen;
        case Wait::warp: return b.warps[f.warp].gen > f.gen;
        default: return false;
    }
}

std::string stuck_message(const Block &b) {
    int at_block = 0, at_warp = 0;
    const Fiber *first = nullptr;
    for (const Fiber &f : b.fibers) {
        if (&f - b.fibers.data() >= b.n || f.wait == Wait::done) continue;
        at_block += f.wait == Wait::block;
        at_warp += f.wait == Wait::warp;
        if (!first) first = &f;
    }
    char text[160];
    std::snprintf(text, sizeof text, "%d threads wait at __syncthreads and %d at a warp operation that the "
                  "others never reach", at_block, at_warp);
    return where(b, *first) + ": " + text;
}

// Runs one block of the grid to its end; "" or what stopped it.
std::string run_block(Block &b) {
    const dim3 d = b.grid->block;
    b.n = int(d.x * d.y * d.z);
    if (int(b.fibers.size()) < b.n) {
        const size_t had = b.fibers.size();
        b.fibers.resize(size_t(b.n));
        for (size_t i = had; i < b.fibers.size(); ++i)
            if (!(b.fibers[i].stack = map_stack())) return "cannot map a fiber stack";
    }
    const int n_warps = (b.n + warpSize - 1) / warpSize;
    b.warps.assign(size_t(n_warps), Warp{});
    for (int i = 0; i < b.n; ++i) {
        Fiber &f = b.fibers[size_t(i)];
        f.idx = uint3{unsigned(i) % d.x, unsigned(i) / d.x % d.y, unsigned(i) / (d.x * d.y)};
        f.warp = i / warpSize;
        f.lane = i % warpSize;
        f.wait = Wait::none;
        prepare(f);  // every thread of the block starts at fiber_main
        ++b.warps[size_t(f.warp)].size;
    }
    b.live = b.n;
    b.arrived = 0;
    b.gen = 0;
    b.error.clear();
    while (b.live > 0 && b.error.empty()) {  // one round: the fibers hand over to each other
        int first = 0;
        while (first < b.n && !can_run(b, b.fibers[size_t(first)])) ++first;
        if (first == b.n) return stuck_message(b);
#if defined(__x86_64__)
        resume(b, b.fibers[size_t(first)], &b.scheduler_sp);
#else
        resume(b, b.fibers[size_t(first)], &b.scheduler);
#endif
    }
    return b.error;
}

std::string fail_text;  // the last launch failure, for hipGetErrorString
hipError_t last_error = hipSuccess;
std::mutex launches;  // one launch at a time: the globals above describe it

hipError_t failed(hipError_t e, const std::string &why) {
    fail_text = why;
    last_error = e;
    return e;
}

hipError_t run_grid(const Grid &g) {
    if (g.block.x * g.block.y * g.block.z > unsigned(MAX_THREADS) || g.block.x * g.block.y * g.block.z == 0 ||
        g.grid.x * g.grid.y * g.grid.z == 0)
        return failed(hipErrorInvalidConfiguration, std::string(g.kernel) + ": launch of an empty or too large block");
    if (g.shared > MAX_SHARED)
        return failed(hipErrorInvalidConfiguration, std::string(g.kernel) + ": " + std::to_string(g.shared) +
                                                        " bytes of shared memory (an AMD workgroup has 65536)");
    static Block block;  // fibers and stacks kept between launches
    std::lock_guard<std::mutex> one_at_a_time(launches);
    Block &b = block;
    b.grid = &g;
    b.shared.assign(g.shared, 0xFF);  // operator new's storage: 16-aligned
    running = &b;
    block_dim = g.block;
    grid_dim = g.grid;
    std::string error;
    for (unsigned z = 0; z < g.grid.z && error.empty(); ++z)
        for (unsigned y = 0; y < g.grid.y && error.empty(); ++y)
            for (unsigned x = 0; x < g.grid.x && error.empty(); ++x) {
                block_idx = uint3{x, y, z};
                error = run_block(b);
            }
    running = nullptr;
    return error.empty() ? hipSuccess : failed(hipErrorIllegalState, error);
}

}  // namespace

// ---- what kernels call -----------------------------------------------------------------------------

void *dynamic_shared() { return running->shared.data(); }

void sync_block() {
    Block &b = *running;
    Fiber &f = *b.current;
    f.gen = b.gen;
    if (++b.arrived == b.live) {  // the last to arrive opens the barrier and goes on
        b.arrived = 0;
        ++b.gen;
        return;
    }
    f.wait = Wait::block;
    hand_over(b);
}

uint64_t warp_exchange(uint64_t bits, int src) {
    Block &b = *running;
    Fiber &f = *b.current;
    Warp &w = b.warps[size_t(f.warp)];
    if (w.finished > 0) stop(b, where(b, f) + ": a warp operation after another lane of the warp returned");
    if (src < 0 || src >= w.size) stop(b, where(b, f) + ": a shuffle from lane " + std::to_string(src) +
                                          ", which the warp does not have");
    const uint64_t gen = w.gen;
    w.slots[gen & 1][f.lane] = bits;
    if (++w.arrived == w.size) {
        w.arrived = 0;
        ++w.gen;
    } else {
        f.gen = gen;
        f.wait = Wait::warp;
        hand_over(b);
    }
    return w.slots[gen & 1][src];
}

void sync_warp() { (void)warp_exchange(0, lane_id()); }

bool warp_any(bool p) {
    Block &b = *running;
    (void)warp_exchange(p, lane_id());
    // Every lane has posted this generation's bits, and none can post the next parity's yet.
    const Fiber &f = *b.current;
    const Warp &w = b.warps[size_t(f.warp)];
    const uint64_t gen = w.gen - 1;
    bool any = false;
    for (int lane = 0; lane < w.size; ++lane) any = any || w.slots[gen & 1][lane] != 0;
    return any;
}

void trap(const char *why) {
    Block &b = *running;
    stop(b, where(b, *b.current) + ": " + why);
}

// Kept for the life of the process: grids and their graphs point at the names.
const char *kernel_name(const void *kernel, const char *signature) {
    static std::unordered_map<const void *, std::string> names;
    auto [it, added] = names.try_emplace(kernel);
    if (!added) return it->second.c_str();
    Dl_info info{};
    if (dladdr(kernel, &info) && info.dli_sname && info.dli_saddr == kernel) {
        int status = 0;
        char *plain = abi::__cxa_demangle(info.dli_sname, nullptr, nullptr, &status);
        it->second = status == 0 && plain ? plain : info.dli_sname;
        std::free(plain);
    } else {  // "... [with Params = {A, B}; Args = ...]" -> "a kernel (A, B)"
        const std::string text = signature;
        const size_t from = text.find("Params = {"), to = text.find('}', from);
        it->second = from == std::string::npos || to == std::string::npos
                         ? "a kernel"
                         : "a kernel (" + text.substr(from + 10, to - from - 10) + ")";
    }
    return it->second.c_str();
}

// ---- streams and graphs ------------------------------------------------------------------------

using Op = std::function<hipError_t()>;

struct Stream {
    bool capturing = false;
    std::vector<Op> captured;
};
struct Graph {
    std::vector<Op> ops;
};
struct Event {
    std::chrono::steady_clock::time_point at;
};

namespace {

// Runs op now, or records it when the stream is capturing a graph.
hipError_t enqueue(hipStream_t stream, Op op) {
    if (stream && stream->capturing) {
        stream->captured.push_back(std::move(op));
        return hipSuccess;
    }
    return op();
}

}  // namespace

void launch_grid(hipStream_t stream, Grid grid) {
    auto g = std::make_shared<Grid>(std::move(grid));
    const hipError_t e = enqueue(stream, [g] { return run_grid(*g); });
    if (e != hipSuccess) last_error = e;
}

}  // namespace luce_emu

using namespace luce_emu;

float __half2float(__half h) {
    const uint32_t sign = uint32_t(h.bits & 0x8000u) << 16, exp = (h.bits >> 10) & 0x1F, mant = h.bits & 0x3FF;
    uint32_t bits;
    if (exp == 0x1F) {
        bits = sign | 0x7F800000u | (mant << 13);  // inf, NaN
    } else if (exp != 0) {
        bits = sign | ((exp + 112) << 23) | (mant << 13);
    } else if (mant == 0) {
        bits = sign;
    } else {  // subnormal: normalise
        int e = 113;
        uint32_t m = mant;
        while (!(m & 0x400u)) {
            m <<= 1;
            --e;
        }
        bits = sign | (uint32_t(e) << 23) | ((m & 0x3FFu) << 13);
    }
    return __uint_as_float(bits);
}

const char *hipGetErrorString(hipError_t e) {
    switch (e) {
        case hipSuccess: return "no error";
        case hipErrorInvalidValue: return "invalid value";
        case hipErrorOutOfMemory: return "out of memory";
        case hipErrorNoDevice: return "no device";
        case hipErrorStreamCaptureUnsupported: return "operation not permitted while a stream is capturing";
        default: return fail_text.empty() ? "emulated launch failed" : fail_text.c_str();
    }
}

hipError_t hipGetLastError() {
    const hipError_t e = last_error;
    last_error = hipSuccess;
    return e;
}

hipError_t hipGetDeviceCount(int *n) {
    *n = 1;
    return hipSuccess;
}

hipError_t hipSetDevice(int device) { return device == 0 ? hipSuccess : hipErrorInvalidValue; }

hipError_t hipMemGetInfo(size_t *free_bytes, size_t *total_bytes) {
    struct sysinfo si {};
    sysinfo(&si);
    *free_bytes = size_t(si.freeram + si.bufferram) * si.mem_unit;
    *total_bytes = size_t(si.totalram) * si.mem_unit;
    return hipSuccess;
}

hipError_t hipGetDeviceProperties(hipDeviceProp_t *prop, int device) {
    if (device != 0) return hipErrorInvalidValue;
    *prop = hipDeviceProp_t{};
    std::snprintf(prop->name, sizeof prop->name, "luce emulator (host CPU, wave%d)", warpSize);
    size_t free_bytes = 0;
    hipMemGetInfo(&free_bytes, &prop->totalGlobalMem);
    prop->warpSize = warpSize;
    prop->multiProcessorCount = 8;
    prop->l2CacheSize = 4 << 20;
    prop->major = 11;  // an RDNA3-like part: no CUDA-only path applies
    prop->minor = 0;
    prop->sharedMemPerBlock = 64 * 1024;
    prop->maxThreadsPerBlock = 1024;
    return hipSuccess;
}

hipError_t hipRuntimeGetVersion(int *version) {
    *version = 0;
    return hipSuccess;
}

// Device memory is host memory, NaN bytes until written (hip_emu.h), each allocation ending where
// an unreadable page begins (its start 256-aligned, as the runtime's): a kernel that reads or
// writes past the end of a buffer, by more than the alignment's slack, faults there, and the
// fault handler names the kernel, block and thread.
namespace {

constexpr size_t PAGE = 4096;

struct Mapping {
    void *base;
    size_t bytes;
};
std::mutex allocations_lock;
std::unordered_map<void *, Mapping> allocations;

void on_fault(int sig, siginfo_t *info, void *) {
    char text[512];
    const Block *b = running;
    int n = b && b->current ? std::snprintf(text, sizeof text,
                                            "luce GPU emulator: %s at %p in %s, block (%u,%u,%u), thread (%u,%u,%u)\n",
                                            sig == SIGSEGV ? "invalid access" : "bus error", info->si_addr,
                                            b->grid->kernel, block_idx.x, block_idx.y, block_idx.z,
                                            b->current->idx.x, b->current->idx.y, b->current->idx.z)
                            : std::snprintf(text, sizeof text, "luce GPU emulator: invalid access at %p (host code)\n",
                                            info->si_addr);
    if (n > 0) (void)!write(2, text, size_t(std::min(n, int(sizeof text) - 1)));
    _exit(70);
}

// Once: the fault report above, on an alternate stack (a fiber's overflow faults on its guard).
void install_fault_handler() {
    static std::once_flag once;
    std::call_once(once, [] {
        static std::vector<uint8_t> alt(64 * 1024);
        stack_t ss{};
        ss.ss_sp = alt.data();
        ss.ss_size = alt.size();
        sigaltstack(&ss, nullptr);
        struct sigaction sa {};
        sa.sa_sigaction = on_fault;
        sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
        sigaction(SIGSEGV, &sa, nullptr);
        sigaction(SIGBUS, &sa, nullptr);
    });
}

}  // namespace

hipError_t hipMalloc(void **p, size_t bytes) {
    install_fault_handler();
    const size_t used = (std::max<size_t>(bytes, 1) + 255) / 256 * 256;
    const size_t mapped = (used + PAGE - 1) / PAGE * PAGE + PAGE;
    void *base = mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (base == MAP_FAILED) return hipErrorOutOfMemory;
    uint8_t *guard = static_cast<uint8_t *>(base) + mapped - PAGE;
    mprotect(guard, PAGE, PROT_NONE);
    *p = guard - used;
    std::memset(*p, 0xFF, bytes);
    std::lock_guard<std::mutex> hold(allocations_lock);
    allocations[*p] = Mapping{base, mapped};
    return hipSuccess;
}

hipError_t hipFree(void *p) {
    if (!p) return hipSuccess;
    std::lock_guard<std::mutex> hold(allocations_lock);
    const auto it = allocations.find(p);
    if (it == allocations.end()) return hipErrorInvalidValue;
    munmap(it->second.base, it->second.bytes);
    allocations.erase(it);
    return hipSuccess;
}

hipError_t hipHostMalloc(void **p, size_t bytes, unsigned) {
    *p = std::aligned_alloc(256, (bytes + 255) / 256 * 256);
    return *p ? hipSuccess : hipErrorOutOfMemory;
}

hipError_t hipHostFree(void *p) {
    std::free(p);
    return hipSuccess;
}

hipError_t hipMemsetAsync(void *p, int value, size_t bytes, hipStream_t stream) {
    return enqueue(stream, [=] {
        std::memset(p, value, bytes);
        return hipSuccess;
    });
}

hipError_t hipMemcpyAsync(void *dst, const void *src, size_t bytes, hipMemcpyKind, hipStream_t stream) {
    return enqueue(stream, [=] {
        std::memmove(dst, src, bytes);
        return hipSuccess;
    });
}

hipError_t hipStreamCreateWithFlags(hipStream_t *stream, unsigned) {
    *stream = new Stream;
    return hipSuccess;
}

hipError_t hipStreamDestroy(hipStream_t stream) {
    delete stream;
    return hipSuccess;
}

hipError_t hipStreamSynchronize(hipStream_t stream) {
    return stream && stream->capturing ? hipErrorStreamCaptureUnsupported : hipSuccess;
}

hipError_t hipEventCreate(hipEvent_t *event) {
    *event = new Event;
    return hipSuccess;
}

hipError_t hipEventDestroy(hipEvent_t event) {
    delete event;
    return hipSuccess;
}

hipError_t hipEventRecord(hipEvent_t event, hipStream_t stream) {
    return enqueue(stream, [event] {
        event->at = std::chrono::steady_clock::now();
        return hipSuccess;
    });
}

hipError_t hipEventSynchronize(hipEvent_t) { return hipSuccess; }

hipError_t hipEventElapsedTime(float *ms, hipEvent_t start, hipEvent_t stop) {
    *ms = std::chrono::duration<float, std::milli>(stop->at - start->at).count();
    return hipSuccess;
}

hipError_t hipStreamBeginCapture(hipStream_t stream, hipStreamCaptureMode) {
    if (!stream || stream->capturing) return hipErrorIllegalState;
    stream->capturing = true;
    stream->captured.clear();
    return hipSuccess;
}

hipError_t hipStreamEndCapture(hipStream_t stream, hipGraph_t *graph) {
    if (!stream || !stream->capturing) return hipErrorIllegalState;
    stream->capturing = false;
    *graph = new Graph{std::move(stream->captured)};
    stream->captured.clear();
    return hipSuccess;
}

hipError_t hipGraphInstantiateWithFlags(hipGraphExec_t *exec, hipGraph_t graph, unsigned long long) {
    *exec = new Graph{graph->ops};
    return hipSuccess;
}

hipError_t hipGraphLaunch(hipGraphExec_t exec, hipStream_t stream) {
    for (const Op &op : exec->ops)
        if (const hipError_t e = enqueue(stream, op); e != hipSuccess) return e;
    return hipSuccess;
}

hipError_t hipGraphDestroy(hipGraph_t graph) {
    delete graph;
    return hipSuccess;
}

hipError_t hipGraphExecDestroy(hipGraphExec_t exec) {
    delete exec;
    return hipSuccess;
}
