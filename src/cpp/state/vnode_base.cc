// StateBackendImpl's vnodes on a base (the early hand-over, issue 48; Del
// Monte §4.1, steps 2 and 4: the target processes the moved keys at once,
// creating new partial state, and merges the source's checkpoint with it as it
// arrives). See state/vnode_base.h for the "gone" keys and rhino/state_backend.h
// for the contract.
//
// The merge puts the base into RocksDB's last level with ingest_behind: every
// entry this instance wrote since the move sits above it and wins. That level
// is reserved for it (allow_ingest_behind) from the DB's creation, so nothing
// of the instance's own is ever compacted into it. Deletes are the exception:
// RocksDB drops a delete that it compacts with nothing below it (checked on
// RocksDB 7.8 with allow_ingest_behind on), so the deletes made since the
// move are kept as gone keys and applied again, above the base, when it lands.
#include "state/vnode_base.h"

#include <rocksdb/db.h>
#include <rocksdb/metadata.h>
#include <rocksdb/options.h>
#include <rocksdb/sst_file_writer.h>
#include <rocksdb/write_batch.h>

#include <cstdio>

#include "state/state_backend_impl.h"
#include "state/state_internal.h"
#include "util/fs.h"

namespace rhino {
using namespace state_internal;

namespace {

constexpr char kVnodeBasePrefix[] = "rhino:vnode_base:";  // + 5 digits: the VnodeBase as JSON
constexpr char kGonePrefix[] = "rhino:gone:";             // + 5 digits + ':' + the key: a key deleted since the move

std::string Digits(uint32_t vnode) {
  char b[16];
  std::snprintf(b, sizeof(b), "%05u", vnode);
  return b;
}
std::string BaseKey(uint32_t vnode) { return kVnodeBasePrefix + Digits(vnode); }
std::string GonePrefix(uint32_t vnode) { return kGonePrefix + Digits(vnode) + ":"; }

json BaseJson(const VnodeBase& b) {
  return {{"operator_id", b.operator_id}, {"instance", b.instance}, {"checkpoint", b.checkpoint}, {"hosts", b.hosts}};
}

Status ParseBase(const std::string& text, VnodeBase* b) {
  try {
    json j = json::parse(text);
    b->operator_id = j.at("operator_id").get<std::string>();
    b->instance = j.at("instance").get<uint32_t>();
    b->checkpoint = j.at("checkpoint").get<uint64_t>();
    b->hosts = j.at("hosts").get<std::vector<std::string>>();
  } catch (const std::exception& e) {
    return Status::Corruption(std::string("a vnode's base record is malformed: ") + e.what());
  }
  return Status::OK();
}

// Whether the last level of `cf` holds files: a base that went in.
bool LastLevelHoldsFiles(rocksdb::DB* db, rocksdb::ColumnFamilyHandle* cf) {
  rocksdb::ColumnFamilyMetaData md;
  db->GetColumnFamilyMetaData(cf, &md);
  return !md.levels.empty() && !md.levels.back().files.empty();
}

}  // namespace

std::map<uint32_t, VnodeBase> StateBackendImpl::VnodeBases() const {
  std::map<uint32_t, VnodeBase> out;
  std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(rocksdb::ReadOptions(), default_cf_));
  const rocksdb::Slice prefix(kVnodeBasePrefix);
  for (it->Seek(prefix); it->Valid() && it->key().starts_with(prefix); it->Next()) {
    uint32_t v = 0;
    VnodeBase b;
    if (std::sscanf(it->key().ToString().c_str() + prefix.size(), "%u", &v) != 1) continue;
    if (ParseBase(it->value().ToString(), &b).ok()) out[v] = std::move(b);
  }
  return out;
}

Status StateBackendImpl::AddVnodeOnBase(uint32_t vnode, const VnodeBase& base) {
  RHINO_RETURN_IF_ERROR(CheckWritable());
  if (!takes_bases_) {
    return Status::InvalidArgument("state at " + dir_ + " was created before vnodes could be taken on a base "
                                   "(no reserved last level): move vnode " + std::to_string(vnode) + " by copy first");
  }
  if (vnode >= partitioner_.num_vnodes()) {
    return Status::UnknownVnode("vnode " + std::to_string(vnode) + " is outside [0, " +
                                std::to_string(partitioner_.num_vnodes()) + ")");
  }
  std::lock_guard admin(admin_mu_);
  {
    ReaderMutexLock lock(&cf_mu_);
    if (cf_by_vnode_[vnode] != nullptr) {
      return Status::AlreadyExists("instance " + std::to_string(instance_) + " of '" + operator_id_ +
                                   "' already holds vnode " + std::to_string(vnode));
    }
  }
  // The record first, durably: a crash before the column family exists leaves
  // a record that the next open completes, never a vnode without its base.
  rocksdb::WriteOptions sync;
  sync.sync = true;
  RHINO_RETURN_IF_ERROR(
      WriteResult(db_->Put(sync, default_cf_, BaseKey(vnode), BaseJson(base).dump()), "recording a vnode's base"));
  rocksdb::ColumnFamilyHandle* h = nullptr;
  rocksdb::Status rs = db_->CreateColumnFamily(*cf_options_, VnodeColumnFamilyName(vnode), &h);
  if (!rs.ok()) {
    db_->Delete(sync, default_cf_, BaseKey(vnode));
    return FromRocks(rs, "creating the column family of vnode " + std::to_string(vnode));
  }
  WriterMutexLock lock(&cf_mu_);
  cf_by_vnode_[vnode] = h;
  on_base_[vnode] = 1;
  bases_.fetch_add(1, std::memory_order_release);
  return Status::OK();
}

Status StateBackendImpl::LoadVnodeBases() {
  std::map<uint32_t, VnodeBase> bases = VnodeBases();
  std::vector<uint32_t> cut_short;
  {
    WriterMutexLock lock(&cf_mu_);
    on_base_.assign(partitioner_.num_vnodes(), 0);
    for (const auto& [v, b] : bases) {
      if (v >= cf_by_vnode_.size()) return Status::Corruption("a base record of vnode " + std::to_string(v) + " in " + dir_);
      if (cf_by_vnode_[v] == nullptr) {
        if (read_only_) continue;  // a crash cut AddVnodeOnBase short: made by the next writable open
        rocksdb::Status rs = db_->CreateColumnFamily(*cf_options_, VnodeColumnFamilyName(v), &cf_by_vnode_[v]);
        if (!rs.ok()) return FromRocks(rs, "creating the column family of vnode " + std::to_string(v));
      }
      on_base_[v] = 1;
      bases_.fetch_add(1, std::memory_order_release);
      if (!read_only_ && LastLevelHoldsFiles(db_.get(), cf_by_vnode_[v])) cut_short.push_back(v);
    }
  }
  for (uint32_t v : cut_short) {
    MergeBaseStats unused;
    RHINO_RETURN_IF_ERROR(FinishMerge(v, &unused));
  }
  return Status::OK();
}

Status StateBackendImpl::MergeBase(uint32_t vnode, const std::vector<std::string>& sst_files, MergeBaseStats* stats) {
  RHINO_RETURN_IF_ERROR(CheckWritable());
  std::lock_guard admin(admin_mu_);
  rocksdb::ColumnFamilyHandle* cf = nullptr;
  {
    ReaderMutexLock lock(&cf_mu_);
    if (!OnBase(vnode)) {
      return Status::InvalidArgument("vnode " + std::to_string(vnode) + " of instance " + std::to_string(instance_) +
                                     " of '" + operator_id_ + "' is not on a base");
    }
    cf = cf_by_vnode_[vnode];
  }
  *stats = MergeBaseStats{};
  for (const auto& f : sst_files) {
    uint64_t size = 0;
    RHINO_RETURN_IF_ERROR(fs::FileSize(f, &size));
    stats->bytes += size;
  }
  stats->files = sst_files.size();
  // A base already in (a merge whose last step a failure cut short) goes in once.
  if (!sst_files.empty() && !LastLevelHoldsFiles(db_.get(), cf)) {
    rocksdb::IngestExternalFileOptions io;
    io.move_files = true;      // hard links: the files are not copied again
    io.ingest_behind = true;   // the last level, under everything written here
    RHINO_RETURN_IF_ERROR(WriteResult(db_->IngestExternalFile(cf, sst_files, io),
                                      "merging the base of vnode " + std::to_string(vnode)));
  }
  return FinishMerge(vnode, stats);
}

Status StateBackendImpl::FinishMerge(uint32_t vnode, MergeBaseStats* stats) {
  std::vector<std::string> gone;
  RHINO_RETURN_IF_ERROR(GoneWithPrefix(vnode, "", &gone));
  rocksdb::WriteBatch wb;
  {
    ReaderMutexLock lock(&cf_mu_);
    rocksdb::ColumnFamilyHandle* cf = cf_by_vnode_[vnode];
    const std::string gp = GonePrefix(vnode);
    for (const auto& k : gone) {
      wb.Delete(cf, k);                  // above the base: the delete wins again
      wb.Delete(default_cf_, gp + k);
    }
    wb.Delete(default_cf_, BaseKey(vnode));
  }
  stats->deletes_again = gone.size();
  RHINO_RETURN_IF_ERROR(WriteResult(db_->Write(rocksdb::WriteOptions(), &wb), "finishing a base's merge"));
  WriterMutexLock lock(&cf_mu_);
  if (on_base_[vnode]) {
    on_base_[vnode] = 0;
    bases_.fetch_sub(1, std::memory_order_release);
  }
  return Status::OK();
}

Status StateBackendImpl::ForgetBase(uint32_t vnode) {
  if (!OnBase(vnode)) return Status::OK();
  std::vector<std::string> gone;
  RHINO_RETURN_IF_ERROR(GoneWithPrefix(vnode, "", &gone));
  // One delete per key, not a DeleteRange: with the memtable insert hint every
  // column family uses (state/rocksdb_options.cc), RocksDB 7.8 left keys that
  // a DeleteRange covered readable when they had been put in a batch that also
  // wrote another column family (reproduced outside Rhino).
  rocksdb::WriteBatch wb;
  const std::string gp = GonePrefix(vnode);
  for (const auto& k : gone) wb.Delete(default_cf_, gp + k);
  wb.Delete(default_cf_, BaseKey(vnode));
  RHINO_RETURN_IF_ERROR(WriteResult(db_->Write(rocksdb::WriteOptions(), &wb), "forgetting a dropped vnode's base"));
  on_base_[vnode] = 0;
  bases_.fetch_sub(1, std::memory_order_release);
  return Status::OK();
}

Status StateBackendImpl::NoteBaseWrite(rocksdb::WriteBatch* wb, uint32_t vnode, std::string_view key, bool put) const {
  const std::string gk = GonePrefix(vnode) + std::string(key);
  rocksdb::Status s = put ? wb->Delete(default_cf_, gk) : wb->Put(default_cf_, gk, rocksdb::Slice());
  return FromRocks(s, "noting a write of a vnode on a base");
}

Status StateBackendImpl::Gone(const std::vector<uint32_t>& vnodes, const std::vector<std::string_view>& keys,
                              std::vector<uint8_t>* gone) const {
  std::vector<std::string> gks(keys.size());
  std::vector<rocksdb::Slice> slices(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) {
    gks[i] = GonePrefix(vnodes[i]) + std::string(keys[i]);
    slices[i] = gks[i];
  }
  std::vector<rocksdb::PinnableSlice> values(keys.size());
  std::vector<rocksdb::Status> st(keys.size());
  if (!keys.empty()) {
    db_->MultiGet(rocksdb::ReadOptions(), default_cf_, keys.size(), slices.data(), values.data(), st.data());
  }
  gone->assign(keys.size(), 0);
  for (size_t i = 0; i < keys.size(); ++i) {
    if (st[i].ok()) {
      (*gone)[i] = 1;
    } else if (!st[i].IsNotFound()) {
      return FromRocks(st[i], "reading the gone keys of a vnode on a base");
    }
  }
  return Status::OK();
}

Status StateBackendImpl::GoneWithPrefix(uint32_t vnode, std::string_view prefix, std::vector<std::string>* out) const {
  const std::string gp = GonePrefix(vnode);
  const std::string from = gp + std::string(prefix);
  std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(rocksdb::ReadOptions(), default_cf_));
  for (it->Seek(from); it->Valid() && it->key().starts_with(from); it->Next()) {
    out->emplace_back(it->key().data() + gp.size(), it->key().size() - gp.size());
  }
  return FromRocks(it->status(), "listing the gone keys of vnode " + std::to_string(vnode));
}

// ---------------------------------------------------------------- BaseFileWriter

BaseFileWriter::BaseFileWriter(const StateBackend& db, std::string dir, uint64_t file_bytes)
    : options_(std::make_unique<rocksdb::Options>(rocksdb::DBOptions(), *db.impl_->cf_options_)),
      dir_(std::move(dir)),
      file_bytes_(file_bytes) {
  options_->compaction_filter = nullptr;  // the DB's, which may close first; a writer runs no compaction
}

BaseFileWriter::~BaseFileWriter() = default;

Status BaseFileWriter::Roll() {
  if (writer_) {
    rocksdb::Status rs = writer_->Finish();
    if (!rs.ok()) return FromRocks(rs, "finishing base file " + files_.back());
  }
  writer_ = std::make_unique<rocksdb::SstFileWriter>(rocksdb::EnvOptions(), *options_);
  char name[32];
  std::snprintf(name, sizeof(name), "base-%06zu.sst", files_.size());
  files_.push_back(fs::Join(dir_, name));
  rocksdb::Status rs = writer_->Open(files_.back());
  return FromRocks(rs, "opening base file " + files_.back());
}

Status BaseFileWriter::Add(std::string_view key, std::string_view value) {
  if (any_ && rocksdb::BytewiseComparator()->Compare(rocksdb::Slice(key.data(), key.size()), last_key_) <= 0) {
    return Status::InvalidArgument("a base's entries must come in key order");
  }
  if (!writer_ || writer_->FileSize() >= file_bytes_) RHINO_RETURN_IF_ERROR(Roll());
  rocksdb::Status rs = writer_->Put(rocksdb::Slice(key.data(), key.size()), rocksdb::Slice(value.data(), value.size()));
  if (!rs.ok()) return FromRocks(rs, "writing base file " + files_.back());
  last_key_.assign(key.data(), key.size());
  any_ = true;
  return Status::OK();
}

Status BaseFileWriter::Finish(std::vector<std::string>* files) {
  if (writer_) {
    rocksdb::Status rs = writer_->Finish();
    writer_.reset();
    if (!rs.ok()) return FromRocks(rs, "finishing base file " + files_.back());
  }
  *files = files_;
  return Status::OK();
}

}  // namespace rhino
