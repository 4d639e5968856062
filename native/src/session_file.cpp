// session_file.cpp — a session's state in a file: what the disk prefix cache keeps of a prompt
// (luce.h luce_session_state_save / luce_session_state_load / luce_session_state_image).
//
// Layout (little-endian): StateHeader, then for each attention layer in layer order and each of
// its KV heads the K rows of positions 0 .. n_past-1 followed by their V rows, in the cache's own
// row format (kv_cache.h); then for each recurrent layer its conv window and its delta-rule state
// (fp32). The header names what the bytes are: the format version, the caller's identity bytes
// (the prompt cache puts the model's and its settings' hash there), the cache types and
// rotation, n_past and both blocks' sizes. A file that disagrees with the session on any of them
// is refused before a byte of it reaches the session: a K row stored in another basis or type
// would be read as garbage attention, silently.
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "errors.h"
#include "session.h"

namespace luce {

namespace {

constexpr char STATE_MAGIC[8] = {'L', 'U', 'C', 'E', 'S', 'T', 'A', 'T'};
constexpr uint32_t STATE_VERSION = 1;
constexpr int IDENTITY_MAX = 64;

struct StateHeader {
    char magic[8];
    uint32_t version;
    uint32_t identity_len;
    uint8_t identity[IDENTITY_MAX];
    uint32_t k_type, v_type, rotate;
    int32_t n_past;
    uint64_t kv_bytes, state_bytes;
};

// One contiguous piece of the session's backend memory the file holds, in file order.
struct Piece {
    void *at;
    size_t bytes;
};

// The pieces of s's state at n_past positions, in file order.
std::vector<Piece> state_pieces(const Session &s, int n_past, uint64_t &kv_bytes, uint64_t &state_bytes) {
    const Hparams &hp = s.model->hp;
    std::vector<Piece> kv, rec;
    kv_bytes = state_bytes = 0;
    size_t n_conv, n_ssm;
    state_sizes(hp, n_conv, n_ssm);
    for (int i = 0; i < hp.n_layer; ++i) {
        if (hp.recurrent[size_t(i)]) {
            const RecurrentState &r = s.recurrent[size_t(i)];
            rec.push_back({r.conv, n_conv * sizeof(float)});
            rec.push_back({r.ssm, n_ssm * sizeof(float)});
            state_bytes += (n_conv + n_ssm) * sizeof(float);
            continue;
        }
        const KvLayer &layer = s.kv[size_t(i)];
        const size_t k_row = kv_row_bytes(layer.format.k, hp.head_dim), v_row = kv_row_bytes(layer.format.v, hp.head_dim);
        for (int h = 0; h < hp.n_head_kv[size_t(i)]; ++h) {  // head h's rows start at h * n_ctx
            const size_t row0 = size_t(h) * size_t(layer.n_ctx);
            kv.push_back({static_cast<uint8_t *>(layer.k) + row0 * k_row, size_t(n_past) * k_row});
            kv.push_back({static_cast<uint8_t *>(layer.v) + row0 * v_row, size_t(n_past) * v_row});
            kv_bytes += size_t(n_past) * (k_row + v_row);
        }
    }
    kv.insert(kv.end(), rec.begin(), rec.end());
    return kv;
}

void check_identity(int identity_len, const uint8_t *identity) {
    if (identity_len < 0 || identity_len > IDENTITY_MAX || (identity_len > 0 && !identity))
        fail(LUCE_ERR_INVALID_ARGUMENT, "session state identity: %d bytes (0 .. %d)", identity_len, IDENTITY_MAX);
}

class File {
public:
    File(const std::string &path, const char *mode) : f_(std::fopen(path.c_str(), mode)) {}
    ~File() {
        if (f_) std::fclose(f_);
    }
    File(const File &) = delete;
    File &operator=(const File &) = delete;
    std::FILE *get() const { return f_; }
    // Flushed to the disk and closed; false on any error.
    bool sync_and_close() {
        const bool ok = std::fflush(f_) == 0 && fsync(fileno(f_)) == 0;
        const bool closed = std::fclose(f_) == 0;
        f_ = nullptr;
        return ok && closed;
    }

private:
    std::FILE *f_;
};

// The header of s's state file and, in pieces, the state it is followed by.
StateHeader state_header(const Session &s, const uint8_t *identity, int identity_len, std::vector<Piece> &pieces) {
    check_identity(identity_len, identity);
    StateHeader h{};
    std::memcpy(h.magic, STATE_MAGIC, sizeof(h.magic));
    h.version = STATE_VERSION;
    h.identity_len = uint32_t(identity_len);
    if (identity_len > 0) std::memcpy(h.identity, identity, size_t(identity_len));
    h.k_type = uint32_t(s.kv_format.k), h.v_type = uint32_t(s.kv_format.v), h.rotate = s.kv_format.rotate;
    h.n_past = s.n_past;
    pieces = state_pieces(s, s.n_past, h.kv_bytes, h.state_bytes);
    return h;
}

}  // namespace

void save_session_state(const Session &s, const char *path, const uint8_t *identity, int identity_len) {
    std::vector<Piece> pieces;
    const StateHeader h = state_header(s, identity, identity_len, pieces);

    // Written beside the target and renamed over it: a reader sees the whole file or none, and
    // two writers of one path never interleave.
    static std::atomic<int> counter{0};
    const std::string tmp = std::string(path) + ".partial-" + std::to_string(getpid()) + "-" + std::to_string(counter++);
    try {
        File f(tmp, "wb");
        if (!f.get()) fail(LUCE_ERR_IO, "cannot write %s: %s", tmp.c_str(), std::strerror(errno));
        bool ok = std::fwrite(&h, sizeof(h), 1, f.get()) == 1;
        std::vector<uint8_t> host;
        for (const Piece &p : pieces) {
            if (!ok) break;
            host.resize(p.bytes);
            s.model->backend->download(host.data(), p.at, p.bytes);
            ok = p.bytes == 0 || std::fwrite(host.data(), p.bytes, 1, f.get()) == 1;
        }
        if (!ok || !f.sync_and_close()) fail(LUCE_ERR_IO, "cannot write %s: %s", tmp.c_str(), std::strerror(errno));
        if (std::rename(tmp.c_str(), path) != 0)
            fail(LUCE_ERR_IO, "cannot rename %s to %s: %s", tmp.c_str(), path, std::strerror(errno));
    } catch (...) {
        std::remove(tmp.c_str());
        throw;
    }
}

uint64_t session_state_image(const Session &s, const uint8_t *identity, int identity_len, void *out,
                             uint64_t capacity) {
    std::vector<Piece> pieces;
    const StateHeader h = state_header(s, identity, identity_len, pieces);
    const uint64_t total = sizeof(h) + h.kv_bytes + h.state_bytes;
    if (!out) return total;
    if (capacity < total)
        fail(LUCE_ERR_INVALID_ARGUMENT, "session state image: %llu bytes of room for %llu",
             static_cast<unsigned long long>(capacity), static_cast<unsigned long long>(total));
    auto *dst = static_cast<uint8_t *>(out);
    std::memcpy(dst, &h, sizeof(h));
    dst += sizeof(h);
    for (const Piece &p : pieces) {
        if (p.bytes) s.model->backend->download(dst, p.at, p.bytes);
        dst += p.bytes;
    }
    return total;
}

void load_session_state(Session &s, const char *path, const uint8_t *identity, int identity_len) {
    check_identity(identity_len, identity);
    File f(path, "rb");
    if (!f.get()) fail(LUCE_ERR_IO, "cannot open %s: %s", path, std::strerror(errno));
    StateHeader h{};
    struct stat st {};
    if (fstat(fileno(f.get()), &st) != 0 || std::fread(&h, sizeof(h), 1, f.get()) != 1 ||
        std::memcmp(h.magic, STATE_MAGIC, sizeof(h.magic)) != 0)
        fail(LUCE_ERR_FORMAT, "%s is not a luce session state", path);
    if (h.version != STATE_VERSION)
        fail(LUCE_ERR_FORMAT, "%s is a session state of format version %u (this luce reads %u)", path, h.version,
             STATE_VERSION);
    if (h.identity_len != uint32_t(identity_len) ||
        (identity_len > 0 && std::memcmp(h.identity, identity, size_t(identity_len)) != 0))
        fail(LUCE_ERR_FORMAT, "%s was written for another model or settings", path);
    if (h.k_type != uint32_t(s.kv_format.k) || h.v_type != uint32_t(s.kv_format.v) || h.rotate != s.kv_format.rotate)
        fail(LUCE_ERR_FORMAT, "%s holds another KV cache type or rotation than this session's", path);
    if (h.n_past < 0 || h.n_past > s.n_ctx)
        fail(LUCE_ERR_CONTEXT_FULL, "%s holds %d positions; the session has %d", path, h.n_past, s.n_ctx);
    uint64_t kv_bytes, state_bytes;
    const std::vector<Piece> pieces = state_pieces(s, h.n_past, kv_bytes, state_bytes);
    if (h.kv_bytes != kv_bytes || h.state_bytes != state_bytes ||
        uint64_t(st.st_size) != sizeof(h) + kv_bytes + state_bytes)
        fail(LUCE_ERR_FORMAT, "%s does not match this model's state sizes (%lld bytes)", path,
             static_cast<long long>(st.st_size));
    // Everything checked: from here only a failing read can stop the load, and it leaves the
    // session empty rather than half-loaded.
    std::vector<uint8_t> host;
    for (const Piece &p : pieces) {
        host.resize(p.bytes);
        if (p.bytes && std::fread(host.data(), p.bytes, 1, f.get()) != 1) {
            s.reset();
            fail(LUCE_ERR_IO, "cannot read %s: %s", path, std::strerror(errno));
        }
        s.model->backend->upload(p.at, host.data(), p.bytes);
    }
    s.n_past = h.n_past;
}

}  // namespace luce
