#include "buffers.h"

#include "arrow_buffers.h"
#include "errors.h"
#include "rhino/partitioner.h"

namespace py = pybind11;

namespace rhino::py_bindings {
namespace {

[[noreturn]] void KeyTypeFail(const std::string& msg) { throw StatusError{Status::KeyType(msg)}; }

std::string TypeName(py::handle h) { return py::str(py::type::of(h).attr("__name__")); }

// Appends the bytes of one scalar key or value; false if the type is unsupported.
bool AppendScalar(py::handle item, bool is_key, std::string* out) {
  PyObject* o = item.ptr();
  if (PyBytes_Check(o)) {
    out->append(PyBytes_AS_STRING(o), static_cast<size_t>(PyBytes_GET_SIZE(o)));
    return true;
  }
  if (PyByteArray_Check(o)) {
    out->append(PyByteArray_AS_STRING(o), static_cast<size_t>(PyByteArray_GET_SIZE(o)));
    return true;
  }
  if (PyMemoryView_Check(o)) {
    // py::bytes(obj) only accepts bytes (it raised a raw TypeError here);
    // PyBytes_FromObject copies any buffer, contiguous or not, in C order.
    py::object b = py::reinterpret_steal<py::object>(PyBytes_FromObject(o));
    if (!b) throw py::error_already_set();
    out->append(PyBytes_AS_STRING(b.ptr()), static_cast<size_t>(PyBytes_GET_SIZE(b.ptr())));
    return true;
  }
  if (!is_key) return false;
  if (PyUnicode_Check(o)) {
    Py_ssize_t n = 0;
    const char* s = PyUnicode_AsUTF8AndSize(o, &n);
    if (s == nullptr) throw py::error_already_set();
    out->append(s, static_cast<size_t>(n));
    return true;
  }
  if (!PyBool_Check(o) && (PyLong_Check(o) || PyIndex_Check(o))) {  // int, NumPy integers
    py::object as_int = py::reinterpret_steal<py::object>(PyNumber_Index(o));
    if (!as_int) throw py::error_already_set();
    int overflow = 0;
    long long v = PyLong_AsLongLongAndOverflow(as_int.ptr(), &overflow);
    if (overflow != 0) KeyTypeFail("int key " + std::string(py::str(item)) + " is outside the int64 range");
    if (v == -1 && PyErr_Occurred()) throw py::error_already_set();
    char buf[8];
    EncodeInt64Key(static_cast<int64_t>(v), buf);
    out->append(buf, 8);
    return true;
  }
  return false;
}

}  // namespace

py::array_t<int64_t> RequireInt64Array(py::handle obj, const char* what) {
  if (!py::isinstance<py::array>(obj)) {
    KeyTypeFail(std::string(what) + " must be a NumPy int64 array, got " + TypeName(obj));
  }
  py::array a = py::reinterpret_borrow<py::array>(obj);
  if (!a.dtype().is(py::dtype::of<int64_t>())) {
    KeyTypeFail(std::string(what) + " must have dtype int64, got " + std::string(py::str(a.dtype())) +
                " (convert explicitly, e.g. keys.astype(np.int64), if that is what you mean)");
  }
  if (a.ndim() != 1) KeyTypeFail(std::string(what) + " must be 1-D, got " + std::to_string(a.ndim()) + "-D");
  return py::array_t<int64_t, py::array::c_style | py::array::forcecast>::ensure(a);
}

void ByteViews::LoadKeys(py::handle keys) {
  views_.clear();
  storage_.clear();
  if (py::isinstance<py::array>(keys)) {
    py::array a = py::reinterpret_borrow<py::array>(keys);
    if (a.dtype().kind() == 'O') {
      FromSequence(keys, true);
      return;
    }
    auto arr = RequireInt64Array(keys, "keys");
    const int64_t* p = arr.data();
    const size_t n = static_cast<size_t>(arr.size());
    storage_.resize(8 * n);
    for (size_t i = 0; i < n; ++i) EncodeInt64Key(p[i], &storage_[8 * i]);
    views_.reserve(n);
    for (size_t i = 0; i < n; ++i) views_.emplace_back(storage_.data() + 8 * i, 8);
    return;
  }
  if (PyBytes_Check(keys.ptr()) || PyUnicode_Check(keys.ptr())) {
    KeyTypeFail("keys must be a collection of keys, got a single " + TypeName(keys) + "; wrap it in a list");
  }
  if (IsArrowArray(keys)) {
    ArrowKeyViews(keys, &storage_, &views_, &keepalive_);
    return;
  }
  if (TypeName(keys) == "ChunkedArray") {
    KeyTypeFail("keys is a pyarrow ChunkedArray; pass one Array (chunked.combine_chunks(), or one chunk per batch)");
  }
  FromSequence(keys, true);
}

void ByteViews::LoadValues(py::handle values) {
  views_.clear();
  storage_.clear();
  if (py::isinstance<py::array>(values)) {
    py::array a = py::reinterpret_borrow<py::array>(values);
    if (a.dtype().kind() == 'O') {
      FromSequence(values, false);
      return;
    }
    if (a.ndim() < 1) throw StatusError{Status::InvalidArgument("values array must have at least one axis")};
    if (!(a.flags() & py::array::c_style)) a = py::array::ensure(a, py::array::c_style);
    keepalive_ = a;
    const size_t n = static_cast<size_t>(a.shape(0));
    const size_t width = n == 0 ? 0 : static_cast<size_t>(a.nbytes()) / n;
    const char* base = static_cast<const char*>(a.data());
    views_.reserve(n);
    for (size_t i = 0; i < n; ++i) views_.emplace_back(base + i * width, width);
    return;
  }
  if (PyBytes_Check(values.ptr())) {
    throw StatusError{Status::InvalidArgument("values must be a collection of values, got a single bytes; wrap it in a list")};
  }
  if (IsArrowArray(values)) {
    ArrowValueViews(values, &views_, &keepalive_);
    return;
  }
  if (TypeName(values) == "ChunkedArray") {
    throw StatusError{Status::InvalidArgument(
        "values is a pyarrow ChunkedArray; pass one Array (chunked.combine_chunks(), or one chunk per batch)")};
  }
  FromSequence(values, false);
}

void ByteViews::FromSequence(py::handle seq_obj, bool keys) {
  if (!PySequence_Check(seq_obj.ptr())) {
    if (keys) KeyTypeFail("keys must be a NumPy int64 array or a sequence of bytes/str/int, got " + TypeName(seq_obj));
    throw StatusError{Status::InvalidArgument("values must be a NumPy array or a sequence of bytes, got " + TypeName(seq_obj))};
  }
  py::sequence seq = py::reinterpret_borrow<py::sequence>(seq_obj);
  const size_t n = static_cast<size_t>(py::len(seq));
  // First pass: sizes, so that storage_ never reallocates under our views.
  size_t total = 0;
  for (size_t i = 0; i < n; ++i) {
    py::handle item = seq[i];
    if (PyBytes_Check(item.ptr())) total += static_cast<size_t>(PyBytes_GET_SIZE(item.ptr()));
    else total += 16;
  }
  storage_.reserve(total);
  std::vector<size_t> offsets(n + 1, 0);
  for (size_t i = 0; i < n; ++i) {
    py::object item = seq[i];
    if (!AppendScalar(item, keys, &storage_)) {
      if (keys) {
        KeyTypeFail("key " + std::to_string(i) + " has type " + TypeName(item) +
                    "; keys must be bytes, str or int (int64)");
      }
      throw StatusError{Status::InvalidArgument("value " + std::to_string(i) + " has type " + TypeName(item) +
                                                "; values must be bytes-like")};
    }
    offsets[i + 1] = storage_.size();
  }
  views_.reserve(n);
  for (size_t i = 0; i < n; ++i) views_.emplace_back(storage_.data() + offsets[i], offsets[i + 1] - offsets[i]);
}

std::string KeyBytes(py::handle key) {
  std::string out;
  if (py::isinstance<py::array>(key) || !AppendScalar(key, true, &out)) {
    KeyTypeFail("a key must be bytes, str or int (int64), got " + TypeName(key));
  }
  return out;
}

}  // namespace rhino::py_bindings
