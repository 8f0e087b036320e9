#include "testing/test_util.h"

#include <dirent.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <fstream>
#include <random>
#include <sstream>
#include <stdexcept>

#include "rhino/replica_store.h"
#include "util/fs.h"

namespace rhino::testing {

TempDir::TempDir() {
  const char* base = std::getenv("TMPDIR");
  std::string tmpl = std::string(base && *base ? base : "/tmp") + "/rhino-cpptest-XXXXXX";
  if (mkdtemp(tmpl.data()) == nullptr) throw std::runtime_error("mkdtemp failed for " + tmpl);
  path_ = tmpl;
}

TempDir::~TempDir() { (void)fs::RemoveAll(path_); }

std::string TempDir::Sub(const std::string& name) const { return fs::Join(path_, name); }

std::string LE(uint64_t v, int bytes) {
  std::string s;
  for (int i = 0; i < bytes; ++i) s.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
  return s;
}

std::string RoutedKey(const std::string& head, const std::string& routing, const std::string& tail, uint8_t flags) {
  std::string s = head + routing + tail;
  s.push_back(static_cast<char>(head.size() >> 8));
  s.push_back(static_cast<char>(head.size() & 0xff));
  s.push_back(static_cast<char>(routing.size() >> 8));
  s.push_back(static_cast<char>(routing.size() & 0xff));
  s.push_back(static_cast<char>(flags));
  s.push_back(static_cast<char>(0xF5));
  return s;
}

::testing::AssertionResult IsCorruption(const Status& s) {
  if (s.code() == Status::Code::kCorruption) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "expected Corruption, got " << s.ToString();
}

std::string Slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void WriteBytes(const std::string& path, std::string_view bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

std::string RandomBytes(size_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::string s(n, '\0');
  for (auto& c : s) c = static_cast<char>(rng() & 0xff);
  return s;
}

bool Exists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

std::vector<std::string> List(const std::string& dir) {
  std::vector<std::string> names;
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return names;
  while (dirent* e = ::readdir(d)) {
    std::string n = e->d_name;
    if (n != "." && n != "..") names.push_back(n);
  }
  ::closedir(d);
  std::sort(names.begin(), names.end());
  return names;
}

Status PoolFiles(ReplicaStore* store, const std::string& src, const std::map<std::string, std::string>& files,
                 std::vector<FileEntry>* entries) {
  Status first = ::mkdir(src.c_str(), 0755) == 0 ? Status::OK() : Status::FromErrno(errno, "mkdir " + src);
  for (const auto& [name, bytes] : files) {  // on an error, the rest are still pooled; the first error is returned
    WriteBytes(src + "/" + name, bytes);
    FileEntry e;
    e.name = name;
    Status s = store->PoolFile(src + "/" + name, nullptr, &e);
    if (first.ok()) first = s;
    entries->push_back(e);
  }
  return first;
}

}  // namespace rhino::testing
