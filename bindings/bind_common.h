// Declarations shared between binding translation units.
#pragma once

#include <pybind11/pybind11.h>

#include <string>

#include "rhino/replica_store.h"

namespace rhino::py_bindings {

void BindRouting(pybind11::module_& m);
void BindState(pybind11::module_& m);
void BindStore(pybind11::module_& m);
void BindWorker(pybind11::module_& m);
RestoreOptions ParseRestoreOptions(const std::string& mode, const std::string& verify);

}  // namespace rhino::py_bindings
