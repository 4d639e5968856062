// gguf.cpp — GGUF parsing with every count, length, type and offset validated against the file.
//
// The reader never trusts a number from the file to size an allocation: counts are first bounded
// by the bytes left (each KV needs >= 13 bytes, each tensor info >= 24, each array element >= its
// width), so a crafted n_kv = 2^63 fails immediately instead of reserving memory or looping.
#include "gguf.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "errors.h"
#include "quants.h"

namespace luce {

namespace {

constexpr uint32_t GGUF_MAGIC = 0x46554747;  // "GGUF" read as little-endian u32
constexpr uint64_t DEFAULT_ALIGNMENT = 32;
constexpr uint64_t MAX_NAME_BYTES = 1024;    // tensor names / keys (ggml itself caps names at 64)
const char *ALIGNMENT_KEY = "general.alignment";

// Smallest encoding of one item, used to bound counts by the bytes left before any loop runs.
constexpr uint64_t MIN_KV_BYTES = 8 + 4 + 1;              // empty key, type, 1-byte value
constexpr uint64_t MIN_TENSOR_INFO_BYTES = 8 + 4 + 8 + 4 + 8;  // empty name, n_dims, 1 ne, type, offset

uint64_t scalar_size(GgufType t) {
    switch (t) {
        case GgufType::U8: case GgufType::I8: case GgufType::BOOL: return 1;
        case GgufType::U16: case GgufType::I16: return 2;
        case GgufType::U32: case GgufType::I32: case GgufType::F32: return 4;
        case GgufType::U64: case GgufType::I64: case GgufType::F64: return 8;
        default: return 0;  // string (variable) / array / unknown
    }
}

const char *type_name(GgufType t) {
    static const char *names[] = {"u8", "i8", "u16", "i16", "u32", "i32", "f32", "bool",
                                  "string", "array", "u64", "i64", "f64"};
    uint32_t i = uint32_t(t);
    return i < 13 ? names[i] : "unknown";
}

bool is_integer(GgufType t) {
    switch (t) {
        case GgufType::U8: case GgufType::I8: case GgufType::U16: case GgufType::I16:
        case GgufType::U32: case GgufType::I32: case GgufType::U64: case GgufType::I64: return true;
        default: return false;
    }
}

// Reads little-endian values from [p, end); every read is bounds-checked first.
struct Cursor {
    const uint8_t *begin, *p, *end;

    uint64_t left() const { return uint64_t(end - p); }
    uint64_t pos() const { return uint64_t(p - begin); }

    void need(uint64_t n, const char *what) {
        if (n > left())
            fail(LUCE_ERR_FORMAT, "truncated GGUF: %s needs %llu bytes at offset %llu, %llu left",
                 what, (unsigned long long)n, (unsigned long long)pos(), (unsigned long long)left());
    }
    template <class T>
    T read(const char *what) {
        need(sizeof(T), what);
        T v;
        std::memcpy(&v, p, sizeof(T));  // x86/ARM little-endian hosts
        p += sizeof(T);
        return v;
    }
    std::string_view string(const char *what, uint64_t max_len = UINT64_MAX) {
        uint64_t n = read<uint64_t>(what);
        if (n > left())
            fail(LUCE_ERR_FORMAT, "%s: string length %llu runs past the end of the file", what,
                 (unsigned long long)n);
        if (n > max_len)
            fail(LUCE_ERR_FORMAT, "%s: string length %llu exceeds %llu", what,
                 (unsigned long long)n, (unsigned long long)max_len);
        std::string_view s(reinterpret_cast<const char *>(p), size_t(n));
        p += n;
        return s;
    }
};

GgufType read_type(Cursor &c, const std::string &key, bool element) {
    uint32_t t = c.read<uint32_t>("value type");
    if (t > uint32_t(GgufType::F64))
        fail(LUCE_ERR_FORMAT, "key '%s': unknown %s type %u", key.c_str(),
             element ? "array element" : "value", t);
    return GgufType(t);
}

void read_scalar(Cursor &c, GgufType t, GgufValue &v, const std::string &key) {
    v.type = t;
    switch (t) {
        case GgufType::U8: v.i = c.read<uint8_t>("u8"); break;
        case GgufType::I8: v.i = c.read<int8_t>("i8"); break;
        case GgufType::U16: v.i = c.read<uint16_t>("u16"); break;
        case GgufType::I16: v.i = c.read<int16_t>("i16"); break;
        case GgufType::U32: v.i = c.read<uint32_t>("u32"); break;
        case GgufType::I32: v.i = c.read<int32_t>("i32"); break;
        case GgufType::I64: v.i = c.read<int64_t>("i64"); break;
        case GgufType::U64: {
            uint64_t u = c.read<uint64_t>("u64");
            v.u64_big = u > uint64_t(INT64_MAX);
            v.i = v.u64_big ? INT64_MAX : int64_t(u);
            break;
        }
        case GgufType::F32: v.f = c.read<float>("f32"); break;
        case GgufType::F64: v.f = c.read<double>("f64"); break;
        case GgufType::BOOL: {
            uint8_t b = c.read<uint8_t>("bool");
            if (b > 1) fail(LUCE_ERR_FORMAT, "key '%s': bool value %u is not 0 or 1", key.c_str(), b);
            v.b = b != 0;
            break;
        }
        case GgufType::STRING: v.s = c.string(key.c_str()); break;
        default: fail(LUCE_ERR_INTERNAL, "read_scalar on %s", type_name(t));
    }
}

// Arrays: the element type is validated before a single element is read; nested arrays are
// refused; the count is bounded by the bytes left; string elements are walked one by one.
void read_array(Cursor &c, GgufValue &v, const std::string &key) {
    v.type = GgufType::ARRAY;
    v.elem_type = read_type(c, key, true);
    if (v.elem_type == GgufType::ARRAY)
        fail(LUCE_ERR_FORMAT, "key '%s': nested arrays are not allowed", key.c_str());
    v.count = c.read<uint64_t>("array count");
    v.data = c.p;
    if (v.elem_type == GgufType::STRING) {
        if (v.count > c.left() / 8)
            fail(LUCE_ERR_FORMAT, "key '%s': array of %llu strings cannot fit in the %llu bytes left",
                 key.c_str(), (unsigned long long)v.count, (unsigned long long)c.left());
        for (uint64_t i = 0; i < v.count; ++i) c.string(key.c_str());
        return;
    }
    uint64_t w = scalar_size(v.elem_type);
    if (v.count > c.left() / w)
        fail(LUCE_ERR_FORMAT, "key '%s': array of %llu %s elements runs past the end of the file",
             key.c_str(), (unsigned long long)v.count, type_name(v.elem_type));
    if (v.elem_type == GgufType::BOOL)
        for (uint64_t i = 0; i < v.count; ++i)
            if (c.p[i] > 1) fail(LUCE_ERR_FORMAT, "key '%s': bool element is not 0 or 1", key.c_str());
    c.p += v.count * w;
}

bool mul_overflows(uint64_t a, uint64_t b, uint64_t *out) { return __builtin_mul_overflow(a, b, out); }
bool add_overflows(uint64_t a, uint64_t b, uint64_t *out) { return __builtin_add_overflow(a, b, out); }

// Reads one integer element of an integer array.
int64_t array_int(const GgufValue &v, uint64_t i, const std::string &key) {
    const uint8_t *p = v.data + i * scalar_size(v.elem_type);
    auto get = [&](auto tag) {
        decltype(tag) x;
        std::memcpy(&x, p, sizeof x);
        return x;
    };
    switch (v.elem_type) {
        case GgufType::U8: return get(uint8_t());
        case GgufType::I8: return get(int8_t());
        case GgufType::U16: return get(uint16_t());
        case GgufType::I16: return get(int16_t());
        case GgufType::U32: return get(uint32_t());
        case GgufType::I32: return get(int32_t());
        case GgufType::I64: return get(int64_t());
        case GgufType::U64: {
            uint64_t u = get(uint64_t());
            if (u > uint64_t(INT64_MAX)) fail(LUCE_ERR_FORMAT, "key '%s': value out of range", key.c_str());
            return int64_t(u);
        }
        default: fail(LUCE_ERR_FORMAT, "key '%s': expected an integer array, found %s elements",
                      key.c_str(), type_name(v.elem_type));
    }
}

}  // namespace

GgufFile *GgufFile::open(const std::string &path) {
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) fail(LUCE_ERR_IO, "cannot open %s: %s", path.c_str(), std::strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        ::close(fd);
        fail(LUCE_ERR_IO, "%s is not a regular file", path.c_str());
    }
    if (st.st_size < 24) {
        ::close(fd);
        fail(LUCE_ERR_FORMAT, "%s is not a GGUF file (%lld bytes, too small for a header)",
             path.c_str(), (long long)st.st_size);
    }
    void *m = mmap(nullptr, size_t(st.st_size), PROT_READ, MAP_PRIVATE, fd, 0);
    ::close(fd);  // the mapping keeps the file alive
    if (m == MAP_FAILED) fail(LUCE_ERR_IO, "cannot mmap %s: %s", path.c_str(), std::strerror(errno));

    GgufFile *f = new GgufFile();
    f->path_ = path;
    f->base_ = static_cast<const uint8_t *>(m);
    f->size_ = size_t(st.st_size);
    try {
        f->parse();
    } catch (...) {
        delete f;
        throw;
    }
    return f;
}

GgufFile::~GgufFile() {
    if (base_) munmap(const_cast<uint8_t *>(base_), size_);
}

void GgufFile::parse() {
    Cursor c{base_, base_, base_ + size_};
    uint32_t magic = c.read<uint32_t>("magic");
    if (magic != GGUF_MAGIC) fail(LUCE_ERR_FORMAT, "%s is not a GGUF file (bad magic)", path_.c_str());
    uint32_t version = c.read<uint32_t>("version");
    if (version != 2 && version != 3)
        fail(LUCE_ERR_FORMAT, "unsupported GGUF version %u (expected 2 or 3)", version);
    uint64_t n_tensors = c.read<uint64_t>("tensor count");
    uint64_t n_kv = c.read<uint64_t>("metadata count");
    if (n_kv > c.left() / MIN_KV_BYTES)
        fail(LUCE_ERR_FORMAT, "metadata count %llu cannot fit in a %zu-byte file",
             (unsigned long long)n_kv, size_);
    if (n_tensors > c.left() / MIN_TENSOR_INFO_BYTES)
        fail(LUCE_ERR_FORMAT, "tensor count %llu cannot fit in a %zu-byte file",
             (unsigned long long)n_tensors, size_);

    for (uint64_t i = 0; i < n_kv; ++i) {
        const uint64_t key_offset = c.pos() + 8;
        std::string key(c.string("metadata key", MAX_NAME_BYTES));
        if (!is_utf8(key))  // the Python reader's message, word for word (inspect and the loader agree)
            fail(LUCE_ERR_FORMAT, "key #%llu at offset %llu is not valid UTF-8", (unsigned long long)i,
                 (unsigned long long)key_offset);
        GgufValue v;
        GgufType t = read_type(c, key, false);
        if (t == GgufType::ARRAY) read_array(c, v, key);
        else read_scalar(c, t, v, key);
        if (!kv_.emplace(key, v).second) fail(LUCE_ERR_FORMAT, "duplicate metadata key '%s'", key.c_str());
    }

    uint64_t alignment = DEFAULT_ALIGNMENT;
    if (const GgufValue *a = find(ALIGNMENT_KEY)) {
        if (!is_integer(a->type) || a->i <= 0 || (a->i & (a->i - 1)) != 0 || a->i > (1 << 20))
            fail(LUCE_ERR_FORMAT, "%s must be a power of two integer", ALIGNMENT_KEY);
        alignment = uint64_t(a->i);
    }

    tensors_.reserve(size_t(n_tensors));  // bounded above by file size / 32
    for (uint64_t i = 0; i < n_tensors; ++i) {
        GgufTensor t;
        const uint64_t name_offset = c.pos() + 8;
        t.name = std::string(c.string("tensor name", MAX_NAME_BYTES));
        if (!is_utf8(t.name))
            fail(LUCE_ERR_FORMAT, "tensor #%llu name at offset %llu is not valid UTF-8", (unsigned long long)i,
                 (unsigned long long)name_offset);
        const char *nm = t.name.c_str();
        uint32_t n_dims = c.read<uint32_t>("tensor n_dims");
        if (n_dims < 1 || n_dims > 4) fail(LUCE_ERR_FORMAT, "tensor %s: n_dims %u not in 1..4", nm, n_dims);
        t.n_dims = int(n_dims);
        uint64_t n_el = 1;
        for (uint32_t d = 0; d < n_dims; ++d) {
            uint64_t ne = c.read<uint64_t>("tensor ne");
            if (ne == 0 || ne > uint64_t(INT64_MAX))
                fail(LUCE_ERR_FORMAT, "tensor %s: dimension %u has invalid size %llu", nm, d,
                     (unsigned long long)ne);
            if (mul_overflows(n_el, ne, &n_el) || n_el > uint64_t(INT64_MAX))
                fail(LUCE_ERR_FORMAT, "tensor %s: element count overflows", nm);
            t.ne[d] = int64_t(ne);
        }
        t.n_elements = int64_t(n_el);
        uint32_t type = c.read<uint32_t>("tensor type");
        const TypeTraits *tt = type_traits(int32_t(type));
        if (!tt) fail(LUCE_ERR_FORMAT, "tensor %s: unknown ggml type %u", nm, type);
        t.type = int32_t(type);
        if (t.ne[0] % tt->block_elems != 0)
            fail(LUCE_ERR_FORMAT, "tensor %s: row of %lld elements is not a multiple of the %s block (%lld)",
                 nm, (long long)t.ne[0], tt->name, (long long)tt->block_elems);
        uint64_t n_blocks = n_el / uint64_t(tt->block_elems);
        if (mul_overflows(n_blocks, uint64_t(tt->block_bytes), &t.n_bytes))
            fail(LUCE_ERR_FORMAT, "tensor %s: byte size overflows", nm);
        t.offset = c.read<uint64_t>("tensor offset");
        if (t.offset % alignment != 0)
            fail(LUCE_ERR_FORMAT, "tensor %s: offset %llu is not aligned to %llu", nm,
                 (unsigned long long)t.offset, (unsigned long long)alignment);
        if (!tensor_index_.emplace(t.name, tensors_.size()).second)
            fail(LUCE_ERR_FORMAT, "duplicate tensor name '%s'", nm);
        tensors_.push_back(std::move(t));
    }

    // Data section: next multiple of the alignment after the tensor infos.
    uint64_t data_start = (c.pos() + alignment - 1) / alignment * alignment;
    for (GgufTensor &t : tensors_) {
        uint64_t begin, end;
        if (add_overflows(data_start, t.offset, &begin) || add_overflows(begin, t.n_bytes, &end) ||
            end > size_)
            fail(LUCE_ERR_FORMAT, "tensor %s: data (offset %llu, %llu bytes) lies past the end of the file",
                 t.name.c_str(), (unsigned long long)t.offset, (unsigned long long)t.n_bytes);
        t.offset = begin;
        t.data = base_ + begin;
    }
    // No two tensors may share bytes: sort by offset and compare neighbours.
    std::vector<const GgufTensor *> by_offset;
    by_offset.reserve(tensors_.size());
    for (const GgufTensor &t : tensors_) by_offset.push_back(&t);
    std::sort(by_offset.begin(), by_offset.end(),
              [](const GgufTensor *a, const GgufTensor *b) { return a->offset < b->offset; });
    for (size_t i = 1; i < by_offset.size(); ++i)
        if (by_offset[i - 1]->offset + by_offset[i - 1]->n_bytes > by_offset[i]->offset)
            fail(LUCE_ERR_FORMAT, "tensors %s and %s overlap", by_offset[i - 1]->name.c_str(),
                 by_offset[i]->name.c_str());
}

const GgufValue *GgufFile::find(const std::string &key) const {
    auto it = kv_.find(key);
    return it == kv_.end() ? nullptr : &it->second;
}

const GgufTensor *GgufFile::tensor(const std::string &name) const {
    auto it = tensor_index_.find(name);
    return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

int64_t GgufFile::get_int(const std::string &key) const {
    const GgufValue *v = find(key);
    if (!v) fail(LUCE_ERR_FORMAT, "missing metadata key '%s'", key.c_str());
    if (!is_integer(v->type))
        fail(LUCE_ERR_FORMAT, "key '%s' must be an integer, found %s", key.c_str(), type_name(v->type));
    if (v->u64_big) fail(LUCE_ERR_FORMAT, "key '%s': value out of range", key.c_str());
    return v->i;
}

int64_t GgufFile::get_int(const std::string &key, int64_t fallback) const {
    return has(key) ? get_int(key) : fallback;
}

double GgufFile::get_float(const std::string &key) const {
    const GgufValue *v = find(key);
    if (!v) fail(LUCE_ERR_FORMAT, "missing metadata key '%s'", key.c_str());
    if (v->type == GgufType::F32 || v->type == GgufType::F64) return v->f;
    if (is_integer(v->type) && !v->u64_big) return double(v->i);
    fail(LUCE_ERR_FORMAT, "key '%s' must be a number, found %s", key.c_str(), type_name(v->type));
}

double GgufFile::get_float(const std::string &key, double fallback) const {
    return has(key) ? get_float(key) : fallback;
}

std::string GgufFile::get_string(const std::string &key, const std::string &fallback) const {
    const GgufValue *v = find(key);
    if (!v) return fallback;
    if (v->type != GgufType::STRING)
        fail(LUCE_ERR_FORMAT, "key '%s' must be a string, found %s", key.c_str(), type_name(v->type));
    return std::string(v->s);
}

std::vector<int64_t> GgufFile::get_int_per_layer(const std::string &key, int64_t n) const {
    const GgufValue *v = find(key);
    if (!v) fail(LUCE_ERR_FORMAT, "missing metadata key '%s'", key.c_str());
    if (v->type != GgufType::ARRAY) return std::vector<int64_t>(size_t(n), get_int(key));
    if (v->count != uint64_t(n))
        fail(LUCE_ERR_FORMAT, "key '%s': per-layer array has %llu entries, expected %lld", key.c_str(),
             (unsigned long long)v->count, (long long)n);
    if (!is_integer(v->elem_type))
        fail(LUCE_ERR_FORMAT, "key '%s': expected an integer array, found %s elements", key.c_str(),
             type_name(v->elem_type));
    std::vector<int64_t> out(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) out[size_t(i)] = array_int(*v, uint64_t(i), key);
    return out;
}

std::vector<bool> GgufFile::get_bool_array(const std::string &key, int64_t n) const {
    const GgufValue *v = find(key);
    if (!v) fail(LUCE_ERR_FORMAT, "missing metadata key '%s'", key.c_str());
    // BOOL elements only: an integer array here is another key's data (inspect refuses it too).
    if (v->type != GgufType::ARRAY || v->elem_type != GgufType::BOOL)
        fail(LUCE_ERR_FORMAT, "key '%s' must be a bool array", key.c_str());
    if (v->count != uint64_t(n))
        fail(LUCE_ERR_FORMAT, "key '%s': per-layer array has %llu entries, expected %lld", key.c_str(),
             (unsigned long long)v->count, (long long)n);
    std::vector<bool> out(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i)
        out[size_t(i)] = v->data[i] != 0;
    return out;
}

}  // namespace luce
