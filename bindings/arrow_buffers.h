// Apache Arrow binary arrays in and out of the state backend, without a
// Python object per value (docs/design.md §2: "take NumPy / Arrow buffers without
// copying"). Variable-width values are what a list of bytes carries, but as
// three buffers: offsets, data and a validity bitmap. PySpark's Arrow paths
// (mapInArrow, applyInArrow, the Arrow-optimized UDFs) hand such arrays over
// and take them back.
//
// pyarrow is an optional dependency: it is imported only when one of these
// functions runs, and its absence raises rhino.InvalidArgumentError naming the
// extra to install.
#pragma once

#include <pybind11/pybind11.h>

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "rhino/state_backend.h"

namespace rhino::py_bindings {

// True if `obj` is a pyarrow.Array (checked without importing pyarrow).
bool IsArrowArray(pybind11::handle obj);

// Views of the values of a pyarrow binary, large_binary, string or
// large_string array, pointing into its data buffer (no copy). `keepalive`
// receives the array. A null value raises InvalidArgumentError: a put of
// "no value" is ambiguous, and deletes are explicit (delete_batch).
void ArrowValueViews(pybind11::handle array, std::vector<std::string_view>* views, pybind11::object* keepalive);

// Keys from a pyarrow array: int64 (each key its 8 little-endian bytes, as
// from NumPy; encoded into `storage`), or binary-like (viewed in place).
// Nulls and other types raise KeyTypeError.
void ArrowKeyViews(pybind11::handle array, std::string* storage, std::vector<std::string_view>* views,
                   pybind11::object* keepalive);

// The values of a MultiGet as a pyarrow array: binary (int32 offsets), or
// large_binary (int64 offsets) when `large` is true, or when it is unset and
// the values total 2 GiB or more. Absent keys are nulls. Each value is copied
// once, from RocksDB's pinned block into the data buffer.
pybind11::object MultiGetToArrow(const MultiGetResult& r, std::optional<bool> large);
// The same from found flags and value views in input order (a session's get).
pybind11::object ViewsToArrow(const std::vector<uint8_t>& found, const std::vector<std::string_view>& values,
                              std::optional<bool> large);

}  // namespace rhino::py_bindings
