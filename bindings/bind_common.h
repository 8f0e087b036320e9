// Declarations shared between binding translation units.
#pragma once

#include <pybind11/pybind11.h>

#include <chrono>
#include <optional>
#include <string>
#include <utility>

#include "rhino/replica_store.h"

namespace rhino::py_bindings {

void BindRouting(pybind11::module_& m);
void BindState(pybind11::module_& m);
void BindStore(pybind11::module_& m);
void BindWorker(pybind11::module_& m);
RestoreOptions ParseRestoreOptions(const std::string& mode, const std::string& verify);

// For long C++ calls made with the GIL released that stop between steps when
// asked (RestoreOptions::keep_going): called without the GIL, at most every
// `interval` it takes the GIL back and runs Python's signal handlers. If one
// raised (Ctrl-C), it keeps the exception and returns false; the binding then
// calls RethrowIfRaised() with the GIL held, after the C++ call has unwound.
class SignalCheck {
 public:
  explicit SignalCheck(std::chrono::milliseconds interval = std::chrono::milliseconds(100))
      : interval_(interval), last_(std::chrono::steady_clock::now()) {}

  bool operator()() {
    const auto now = std::chrono::steady_clock::now();
    if (now - last_ < interval_) return true;
    last_ = now;
    pybind11::gil_scoped_acquire gil;
    if (PyErr_CheckSignals() == 0) return true;
    raised_.emplace();  // takes the pending Python exception
    return false;
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

}  // namespace rhino::py_bindings
