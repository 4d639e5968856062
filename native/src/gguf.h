// gguf.h — a memory-mapped, fully validated view of a GGUF file.
//
// Every GGUF is untrusted input (the 2026 crafted-file bugs in llama.cpp and ollama came from
// trusting counts, string lengths, array element types and tensor offsets). GgufFile::open parses
// the whole header once, validating every count, length, type, size and offset against the file's
// length with overflow-checked arithmetic, BEFORE any allocation sized by file contents or any
// pointer into the data section is formed. After open() succeeds, every accessor is safe.
//
// Layout (little-endian, spec/qwen35.md §3.1):
//   magic "GGUF" | u32 version (2 or 3) | u64 n_tensors | u64 n_kv
//   n_kv x (string key, u32 value_type, value)        string = u64 length + bytes (no NUL)
//   n_tensors x (string name, u32 n_dims, u64 ne[n_dims], u32 ggml_type, u64 offset)
//   padding to general.alignment, then the data section; tensor offsets are relative to it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

namespace luce {

enum class GgufType : uint32_t {
    U8 = 0, I8 = 1, U16 = 2, I16 = 3, U32 = 4, I32 = 5, F32 = 6, BOOL = 7,
    STRING = 8, ARRAY = 9, U64 = 10, I64 = 11, F64 = 12,
};

// One metadata value. Scalars are decoded; arrays stay in the mapping (`data` points at the first
// element, already validated to lie inside the file: for string arrays every length was checked).
struct GgufValue {
    GgufType type = GgufType::U8;
    GgufType elem_type = GgufType::U8;  // arrays only
    uint64_t count = 0;                 // arrays only
    const uint8_t *data = nullptr;      // arrays only
    int64_t i = 0;                      // integer scalars (u64 > INT64_MAX is flagged by u64_big)
    bool u64_big = false;
    double f = 0.0;                     // float scalars
    bool b = false;
    std::string_view s;                 // strings
};

struct GgufTensor {
    std::string name;
    int32_t type = 0;        // ggml type id (known to quants.h; may be unsupported for compute)
    int n_dims = 0;
    int64_t ne[4] = {1, 1, 1, 1};  // ne[0] is the contiguous dimension
    int64_t n_elements = 0;
    uint64_t offset = 0;     // absolute offset in the file
    uint64_t n_bytes = 0;
    const void *data = nullptr;
};

class GgufFile {
public:
    static GgufFile *open(const std::string &path);  // caller owns; throws luce::Error
    ~GgufFile();
    GgufFile(const GgufFile &) = delete;
    GgufFile &operator=(const GgufFile &) = delete;

    const GgufValue *find(const std::string &key) const;
    const GgufTensor *tensor(const std::string &name) const;
    const std::vector<GgufTensor> &tensors() const { return tensors_; }
    const std::string &path() const { return path_; }

    // Typed getters: every integer width accepted, range-checked into int64; a key of another
    // type is a FORMAT error naming the key.
    bool has(const std::string &key) const { return find(key) != nullptr; }
    int64_t get_int(const std::string &key) const;
    int64_t get_int(const std::string &key, int64_t fallback) const;
    double get_float(const std::string &key, double fallback) const;
    double get_float(const std::string &key) const;
    std::string get_string(const std::string &key, const std::string &fallback) const;
    // Integer array (any integer element width) or scalar broadcast to n entries.
    std::vector<int64_t> get_int_per_layer(const std::string &key, int64_t n) const;
    std::vector<bool> get_bool_array(const std::string &key, int64_t n) const;

private:
    GgufFile() = default;
    void parse();

    std::string path_;
    const uint8_t *base_ = nullptr;
    size_t size_ = 0;
    std::map<std::string, GgufValue> kv_;
    std::vector<GgufTensor> tensors_;
    std::map<std::string, size_t> tensor_index_;
};

}  // namespace luce
