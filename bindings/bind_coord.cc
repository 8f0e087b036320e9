// Bindings of the coordinator's transport (docs/protocol.md §8):
// _core.CoordServer, which calls a Python handler for every CoordReq.
// (The client side is _core.StateClient.coord, in bind_service.cc.)
//
// GIL rules. The handler runs on the server's own threads and takes the GIL
// for the call. So every wait for those threads (close(), the destructor, the
// interpreter's exit) happens with the GIL released, and close() refuses to
// run inside a handler, which would wait for itself. A handler's exception
// never escapes: it becomes the answer's code and message.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "bind_common.h"
#include "coordinator/coord_server.h"
#include "errors.h"

namespace py = pybind11;

namespace rhino::py_bindings {
namespace {

struct PyCoordServer {
  std::mutex close_mu;  // held, without the GIL, for the whole of a close: a second close waits for it
  std::mutex mu;        // guards `server` and `final_metrics` for a few instructions at a time
  std::shared_ptr<CoordServer> server;  // GUARDED_BY(mu); null once closed
  CoordServerMetrics final_metrics;     // GUARDED_BY(mu); what metrics() reports after close
  std::string host;
  uint16_t port = 0;
  std::string address;

  std::shared_ptr<CoordServer> get() {
    std::lock_guard<std::mutex> l(mu);
    return server;
  }

  // Call without the GIL: the handlers under way may need it to finish.
  void Close() {
    std::lock_guard<std::mutex> c(close_mu);
    std::shared_ptr<CoordServer> s = get();
    if (!s) return;
    s->Shutdown();
    std::lock_guard<std::mutex> l(mu);
    final_metrics = s->Metrics();
    server.reset();
    // `s` goes last, here: with it the handler, whose Python callable is
    // released under the GIL (HandlerHolder).
  }

  ~PyCoordServer() {
    std::shared_ptr<CoordServer> s = get();
    if (!s) return;
    if (s->InHandlerThread()) {
      // The last reference went inside a handler of this very server: it
      // cannot wait for its own thread, so another thread closes it once this
      // handler has returned.
      std::thread([s = std::move(s)]() mutable {
        s->Shutdown();
        s.reset();
      }).detach();
      return;
    }
    s.reset();
    py::gil_scoped_release release;  // pybind11 deallocates with the GIL held
    Close();
  }
};

// Servers not closed yet, for the interpreter's exit (CloseAllAtExit).
std::mutex g_live_mu;
std::vector<std::weak_ptr<PyCoordServer>> g_live;  // GUARDED_BY(g_live_mu)

// Registered with atexit: a handler thread that asks for the GIL while the
// interpreter finalizes would be stopped in the middle of a C++ frame, so
// every server still open is closed first, while Python still runs.
void CloseAllAtExit() {
  std::vector<std::shared_ptr<PyCoordServer>> live;
  {
    std::lock_guard<std::mutex> l(g_live_mu);
    for (auto& w : g_live)
      if (auto s = w.lock()) live.push_back(std::move(s));
    g_live.clear();
  }
  py::gil_scoped_release release;
  for (auto& s : live) s->Close();
}

// The Python callable, released under the GIL whichever thread drops it (the
// server's destructor runs without it).
struct HandlerHolder {
  py::object fn;
  ~HandlerHolder() {
    py::gil_scoped_acquire gil;
    fn = py::object();
  }
};

// A handler exception as an answer: the code of its class in the one error
// table (bindings/errors.cc); the message alone for a Rhino error, which is
// meant to be read, and prefixed by the class name for any other exception,
// which is a bug in the handler and should say so.
Status FromHandlerException(py::error_already_set& e) {
  bool mapped = false;
  Status::Code code = Status::Code::kIOError;
  std::string text, type_name = "exception";
  try {
    code = StatusCodeOfException(e.value(), &mapped);
    type_name = py::str(py::type::handle_of(e.value()).attr("__name__")).cast<std::string>();
    text = py::str(e.value()).cast<std::string>();
  } catch (py::error_already_set&) {
    // str() itself raised: the class name still says what went wrong.
  }
  if (!mapped) text = text.empty() ? type_name : type_name + ": " + text;
  return Status::FromCode(static_cast<uint32_t>(code), std::move(text));
}

// (code, message, result_json) from the handler as a Status and a result.
Status FromHandlerResult(const py::object& r, std::string* result) {
  if (!py::isinstance<py::tuple>(r) || py::len(r) != 3) {
    std::string shown = py::repr(r).cast<std::string>().substr(0, 200);
    return Status::IOError("TypeError: the coordinator's handler must return (code, message, result_json), got " +
                           shown);
  }
  py::tuple t = py::reinterpret_borrow<py::tuple>(r);
  int64_t code = t[0].cast<int64_t>();
  if (code < 0 || code > 0xffffffffLL) {
    return Status::IOError("ValueError: the coordinator's handler returned code " + std::to_string(code));
  }
  if (code != 0) {
    return Status::FromCode(static_cast<uint32_t>(code), t[1].is_none() ? "" : t[1].cast<std::string>());
  }
  if (!t[2].is_none()) *result = t[2].cast<std::string>();
  return Status::OK();
}

// with_caller: the handler also gets (role, scope, peer_id, address), who the
// caller proved to be in the handshake (protocol §2, "Roles").
CoordHandler MakeHandler(py::object fn, bool with_caller) {
  auto holder = std::make_shared<HandlerHolder>();
  holder->fn = std::move(fn);
  return [holder, with_caller](const std::string& method, const std::string& args, const PeerIdentity& caller,
                               std::string* result) -> Status {
    py::gil_scoped_acquire gil;
    try {
      py::object r = with_caller ? holder->fn(py::str(method), py::str(args),
                                              py::make_tuple(RoleName(caller.role), caller.scope,
                                                             py::bytes(caller.id), caller.address))
                                 : holder->fn(py::str(method), py::str(args));
      return FromHandlerResult(r, result);
    } catch (py::error_already_set& e) {
      return FromHandlerException(e);
    } catch (const py::cast_error& e) {  // a result tuple of the wrong types
      return Status::IOError(std::string("TypeError: the coordinator's handler returned ") + e.what());
    }
  };
}

py::dict MetricsDict(const CoordServerMetrics& m) {
  py::dict d;
  d["frames_in"] = m.frames_in;
  d["frames_out"] = m.frames_out;
  d["bytes_in"] = m.bytes_in;
  d["bytes_out"] = m.bytes_out;
  d["frames_rejected"] = m.frames_rejected;
  d["auth_failures"] = m.auth_failures;
  d["tls_failures"] = m.tls_failures;
  d["peers_dead"] = m.peers_dead;
  d["open_connections"] = m.open_connections;
  d["reads_paused"] = m.reads_paused;
  d["outbound_bytes"] = m.outbound_bytes;
  d["connections_accepted"] = m.connections_accepted;
  d["connections_refused"] = m.connections_refused;
  d["requests"] = m.requests;
  d["requests_failed"] = m.requests_failed;
  d["requests_refused"] = m.requests_refused;
  d["handlers_running"] = m.handlers_running;
  d["requests_queued"] = m.requests_queued;
  return d;
}

}  // namespace

void BindCoord(py::module_& m) {
  py::module_::import("atexit").attr("register")(py::cpp_function(&CloseAllAtExit));

  py::class_<PyCoordServer, std::shared_ptr<PyCoordServer>>(m, "CoordServer", R"doc(
The coordinator's transport (docs/protocol.md §8): listens on host:port,
authenticates every connection with the shared secret as a worker does, and
calls handler(method, args_json) -> (code, message, result_json) for every
CoordReq, on one of `threads` handler threads with the GIL held; code 0 is ok.
With with_caller=True it is called handler(method, args_json, caller) instead,
caller = (role, scope, peer_id: bytes, address): who the connection proved to be
in the handshake (docs/protocol.md §2, "Roles"), for the handler to decide what
that role may ask.
The methods in lane_methods (the liveness lane) have `lane_threads` threads of
their own and never queue behind the others.
An exception from the handler answers the code of its rhino error class (from
the one error table), or IOError with "TypeName: message" for any other.
close() lets the handlers under way finish, then closes every connection.
)doc")
      .def(py::init([](const std::string& host, uint16_t port, py::bytes secret, py::object handler,
                       const std::string& server_id, uint32_t threads, uint32_t max_frame_bytes,
                       uint32_t heartbeat_ms, uint32_t peer_timeout_ms, const std::string& tls_cert,
                       const std::string& tls_key, const std::string& tls_ca, uint32_t max_connections,
                       uint32_t max_unauthenticated_connections, uint32_t max_connections_per_peer,
                       uint32_t max_unauthenticated_per_peer, std::vector<std::string> lane_methods,
                       uint32_t lane_threads, bool with_caller) {
             if (!PyCallable_Check(handler.ptr())) throw py::type_error("handler must be callable");
             CoordServerOptions o;
             o.max_connections = max_connections;
             o.max_unauthenticated_connections = max_unauthenticated_connections;
             o.max_connections_per_peer = max_connections_per_peer;
             o.max_unauthenticated_per_peer = max_unauthenticated_per_peer;
             o.host = host;
             o.port = port;
             o.secret = std::string(secret);
             o.server_id = server_id;
             o.threads = threads;
             o.lane_methods = std::move(lane_methods);
             o.lane_threads = lane_threads;
             o.max_frame_bytes = max_frame_bytes;
             o.heartbeat_ms = heartbeat_ms;
             o.peer_timeout_ms = peer_timeout_ms;
             o.tls = TlsOf(tls_cert, tls_key, tls_ca);
             CoordHandler h = MakeHandler(std::move(handler), with_caller);
             std::unique_ptr<CoordServer> server;
             Status s;
             {
               // Without the GIL: on failure the handler, and with it the
               // callable, is dropped in there (HandlerHolder takes the GIL).
               py::gil_scoped_release release;
               s = CoordServer::Start(o, std::move(h), &server);
             }
             ThrowIfError(s);
             auto p = std::make_shared<PyCoordServer>();
             p->host = server->host();
             p->port = server->port();
             p->address = server->address();
             p->server = std::move(server);
             std::lock_guard<std::mutex> l(g_live_mu);
             g_live.erase(std::remove_if(g_live.begin(), g_live.end(), [](const auto& w) { return w.expired(); }),
                          g_live.end());
             g_live.push_back(p);
             return p;
           }),
           py::arg("host"), py::arg("port"), py::arg("secret"), py::arg("handler"), py::kw_only(),
           py::arg("server_id") = "coordinator", py::arg("threads") = 4,
           py::arg("max_frame_bytes") = kDefaultMaxFrameBytes, py::arg("heartbeat_ms") = 500,
           py::arg("peer_timeout_ms") = 3000, py::arg("tls_cert") = "", py::arg("tls_key") = "",
           py::arg("tls_ca") = "", py::arg("max_connections") = kDefaultMaxConnections,
           py::arg("max_unauthenticated_connections") = kDefaultMaxUnauthenticatedConnections,
           py::arg("max_connections_per_peer") = kDefaultMaxConnectionsPerPeer,
           py::arg("max_unauthenticated_per_peer") = kDefaultMaxUnauthenticatedPerPeer,
           py::arg("lane_methods") = std::vector<std::string>{}, py::arg("lane_threads") = 1,
           py::arg("with_caller") = false)
      .def_property_readonly("port", [](PyCoordServer& h) { return h.port; })
      .def_property_readonly("host", [](PyCoordServer& h) { return h.host; })
      .def_property_readonly("address", [](PyCoordServer& h) { return h.address; }, "\"host:port\"")
      .def_property_readonly("closed", [](PyCoordServer& h) { return h.get() == nullptr; })
      .def("metrics",
           [](PyCoordServer& h) {
             auto s = h.get();
             if (s) return MetricsDict(s->Metrics());
             std::lock_guard<std::mutex> l(h.mu);
             return MetricsDict(h.final_metrics);
           },
           "Counters of the connections and requests (after close: as they were then).")
      .def("close",
           [](PyCoordServer& h) {
             auto s = h.get();
             if (s && s->InHandlerThread()) {
               throw StatusError{Status::InvalidArgument(
                   "CoordServer.close() called from inside its own handler (it would wait for itself)")};
             }
             s.reset();
             py::gil_scoped_release release;
             h.Close();
           },
           "Stops serving: lets the handlers under way finish, answers queued requests Aborted, closes the "
           "connections. Idempotent; waits with the GIL released.")
      .def("__enter__", [](std::shared_ptr<PyCoordServer> h) { return h; })
      .def("__exit__", [](PyCoordServer& h, py::args) {
        auto s = h.get();
        if (s && s->InHandlerThread()) {
          throw StatusError{Status::InvalidArgument(
              "CoordServer.close() called from inside its own handler (it would wait for itself)")};
        }
        s.reset();
        py::gil_scoped_release release;
        h.Close();
      });
}

}  // namespace rhino::py_bindings
