#include "service/base_reader.h"

namespace rhino {

RemoteBaseReader::RemoteBaseReader(std::map<uint32_t, VnodeBase> bases, StateClientOptions options)
    : bases_(std::move(bases)), options_(std::move(options)) {}

RemoteBaseReader::~RemoteBaseReader() = default;

const VnodeBase& RemoteBaseReader::BaseOf(uint32_t vnode) const { return bases_.at(vnode); }

Status RemoteBaseReader::ReaderOf(const VnodeBase& base, Reader** out) {
  const BaseId id{base.operator_id, base.instance, base.checkpoint};
  auto it = readers_.find(id);
  if (it != readers_.end()) {
    *out = &it->second;
    return Status::OK();
  }
  std::string why;
  for (const auto& host : base.hosts) {
    Reader r;
    SessionOpenRsp info;
    Status s = StateClient::Connect(host, options_, &r.client);
    if (s.ok()) s = r.client->ReadCheckpoint(base.operator_id, base.instance, base.checkpoint, &r.session, &info);
    if (s.ok()) {
      *out = &(readers_[id] = std::move(r));
      return Status::OK();
    }
    why += (why.empty() ? "" : "; ") + host + ": " + s.ToString();
  }
  return Status::PeerDead("no worker holding checkpoint " + std::to_string(base.checkpoint) + " of instance " +
                          std::to_string(base.instance) + " of '" + base.operator_id + "' answered (" +
                          (why.empty() ? std::string("none recorded") : why) + ")");
}

template <typename Call>
Status RemoteBaseReader::WithReader(const VnodeBase& base, Call call) {
  Status s;
  for (int attempt = 0; attempt < 2; ++attempt) {
    Reader* r = nullptr;
    RHINO_RETURN_IF_ERROR(ReaderOf(base, &r));
    ++round_trips_;
    s = call(r->session.get());
    if (s.ok()) return s;
    // The reader's worker may be gone: a fresh reader, on the first worker that answers.
    readers_.erase(BaseId{base.operator_id, base.instance, base.checkpoint});
  }
  return s;
}

Status RemoteBaseReader::Get(const std::vector<uint32_t>& vnodes, const std::vector<std::string_view>& keys,
                             std::vector<uint8_t>* found, std::vector<std::string>* values) {
  found->assign(keys.size(), 0);
  values->assign(keys.size(), std::string());
  // One request per base: the keys of each, in their order.
  std::map<BaseId, std::vector<size_t>> by_base;
  for (size_t i = 0; i < keys.size(); ++i) {
    const VnodeBase& b = BaseOf(vnodes[i]);
    by_base[BaseId{b.operator_id, b.instance, b.checkpoint}].push_back(i);
  }
  for (const auto& entry : by_base) {
    const std::vector<size_t>& at = entry.second;  // not a structured binding: lambdas capture it (C++17)
    const VnodeBase& b = BaseOf(vnodes[at[0]]);
    std::vector<std::string_view> ask;
    ask.reserve(at.size());
    for (size_t i : at) ask.push_back(keys[i]);
    RHINO_RETURN_IF_ERROR(WithReader(b, [&](ClientSession* session) {
      return session->Get(ask, [&](size_t j, bool f, std::string_view v, const std::shared_ptr<std::string>&) {
        (*found)[at[j]] = f;
        if (f) (*values)[at[j]].assign(v.data(), v.size());
      });
    }));
  }
  return Status::OK();
}

Status RemoteBaseReader::Scan(uint32_t vnode, std::string_view prefix, std::optional<std::string_view> after,
                              size_t max_entries, std::vector<std::pair<std::string, std::string>>* out, bool* more) {
  out->clear();
  *more = false;
  ScanReq req;
  req.has_vnode = true;
  req.vnode = vnode;
  req.prefix = std::string(prefix);
  if (after) {
    req.has_after = true;
    req.after_vnode = vnode;
    req.after_key = std::string(*after);
  }
  req.max_items = static_cast<uint32_t>(max_entries);
  return WithReader(BaseOf(vnode), [&](ClientSession* session) {
    out->clear();
    ScanRsp rsp;
    std::shared_ptr<std::string> payload;
    RHINO_RETURN_IF_ERROR(session->ScanPage(req, &rsp, &payload));
    for (size_t i = 0; i < rsp.keys.size(); ++i) out->emplace_back(std::string(rsp.keys[i]), std::string(rsp.values[i]));
    *more = !rsp.done;
    return Status::OK();
  });
}

}  // namespace rhino
