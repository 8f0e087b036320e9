// Conversion of Python key and value collections into byte views, done once
// per batch with the GIL held; the C++ work that follows runs without it.
//
// Keys: a 1-D NumPy int64 array (each key its 8 little-endian bytes, no
// per-key Python work), a pyarrow int64 or binary/string array
// (arrow_buffers.h), or a sequence whose items are bytes-like, str (UTF-8)
// or int (int64). Anything else raises rhino.KeyTypeError.
// Values: a sequence of bytes-like objects, a C-contiguous NumPy array whose
// rows (axis 0) are the fixed-width values, or a pyarrow binary/string array
// (arrow_buffers.h; viewed in place, no copy).
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <string>
#include <string_view>
#include <vector>

namespace rhino::py_bindings {

class ByteViews {
 public:
  const std::vector<std::string_view>& views() const { return views_; }
  size_t size() const { return views_.size(); }

  void LoadKeys(pybind11::handle keys);
  void LoadValues(pybind11::handle values);

 private:
  void FromSequence(pybind11::handle seq, bool keys);
  std::string storage_;  // owned copies; reserved up front so views stay valid
  pybind11::object keepalive_;  // the NumPy array our views point into
  std::vector<std::string_view> views_;
};

// One key as bytes (the single-key API).
std::string KeyBytes(pybind11::handle key);

// A 1-D int64 NumPy array, or raises rhino.KeyTypeError. `what` names the argument.
pybind11::array_t<int64_t> RequireInt64Array(pybind11::handle obj, const char* what);

}  // namespace rhino::py_bindings
