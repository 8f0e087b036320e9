// Declarations shared between binding translation units.
#pragma once

#include <pybind11/pybind11.h>

#include <chrono>
#include <functional>
#include <optional>
#include <string>
#include <utility>

#include "rhino/replica_store.h"

namespace rhino::py_bindings {

void BindRouting(pybind11::module_& m);
void BindState(pybind11::module_& m);
void BindStore(pybind11::module_& m);
void BindWorker(pybind11::module_& m);
void BindService(pybind11::module_& m);
RestoreOptions ParseRestoreOptions(const std::string& mode, const std::string& verify);

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

// RestoreOptions::keep_going for the restore bindings: Ctrl-C stops the restore,
// and `progress` (None, or callable(stage, files_done, files_total, bytes_done,
// bytes_total)) hears after the first file of each stage, at most every 0.1 s,
// and at each stage's end. Raises TypeError for a non-callable `progress`.
std::function<bool(const RestoreProgress&)> RestoreKeepGoing(SignalCheck& signals,
                                                             const pybind11::object& progress);

}  // namespace rhino::py_bindings
