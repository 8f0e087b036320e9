// Small POSIX file-system helpers returning Status. Internal to the C++ core.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "rhino/status.h"

namespace rhino::fs {

bool Exists(const std::string& path);
bool IsDir(const std::string& path);
// mkdir -p; ok if it exists. Each directory it creates is durable (its parent
// fsynced) when it returns.
Status MakeDirs(const std::string& path);
Status ListDir(const std::string& path, std::vector<std::string>* names);  // sorted, no . / ..
Status RemoveAll(const std::string& path);  // rm -rf; ok if absent
Status FsyncPath(const std::string& path);  // fsync a file or directory
Status FsyncParent(const std::string& path);
Status Rename(const std::string& from, const std::string& to);
Status FileSize(const std::string& path, uint64_t* size);
Status Inode(const std::string& path, uint64_t* dev, uint64_t* ino);
// Copies bytes (sendfile/copy_file_range), fsyncs the copy.
// sync = false leaves the copy in the page cache (a rebuildable file; see
// RestoreOptions::durable).
Status CopyFile(const std::string& from, const std::string& to, bool sync = true);
// fsync every file directly in `dir`, then `dir` itself: makes durable, after
// the fact, a directory that was built without syncing.
Status FsyncDirTree(const std::string& dir);
// link(2); sets *cross_device if it failed with EXDEV (and returns ok=false then).
Status Link(const std::string& from, const std::string& to, bool* cross_device);
Status ReadFile(const std::string& path, std::string* data);
// Writes `data` to path.tmp, fsyncs, renames over `path`, fsyncs the directory.
// With sync false, no fsync: atomic (a crash leaves the old or the new file)
// but not yet durable; the caller makes it durable later (FsyncPath, FsyncParent).
Status WriteFileAtomic(const std::string& path, const std::string& data, bool sync = true);
std::string Join(const std::string& a, const std::string& b);
std::string Parent(const std::string& path);
std::string Basename(const std::string& path);
std::string RandomHex(int bytes);

}  // namespace rhino::fs
