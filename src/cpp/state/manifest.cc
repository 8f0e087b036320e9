#include "rhino/manifest.h"

#include <xxhash.h>

#include <cctype>
#include <cstdio>
#include <limits>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <type_traits>

namespace rhino {
namespace {

using json = nlohmann::json;

std::string Hex64(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

}  // namespace

uint64_t Manifest::total_bytes() const {
  uint64_t n = 0;
  for (const auto& f : files) n += f.size;
  return n;
}
uint64_t Manifest::delta_bytes() const {
  uint64_t n = 0;
  for (const auto& f : files)
    if (f.in_delta) n += f.size;
  return n;
}
uint64_t Manifest::delta_files() const {
  uint64_t n = 0;
  for (const auto& f : files) n += f.in_delta ? 1 : 0;
  return n;
}

std::string Manifest::Serialize() const {
  json j;
  j["format"] = kFormatVersion;
  j["operator_id"] = operator_id;
  j["instance"] = instance;
  j["checkpoint_id"] = checkpoint_id;
  j["parent_id"] = has_parent ? json(parent_id) : json(nullptr);
  j["epoch"] = epoch;
  j["version"] = version;
  j["partitioner"] = {{"num_key_groups", partitioner.num_key_groups},
                      {"num_vnodes", partitioner.num_vnodes},
                      {"seed", partitioner.seed}};
  j["vnodes"] = vnodes;
  json fl = json::array();
  for (const auto& f : files) {
    fl.push_back({{"name", f.name}, {"size", f.size}, {"checksum", f.checksum},
                  {"identity", f.identity}, {"in_delta", f.in_delta}});
  }
  j["files"] = std::move(fl);
  j["created_unix_ms"] = created_unix_ms;
  std::string body = j.dump();
  return body + "\nxxh3:" + Hex64(XXH3_64bits(body.data(), body.size())) + "\n";
}

namespace {

// A field of type T (an unsigned integer, or int64_t) read exactly: nlohmann's
// get<T>() converts a negative, fractional or too large number without a word
// (-1 as instance 4294967295), and a manifest is data from the network (an
// OpenStreamReq's, protocol §4) or a disk: a number out of range is Corruption.
template <typename T>
T Exact(const json& v, const char* name) {
  static_assert(std::is_integral_v<T>);
  if constexpr (std::is_unsigned_v<T>) {
    if (!v.is_number_unsigned() || v.get<uint64_t>() > std::numeric_limits<T>::max()) {
      throw std::out_of_range(std::string("'") + name + "' is " + v.dump() + ", not an integer in [0, " +
                              std::to_string(std::numeric_limits<T>::max()) + "]");
    }
  } else {
    if (!v.is_number_integer() || (v.is_number_unsigned() && v.get<uint64_t>() > uint64_t(INT64_MAX))) {
      throw std::out_of_range(std::string("'") + name + "' is " + v.dump() + ", not a 64-bit integer");
    }
  }
  return v.get<T>();
}

template <typename T>
T Exact(const json& obj, const char* name, int) {
  return Exact<T>(obj.at(name), name);
}

}  // namespace

Status Manifest::Parse(const std::string& data, Manifest* out) {
  auto nl = data.find('\n');
  if (nl == std::string::npos) return Status::Corruption("manifest has no checksum trailer (truncated?)");
  std::string body = data.substr(0, nl);
  std::string trailer = data.substr(nl + 1);
  while (!trailer.empty() && (trailer.back() == '\n' || trailer.back() == '\r')) trailer.pop_back();
  if (trailer != "xxh3:" + Hex64(XXH3_64bits(body.data(), body.size()))) {
    return Status::Corruption("manifest checksum mismatch");
  }
  try {
    json j = json::parse(body);
    if (j.at("format").get<int>() != kFormatVersion) {
      return Status::Corruption("unsupported manifest format " + j.at("format").dump());
    }
    Manifest m;
    m.operator_id = j.at("operator_id").get<std::string>();
    m.instance = Exact<uint32_t>(j, "instance", 0);
    m.checkpoint_id = Exact<uint64_t>(j, "checkpoint_id", 0);
    m.has_parent = !j.at("parent_id").is_null();
    m.parent_id = m.has_parent ? Exact<uint64_t>(j, "parent_id", 0) : 0;
    m.epoch = Exact<uint64_t>(j, "epoch", 0);
    m.version = Exact<uint64_t>(j, "version", 0);
    const auto& p = j.at("partitioner");
    m.partitioner.num_key_groups = Exact<uint32_t>(p, "num_key_groups", 0);
    m.partitioner.num_vnodes = Exact<uint32_t>(p, "num_vnodes", 0);
    m.partitioner.seed = Exact<uint64_t>(p, "seed", 0);
    if (!j.at("vnodes").is_array()) throw std::out_of_range("'vnodes' is not a list");
    for (const auto& v : j.at("vnodes")) m.vnodes.push_back(Exact<uint32_t>(v, "vnodes"));
    for (const auto& f : j.at("files")) {
      FileEntry e;
      e.name = f.at("name").get<std::string>();
      e.size = Exact<uint64_t>(f, "size", 0);
      e.checksum = f.at("checksum").get<std::string>();
      e.identity = f.at("identity").get<std::string>();
      e.in_delta = f.at("in_delta").get<bool>();
      m.files.push_back(std::move(e));
    }
    m.created_unix_ms = Exact<int64_t>(j, "created_unix_ms", 0);
    *out = std::move(m);
  } catch (const std::exception& e) {
    return Status::Corruption(std::string("malformed manifest: ") + e.what());
  }
  return Status::OK();
}

bool IsPlainFileName(const std::string& name) {
  if (name.empty() || name == "." || name == ".." || name.size() > 255) return false;
  for (char c : name)
    if (c == '/' || c == '\0') return false;
  return true;
}

bool IsValidOperatorId(const std::string& id) {
  if (id.empty() || id.size() > 128 || id[0] == '.') return false;
  for (unsigned char c : id)
    if (!(std::isalnum(c) || c == '_' || c == '-' || c == '.')) return false;
  return true;
}

bool IsValidIdentity(const std::string& identity) {
  if (identity.size() < 34 || identity[32] != '-') return false;
  for (int i = 0; i < 32; ++i) {
    char c = identity[i];
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  if (identity.size() > 32 + 1 + 20) return false;
  for (size_t i = 33; i < identity.size(); ++i)
    if (identity[i] < '0' || identity[i] > '9') return false;
  return true;
}

}  // namespace rhino
