// Clang's thread-safety analysis (-Wthread-safety): the annotations, and the
// mutex, lock and condition-variable types the analysis can follow.
//
// Under clang the macros below are attributes, and `make thread-safety`
// compiles the core with -Wthread-safety -Werror=thread-safety: a member
// declared GUARDED_BY(mu_) read or written without mu_ held, a REQUIRES(mu_)
// function called without it, a lock still held on some path out of a
// function, all fail that check. Under other compilers they expand to nothing.
//
// libstdc++'s std::mutex, std::lock_guard and std::unique_lock carry no
// annotations, so the analysis cannot see a lock taken with them: guarded
// members use Mutex (or SharedMutex) with MutexLock (or ReaderMutexLock and
// WriterMutexLock), and wait on a CondVar.
//
// The analysis does not look into lambdas as running under the caller's lock:
// a predicate that a CondVar calls with the mutex held, if it reads guarded
// members, starts with mu_.AssertHeld(). Constructors and destructors are not
// checked (nobody else can see the object yet, or any more).
//
// A public header (rhino/state_backend.h annotates its members), so it
// includes nothing of the rest of src/cpp (docs/design.md, "Include layering").
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <shared_mutex>

#if defined(__clang__)
#define RHINO_THREAD_ANNOTATION_(x) __attribute__((x))
#else
#define RHINO_THREAD_ANNOTATION_(x)
#endif

// On a class: its objects are capabilities (mutexes) named `x` in messages.
#define CAPABILITY(x) RHINO_THREAD_ANNOTATION_(capability(x))
// On a class: an RAII lock, holding the capabilities its constructor acquires.
#define SCOPED_CAPABILITY RHINO_THREAD_ANNOTATION_(scoped_lockable)
// On a data member: read only with `x` held (shared or exclusive), written
// only with `x` held exclusively.
#define GUARDED_BY(x) RHINO_THREAD_ANNOTATION_(guarded_by(x))
// On a pointer member: what it points to is guarded by `x` (the pointer is not).
#define PT_GUARDED_BY(x) RHINO_THREAD_ANNOTATION_(pt_guarded_by(x))
// On a mutex member: the lock order (checked with -Wthread-safety-beta only).
#define ACQUIRED_BEFORE(...) RHINO_THREAD_ANNOTATION_(acquired_before(__VA_ARGS__))
#define ACQUIRED_AFTER(...) RHINO_THREAD_ANNOTATION_(acquired_after(__VA_ARGS__))
// On a function: its callers hold these (exclusively / at least shared).
#define REQUIRES(...) RHINO_THREAD_ANNOTATION_(requires_capability(__VA_ARGS__))
#define REQUIRES_SHARED(...) RHINO_THREAD_ANNOTATION_(requires_shared_capability(__VA_ARGS__))
// On a function: it returns holding these (no argument: `this`).
#define ACQUIRE(...) RHINO_THREAD_ANNOTATION_(acquire_capability(__VA_ARGS__))
#define ACQUIRE_SHARED(...) RHINO_THREAD_ANNOTATION_(acquire_shared_capability(__VA_ARGS__))
// On a function: it releases these (no argument: `this`).
#define RELEASE(...) RHINO_THREAD_ANNOTATION_(release_capability(__VA_ARGS__))
#define RELEASE_SHARED(...) RHINO_THREAD_ANNOTATION_(release_shared_capability(__VA_ARGS__))
// On a function: it acquires the capability if it returns `result` (the first argument).
#define TRY_ACQUIRE(...) RHINO_THREAD_ANNOTATION_(try_acquire_capability(__VA_ARGS__))
// On a function: its callers must not hold these (it takes them itself).
#define EXCLUDES(...) RHINO_THREAD_ANNOTATION_(locks_excluded(__VA_ARGS__))
// On a function: the capability is held once it returns (the analysis takes its word).
#define ASSERT_CAPABILITY(x) RHINO_THREAD_ANNOTATION_(assert_capability(x))
// On a function: it returns (a reference to) the capability `x`.
#define RETURN_CAPABILITY(x) RHINO_THREAD_ANNOTATION_(lock_returned(x))
// On a function: not analysed. Every use says why, beside it.
#define NO_THREAD_SAFETY_ANALYSIS RHINO_THREAD_ANNOTATION_(no_thread_safety_analysis)

namespace rhino {

class CondVar;

// A std::mutex the analysis can follow.
class CAPABILITY("mutex") Mutex {
 public:
  Mutex() = default;
  Mutex(const Mutex&) = delete;
  Mutex& operator=(const Mutex&) = delete;

  void Lock() ACQUIRE() { mu_.lock(); }
  void Unlock() RELEASE() { mu_.unlock(); }
  bool TryLock() TRY_ACQUIRE(true) { return mu_.try_lock(); }
  // Tells the analysis that the calling thread holds this mutex, where it
  // cannot see it (a CondVar predicate). Not checked at run time.
  void AssertHeld() const ASSERT_CAPABILITY(this) {}

 private:
  friend class CondVar;
  std::mutex mu_;
};

// Holds a Mutex for its scope: `MutexLock l(&mu_);`. Unlock() and Lock()
// release and take it again within the scope (std::unique_lock's unlock and
// lock); the destructor unlocks only if it is held.
class SCOPED_CAPABILITY MutexLock {
 public:
  explicit MutexLock(Mutex* mu) ACQUIRE(mu) : mu_(mu) { mu_->Lock(); }
  ~MutexLock() RELEASE() {
    if (locked_) mu_->Unlock();
  }
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

  void Unlock() RELEASE() {
    mu_->Unlock();
    locked_ = false;
  }
  void Lock() ACQUIRE() {
    mu_->Lock();
    locked_ = true;
  }

 private:
  Mutex* const mu_;
  bool locked_ = true;
};

// A std::condition_variable waited on with a Mutex held: each wait releases
// it, blocks, and holds it again when it returns (spurious wake-ups included:
// wait in a loop, or with a predicate).
class CondVar {
 public:
  CondVar() = default;
  CondVar(const CondVar&) = delete;
  CondVar& operator=(const CondVar&) = delete;

  void Wait(Mutex* mu) REQUIRES(mu) {
    std::unique_lock<std::mutex> l(mu->mu_, std::adopt_lock);
    cv_.wait(l);
    l.release();  // still held: the caller's MutexLock unlocks it
  }
  // False if it returned because `deadline` passed.
  template <typename Clock, typename Duration>
  bool WaitUntil(Mutex* mu, const std::chrono::time_point<Clock, Duration>& deadline) REQUIRES(mu) {
    std::unique_lock<std::mutex> l(mu->mu_, std::adopt_lock);
    const bool timed_out = cv_.wait_until(l, deadline) == std::cv_status::timeout;
    l.release();
    return !timed_out;
  }

  // Until pred() (called with `mu` held) is true.
  template <typename Pred>
  void Wait(Mutex* mu, Pred pred) REQUIRES(mu) {
    while (!pred()) Wait(mu);
  }
  // pred() once it is true or `deadline` has passed.
  template <typename Clock, typename Duration, typename Pred>
  bool WaitUntil(Mutex* mu, const std::chrono::time_point<Clock, Duration>& deadline, Pred pred) REQUIRES(mu) {
    while (!pred()) {
      if (!WaitUntil(mu, deadline)) return pred();
    }
    return true;
  }
  // pred() once it is true or `timeout` has passed.
  template <typename Rep, typename Period, typename Pred>
  bool WaitFor(Mutex* mu, const std::chrono::duration<Rep, Period>& timeout, Pred pred) REQUIRES(mu) {
    return WaitUntil(mu, std::chrono::steady_clock::now() + timeout, pred);
  }
  // One timed wait (no predicate): false if `timeout` passed.
  template <typename Rep, typename Period>
  bool WaitFor(Mutex* mu, const std::chrono::duration<Rep, Period>& timeout) REQUIRES(mu) {
    return WaitUntil(mu, std::chrono::steady_clock::now() + timeout);
  }

  void Signal() { cv_.notify_one(); }
  void SignalAll() { cv_.notify_all(); }

 private:
  std::condition_variable cv_;
};

// A std::shared_mutex the analysis can follow: many readers or one writer.
class CAPABILITY("shared_mutex") SharedMutex {
 public:
  SharedMutex() = default;
  SharedMutex(const SharedMutex&) = delete;
  SharedMutex& operator=(const SharedMutex&) = delete;

  void Lock() ACQUIRE() { mu_.lock(); }
  void Unlock() RELEASE() { mu_.unlock(); }
  void LockShared() ACQUIRE_SHARED() { mu_.lock_shared(); }
  void UnlockShared() RELEASE_SHARED() { mu_.unlock_shared(); }

 private:
  std::shared_mutex mu_;
};

// Holds a SharedMutex shared for its scope (std::shared_lock).
class SCOPED_CAPABILITY ReaderMutexLock {
 public:
  explicit ReaderMutexLock(SharedMutex* mu) ACQUIRE_SHARED(mu) : mu_(mu) { mu_->LockShared(); }
  ~ReaderMutexLock() RELEASE() { mu_->UnlockShared(); }
  ReaderMutexLock(const ReaderMutexLock&) = delete;
  ReaderMutexLock& operator=(const ReaderMutexLock&) = delete;

 private:
  SharedMutex* const mu_;
};

// Holds a SharedMutex exclusively for its scope (std::unique_lock).
class SCOPED_CAPABILITY WriterMutexLock {
 public:
  explicit WriterMutexLock(SharedMutex* mu) ACQUIRE(mu) : mu_(mu) { mu_->Lock(); }
  ~WriterMutexLock() RELEASE() { mu_->Unlock(); }
  WriterMutexLock(const WriterMutexLock&) = delete;
  WriterMutexLock& operator=(const WriterMutexLock&) = delete;

 private:
  SharedMutex* const mu_;
};

}  // namespace rhino
