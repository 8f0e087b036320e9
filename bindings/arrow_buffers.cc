#include "arrow_buffers.h"

#include <pybind11/numpy.h>

#include <cstdint>
#include <cstring>
#include <limits>
#include <string>

#include "errors.h"
#include "rhino/partitioner.h"

namespace py = pybind11;

namespace rhino::py_bindings {
namespace {

[[noreturn]] void Invalid(const std::string& msg) { throw StatusError{Status::InvalidArgument(msg)}; }

py::module_ ImportPyArrow() {
  try {
    return py::module_::import("pyarrow");
  } catch (py::error_already_set& e) {
    if (!e.matches(PyExc_ImportError)) throw;
    Invalid("Arrow values need pyarrow, which is not installed (pip install 'rhino-state[arrow]')");
  }
}

// A pyarrow.Buffer's address and size (CPU memory only).
const char* BufferData(py::handle buf, size_t* size) {
  if (buf.is_none()) {
    *size = 0;
    return nullptr;
  }
  if (py::hasattr(buf, "is_cpu") && !buf.attr("is_cpu").cast<bool>()) Invalid("Arrow buffers must be in CPU memory");
  *size = buf.attr("size").cast<size_t>();
  return reinterpret_cast<const char*>(buf.attr("address").cast<uintptr_t>());
}

template <typename Offset>
void ViewsFromOffsets(const char* offsets_buf, size_t offsets_size, const char* data, size_t data_size, int64_t offset,
                      size_t n, std::vector<std::string_view>* views) {
  if (n == 0) return;
  const size_t needed = (static_cast<size_t>(offset) + n + 1) * sizeof(Offset);
  if (offsets_buf == nullptr || offsets_size < needed) Invalid("Arrow array's offsets buffer is too short");
  const Offset* o = reinterpret_cast<const Offset*>(offsets_buf) + offset;
  views->reserve(n);
  for (size_t i = 0; i < n; ++i) {
    // A malformed array (offsets going back, or past the data) is refused,
    // never read out of bounds.
    if (o[i] < 0 || o[i + 1] < o[i] || static_cast<uint64_t>(o[i + 1]) > data_size) {
      Invalid("Arrow array has bad offsets at value " + std::to_string(i));
    }
    views->emplace_back(data + o[i], static_cast<size_t>(o[i + 1] - o[i]));
  }
}

template <typename Offset>
py::object BuildArray(const MultiGetResult& r, size_t total, size_t nulls, py::module_& pa, const char* type_name) {
  const size_t n = r.size();
  py::array_t<Offset> offsets(static_cast<py::ssize_t>(n + 1));
  py::array_t<uint8_t> data(static_cast<py::ssize_t>(total));
  py::object validity = py::none();
  uint8_t* bits = nullptr;
  if (nulls > 0) {
    py::array_t<uint8_t> bitmap(static_cast<py::ssize_t>((n + 7) / 8));
    bits = bitmap.mutable_data();
    std::memset(bits, 0, (n + 7) / 8);
    validity = pa.attr("py_buffer")(bitmap);
  }
  Offset* o = offsets.mutable_data();
  char* d = reinterpret_cast<char*>(data.mutable_data());
  {
    py::gil_scoped_release release;
    // In lookup order (see MultiGetResult::value_at): first each value's
    // length at its key's slot, then the offsets, then the copies.
    o[0] = 0;
    for (size_t j = 0; j < n; ++j) {
      const size_t i = r.key_index(j);
      const bool hit = r.found_at(j);
      o[i + 1] = hit ? static_cast<Offset>(r.value_at(j).size()) : 0;
      if (hit && bits != nullptr) bits[i / 8] |= static_cast<uint8_t>(1u << (i % 8));  // Arrow bitmaps are LSB first
    }
    for (size_t i = 0; i < n; ++i) o[i + 1] += o[i];
    for (size_t j = 0; j < n; ++j) {
      if (!r.found_at(j)) continue;
      std::string_view v = r.value_at(j);
      if (!v.empty()) std::memcpy(d + o[r.key_index(j)], v.data(), v.size());  // an empty view may be nullptr
    }
  }
  py::list buffers;
  buffers.append(validity);
  buffers.append(pa.attr("py_buffer")(offsets));
  buffers.append(pa.attr("py_buffer")(data));
  return pa.attr("Array").attr("from_buffers")(pa.attr(type_name)(), n, buffers, py::arg("null_count") = nulls);
}

// The same from values already in input order (a session's answer frames).
template <typename Offset>
py::object BuildArrayFromViews(const std::vector<uint8_t>& found, const std::vector<std::string_view>& values,
                               size_t total, size_t nulls, py::module_& pa, const char* type_name) {
  const size_t n = found.size();
  py::array_t<Offset> offsets(static_cast<py::ssize_t>(n + 1));
  py::array_t<uint8_t> data(static_cast<py::ssize_t>(total));
  py::object validity = py::none();
  uint8_t* bits = nullptr;
  if (nulls > 0) {
    py::array_t<uint8_t> bitmap(static_cast<py::ssize_t>((n + 7) / 8));
    bits = bitmap.mutable_data();
    std::memset(bits, 0, (n + 7) / 8);
    validity = pa.attr("py_buffer")(bitmap);
  }
  Offset* o = offsets.mutable_data();
  char* d = reinterpret_cast<char*>(data.mutable_data());
  {
    py::gil_scoped_release release;
    o[0] = 0;
    for (size_t i = 0; i < n; ++i) {
      const size_t len = found[i] ? values[i].size() : 0;
      if (found[i] && bits != nullptr) bits[i / 8] |= static_cast<uint8_t>(1u << (i % 8));  // LSB first
      // An absent or empty value may be a view of nullptr: memcpy's arguments must not be
      // null even for 0 bytes (UBSan, make sanitize; docs/testing.md).
      if (len > 0) std::memcpy(d + o[i], values[i].data(), len);
      o[i + 1] = o[i] + static_cast<Offset>(len);
    }
  }
  py::list buffers;
  buffers.append(validity);
  buffers.append(pa.attr("py_buffer")(offsets));
  buffers.append(pa.attr("py_buffer")(data));
  return pa.attr("Array").attr("from_buffers")(pa.attr(type_name)(), n, buffers, py::arg("null_count") = nulls);
}

}  // namespace

bool IsArrowArray(py::handle obj) {
  // pyarrow cannot have made `obj` unless it is imported already.
  PyObject* mod = PyImport_GetModule(py::str("pyarrow").ptr());
  if (mod == nullptr) {
    PyErr_Clear();
    return false;
  }
  py::object pa = py::reinterpret_steal<py::object>(mod);
  if (pa.is_none() || !py::hasattr(pa, "Array")) return false;  // blocked (sys.modules entry None) or partial
  return py::isinstance(obj, pa.attr("Array"));
}

namespace {

// Views of a binary-like array's values. Bad input raises InvalidArgument
// for values and KeyType for keys.
void BinaryViews(py::module_& pa, py::handle array, bool keys, std::vector<std::string_view>* views) {
  auto fail = [&](const std::string& msg) {
    throw StatusError{keys ? Status::KeyType(msg) : Status::InvalidArgument(msg)};
  };
  py::object type = array.attr("type");
  py::object types = pa.attr("types");
  bool large;
  if (types.attr("is_binary")(type).cast<bool>() || types.attr("is_string")(type).cast<bool>()) {
    large = false;
  } else if (types.attr("is_large_binary")(type).cast<bool>() || types.attr("is_large_string")(type).cast<bool>()) {
    large = true;
  } else {
    fail(std::string(keys ? "keys as an Arrow array must be int64, binary, large_binary, string or large_string"
                          : "values as an Arrow array must be binary, large_binary, string or large_string") +
         ", got " + std::string(py::str(type)));
  }
  const auto null_count = array.attr("null_count").cast<int64_t>();
  if (null_count != 0) {
    fail(keys ? "Arrow keys have " + std::to_string(null_count) + " nulls; every key must be set"
              : "Arrow values have " + std::to_string(null_count) +
                    " nulls; a put needs a value for every key (delete keys with delete_batch)");
  }
  const auto n = static_cast<size_t>(py::len(array));
  const auto offset = array.attr("offset").cast<int64_t>();
  py::list bufs = array.attr("buffers")();  // [validity, offsets, data]
  if (py::len(bufs) < 3) Invalid("Arrow array has " + std::to_string(py::len(bufs)) + " buffers, expected 3");
  size_t offsets_size = 0, data_size = 0;
  const char* offsets_buf = BufferData(bufs[1], &offsets_size);
  const char* data = BufferData(bufs[2], &data_size);
  views->clear();
  if (large) {
    ViewsFromOffsets<int64_t>(offsets_buf, offsets_size, data, data_size, offset, n, views);
  } else {
    ViewsFromOffsets<int32_t>(offsets_buf, offsets_size, data, data_size, offset, n, views);
  }
}

}  // namespace

void ArrowValueViews(py::handle array, std::vector<std::string_view>* views, py::object* keepalive) {
  py::module_ pa = ImportPyArrow();
  BinaryViews(pa, array, /*keys=*/false, views);
  *keepalive = py::reinterpret_borrow<py::object>(array);
}

void ArrowKeyViews(py::handle array, std::string* storage, std::vector<std::string_view>* views,
                   py::object* keepalive) {
  py::module_ pa = ImportPyArrow();
  py::object type = array.attr("type");
  if (!pa.attr("types").attr("is_int64")(type).cast<bool>()) {
    BinaryViews(pa, array, /*keys=*/true, views);
    *keepalive = py::reinterpret_borrow<py::object>(array);
    return;
  }
  const auto null_count = array.attr("null_count").cast<int64_t>();
  if (null_count != 0) {
    throw StatusError{Status::KeyType("Arrow keys have " + std::to_string(null_count) + " nulls; every key must be set")};
  }
  const auto n = static_cast<size_t>(py::len(array));
  const auto offset = array.attr("offset").cast<int64_t>();
  py::list bufs = array.attr("buffers")();  // [validity, values]
  size_t size = 0;
  const char* values = py::len(bufs) >= 2 ? BufferData(bufs[1], &size) : nullptr;
  if (n > 0 && (values == nullptr || size < (static_cast<size_t>(offset) + n) * sizeof(int64_t))) {
    Invalid("Arrow int64 array's values buffer is too short");
  }
  // Encoded like a NumPy int64 key: its 8 little-endian bytes.
  storage->resize(8 * n);
  views->clear();
  views->reserve(n);
  for (size_t i = 0; i < n; ++i) {
    int64_t k;
    std::memcpy(&k, values + 8 * (static_cast<size_t>(offset) + i), sizeof(k));
    EncodeInt64Key(k, &(*storage)[8 * i]);
  }
  for (size_t i = 0; i < n; ++i) views->emplace_back(storage->data() + 8 * i, 8);
}

py::object MultiGetToArrow(const MultiGetResult& r, std::optional<bool> large) {
  py::module_ pa = ImportPyArrow();
  const size_t n = r.size();
  size_t total = 0, nulls = 0;
  for (size_t j = 0; j < n; ++j) {
    if (r.found_at(j)) total += r.value_at(j).size();
    else ++nulls;
  }
  const auto max32 = static_cast<size_t>(std::numeric_limits<int32_t>::max());
  const bool use_large = large.value_or(total > max32);
  if (!use_large && total > max32) {
    Invalid("the values total " + std::to_string(total) +
            " bytes, more than an Arrow binary array holds (2 GiB); pass large=True for large_binary");
  }
  return use_large ? BuildArray<int64_t>(r, total, nulls, pa, "large_binary")
                   : BuildArray<int32_t>(r, total, nulls, pa, "binary");
}

py::object ViewsToArrow(const std::vector<uint8_t>& found, const std::vector<std::string_view>& values,
                        std::optional<bool> large) {
  py::module_ pa = ImportPyArrow();
  size_t total = 0, nulls = 0;
  for (size_t i = 0; i < found.size(); ++i) {
    if (found[i]) total += values[i].size();
    else ++nulls;
  }
  const auto max32 = static_cast<size_t>(std::numeric_limits<int32_t>::max());
  const bool use_large = large.value_or(total > max32);
  if (!use_large && total > max32) {
    Invalid("the values total " + std::to_string(total) +
            " bytes, more than an Arrow binary array holds (2 GiB); pass large=True for large_binary");
  }
  return use_large ? BuildArrayFromViews<int64_t>(found, values, total, nulls, pa, "large_binary")
                   : BuildArrayFromViews<int32_t>(found, values, total, nulls, pa, "binary");
}

}  // namespace rhino::py_bindings
