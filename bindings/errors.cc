#include "errors.h"

namespace py = pybind11;

namespace rhino::py_bindings {

// The table both ways is kStatusCodes (rhino/status.h): each row of
// status_codes.h names its class in rhino/errors.py.

Status::Code StatusCodeOfException(py::handle exc, bool* mapped) {
  if (mapped != nullptr) *mapped = false;
  py::module_ errors = py::module_::import("rhino.errors");
  // The MRO lists the exception's own class first, then its bases from the
  // most derived on: the first one in the table is the closest mapping.
  py::tuple mro = py::type::handle_of(exc).attr("__mro__");
  for (py::handle cls : mro) {
    for (const StatusCodeInfo& row : kStatusCodes) {
      if (cls.is(errors.attr(row.python_class))) {
        if (mapped != nullptr) *mapped = true;
        return row.code;
      }
    }
  }
  return Status::Code::kIOError;
}

void BindErrors(py::module_& m) {
  // The list of status_codes.h, for tests/test_status_codes.py to hold
  // rhino/errors.py and docs/protocol.md against.
  m.def(
      "status_codes",
      [] {
        py::list codes;
        for (const StatusCodeInfo& row : kStatusCodes)
          codes.append(py::make_tuple(static_cast<int>(row.code), row.name, row.python_class));
        return codes;
      },
      "Every status code but OK, as (number, name, python_class): the list of rhino/status_codes.h.");
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const StatusError& e) {
      const char* name = "RhinoError";
      for (const StatusCodeInfo& row : kStatusCodes)
        if (row.code == e.status.code()) name = row.python_class;
      py::object cls = py::module_::import("rhino.errors").attr(name);
      // A message may quote bytes a peer sent (an operator id, a file name),
      // which need not be UTF-8: undecodable bytes are shown as \xNN rather
      // than turning the error into a UnicodeDecodeError.
      const std::string& msg = e.status.message();
      py::object text = py::reinterpret_steal<py::object>(
          PyUnicode_DecodeUTF8(msg.data(), static_cast<Py_ssize_t>(msg.size()), "backslashreplace"));
      if (!text) {
        PyErr_Clear();
        text = py::str("(undecodable error message)");
      }
      PyErr_SetObject(cls.ptr(), text.ptr());
    }
  });
}

}  // namespace rhino::py_bindings
