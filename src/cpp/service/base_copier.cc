#include "service/base_copier.h"

#include <chrono>
#include <cstdio>
#include <algorithm>
#include <map>
#include <set>
#include <tuple>
#include <optional>
#include <string_view>
#include <utility>

#include "service/base_reader.h"
#include "service/hosted_instance.h"
#include "state/vnode_base.h"
#include "util/fs.h"

namespace rhino {

namespace {

constexpr size_t kPageEntries = 4096;  // per ScanReq of the copy
constexpr int kIdleMs = 200;           // between looks when nothing is on a base
constexpr int kBusyRetryMs = 20;       // between tries of a merge while a session is open
constexpr int kRenewSeconds = 30;      // between renewals of the holds of the bases not merged

}  // namespace

BaseCopier::BaseCopier(Instances instances, StateClientOptions peers, uint64_t bytes_per_s)
    : instances_(std::move(instances)), peers_(std::move(peers)), bytes_per_s_(bytes_per_s) {}

BaseCopier::~BaseCopier() { Stop(); }

void BaseCopier::Start() {
  thread_ = std::thread([this] { Run(); });
}

void BaseCopier::Stop() {
  stop_.store(true);
  {
    MutexLock l(&mu_);
    cv_.SignalAll();
  }
  if (thread_.joinable()) thread_.join();
}

bool BaseCopier::Pause(int ms) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
  for (;;) {
    MaybeRenewHolds();
    const auto now = std::chrono::steady_clock::now();
    if (stop_.load() || now >= until) break;
    MutexLock l(&mu_);
    cv_.WaitUntil(&mu_, std::min(until, now + std::chrono::seconds(1)), [this] { return stop_.load(); });
  }
  return !stop_.load();
}

void BaseCopier::MaybeRenewHolds() {
  std::set<std::tuple<std::string, uint32_t, uint64_t, std::string>> touch;  // a base, one of its workers
  for (const auto& inst : instances_()) {
    std::lock_guard<InstanceMutex> l(inst->mu());
    for (const auto& [v, b] : inst->Bases()) {
      for (const auto& host : b.hosts) touch.emplace(b.operator_id, b.instance, b.checkpoint, host);
    }
  }
  const auto now = std::chrono::steady_clock::now();
  const bool due = now - renewed_ >= std::chrono::seconds(kRenewSeconds);
  const bool fresh = std::any_of(touch.begin(), touch.end(), [this](const auto& t) { return held_.count(t) == 0; });
  if (touch.empty() || (!due && !fresh)) return;
  renewed_ = now;
  held_ = touch;
  for (const auto& [op, instance, checkpoint, host] : touch) {
    if (stop_.load()) return;
    std::shared_ptr<StateClient> client;
    std::unique_ptr<ClientSession> reader;
    SessionOpenRsp info;
    Status s = StateClient::Connect(host, peers_, &client);
    if (s.ok()) s = client->ReadCheckpoint(op, instance, checkpoint, &reader, &info);
    if (reader) reader->Abort("a base's hold renewed");
    // A worker that is down now renews nothing: the base is read from another.
  }
}

void BaseCopier::Run() {
  while (!stop_.load()) {
    MaybeRenewHolds();
    if (!CopyOne() && !Pause(kIdleMs)) return;
  }
}

bool BaseCopier::CopyOne() {
  for (const auto& inst : instances_()) {
    std::map<uint32_t, VnodeBase> bases;
    {
      std::lock_guard<InstanceMutex> l(inst->mu());
      bases = inst->Bases();
    }
    if (bases.empty()) continue;
    const auto& [vnode, base] = *bases.begin();
    Status s = CopyAndMerge(inst, vnode, base);
    if (!s.ok() && !stop_.load()) {
      failures_++;
      std::fprintf(stderr, "rhino worker: the base of vnode %u of %s/%u (checkpoint %llu of %s/%u) not merged: %s\n",
                   vnode, inst->config().operator_id.c_str(), inst->config().instance,
                   static_cast<unsigned long long>(base.checkpoint), base.operator_id.c_str(), base.instance,
                   s.ToString().c_str());
      Pause(1000);  // the base's workers may be back, or the vnode off its base, at the next look
    }
    return true;
  }
  return false;
}

Status BaseCopier::CopyAndMerge(const std::shared_ptr<HostedInstance>& inst, uint32_t vnode, const VnodeBase& base) {
  std::string dir;
  std::unique_ptr<BaseFileWriter> writer;
  {
    std::lock_guard<InstanceMutex> l(inst->mu());
    dir = inst->BaseWorkDir(vnode);
    writer = inst->NewBaseFileWriter(dir);
  }
  if (!writer) return Status::Aborted("the instance closed");
  RHINO_RETURN_IF_ERROR(fs::MakeDirs(dir));
  struct Cleanup {
    std::string dir;
    ~Cleanup() { fs::RemoveAll(dir); }
  } cleanup{dir};
  // Read the base a page at a time, at most bytes_per_s_.
  RemoteBaseReader reader({{vnode, base}}, peers_);
  const auto t0 = std::chrono::steady_clock::now();
  uint64_t bytes = 0;
  std::optional<std::string> after;
  for (bool more = true; more;) {
    if (stop_.load()) return Status::Aborted("the worker stops");
    std::vector<std::pair<std::string, std::string>> page;
    std::optional<std::string_view> at;
    if (after) at = *after;
    RHINO_RETURN_IF_ERROR(reader.Scan(vnode, "", at, kPageEntries, &page, &more));
    for (const auto& [k, v] : page) {
      RHINO_RETURN_IF_ERROR(writer->Add(k, v));
      bytes += k.size() + v.size();
    }
    if (!page.empty()) after = page.back().first;
    if (bytes_per_s_ > 0) {
      const double due = static_cast<double>(bytes) / static_cast<double>(bytes_per_s_);
      const double spent = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (due > spent && !Pause(static_cast<int>((due - spent) * 1000))) return Status::Aborted("the worker stops");
    }
  }
  std::vector<std::string> files;
  RHINO_RETURN_IF_ERROR(writer->Finish(&files));
  // Merge between two batches: a session holds the instance for its batch.
  for (;;) {
    MergeBaseStats stats;
    Status s;
    {
      std::lock_guard<InstanceMutex> l(inst->mu());
      s = inst->MergeBase(vnode, base, files, &stats);
    }
    if (s.ok()) {
      merged_++;
      merged_bytes_ += stats.bytes;
      return s;
    }
    if (s.code() == Status::Code::kAborted) return Status::OK();  // off that base meanwhile: nothing to merge
    if (s.code() != Status::Code::kSessionBusy) return s;
    if (!Pause(kBusyRetryMs)) return Status::Aborted("the worker stops");
  }
}

}  // namespace rhino
