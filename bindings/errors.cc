#include "errors.h"

namespace py = pybind11;

namespace rhino::py_bindings {
namespace {

// Status code -> class in rhino/errors.py. Every class also inherits the
// builtin a Python user would expect (see rhino/errors.py).
struct Mapping {
  Status::Code code;
  const char* python_class;
};
constexpr Mapping kTable[] = {
    {Status::Code::kNotFound, "NotFoundError"},
    {Status::Code::kCorruption, "CorruptionError"},
    {Status::Code::kInvalidArgument, "InvalidArgumentError"},
    {Status::Code::kIOError, "RhinoIOError"},
    {Status::Code::kAlreadyExists, "AlreadyExistsError"},
    {Status::Code::kUnknownVnode, "UnknownVnodeError"},
    {Status::Code::kKeyType, "KeyTypeError"},
    {Status::Code::kPathOutsideStore, "PathOutsideStoreError"},
    {Status::Code::kNoSpace, "NoSpaceError"},
    {Status::Code::kBusy, "BusyError"},
    {Status::Code::kTimeout, "RhinoTimeoutError"},
    {Status::Code::kPeerDead, "PeerDeadError"},
    {Status::Code::kAborted, "AbortedError"},
    {Status::Code::kStaleChainVersion, "StaleChainVersionError"},
    {Status::Code::kAuthFailed, "AuthFailedError"},
    {Status::Code::kUnknownInstance, "UnknownInstanceError"},
    {Status::Code::kSessionBusy, "SessionBusyError"},
    {Status::Code::kStaleEpoch, "StaleEpochError"},
    {Status::Code::kTlsFailed, "TLSError"},
};

}  // namespace

Status::Code StatusCodeOfException(py::handle exc, bool* mapped) {
  if (mapped != nullptr) *mapped = false;
  py::module_ errors = py::module_::import("rhino.errors");
  // The MRO lists the exception's own class first, then its bases from the
  // most derived on: the first one in the table is the closest mapping.
  py::tuple mro = py::type::handle_of(exc).attr("__mro__");
  for (py::handle cls : mro) {
    for (const auto& row : kTable) {
      if (cls.is(errors.attr(row.python_class))) {
        if (mapped != nullptr) *mapped = true;
        return row.code;
      }
    }
  }
  return Status::Code::kIOError;
}

void RegisterErrorTranslator(py::module_& m) {
  (void)m;
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const StatusError& e) {
      const char* name = "RhinoError";
      for (const auto& row : kTable)
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
