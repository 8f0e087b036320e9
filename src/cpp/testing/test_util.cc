#include "testing/test_util.h"

#include <cstdlib>
#include <stdexcept>

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

}  // namespace rhino::testing
