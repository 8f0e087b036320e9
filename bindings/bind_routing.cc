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
    const auto& v = views.views();
    for (size_t i = 0; i < v.size(); ++i) {
      uint32_t kg = p.KeyGroupOfHash(p.HashBytes(v[i]));
      o[i] = static_cast<int32_t>(vnodes ? p.VnodeOfKeyGroup(kg) : kg);
    }
  }
  return out;
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

key group = top log2(K) bits of XXH3_64(key bytes, seed); vnode = floor(kg * V / K).
An int key is hashed as its 8 little-endian bytes; a str key as its UTF-8 bytes.
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
           "XXH3_64 of the key's bytes with this partitioner's seed.")
      .def("key_group", [](const Partitioner& p, py::handle key) { return p.KeyGroupOfHash(p.HashBytes(KeyBytes(key))); },
           py::arg("key"))
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

void BindRouting(py::module_& m) {
  BindPartitioner(m);
  BindRoutingTable(m);
}

}  // namespace rhino::py_bindings
