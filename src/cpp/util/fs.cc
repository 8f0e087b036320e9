#include "util/fs.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/sendfile.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <random>

namespace rhino::fs {
namespace {

struct Fd {
  int fd = -1;
  explicit Fd(int f) : fd(f) {}
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

}  // namespace

bool Exists(const std::string& path) {
  struct stat st;
  return ::lstat(path.c_str(), &st) == 0;
}

bool IsDir(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

Status MakeDirs(const std::string& path) {
  if (path.empty() || IsDir(path)) return Status::OK();
  std::string parent = Parent(path);
  if (!parent.empty() && parent != path) RHINO_RETURN_IF_ERROR(MakeDirs(parent));
  if (::mkdir(path.c_str(), 0755) != 0) {
    if (errno != EEXIST) return Status::FromErrno(errno, "mkdir " + path);
    // Made meanwhile by someone else is fine; a file in the way is not (mkdir -p fails too).
    if (!IsDir(path)) return Status::AlreadyExists("mkdir " + path + ": exists and is not a directory");
    return Status::OK();
  }
  // The new entry is durable only once its parent is fsynced: without this a
  // power loss could take a store's or an instance's whole directory, with
  // every checkpoint later made durable inside it (tests/test_power_loss.py).
  return FsyncParent(path);
}

Status ListDir(const std::string& path, std::vector<std::string>* names) {
  names->clear();
  DIR* d = ::opendir(path.c_str());
  if (d == nullptr) return Status::FromErrno(errno, "opendir " + path);
  while (struct dirent* e = ::readdir(d)) {
    std::string n = e->d_name;
    if (n != "." && n != "..") names->push_back(std::move(n));
  }
  ::closedir(d);
  std::sort(names->begin(), names->end());
  return Status::OK();
}

Status RemoveAll(const std::string& path) {
  struct stat st;
  if (::lstat(path.c_str(), &st) != 0) {
    return errno == ENOENT ? Status::OK() : Status::FromErrno(errno, "stat " + path);
  }
  if (S_ISDIR(st.st_mode)) {
    std::vector<std::string> names;
    RHINO_RETURN_IF_ERROR(ListDir(path, &names));
    for (const auto& n : names) RHINO_RETURN_IF_ERROR(RemoveAll(Join(path, n)));
    if (::rmdir(path.c_str()) != 0 && errno != ENOENT) return Status::FromErrno(errno, "rmdir " + path);
  } else if (::unlink(path.c_str()) != 0 && errno != ENOENT) {
    return Status::FromErrno(errno, "unlink " + path);
  }
  return Status::OK();
}

Status FsyncPath(const std::string& path) {
  Fd f(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (f.fd < 0) return Status::FromErrno(errno, "open for fsync " + path);
  if (::fsync(f.fd) != 0) return Status::FromErrno(errno, "fsync " + path);
  return Status::OK();
}

Status FsyncParent(const std::string& path) { return FsyncPath(Parent(path)); }

Status FsyncDirTree(const std::string& dir) {
  std::vector<std::string> names;
  RHINO_RETURN_IF_ERROR(ListDir(dir, &names));
  for (const auto& n : names) {
    const std::string p = Join(dir, n);
    Status s = FsyncPath(p);
    // RocksDB may delete an obsolete file (an old WAL, OPTIONS) meanwhile.
    if (!s.ok() && Exists(p)) return s;
  }
  return FsyncPath(dir);
}

Status Rename(const std::string& from, const std::string& to) {
  if (::rename(from.c_str(), to.c_str()) != 0) return Status::FromErrno(errno, "rename " + from + " -> " + to);
  return Status::OK();
}

Status FileSize(const std::string& path, uint64_t* size) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return Status::FromErrno(errno, "stat " + path);
  *size = static_cast<uint64_t>(st.st_size);
  return Status::OK();
}

Status Inode(const std::string& path, uint64_t* dev, uint64_t* ino) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return Status::FromErrno(errno, "stat " + path);
  *dev = st.st_dev;
  *ino = st.st_ino;
  return Status::OK();
}

Status CopyFile(const std::string& from, const std::string& to, bool sync) {
  Fd in(::open(from.c_str(), O_RDONLY | O_CLOEXEC));
  if (in.fd < 0) return Status::FromErrno(errno, "open " + from);
  struct stat st;
  if (::fstat(in.fd, &st) != 0) return Status::FromErrno(errno, "stat " + from);
  Fd out(::open(to.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600));  // owner-only: copies of state
  if (out.fd < 0) return Status::FromErrno(errno, "create " + to);
  off_t remaining = st.st_size;
  while (remaining > 0) {
    ssize_t n = ::copy_file_range(in.fd, nullptr, out.fd, nullptr, static_cast<size_t>(remaining), 0);
    if (n < 0 && (errno == EXDEV || errno == ENOSYS || errno == EINVAL || errno == EOPNOTSUPP)) {
      n = ::sendfile(out.fd, in.fd, nullptr, static_cast<size_t>(remaining));
    }
    if (n < 0) {
      if (errno == EINTR) continue;
      Status s = Status::FromErrno(errno, "copy " + from + " -> " + to);
      ::unlink(to.c_str());
      return s;
    }
    if (n == 0) break;  // the source shrank under us
    remaining -= n;
  }
  if (sync && ::fsync(out.fd) != 0) {
    Status s = Status::FromErrno(errno, "fsync " + to);
    ::unlink(to.c_str());
    return s;
  }
  return Status::OK();
}

Status Link(const std::string& from, const std::string& to, bool* cross_device) {
  *cross_device = false;
  if (::link(from.c_str(), to.c_str()) == 0) return Status::OK();
  if (errno == EXDEV || errno == EPERM || errno == EMLINK) *cross_device = true;
  return Status::FromErrno(errno, "link " + from + " -> " + to);
}

Status ReadFile(const std::string& path, std::string* data) {
  Fd f(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (f.fd < 0) return Status::FromErrno(errno, "open " + path);
  data->clear();
  char buf[1 << 16];
  for (;;) {
    ssize_t n = ::read(f.fd, buf, sizeof(buf));
    if (n < 0) {
      if (errno == EINTR) continue;
      return Status::FromErrno(errno, "read " + path);
    }
    if (n == 0) break;
    data->append(buf, static_cast<size_t>(n));
  }
  return Status::OK();
}

Status WriteFileAtomic(const std::string& path, const std::string& data, bool sync) {
  std::string tmp = path + ".tmp-" + RandomHex(6);
  {
    Fd f(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644));
    if (f.fd < 0) return Status::FromErrno(errno, "create " + tmp);
    size_t off = 0;
    while (off < data.size()) {
      ssize_t n = ::write(f.fd, data.data() + off, data.size() - off);
      if (n < 0) {
        if (errno == EINTR) continue;
        Status s = Status::FromErrno(errno, "write " + tmp);
        ::unlink(tmp.c_str());
        return s;
      }
      off += static_cast<size_t>(n);
    }
    if (sync && ::fsync(f.fd) != 0) {
      Status s = Status::FromErrno(errno, "fsync " + tmp);
      ::unlink(tmp.c_str());
      return s;
    }
  }
  Status s = Rename(tmp, path);
  if (!s.ok()) {
    ::unlink(tmp.c_str());
    return s;
  }
  return sync ? FsyncParent(path) : Status::OK();
}

std::string Join(const std::string& a, const std::string& b) {
  if (a.empty()) return b;
  return a.back() == '/' ? a + b : a + "/" + b;
}

std::string Parent(const std::string& path) {
  std::string p = path;
  while (p.size() > 1 && p.back() == '/') p.pop_back();
  auto pos = p.rfind('/');
  if (pos == std::string::npos) return ".";
  if (pos == 0) return "/";
  return p.substr(0, pos);
}

std::string Basename(const std::string& path) {
  std::string p = path;
  while (p.size() > 1 && p.back() == '/') p.pop_back();
  auto pos = p.rfind('/');
  return pos == std::string::npos ? p : p.substr(pos + 1);
}

std::string RandomHex(int bytes) {
  static thread_local std::mt19937_64 rng{std::random_device{}()};
  static const char* kHex = "0123456789abcdef";
  std::string s;
  for (int i = 0; i < bytes; ++i) {
    auto b = static_cast<unsigned>(rng() & 0xff);
    s.push_back(kHex[b >> 4]);
    s.push_back(kHex[b & 15]);
  }
  return s;
}

}  // namespace rhino::fs
