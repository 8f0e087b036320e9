// A RocksDB FileSystem that skips every fsync while a DB is being opened.
//
// Why: a takeover (design §4, Rhino §4.1) opens a DB directory just built by
// hard links from a checkpoint that is already durable in the replica store.
// Opening it writes a new MANIFEST, CURRENT, OPTIONS and WAL, each synced,
// and under the write load of a running job every fsync waits for the file
// system's journal: 0.3-0.45 s per open here, against 20 ms on a quiet disk
// (bench/results/takeover_open.md). Nothing in that directory is the only copy
// of committed state, so the open need not wait for the disk: the caller
// makes the directory durable afterwards, off the critical path
// (fs::FsyncDirTree), and a worker that restarts with a damaged directory
// rebuilds it from the store (HostedInstance::Rebuild).
//
// Only the open skips: once EndOpen() is called, the files the DB keeps
// (its WAL, MANIFEST) sync as usual.
//
// The open also leaves out the OPTIONS file. DB::Open serializes every column
// family's options to a new OPTIONS file and then parses the file back to
// verify it: with one column family per vnode that was ~70% of the open's CPU
// (0.45 ms per vnode; perf, bench/results/takeover_open.sched.md). The
// directory already holds the checkpoint's OPTIONS file, written by the same
// options; the file system refuses the new one while the open skips, RocksDB
// logs that and goes on (fail_if_options_file_error = false), and
// StateBackend writes it right after the open, in the background
// (StateBackendImpl::WriteDeferredOptionsFile).
#pragma once

#include <atomic>
#include <memory>

#include <rocksdb/env.h>
#include <rocksdb/file_system.h>

namespace rhino {

class OpenWithoutSyncFileSystem : public rocksdb::FileSystemWrapper {
 public:
  explicit OpenWithoutSyncFileSystem(const std::shared_ptr<rocksdb::FileSystem>& base);
  static const char* kClassName() { return "RhinoOpenWithoutSync"; }
  const char* Name() const override { return kClassName(); }

  // From here on, every file and directory syncs again.
  void EndOpen() { skipping_->store(false, std::memory_order_release); }

  rocksdb::IOStatus NewWritableFile(const std::string& name, const rocksdb::FileOptions& opts,
                                    std::unique_ptr<rocksdb::FSWritableFile>* out,
                                    rocksdb::IODebugContext* dbg) override;
  rocksdb::IOStatus ReopenWritableFile(const std::string& name, const rocksdb::FileOptions& opts,
                                       std::unique_ptr<rocksdb::FSWritableFile>* out,
                                       rocksdb::IODebugContext* dbg) override;
  rocksdb::IOStatus ReuseWritableFile(const std::string& name, const std::string& old_name,
                                      const rocksdb::FileOptions& opts, std::unique_ptr<rocksdb::FSWritableFile>* out,
                                      rocksdb::IODebugContext* dbg) override;
  rocksdb::IOStatus NewDirectory(const std::string& name, const rocksdb::IOOptions& io_opts,
                                 std::unique_ptr<rocksdb::FSDirectory>* out, rocksdb::IODebugContext* dbg) override;

 private:
  // Shared with every file opened through us, which may outlive the open.
  std::shared_ptr<std::atomic<bool>> skipping_;
};

// An Env over Env::Default() (its thread pools) whose files go through an
// OpenWithoutSyncFileSystem; `fs` gets that file system, to call EndOpen().
std::unique_ptr<rocksdb::Env> NewOpenWithoutSyncEnv(std::shared_ptr<OpenWithoutSyncFileSystem>* fs);

}  // namespace rhino
