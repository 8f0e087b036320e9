// Bindings of the state client (rhino/client/): _core.StateClient (which
// also speaks to the coordinator: coord) and _core.ClientSession. Every call
// that waits on the network releases the GIL.
// A handle is safe against a close from another thread: calls on one session
// are serialized by its mutex, and a client closed under a call fails that
// call with a RhinoError instead of freeing what it uses.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstring>
#include <mutex>

#include "arrow_buffers.h"
#include "bind_common.h"
#include "buffers.h"
#include "client/state_client.h"
#include "errors.h"

namespace py = pybind11;

namespace rhino::py_bindings {
namespace {

struct PyClient {
  std::shared_ptr<StateClient> client;
  std::mutex mu;  // guards `client` against close
  std::shared_ptr<StateClient> get() {
    std::lock_guard<std::mutex> l(mu);
    if (!client) throw StatusError{Status::Aborted("the state client is closed")};
    return client;
  }
};

struct PySession {
  std::unique_ptr<ClientSession> session;
  std::shared_ptr<StateClient> client;  // keeps the connection's owner alive
  std::mutex mu;                        // one call at a time; close waits for it
  ClientSession& get() {
    if (!session) throw StatusError{Status::Aborted("the session is closed")};
    return *session;
  }
};

// Values received for a Get: found[i] and value[i], a view into one of the
// answer frames kept in `frames` (no copy until the Python objects are built).
struct Received {
  std::vector<uint8_t> found;
  std::vector<std::string_view> value;
  std::vector<std::shared_ptr<std::string>> frames;
};

void Fetch(PySession& s, py::handle keys, Received* r) {
  ByteViews k;
  k.LoadKeys(keys);
  const size_t n = k.size();
  r->found.assign(n, 0);
  r->value.assign(n, std::string_view());
  Status st;
  {
    py::gil_scoped_release release;
    std::lock_guard<std::mutex> l(s.mu);
    if (!s.session) {
      st = Status::Aborted("the session is closed");
    } else {
      st = s.session->Get(k.views(), [&](size_t i, bool found, std::string_view v,
                                         const std::shared_ptr<std::string>& frame) {
        r->found[i] = found;
        r->value[i] = v;
        if (r->frames.empty() || r->frames.back() != frame) r->frames.push_back(frame);
      });
    }
  }
  ThrowIfError(st);
}

// A checkpoint reader (docs/protocol.md §7.9): a ClientSession that takes no
// writes, with the checkpoint it reads and its vnodes.
py::tuple ReadCheckpoint(PyClient& h, const std::string& op, uint32_t instance, std::optional<uint64_t> checkpoint) {
  auto c = h.get();
  auto ps = std::make_shared<PySession>();
  ps->client = c;
  SessionOpenRsp info;
  Status s;
  {
    py::gil_scoped_release release;
    s = c->ReadCheckpoint(op, instance, checkpoint, &ps->session, &info);
  }
  ThrowIfError(s);
  return py::make_tuple(ps, info.checkpoint, info.vnodes);
}

}  // namespace

using SessionClass = py::class_<PySession, std::shared_ptr<PySession>>;

static void DefSessionWrites(SessionClass& cls) {
  cls
      .def("put_batch",
           [](PySession& s, py::handle keys, py::handle values) {
             ByteViews k, v;
             k.LoadKeys(keys);
             v.LoadValues(values);
             Status st;
             {
               py::gil_scoped_release release;
               std::lock_guard<std::mutex> l(s.mu);
               st = s.session ? s.session->Put(k.views(), v.views()) : Status::Aborted("the session is closed");
             }
             ThrowIfError(st);
           },
           py::arg("keys"), py::arg("values"))
      .def("delete_batch",
           [](PySession& s, py::handle keys) {
             ByteViews k;
             k.LoadKeys(keys);
             Status st;
             {
               py::gil_scoped_release release;
               std::lock_guard<std::mutex> l(s.mu);
               st = s.session ? s.session->Delete(k.views()) : Status::Aborted("the session is closed");
             }
             ThrowIfError(st);
           },
           py::arg("keys"));
}

static void DefSessionScanAndEnd(SessionClass& cls) {
  cls
      .def("_scan_page",
           [](PySession& s, std::optional<uint32_t> vnode, py::bytes prefix, std::optional<uint32_t> after_vnode,
              std::optional<py::bytes> after_key, uint32_t max_items) {
             ScanReq req;
             req.has_vnode = vnode.has_value();
             req.vnode = vnode.value_or(0);
             req.prefix = std::string(prefix);
             req.has_after = after_key.has_value();
             req.after_vnode = after_vnode.value_or(0);
             if (after_key) req.after_key = std::string(*after_key);
             req.max_items = max_items;
             ScanRsp rsp;
             std::shared_ptr<std::string> payload;
             Status st;
             {
               py::gil_scoped_release release;
               std::lock_guard<std::mutex> l(s.mu);
               st = s.session ? s.session->ScanPage(req, &rsp, &payload) : Status::Aborted("the session is closed");
             }
             ThrowIfError(st);
             py::list ks(rsp.keys.size()), vs(rsp.values.size());
             for (size_t i = 0; i < rsp.keys.size(); ++i) {
               ks[i] = py::bytes(rsp.keys[i].data(), rsp.keys[i].size());
               vs[i] = py::bytes(rsp.values[i].data(), rsp.values[i].size());
             }
             return py::make_tuple(ks, vs, rsp.done, rsp.last_vnode);
           },
           py::arg("vnode"), py::arg("prefix"), py::arg("after_vnode"), py::arg("after_key"), py::arg("max_items"))
      .def("commit",
           [](PySession& s, const std::string& mode, std::optional<int64_t> batch_time_ms) {
             CommitMode m;
             if (mode == "barrier") {
               m = CommitMode::kBarrier;
             } else if (mode == "async") {
               m = CommitMode::kAsync;
             } else {
               throw StatusError{Status::InvalidArgument("commit mode must be 'barrier' or 'async', not '" + mode + "'")};
             }
             SessionCommitRsp rsp;
             Status st;
             {
               py::gil_scoped_release release;
               std::lock_guard<std::mutex> l(s.mu);
               st = s.session ? s.session->Commit(m, batch_time_ms, &rsp) : Status::Aborted("the session is closed");
             }
             ThrowIfError(st);
             return py::make_tuple(rsp.version, rsp.stats);
           },
           py::arg("mode") = "barrier", py::kw_only(), py::arg("batch_time_ms") = py::none())
      .def("abort",
           [](PySession& s, const std::string& reason) {
             py::gil_scoped_release release;
             std::lock_guard<std::mutex> l(s.mu);
             if (s.session) s.session->Abort(reason).ok();
           },
           py::arg("reason") = "aborted by the client")
      .def_property_readonly("open",
                             [](PySession& s) {
                               std::lock_guard<std::mutex> l(s.mu);
                               return s.session != nullptr && s.session->open();
                             })
      .def_property_readonly("batch", [](PySession& s) { return s.get().batch(); });
}

// Pipelined scans (one round trip for many (vnode, prefix) pages) and the
// session's round-trip count.
static void DefSessionScanMany(SessionClass& cls) {
  cls.def("scan_many",
          [](PySession& s, const std::vector<std::pair<std::optional<uint32_t>, py::bytes>>& items,
             uint32_t max_items) {
            std::vector<ScanReq> reqs(items.size());
            for (size_t i = 0; i < items.size(); ++i) {
              reqs[i].has_vnode = items[i].first.has_value();
              reqs[i].vnode = items[i].first.value_or(0);
              reqs[i].prefix = std::string(items[i].second);
              reqs[i].max_items = max_items;
            }
            std::vector<ScanRsp> rsps;
            std::vector<std::shared_ptr<std::string>> payloads;
            Status st;
            {
              py::gil_scoped_release release;
              std::lock_guard<std::mutex> l(s.mu);
              st = s.session ? s.session->ScanMany(reqs, &rsps, &payloads) : Status::Aborted("the session is closed");
            }
            ThrowIfError(st);
            py::list out(rsps.size());
            for (size_t i = 0; i < rsps.size(); ++i) {
              py::list entries(rsps[i].keys.size());
              for (size_t j = 0; j < rsps[i].keys.size(); ++j) {
                entries[j] = py::make_tuple(py::bytes(rsps[i].keys[j].data(), rsps[i].keys[j].size()),
                                            py::bytes(rsps[i].values[j].data(), rsps[i].values[j].size()));
              }
              out[i] = py::make_tuple(entries, rsps[i].done);
            }
            return out;
          },
          py::arg("items"), py::arg("max_items"),
          "One page of each (vnode, prefix) scan, all in one round trip: [(entries, done), ...].")
      .def_property_readonly("round_trips", [](PySession& s) {
        std::lock_guard<std::mutex> l(s.mu);
        return s.session ? s.session->round_trips() : uint64_t{0};
      });
}

static void BindStateClientClass(py::module_& m) {
  py::class_<PyClient, std::shared_ptr<PyClient>>(m, "StateClient",
                                                 "A connection to a worker's state service (rhino.connect).")
      .def_static(
          "connect",
          [](const std::string& address, py::bytes secret, const std::string& client_id, uint32_t max_frame_bytes,
             uint32_t peer_timeout_ms, uint32_t request_timeout_ms, const std::string& local_bind_host,
             const std::string& tls_cert, const std::string& tls_key, const std::string& tls_ca,
             const std::string& role, const std::string& scope, bool derived) {
            StateClientOptions o;
            o.credential = CredentialOf(std::string(secret), role, scope, derived);
            o.client_id = client_id;
            o.max_frame_bytes = max_frame_bytes;
            o.peer_timeout_ms = peer_timeout_ms;
            o.heartbeat_ms = std::max<uint32_t>(1, std::min<uint32_t>(500, peer_timeout_ms / 3));
            o.request_timeout_ms = request_timeout_ms;
            o.local_bind_host = local_bind_host;
            o.tls = TlsOf(tls_cert, tls_key, tls_ca);
            auto h = std::make_shared<PyClient>();
            Status s;
            {
              py::gil_scoped_release release;
              s = StateClient::Connect(address, o, &h->client);
            }
            ThrowIfError(s);
            return h;
          },
          py::arg("address"), py::arg("secret"), py::arg("client_id") = "client",
          py::arg("max_frame_bytes") = kDefaultMaxFrameBytes, py::arg("peer_timeout_ms") = 3000,
          py::arg("request_timeout_ms") = 120000, py::arg("local_bind_host") = "", py::arg("tls_cert") = "",
          py::arg("tls_key") = "", py::arg("tls_ca") = "", py::arg("role") = "admin", py::arg("scope") = "",
          py::arg("derived") = false)
      .def("instance",
           [](PyClient& h, const std::string& action, const std::string& op, uint32_t instance, uint64_t epoch,
              const std::string& args) {
             InstanceAction a;
             ThrowIfError(ParseInstanceAction(action, &a));
             auto c = h.get();
             std::string result;
             Status s;
             {
               py::gil_scoped_release release;
               s = c->Instance(a, op, instance, epoch, args, &result);
             }
             ThrowIfError(s);
             return result;
           },
           py::arg("action"), py::arg("operator_id"), py::arg("instance"), py::arg("epoch"), py::arg("args") = "{}",
           "An instance request (docs/protocol.md §7.1); returns its JSON answer.")
      .def("coord",
           [](PyClient& h, const std::string& method, const std::string& args) {
             auto c = h.get();
             std::string result;
             Status s;
             {
               py::gil_scoped_release release;
               s = c->Coord(method, args, &result);
             }
             ThrowIfError(s);
             return result;
           },
           py::arg("method"), py::arg("args_json"),
           "A coordinator request (docs/protocol.md §8): method ([a-z_]{1,64}) and a JSON document; returns the "
           "answer's JSON, or raises the rhino error of its code.")
      .def("open_session",
           [](PyClient& h, const std::string& op, uint32_t instance, uint64_t batch, uint64_t epoch,
              std::optional<uint64_t> attempt, std::optional<uint64_t> committed) {
             auto c = h.get();
             auto ps = std::make_shared<PySession>();
             ps->client = c;
             SessionOpenRsp info;
             Status s;
             {
               py::gil_scoped_release release;
               s = c->OpenSession(op, instance, batch, epoch, &ps->session, &info, attempt, committed);
             }
             ThrowIfError(s);
             py::object version = info.has_version ? py::object(py::int_(info.version)) : py::object(py::none());
             return py::make_tuple(ps, version, info.rolled_back);
           },
           py::arg("operator_id"), py::arg("instance"), py::arg("batch"), py::arg("epoch"),
           py::arg("attempt") = py::none(), py::arg("committed") = py::none(),
           "Opens a session: (session, version it sees or None, whether the worker rolled back). attempt: the "
           "token begin_batch gave the attempt, committed: the operator's last committed batch then (the "
           "attempt fence, docs/protocol.md §7.2).")
      .def("read_checkpoint", &ReadCheckpoint, py::arg("operator_id"), py::arg("instance"), py::arg("checkpoint"),
           "Opens a checkpoint reader: (read-only session, checkpoint id, vnodes).")
      .def("close",
           [](PyClient& h) {
             std::shared_ptr<StateClient> c;
             {
               std::lock_guard<std::mutex> l(h.mu);
               c = std::move(h.client);
             }
             if (c) {
               py::gil_scoped_release release;
               c->Close();
             }
           })
      .def_property_readonly("is_open",
                             [](PyClient& h) {
                               std::lock_guard<std::mutex> l(h.mu);
                               return h.client != nullptr && h.client->is_open();
                             })
      .def_property_readonly("is_unix", [](PyClient& h) { return h.get()->is_unix(); })
      .def_property_readonly("address", [](PyClient& h) { return h.get()->address(); })
      .def_property_readonly("max_frame_bytes", [](PyClient& h) { return h.get()->max_frame_bytes(); });
}

static void BindClientSession(py::module_& m) {
  auto cls = py::class_<PySession, std::shared_ptr<PySession>>(m, "ClientSession", "One session (rhino.client.Session).")
      .def("get_batch",
           [](PySession& s, py::handle keys) {
             Received r;
             Fetch(s, keys, &r);
             const size_t n = r.found.size();
             py::list out(n);
             for (size_t i = 0; i < n; ++i) {
               if (r.found[i]) {
                 PyObject* b = PyBytes_FromStringAndSize(r.value[i].data(), static_cast<Py_ssize_t>(r.value[i].size()));
                 if (b == nullptr) throw py::error_already_set();
                 PyList_SET_ITEM(out.ptr(), static_cast<Py_ssize_t>(i), b);
               } else {
                 PyList_SET_ITEM(out.ptr(), static_cast<Py_ssize_t>(i), Py_NewRef(Py_None));
               }
             }
             return out;
           },
           py::arg("keys"))
      .def("get_batch_array",
           [](PySession& s, py::handle keys, size_t width) {
             Received r;
             Fetch(s, keys, &r);
             const auto n = static_cast<py::ssize_t>(r.found.size());
             py::array_t<uint8_t> out({n, static_cast<py::ssize_t>(width)});
             py::array_t<bool> mask(n);
             uint8_t* o = out.mutable_data();
             bool* f = mask.mutable_data();
             for (py::ssize_t i = 0; i < n; ++i) {
               f[i] = r.found[i] != 0;
               if (!f[i]) {
                 std::memset(o + i * width, 0, width);
                 continue;
               }
               if (r.value[i].size() != width) {
                 throw StatusError{Status::InvalidArgument("value " + std::to_string(i) + " has " +
                                                           std::to_string(r.value[i].size()) + " bytes, not width " +
                                                           std::to_string(width))};
               }
               std::memcpy(o + i * width, r.value[i].data(), width);
             }
             return py::make_tuple(out, mask);
           },
           py::arg("keys"), py::arg("width"))
      .def("get_batch_arrow",
           [](PySession& s, py::handle keys, std::optional<bool> large) {
             Received r;
             Fetch(s, keys, &r);
             return ViewsToArrow(r.found, r.value, large);
           },
           py::arg("keys"), py::kw_only(), py::arg("large") = py::none());
  DefSessionWrites(cls);
  DefSessionScanAndEnd(cls);
  DefSessionScanMany(cls);
}

void BindService(py::module_& m) {
  BindStateClientClass(m);
  BindClientSession(m);
}

}  // namespace rhino::py_bindings
