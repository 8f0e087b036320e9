#include "replication/file_syncer.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>
#include <utility>

#include "util/crash_point.h"

namespace rhino {

struct SyncBatch::State {
  mutable std::mutex mu;
  std::condition_variable done_cv;
  size_t pending = 0;
  bool cancelled = false;
  Status first_error;
};

namespace {

struct Job {
  std::shared_ptr<SyncBatch::State> batch;
  int fd;
  std::string what;
};

// One thread for the whole process: fsyncs to one disk gain little from
// running side by side, and the thread costs nothing while idle. It is never
// joined (the process may exit with it waiting), so it is never destroyed.
// A forked child has none of its parent's threads: it starts its own syncer
// (and leaves the parent's copy, whose mutex may be held, untouched).
class Syncer {
 public:
  static Syncer& Shared() {
    static std::mutex mu;
    static Syncer* s = nullptr;
    static pid_t owner = 0;
    std::lock_guard<std::mutex> l(mu);
    const pid_t me = ::getpid();
    if (s == nullptr || owner != me) {
      s = new Syncer();
      owner = me;
    }
    return *s;
  }

  void Push(Job job) {
    {
      std::lock_guard<std::mutex> l(mu_);
      queue_.push_back(std::move(job));
    }
    cv_.notify_one();
  }

 private:
  Syncer() { std::thread([this]() { Run(); }).detach(); }

  void Run() {
    for (;;) {
      Job job;
      {
        std::unique_lock<std::mutex> l(mu_);
        cv_.wait(l, [&]() { return !queue_.empty(); });
        job = std::move(queue_.front());
        queue_.pop_front();
      }
      bool cancelled;
      {
        std::lock_guard<std::mutex> l(job.batch->mu);
        cancelled = job.batch->cancelled;
      }
      Status s;
      if (!cancelled) {
        CrashPoint("replica.before_file_fsync");
        if (FaultPoint("replica.file_fsync_fails")) {
          s = Status::FromErrno(EIO, "fsync " + job.what + " (injected by RHINO_FAULT_POINT)");
        } else if (::fsync(job.fd) != 0) {
          s = Status::FromErrno(errno, "fsync " + job.what);
        } else {
          // Drop-behind: the file is on disk and a replica's files are cold
          // until a failover, so free their pages now rather than letting them
          // evict the primaries' hot pages (HDFS's drop.cache.behind.writes).
          ::posix_fadvise(job.fd, 0, 0, POSIX_FADV_DONTNEED);
        }
      }
      ::close(job.fd);
      {
        std::lock_guard<std::mutex> l(job.batch->mu);
        if (!s.ok() && job.batch->first_error.ok()) job.batch->first_error = s;
        --job.batch->pending;
      }
      job.batch->done_cv.notify_all();
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Job> queue_;
};

}  // namespace

SyncBatch::SyncBatch() : state_(std::make_shared<State>()) {}

SyncBatch::~SyncBatch() {
  std::lock_guard<std::mutex> l(state_->mu);
  state_->cancelled = true;
}

void SyncBatch::Add(int fd, std::string what) {
  {
    std::lock_guard<std::mutex> l(state_->mu);
    ++state_->pending;
  }
  Syncer::Shared().Push(Job{state_, fd, std::move(what)});
}

Status SyncBatch::Wait() {
  std::unique_lock<std::mutex> l(state_->mu);
  state_->done_cv.wait(l, [&]() { return state_->pending == 0; });
  return state_->first_error;
}

size_t SyncBatch::pending() const {
  std::lock_guard<std::mutex> l(state_->mu);
  return state_->pending;
}

}  // namespace rhino
