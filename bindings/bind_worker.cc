// Bindings for the data plane: Worker, replicate / ReplicationHandle and
// query_store. Every blocking call releases the GIL. The frame codec has no
// binding: the tests check it against a live worker with their own encoder
// (tests/dataplane_wire.py), and fuzz/frame_fuzzer.cc fuzzes it in C++.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <memory>
#include <optional>

#include "bind_common.h"
#include "client/chain_client.h"
#include "errors.h"
#include "net/frame.h"
#include "net/messages.h"
#include "rhino/replica_store.h"
#include "worker/worker.h"

namespace py = pybind11;

namespace rhino::py_bindings {
namespace {

// Owners whose destructors may block (joining threads): they let go of the
// GIL meanwhile, so a worker's threads never wait on Python.
struct PyWorker {
  WorkerOptions options;
  std::unique_ptr<Worker> worker = std::make_unique<Worker>();
  ~PyWorker() {
    py::gil_scoped_release release;
    worker.reset();
  }
};

struct PyReplication {
  // Declared first, so destroyed last: the replication reads the store until
  // its handle is gone.
  std::unique_ptr<ReplicaStore> store;
  std::unique_ptr<ReplicationHandle> handle;
  ~PyReplication() {
    py::gil_scoped_release release;
    handle.reset();
  }
};

py::dict MetricsDict(const WorkerMetrics& m) {
  py::dict d;
  d["bytes_received"] = m.bytes_received;
  d["bytes_sent"] = m.bytes_sent;
  d["bytes_written"] = m.bytes_written;
  d["net_bytes_in"] = m.net_bytes_in;
  d["net_bytes_out"] = m.net_bytes_out;
  d["active_streams"] = m.active_streams;
  d["in_flight_credits"] = m.in_flight_credits;
  d["streams_opened"] = m.streams_opened;
  d["checkpoints_complete"] = m.checkpoints_complete;
  d["checkpoints_aborted"] = m.checkpoints_aborted;
  d["auth_failures"] = m.auth_failures;
  d["tls_failures"] = m.tls_failures;
  d["rejected_frames"] = m.rejected_frames;
  d["stale_rejections"] = m.stale_rejections;
  d["peers_dead"] = m.peers_dead;
  d["open_connections"] = m.open_connections;
  d["reads_paused"] = m.reads_paused;
  d["outbound_bytes"] = m.outbound_bytes;
  d["buffer_pool_cached_bytes"] = m.buffer_pool_cached_bytes;
  d["checkpoints_retired"] = m.checkpoints_retired;
  d["gc_files_removed"] = m.gc_files_removed;
  d["gc_bytes_removed"] = m.gc_bytes_removed;
  d["gc_deferred"] = m.gc_deferred;
  d["pool_files"] = m.pool_files;
  d["pool_bytes"] = m.pool_bytes;
  d["gc_pins"] = m.gc_pins;
  d["retention_errors"] = m.retention_errors;
  d["retention_last_error"] = m.retention_last_error;
  py::list inst;
  for (const auto& i : m.instances) {
    py::dict e;
    e["operator_id"] = i.operator_id;
    e["instance"] = i.instance;
    e["last_committed"] = i.has_committed ? py::object(py::int_(i.last_committed)) : py::object(py::none());
    e["last_opened"] = i.last_opened;
    e["chain_version"] = i.chain_version;
    inst.append(e);
  }
  d["instances"] = inst;
  py::list hosted;
  for (const auto& h : m.hosted) {
    py::dict e;
    e["operator_id"] = h.operator_id;
    e["instance"] = h.instance;
    e["epoch"] = h.epoch;
    e["version"] = h.has_version ? py::object(py::int_(h.version)) : py::object(py::none());
    e["session_open"] = h.session_open;
    e["sessions_opened"] = h.sessions_opened;
    e["sessions_aborted"] = h.sessions_aborted;
    e["sessions_expired"] = h.sessions_expired;
    e["commits"] = h.commits;
    e["commit_failures"] = h.commit_failures;
    e["rollbacks"] = h.rollbacks;
    e["keys_written"] = h.keys_written;
    e["bytes_written"] = h.bytes_written;
    e["bytes_replicated"] = h.bytes_replicated;
    e["write_seconds"] = h.write_seconds;
    e["checkpoint_seconds"] = h.checkpoint_seconds;
    e["replicate_seconds"] = h.replicate_seconds;
    e["last_complete"] = h.has_complete ? py::object(py::int_(h.last_complete)) : py::object(py::none());
    e["replications_pending"] = h.replications_pending;
    e["vnodes"] = h.vnodes;
    hosted.append(e);
  }
  d["hosted"] = hosted;
  return d;
}

py::dict ProgressDict(const ReplicationProgress& p) {
  py::dict d;
  d["state"] = ReplicationStateName(p.state);
  d["bytes_sent"] = p.bytes_sent;
  d["bytes_total"] = p.bytes_total;
  d["files_sent"] = p.files_sent;
  d["files_total"] = p.files_total;
  d["credits"] = p.credits;
  d["in_flight_credits"] = p.in_flight;
  return d;
}

py::dict ResultDict(const ReplicationResult& r) {
  py::dict d;
  d["checkpoint_id"] = r.checkpoint_id;
  d["bytes_sent"] = r.bytes_sent;
  d["files_sent"] = r.files_sent;
  d["seconds"] = r.seconds;
  d["member_needed_files"] = r.member_needed_files;
  d["member_needed_bytes"] = r.member_needed_bytes;
  return d;
}

void BindWorkerClass(py::module_& m) {
  py::class_<PyWorker>(m, "Worker", R"doc(
One host's Rhino runtime: its replica store and the data-plane server that
takes part in replica chains (docs/protocol.md). start() binds and serves;
stop() aborts streams under way and closes connections; join() waits for stop.
)doc")
      .def(py::init([](const std::string& id, const std::string& store_dir, const std::string& listen_host,
                       uint16_t listen_port, const std::string& secret, uint32_t io_threads, uint32_t disk_threads,
                       uint32_t heartbeat_ms, uint32_t peer_timeout_ms, uint32_t max_frame_bytes,
                       uint32_t max_window, uint32_t stream_idle_timeout_ms, const std::string& state_dir,
                       const std::string& unix_socket, uint32_t service_threads, uint64_t max_session_bytes,
                       uint32_t replicate_timeout_ms, uint32_t session_idle_timeout_ms, uint32_t keep_checkpoints,
                       uint32_t retention_interval_ms, const std::string& tls_cert, const std::string& tls_key,
                       const std::string& tls_ca, uint32_t max_connections,
                       uint32_t max_unauthenticated_connections, uint32_t max_connections_per_peer,
                       uint32_t max_unauthenticated_per_peer, uint32_t max_instances,
                       uint32_t max_checkpoint_readers, uint32_t max_streams_per_connection,
                       uint64_t max_outbound_bytes, uint64_t base_copy_bytes_per_s) {
             auto w = std::make_unique<PyWorker>();
             WorkerOptions o;
             o.max_streams_per_connection = max_streams_per_connection;
             o.max_outbound_bytes = max_outbound_bytes;
             o.max_instances = max_instances;
             o.max_checkpoint_readers = max_checkpoint_readers;
             o.base_copy_bytes_per_s = base_copy_bytes_per_s;
             o.max_connections = max_connections;
             o.max_unauthenticated_connections = max_unauthenticated_connections;
             o.max_connections_per_peer = max_connections_per_peer;
             o.max_unauthenticated_per_peer = max_unauthenticated_per_peer;
             o.tls = TlsOf(tls_cert, tls_key, tls_ca);
             o.state_dir = state_dir;
             o.unix_socket = unix_socket;
             o.service_threads = service_threads;
             o.max_session_bytes = max_session_bytes;
             o.replicate_timeout_ms = replicate_timeout_ms;
             o.session_idle_timeout_ms = session_idle_timeout_ms;
             o.keep_checkpoints = keep_checkpoints;
             o.retention_interval_ms = retention_interval_ms;
             o.id = id;
             o.store_dir = store_dir;
             o.listen_host = listen_host;
             o.listen_port = listen_port;
             o.secret = secret;
             o.io_threads = io_threads;
             o.disk_threads = disk_threads;
             o.heartbeat_ms = heartbeat_ms;
             o.peer_timeout_ms = peer_timeout_ms;
             o.max_frame_bytes = max_frame_bytes;
             o.max_window = max_window;
             o.stream_idle_timeout_ms = stream_idle_timeout_ms;
             w->options = o;
             return w;
           }),
           py::kw_only(), py::arg("id"), py::arg("store_dir"), py::arg("listen_host") = "127.0.0.1",
           py::arg("listen_port") = 0, py::arg("secret"), py::arg("io_threads") = 1, py::arg("disk_threads") = 2,
           py::arg("heartbeat_ms") = 500, py::arg("peer_timeout_ms") = 3000,
           py::arg("max_frame_bytes") = kDefaultMaxFrameBytes, py::arg("max_window") = 64,
           py::arg("stream_idle_timeout_ms") = 60000, py::arg("state_dir") = "", py::arg("unix_socket") = "",
           py::arg("service_threads") = 4, py::arg("max_session_bytes") = 1ull << 30,
           py::arg("replicate_timeout_ms") = 60000, py::arg("session_idle_timeout_ms") = 600000,
           py::arg("keep_checkpoints") = 3, py::arg("retention_interval_ms") = 10000, py::arg("tls_cert") = "",
           py::arg("tls_key") = "", py::arg("tls_ca") = "", py::arg("max_connections") = kDefaultMaxConnections,
           py::arg("max_unauthenticated_connections") = kDefaultMaxUnauthenticatedConnections,
           py::arg("max_connections_per_peer") = kDefaultMaxConnectionsPerPeer,
           py::arg("max_unauthenticated_per_peer") = kDefaultMaxUnauthenticatedPerPeer,
           py::arg("max_instances") = kDefaultMaxInstances,
           py::arg("max_checkpoint_readers") = kDefaultMaxCheckpointReaders,
           py::arg("max_streams_per_connection") = kDefaultMaxStreamsPerConnection,
           py::arg("max_outbound_bytes") = kDefaultMaxOutboundBytes, py::arg("base_copy_bytes_per_s") = 256ull << 20)
      .def("start", [](PyWorker& w) {
             Status s;
             {
               py::gil_scoped_release release;
               s = w.worker->Start(w.options);
             }
             ThrowIfError(s);
           }, "Opens the store (cleaning stale staging), binds, listens and starts the threads.")
      .def("stop", [](PyWorker& w) {
             py::gil_scoped_release release;
             w.worker->Stop();
           }, "Aborts streams under way, closes connections, stops the threads. Idempotent.")
      .def("join", [](PyWorker& w) {
             py::gil_scoped_release release;
             w.worker->Join();
           }, "Blocks until the worker has stopped.")
      .def_property_readonly("port", [](const PyWorker& w) { return w.worker->port(); },
                             "The bound port (useful with listen_port=0).")
      .def_property_readonly("id", [](const PyWorker& w) { return w.options.id; })
      .def("metrics", [](const PyWorker& w) {
             // Without the GIL: it waits for each hosted instance's lock, which a
             // commit holds for its write and checkpoint (seconds for a big
             // batch), and the daemon's heartbeats to the coordinator are
             // Python threads that must keep running meanwhile.
             WorkerMetrics m;
             {
               py::gil_scoped_release release;
               m = w.worker->Metrics();
             }
             return MetricsDict(m);
           },
           "A snapshot of the worker's counters (bytes, streams, credits, checkpoint states, security).");
}

// The primary's side of chain replication (docs/protocol.md §4) and the
// store query, as Python calls.
void BindReplication(py::module_& m) {

  py::class_<PyReplication>(m, "ReplicationHandle", "A replication of one checkpoint down a chain, under way or done.")
      .def("progress", [](const PyReplication& r) { return ProgressDict(r.handle->Progress()); })
      .def_property_readonly("done", [](const PyReplication& r) { return r.handle->Done(); })
      .def("cancel", [](PyReplication& r) { r.handle->Cancel(); }, "Aborts the replication down the chain.")
      .def("wait", [](const PyReplication& r, std::optional<double> timeout) -> py::object {
             // Waits in slices with the GIL released, and between slices lets Python run its signal
             // handlers: a transfer of a large checkpoint can take minutes, and Ctrl-C or a SIGTERM
             // handler must not wait for it. The exception (KeyboardInterrupt, SystemExit) propagates;
             // the transfer goes on until the handle is dropped or cancelled.
             if (timeout && (std::isnan(*timeout) || *timeout < 0))
               ThrowIfError(Status::InvalidArgument("timeout must be a number of seconds >= 0, or None"));
             constexpr int64_t kSliceMs = 100;
             const bool bounded = timeout.has_value();
             const auto deadline = std::chrono::steady_clock::now() +
                                   std::chrono::milliseconds(bounded ? std::max<int64_t>(
                                                                           0, static_cast<int64_t>(*timeout * 1000.0))
                                                                     : 0);
             ReplicationResult res;
             for (;;) {
               int64_t slice = kSliceMs;
               if (bounded) {
                 const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                                       deadline - std::chrono::steady_clock::now())
                                       .count();
                 slice = std::clamp<int64_t>(left, 0, kSliceMs);
               }
               bool done;
               {
                 py::gil_scoped_release release;
                 done = r.handle->Wait(slice, &res);
               }
               if (done) break;
               if (PyErr_CheckSignals() != 0) throw py::error_already_set();
               if (bounded && std::chrono::steady_clock::now() >= deadline) return py::none();
             }
             ThrowIfError(res.status);
             return ResultDict(res);
           }, py::arg("timeout") = py::none(),
           "Waits for the end. Returns the result dict once the chain has committed (the checkpoint is "
           "complete), raises the mapped RhinoError if it failed, or returns None if `timeout` passed first. "
           "Signals are handled while it waits (Ctrl-C raises KeyboardInterrupt); the transfer itself stops "
           "only when the handle is cancelled or dropped.");

  m.def("replicate", [](const std::string& store_dir, const std::string& operator_id, uint32_t instance,
                        uint64_t checkpoint_id, const std::vector<std::string>& chain, uint64_t chain_version,
                        const std::string& secret, uint32_t chunk_bytes, uint32_t window, uint32_t timeout_ms,
                        uint32_t heartbeat_ms, uint32_t peer_timeout_ms, const std::string& client_id,
                        const std::string& tls_cert, const std::string& tls_key, const std::string& tls_ca,
                        const std::string& role, const std::string& scope, bool derived) {
          const Credential credential = CredentialOf(secret, role, scope, derived);
          ReplicateOptions o;
          ThrowIfError(net::MakeTlsContext(TlsOf(tls_cert, tls_key, tls_ca), &o.tls));
          o.chunk_bytes = chunk_bytes;
          o.window = window;
          o.timeout_ms = timeout_ms;
          o.heartbeat_ms = heartbeat_ms;
          o.peer_timeout_ms = peer_timeout_ms;
          o.client_id = client_id;
          auto r = std::make_unique<PyReplication>();
          Status s;
          {
            py::gil_scoped_release release;
            s = ReplicaStore::Open(store_dir, &r->store);
            if (s.ok()) {
              s = ReplicateCheckpoint(r->store.get(), operator_id, instance, checkpoint_id, chain, chain_version,
                                      credential, o, &r->handle);
            }
          }
          ThrowIfError(s);
          return r;
        }, py::arg("store_dir"), py::arg("operator_id"), py::arg("instance"), py::arg("checkpoint_id"),
        py::arg("chain"), py::kw_only(), py::arg("chain_version"), py::arg("secret"),
        py::arg("chunk_bytes") = 1u << 20, py::arg("window") = 16, py::arg("timeout_ms") = 30000,
        py::arg("heartbeat_ms") = 500, py::arg("peer_timeout_ms") = 3000, py::arg("client_id") = "primary",
        py::arg("tls_cert") = "", py::arg("tls_key") = "", py::arg("tls_ca") = "", py::arg("role") = "admin",
        py::arg("scope") = "", py::arg("derived") = false,
        "Starts replicating a checkpoint of the store at `store_dir` down `chain` ['host:port', ...].");

  m.def("query_store", [](const std::string& address, const std::string& secret, const std::string& operator_id,
                          uint32_t instance, uint32_t timeout_ms, const std::string& tls_cert,
                          const std::string& tls_key, const std::string& tls_ca, const std::string& role,
                          const std::string& scope, bool derived) {
          const Credential credential = CredentialOf(secret, role, scope, derived);
          std::vector<uint64_t> ids;
          net::TlsContext tls;
          ThrowIfError(net::MakeTlsContext(TlsOf(tls_cert, tls_key, tls_ca), &tls));
          Status s;
          {
            py::gil_scoped_release release;
            s = QueryStore(address, credential, operator_id, instance, timeout_ms, &ids, tls);
          }
          ThrowIfError(s);
          return ids;
        }, py::arg("address"), py::kw_only(), py::arg("secret"), py::arg("operator_id"), py::arg("instance"),
        py::arg("timeout_ms") = 5000, py::arg("tls_cert") = "", py::arg("tls_key") = "", py::arg("tls_ca") = "",
        py::arg("role") = "admin", py::arg("scope") = "", py::arg("derived") = false,
        "Committed checkpoint ids of an instance in the worker's replica store.");

}

}  // namespace

void BindWorker(py::module_& m) {
  m.def("credential_key", [](py::bytes root, const std::string& role, const std::string& scope) {
          PeerRole r = PeerRole::kAdmin;
          ThrowIfError(ParseRole(role, &r));
          ThrowIfError(CheckScope(r, scope));
          return py::bytes(CredentialKey(std::string(root), r, scope));
        }, py::arg("root"), py::arg("role"), py::arg("scope") = "",
        "The key of `role` with `scope`, derived from the cluster's root secret (docs/protocol.md §2, \"Roles\").");
  m.attr("MAX_FRAME_BYTES") = kDefaultMaxFrameBytes;
  m.attr("MAX_STREAMS_PER_CONNECTION") = kDefaultMaxStreamsPerConnection;
  m.attr("MAX_OUTBOUND_BYTES") = kDefaultMaxOutboundBytes;
  m.attr("MAX_CONNECTIONS") = kDefaultMaxConnections;
  m.attr("MAX_UNAUTHENTICATED_CONNECTIONS") = kDefaultMaxUnauthenticatedConnections;
  m.attr("MAX_CONNECTIONS_PER_PEER") = kDefaultMaxConnectionsPerPeer;
  m.attr("MAX_UNAUTHENTICATED_PER_PEER") = kDefaultMaxUnauthenticatedPerPeer;
  m.attr("MAX_INSTANCES") = kDefaultMaxInstances;
  m.attr("MAX_CHECKPOINT_READERS") = kDefaultMaxCheckpointReaders;
  m.attr("FRAME_HEADER_BYTES") = kFrameHeaderBytes;
  BindWorkerClass(m);
  BindReplication(m);
}

}  // namespace rhino::py_bindings
