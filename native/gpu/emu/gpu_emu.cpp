// gpu_emu.cpp — the emulated GPU's scheduler and runtime (gpu_emu.h says what it is for).
//
// A launch runs its blocks one after another on the calling thread, one launch at a time in the
// process. A block's threads are fibers with stacks of their own. A fiber runs until it finishes
// or waits at a barrier (the block's, or its warp's), then hands over to the next fiber in thread
// order that can go on; past the last one, the scheduler starts a new round from the first. The
// last thread to reach a barrier opens it; a thread waiting on an mbarrier phase goes on once
// another has arrived at a barrier or landed a copy since it looked. When a round finds no fiber
// that can go on and some have not finished, the block is stuck (a barrier some threads never
// reach, a phase that never completes): the launch fails with a DEVICE error, as do the other
// misuses gpu_emu.h lists.
#include <cxxabi.h>
#include <dlfcn.h>
#include <link.h>
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

#include "gpu_emu.h"
#include "../../src/half.h"

#if !defined(__x86_64__)
#include <ucontext.h>
#endif

namespace luce_emu {

uint3 thread_idx, block_idx;
dim3 block_dim, grid_dim;
int lane = 0;

namespace {

constexpr int MAX_THREADS = 1024;                  // per block, as on every HIP and CUDA device
#if defined(LUCE_HIP)
constexpr size_t MAX_SHARED = 64 * 1024;           // an AMD workgroup's LDS
constexpr size_t DEFAULT_SHARED = MAX_SHARED;
#else
constexpr size_t MAX_SHARED = 227 * 1024;          // an sm_90 block's, where the kernel opted in
constexpr size_t DEFAULT_SHARED = 48 * 1024;       // without the opt-in
#endif
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

enum class Wait { none, block, warp, phase, done };

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

// An mbarrier: a phase completes when every expected arrival has come and every byte the
// arrivals announced has landed.
struct Mbarrier {
    int expected = 0, pending = 0;
    int64_t bytes_due = 0;  // announced by expect_tx, less the bytes landed (a copy may land first)
    uint32_t phase = 0;     // completed phases
};

struct Block {
    std::vector<Fiber> fibers;
    std::vector<Warp> warps;
    int n = 0, live = 0, arrived = 0;
    uint64_t gen = 0;
    uint64_t events = 0;  // mbarrier arrivals and landed copies so far: what a waiting phase needs
    std::unordered_map<uint32_t, Mbarrier> mbarriers;  // by shared address, from their init
    Fiber *current = nullptr;
    const Grid *grid = nullptr;
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
        case Wait::phase: return b.events > f.gen;
        default: return false;
    }
}

std::string stuck_message(const Block &b) {
    int at_block = 0, at_warp = 0, at_phase = 0;
    const Fiber *first = nullptr;
    for (const Fiber &f : b.fibers) {
        if (&f - b.fibers.data() >= b.n || f.wait == Wait::done) continue;
        at_block += f.wait == Wait::block;
        at_warp += f.wait == Wait::warp;
        at_phase += f.wait == Wait::phase;
        if (!first) first = &f;
    }
    char text[200];
    if (at_phase > 0)
        std::snprintf(text, sizeof text, "%d threads wait at __syncthreads, %d at a warp operation and %d on an "
                      "mbarrier phase that never completes", at_block, at_warp, at_phase);
    else
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
    b.events = 0;
    b.mbarriers.clear();
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

// Dynamic shared memory, in the library's own storage: shared_address() maps shared memory to
// 32-bit offsets from one base, which this and every kernel's static __shared__ arrays are near.
alignas(128) uint8_t dynamic_space[MAX_SHARED];
std::unordered_map<const void *, size_t> shared_opt_in;  // cudaFuncSetAttribute, by kernel

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
    std::lock_guard<std::mutex> one_at_a_time(launches);
    const auto opted = shared_opt_in.find(g.fn);
    const size_t allowed = opted == shared_opt_in.end() ? DEFAULT_SHARED : std::max(DEFAULT_SHARED, opted->second);
    if (g.shared > allowed)
#if defined(LUCE_HIP)
        return failed(hipErrorInvalidConfiguration, std::string(g.kernel) + ": " + std::to_string(g.shared) +
                                                        " bytes of shared memory (an AMD workgroup has 65536)");
#else
        return failed(hipErrorInvalidConfiguration, std::string(g.kernel) + ": " + std::to_string(g.shared) +
                                                        " bytes of dynamic shared memory, " + std::to_string(allowed) +
                                                        " allowed (cudaFuncSetAttribute opts in to up to " +
                                                        std::to_string(MAX_SHARED) + ")");
#endif
    static Block block;  // fibers and stacks kept between launches
    Block &b = block;
    b.grid = &g;
    std::memset(dynamic_space, 0xFF, g.shared);
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

void *dynamic_shared() { return dynamic_space; }

hipError_t set_max_dynamic_shared(const void *kernel, int bytes) {
    if (bytes < 0 || size_t(bytes) > MAX_SHARED) return failed(hipErrorInvalidValue, "more shared memory than a block has");
    std::lock_guard<std::mutex> hold(launches);
    shared_opt_in[kernel] = size_t(bytes);
    return hipSuccess;
}

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

const uint64_t *warp_gather(uint64_t bits) {
    (void)warp_exchange(bits, lane_id());
    // Every lane has posted this generation's bits, and none can post the next parity's yet.
    const Block &b = *running;
    const Warp &w = b.warps[size_t(b.current->warp)];
    return w.slots[(w.gen - 1) & 1];
}

void full_warp(unsigned mask) {
    if (mask != 0xFFFFFFFFu) trap("a warp operation on part of the warp (luce's kernels use full warps)");
}

void sync_warp() { (void)warp_exchange(0, lane_id()); }

bool warp_any(bool p) {
    const uint64_t *all = warp_gather(p);
    const int size = running->warps[size_t(running->current->warp)].size;
    bool any = false;
    for (int lane = 0; lane < size; ++lane) any = any || all[lane] != 0;
    return any;
}

void trap(const char *why) {
    Block &b = *running;
    stop(b, where(b, *b.current) + ": " + why);
}

// ---- the PTX that luce's CUDA source writes by hand -------------------------------------------------

namespace {

// Shared memory is this library's own storage: dynamic_space and the kernels' static __shared__
// arrays, all in its writable segments. Its 32-bit addresses are offsets from 2 GiB below
// dynamic_space, which every byte of the library's image has.
struct Image {
    uintptr_t lo = 0, hi = 0;  // the loaded segments around dynamic_space
};
Image library_image() {
    static const Image image = [] {
        Image im;
        dl_iterate_phdr([](dl_phdr_info *info, size_t, void *data) {
            auto &im = *static_cast<Image *>(data);
            const uintptr_t probe = reinterpret_cast<uintptr_t>(dynamic_space);
            uintptr_t lo = UINTPTR_MAX, hi = 0;
            for (int i = 0; i < info->dlpi_phnum; ++i) {
                const ElfW(Phdr) &ph = info->dlpi_phdr[i];
                if (ph.p_type != PT_LOAD) continue;
                lo = std::min<uintptr_t>(lo, info->dlpi_addr + ph.p_vaddr);
                hi = std::max<uintptr_t>(hi, info->dlpi_addr + ph.p_vaddr + ph.p_memsz);
            }
            if (probe < lo || probe >= hi) return 0;
            im.lo = lo, im.hi = hi;
            return 1;
        }, &im);
        return im;
    }();
    return image;
}
uintptr_t shared_base() { return reinterpret_cast<uintptr_t>(dynamic_space) - (uintptr_t(1) << 31); }

// How often each emulated PTX operation ran (warp operations once per warp): luce_emu_ptx_counts.
struct PtxCounts {
    uint64_t mma, ldmatrix, bulk_copies, tensor_copies, phase_waits;
} ptx_counts;

Mbarrier &mbarrier_at(uint32_t bar) {
    const auto it = running->mbarriers.find(bar);
    if (it == running->mbarriers.end()) trap("an mbarrier used before its mbarrier.init");
    return it->second;
}

// Something a waiting phase may need has happened; the phase completes if it now can.
void mbarrier_update(Mbarrier &m) {
    ++running->events;
    if (m.pending == 0 && m.bytes_due == 0) {
        ++m.phase;
        m.pending = m.expected;
    }
}

void landed(uint32_t bar, uint32_t bytes) {
    Mbarrier &m = mbarrier_at(bar);
    m.bytes_due -= bytes;
    mbarrier_update(m);
}

#if !defined(LUCE_HIP)
// The emulated tensor map's fields in CUtensorMap's 128 opaque bytes.
struct TensorMapFields {
    uint64_t magic;
    const uint8_t *base;
    uint64_t dims[2], row_stride;
    uint32_t box[2], elem_bytes;
};
constexpr uint64_t TENSOR_MAP_MAGIC = 0x6c7563652d746d61ull;  // "luce-tma"
static_assert(sizeof(TensorMapFields) <= sizeof(CUtensorMap), "the fields fit the opaque map");

CUresult encode_tiled(CUtensorMap *map, CUtensorMapDataType type, cuuint32_t rank, void *base, const cuuint64_t *dims,
                      const cuuint64_t *strides, const cuuint32_t *box, const cuuint32_t *element_strides,
                      CUtensorMapInterleave, CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill) {
    const uint32_t elem = type == CU_TENSOR_MAP_DATA_TYPE_UINT8 ? 1 : type == CU_TENSOR_MAP_DATA_TYPE_UINT16 ? 2 : 4;
    // The driver's rules for a 2D tiled map, as far as luce's maps reach them.
    const bool ok = rank == 2 && reinterpret_cast<uintptr_t>(base) % 16 == 0 && dims[0] > 0 && dims[1] > 0 &&
                    strides[0] % 16 == 0 && box[0] >= 1 && box[0] <= 256 && box[1] >= 1 && box[1] <= 256 &&
                    box[0] * elem % 16 == 0 && element_strides[0] == 1 && element_strides[1] == 1;
    if (!ok) return CUDA_ERROR_INVALID_VALUE;
    TensorMapFields f{TENSOR_MAP_MAGIC, static_cast<const uint8_t *>(base), {dims[0], dims[1]}, strides[0],
                      {box[0], box[1]}, elem};
    std::memset(map, 0, sizeof *map);
    std::memcpy(map, &f, sizeof f);
    return CUDA_SUCCESS;
}
#endif

}  // namespace

uint32_t shared_address(const void *p) {
    const uintptr_t a = reinterpret_cast<uintptr_t>(p);
    const Image im = library_image();
    if (a < im.lo || a >= im.hi) trap("__cvta_generic_to_shared of an address outside shared memory");
    return uint32_t(a - shared_base());
}

uint8_t *shared_pointer(uint32_t address, uint32_t bytes) {
    const uintptr_t a = shared_base() + address;
    const Image im = library_image();
    if (a < im.lo || a + bytes > im.hi) trap("a shared-memory address outside shared memory");
    return reinterpret_cast<uint8_t *>(a);
}

void ldmatrix_x4(uint32_t row_address, uint32_t (&r)[4]) {
    const uint64_t *all = warp_gather(row_address);
    ptx_counts.ldmatrix += lane == 0;
    for (int i = 0; i < 4; ++i) {
        const uint32_t row = uint32_t(all[8 * i + lane / 4]);
        if (row % 16) trap("ldmatrix: a row address off a 16-byte boundary");
        std::memcpy(&r[i], shared_pointer(row, 16) + 4 * (lane % 4), 4);
    }
}

void mma_s8(int k, const uint32_t *a, const uint32_t *b, int (&d)[4]) {
    uint32_t A[32][4] = {}, B[32][2] = {};  // every lane's fragment registers
    const uint64_t *all = warp_gather(a[0] | uint64_t(a[1]) << 32);
    for (int l = 0; l < 32; ++l) A[l][0] = uint32_t(all[l]), A[l][1] = uint32_t(all[l] >> 32);
    if (k == 32) {
        all = warp_gather(a[2] | uint64_t(a[3]) << 32);
        for (int l = 0; l < 32; ++l) A[l][2] = uint32_t(all[l]), A[l][3] = uint32_t(all[l] >> 32);
    }
    all = warp_gather(k == 32 ? b[0] | uint64_t(b[1]) << 32 : b[0]);
    for (int l = 0; l < 32; ++l) B[l][0] = uint32_t(all[l]), B[l][1] = uint32_t(all[l] >> 32);
    ptx_counts.mma += lane == 0;
    const auto byte = [](uint32_t word, int i) { return int(int8_t(word >> (8 * i))); };
    const int g = lane / 4, tq = lane % 4;
    for (int c = 0; c < 4; ++c) {
        const int row = g + 8 * (c / 2), col = 2 * tq + c % 2;
        int sum = 0;
        for (int kk = 0; kk < k; ++kk) {  // A[row][kk]: lane row % 8, kk % 16 / 4 of register (row / 8, kk / 16)
            const uint32_t aw = A[(row % 8) * 4 + (kk % 16) / 4][row / 8 + 2 * (kk / 16)];
            const uint32_t bw = B[col * 4 + (kk % 16) / 4][kk / 16];
            sum += byte(aw, kk % 4) * byte(bw, kk % 4);
        }
        d[c] = sum;
    }
}

void mbarrier_init(uint32_t bar, int arrivals) {
    if (bar % 8) trap("mbarrier.init: a barrier off an 8-byte boundary");
    if (arrivals < 1) trap("mbarrier.init: a barrier that expects no arrival");
    running->mbarriers[bar] = Mbarrier{arrivals, arrivals, 0, 0};
}

void mbarrier_arrive(uint32_t bar, uint32_t expect_bytes) {
    Mbarrier &m = mbarrier_at(bar);
    if (m.pending == 0) trap("an mbarrier arrival its phase does not count (the phase waits only for bytes)");
    m.bytes_due += expect_bytes;
    --m.pending;
    mbarrier_update(m);
}

void mbarrier_wait(uint32_t bar, uint32_t parity) {
    Block &b = *running;
    while ((mbarrier_at(bar).phase & 1) == (parity & 1)) {
        ++ptx_counts.phase_waits;
        Fiber &f = *b.current;
        f.gen = b.events;
        f.wait = Wait::phase;
        hand_over(b);
    }
}

void bulk_copy(uint32_t dst, const void *src, uint32_t bytes, uint32_t bar) {
    if (dst % 16 || reinterpret_cast<uintptr_t>(src) % 16 || bytes % 16)
        trap("cp.async.bulk: an address or size off a 16-byte boundary");
    std::memcpy(shared_pointer(dst, bytes), src, bytes);
    ++ptx_counts.bulk_copies;
    landed(bar, bytes);
}

#if !defined(LUCE_HIP)
void tensor_copy(uint32_t dst, const void *map, int x, int y, uint32_t bar) {
    TensorMapFields f;
    std::memcpy(&f, map, sizeof f);
    if (f.magic != TENSOR_MAP_MAGIC) trap("cp.async.bulk.tensor: a tensor map the driver did not encode");
    if (dst % 128) trap("cp.async.bulk.tensor: a destination off a 128-byte boundary");
    // The H200 faulted ("an illegal instruction") on boxes whose rows start off a 16-byte boundary.
    if (int64_t(x) * f.elem_bytes % 16) trap("cp.async.bulk.tensor: a box that starts off a 16-byte boundary");
    const uint32_t row_bytes = f.box[0] * f.elem_bytes, bytes = row_bytes * f.box[1];
    uint8_t *out = shared_pointer(dst, bytes);
    for (uint32_t r = 0; r < f.box[1]; ++r)
        for (uint32_t e = 0; e < f.box[0]; ++e) {
            const int64_t ex = int64_t(x) + e, ey = int64_t(y) + r;
            uint8_t *to = out + r * row_bytes + e * f.elem_bytes;
            const bool inside = ex >= 0 && ey >= 0 && uint64_t(ex) < f.dims[0] && uint64_t(ey) < f.dims[1];
            if (inside) std::memcpy(to, f.base + uint64_t(ey) * f.row_stride + uint64_t(ex) * f.elem_bytes, f.elem_bytes);
            else std::memset(to, 0, f.elem_bytes);  // past the array: zeros
        }
    ++ptx_counts.tensor_copies;
    landed(bar, bytes);
}
#endif

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

__half __float2half_rn(float f) { return __half{luce::f32_to_f16(f)}; }

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
    size_t free_bytes = 0;
    hipMemGetInfo(&free_bytes, &prop->totalGlobalMem);
    prop->warpSize = warpSize;
#if defined(LUCE_HIP)
    std::snprintf(prop->name, sizeof prop->name, "luce emulator (host CPU, wave%d)", warpSize);
    prop->multiProcessorCount = 8;
    prop->l2CacheSize = 4 << 20;
    prop->major = 11;  // an RDNA3-like part: no CUDA-only path applies
    prop->minor = 0;
#else
    // An H200's numbers, so the backend picks the kernels it picks there (sm_90: tensor cores,
    // bulk copies, tensor maps, programmatic dependent launch).
    std::snprintf(prop->name, sizeof prop->name, "luce emulator (host CPU, sm_90)");
    prop->multiProcessorCount = 132;
    prop->l2CacheSize = 50 << 20;
    prop->major = 9;
    prop->minor = 0;
#endif
    prop->sharedMemPerBlock = DEFAULT_SHARED;
    prop->maxThreadsPerBlock = 1024;
    return hipSuccess;
}

hipError_t hipRuntimeGetVersion(int *version) {
    *version = 0;
    return hipSuccess;
}

// Device memory is host memory, NaN bytes until written (gpu_emu.h), each allocation ending where
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

#if !defined(LUCE_HIP)
hipError_t cudaGetDriverEntryPointByVersion(const char *symbol, void **fn, unsigned, unsigned long long,
                                            cudaDriverEntryPointQueryResult *status) {
    const bool known = std::string(symbol) == "cuTensorMapEncodeTiled";
    *fn = known ? reinterpret_cast<void *>(&encode_tiled) : nullptr;
    *status = known ? cudaDriverEntryPointSuccess : cudaDriverEntryPointSymbolNotFound;
    return hipSuccess;
}
#endif

// For tests (tests/test_gpu_emu.py): which of the CUDA path's PTX ran, so a check can tell that the
// tensor-core kernels and the copies it meant to run did (out: mma, ldmatrix, bulk copies,
// tensor-map copies, waits on an mbarrier phase not yet complete).
extern "C" void luce_emu_ptx_counts(uint64_t out[5]) {
    const PtxCounts c = ptx_counts;
    const uint64_t v[5] = {c.mma, c.ldmatrix, c.bulk_copies, c.tensor_copies, c.phase_waits};
    std::memcpy(out, v, sizeof v);
}
