#include "model/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <limits>

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace specula {
namespace {

// The reference implementation refuses headers above 100 MB; so do we, rather than trusting a
// corrupt length field with a huge allocation.
constexpr uint64_t kMaxHeaderBytes = 100u << 20;

struct DtypeSize {
  const char* name;
  size_t size;
};
// Every whole-byte safetensors dtype (sub-byte ones such as F4 are not supported).
constexpr DtypeSize kDtypeSizes[] = {{"BOOL", 1}, {"U8", 1},  {"I8", 1},      {"F8_E5M2", 1}, {"F8_E4M3", 1},
                                     {"F8_E8M0", 1}, {"I16", 2}, {"U16", 2},  {"F16", 2},     {"BF16", 2},
                                     {"I32", 4},  {"U32", 4}, {"F32", 4},     {"F64", 8},     {"I64", 8},
                                     {"U64", 8}};

std::string errno_text() { return std::strerror(errno); }

}  // namespace

size_t safetensors_dtype_size(const std::string& dtype_name) {
  for (const auto& d : kDtypeSizes)
    if (dtype_name == d.name) return d.size;
  return 0;
}

int64_t SafetensorsEntry::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::shared_ptr<SafetensorsFile> SafetensorsFile::open(const std::filesystem::path& path) {
  std::shared_ptr<SafetensorsFile> f(new SafetensorsFile());
  f->path_ = path;
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  SPECULA_CHECK(fd >= 0, "{}: cannot open safetensors file ({})", path.string(), errno_text());
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    std::string why = errno_text();
    ::close(fd);
    throw Error(fmt::format("{}: cannot stat ({})", path.string(), why));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    throw Error(fmt::format("{}: not a regular file", path.string()));
  }
  f->size_ = static_cast<size_t>(st.st_size);
  if (f->size_ < 8) {
    ::close(fd);
    throw Error(fmt::format("{}: truncated safetensors file ({} bytes, the header length alone needs 8)",
                            path.string(), f->size_));
  }
  // Read-only private mapping: pages come from the page cache on demand and are never written.
  void* m = ::mmap(nullptr, f->size_, PROT_READ, MAP_PRIVATE, fd, 0);
  std::string why = errno_text();
  ::close(fd);  // the mapping keeps the file alive
  SPECULA_CHECK(m != MAP_FAILED, "{}: mmap failed ({})", path.string(), why);
  f->map_ = m;
  f->parse_header();
  return f;
}

SafetensorsFile::~SafetensorsFile() {
  if (map_ != nullptr) ::munmap(map_, size_);
}

const SafetensorsEntry* SafetensorsFile::find(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &entries_[it->second];
}

void SafetensorsFile::parse_header() {
  const std::string file = path_.string();
  const auto* bytes = static_cast<const uint8_t*>(map_);
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | bytes[i];  // little-endian
  SPECULA_CHECK(header_len <= kMaxHeaderBytes, "{}: header length {} exceeds the 100 MB limit (corrupt file?)", file,
                header_len);
  SPECULA_CHECK(header_len <= size_ - 8, "{}: header length {} runs past the end of the file ({} bytes): truncated?",
                file, header_len, size_);
  data_ = bytes + 8 + header_len;
  data_size_ = size_ - 8 - static_cast<size_t>(header_len);

  nlohmann::json header;
  try {
    header = nlohmann::json::parse(bytes + 8, bytes + 8 + header_len);
  } catch (const nlohmann::json::exception& e) {  // parse_error, or out_of_range for a number like 1e400
    std::string what = e.what();
    auto pos = what.find("] ");
    if (pos != std::string::npos) what = what.substr(pos + 2);
    throw Error(fmt::format("{}: corrupt safetensors header ({})", file, what));
  }
  SPECULA_CHECK(header.is_object(), "{}: safetensors header is not a JSON object", file);

  for (auto it = header.begin(); it != header.end(); ++it) {
    const std::string& name = it.key();
    const auto& v = it.value();
    if (name == "__metadata__") {
      // Documented as string -> string; tolerate other values by keeping their JSON text.
      if (v.is_object()) {
        for (auto m = v.begin(); m != v.end(); ++m) metadata_[m.key()] = m->is_string() ? m->get<std::string>() : m->dump();
      }
      continue;
    }
    auto bad = [&](const std::string& what) -> Error {
      return Error(fmt::format("{}: tensor '{}': {}", file, name, what));
    };
    if (!v.is_object()) throw bad("header entry is not an object");
    if (!v.contains("dtype") || !v["dtype"].is_string()) throw bad("missing or non-string 'dtype'");
    if (!v.contains("shape") || !v["shape"].is_array()) throw bad("missing or non-list 'shape'");
    if (!v.contains("data_offsets") || !v["data_offsets"].is_array() || v["data_offsets"].size() != 2)
      throw bad("missing 'data_offsets' [begin, end]");

    SafetensorsEntry e;
    e.name = name;
    e.dtype_name = v["dtype"].get<std::string>();
    size_t elem = safetensors_dtype_size(e.dtype_name);
    if (elem == 0) throw bad(fmt::format("unknown or unsupported dtype '{}'", e.dtype_name));
    DType parsed;
    if (parse_dtype(e.dtype_name, &parsed)) e.dtype = parsed;

    // numel with overflow checks: a corrupt shape must not wrap around and pass the size check.
    uint64_t numel = 1;
    for (const auto& d : v["shape"]) {
      if (!d.is_number_unsigned()) throw bad(fmt::format("shape {} has a non-integer or negative dimension", v["shape"].dump()));
      uint64_t dim = d.get<uint64_t>();
      if (dim > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) ||
          (dim != 0 && numel > std::numeric_limits<uint64_t>::max() / dim / elem))
        throw bad(fmt::format("shape {} is too large", v["shape"].dump()));
      numel *= dim;
      e.shape.push_back(static_cast<int64_t>(dim));
    }
    const auto& off = v["data_offsets"];
    if (!off[0].is_number_unsigned() || !off[1].is_number_unsigned())
      throw bad(fmt::format("data_offsets {} are not non-negative integers", off.dump()));
    uint64_t begin = off[0].get<uint64_t>(), end = off[1].get<uint64_t>();
    if (begin > end) throw bad(fmt::format("data_offsets [{}, {}] end before they begin", begin, end));
    if (end > data_size_) {
      throw bad(fmt::format("data_offsets [{}, {}] lie outside the data section ({} bytes): truncated file?", begin,
                            end, data_size_));
    }
    if (end - begin != numel * elem) {
      throw bad(fmt::format("data_offsets [{}, {}] hold {} bytes but shape {} of {} needs {}", begin, end, end - begin,
                            shape_str(e.shape), e.dtype_name, numel * elem));
    }
    e.begin = static_cast<size_t>(begin);
    e.end = static_cast<size_t>(end);
    entries_.push_back(std::move(e));
  }

  std::sort(entries_.begin(), entries_.end(), [](const SafetensorsEntry& a, const SafetensorsEntry& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  size_t reach = 0;          // furthest end of any tensor so far
  const SafetensorsEntry* reacher = nullptr;
  for (size_t i = 0; i < entries_.size(); ++i) {
    const SafetensorsEntry& e = entries_[i];
    // Two tensors sharing bytes would alias silently; empty tensors occupy nothing.
    if (e.nbytes() > 0) {
      if (reacher != nullptr && e.begin < reach) {
        throw Error(fmt::format("{}: tensors '{}' and '{}' overlap in the data section", file, reacher->name, e.name));
      }
      reach = e.end;
      reacher = &e;
    }
    index_[e.name] = i;
  }
}

void write_safetensors(const std::filesystem::path& path, const std::vector<std::pair<std::string, Tensor>>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  size_t offset = 0;
  for (const auto& [name, t] : tensors) {
    SPECULA_CHECK(t.is_cpu(), "write_safetensors: tensor '{}' is {}, not on the CPU", name, t.describe());
    header[name] = {{"dtype", std::string(dtype_name(t.dtype()))},
                    {"shape", t.shape()},
                    {"data_offsets", {offset, offset + t.nbytes()}}};
    offset += t.nbytes();
  }
  std::string text = header.dump();
  // Pad with spaces so the data section starts 8-byte aligned, as the reference writer does.
  text.append((8 - text.size() % 8) % 8, ' ');
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  SPECULA_CHECK(out.good(), "{}: cannot open for writing", path.string());
  uint64_t n = text.size();
  char len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  out.write(len, 8);
  out.write(text.data(), static_cast<std::streamsize>(text.size()));
  for (const auto& [name, t] : tensors) out.write(static_cast<const char*>(t.data()), static_cast<std::streamsize>(t.nbytes()));
  out.close();
  SPECULA_CHECK(out.good(), "{}: write failed", path.string());
}

}  // namespace specula
