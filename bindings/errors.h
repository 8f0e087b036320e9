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

// Registers the translator, and rhino._core.status_codes(): the list of
// rhino/status_codes.h as [(number, name, python_class)].
void BindErrors(pybind11::module_& m);

// The reverse of the translator, by the same table: the Status code of a
// Python exception instance, from the most derived class of the table in its
// type's MRO (a subclass of StaleEpochError is StaleEpoch). *mapped tells
// whether one was found; if not (a builtin exception, or RhinoError itself),
// the code is IOError, which is also how the protocol reports a code it does
// not know (docs/protocol.md §3). REQUIRES: the GIL.
Status::Code StatusCodeOfException(pybind11::handle exc, bool* mapped = nullptr);

}  // namespace rhino::py_bindings
