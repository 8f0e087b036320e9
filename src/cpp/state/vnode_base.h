// A vnode on a base (the early hand-over, issue 48; rhino/state_backend.h,
// VnodeBase): how a session reads through to the base, and how a base that
// lands is written into the files MergeBase puts under the vnode.
//
// While a vnode is on its base, the state keeps one more thing beside its
// column family: the keys this instance deleted since the move ("gone" keys,
// in the metadata column family). RocksDB cannot tell a key deleted here from
// one never written here, and only the second may be read through; and a
// delete that compaction drops (nothing is below it until the base lands)
// must be applied again over the base when it merges.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "rhino/state_backend.h"
#include "rhino/status.h"

namespace rocksdb {
class SstFileWriter;
struct Options;
}  // namespace rocksdb

namespace rhino {

// The reads of bases, for a session: the state service's implementation asks
// a worker that holds the base's checkpoint (one request per call, so a task
// pays a constant number of round trips per batch); a unit test's answers
// from a model.
class BaseReader {
 public:
  virtual ~BaseReader() = default;
  // The base values of keys[i] in vnodes[i] (each on a base): found[i], and
  // values[i] where found. The keys of one call may span vnodes and bases.
  virtual Status Get(const std::vector<uint32_t>& vnodes, const std::vector<std::string_view>& keys,
                     std::vector<uint8_t>* found, std::vector<std::string>* values) = 0;
  // The base entries of `vnode` whose key starts with `prefix`, in RocksDB's
  // order, strictly after `after` if set: at most `max_entries` of them, and
  // *more if there are others after the last.
  virtual Status Scan(uint32_t vnode, std::string_view prefix, std::optional<std::string_view> after,
                      size_t max_entries, std::vector<std::pair<std::string, std::string>>* out, bool* more) = 0;
};

// Writes a base's entries, in key order, into SST files of at most
// `file_bytes` each, in `dir`, for StateBackend::MergeBase: the vnode's own
// column family options (copied from `db` at construction: the writer may
// outlive that StateBackend object, which a rollback replaces), so the files
// read as the vnode's own would.
class BaseFileWriter {
 public:
  BaseFileWriter(const StateBackend& db, std::string dir, uint64_t file_bytes = 64ull << 20);
  ~BaseFileWriter();
  BaseFileWriter(const BaseFileWriter&) = delete;
  BaseFileWriter& operator=(const BaseFileWriter&) = delete;

  // InvalidArgument for a key not after the previous one.
  Status Add(std::string_view key, std::string_view value);
  // Closes the last file; *files are every file written, in key order.
  Status Finish(std::vector<std::string>* files);

 private:
  Status Roll();
  std::unique_ptr<rocksdb::Options> options_;
  const std::string dir_;
  const uint64_t file_bytes_;
  std::unique_ptr<rocksdb::SstFileWriter> writer_;
  std::vector<std::string> files_;
  std::string last_key_;
  bool any_ = false;
};

}  // namespace rhino
