#include "service/state_service.h"

#include <future>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>

#include "rhino/manifest.h"
#include "rhino/state_client.h"
#include "util/fs.h"

namespace rhino {
namespace {

using json = nlohmann::json;

std::string Describe(const std::string& op, uint32_t instance) { return op + "/" + std::to_string(instance); }

// The request's JSON arguments; InvalidArgument names the field at fault.
Status ParseArgs(const std::string& text, json* out) {
  if (text.empty()) {
    *out = json::object();
    return Status::OK();
  }
  try {
    *out = json::parse(text);
  } catch (const std::exception& e) {
    return Status::InvalidArgument(std::string("the request's arguments are not JSON: ") + e.what());
  }
  if (!out->is_object()) return Status::InvalidArgument("the request's arguments are not a JSON object");
  return Status::OK();
}

template <typename T>
Status Arg(const json& args, const char* name, T* out, bool required) {
  auto it = args.find(name);
  if (it == args.end() || it->is_null()) {
    return required ? Status::InvalidArgument(std::string("missing argument '") + name + "'") : Status::OK();
  }
  try {
    *out = it->get<T>();
  } catch (const std::exception& e) {
    return Status::InvalidArgument(std::string("argument '") + name + "' has the wrong type: " + e.what());
  }
  return Status::OK();
}

json InfoJson(HostedInstance& inst) {
  InstanceMetrics m = inst.Metrics();
  const InstanceConfig& c = inst.config();
  json j{{"operator_id", c.operator_id},
         {"instance", c.instance},
         {"epoch", c.epoch},
         {"version", m.has_version ? json(m.version) : json(nullptr)},
         {"vnodes", c.vnodes},
         {"num_key_groups", c.partitioner.num_key_groups},
         {"num_vnodes", c.partitioner.num_vnodes},
         {"seed", c.partitioner.seed},
         {"chain", c.chain},
         {"chain_version", c.chain_version},
         {"session_open", m.session_open},
         {"last_complete", m.has_complete ? json(m.last_complete) : json(nullptr)},
         {"replications_pending", m.replications_pending},
         {"db_name", c.db_name}};
  return j;
}

}  // namespace

// ---------------------------------------------------------------- sessions

class StateService::SessionStream : public net::StreamListener,
                                    public std::enable_shared_from_this<StateService::SessionStream> {
 public:
  SessionStream(StateService* svc, const std::shared_ptr<net::Connection>& conn, uint32_t stream_id,
                std::shared_ptr<HostedInstance> inst, uint64_t token)
      : svc_(svc), conn_(conn), stream_id_(stream_id), inst_(std::move(inst)), token_(token) {}

  void OnFrame(const FrameHeader& h, std::shared_ptr<std::string> payload) override {
    auto self = shared_from_this();
    asio::post(inst_->strand(), [self, h, payload]() { self->Handle(h, *payload); });
  }

  void OnConnectionClosed(const Status&) override {
    // The client died or went away: nothing of its session is visible.
    auto self = shared_from_this();
    asio::post(inst_->strand(), [self]() {
      std::lock_guard<std::mutex> l(self->inst_->mu());
      self->inst_->Abort(self->token_);
    });
  }

  // Runs the open on the instance's strand (the listener is attached already,
  // so frames the client pipelines after the open queue up behind it).
  void Open(const SessionOpenReq& req) {
    auto self = shared_from_this();
    asio::post(inst_->strand(), [self, req]() {
      SessionOpenRsp rsp;
      Status s;
      {
        std::lock_guard<std::mutex> l(self->inst_->mu());
        s = self->svc_->CheckEpoch(req.operator_id, req.instance, req.epoch);
        if (s.ok()) s = self->inst_->OpenSession(self->token_, req.batch, req.epoch, &rsp);
      }
      if (!s.ok()) {
        rsp = SessionOpenRsp();
        rsp.code = WireCode(s);
        rsp.message = s.message();
      }
      self->Send(MessageType::kSessionOpenRsp, rsp.Encode());
    });
  }

 private:
  void Send(MessageType type, std::string payload) {
    if (auto c = conn_.lock()) c->Send(type, stream_id_, 0, std::move(payload));
  }
  void Reply(MessageType rsp_type, const Status& s) { Send(rsp_type, ServiceErrorPayload(rsp_type, s)); }
  // A malformed frame closes the connection (protocol §1), which aborts the session.
  void Malformed(const char* what, const Status& s) {
    if (svc_->counters_ != nullptr) svc_->counters_->frames_rejected.fetch_add(1);
    if (auto c = conn_.lock()) c->CloseWithError(stream_id_, Status::Corruption(std::string("invalid ") + what + ": " + s.message()));
  }
  void End() {
    if (auto c = conn_.lock()) c->Detach(stream_id_);
  }

  void Handle(const FrameHeader& h, const std::string& payload) {
    HostedInstance& inst = *inst_;
    switch (h.type) {
      case MessageType::kGetReq: {
        GetReq req;
        Status s = GetReq::Decode(payload, &req);
        if (!s.ok()) return Malformed("GetReq", s);
        std::string out;
        {
          std::lock_guard<std::mutex> l(inst.mu());
          s = inst.CheckSession(token_);
          if (s.ok()) {
            const size_t budget = svc_->options_.max_frame_bytes;
            Status too_big;
            s = inst.session_batch()->MultiGetAll(
                req.keys, 0, [&](const std::vector<uint8_t>& found, const std::vector<std::string_view>& values) {
                  // Answer the longest prefix that fits in one frame; the client asks again for the rest.
                  size_t size = 16, count = 0;
                  for (; count < found.size(); ++count) {
                    const size_t add = 1 + (found[count] ? 4 + values[count].size() : 0);
                    if (size + add > budget) break;
                    size += add;
                  }
                  if (count == 0 && !found.empty()) {
                    too_big = Status::InvalidArgument("a value of " + std::to_string(values[0].size()) +
                                                      " bytes does not fit in a frame (max_frame_bytes)");
                    return;
                  }
                  out = EncodeGetRsp(found, values, count);
                });
            if (s.ok()) s = too_big;
            if (s.ok() && req.keys.empty()) out = EncodeGetRsp({}, {}, 0);
          }
        }
        if (!s.ok()) return Reply(MessageType::kGetRsp, s);
        return Send(MessageType::kGetRsp, std::move(out));
      }
      case MessageType::kWriteReq: {
        WriteReq req;
        Status s = WriteReq::Decode(payload, &req);
        if (!s.ok()) return Malformed("WriteReq", s);
        SessionRsp rsp;
        {
          std::lock_guard<std::mutex> l(inst.mu());
          s = inst.CheckSession(token_);
          uint64_t bytes = 0;
          for (auto k : req.keys) bytes += k.size();
          for (auto v : req.values) bytes += v.size();
          if (s.ok() && inst.session_batch()->bytes() + bytes > svc_->options_.max_session_bytes) {
            s = Status::InvalidArgument("the session would hold " +
                                        std::to_string(inst.session_batch()->bytes() + bytes) +
                                        " bytes of uncommitted writes, over the worker's limit of " +
                                        std::to_string(svc_->options_.max_session_bytes) +
                                        " (--max-session-bytes): commit smaller batches");
          }
          if (s.ok()) {
            if (req.op == static_cast<uint8_t>(WriteOp::kPut)) {
              s = inst.session_batch()->Put(req.keys, req.values);
            } else if (req.op == static_cast<uint8_t>(WriteOp::kDelete)) {
              s = req.values.empty() ? inst.session_batch()->Delete(req.keys)
                                     : Status::InvalidArgument("a delete carries no values");
            } else {
              s = Status::InvalidArgument("unknown write op " + std::to_string(req.op));
            }
          }
          rsp.count = req.keys.size();
        }
        if (!s.ok()) return Reply(MessageType::kSessionRsp, s);
        return Send(MessageType::kSessionRsp, rsp.Encode());
      }
      case MessageType::kScanReq: {
        ScanReq req;
        Status s = ScanReq::Decode(payload, &req);
        if (!s.ok()) return Malformed("ScanReq", s);
        std::string out;
        {
          std::lock_guard<std::mutex> l(inst.mu());
          s = inst.CheckSession(token_);
          if (s.ok()) {
            ScanRspBuilder b;
            const size_t budget = svc_->options_.max_frame_bytes;
            bool stopped = false;
            uint32_t last_vnode = req.after_vnode;
            Status too_big;
            s = inst.session_batch()->Scan(
                req.has_vnode ? std::optional<uint32_t>(req.vnode) : std::nullopt, req.prefix,
                req.has_after ? std::optional<uint32_t>(req.after_vnode) : std::nullopt,
                req.has_after ? std::optional<std::string_view>(req.after_key) : std::nullopt,
                [&](uint32_t v, std::string_view k, std::string_view val) {
                  if ((req.max_items != 0 && b.count() >= req.max_items) || b.SizeWith(k.size(), val.size()) > budget) {
                    if (b.count() == 0) too_big = Status::InvalidArgument("an entry of " + std::to_string(k.size() + val.size()) +
                                                                          " bytes does not fit in a frame");
                    stopped = true;
                    return false;
                  }
                  b.Add(k, val);
                  last_vnode = v;
                  return true;
                });
            if (s.ok()) s = too_big;
            if (s.ok()) out = b.Finish(!stopped, last_vnode);
          }
        }
        if (!s.ok()) return Reply(MessageType::kScanRsp, s);
        return Send(MessageType::kScanRsp, std::move(out));
      }
      case MessageType::kSessionCommitReq: {
        SessionCommitReq req;
        Status s = SessionCommitReq::Decode(payload, &req);
        if (!s.ok()) return Malformed("SessionCommitReq", s);
        if (req.mode > static_cast<uint8_t>(CommitMode::kAsync)) {
          return Reply(MessageType::kSessionCommitRsp, Status::InvalidArgument("unknown commit mode " + std::to_string(req.mode)));
        }
        auto self = shared_from_this();
        std::lock_guard<std::mutex> l(inst.mu());
        const std::string op = inst.config().operator_id;
        const uint32_t i = inst.config().instance;
        const uint64_t epoch = inst.config().epoch;
        StateService* svc = svc_;
        inst.Commit(token_, static_cast<CommitMode>(req.mode),
                    [svc, op, i, epoch]() { return svc->CheckEpoch(op, i, epoch); },
                    [self](const SessionCommitRsp& rsp) {
                      self->Send(MessageType::kSessionCommitRsp, rsp.Encode());
                      self->End();
                    });
        return;
      }
      case MessageType::kSessionAbortReq: {
        SessionAbortReq req;
        Status s = SessionAbortReq::Decode(payload, &req);
        if (!s.ok()) return Malformed("SessionAbortReq", s);
        {
          std::lock_guard<std::mutex> l(inst.mu());
          inst.Abort(token_);
        }
        Send(MessageType::kSessionRsp, SessionRsp().Encode());
        return End();
      }
      default:
        return Reply(MessageType::kSessionRsp,
                     Status::InvalidArgument(std::string("unexpected ") + MessageTypeName(h.type) + " on a session stream"));
    }
  }

  StateService* const svc_;
  std::weak_ptr<net::Connection> conn_;
  const uint32_t stream_id_;
  std::shared_ptr<HostedInstance> inst_;
  const uint64_t token_;
};

// ---------------------------------------------------------------- the service

StateService::StateService(ReplicaStore* store, net::ConnectionCounters* counters, const StateServiceOptions& options)
    : store_(store),
      counters_(counters),
      options_(options),
      epochs_(options.state_dir, "epoch"),
      pool_(std::max<uint32_t>(1, options.threads)),
      admin_(asio::make_strand(pool_.get_executor())) {
  env_.worker_id = options.worker_id;
  env_.state_dir = options.state_dir;
  env_.store = store;
  env_.secret = options.secret;
  env_.replicate = options.replicate;
  env_.replicate.client_id = options.worker_id;
  env_.discard_on_chain = [this](const InstanceConfig& c, std::optional<uint64_t> after) {
    return DiscardOnChain(c, after);
  };
}

StateService::~StateService() { Shutdown(); }

bool StateService::Handles(MessageType type) {
  // Protocol §7's types, 17..29, and no others: types added after them (the
  // coordinator's, §8) are not the service's, and the replica server refuses them.
  return static_cast<uint8_t>(type) >= static_cast<uint8_t>(MessageType::kInstanceReq) &&
         static_cast<uint8_t>(type) <= static_cast<uint8_t>(MessageType::kSessionAbortReq);
}

Status StateService::Start() {
  if (options_.state_dir.empty()) return Status::InvalidArgument("the state service needs a state directory");
  RHINO_RETURN_IF_ERROR(fs::MakeDirs(fs::Join(options_.state_dir, "instances")));
  fs::RemoveAll(fs::Join(options_.state_dir, "tmp"));  // imports and moves a killed worker left
  std::vector<std::string> ops;
  RHINO_RETURN_IF_ERROR(fs::ListDir(fs::Join(options_.state_dir, "instances"), &ops));
  for (const auto& op : ops) {
    std::vector<std::string> ids;
    if (!fs::ListDir(fs::Join(fs::Join(options_.state_dir, "instances"), op), &ids).ok()) continue;
    for (const auto& id : ids) {
      const std::string dir = fs::Join(fs::Join(fs::Join(options_.state_dir, "instances"), op), id);
      if (fs::Exists(fs::Join(dir, "CLOSED"))) continue;
      std::string text;
      if (!fs::ReadFile(fs::Join(dir, "instance.json"), &text).ok()) continue;
      InstanceConfig c;
      Status s = ParseInstanceConfig(text, &c);
      std::shared_ptr<HostedInstance> inst;
      if (s.ok()) s = HostedInstance::Open(env_, c, pool_, &inst);
      if (s.ok()) {
        std::lock_guard<std::mutex> l(inst->mu());
        s = inst->Recover();
      }
      if (!s.ok()) {
        // One damaged instance must not keep the worker from serving the others.
        std::fprintf(stderr, "rhino worker %s: cannot host %s/%s again: %s\n", options_.worker_id.c_str(), op.c_str(),
                     id.c_str(), s.ToString().c_str());
        continue;
      }
      std::lock_guard<std::mutex> l(mu_);
      instances_[{c.operator_id, c.instance}] = inst;
    }
  }
  if (options_.session_idle_timeout_ms > 0) sweeper_ = std::thread([this]() { SweepIdleSessions(); });
  return Status::OK();
}

void StateService::SweepIdleSessions() {
  const auto idle = std::chrono::milliseconds(options_.session_idle_timeout_ms);
  const auto tick = std::min<std::chrono::milliseconds>(idle / 4 + std::chrono::milliseconds(1),
                                                         std::chrono::milliseconds(1000));
  std::unique_lock<std::mutex> l(mu_);
  while (!stopped_) {
    sweep_cv_.wait_for(l, tick);
    if (stopped_) break;
    std::vector<std::shared_ptr<HostedInstance>> all;
    for (auto& [k, inst] : instances_) all.push_back(inst);
    l.unlock();
    for (auto& inst : all) {
      // On the instance's strand, in order with its session's frames.
      asio::post(inst->strand(), [inst, idle]() {
        std::lock_guard<std::mutex> g(inst->mu());
        inst->ExpireIdleSession(idle);
      });
    }
    l.lock();
  }
}

void StateService::Shutdown() {
  std::map<Key, std::shared_ptr<HostedInstance>> all;
  {
    std::lock_guard<std::mutex> l(mu_);
    if (stopped_) return;
    stopped_ = true;
    all.swap(instances_);
  }
  sweep_cv_.notify_all();
  if (sweeper_.joinable()) sweeper_.join();
  for (auto& [key, inst] : all) {
    std::lock_guard<std::mutex> l(inst->mu());
    inst->Close();
  }
  pool_.join();
}

std::shared_ptr<HostedInstance> StateService::Find(const std::string& op, uint32_t instance) {
  std::lock_guard<std::mutex> l(mu_);
  auto it = instances_.find({op, instance});
  return it == instances_.end() ? nullptr : it->second;
}

Status StateService::CheckEpoch(const std::string& op, uint32_t instance, uint64_t epoch) {
  Status s = epochs_.Check(op, instance, epoch);
  if (s.IsStaleChainVersion()) {
    return Status::StaleEpoch("worker " + options_.worker_id + ": " + s.message());
  }
  return s;
}

Status StateService::RaiseEpoch(const std::string& op, uint32_t instance, uint64_t epoch) {
  bool raised = false;
  Status s = epochs_.Observe(op, instance, epoch, &raised);
  if (s.IsStaleChainVersion()) {
    return Status::StaleEpoch("worker " + options_.worker_id + ": " + s.message());
  }
  return s;
}

Status StateService::DiscardOnChain(const InstanceConfig& config, std::optional<uint64_t> after) {
  StateClientOptions o;
  o.client_id = options_.worker_id;
  o.secret = options_.secret;
  o.max_frame_bytes = options_.max_frame_bytes;
  o.peer_timeout_ms = options_.peer_timeout_ms;
  o.request_timeout_ms = 30000;
  json args{{"after", after ? json(*after) : json(nullptr)}};
  for (const auto& member : config.chain) {
    std::shared_ptr<StateClient> c;
    std::string result;
    Status s = StateClient::Connect(member, o, &c);
    if (s.ok()) {
      s = c->Instance(InstanceAction::kDiscardAfter, config.operator_id, config.instance, config.epoch, args.dump(),
                      &result);
    }
    if (!s.ok()) {
      return Status::FromCode(WireCode(s), "cannot drop the re-executed checkpoints of " +
                                               Describe(config.operator_id, config.instance) + " on " + member +
                                               ": " + s.message());
    }
  }
  return Status::OK();
}

void StateService::Reject(const std::shared_ptr<net::Connection>& conn, const FrameHeader& h, const Status& why) {
  if (counters_ != nullptr) counters_->frames_rejected.fetch_add(1);
  conn->CloseWithError(h.stream_id, why);
}

std::shared_ptr<net::StreamListener> StateService::OnUnclaimed(const std::shared_ptr<net::Connection>& conn,
                                                               const FrameHeader& h,
                                                               std::shared_ptr<std::string> payload) {
  switch (h.type) {
    case MessageType::kInstanceReq: {
      InstanceReq req;
      Status s = InstanceReq::Decode(*payload, &req);
      if (!s.ok()) {
        Reject(conn, h, Status::Corruption("invalid InstanceReq: " + s.message()));
        return nullptr;
      }
      std::weak_ptr<net::Connection> weak = conn;
      const uint32_t sid = h.stream_id;
      asio::post(admin_, [this, weak, sid, req]() {
        if (auto c = weak.lock()) HandleInstanceReq(c, sid, req);
      });
      return nullptr;
    }
    case MessageType::kSessionOpenReq: {
      SessionOpenReq req;
      Status s = SessionOpenReq::Decode(*payload, &req);
      if (!s.ok()) {
        Reject(conn, h, Status::Corruption("invalid SessionOpenReq: " + s.message()));
        return nullptr;
      }
      std::shared_ptr<HostedInstance> inst = Find(req.operator_id, req.instance);
      if (!inst) {
        s = CheckEpoch(req.operator_id, req.instance, req.epoch);
        if (s.ok()) {
          s = Status::UnknownInstance("worker " + options_.worker_id + " does not host " +
                                      Describe(req.operator_id, req.instance));
        }
        conn->Send(MessageType::kSessionOpenRsp, h.stream_id, 0, ServiceErrorPayload(MessageType::kSessionOpenRsp, s));
        return nullptr;
      }
      auto stream = std::make_shared<SessionStream>(this, conn, h.stream_id, inst, next_token_.fetch_add(1));
      stream->Open(req);
      return stream;
    }
    case MessageType::kGetReq:
    case MessageType::kWriteReq:
    case MessageType::kScanReq:
    case MessageType::kSessionCommitReq:
    case MessageType::kSessionAbortReq: {
      // A frame on a stream whose session has ended (or never opened).
      MessageType rsp = h.type == MessageType::kGetReq        ? MessageType::kGetRsp
                        : h.type == MessageType::kScanReq     ? MessageType::kScanRsp
                        : h.type == MessageType::kSessionCommitReq ? MessageType::kSessionCommitRsp
                                                                   : MessageType::kSessionRsp;
      conn->Send(rsp, h.stream_id, 0,
                 ServiceErrorPayload(rsp, Status::Aborted("no open session on stream " + std::to_string(h.stream_id))));
      return nullptr;
    }
    default:
      // Answers (…Rsp) are never sent to a worker.
      Reject(conn, h, Status::Corruption(std::string("unexpected ") + MessageTypeName(h.type) + " sent to a worker"));
      return nullptr;
  }
}

void StateService::HandleInstanceReq(const std::shared_ptr<net::Connection>& conn, uint32_t stream_id,
                                     const InstanceReq& req) {
  InstanceRsp rsp;
  Status s = DoInstanceReq(req, &rsp.result);
  rsp.code = WireCode(s);
  rsp.message = s.message();
  if (!s.ok()) rsp.result.clear();
  conn->Send(MessageType::kInstanceRsp, stream_id, 0, rsp.Encode());
}

Status StateService::DoInstanceReq(const InstanceReq& req, std::string* result) {
  {
    std::lock_guard<std::mutex> l(mu_);
    if (stopped_) return Status::Aborted("worker " + options_.worker_id + " is shutting down");
  }
  const auto action = static_cast<InstanceAction>(req.action);
  if (action != InstanceAction::kList && !IsValidOperatorId(req.operator_id)) {
    return Status::InvalidArgument("invalid operator id '" + req.operator_id + "' (want [A-Za-z0-9_.-]{1,128})");
  }
  json args;
  RHINO_RETURN_IF_ERROR(ParseArgs(req.args, &args));
  const std::string& op = req.operator_id;
  const uint32_t i = req.instance;
  const std::string what = Describe(op, i);
  json out = json::object();
  switch (action) {
    case InstanceAction::kOpen: {
      PartitionerOptions p;
      std::vector<uint32_t> vnodes;
      std::vector<std::string> chain;
      uint64_t chain_version = 0;
      RHINO_RETURN_IF_ERROR(Arg(args, "num_key_groups", &p.num_key_groups, false));
      RHINO_RETURN_IF_ERROR(Arg(args, "num_vnodes", &p.num_vnodes, false));
      RHINO_RETURN_IF_ERROR(Arg(args, "seed", &p.seed, false));
      RHINO_RETURN_IF_ERROR(Arg(args, "vnodes", &vnodes, false));
      RHINO_RETURN_IF_ERROR(Arg(args, "chain", &chain, false));
      RHINO_RETURN_IF_ERROR(Arg(args, "chain_version", &chain_version, false));
      Partitioner check;
      RHINO_RETURN_IF_ERROR(Partitioner::Create(p, &check));
      for (uint32_t v : vnodes) {
        if (v >= p.num_vnodes) return Status::UnknownVnode("vnode " + std::to_string(v) + " is outside [0, " + std::to_string(p.num_vnodes) + ")");
      }
      RHINO_RETURN_IF_ERROR(RaiseEpoch(op, i, req.epoch));
      if (auto inst = Find(op, i)) {
        std::lock_guard<std::mutex> l(inst->mu());
        const auto& c = inst->config().partitioner;
        if (c.num_key_groups != p.num_key_groups || c.num_vnodes != p.num_vnodes || c.seed != p.seed) {
          return Status::InvalidArgument(what + " is hosted here with another partitioner");
        }
        RHINO_RETURN_IF_ERROR(inst->SetPlacement(req.epoch, chain, chain_version));
        out = InfoJson(*inst);
        break;
      }
      InstanceConfig c;
      const std::string dir = fs::Join(fs::Join(fs::Join(options_.state_dir, "instances"), op), std::to_string(i));
      std::string text;
      if (fs::ReadFile(fs::Join(dir, "instance.json"), &text).ok()) {
        RHINO_RETURN_IF_ERROR(ParseInstanceConfig(text, &c));  // hosted before, then closed: open its state
        if (c.partitioner.num_key_groups != p.num_key_groups || c.partitioner.num_vnodes != p.num_vnodes ||
            c.partitioner.seed != p.seed) {
          return Status::InvalidArgument(what + " has state here made with another partitioner");
        }
      } else {
        c.operator_id = op;
        c.instance = i;
        c.partitioner = p;
        c.vnodes = vnodes;
      }
      c.epoch = req.epoch;
      c.chain = chain;
      c.chain_version = chain_version;
      std::shared_ptr<HostedInstance> inst;
      RHINO_RETURN_IF_ERROR(HostedInstance::Open(env_, c, pool_, &inst));
      fs::RemoveAll(fs::Join(dir, "CLOSED"));
      {
        std::lock_guard<std::mutex> l(inst->mu());
        RHINO_RETURN_IF_ERROR(inst->Recover());
        out = InfoJson(*inst);
      }
      std::lock_guard<std::mutex> l(mu_);
      instances_[{op, i}] = inst;
      break;
    }
    case InstanceAction::kClose: {
      RHINO_RETURN_IF_ERROR(CheckEpoch(op, i, req.epoch));
      auto inst = Find(op, i);
      if (!inst) return Status::UnknownInstance("worker " + options_.worker_id + " does not host " + what);
      {
        std::lock_guard<std::mutex> l(inst->mu());
        if (inst->has_session()) return Status::SessionBusy(what + " has an open session");
        inst->Close();
        const std::string dir = fs::Join(fs::Join(fs::Join(options_.state_dir, "instances"), op), std::to_string(i));
        RHINO_RETURN_IF_ERROR(fs::WriteFileAtomic(fs::Join(dir, "CLOSED"), "closed\n"));
      }
      std::lock_guard<std::mutex> l(mu_);
      instances_.erase({op, i});
      break;
    }
    case InstanceAction::kTakeover: {
      std::vector<std::string> chain;
      uint64_t chain_version = 0;
      uint64_t checkpoint = 0;
      bool has_checkpoint = args.contains("checkpoint") && !args["checkpoint"].is_null();
      RHINO_RETURN_IF_ERROR(Arg(args, "chain", &chain, false));
      RHINO_RETURN_IF_ERROR(Arg(args, "chain_version", &chain_version, false));
      RHINO_RETURN_IF_ERROR(Arg(args, "checkpoint", &checkpoint, false));
      std::optional<uint64_t> redo_version;
      std::vector<ReconfigOp> redo;
      if (args.contains("redo_version") && !args["redo_version"].is_null()) {
        uint64_t rv = 0;
        RHINO_RETURN_IF_ERROR(Arg(args, "redo_version", &rv, true));
        redo_version = rv;
        if (args.contains("redo")) RHINO_RETURN_IF_ERROR(ParseReconfigOps(args["redo"].dump(), &redo));
      }
      if (!has_checkpoint) {
        std::vector<uint64_t> ids;
        RHINO_RETURN_IF_ERROR(store_->ListCheckpoints(op, i, &ids));
        if (ids.empty()) return Status::NotFound("worker " + options_.worker_id + " holds no checkpoint of " + what + " to take over");
        checkpoint = ids.back();
      }
      RHINO_RETURN_IF_ERROR(RaiseEpoch(op, i, req.epoch));
      InstanceConfig c;
      c.operator_id = op;
      c.instance = i;
      c.epoch = req.epoch;
      c.chain = chain;
      c.chain_version = chain_version;
      c.redo_version = redo_version;
      c.redo = redo;
      if (auto old = Find(op, i)) {
        // A stale hosting of the same instance here (e.g. before a restart): replaced.
        std::lock_guard<std::mutex> l(old->mu());
        c.db_name = old->config().db_name;
        old->Close();
        std::lock_guard<std::mutex> m(mu_);
        instances_.erase({op, i});
      }
      const auto t0 = std::chrono::steady_clock::now();
      std::shared_ptr<HostedInstance> inst;
      RestoreStats rs;
      RHINO_RETURN_IF_ERROR(HostedInstance::Takeover(env_, c, checkpoint, pool_, &inst, &rs));
      const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      const std::string dir = fs::Join(fs::Join(fs::Join(options_.state_dir, "instances"), op), std::to_string(i));
      fs::RemoveAll(fs::Join(dir, "CLOSED"));
      {
        std::lock_guard<std::mutex> l(inst->mu());
        out = InfoJson(*inst);
      }
      out["checkpoint"] = checkpoint;
      out["restore_s"] = secs;
      out["restore"] = {{"files", rs.files},           {"linked_files", rs.linked_files},
                        {"copied_files", rs.copied_files}, {"copied_bytes", rs.copied_bytes},
                        {"total_bytes", rs.total_bytes}, {"build_s", rs.build_seconds},
                        {"open_s", rs.open_seconds}};
      std::lock_guard<std::mutex> l(mu_);
      instances_[{op, i}] = inst;
      break;
    }
    case InstanceAction::kFence: {
      RHINO_RETURN_IF_ERROR(RaiseEpoch(op, i, req.epoch));
      out["epoch"] = req.epoch;
      break;
    }
    case InstanceAction::kImport: {
      std::string from_op;
      uint32_t from_i = 0;
      uint64_t checkpoint = 0;
      std::vector<uint32_t> vnodes;
      RHINO_RETURN_IF_ERROR(Arg(args, "from_operator", &from_op, true));
      RHINO_RETURN_IF_ERROR(Arg(args, "from_instance", &from_i, true));
      RHINO_RETURN_IF_ERROR(Arg(args, "checkpoint", &checkpoint, true));
      RHINO_RETURN_IF_ERROR(Arg(args, "vnodes", &vnodes, true));
      if (!IsValidOperatorId(from_op)) return Status::InvalidArgument("invalid operator id '" + from_op + "'");
      RHINO_RETURN_IF_ERROR(CheckEpoch(op, i, req.epoch));
      auto inst = Find(op, i);
      if (!inst) return Status::UnknownInstance("worker " + options_.worker_id + " does not host " + what);
      std::lock_guard<std::mutex> l(inst->mu());
      if (inst->config().epoch != req.epoch) {
        return Status::StaleEpoch("import at epoch " + std::to_string(req.epoch) + " into " + what +
                                  ", hosted here at epoch " + std::to_string(inst->config().epoch));
      }
      std::vector<uint32_t> imported;
      RHINO_RETURN_IF_ERROR(inst->ImportFromCheckpoint(from_op, from_i, checkpoint, vnodes, &imported));
      out["imported"] = imported;
      break;
    }
    case InstanceAction::kMoveVnodes: {
      std::string to_op;
      uint32_t to_i = 0;
      uint64_t to_epoch = 0;
      std::vector<uint32_t> vnodes;
      RHINO_RETURN_IF_ERROR(Arg(args, "to_operator", &to_op, true));
      RHINO_RETURN_IF_ERROR(Arg(args, "to_instance", &to_i, true));
      RHINO_RETURN_IF_ERROR(Arg(args, "to_epoch", &to_epoch, true));
      RHINO_RETURN_IF_ERROR(Arg(args, "vnodes", &vnodes, true));
      RHINO_RETURN_IF_ERROR(CheckEpoch(op, i, req.epoch));
      RHINO_RETURN_IF_ERROR(CheckEpoch(to_op, to_i, to_epoch));
      auto from = Find(op, i);
      auto to = Find(to_op, to_i);
      if (!from) return Status::UnknownInstance("worker " + options_.worker_id + " does not host " + what);
      if (!to) return Status::UnknownInstance("worker " + options_.worker_id + " does not host " + Describe(to_op, to_i));
      if (from == to) return Status::InvalidArgument("cannot move vnodes of " + what + " to itself");
      std::scoped_lock l(from->mu(), to->mu());
      if (from->config().epoch != req.epoch || to->config().epoch != to_epoch) {
        return Status::StaleEpoch("a vnode move names an epoch other than the instances' own");
      }
      std::vector<uint32_t> moved;
      RHINO_RETURN_IF_ERROR(from->MoveVnodesTo(to.get(), vnodes, &moved));
      out["moved"] = moved;
      break;
    }
    case InstanceAction::kList: {
      std::vector<std::shared_ptr<HostedInstance>> all;
      {
        std::lock_guard<std::mutex> l(mu_);
        for (auto& [k, inst] : instances_) all.push_back(inst);
      }
      json list = json::array();
      for (auto& inst : all) {
        std::lock_guard<std::mutex> l(inst->mu());
        list.push_back(InfoJson(*inst));
      }
      out["instances"] = list;
      break;
    }
    case InstanceAction::kStatus: {
      std::vector<uint64_t> ids;
      RHINO_RETURN_IF_ERROR(store_->ListCheckpoints(op, i, &ids));
      out["checkpoints"] = ids;
      auto inst = Find(op, i);
      out["hosted"] = inst != nullptr;
      if (inst) {
        std::lock_guard<std::mutex> l(inst->mu());
        out.update(InfoJson(*inst));
        uint64_t checkpoint = 0;
        RHINO_RETURN_IF_ERROR(Arg(args, "checkpoint", &checkpoint, false));
        if (args.contains("checkpoint") && !args["checkpoint"].is_null()) {
          std::string message;
          out["replication"] = inst->ReplicationStateOf(checkpoint, &message);
          out["replication_message"] = message;
        }
      }
      break;
    }
    case InstanceAction::kDiscardAfter: {
      std::optional<uint64_t> after;
      if (args.contains("after") && !args["after"].is_null()) {
        uint64_t a = 0;
        RHINO_RETURN_IF_ERROR(Arg(args, "after", &a, true));
        after = a;
      }
      RHINO_RETURN_IF_ERROR(RaiseEpoch(op, i, req.epoch));
      if (Find(op, i)) return Status::InvalidArgument(what + " is hosted here: its own checkpoints are not discarded by a peer");
      std::vector<uint64_t> removed;
      RHINO_RETURN_IF_ERROR(store_->DiscardAfter(op, i, after, &removed));
      out["removed"] = removed;
      break;
    }
    case InstanceAction::kReconfigure: {
      uint64_t version = 0;
      double timeout_s = 120;
      std::vector<ReconfigOp> ops;
      RHINO_RETURN_IF_ERROR(Arg(args, "version", &version, true));
      RHINO_RETURN_IF_ERROR(Arg(args, "timeout_s", &timeout_s, false));
      if (!args.contains("ops")) return Status::InvalidArgument("reconfigure needs 'ops'");
      RHINO_RETURN_IF_ERROR(ParseReconfigOps(args["ops"].dump(), &ops));
      RHINO_RETURN_IF_ERROR(CheckEpoch(op, i, req.epoch));
      auto inst = Find(op, i);
      if (!inst) return Status::UnknownInstance("worker " + options_.worker_id + " does not host " + what);
      auto done = std::make_shared<std::promise<SessionCommitRsp>>();
      auto fut = done->get_future();
      bool replicating = false;
      {
        std::lock_guard<std::mutex> l(inst->mu());
        if (inst->config().epoch != req.epoch) {
          return Status::StaleEpoch("reconfigure at epoch " + std::to_string(req.epoch) + " of " + what +
                                    ", hosted here at epoch " + std::to_string(inst->config().epoch));
        }
        RHINO_RETURN_IF_ERROR(inst->Reconfigure(version, ops, &replicating,
                                                [done](const SessionCommitRsp& r) { done->set_value(r); }));
        out = InfoJson(*inst);
      }
      if (replicating) {
        // Outside the instance's lock: the chain's ack is handled on its strand.
        if (fut.wait_for(std::chrono::duration<double>(timeout_s)) != std::future_status::ready) {
          return Status::Timeout("the first checkpoint of " + what + " was not complete on its chain within " +
                                 std::to_string(timeout_s) + " s");
        }
        SessionCommitRsp r = fut.get();
        if (r.code != 0) return Status::FromCode(r.code, r.message);
      }
      out["replicated"] = replicating;
      break;
    }
    case InstanceAction::kReplicate: {
      uint64_t checkpoint = 0, chain_version = 0;
      double timeout_s = 600;
      std::vector<std::string> to;
      RHINO_RETURN_IF_ERROR(Arg(args, "to", &to, true));
      RHINO_RETURN_IF_ERROR(Arg(args, "chain_version", &chain_version, true));
      RHINO_RETURN_IF_ERROR(Arg(args, "timeout_s", &timeout_s, false));
      RHINO_RETURN_IF_ERROR(CheckEpoch(op, i, req.epoch));
      if (to.empty()) return Status::InvalidArgument("replicate needs at least one worker in 'to'");
      std::vector<uint64_t> ids;
      RHINO_RETURN_IF_ERROR(store_->ListCheckpoints(op, i, &ids));
      if (args.contains("checkpoint") && !args["checkpoint"].is_null()) {
        RHINO_RETURN_IF_ERROR(Arg(args, "checkpoint", &checkpoint, true));
        if (!std::binary_search(ids.begin(), ids.end(), checkpoint)) {
          return Status::NotFound("worker " + options_.worker_id + " holds no checkpoint " +
                                  std::to_string(checkpoint) + " of " + what);
        }
      } else {
        if (ids.empty()) return Status::NotFound("worker " + options_.worker_id + " holds no checkpoint of " + what);
        checkpoint = ids.back();
      }
      // A bulk copy (design §3 failure model): the receivers get every file
      // they lack, as a chain of their own, under the instance's chain version.
      ReplicateOptions o = options_.replicate;
      o.client_id = options_.worker_id;
      o.on_done = nullptr;
      std::unique_ptr<ReplicationHandle> h;
      const auto t0 = std::chrono::steady_clock::now();
      RHINO_RETURN_IF_ERROR(ReplicateCheckpoint(store_->dir(), op, i, checkpoint, to, chain_version,
                                                options_.secret, o, &h));
      ReplicationResult r;
      if (!h->Wait(static_cast<int64_t>(timeout_s * 1000), &r)) {
        h->Cancel();
        return Status::Timeout("copying checkpoint " + std::to_string(checkpoint) + " of " + what + " took over " +
                               std::to_string(timeout_s) + " s");
      }
      RHINO_RETURN_IF_ERROR(r.status);
      out["checkpoint"] = checkpoint;
      out["bytes_sent"] = r.bytes_sent;
      out["seconds"] = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      break;
    }
    default:
      return Status::InvalidArgument("unknown instance action " + std::to_string(req.action));
  }
  *result = out.dump();
  return Status::OK();
}

std::optional<uint64_t> StateService::RetentionFloor(const std::string& op, uint32_t instance) {
  std::shared_ptr<HostedInstance> inst = Find(op, instance);
  if (!inst) return std::nullopt;
  // Never wait: a commit holds the instance for seconds, and retention can
  // come back next pass. Until then, it keeps everything of this instance.
  std::unique_lock<std::mutex> l(inst->mu(), std::try_to_lock);
  if (!l.owns_lock()) return 0;
  return inst->last_complete().value_or(0);
}

std::vector<InstanceMetrics> StateService::Metrics() {
  std::vector<std::shared_ptr<HostedInstance>> all;
  {
    std::lock_guard<std::mutex> l(mu_);
    for (auto& [k, inst] : instances_) all.push_back(inst);
  }
  std::vector<InstanceMetrics> out;
  for (auto& inst : all) {
    std::lock_guard<std::mutex> l(inst->mu());
    out.push_back(inst->Metrics());
  }
  return out;
}

}  // namespace rhino
