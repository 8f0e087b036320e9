#include "util/crash_point.h"

#include <csignal>
#include <cstdlib>
#include <cstring>
#include <chrono>
#include <string>
#include <thread>

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

void DelayPoint(const char* name) {
  struct Target {
    std::string name;
    long ms = 0;
  };
  static const Target target = [] {
    Target t;
    const char* v = std::getenv("RHINO_DELAY_POINT");
    const char* colon = v ? std::strrchr(v, ':') : nullptr;
    if (colon != nullptr) {
      t.name.assign(v, colon);
      t.ms = std::strtol(colon + 1, nullptr, 10);
    }
    return t;
  }();
  if (target.ms > 0 && target.name == name) std::this_thread::sleep_for(std::chrono::milliseconds(target.ms));
}

}  // namespace rhino
