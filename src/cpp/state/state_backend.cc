// StateBackend, the API of rhino/state_backend.h: each call goes to its
// StateBackendImpl (state/state_backend_impl.h). Here too: the API's small
// value types (WriteBatch, MultiGetResult), the names of the vnode column
// families, and the compaction styles' names.
#include "rhino/state_backend.h"

#include <rocksdb/options.h>

#include <string>
#include <utility>

#include "state/state_backend_impl.h"

namespace rhino {

bool ParseCompactionStyle(const std::string& name, CompactionStyle* out) {
  if (name == "level") {
    *out = CompactionStyle::kLevel;
  } else if (name == "universal") {
    *out = CompactionStyle::kUniversal;
  } else {
    return false;
  }
  return true;
}

const char* CompactionStyleName(CompactionStyle style) {
  return style == CompactionStyle::kUniversal ? "universal" : "level";
}

std::string VnodeColumnFamilyName(uint32_t vnode) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "vnode-%05u", vnode);
  return buf;
}

bool ParseVnodeColumnFamilyName(const std::string& name, uint32_t* vnode) {
  if (name.size() < 7 || name.compare(0, 6, "vnode-") != 0) return false;
  uint64_t v = 0;
  for (size_t i = 6; i < name.size(); ++i) {
    if (name[i] < '0' || name[i] > '9') return false;
    v = v * 10 + static_cast<uint64_t>(name[i] - '0');
    if (v > (1u << 30)) return false;
  }
  *vnode = static_cast<uint32_t>(v);
  return true;
}

// ---------------------------------------------------------------- WriteBatch

WriteBatch::WriteBatch() : rep_(std::make_unique<Rep>()) {}
WriteBatch::~WriteBatch() = default;
WriteBatch::WriteBatch(WriteBatch&&) noexcept = default;
WriteBatch& WriteBatch::operator=(WriteBatch&&) noexcept = default;
size_t WriteBatch::count() const { return static_cast<size_t>(rep_->batch.Count()); }
void WriteBatch::Clear() { rep_->batch.Clear(); }

// ---------------------------------------------------------------- MultiGetResult

MultiGetResult::MultiGetResult() : rep_(std::make_unique<Rep>()) {}
MultiGetResult::~MultiGetResult() = default;
size_t MultiGetResult::size() const { return rep_->slot.size(); }
bool MultiGetResult::found(size_t i) const { return rep_->slot[i] != Rep::kMissing; }
std::string_view MultiGetResult::value(size_t i) const {
  const rocksdb::PinnableSlice& p = rep_->pinned[rep_->slot[i]];
  return std::string_view(p.data(), p.size());
}
size_t MultiGetResult::key_index(size_t j) const { return rep_->order[j]; }
bool MultiGetResult::found_at(size_t j) const { return rep_->hit[j] != 0; }
std::string_view MultiGetResult::value_at(size_t j) const {
  const rocksdb::PinnableSlice& p = rep_->pinned[j];
  return std::string_view(p.data(), p.size());
}

// ---------------------------------------------------------------- StateBackend: the API, over its implementation

StateBackend::StateBackend(std::unique_ptr<StateBackendImpl> impl) : impl_(std::move(impl)) {}
StateBackend::~StateBackend() = default;

Status StateBackend::Open(const std::string& dir, const StateOptions& options, std::unique_ptr<StateBackend>* out) {
  std::unique_ptr<StateBackendImpl> impl;
  RHINO_RETURN_IF_ERROR(StateBackendImpl::Open(dir, options, &impl));
  out->reset(new StateBackend(std::move(impl)));
  return Status::OK();
}

Status StateBackend::Restore(const ReplicaStore& store, const std::string& operator_id, uint32_t instance,
                             uint64_t checkpoint_id, const std::string& target_dir,
                             const RestoreOptions& restore_options, const StateOptions& options,
                             std::unique_ptr<StateBackend>* out, RestoreStats* stats) {
  std::unique_ptr<StateBackendImpl> impl;
  RHINO_RETURN_IF_ERROR(StateBackendImpl::Restore(store, operator_id, instance, checkpoint_id, target_dir,
                                                  restore_options, options, &impl, stats));
  out->reset(new StateBackend(std::move(impl)));
  return Status::OK();
}

const std::string& StateBackend::dir() const { return impl_->dir(); }
CompactionStyle StateBackend::compaction() const { return impl_->compaction(); }
const Partitioner& StateBackend::partitioner() const { return impl_->partitioner(); }
const std::string& StateBackend::operator_id() const { return impl_->operator_id(); }
uint32_t StateBackend::instance() const { return impl_->instance(); }
std::vector<uint32_t> StateBackend::vnodes() const { return impl_->vnodes(); }

Status StateBackend::Get(std::string_view key, std::string* value) const { return impl_->Get(key, value); }
Status StateBackend::Put(std::string_view key, std::string_view value) { return impl_->Put(key, value); }
Status StateBackend::Delete(std::string_view key) { return impl_->Delete(key); }

Status StateBackend::BatchPut(WriteBatch* batch, const std::vector<std::string_view>& keys,
                              const std::vector<std::string_view>& values) const {
  return impl_->BatchPut(batch, keys, values);
}
Status StateBackend::BatchDelete(WriteBatch* batch, const std::vector<std::string_view>& keys) const {
  return impl_->BatchDelete(batch, keys);
}
Status StateBackend::Write(WriteBatch* batch, std::optional<uint64_t> version, std::optional<int64_t> batch_time_ms) {
  return impl_->Write(batch, version, batch_time_ms);
}
Status StateBackend::MultiGet(const std::vector<std::string_view>& keys, MultiGetResult* out) const {
  return impl_->MultiGet(keys, out);
}
Status StateBackend::BatchOrder(const std::vector<std::string_view>& keys, std::vector<size_t>* order) const {
  return impl_->BatchOrder(keys, order);
}
Status StateBackend::Scan(uint32_t vnode, const std::function<bool(std::string_view, std::string_view)>& fn) const {
  return impl_->Scan(vnode, fn);
}

std::optional<uint64_t> StateBackend::version() const { return impl_->version(); }
std::optional<VersionBase> StateBackend::BaseOf(uint64_t version) const { return impl_->BaseOf(version); }
std::optional<uint64_t> StateBackend::last_checkpoint() const { return impl_->last_checkpoint(); }

std::optional<int64_t> StateBackend::ttl_clock() const { return impl_->ttl_clock(); }
Status StateBackend::SetTtlClock(int64_t ms) { return impl_->SetTtlClock(ms); }
Status StateBackend::CompactVnodes(uint64_t* bytes_before, uint64_t* bytes_after) {
  return impl_->CompactVnodes(bytes_before, bytes_after);
}
void StateBackend::AbortCompaction() { impl_->AbortCompaction(); }

Status StateBackend::Checkpoint(ReplicaStore* store, uint64_t checkpoint_id, uint64_t epoch, Manifest* out) {
  return impl_->Checkpoint(store, checkpoint_id, epoch, out);
}

Status StateBackend::ExportVnodes(const std::vector<uint32_t>& vnodes, const std::string& export_dir) {
  return impl_->ExportVnodes(vnodes, export_dir);
}
Status StateBackend::ImportVnodes(const std::string& export_dir, std::vector<uint32_t>* imported) {
  return impl_->ImportVnodes(export_dir, imported);
}
Status StateBackend::DropVnodes(const std::vector<uint32_t>& vnodes) { return impl_->DropVnodes(vnodes); }

bool StateBackend::takes_bases() const { return impl_->takes_bases(); }
Status StateBackend::AddVnodeOnBase(uint32_t vnode, const VnodeBase& base) { return impl_->AddVnodeOnBase(vnode, base); }
std::map<uint32_t, VnodeBase> StateBackend::VnodeBases() const { return impl_->VnodeBases(); }
Status StateBackend::MergeBase(uint32_t vnode, const std::vector<std::string>& sst_files, MergeBaseStats* stats) {
  return impl_->MergeBase(vnode, sst_files, stats);
}
Status StateBackend::Stats(std::vector<VnodeStats>* out) const { return impl_->Stats(out); }
Status StateBackend::Flush() { return impl_->Flush(); }
Status StateBackend::WaitForCompactions(std::chrono::milliseconds timeout, bool* settled) const {
  return impl_->WaitForCompactions(timeout, settled);
}

}  // namespace rhino
