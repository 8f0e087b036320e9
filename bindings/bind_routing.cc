// Bindings for hashing and routing: Partitioner and RoutingTable.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <string>
#include <vector>

#include "buffers.h"
#include "errors.h"
#include "rhino/partitioner.h"
#include "rhino/routing_table.h"

namespace py = pybind11;

namespace rhino::py_bindings {
namespace {

// Hashes either an int64 array (GIL released, no per-key Python work) or a
// sequence of bytes/str/int keys; `vnodes` selects the output.
py::array_t<int32_t> MapKeys(const Partitioner& p, py::handle keys, bool vnodes) {
  if (py::isinstance<py::array>(keys) && py::reinterpret_borrow<py::array>(keys).dtype().kind() != 'O') {
    auto arr = RequireInt64Array(keys, "keys");
    py::array_t<int32_t> out(arr.size());
    const int64_t* in = arr.data();
    int32_t* o = out.mutable_data();
    const size_t n = static_cast<size_t>(arr.size());
    {
      py::gil_scoped_release release;
      if (vnodes) p.VnodesInt64(in, n, o);
      else p.KeyGroupsInt64(in, n, o);
    }
    return out;
  }
  ByteViews views;
  views.LoadKeys(keys);
  py::array_t<int32_t> out(static_cast<py::ssize_t>(views.size()));
  int32_t* o = out.mutable_data();
  {
    py::gil_scoped_release release;
    // Each key by its routing part (partitioner.h), as the state backend routes it.
    const auto& v = views.views();
    if (vnodes) p.VnodesBytes(v.data(), v.size(), o);
    else p.KeyGroupsBytes(v.data(), v.size(), o);
  }
  return out;
}

// ---- routed keys (partitioner.h; docs/protocol.md §7.8) ----

uint8_t RoutedFlags(bool ttl) { return ttl ? kRoutedFlagTtl : 0; }

py::bytes RoutedKey(py::handle head, py::handle routing, py::handle tail, bool ttl) {
  std::string out;
  ThrowIfError(MakeRoutedKey(KeyBytes(head), KeyBytes(routing), KeyBytes(tail), RoutedFlags(ttl), &out));
  return py::bytes(out);
}

// One part of routed_keys: a bytes-like (or str) object is the same part for
// every key; anything else is a collection of parts, one per key.
struct Parts {
  std::string one;
  bool shared = false;
  ByteViews many;
  void Load(py::handle obj) {
    PyObject* o = obj.ptr();
    shared = PyBytes_Check(o) || PyByteArray_Check(o) || PyMemoryView_Check(o) || PyUnicode_Check(o);
    if (shared) one = KeyBytes(obj);
    else many.LoadKeys(obj);
  }
  std::string_view at(size_t i) const { return shared ? std::string_view(one) : many.views()[i]; }
};

py::list RoutedKeys(py::handle heads, py::handle routings, py::handle tails, bool ttl) {
  Parts h, r, t;
  h.Load(heads);
  r.Load(routings);
  t.Load(tails);
  if (r.shared) throw StatusError{Status::InvalidArgument("routings must be a collection, one routing part per key")};
  const size_t n = r.many.size();
  for (const auto& [parts, name] : {std::pair<const Parts*, const char*>{&h, "heads"}, {&t, "tails"}}) {
    if (!parts->shared && parts->many.size() != n) {
      throw StatusError{Status::InvalidArgument(std::string(name) + " has " + std::to_string(parts->many.size()) +
                                                " items for " + std::to_string(n) + " routing parts")};
    }
  }
  py::list out(n);
  std::string key;
  for (size_t i = 0; i < n; ++i) {
    Status s = MakeRoutedKey(h.at(i), r.at(i), t.at(i), RoutedFlags(ttl), &key);
    if (!s.ok()) throw StatusError{Status::InvalidArgument("key " + std::to_string(i) + ": " + s.message())};
    PyObject* b = PyBytes_FromStringAndSize(key.data(), static_cast<Py_ssize_t>(key.size()));
    if (b == nullptr) throw py::error_already_set();
    PyList_SET_ITEM(out.ptr(), static_cast<Py_ssize_t>(i), b);
  }
  return out;
}

py::object SplitKey(py::handle key) {
  const std::string k = KeyBytes(key);
  RoutedKeyParts p;
  if (!SplitRoutedKey(k, &p)) return py::none();
  return py::make_tuple(py::bytes(std::string(p.head)), py::bytes(std::string(p.routing)),
                        py::bytes(std::string(p.tail)), p.flags);
}

RoutingTable MakeTable(py::handle assignment, uint32_t num_instances, uint64_t epoch) {
  auto arr = py::array_t<int32_t, py::array::c_style | py::array::forcecast>::ensure(assignment);
  if (!arr || arr.ndim() != 1) throw StatusError{Status::InvalidArgument("assignment must be a 1-D integer array")};
  std::vector<int32_t> v(arr.data(), arr.data() + arr.size());
  RoutingTable t;
  ThrowIfError(RoutingTable::FromAssignment(std::move(v), num_instances, epoch, &t));
  return t;
}

}  // namespace

static void BindPartitioner(py::module_& m) {
  py::class_<Partitioner>(m, "Partitioner", R"doc(
Maps keys to key groups and vnodes (docs/design.md §1).

key group = top log2(K) bits of XXH3_64(routing part, seed); vnode = floor(kg * V / K).
An int key is hashed as its 8 little-endian bytes; a str key as its UTF-8 bytes.
The routing part of a plain key is the whole key; of a routed key (rhino.routed_key),
the part it was built with, so it lands in the vnode of that plain key.
)doc")
      .def(py::init([](int64_t num_key_groups, int64_t num_vnodes, uint64_t seed) {
             // Taken as int64 so that K = 2^32 or V = -1 is an InvalidArgumentError like
             // any other bad K or V, not a pybind11 TypeError or a silent wrap-around.
             if (num_key_groups < 0 || num_key_groups > UINT32_MAX)
               throw StatusError{Status::InvalidArgument("num_key_groups must be a power of two in [1, 2^30], got " +
                                                         std::to_string(num_key_groups))};
             if (num_vnodes < 0 || num_vnodes > UINT32_MAX)
               throw StatusError{Status::InvalidArgument("num_vnodes must be in [1, num_key_groups], got " +
                                                         std::to_string(num_vnodes))};
             Partitioner p;
             ThrowIfError(Partitioner::Create(PartitionerOptions{static_cast<uint32_t>(num_key_groups),
                                                                 static_cast<uint32_t>(num_vnodes), seed}, &p));
             return p;
           }),
           py::kw_only(), py::arg("num_key_groups") = 1u << 15, py::arg("num_vnodes") = 256u,
           py::arg("seed") = 0ull)
      .def_property_readonly("num_key_groups", &Partitioner::num_key_groups)
      .def_property_readonly("num_vnodes", &Partitioner::num_vnodes)
      .def_property_readonly("seed", &Partitioner::seed)
      .def("hash", [](const Partitioner& p, py::handle key) { return p.HashBytes(KeyBytes(key)); }, py::arg("key"),
           "XXH3_64 of the key's bytes with this partitioner's seed (all of them: a routed key's key group "
           "is that of its routing part).")
      .def("key_group", [](const Partitioner& p, py::handle key) { return p.KeyGroupOfBytes(KeyBytes(key)); },
           py::arg("key"), "The key group of the key's routing part (the whole key unless it is routed).")
      .def("vnode", [](const Partitioner& p, py::handle key) { return p.VnodeOfBytes(KeyBytes(key)); }, py::arg("key"))
      .def("key_groups", [](const Partitioner& p, py::handle keys) { return MapKeys(p, keys, false); },
           py::arg("keys"), "Key groups of many keys, as an int32 array (GIL released for int64 arrays).")
      .def("vnodes", [](const Partitioner& p, py::handle keys) { return MapKeys(p, keys, true); }, py::arg("keys"),
           "Vnodes of many keys, as an int32 array (GIL released for int64 arrays).")
      .def("vnode_of_key_group", [](const Partitioner& p, uint32_t kg) {
             if (kg >= p.num_key_groups()) throw StatusError{Status::InvalidArgument("key group out of range")};
             return p.VnodeOfKeyGroup(kg);
           }, py::arg("key_group"))
      .def("key_group_range", [](const Partitioner& p, uint32_t vnode) {
             if (vnode >= p.num_vnodes())
               throw StatusError{Status::UnknownVnode("vnode " + std::to_string(vnode) + " is outside [0, " +
                                                      std::to_string(p.num_vnodes()) + ")")};
             uint32_t a, b;
             p.KeyGroupRange(vnode, &a, &b);
             return py::make_tuple(a, b);
           }, py::arg("vnode"), "The half-open key-group range [first, last) of a vnode.")
      .def("__repr__", [](const Partitioner& p) {
        return "Partitioner(num_key_groups=" + std::to_string(p.num_key_groups()) +
               ", num_vnodes=" + std::to_string(p.num_vnodes()) + ", seed=" + std::to_string(p.seed()) + ")";
      });
}

static void BindRoutingTable(py::module_& m) {
  py::class_<RoutingTable>(m, "RoutingTable", R"doc(
vnode -> instance, versioned by a configuration epoch.

from_ring() builds the initial table from a consistent-hash ring; afterwards
the table changes only through reassign() (a handover), which bumps the epoch.
)doc")
      .def(py::init(&MakeTable), py::arg("assignment"), py::arg("num_instances"), py::kw_only(),
           py::arg("epoch") = 0)
      .def_static("from_ring", [](uint32_t num_vnodes, uint32_t num_instances, uint64_t epoch,
                                  uint32_t tokens_per_instance, uint64_t seed) {
             RoutingTable t;
             ThrowIfError(RoutingTable::FromRing(RingOptions{num_vnodes, num_instances, tokens_per_instance, seed},
                                                 epoch, &t));
             return t;
           }, py::arg("num_vnodes"), py::arg("num_instances"), py::kw_only(), py::arg("epoch") = 0,
           py::arg("tokens_per_instance") = 64, py::arg("seed") = 0)
      .def_property_readonly("epoch", &RoutingTable::epoch)
      .def_property_readonly("num_vnodes", &RoutingTable::num_vnodes)
      .def_property_readonly("num_instances", &RoutingTable::num_instances)
      .def_property_readonly("assignment", [](const RoutingTable& t) {
        const auto& a = t.assignment();
        return py::array_t<int32_t>(static_cast<py::ssize_t>(a.size()), a.data());
      })
      .def("instance_of", [](const RoutingTable& t, int64_t vnode) {
             if (vnode < 0 || vnode >= t.num_vnodes())
               throw StatusError{Status::UnknownVnode("vnode " + std::to_string(vnode) + " is outside [0, " +
                                                      std::to_string(t.num_vnodes()) + ")")};
             return t.InstanceOf(static_cast<uint32_t>(vnode));
           }, py::arg("vnode"))
      .def("instances_of", [](const RoutingTable& t, py::handle vnodes) {
             // Cast to int64, never straight to int32: a forced cast to int32 would
             // wrap 2^32 + 3 to vnode 3 and truncate 3.9 to 3 instead of rejecting them.
             py::array any = py::array::ensure(vnodes);
             if (!any || any.ndim() != 1) throw StatusError{Status::InvalidArgument("vnodes must be a 1-D integer array")};
             const char kind = any.dtype().kind();
             if (any.size() > 0 && kind != 'i' && kind != 'u')
               throw StatusError{Status::InvalidArgument("vnodes must be integers, got dtype " +
                                                         std::string(py::str(any.dtype())))};
             auto arr = py::array_t<int64_t, py::array::c_style | py::array::forcecast>::ensure(any);
             if (!arr) throw py::error_already_set();
             const size_t n = static_cast<size_t>(arr.size());
             py::array_t<int32_t> out(arr.size());
             Status s;
             {
               py::gil_scoped_release release;
               const int64_t* in = arr.data();
               std::vector<int32_t> narrow(n);
               for (size_t i = 0; i < n && s.ok(); ++i) {
                 if (in[i] < 0 || in[i] >= static_cast<int64_t>(t.num_vnodes())) {
                   s = Status::UnknownVnode("vnode " + std::to_string(in[i]) + " is outside [0, " +
                                            std::to_string(t.num_vnodes()) + ")");
                 }
                 narrow[i] = static_cast<int32_t>(in[i]);
               }
               if (s.ok()) s = t.InstancesOf(narrow.data(), n, out.mutable_data());
             }
             ThrowIfError(s);
             return out;
           }, py::arg("vnodes"))
      .def("vnodes_of", &RoutingTable::VnodesOf, py::arg("instance"))
      .def("reassign", [](const RoutingTable& t, std::vector<int32_t> vnodes, int32_t target) {
             RoutingTable out;
             ThrowIfError(t.Reassign(vnodes, target, &out));
             return out;
           }, py::arg("vnodes"), py::arg("target"),
           "A new table with `vnodes` moved to `target` and epoch + 1 (the routing side of a handover).")
      .def("__repr__", [](const RoutingTable& t) {
        return "RoutingTable(num_vnodes=" + std::to_string(t.num_vnodes()) +
               ", num_instances=" + std::to_string(t.num_instances()) + ", epoch=" + std::to_string(t.epoch()) + ")";
      });
}

static void BindRoutedKeys(py::module_& m) {
  m.def("routed_key", &RoutedKey, py::arg("head"), py::arg("routing"), py::arg("tail") = py::bytes(""),
        py::kw_only(), py::arg("ttl") = false, R"doc(
head | routing | tail | trailer: a key that lives in the vnode of the plain key `routing`.

The trailer is 6 bytes: u16be len(head), u16be len(routing), flags (0x01 if `ttl`:
the value starts with an 8-byte big-endian expiry in ms), 0xF5. Each part is
bytes-like (a str or int is taken as the key bytes it stands for). len(head)
and len(routing) are at most 65535 (InvalidArgumentError otherwise).
)doc");
  m.def("routed_keys", &RoutedKeys, py::arg("heads"), py::arg("routings"), py::arg("tails") = py::bytes(""),
        py::kw_only(), py::arg("ttl") = false,
        "routed_key for many keys: `routings` is a collection (sequence, int64 array, pyarrow array); `heads` "
        "and `tails` are collections of the same length, or one bytes object for every key.");
  m.def("split_routed_key", &SplitKey, py::arg("key"),
        "(head, routing, tail, flags) of a routed key; None for a plain key (one that does not end in a valid "
        "trailer).");
}

void BindRouting(py::module_& m) {
  BindPartitioner(m);
  BindRoutingTable(m);
  BindRoutedKeys(m);
}

}  // namespace rhino::py_bindings
