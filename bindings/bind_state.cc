// Bindings for the state backend: StateBackend and WriteBatch.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <optional>

#include "arrow_buffers.h"
#include "bind_common.h"
#include "buffers.h"
#include "errors.h"
#include "rhino/state_backend.h"

namespace py = pybind11;

namespace rhino::py_bindings {
namespace {

// The Python-facing handle: closeable, and remembers how it was restored.
//
// Calls run with the GIL released, so close() may come from another thread
// while one is under way. Every call therefore holds a pass of `gate` (see
// CloseGate in bind_common.h) for as long as it uses the DB, results it still
// pins included: close() refuses new calls (InvalidArgumentError
// "StateBackend is closed"), waits with the GIL released for the calls under
// way, then destroys the DB, and returns only then (the directory's LOCK is
// free). A pass is taken with the GIL held (it never blocks), after the
// arguments are read and before the GIL is released.
struct PyState {
  CloseGate gate{"StateBackend"};
  std::unique_ptr<StateBackend> db;  // set before the handle is shared; reset only by Close()
  std::optional<RestoreStats> restore_stats;

  // The DB for the length of one call.
  class Use {
   public:
    StateBackend* operator->() const { return db_; }
    StateBackend& operator*() const { return *db_; }

   private:
    friend struct PyState;
    Use(CloseGate::Pass pass, StateBackend* db) : pass_(std::move(pass)), db_(db) {}
    CloseGate::Pass pass_;
    StateBackend* db_;
  };

  // Raises InvalidArgumentError "StateBackend is closed" once close() has begun.
  Use use() {
    CloseGate::Pass pass = gate.Enter();
    return Use(std::move(pass), db.get());
  }

  // Call without the GIL. Waits for the calls under way, then closes the DB.
  void Close() {
    gate.Close([this] { db.reset(); });
  }

  ~PyState() {
    // Garbage collection or interpreter exit: no call is under way (each
    // holds a reference to the handle), so this only closes the DB, letting
    // go of the GIL meanwhile as close() does (RocksDB may wait for a flush).
    if (!db) return;
    if (PyGILState_Check()) {
      py::gil_scoped_release release;
      Close();
    } else {
      Close();
    }
  }
};

struct PyWriteBatch {
  std::shared_ptr<PyState> owner;
  WriteBatch batch;
};

CompactionStyle CompactionArg(const std::string& name) {
  CompactionStyle c;
  if (!ParseCompactionStyle(name, &c))
    throw py::value_error("compaction must be 'level' or 'universal', got '" + name + "'");
  return c;
}

StateOptions MakeOptions(py::object partitioner, const std::string& operator_id, uint32_t instance,
                         py::object vnodes, uint64_t write_buffer_budget, bool read_only,
                         const std::string& compaction, uint32_t flush_threads, uint64_t checkpoint_wal_bytes) {
  StateOptions o;
  o.checkpoint_wal_bytes = checkpoint_wal_bytes;
  o.compaction = CompactionArg(compaction);
  o.flush_threads = flush_threads;
  o.operator_id = operator_id;
  o.instance = instance;
  o.read_only = read_only;
  o.write_buffer_budget = write_buffer_budget;
  if (partitioner.is_none()) {
    o.check_partitioner = false;  // existing state: use what it was created with
  } else {
    const auto& p = partitioner.cast<const Partitioner&>();
    o.partitioner = PartitionerOptions{p.num_key_groups(), p.num_vnodes(), p.seed()};
  }
  if (!vnodes.is_none()) {
    for (py::handle v : vnodes) {
      int64_t x = v.cast<int64_t>();
      // Range-check before narrowing: 2^32 + 3 must not silently become vnode 3.
      if (x < 0 || x > (int64_t{1} << 30))
        throw StatusError{Status::UnknownVnode("vnode " + std::to_string(x) + " is out of range")};
      o.vnodes.push_back(static_cast<uint32_t>(x));
    }
    if (o.vnodes.empty()) throw StatusError{Status::InvalidArgument("vnodes is empty: an instance holds at least one")};
  }
  return o;
}

std::vector<uint32_t> ToVnodes(const std::vector<int64_t>& in) {
  std::vector<uint32_t> out;
  for (int64_t v : in) {
    if (v < 0 || v > (int64_t{1} << 30)) throw StatusError{Status::UnknownVnode("vnode " + std::to_string(v) + " is out of range")};
    out.push_back(static_cast<uint32_t>(v));
  }
  return out;
}

// A vnode argument as Python passes it (int64): range-checked before the cast
// to uint32, so that e.g. 2^32 does not wrap around to vnode 0.
void CheckVnodeArg(int64_t vnode) {
  if (vnode < 0 || vnode > (int64_t{1} << 30))
    throw StatusError{Status::UnknownVnode("vnode " + std::to_string(vnode) + " is out of range")};
}

void WriteWith(PyState& st, py::handle keys, py::handle values, std::optional<uint64_t> version) {
  ByteViews k, v;
  k.LoadKeys(keys);
  if (!values.is_none()) v.LoadValues(values);
  auto db = st.use();
  Status s;
  {
    py::gil_scoped_release release;
    WriteBatch batch;
    s = values.is_none() ? db->BatchDelete(&batch, k.views()) : db->BatchPut(&batch, k.views(), v.views());
    if (s.ok()) s = db->Write(&batch, version);
  }
  ThrowIfError(s);
}

// MultiGet of Python keys, the GIL released during the lookups. The values
// stay pinned in the DB while *r lives: the caller holds `db` (a pass) for
// longer than *r.
void LookUp(const PyState::Use& db, const ByteViews& k, MultiGetResult* r) {
  Status s;
  {
    py::gil_scoped_release release;
    s = db->MultiGet(k.views(), r);
  }
  ThrowIfError(s);
}

py::object MaybeBytes(const Status& s, const std::string& value) {
  if (s.IsNotFound()) return py::none();
  ThrowIfError(s);
  return py::bytes(value);
}

}  // namespace

using StateClass = py::class_<PyState, std::shared_ptr<PyState>>;

// StateBackend's methods, in groups: single keys and batches written,
// reads and scans, and checkpoints, vnode moves and housekeeping.
static void DefStateWrites(StateClass& cls) {
  cls
      .def("get", [](PyState& st, py::handle key) {
             std::string k = KeyBytes(key), value;
             auto db = st.use();
             Status s;
             {
               py::gil_scoped_release release;
               s = db->Get(k, &value);
             }
             return MaybeBytes(s, value);
           }, py::arg("key"), "The value of `key`, or None.")
      .def("put", [](PyState& st, py::handle key, py::bytes value) {
             std::string k = KeyBytes(key);
             std::string_view v = value;
             ThrowIfError(st.use()->Put(k, v));
           }, py::arg("key"), py::arg("value"))
      .def("delete", [](PyState& st, py::handle key) {
             std::string k = KeyBytes(key);
             ThrowIfError(st.use()->Delete(k));
           }, py::arg("key"))
      .def("put_batch", [](PyState& st, py::handle keys, py::handle values, std::optional<uint64_t> version) {
             if (values.is_none()) throw StatusError{Status::InvalidArgument("values must not be None")};
             WriteWith(st, keys, values, version);
           }, py::arg("keys"), py::arg("values"), py::kw_only(), py::arg("version") = py::none(),
           "Atomically puts keys[i] = values[i]; with version=b, also sets the state version to b in the same write.")
      .def("delete_batch", [](PyState& st, py::handle keys, std::optional<uint64_t> version) {
             WriteWith(st, keys, py::none(), version);
           }, py::arg("keys"), py::kw_only(), py::arg("version") = py::none())
      .def("batch", [](std::shared_ptr<PyState> st) {
             st->use();  // "StateBackend is closed" once closed
             return PyWriteBatch{st, WriteBatch()};
           }, "A new WriteBatch for this state.")
      .def("write", [](PyState& st, PyWriteBatch& b, std::optional<uint64_t> version) {
             if (b.owner.get() != &st) throw StatusError{Status::InvalidArgument("batch belongs to another StateBackend")};
             auto db = st.use();
             Status s;
             {
               py::gil_scoped_release release;
               s = db->Write(&b.batch, version);
             }
             ThrowIfError(s);
           }, py::arg("batch"), py::kw_only(), py::arg("version") = py::none(),
           "Applies `batch` atomically, together with the state version if given.");
}

static void DefStateReads(StateClass& cls) {
  cls
      .def("get_batch", [](PyState& st, py::handle keys) {
             ByteViews k;
             k.LoadKeys(keys);
             auto db = st.use();
             MultiGetResult r;  // destroyed (unpinning its values) before db
             LookUp(db, k, &r);
             // Each value is copied once: from RocksDB's pinned block into its
             // bytes object, in lookup order (see MultiGetResult::value_at).
             const size_t n = r.size();
             py::list out(n);
             for (size_t j = 0; j < n; ++j) {
               const auto i = static_cast<Py_ssize_t>(r.key_index(j));
               if (r.found_at(j)) {
                 std::string_view v = r.value_at(j);
                 PyObject* b = PyBytes_FromStringAndSize(v.data(), static_cast<Py_ssize_t>(v.size()));
                 if (b == nullptr) throw py::error_already_set();
                 PyList_SET_ITEM(out.ptr(), i, b);  // steals b
               } else {
                 PyList_SET_ITEM(out.ptr(), i, Py_NewRef(Py_None));
               }
             }
             return out;
           }, py::arg("keys"), "Values of many keys as a list (None where absent).")
      .def("_batch_order", [](PyState& st, py::handle keys) {
             ByteViews k;
             k.LoadKeys(keys);
             std::vector<size_t> order;
             ThrowIfError(st.use()->BatchOrder(k.views(), &order));
             py::array_t<int64_t> out(static_cast<py::ssize_t>(order.size()));
             std::copy(order.begin(), order.end(), out.mutable_data());
             return out;
           }, py::arg("keys"), "For tests: the order batches apply and look up `keys` in (indices).")
      .def("get_batch_array", [](PyState& st, py::handle keys, size_t width) {
             ByteViews k;
             k.LoadKeys(keys);
             auto db = st.use();
             MultiGetResult r;  // destroyed (unpinning its values) before db
             LookUp(db, k, &r);
             const auto n = static_cast<py::ssize_t>(r.size());
             py::array_t<uint8_t> out({n, static_cast<py::ssize_t>(width)});
             py::array_t<bool> mask(n);
             uint8_t* o = out.mutable_data();
             bool* f = mask.mutable_data();
             // In lookup order (see MultiGetResult::value_at): the reads follow
             // RocksDB's blocks, and the writes land in our own output.
             for (size_t j = 0; j < static_cast<size_t>(n); ++j) {
               const size_t i = r.key_index(j);
               f[i] = r.found_at(j);
               if (!f[i]) {
                 std::memset(o + i * width, 0, width);  // absent keys read as zeros
                 continue;
               }
               std::string_view v = r.value_at(j);
               if (v.size() != width) {
                 throw StatusError{Status::InvalidArgument("value " + std::to_string(i) + " has " +
                                                           std::to_string(v.size()) + " bytes, not width " +
                                                           std::to_string(width))};
               }
               std::memcpy(o + i * width, v.data(), width);
             }
             return py::make_tuple(out, mask);
           }, py::arg("keys"), py::arg("width"),
           "Fixed-width values of many keys: (uint8 array of shape (n, width), bool found mask).")
      .def("get_batch_arrow", [](PyState& st, py::handle keys, std::optional<bool> large) {
             ByteViews k;
             k.LoadKeys(keys);
             auto db = st.use();
             MultiGetResult r;  // destroyed (unpinning its values) before db
             LookUp(db, k, &r);
             return MultiGetToArrow(r, large);
           }, py::arg("keys"), py::kw_only(), py::arg("large") = py::none(),
           "Values of many keys as a pyarrow binary array (null where absent); large=True gives large_binary.")
      .def("scan", [](PyState& st, int64_t vnode) {
             CheckVnodeArg(vnode);
             std::vector<std::pair<std::string, std::string>> items;
             auto db = st.use();
             Status s;
             {
               py::gil_scoped_release release;
               s = db->Scan(static_cast<uint32_t>(vnode), [&](std::string_view k, std::string_view v) {
                 items.emplace_back(std::string(k), std::string(v));
                 return true;
               });
             }
             ThrowIfError(s);
             py::list out;
             for (auto& [k, v] : items) out.append(py::make_tuple(py::bytes(k), py::bytes(v)));
             return out;
           }, py::arg("vnode"), "All (key, value) pairs of one vnode, in key order, from a consistent snapshot.")
      .def("count", [](PyState& st, int64_t vnode) {
             CheckVnodeArg(vnode);
             uint64_t n = 0;
             auto db = st.use();
             Status s;
             {
               py::gil_scoped_release release;
               s = db->Scan(static_cast<uint32_t>(vnode), [&](std::string_view, std::string_view) {
                 ++n;
                 return true;
               });
             }
             ThrowIfError(s);
             return n;
           }, py::arg("vnode"), "Exact number of keys in one vnode (a scan).");
}

// TTL (docs/protocol.md §7.8): the clock and a full compaction through the filter.
static void DefStateTtl(StateClass& cls) {
  cls
      .def("compact", [](PyState& st) {
             auto db = st.use();
             uint64_t before = 0, after = 0;
             Status s;
             {
               py::gil_scoped_release release;
               s = db->CompactVnodes(&before, &after);
             }
             ThrowIfError(s);
             py::dict d;
             d["bytes_before"] = before;
             d["bytes_after"] = after;
             return d;
           },
           "Compacts every vnode fully (the TTL filter drops the entries the TTL clock has expired); returns "
           "bytes_before and bytes_after, the vnodes' live SST bytes. close() waits for it.")
      .def("set_ttl_clock", [](PyState& st, int64_t ms) { ThrowIfError(st.use()->SetTtlClock(ms)); }, py::arg("ms"),
           "Sets (and stores with the state) the TTL clock: compactions drop the routed keys with flag TTL whose "
           "expiry, their value's first 8 bytes (int64 big-endian), is <= ms.");
}

static void DefStateAdmin(StateClass& cls) {
  cls
      .def("checkpoint", [](PyState& st, ReplicaStore& store, uint64_t checkpoint_id, uint64_t epoch) {
             Manifest mf;
             auto db = st.use();
             Status s;
             {
               py::gil_scoped_release release;
               s = db->Checkpoint(&store, checkpoint_id, epoch, &mf);
             }
             ThrowIfError(s);
             return mf;
           }, py::arg("store"), py::arg("checkpoint_id"), py::kw_only(), py::arg("epoch") = 0,
           "Takes checkpoint `checkpoint_id` into `store` and returns its committed Manifest.")
      .def("export_vnodes", [](PyState& st, std::vector<int64_t> vnodes, const std::string& path) {
             auto v = ToVnodes(vnodes);
             auto db = st.use();
             Status s;
             {
               py::gil_scoped_release release;
               s = db->ExportVnodes(v, path);
             }
             ThrowIfError(s);
           }, py::arg("vnodes"), py::arg("path"), "Exports vnodes into `path` (must not exist) as hard links.")
      .def("import_vnodes", [](PyState& st, const std::string& path) {
             std::vector<uint32_t> imported;
             auto db = st.use();
             Status s;
             {
               py::gil_scoped_release release;
               s = db->ImportVnodes(path, &imported);
             }
             ThrowIfError(s);
             return imported;
           }, py::arg("path"), "Imports (and consumes) an export made by export_vnodes(); returns the vnodes.")
      .def("drop_vnodes", [](PyState& st, std::vector<int64_t> vnodes) {
             auto v = ToVnodes(vnodes);
             ThrowIfError(st.use()->DropVnodes(v));
           }, py::arg("vnodes"))
      .def("stats", [](PyState& st) {
             std::vector<VnodeStats> v;
             ThrowIfError(st.use()->Stats(&v));
             py::list out;
             for (const auto& x : v) {
               py::dict d;
               d["vnode"] = x.vnode;
               d["estimated_keys"] = x.estimated_keys;
               d["sst_bytes"] = x.sst_bytes;
               out.append(d);
             }
             return out;
           }, "Per-vnode RocksDB estimates: vnode, estimated_keys, sst_bytes.")
      .def("flush", [](PyState& st) {
             auto db = st.use();
             Status s;
             {
               py::gil_scoped_release release;
               s = db->Flush();
             }
             ThrowIfError(s);
           })
      .def("wait_for_compactions", [](PyState& st, std::optional<double> timeout) {
             if (timeout && (std::isnan(*timeout) || *timeout < 0))
               ThrowIfError(Status::InvalidArgument("timeout must be a number of seconds >= 0, or None"));
             // Waits in slices with the GIL released, checking for signals in
             // between, so Ctrl-C interrupts a long wait.
             const auto start = std::chrono::steady_clock::now();
             for (;;) {
               auto slice = std::chrono::milliseconds(200);
               if (timeout) {
                 auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                     std::chrono::duration<double>(*timeout) - (std::chrono::steady_clock::now() - start));
                 slice = std::clamp(left, std::chrono::milliseconds(0), slice);
               }
               bool settled = false;
               Status s;
               {
                 // A pass per slice, not for the whole wait: a close() between
                 // slices goes ahead, and the next slice raises "closed".
                 auto db = st.use();
                 py::gil_scoped_release release;
                 s = db->WaitForCompactions(slice, &settled);
               }
               ThrowIfError(s);
               if (settled) return true;
               if (timeout && std::chrono::steady_clock::now() - start >= std::chrono::duration<double>(*timeout))
                 return false;
               if (PyErr_CheckSignals() != 0) throw py::error_already_set();
             }
           }, py::arg("timeout") = py::none(),
           "Waits until no flush or compaction is pending or running (True), or until `timeout` seconds "
           "pass (False; None waits without limit; a read-only backend is settled at once). Settling before "
           "a checkpoint leaves fewer L0 files "
           "in it, and a hard-link restore costs one link per file.")
      .def("close", [](PyState& st) {
             py::gil_scoped_release release;  // the calls under way may need the GIL to finish
             st.Close();
           },
           "Closes the DB. Safe from any thread: calls that have begun finish first (close() waits "
           "for them), later ones raise InvalidArgumentError; when it returns the directory can be "
           "reopened. Idempotent. Raises InvalidArgumentError if called from inside a call on this "
           "StateBackend (e.g. from a callback), which it would wait for forever.")
      .def("__enter__", [](std::shared_ptr<PyState> st) { return st; })
      .def("__exit__", [](PyState& st, py::args) {
        py::gil_scoped_release release;
        st.Close();
      })
      .def("_in_call", [](PyState& st, py::object fn) {
             auto db = st.use();
             return fn();
           }, py::arg("fn"),
           "For tests: runs fn() (with the GIL) as a call on this StateBackend does, holding it open: "
           "a close() meanwhile waits for fn to return. Returns fn's result.");
}

void BindState(py::module_& m) {
  py::class_<PyWriteBatch>(m, "WriteBatch", "Puts and deletes applied atomically by StateBackend.write().")
      .def("put", [](PyWriteBatch& b, py::handle keys, py::handle values) {
             ByteViews k, v;
             k.LoadKeys(keys);
             v.LoadValues(values);
             ThrowIfError(b.owner->use()->BatchPut(&b.batch, k.views(), v.views()));
           }, py::arg("keys"), py::arg("values"))
      .def("delete", [](PyWriteBatch& b, py::handle keys) {
             ByteViews k;
             k.LoadKeys(keys);
             ThrowIfError(b.owner->use()->BatchDelete(&b.batch, k.views()));
           }, py::arg("keys"))
      .def("clear", [](PyWriteBatch& b) { b.batch.Clear(); })
      .def("__len__", [](const PyWriteBatch& b) { return b.batch.count(); });

  auto cls = py::class_<PyState, std::shared_ptr<PyState>>(m, "StateBackend", R"doc(
One operator instance's keyed state: one RocksDB, one column family per vnode.

Keys are bytes, str (UTF-8) or int (int64, stored as 8 little-endian bytes);
batches take a NumPy int64 array, a pyarrow int64 or binary/string array, or a
sequence. Values are bytes, rows of a
C-contiguous NumPy array, or a pyarrow binary/string array (no nulls). A key whose vnode this instance does not hold raises
UnknownVnodeError, and nothing of its batch is written.
)doc")
      .def_static("open", [](const std::string& path, py::object partitioner, const std::string& operator_id,
                             uint32_t instance, py::object vnodes, uint64_t write_buffer_budget, bool read_only,
                             bool create, const std::string& compaction, uint32_t flush_threads,
                             uint64_t checkpoint_wal_bytes) {
             StateOptions o = MakeOptions(partitioner, operator_id, instance, vnodes, write_buffer_budget, read_only,
                                          compaction, flush_threads, checkpoint_wal_bytes);
             o.error_if_missing = !create;
             auto st = std::make_shared<PyState>();
             Status s;
             {
               py::gil_scoped_release release;
               s = StateBackend::Open(path, o, &st->db);
             }
             ThrowIfError(s);
             return st;
           }, py::arg("path"), py::kw_only(), py::arg("partitioner") = py::none(), py::arg("operator_id") = "op",
           py::arg("instance") = 0, py::arg("vnodes") = py::none(), py::arg("write_buffer_budget") = 256ull << 20,
           py::arg("read_only") = false, py::arg("create") = true, py::arg("compaction") = "level",
           py::arg("flush_threads") = 1, py::arg("checkpoint_wal_bytes") = StateOptions().checkpoint_wal_bytes,
           "Opens or creates state at `path`. For a new DB, `vnodes` (default: all) become column families.\n"
           "`compaction` is each vnode's compaction style, 'level' or 'universal' (chosen at every open).\n"
           "`flush_threads` (1..16) lets a checkpoint's vnode flushes overlap.\n"
           "`checkpoint_wal_bytes`: a checkpoint whose write-ahead log holds less copies the log instead of\n"
           "flushing every vnode's memtable (a restore replays it); 0 flushes at every checkpoint.")
      .def_property_readonly("path", [](PyState& s) { return s.use()->dir(); })
      .def_property_readonly("operator_id", [](PyState& s) { return s.use()->operator_id(); })
      .def_property_readonly("instance", [](PyState& s) { return s.use()->instance(); })
      .def_property_readonly("compaction", [](PyState& s) { return std::string(CompactionStyleName(s.use()->compaction())); })
      .def_property_readonly("partitioner", [](PyState& s) { return s.use()->partitioner(); })
      .def_property_readonly("vnodes", [](PyState& s) { return s.use()->vnodes(); })
      .def_property_readonly("version", [](PyState& s) { return s.use()->version(); },
                             "The state version (micro-batch id) last written with version=..., or None.")
      .def_property_readonly("last_checkpoint", [](PyState& s) { return s.use()->last_checkpoint(); })
      .def_property_readonly("ttl_clock", [](PyState& s) { return s.use()->ttl_clock(); },
                             "The TTL clock (ms of batch time) compactions expire entries by, or None.")
      .def_property_readonly("restore_stats", [](PyState& s) { return s.restore_stats; },
                             "RestoreStats if this state was opened by ReplicaStore.restore(), else None.")
      .def_property_readonly("closed", [](PyState& s) { return !s.gate.open(); },
                             "True once close() has begun (calls then raise InvalidArgumentError).");
  DefStateWrites(cls);
  DefStateTtl(cls);
  DefStateReads(cls);
  DefStateAdmin(cls);

  auto store_cls = py::reinterpret_borrow<py::class_<ReplicaStore>>(m.attr("ReplicaStore"));
  store_cls.def("restore", [](const ReplicaStore& store, const std::string& op, uint32_t inst, uint64_t id,
                              const std::string& target, const std::string& mode, const std::string& verify,
                              uint64_t write_buffer_budget, const std::string& compaction,
                              uint32_t flush_threads, uint64_t checkpoint_wal_bytes, const py::object& progress,
                              bool sync, bool latency_critical) {
        RestoreOptions ro = ParseRestoreOptions(mode, verify);
        ro.durable = sync;
        ro.latency_critical = latency_critical;
        SignalCheck signals;
        ro.keep_going = RestoreKeepGoing(signals, progress);
        StateOptions so;
        so.write_buffer_budget = write_buffer_budget;
        so.compaction = CompactionArg(compaction);
        so.flush_threads = flush_threads;
        so.checkpoint_wal_bytes = checkpoint_wal_bytes;
        so.sync_open = sync;
        auto st = std::make_shared<PyState>();
        RestoreStats stats;
        Status s;
        {
          py::gil_scoped_release release;
          s = StateBackend::Restore(store, op, inst, id, target, ro, so, &st->db, &stats);
        }
        signals.RethrowIfRaised();
        ThrowIfError(s);
        st->restore_stats = stats;
        return st;
      }, py::arg("operator_id"), py::arg("instance"), py::arg("checkpoint_id"), py::arg("target"), py::kw_only(),
      py::arg("mode") = "link", py::arg("verify") = "size", py::arg("write_buffer_budget") = 256ull << 20,
      py::arg("compaction") = "level", py::arg("flush_threads") = 1,
      py::arg("checkpoint_wal_bytes") = StateOptions().checkpoint_wal_bytes, py::arg("progress") = py::none(),
      py::arg("sync") = true, py::arg("latency_critical") = false,
      R"doc(Restores a checkpoint into `target` (must not exist) and opens it.

mode='link' hard-links immutable files from the pool (O(files)), falling back to
a copy across filesystems (restore_stats.fell_back_to_copy); mode='copy' copies.
verify='size' checks presence and sizes (O(files)); 'full' re-hashes every byte.
Ctrl-C stops a long restore (a full verify, a copy) between files; `target`
is then left absent.
progress, if given, is called as progress(stage, files_done, files_total,
bytes_done, bytes_total), stage 'check' then 'place', after the first file of
each stage, at most every 0.1 s, and at each stage's end; an exception it
raises stops the restore like Ctrl-C and propagates.
sync=False builds and opens `target` without one fsync, as a worker's takeover
does (the checkpoint stays durable in the store): a crash of the machine soon
after may leave `target` damaged, and it is then restored again.
latency_critical=True runs the restore under the normal scheduling policy even
if the calling thread is a SCHED_BATCH one, as a worker's takeover does.)doc");
}

}  // namespace rhino::py_bindings
