// The one place where C++ Status values become Python exceptions.
#pragma once

#include <pybind11/pybind11.h>

#include "rhino/status.h"

namespace rhino::py_bindings {

// Thrown by ThrowIfError; translated by the registered translator into the
// rhino.errors class for the Status code.
struct StatusError {
  Status status;
};

inline void ThrowIfError(const Status& s) {
  if (!s.ok()) throw StatusError{s};
}

void RegisterErrorTranslator(pybind11::module_& m);

}  // namespace rhino::py_bindings
