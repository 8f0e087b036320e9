#include "util/sched.h"

#include <pthread.h>
#include <sched.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <time.h>

#include <cstdio>

namespace rhino {

LatencyCritical::LatencyCritical() {
#ifdef __linux__
  int policy = 0;
  sched_param p{};
  if (pthread_getschedparam(pthread_self(), &policy, &p) != 0) return;
  if (policy == SCHED_BATCH || policy == SCHED_IDLE) {
    sched_param normal{};
    normal.sched_priority = 0;
    // BATCH -> OTHER needs no privilege; IDLE -> OTHER may be refused
    // (RLIMIT_NICE), and then the section simply runs as before.
    if (pthread_setschedparam(pthread_self(), SCHED_OTHER, &normal) == 0) saved_policy_ = policy;
  }
  // A larger CPU share: kNiceBoost nice levels down (CFS weights ~1.25x per
  // level), for this thread only (Linux's setpriority takes a thread id).
  // It needs CAP_SYS_NICE or RLIMIT_NICE; without them it is refused and the
  // section keeps its share.
  const pid_t tid = static_cast<pid_t>(syscall(SYS_gettid));
  errno = 0;
  const int nice = getpriority(PRIO_PROCESS, static_cast<id_t>(tid));
  if (errno != 0) return;
  const int boosted = nice - kNiceBoost < -20 ? -20 : nice - kNiceBoost;
  if (boosted < nice && setpriority(PRIO_PROCESS, static_cast<id_t>(tid), boosted) == 0) {
    saved_nice_ = nice;
    boosted_ = true;
  }
#endif
}

LatencyCritical::~LatencyCritical() {
#ifdef __linux__
  if (boosted_) {
    // back up: raising one's nice value needs no privilege
    setpriority(PRIO_PROCESS, static_cast<id_t>(syscall(SYS_gettid)), saved_nice_);
  }
  if (saved_policy_ < 0) return;
  sched_param p{};
  p.sched_priority = 0;
  pthread_setschedparam(pthread_self(), saved_policy_, &p);
#endif
}

ThreadSchedStat ReadThreadSchedStat() {
  ThreadSchedStat s;
#ifdef __linux__
  // CPU time from the thread's clock: schedstat's own figure for a running
  // thread lags by up to a scheduler tick. Its run-queue wait is exact (it is
  // added when the thread is picked to run, and this thread is running).
  timespec ts{};
  if (clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts) == 0) {
    s.cpu_ns = static_cast<uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<uint64_t>(ts.tv_nsec);
  }
  if (FILE* f = std::fopen("/proc/thread-self/schedstat", "r")) {
    unsigned long long cpu = 0, wait = 0;
    if (std::fscanf(f, "%llu %llu", &cpu, &wait) == 2) s.wait_ns = wait;
    std::fclose(f);
  }
#endif
  return s;
}

}  // namespace rhino
