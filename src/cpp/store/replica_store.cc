// ReplicaStore (rhino/replica_store.h): its directory, locks and pins, the
// pool of checkpoint files by content identity, committing and reading
// manifests, and verifying them. A restore is store_restore.cc's; dropping
// checkpoints and collecting the pool, store_gc.cc's.
#include "rhino/replica_store.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>
// Bulk hashing (chunks, whole files) through libxxhash's run-time dispatch to
// its AVX2/AVX-512 kernels; the plain entry points are built for baseline
// x86-64 (SSE2). Same hash values either way (the XXH3 spec).
#include <xxh_x86dispatch.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <set>
#include <unordered_map>

#include "store/store_internal.h"
#include "util/crash_point.h"
#include "util/fs.h"

namespace rhino {
using namespace store_internal;

namespace {

constexpr char kManifestSuffix[] = ".manifest";

bool ParseManifestName(const std::string& name, uint64_t* id) {
  const size_t suffix = sizeof(kManifestSuffix) - 1;
  if (name.size() != 20 + suffix || name.compare(20, suffix, kManifestSuffix) != 0) return false;
  uint64_t v = 0;
  for (int i = 0; i < 20; ++i) {
    if (name[i] < '0' || name[i] > '9') return false;
    v = v * 10 + static_cast<uint64_t>(name[i] - '0');
  }
  *id = v;
  return true;
}

}  // namespace

namespace store_internal {

std::string ManifestName(uint64_t checkpoint_id) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%020llu", static_cast<unsigned long long>(checkpoint_id));
  return std::string(buf) + kManifestSuffix;
}

bool StagingOwnerDead(const std::string& name, const std::string& prefix) {
  if (name.compare(0, prefix.size(), prefix) != 0) return false;
  auto dash = name.find('-', prefix.size());
  if (dash == std::string::npos) return false;
  long pid = std::strtol(name.substr(prefix.size(), dash - prefix.size()).c_str(), nullptr, 10);
  if (pid <= 0) return false;
  return ::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH;
}

}  // namespace store_internal

bool IsImmutableDbFile(const std::string& name) {
  auto ends = [&](const char* s) {
    size_t n = std::char_traits<char>::length(s);
    return name.size() > n && name.compare(name.size() - n, n, s) == 0;
  };
  return ends(".sst") || ends(".blob");
}

Status HashFile(const std::string& path, std::string* checksum, uint64_t* size) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return Status::FromErrno(errno, "open " + path);
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
  XXH3_state_t* st = XXH3_createState();
  XXH3_128bits_reset(st);
  std::string buf(1 << 20, '\0');
  uint64_t total = 0;
  Status s;
  for (;;) {
    ssize_t n = ::read(fd, buf.data(), buf.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      s = Status::FromErrno(errno, "read " + path);
      break;
    }
    if (n == 0) break;
    XXH3_128bits_update(st, buf.data(), static_cast<size_t>(n));
    total += static_cast<uint64_t>(n);
  }
  XXH128_hash_t h = XXH3_128bits_digest(st);
  XXH3_freeState(st);
  ::close(fd);
  if (!s.ok()) return s;
  char hex[33];
  std::snprintf(hex, sizeof(hex), "%016llx%016llx", static_cast<unsigned long long>(h.high64),
                static_cast<unsigned long long>(h.low64));
  *checksum = hex;
  *size = total;
  return Status::OK();
}

ReplicaStore::Lock::~Lock() {
  if (fd_ >= 0) ::close(fd_);  // closing the fd releases the flock
}

ReplicaStore::Pin::~Pin() { ::unlink(path_.c_str()); }

Status ReplicaStore::PinManifest(const Manifest& m, std::unique_ptr<Pin>* out) {
  std::string list;
  for (const auto& f : m.files) list.append(f.identity).push_back('\n');
  const std::string dir = fs::Join(dir_, "pins");
  RHINO_RETURN_IF_ERROR(fs::MakeDirs(dir));  // a store made before pins existed
  // Not synced: a pin never outlives its process, and GC drops those of dead ones.
  std::string path = fs::Join(dir, std::to_string(::getpid()) + "-" + fs::RandomHex(8));
  RHINO_RETURN_IF_ERROR(fs::WriteFileAtomic(path, list, /*sync=*/false));
  *out = std::make_unique<Pin>(std::move(path));
  return Status::OK();
}

// The identities the live pins hold (PinManifest); the pins of processes that
// no longer run are removed. Under the exclusive lock.
Status ReplicaStore::PinnedIdentities(std::set<std::string>* pinned, uint64_t* pins) {
  const std::string dir = fs::Join(dir_, "pins");
  if (!fs::Exists(dir)) return Status::OK();
  std::vector<std::string> names;
  RHINO_RETURN_IF_ERROR(fs::ListDir(dir, &names));
  for (const auto& n : names) {
    const std::string path = fs::Join(dir, n);
    if (StagingOwnerDead(n, "")) {
      ::unlink(path.c_str());
      continue;
    }
    std::string list;
    Status s = fs::ReadFile(path, &list);
    if (s.IsNotFound()) continue;  // released meanwhile
    // Never delete on uncertainty: a live pin that cannot be read stops GC.
    if (!s.ok()) return Status::IOError("garbage collection stopped: pin " + path + ": " + s.message());
    ++*pins;
    size_t start = 0;
    while (start < list.size()) {
      size_t end = list.find('\n', start);
      if (end == std::string::npos) end = list.size();
      if (end > start) pinned->insert(list.substr(start, end - start));
      start = end + 1;
    }
  }
  return Status::OK();
}

Status ReplicaStore::AcquireLock(bool exclusive, std::unique_ptr<Lock>* out, bool wait) const {
  std::string path = fs::Join(dir_, "LOCK");
  int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) return Status::FromErrno(errno, "open " + path);
  while (::flock(fd, (exclusive ? LOCK_EX : LOCK_SH) | (wait ? 0 : LOCK_NB)) != 0) {
    if (errno == EINTR) continue;
    if (errno == EWOULDBLOCK) {
      ::close(fd);
      return Status::Busy("the replica store " + dir_ + " is in use");
    }
    Status s = Status::FromErrno(errno, "flock " + path);
    ::close(fd);
    return s;
  }
  *out = std::make_unique<Lock>(fd);
  return Status::OK();
}

Status ReplicaStore::Open(const std::string& dir, std::unique_ptr<ReplicaStore>* out) {
  if (dir.empty()) return Status::InvalidArgument("store directory is empty");
  for (const char* sub : {"pool", "checkpoints", "tmp", "pins"}) {
    RHINO_RETURN_IF_ERROR(fs::MakeDirs(fs::Join(dir, sub)));
  }
  std::unique_ptr<ReplicaStore> store(new ReplicaStore(dir));
  // Staging left by a crashed process is garbage: nothing ever reads it.
  std::vector<std::string> names;
  RHINO_RETURN_IF_ERROR(fs::ListDir(fs::Join(dir, "tmp"), &names));
  for (const auto& n : names) {
    auto dash = n.find('-');
    if (dash != std::string::npos && StagingOwnerDead(n, n.substr(0, dash + 1))) {
      RHINO_RETURN_IF_ERROR(fs::RemoveAll(fs::Join(fs::Join(dir, "tmp"), n)));
    }
  }
  *out = std::move(store);
  return Status::OK();
}

Status ReplicaStore::NewStagingDir(const std::string& kind, std::string* path) {
  *path = fs::Join(fs::Join(dir_, "tmp"), kind + "-" + std::to_string(::getpid()) + "-" + fs::RandomHex(8));
  if (::mkdir(path->c_str(), 0755) != 0) return Status::FromErrno(errno, "mkdir " + *path);
  return Status::OK();
}

Status ReplicaStore::PoolPath(const std::string& identity, std::string* path) const {
  if (!IsValidIdentity(identity)) {
    return Status::PathOutsideStore("'" + identity + "' is not a content identity; refusing to use it as a path");
  }
  *path = fs::Join(fs::Join(dir_, "pool"), identity);
  return Status::OK();
}

Status ReplicaStore::InstanceDir(const std::string& operator_id, uint32_t instance,
                                 std::string* path) const {
  if (!IsValidOperatorId(operator_id)) {
    return Status::PathOutsideStore("operator id '" + operator_id +
                                    "' is not [A-Za-z0-9_.-]{1,128} without a leading '.'");
  }
  *path = fs::Join(fs::Join(fs::Join(dir_, "checkpoints"), operator_id), std::to_string(instance));
  return Status::OK();
}

Status ReplicaStore::PoolFile(const std::string& path, const FileEntry* known, FileEntry* entry) {
  if (known != nullptr && IsValidIdentity(known->identity)) {
    std::string pooled = fs::Join(fs::Join(dir_, "pool"), known->identity);
    uint64_t d1, i1, d2, i2;
    if (fs::Inode(path, &d1, &i1).ok() && fs::Inode(pooled, &d2, &i2).ok() && d1 == d2 && i1 == i2) {
      // Same inode as a pooled file: same bytes, already pooled (pool files are immutable).
      entry->size = known->size;
      entry->checksum = known->checksum;
      entry->identity = known->identity;
      return Status::OK();
    }
  }
  RHINO_RETURN_IF_ERROR(HashFile(path, &entry->checksum, &entry->size));
  entry->identity = entry->checksum + "-" + std::to_string(entry->size);
  return AdoptVerifiedFile(path, *entry);
}

Status ReplicaStore::AdoptVerifiedFile(const std::string& path, const FileEntry& entry) {
  std::string pooled;
  RHINO_RETURN_IF_ERROR(PoolPath(entry.identity, &pooled));
  if (fs::Exists(pooled)) return Status::OK();  // the same content is pooled already
  bool cross_device = false;
  Status s = fs::Link(path, pooled, &cross_device);
  if (!s.ok() && cross_device) {
    std::string tmp = pooled + ".tmp-" + fs::RandomHex(6);
    s = fs::CopyFile(path, tmp);
    if (s.ok()) s = fs::Rename(tmp, pooled);
    if (!s.ok()) ::unlink(tmp.c_str());
  }
  if (!s.ok() && s.IsAlreadyExists()) return Status::OK();  // a concurrent pooler won
  if (!s.ok()) return s;
  // Pool files are immutable (make accidents loud) and owner-only: state is
  // nobody else's to read (issue 46). A restore's links share this inode, so
  // its SSTs are 0400 too.
  ::chmod(pooled.c_str(), 0400);
  return Status::OK();
}

Status ReplicaStore::CommitManifest(const Manifest& m) {
  std::string inst_dir;
  RHINO_RETURN_IF_ERROR(InstanceDir(m.operator_id, m.instance, &inst_dir));
  for (const auto& f : m.files) {
    if (!IsPlainFileName(f.name)) return Status::PathOutsideStore("file name '" + f.name + "' is not a plain name");
    std::string pooled;
    RHINO_RETURN_IF_ERROR(PoolPath(f.identity, &pooled));
    uint64_t size = 0;
    Status s = fs::FileSize(pooled, &size);
    if (!s.ok()) return Status::NotFound("cannot commit: file " + f.name + " is not pooled (" + s.message() + ")");
    if (size != f.size) return Status::Corruption("cannot commit: pooled " + f.name + " has " +
                                                  std::to_string(size) + " bytes, expected " + std::to_string(f.size));
  }
  RHINO_RETURN_IF_ERROR(fs::MakeDirs(inst_dir));
  RHINO_RETURN_IF_ERROR(fs::FsyncParent(inst_dir));
  RHINO_RETURN_IF_ERROR(fs::FsyncParent(fs::Parent(inst_dir)));
  // The pool's directory entries must be durable before a manifest names them.
  RHINO_RETURN_IF_ERROR(fs::FsyncPath(fs::Join(dir_, "pool")));

  std::string final_path = fs::Join(inst_dir, ManifestName(m.checkpoint_id));
  std::string tmp = final_path + ".tmp-" + std::to_string(::getpid()) + "-" + fs::RandomHex(6);
  CrashPoint("checkpoint.before_manifest");
  {
    // Write + fsync a temporary file, then link(2) it into place: the commit
    // is atomic and, unlike rename(2), never replaces a committed manifest.
    std::string data = m.Serialize();
    int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0400);
    if (fd < 0) return Status::FromErrno(errno, "create " + tmp);
    size_t off = 0;
    Status s;
    while (off < data.size() && s.ok()) {
      ssize_t n = ::write(fd, data.data() + off, data.size() - off);
      if (n < 0 && errno != EINTR) s = Status::FromErrno(errno, "write " + tmp);
      if (n > 0) off += static_cast<size_t>(n);
      if (off * 2 >= data.size()) CrashPoint("checkpoint.mid_manifest");
    }
    if (s.ok() && ::fsync(fd) != 0) s = Status::FromErrno(errno, "fsync " + tmp);
    ::close(fd);
    if (!s.ok()) {
      ::unlink(tmp.c_str());
      return s;
    }
  }
  CrashPoint("checkpoint.before_link_manifest");
  if (::link(tmp.c_str(), final_path.c_str()) != 0) {
    int err = errno;
    ::unlink(tmp.c_str());
    if (err == EEXIST) {
      return Status::AlreadyExists("checkpoint " + std::to_string(m.checkpoint_id) + " of " +
                                   m.operator_id + "/" + std::to_string(m.instance) + " is already committed");
    }
    return Status::FromErrno(err, "link " + final_path);
  }
  ::unlink(tmp.c_str());
  RHINO_RETURN_IF_ERROR(fs::FsyncPath(inst_dir));
  CrashPoint("checkpoint.after_commit");
  return Status::OK();
}

Status ReplicaStore::ReadManifest(const std::string& operator_id, uint32_t instance,
                                  uint64_t checkpoint_id, Manifest* out) const {
  std::string inst_dir;
  RHINO_RETURN_IF_ERROR(InstanceDir(operator_id, instance, &inst_dir));
  std::string data;
  Status s = fs::ReadFile(fs::Join(inst_dir, ManifestName(checkpoint_id)), &data);
  if (s.IsNotFound()) {
    return Status::NotFound("checkpoint " + std::to_string(checkpoint_id) + " of " + operator_id + "/" +
                            std::to_string(instance) + " is not in store " + dir_);
  }
  RHINO_RETURN_IF_ERROR(s);
  s = Manifest::Parse(data, out);
  if (!s.ok()) {
    return Status::Corruption("checkpoint " + std::to_string(checkpoint_id) + " of " + operator_id + "/" +
                              std::to_string(instance) + ": " + s.message());
  }
  if (out->operator_id != operator_id || out->instance != instance || out->checkpoint_id != checkpoint_id) {
    return Status::Corruption("manifest at checkpoint " + std::to_string(checkpoint_id) + " of " + operator_id +
                              "/" + std::to_string(instance) + " describes another checkpoint");
  }
  return Status::OK();
}

Status ReplicaStore::ListCheckpoints(const std::string& operator_id, uint32_t instance,
                                     std::vector<uint64_t>* out) const {
  out->clear();
  std::string inst_dir;
  RHINO_RETURN_IF_ERROR(InstanceDir(operator_id, instance, &inst_dir));
  if (!fs::IsDir(inst_dir)) return Status::OK();
  std::vector<std::string> names;
  RHINO_RETURN_IF_ERROR(fs::ListDir(inst_dir, &names));
  for (const auto& n : names) {
    uint64_t id;
    if (ParseManifestName(n, &id)) out->push_back(id);
  }
  return Status::OK();  // names are zero-padded, so sorted names are sorted ids
}

Status ReplicaStore::ListInstances(std::vector<InstanceRef>* out) const {
  out->clear();
  std::vector<std::string> ops;
  RHINO_RETURN_IF_ERROR(fs::ListDir(fs::Join(dir_, "checkpoints"), &ops));
  for (const auto& op : ops) {
    if (!IsValidOperatorId(op)) continue;
    std::vector<std::string> insts;
    RHINO_RETURN_IF_ERROR(fs::ListDir(fs::Join(fs::Join(dir_, "checkpoints"), op), &insts));
    for (const auto& i : insts) {
      char* end = nullptr;
      unsigned long v = std::strtoul(i.c_str(), &end, 10);
      if (!i.empty() && *end == '\0' && std::to_string(v) == i) out->push_back({op, static_cast<uint32_t>(v)});
    }
  }
  return Status::OK();
}

Status ReplicaStore::Verify(const std::string& operator_id, uint32_t instance, VerifyLevel level,
                            VerifyReport* report, const VerifyObserver& observer) const {
  *report = VerifyReport();
  // Pooled files are immutable and shared by consecutive checkpoints (an
  // incremental checkpoint adds only its delta), so each is read once:
  // identity -> (its XXH3-128, or the error reading it).
  struct Hashed {
    std::string sum;
    std::string error;
  };
  std::unordered_map<std::string, Hashed> hashed;
  std::unique_ptr<Lock> lock;
  RHINO_RETURN_IF_ERROR(AcquireLock(false, &lock));
  std::vector<InstanceRef> instances;
  if (operator_id.empty()) {
    RHINO_RETURN_IF_ERROR(ListInstances(&instances));
  } else {
    std::string ignored;
    RHINO_RETURN_IF_ERROR(InstanceDir(operator_id, instance, &ignored));
    instances.push_back({operator_id, instance});
  }
  for (const auto& inst : instances) {
    std::vector<uint64_t> ids;
    RHINO_RETURN_IF_ERROR(ListCheckpoints(inst.operator_id, inst.instance, &ids));
    for (uint64_t id : ids) {
      ++report->checkpoints;
      auto problem = [&](const std::string& file, const std::string& detail) {
        report->problems.push_back({inst.operator_id, inst.instance, id, file, detail});
      };
      Manifest m;
      Status s = ReadManifest(inst.operator_id, inst.instance, id, &m);
      if (!s.ok()) {
        problem("", s.message());
        continue;
      }
      for (const auto& f : m.files) {
        std::string pooled;
        if (!IsPlainFileName(f.name) || !PoolPath(f.identity, &pooled).ok()) {
          problem(f.name, "invalid file name or identity");
          continue;
        }
        uint64_t size = 0;
        if (!fs::FileSize(pooled, &size).ok()) {
          problem(f.name, "missing from the pool");
          continue;
        }
        ++report->files_checked;
        if (size != f.size) {
          problem(f.name, (size < f.size ? "truncated: " : "wrong size: ") + std::to_string(size) +
                              " bytes, expected " + std::to_string(f.size));
          continue;
        }
        if (level == VerifyLevel::kFull) {
          auto it = hashed.find(f.identity);
          if (it == hashed.end()) {
            Hashed h;
            uint64_t n = 0;
            Status hs = HashFile(pooled, &h.sum, &n);
            report->bytes_checked += n;
            if (!hs.ok()) h.error = hs.message();
            it = hashed.emplace(f.identity, std::move(h)).first;
          }
          if (!it->second.error.empty()) {
            problem(f.name, it->second.error);
          } else if (it->second.sum != f.checksum) {
            problem(f.name, "checksum mismatch");
          }
        }
        if (observer && !observer(*report)) {
          return Status::Aborted("verify stopped by its caller after " + std::to_string(report->files_checked) +
                                 " files");
        }
      }
    }
  }
  return Status::OK();
}

}  // namespace rhino
