// gguf.cpp: the GGUF parser behind gguf_file (see gguf.hpp for the format and the trust model).
//
// Parsing runs once, in open()/from_bytes(), on the caller's thread; the resulting gguf_file is
// immutable. Every read goes through `byte_cursor`, which refuses to read past the end and keeps
// the first error (sticky), so no code path here indexes the bytes directly.
//
// Error codes, in the order they are checked:
//   gguf_io                   open/stat/mmap failed (open() only)
//   gguf_truncated            a read ran past the end of the file
//   gguf_bad_magic            the first 4 bytes are not "GGUF"
//   gguf_bad_version          version other than 2 or 3
//   gguf_bad_count            n_kv / n_tensors / array length cannot fit in the remaining bytes
//   gguf_bad_value_type       unknown metadata value type id (or arrays nested too deep)
//   gguf_duplicate_key        a metadata key appears twice
//   gguf_bad_alignment        general.alignment not a u32 power of two
//   gguf_bad_dims             n_dims outside 1..4, a zero dim, or an element count overflow
//   gguf_unsupported_type     unknown tensor type id
//   gguf_bad_shape            ne[0] not a whole number of the type's blocks
//   gguf_duplicate_tensor     two tensors share a name
//   gguf_tensor_misaligned    a tensor offset not a multiple of the alignment
//   gguf_tensor_out_of_bounds tensor bytes past the end of the file
//   gguf_tensor_overlap       two tensors' byte ranges intersect
#include "model/gguf.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cassert>
#include <cerrno>
#include <cstring>
#include <unordered_set>

#include "model/gguf_internal.hpp"

namespace ordo::model {

namespace {

// Smallest encodings, used to reject counts that cannot possibly fit in the remaining bytes
// before anything is allocated for them.
constexpr uint64_t k_min_kv_bytes = 8 + 4 + 1;                   // empty key, type, 1-byte value
constexpr uint64_t k_min_tensor_info_bytes = 8 + 4 + 8 + 4 + 8;  // empty name, 1 dim, type, off

uint64_t min_value_bytes(gguf_value_type t) {
    switch (t) {
        case gguf_value_type::u8:
        case gguf_value_type::i8:
        case gguf_value_type::boolean:
            return 1;
        case gguf_value_type::u16:
        case gguf_value_type::i16:
            return 2;
        case gguf_value_type::u32:
        case gguf_value_type::i32:
        case gguf_value_type::f32:
            return 4;
        case gguf_value_type::u64:
        case gguf_value_type::i64:
        case gguf_value_type::f64:
            return 8;
        case gguf_value_type::string:
            return 8;
        case gguf_value_type::array:
            return 4 + 8;
    }
    return 1;
}

bool known_value_type(uint32_t t) {
    return t <= static_cast<uint32_t>(gguf_value_type::f64);
}

std::string quoted(std::string_view s) {
    // Names come from a hostile file: cap what reaches a log line.
    constexpr size_t k_name_print_max = 96;
    std::string out = "'";
    out.append(s.substr(0, k_name_print_max));
    if (s.size() > k_name_print_max) out += "...";
    return out + "'";
}

template <typename T>
gguf_value read_scalar(byte_cursor& c, std::string_view what) {
    return gguf_value(c.read<T>(what));
}

status parse_value(byte_cursor& c, gguf_value_type type, uint32_t depth, uint64_t& budget,
                   gguf_value& out);

status parse_array(byte_cursor& c, uint32_t depth, uint64_t& budget, gguf_value& out) {
    if (depth >= k_gguf_array_depth_max) {
        return make_error("gguf_bad_value_type", c.where("arrays nested deeper than " +
                                                         std::to_string(k_gguf_array_depth_max)));
    }
    uint32_t elem_raw = c.read<uint32_t>("array element type");
    uint64_t count = c.read<uint64_t>("array length");
    if (!c.ok()) return c.err();
    if (!known_value_type(elem_raw)) {
        return make_error("gguf_bad_value_type",
                          c.where("unknown array element type " + std::to_string(elem_raw)));
    }
    auto elem = static_cast<gguf_value_type>(elem_raw);
    if (count > c.remaining() / min_value_bytes(elem)) {
        return make_error("gguf_bad_count",
                          c.where("array length " + std::to_string(count) + " of " +
                                  std::string(value_type_name(elem)) + " cannot fit in the " +
                                  std::to_string(c.remaining()) + " bytes left"));
    }
    if (count > budget) {
        return make_error("gguf_bad_count", c.where("array length " + std::to_string(count) +
                                                    " exceeds the metadata value limit of " +
                                                    std::to_string(k_gguf_metadata_values_max)));
    }
    budget -= count;
    gguf_array arr;
    arr.elem_type = elem;
    arr.items.reserve(static_cast<size_t>(count));
    for (uint64_t i = 0; i < count; ++i) {
        gguf_value item;
        if (auto st = parse_value(c, elem, depth + 1, budget, item); !st) return st;
        arr.items.push_back(std::move(item));
    }
    out = gguf_value(std::move(arr));
    return {};
}

status parse_value(byte_cursor& c, gguf_value_type type, uint32_t depth, uint64_t& budget,
                   gguf_value& out) {
    switch (type) {
        case gguf_value_type::u8:
            out = read_scalar<uint8_t>(c, "u8 value");
            break;
        case gguf_value_type::i8:
            out = read_scalar<int8_t>(c, "i8 value");
            break;
        case gguf_value_type::u16:
            out = read_scalar<uint16_t>(c, "u16 value");
            break;
        case gguf_value_type::i16:
            out = read_scalar<int16_t>(c, "i16 value");
            break;
        case gguf_value_type::u32:
            out = read_scalar<uint32_t>(c, "u32 value");
            break;
        case gguf_value_type::i32:
            out = read_scalar<int32_t>(c, "i32 value");
            break;
        case gguf_value_type::f32:
            out = read_scalar<float>(c, "f32 value");
            break;
        case gguf_value_type::u64:
            out = read_scalar<uint64_t>(c, "u64 value");
            break;
        case gguf_value_type::i64:
            out = read_scalar<int64_t>(c, "i64 value");
            break;
        case gguf_value_type::f64:
            out = read_scalar<double>(c, "f64 value");
            break;
        case gguf_value_type::boolean: {
            uint8_t b = c.read<uint8_t>("bool value");
            out = gguf_value(b != 0);
            break;
        }
        case gguf_value_type::string:
            out = gguf_value(c.read_string("string value"));
            break;
        case gguf_value_type::array:
            return parse_array(c, depth, budget, out);
    }
    if (!c.ok()) return c.err();
    return {};
}

}  // namespace

// ---- lifetime ---------------------------------------------------------------------------------

gguf_file::gguf_file(gguf_file&& o) noexcept {
    *this = std::move(o);
}

gguf_file& gguf_file::operator=(gguf_file&& o) noexcept {
    if (this == &o) return *this;
    release();
    _base = std::exchange(o._base, nullptr);
    _size = std::exchange(o._size, 0);
    _map = std::exchange(o._map, nullptr);
    _owned = std::move(o._owned);  // moving a vector keeps its heap block, so _base stays valid
    _version = o._version;
    _alignment = o._alignment;
    _data_offset = o._data_offset;
    _kv = std::move(o._kv);
    _tensors = std::move(o._tensors);
    return *this;
}

gguf_file::~gguf_file() {
    release();
}

void gguf_file::release() {
    if (_map != nullptr) munmap(_map, static_cast<size_t>(_size));
    _map = nullptr;
    _base = nullptr;
    _size = 0;
}

result<gguf_file> gguf_file::open(const std::string& path) {
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        return make_error("gguf_io", "cannot open " + path + ": " + std::strerror(errno));
    }
    struct stat st {};
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        ::close(fd);
        return make_error("gguf_io", path + " is not a readable regular file");
    }
    gguf_file f;
    f._size = static_cast<uint64_t>(st.st_size);
    if (f._size > 0) {
        void* p = mmap(nullptr, static_cast<size_t>(f._size), PROT_READ, MAP_PRIVATE, fd, 0);
        if (p == MAP_FAILED) {
            int e = errno;
            ::close(fd);
            f._size = 0;
            return make_error("gguf_io", "cannot map " + path + ": " + std::strerror(e));
        }
        f._map = p;
        f._base = static_cast<const uint8_t*>(p);
    }
    ::close(fd);  // the mapping stays valid after close
    if (auto s = f.parse(); !s) {
        return make_error(s.err().code, path + ": " + s.err().message);
    }
    return f;
}

result<gguf_file> gguf_file::from_bytes(std::span<const uint8_t> bytes) {
    gguf_file f;
    f._owned.assign(bytes.begin(), bytes.end());
    f._base = f._owned.data();
    f._size = f._owned.size();
    if (auto s = f.parse(); !s) return s.err();
    return f;
}

// ---- parsing ----------------------------------------------------------------------------------

namespace {

status parse_header(byte_cursor& c, uint32_t& version, uint64_t& n_tensors, uint64_t& n_kv) {
    if (c.remaining() >= 4) {
        uint32_t magic = c.read<uint32_t>("magic");
        if (magic != k_gguf_magic) {
            char hex[16];
            std::snprintf(hex, sizeof hex, "0x%08x", magic);
            return make_error("gguf_bad_magic", std::string("not a GGUF file: magic ") + hex +
                                                    " at offset 0, expected \"GGUF\"");
        }
    } else {
        c.read<uint32_t>("magic");
        return c.err();
    }
    version = c.read<uint32_t>("version");
    if (!c.ok()) return c.err();
    if (version != 2 && version != 3) {
        return make_error("gguf_bad_version", "GGUF version " + std::to_string(version) +
                                                  " at offset 4 is not supported (need 2 or 3)");
    }
    n_tensors = c.read<uint64_t>("tensor count");
    n_kv = c.read<uint64_t>("metadata count");
    if (!c.ok()) return c.err();
    if (n_kv > k_gguf_metadata_values_max || n_tensors > k_gguf_tensors_max) {
        return make_error("gguf_bad_count", "metadata count " + std::to_string(n_kv) +
                                                " or tensor count " + std::to_string(n_tensors) +
                                                " exceeds the limits (" +
                                                std::to_string(k_gguf_metadata_values_max) + ", " +
                                                std::to_string(k_gguf_tensors_max) + ")");
    }
    if (n_kv > c.remaining() / k_min_kv_bytes) {
        return make_error("gguf_bad_count", "metadata count " + std::to_string(n_kv) +
                                                " at offset 16 cannot fit in the " +
                                                std::to_string(c.remaining()) + " bytes left");
    }
    if (n_tensors > c.remaining() / k_min_tensor_info_bytes) {
        return make_error("gguf_bad_count", "tensor count " + std::to_string(n_tensors) +
                                                " at offset 8 cannot fit in the " +
                                                std::to_string(c.remaining()) + " bytes left");
    }
    return {};
}

status parse_kvs(byte_cursor& c, uint64_t n_kv, std::vector<gguf_kv>& out) {
    std::unordered_set<std::string> seen;
    uint64_t budget = k_gguf_metadata_values_max;
    out.reserve(static_cast<size_t>(n_kv));
    for (uint64_t i = 0; i < n_kv; ++i) {
        c.set_context("metadata #" + std::to_string(i));
        uint64_t at = c.pos();
        gguf_kv kv;
        kv.key = c.read_string("key");
        if (!c.ok()) return c.err();
        c.set_context("metadata key " + quoted(kv.key));
        uint32_t type_raw = c.read<uint32_t>("value type");
        if (!c.ok()) return c.err();
        if (!known_value_type(type_raw)) {
            return make_error("gguf_bad_value_type",
                              c.where("unknown value type " + std::to_string(type_raw)));
        }
        if (auto st = parse_value(c, static_cast<gguf_value_type>(type_raw), 0, budget, kv.value);
            !st) {
            return st;
        }
        if (!seen.insert(kv.key).second) {
            return make_error("gguf_duplicate_key", "metadata key " + quoted(kv.key) +
                                                        " at offset " + std::to_string(at) +
                                                        " appears twice");
        }
        out.push_back(std::move(kv));
    }
    c.set_context("");
    return {};
}

status parse_tensor_info(byte_cursor& c, uint64_t index, uint64_t alignment, gguf_tensor_info& t) {
    c.set_context("tensor #" + std::to_string(index));
    t.name = c.read_string("name");
    if (!c.ok()) return c.err();
    c.set_context("tensor " + quoted(t.name));
    t.n_dims = c.read<uint32_t>("n_dims");
    if (!c.ok()) return c.err();
    if (t.n_dims == 0 || t.n_dims > k_gguf_max_dims) {
        return make_error("gguf_bad_dims",
                          c.where("n_dims " + std::to_string(t.n_dims) + " outside 1.." +
                                  std::to_string(k_gguf_max_dims)));
    }
    t.n_elements = 1;
    for (uint32_t d = 0; d < t.n_dims; ++d) {
        t.ne[d] = c.read<uint64_t>("dimension");
        if (!c.ok()) return c.err();
        if (t.ne[d] == 0) {
            return make_error("gguf_bad_dims",
                              c.where("dimension " + std::to_string(d) + " is zero"));
        }
        if (t.n_elements > UINT64_MAX / t.ne[d] || t.ne[d] > (uint64_t{1} << 62)) {
            return make_error("gguf_bad_dims", c.where("element count overflows 64 bits"));
        }
        t.n_elements *= t.ne[d];
    }
    uint32_t type_raw = c.read<uint32_t>("type");
    t.offset = c.read<uint64_t>("offset");
    if (!c.ok()) return c.err();
    const ggml_type_traits* tr = find_type_traits(type_raw);
    if (tr == nullptr) {
        return make_error("gguf_unsupported_type",
                          c.where("unknown tensor type id " + std::to_string(type_raw)));
    }
    t.type = tr->type;
    if (t.ne[0] % tr->block_size != 0) {
        return make_error(
            "gguf_bad_shape",
            c.where("ne[0] = " + std::to_string(t.ne[0]) + " is not a multiple of " +
                    std::string(tr->name) + "'s block size " + std::to_string(tr->block_size)));
    }
    auto bytes = bytes_for(t.type, t.n_elements);
    if (!bytes) return make_error("gguf_bad_dims", c.where("byte size overflows 64 bits"));
    t.n_bytes = *bytes;
    if (t.offset % alignment != 0) {
        return make_error(
            "gguf_tensor_misaligned",
            c.where("data offset " + std::to_string(t.offset) +
                    " is not a multiple of the alignment " + std::to_string(alignment)));
    }
    return {};
}

// "16 blocks of 144 bytes" (or "64 elements of 4 bytes" for the float types): what a tensor's
// byte size is made of, for the truncation message.
std::string block_count_text(const gguf_tensor_info& t) {
    const uint32_t bs = block_size(t.type);
    const std::string unit = bs == 1 ? " elements of " : " blocks of ";
    return std::to_string(t.n_elements / bs) + unit + std::to_string(block_bytes(t.type)) +
           " bytes";
}

}  // namespace

status gguf_file::parse() {
    byte_cursor c(_base, _size);
    uint64_t n_tensors = 0;
    uint64_t n_kv = 0;
    if (auto st = parse_header(c, _version, n_tensors, n_kv); !st) return st;
    if (auto st = parse_kvs(c, n_kv, _kv); !st) return st;

    if (const gguf_value* a = find("general.alignment")) {
        auto v = a->as_u64();
        bool u32_int = a->type() == gguf_value_type::u32 || a->type() == gguf_value_type::i32 ||
                       a->type() == gguf_value_type::u64 || a->type() == gguf_value_type::u16;
        if (!u32_int || !v || *v == 0 || *v > UINT32_MAX || (*v & (*v - 1)) != 0) {
            return make_error("gguf_bad_alignment", "general.alignment = " + format_value(*a) +
                                                        " is not a power-of-two u32");
        }
        _alignment = *v;
    }
    // The table may be large; reserve only what the bytes can hold (checked in parse_header).
    _tensors.reserve(static_cast<size_t>(n_tensors));
    std::unordered_set<std::string_view> names;
    for (uint64_t i = 0; i < n_tensors; ++i) {
        gguf_tensor_info t;
        if (auto st = parse_tensor_info(c, i, _alignment, t); !st) return st;
        _tensors.push_back(std::move(t));
    }
    for (const auto& t : _tensors) {
        if (!names.insert(t.name).second) {
            return make_error("gguf_duplicate_tensor",
                              "tensor " + quoted(t.name) + " appears twice in the table");
        }
    }
    // Data starts at the next multiple of the alignment after the table. A file with no
    // tensors (vocab-only) may end before that padding.
    uint64_t end_of_table = c.pos();
    _data_offset = end_of_table + (_alignment - end_of_table % _alignment) % _alignment;
    if (!_tensors.empty() && _data_offset > _size) {
        return make_error("gguf_truncated",
                          "data section starts at " + std::to_string(_data_offset) +
                              " but the file has " + std::to_string(_size) + " bytes");
    }
    return place_tensors();
}

status gguf_file::place_tensors() {
    const uint64_t data_bytes = _size >= _data_offset ? _size - _data_offset : 0;
    for (auto& t : _tensors) {
        if (t.offset > data_bytes || t.n_bytes > data_bytes - t.offset) {
            return make_error("gguf_tensor_out_of_bounds",
                              "tensor " + quoted(t.name) + " (" + std::string(type_name(t.type)) +
                                  ", " + block_count_text(t) + ") spans data offsets [" +
                                  std::to_string(t.offset) + ", +" + std::to_string(t.n_bytes) +
                                  ") but the data section holds " + std::to_string(data_bytes) +
                                  " bytes (starts at " + std::to_string(_data_offset) + ")");
        }
        t.data = std::span<const uint8_t>(_base + _data_offset + t.offset,
                                          static_cast<size_t>(t.n_bytes));
    }
    std::vector<const gguf_tensor_info*> order;
    order.reserve(_tensors.size());
    for (const auto& t : _tensors) order.push_back(&t);
    std::sort(order.begin(), order.end(), [](auto* a, auto* b) { return a->offset < b->offset; });
    for (size_t i = 1; i < order.size(); ++i) {
        const auto* prev = order[i - 1];
        const auto* cur = order[i];
        if (prev->offset + prev->n_bytes > cur->offset) {
            return make_error("gguf_tensor_overlap",
                              "tensor " + quoted(prev->name) + " [" + std::to_string(prev->offset) +
                                  ", " + std::to_string(prev->offset + prev->n_bytes) +
                                  ") overlaps tensor " + quoted(cur->name) + " starting at " +
                                  std::to_string(cur->offset));
        }
    }
    return {};
}

// ---- lookups ----------------------------------------------------------------------------------

const gguf_value* gguf_file::find(std::string_view key) const {
    for (const auto& kv : _kv) {
        if (kv.key == key) return &kv.value;
    }
    return nullptr;
}

const gguf_tensor_info* gguf_file::find_tensor(std::string_view name) const {
    for (const auto& t : _tensors) {
        if (t.name == name) return &t;
    }
    return nullptr;
}

status require_supported(const gguf_tensor_info& t) {
    if (is_supported(t.type)) return {};
    return make_error("gguf_unsupported_type",
                      "tensor " + quoted(t.name) + " has type " + std::string(type_name(t.type)) +
                          ", which ordo cannot compute with (supported: " + supported_type_names() +
                          ")");
}

status gguf_file::require_supported_types() const {
    for (const auto& t : _tensors) {
        if (auto st = require_supported(t); !st) return st;
    }
    return {};
}

}  // namespace ordo::model
