// Declarations shared between binding translation units.
#pragma once

#include <pybind11/pybind11.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <iterator>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "errors.h"
#include "rhino/credential.h"
#include "rhino/replica_store.h"
#include "rhino/tls.h"

namespace rhino::py_bindings {

void BindRouting(pybind11::module_& m);
void BindState(pybind11::module_& m);
void BindStore(pybind11::module_& m);
void BindWorker(pybind11::module_& m);
void BindService(pybind11::module_& m);
void BindCoord(pybind11::module_& m);
RestoreOptions ParseRestoreOptions(const std::string& mode, const std::string& verify);
// The tls_cert / tls_key / tls_ca keyword arguments (all empty: plaintext).
inline TlsFiles TlsOf(const std::string& cert, const std::string& key, const std::string& ca) {
  return TlsFiles{cert, key, ca};
}

// What a client proves (docs/protocol.md §2, "Roles"), from the secret, role,
// scope and derived keyword arguments: `secret` is the cluster's root secret,
// from which the role's key is derived, or (derived=True) that key itself (a
// task's credential file). The admin from the root proves the root itself
// (the handshake's form without a role). A bad role or scope raises
// InvalidArgumentError.
inline Credential CredentialOf(const std::string& secret, const std::string& role, const std::string& scope,
                               bool derived) {
  PeerRole r = PeerRole::kAdmin;
  ThrowIfError(ParseRole(role, &r));
  ThrowIfError(CheckScope(r, scope));
  if (secret.empty()) ThrowIfError(Status::InvalidArgument("the secret (or the role's key) is empty"));
  if (derived) return Credential{r, scope, secret, false};
  // The admin from the root proves the root itself (the handshake without a role).
  return r == PeerRole::kAdmin ? Credential::Root(secret) : Credential::FromRoot(secret, r, scope);
}

// For long C++ calls made with the GIL released that report as they go and
// stop when asked (RestoreOptions::keep_going, ReplicaStore::VerifyObserver):
// called without the GIL, at most every `interval` (or at once when `force`)
// it takes the GIL back, runs Python's signal handlers, then the caller's
// report (a Python progress callback). If either raised (Ctrl-C, an exception
// from the callback), it keeps the exception and returns false; the binding
// calls RethrowIfRaised() with the GIL held, after the C++ call has unwound.
class SignalCheck {
 public:
  explicit SignalCheck(std::chrono::milliseconds interval = std::chrono::milliseconds(100))
      : interval_(interval), last_(std::chrono::steady_clock::now()) {}

  bool operator()() { return Check(false, [] {}); }

  template <typename Report>
  bool Check(bool force, Report&& report) {
    const auto now = std::chrono::steady_clock::now();
    if (!force && now - last_ < interval_) return true;
    last_ = now;
    pybind11::gil_scoped_acquire gil;
    if (PyErr_CheckSignals() != 0) {
      raised_.emplace();  // takes the pending Python exception
      return false;
    }
    try {
      report();
    } catch (pybind11::error_already_set& e) {
      raised_.emplace(std::move(e));
      return false;
    }
    return true;
  }

  void RethrowIfRaised() {
    if (raised_) {
      pybind11::error_already_set e = std::move(*raised_);
      raised_.reset();
      throw e;
    }
  }

 private:
  std::chrono::milliseconds interval_;
  std::chrono::steady_clock::time_point last_;
  std::optional<pybind11::error_already_set> raised_;
};

// A handle's guard against close() during a call (issue 18, item 5b).
//
// Every call on a closeable handle holds a CloseGate::Pass while it uses the
// owned C++ object, including while it has released the GIL. Close() refuses
// new passes at once (Enter throws the "closed" error), waits until the passes
// already taken are given back, then destroys the object, and only then
// returns: after close() the object is gone (a RocksDB directory's LOCK is
// free) and nothing can be using it.
//
// GIL rules, which make it deadlock-free:
//  - Enter never blocks for long (mu_ is only ever held for a few
//    instructions, never while waiting), so it may be called with the GIL held.
//  - Close must be called WITHOUT the GIL: a call holding a pass may need the
//    GIL to finish (it converts its results, or runs a Python callback), and
//    a pass may be held across taking the GIL back.
//  - A pass is not a lock: a call holding one may call back into Python,
//    which may make more calls on the same handle (they take passes too).
//    Only close() from inside such a callback, on the thread that holds a
//    pass of the same gate, would wait for itself: Close refuses it.
class CloseGate {
 public:
  class Pass {
   public:
    Pass(Pass&& o) noexcept : gate_(std::exchange(o.gate_, nullptr)) {}
    Pass(const Pass&) = delete;
    Pass& operator=(const Pass&) = delete;
    Pass& operator=(Pass&&) = delete;
    ~Pass() {
      if (gate_ != nullptr) gate_->Leave();
    }

   private:
    friend class CloseGate;
    explicit Pass(CloseGate* gate) : gate_(gate) {}
    CloseGate* gate_;
  };

  // `what` names the handle in errors ("StateBackend").
  explicit CloseGate(std::string what) : what_(std::move(what)) {}
  CloseGate(const CloseGate&) = delete;
  CloseGate& operator=(const CloseGate&) = delete;

  // A pass for one call; InvalidArgument "<what> is closed" once a close has
  // begun. With or without the GIL.
  Pass Enter() {
    {
      std::lock_guard<std::mutex> l(mu_);
      if (state_ != State::kOpen) throw StatusError{Status::InvalidArgument(what_ + " is closed")};
      ++active_;
    }
    HeldByThisThread().push_back(this);
    return Pass(this);
  }

  // True until a close begins.
  bool open() {
    std::lock_guard<std::mutex> l(mu_);
    return state_ == State::kOpen;
  }

  // Refuses new calls, waits for the calls under way, then runs destroy()
  // (once; a concurrent or later Close waits for it, then returns). Call it
  // without the GIL. InvalidArgument if this thread is inside a call on the
  // same handle (that would wait for itself forever).
  template <typename Destroy>
  void Close(Destroy&& destroy) {
    const auto& held = HeldByThisThread();
    if (std::find(held.begin(), held.end(), this) != held.end())
      throw StatusError{Status::InvalidArgument(what_ + ".close() called from inside a call on the same " + what_ +
                                                " (it would wait for itself)")};
    std::unique_lock<std::mutex> l(mu_);
    if (state_ != State::kOpen) {
      cv_.wait(l, [this] { return state_ == State::kClosed; });
      return;
    }
    state_ = State::kClosing;
    cv_.wait(l, [this] { return active_ == 0; });
    l.unlock();
    // No pass is out and none can be taken: nothing else uses the object.
    // Destroyed outside mu_, so that calls refused meanwhile never wait.
    destroy();
    l.lock();
    state_ = State::kClosed;
    cv_.notify_all();
  }

 private:
  enum class State { kOpen, kClosing, kClosed };

  void Leave() {
    auto& held = HeldByThisThread();
    for (auto it = held.rbegin(); it != held.rend(); ++it) {
      if (*it == this) {
        held.erase(std::next(it).base());
        break;
      }
    }
    std::lock_guard<std::mutex> l(mu_);
    if (--active_ == 0 && state_ == State::kClosing) cv_.notify_all();
  }

  // The gates whose passes this thread holds (usually zero or one).
  static std::vector<const CloseGate*>& HeldByThisThread() {
    thread_local std::vector<const CloseGate*> held;
    return held;
  }

  const std::string what_;
  std::mutex mu_;
  std::condition_variable cv_;
  State state_ = State::kOpen;  // GUARDED_BY(mu_)
  uint64_t active_ = 0;         // GUARDED_BY(mu_): passes out
};

// RestoreOptions::keep_going for the restore bindings: Ctrl-C stops the restore,
// and `progress` (None, or callable(stage, files_done, files_total, bytes_done,
// bytes_total)) hears after the first file of each stage, at most every 0.1 s,
// and at each stage's end. Raises TypeError for a non-callable `progress`.
std::function<bool(const RestoreProgress&)> RestoreKeepGoing(SignalCheck& signals,
                                                             const pybind11::object& progress);

}  // namespace rhino::py_bindings
