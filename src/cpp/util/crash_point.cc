#include "util/crash_point.h"

#include <csignal>
#include <cstdlib>
#include <cstring>
#include <string>

namespace rhino {

void CrashPoint(const char* name) {
  // Read once: the environment does not change under us in the processes
  // that use this.
  static const std::string target = [] {
    const char* v = std::getenv("RHINO_CRASH_POINT");
    return std::string(v ? v : "");
  }();
  if (!target.empty() && target == name) std::raise(SIGKILL);
}

bool FaultPoint(const char* name) {
  static const std::string target = [] {
    const char* v = std::getenv("RHINO_FAULT_POINT");
    return std::string(v ? v : "");
  }();
  return !target.empty() && target == name;
}

}  // namespace rhino
