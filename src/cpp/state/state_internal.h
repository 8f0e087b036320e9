// Helpers shared by the StateBackend's translation units: RocksDB status
// mapping, metadata keys and encodings. Internal to the C++ core.
#pragma once

#include <rocksdb/status.h>

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "rhino/partitioner.h"
#include "rhino/status.h"

namespace rhino::state_internal {

using json = nlohmann::json;

constexpr char kMetaKey[] = "rhino:meta";
constexpr char kVersionKey[] = "rhino:version";
constexpr char kCheckpointKey[] = "rhino:checkpoint";
constexpr char kTtlClockKey[] = "rhino:ttl_clock";  // int64 as EncodeU64 (two's complement)
// What the version of that commit was built on (VersionBase), written only
// where that is not version - 1: EncodeU64(version), a byte 1 if it was built
// on a version (else 0), EncodeU64(that version, else 0).
constexpr char kBaseKey[] = "rhino:base";
constexpr char kExportManifest[] = "RHINO_EXPORT.json";

inline Status FromRocks(const rocksdb::Status& s, const std::string& context) {
  if (s.ok()) return Status::OK();
  std::string msg = context + ": " + s.ToString();
  if (s.IsNotFound()) return Status::NotFound(msg);
  if (s.IsCorruption()) return Status::Corruption(msg);
  if (s.IsInvalidArgument()) return Status::InvalidArgument(msg);
  if (s.IsNoSpace()) return Status::NoSpace(msg);
  if (s.IsBusy() || s.IsTryAgain()) return Status::Busy(msg);
  if (s.IsIOError() && s.ToString().find("No space left") != std::string::npos) return Status::NoSpace(msg);
  return Status::IOError(msg);
}

inline std::string EncodeU64(uint64_t v) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[i] = static_cast<char>((v >> (8 * i)) & 0xff);
  return s;
}

inline bool DecodeU64(const std::string& s, uint64_t* v) {
  if (s.size() != 8) return false;
  *v = 0;
  for (int i = 7; i >= 0; --i) *v = (*v << 8) | static_cast<unsigned char>(s[i]);
  return true;
}

inline std::string Hex(const std::string& s) {
  static const char* k = "0123456789abcdef";
  std::string r;
  for (unsigned char c : s) {
    r.push_back(k[c >> 4]);
    r.push_back(k[c & 15]);
  }
  return r;
}

inline std::string Unhex(const std::string& h) {
  std::string r;
  auto v = [](char c) { return c <= '9' ? c - '0' : c - 'a' + 10; };
  for (size_t i = 0; i + 1 < h.size(); i += 2) r.push_back(static_cast<char>((v(h[i]) << 4) | v(h[i + 1])));
  return r;
}

inline json PartitionerJson(const PartitionerOptions& p) {
  return {{"num_key_groups", p.num_key_groups}, {"num_vnodes", p.num_vnodes}, {"seed", p.seed}};
}

inline PartitionerOptions PartitionerFromJson(const json& j) {
  PartitionerOptions p;
  p.num_key_groups = j.at("num_key_groups").get<uint32_t>();
  p.num_vnodes = j.at("num_vnodes").get<uint32_t>();
  p.seed = j.at("seed").get<uint64_t>();
  return p;
}

inline bool SamePartitioner(const PartitionerOptions& a, const PartitionerOptions& b) {
  return a.num_key_groups == b.num_key_groups && a.num_vnodes == b.num_vnodes && a.seed == b.seed;
}

inline std::string DescribePartitioner(const PartitionerOptions& p) {
  return "K=" + std::to_string(p.num_key_groups) + " V=" + std::to_string(p.num_vnodes) +
         " seed=" + std::to_string(p.seed);
}

}  // namespace rhino::state_internal
