#include "open_without_sync.h"

namespace rhino {
namespace {

using rocksdb::IODebugContext;
using rocksdb::IOOptions;
using rocksdb::IOStatus;

class File : public rocksdb::FSWritableFileOwnerWrapper {
 public:
  File(std::unique_ptr<rocksdb::FSWritableFile>&& t, std::shared_ptr<std::atomic<bool>> skipping)
      : FSWritableFileOwnerWrapper(std::move(t)), skipping_(std::move(skipping)) {}
  IOStatus Sync(const IOOptions& o, IODebugContext* d) override {
    return skip() ? IOStatus::OK() : FSWritableFileOwnerWrapper::Sync(o, d);
  }
  IOStatus Fsync(const IOOptions& o, IODebugContext* d) override {
    return skip() ? IOStatus::OK() : FSWritableFileOwnerWrapper::Fsync(o, d);
  }
  IOStatus RangeSync(uint64_t off, uint64_t n, const IOOptions& o, IODebugContext* d) override {
    return skip() ? IOStatus::OK() : FSWritableFileOwnerWrapper::RangeSync(off, n, o, d);
  }

 private:
  bool skip() const { return skipping_->load(std::memory_order_acquire); }
  std::shared_ptr<std::atomic<bool>> skipping_;
};

class Directory : public rocksdb::FSDirectoryWrapper {
 public:
  Directory(std::unique_ptr<rocksdb::FSDirectory>&& t, std::shared_ptr<std::atomic<bool>> skipping)
      : FSDirectoryWrapper(std::move(t)), skipping_(std::move(skipping)) {}
  IOStatus Fsync(const IOOptions& o, IODebugContext* d) override {
    return skip() ? IOStatus::OK() : FSDirectoryWrapper::Fsync(o, d);
  }
  IOStatus FsyncWithDirOptions(const IOOptions& o, IODebugContext* d,
                               const rocksdb::DirFsyncOptions& dirs) override {
    return skip() ? IOStatus::OK() : FSDirectoryWrapper::FsyncWithDirOptions(o, d, dirs);
  }

 private:
  bool skip() const { return skipping_->load(std::memory_order_acquire); }
  std::shared_ptr<std::atomic<bool>> skipping_;
};

}  // namespace

OpenWithoutSyncFileSystem::OpenWithoutSyncFileSystem(const std::shared_ptr<rocksdb::FileSystem>& base)
    : FileSystemWrapper(base), skipping_(std::make_shared<std::atomic<bool>>(true)) {}

namespace {

// RocksDB's temporary OPTIONS file, <dir>/OPTIONS-<number>.dbtmp, written and
// parsed back before it is renamed into place (options_parser.cc).
bool IsTempOptionsFile(const std::string& name) {
  const size_t slash = name.find_last_of('/');
  const std::string base = slash == std::string::npos ? name : name.substr(slash + 1);
  static const std::string kPrefix = "OPTIONS-", kSuffix = ".dbtmp";
  return base.size() > kPrefix.size() + kSuffix.size() && base.compare(0, kPrefix.size(), kPrefix) == 0 &&
         base.compare(base.size() - kSuffix.size(), kSuffix.size(), kSuffix) == 0;
}

}  // namespace

IOStatus OpenWithoutSyncFileSystem::NewWritableFile(const std::string& name, const rocksdb::FileOptions& opts,
                                                    std::unique_ptr<rocksdb::FSWritableFile>* out,
                                                    IODebugContext* dbg) {
  if (skipping_->load(std::memory_order_acquire) && IsTempOptionsFile(name)) {
    return IOStatus::NotSupported("Rhino writes the OPTIONS file after this open (open_without_sync.h)");
  }
  IOStatus s = target()->NewWritableFile(name, opts, out, dbg);
  if (s.ok()) out->reset(new File(std::move(*out), skipping_));
  return s;
}

IOStatus OpenWithoutSyncFileSystem::ReopenWritableFile(const std::string& name, const rocksdb::FileOptions& opts,
                                                       std::unique_ptr<rocksdb::FSWritableFile>* out,
                                                       IODebugContext* dbg) {
  IOStatus s = target()->ReopenWritableFile(name, opts, out, dbg);
  if (s.ok()) out->reset(new File(std::move(*out), skipping_));
  return s;
}

IOStatus OpenWithoutSyncFileSystem::ReuseWritableFile(const std::string& name, const std::string& old_name,
                                                      const rocksdb::FileOptions& opts,
                                                      std::unique_ptr<rocksdb::FSWritableFile>* out,
                                                      IODebugContext* dbg) {
  IOStatus s = target()->ReuseWritableFile(name, old_name, opts, out, dbg);
  if (s.ok()) out->reset(new File(std::move(*out), skipping_));
  return s;
}

IOStatus OpenWithoutSyncFileSystem::NewDirectory(const std::string& name, const IOOptions& io_opts,
                                                 std::unique_ptr<rocksdb::FSDirectory>* out, IODebugContext* dbg) {
  IOStatus s = target()->NewDirectory(name, io_opts, out, dbg);
  if (s.ok()) out->reset(new Directory(std::move(*out), skipping_));
  return s;
}

std::unique_ptr<rocksdb::Env> NewOpenWithoutSyncEnv(std::shared_ptr<OpenWithoutSyncFileSystem>* fs) {
  *fs = std::make_shared<OpenWithoutSyncFileSystem>(rocksdb::FileSystem::Default());
  return rocksdb::NewCompositeEnv(*fs);
}

}  // namespace rhino
