// Manifest: the committed description of one checkpoint of one instance.
//
// A checkpoint is visible in a replica store iff its manifest file exists
// (Rhino §4.2 / docs/design.md §3 step 6): the manifest is written to a temporary file,
// fsync'ed and renamed into place, so a partial checkpoint is never visible.
//
// On disk a manifest is one line of JSON followed by a trailer line
// "xxh3:<16 hex digits>" over the JSON bytes, so that a torn or edited manifest
// is detected as Corruption rather than silently misread.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "rhino/partitioner.h"
#include "rhino/status.h"

namespace rhino {

// One file of a checkpoint.
struct FileEntry {
  std::string name;      // the file's name inside the RocksDB directory, e.g. "000123.sst"
  uint64_t size = 0;     // bytes
  std::string checksum;  // XXH3-128 of the contents, 32 lowercase hex digits
  // Content identity: "<checksum>-<size>". Pool files are keyed by it, never by
  // `name`, because RocksDB reuses file numbers after a restore.
  std::string identity;
  bool in_delta = false;  // new since the parent checkpoint
};

struct Manifest {
  static constexpr int kFormatVersion = 1;

  std::string operator_id;
  uint32_t instance = 0;
  uint64_t checkpoint_id = 0;
  bool has_parent = false;
  uint64_t parent_id = 0;
  uint64_t epoch = 0;    // routing epoch the checkpoint was taken in
  uint64_t version = 0;  // state version (micro-batch id) committed in the DB
  PartitionerOptions partitioner;
  std::vector<uint32_t> vnodes;
  std::vector<FileEntry> files;
  int64_t created_unix_ms = 0;

  uint64_t total_bytes() const;
  uint64_t delta_bytes() const;
  uint64_t delta_files() const;

  std::string Serialize() const;  // JSON line + checksum trailer
  static Status Parse(const std::string& data, Manifest* out);
};

// True if `name` is a plain file name: no '/', no NUL, not "." or "..", not empty.
bool IsPlainFileName(const std::string& name);
// True if `id` is a valid operator id: [A-Za-z0-9_.-]{1,128}, not starting with '.'.
bool IsValidOperatorId(const std::string& id);
// True if `identity` has the form "<32 hex>-<decimal size>".
bool IsValidIdentity(const std::string& identity);

}  // namespace rhino
