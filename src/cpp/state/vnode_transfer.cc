// StateBackendImpl vnode export / import / drop: the state side of a handover.
#include <rocksdb/db.h>
#include <rocksdb/metadata.h>
#include <rocksdb/options.h>
#include <rocksdb/utilities/checkpoint.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <set>
#include <unordered_map>

#include "state/state_backend_impl.h"
#include "state/state_internal.h"
#include "util/crash_point.h"
#include "util/fs.h"

namespace rhino {
using namespace state_internal;

// ---------------------------------------------------------------- vnode export / import

Status StateBackendImpl::ExportVnodes(const std::vector<uint32_t>& vnodes, const std::string& export_dir) {
  std::lock_guard admin(admin_mu_);
  if (fs::Exists(export_dir)) return Status::AlreadyExists("export directory " + export_dir + " already exists");
  ReaderMutexLock lock(&cf_mu_);
  std::set<uint32_t> uniq(vnodes.begin(), vnodes.end());
  if (uniq.empty()) return Status::InvalidArgument("no vnodes to export");
  for (uint32_t v : uniq) {
    if (v >= cf_by_vnode_.size() || !cf_by_vnode_[v]) {
      return Status::UnknownVnode("cannot export vnode " + std::to_string(v) + ": instance " +
                                  std::to_string(instance_) + " of '" + operator_id_ + "' does not hold it");
    }
    // Its column family holds only the writes since its move: the export would lose the base.
    if (OnBase(v)) {
      return Status::InvalidArgument("cannot export vnode " + std::to_string(v) + " of instance " +
                                     std::to_string(instance_) + " of '" + operator_id_ +
                                     "': it is on a base that has not been merged yet");
    }
  }
  RHINO_RETURN_IF_ERROR(fs::MakeDirs(fs::Parent(export_dir)));
  const std::string stage = export_dir + ".rhino-export-" + std::to_string(::getpid()) + "-" + fs::RandomHex(6);
  if (::mkdir(stage.c_str(), 0755) != 0) return Status::FromErrno(errno, "mkdir " + stage);
  auto fail = [&](Status st) {
    fs::RemoveAll(stage);
    return st;
  };
  rocksdb::Checkpoint* raw = nullptr;
  rocksdb::Status rs = rocksdb::Checkpoint::Create(db_.get(), &raw);
  std::unique_ptr<rocksdb::Checkpoint> cp(raw);
  if (!rs.ok()) return fail(FromRocks(rs, "checkpoint object"));
  json manifest = {{"format", 1},
                   {"operator_id", operator_id_},
                   {"instance", instance_},
                   {"partitioner", PartitionerJson(PartitionerOptions{partitioner_.num_key_groups(),
                                                                      partitioner_.num_vnodes(),
                                                                      partitioner_.seed()})},
                   {"version", version() ? json(*version()) : json(nullptr)}};
  json jvnodes = json::array();
  for (uint32_t v : uniq) {
    const std::string name = VnodeColumnFamilyName(v);
    rocksdb::ExportImportFilesMetaData* meta = nullptr;
    rs = cp->ExportColumnFamily(cf_by_vnode_[v], fs::Join(stage, name), &meta);
    std::unique_ptr<rocksdb::ExportImportFilesMetaData> meta_owner(meta);
    if (!rs.ok()) return fail(FromRocks(rs, "exporting " + name));
    json files = json::array();
    for (const auto& f : meta->files) {
      files.push_back({{"name", f.relative_filename.empty() ? fs::Basename(f.name) : f.relative_filename},
                       {"file_number", f.file_number},
                       {"size", f.size},
                       {"level", f.level},
                       {"smallest_seqno", f.smallest_seqno},
                       {"largest_seqno", f.largest_seqno},
                       {"smallestkey", Hex(f.smallestkey)},
                       {"largestkey", Hex(f.largestkey)},
                       {"num_entries", f.num_entries},
                       {"num_deletions", f.num_deletions}});
    }
    jvnodes.push_back({{"vnode", v}, {"comparator", meta->db_comparator_name}, {"files", files}});
  }
  manifest["vnodes"] = jvnodes;
  Status s = fs::WriteFileAtomic(fs::Join(stage, kExportManifest), manifest.dump());
  if (s.ok()) s = fs::FsyncPath(stage);
  if (s.ok()) s = fs::Rename(stage, export_dir);
  if (!s.ok()) return fail(s);
  return fs::FsyncParent(export_dir);
}

Status StateBackendImpl::ImportVnodes(const std::string& export_dir, std::vector<uint32_t>* imported) {
  RHINO_RETURN_IF_ERROR(CheckWritable());
  std::lock_guard admin(admin_mu_);
  imported->clear();
  std::string data;
  Status s = fs::ReadFile(fs::Join(export_dir, kExportManifest), &data);
  if (s.IsNotFound()) return Status::NotFound("no vnode export at " + export_dir);
  RHINO_RETURN_IF_ERROR(s);
  json manifest;
  std::vector<std::pair<uint32_t, rocksdb::ExportImportFilesMetaData>> todo;
  try {
    manifest = json::parse(data);
    PartitionerOptions p = PartitionerFromJson(manifest.at("partitioner"));
    PartitionerOptions mine{partitioner_.num_key_groups(), partitioner_.num_vnodes(), partitioner_.seed()};
    if (!SamePartitioner(p, mine)) {
      return Status::InvalidArgument("export was made with " + DescribePartitioner(p) + ", this state uses " +
                                     DescribePartitioner(mine));
    }
    for (const auto& jv : manifest.at("vnodes")) {
      uint32_t v = jv.at("vnode").get<uint32_t>();
      const std::string dir = fs::Join(export_dir, VnodeColumnFamilyName(v));
      rocksdb::ExportImportFilesMetaData meta;
      meta.db_comparator_name = jv.at("comparator").get<std::string>();
      for (const auto& jf : jv.at("files")) {
        rocksdb::LiveFileMetaData f;
        std::string name = jf.at("name").get<std::string>();
        if (!IsPlainFileName(name)) return Status::PathOutsideStore("export names file '" + name + "'");
        f.relative_filename = name;
        f.name = "/" + name;
        f.directory = dir;
        f.db_path = dir;
        f.file_number = jf.at("file_number").get<uint64_t>();
        f.size = jf.at("size").get<uint64_t>();
        f.level = jf.at("level").get<int>();
        f.smallest_seqno = jf.at("smallest_seqno").get<uint64_t>();
        f.largest_seqno = jf.at("largest_seqno").get<uint64_t>();
        f.smallestkey = Unhex(jf.at("smallestkey").get<std::string>());
        f.largestkey = Unhex(jf.at("largestkey").get<std::string>());
        f.num_entries = jf.at("num_entries").get<uint64_t>();
        f.num_deletions = jf.at("num_deletions").get<uint64_t>();
        f.column_family_name = VnodeColumnFamilyName(v);
        meta.files.push_back(std::move(f));
      }
      todo.emplace_back(v, std::move(meta));
    }
  } catch (const std::exception& e) {
    return Status::Corruption("malformed vnode export at " + export_dir + ": " + e.what());
  }

  WriterMutexLock lock(&cf_mu_);
  for (const auto& [v, meta] : todo) {
    if (v >= cf_by_vnode_.size()) {
      return Status::UnknownVnode("export holds vnode " + std::to_string(v) + ", outside [0, " +
                                  std::to_string(cf_by_vnode_.size()) + ")");
    }
    if (cf_by_vnode_[v]) {
      return Status::AlreadyExists("instance " + std::to_string(instance_) + " already holds vnode " +
                                   std::to_string(v));
    }
  }
  const rocksdb::ColumnFamilyOptions& cfo = *cf_options_;  // the same cache and filter as every vnode
  rocksdb::ImportColumnFamilyOptions io;
  io.move_files = true;  // link into the DB, then unlink from the export: O(files)
  std::vector<uint32_t> done;
  for (const auto& [v, meta] : todo) {
    rocksdb::ColumnFamilyHandle* h = nullptr;
    // An empty vnode exports no files, and RocksDB refuses to import an empty
    // file list: it becomes an empty column family.
    rocksdb::Status rs = meta.files.empty()
                             ? db_->CreateColumnFamily(cfo, VnodeColumnFamilyName(v), &h)
                             : db_->CreateColumnFamilyWithImport(cfo, VnodeColumnFamilyName(v), io, meta, &h);
    if (!rs.ok()) {
      // Roll back the vnodes imported so far: all or nothing.
      for (uint32_t d : done) {
        db_->DropColumnFamily(cf_by_vnode_[d]);
        db_->DestroyColumnFamilyHandle(cf_by_vnode_[d]);
        cf_by_vnode_[d] = nullptr;
      }
      return FromRocks(rs, "importing vnode " + std::to_string(v));
    }
    cf_by_vnode_[v] = h;
    done.push_back(v);
  }
  *imported = done;
  fs::RemoveAll(export_dir);
  return Status::OK();
}

Status StateBackendImpl::DropVnodes(const std::vector<uint32_t>& vnodes) {
  RHINO_RETURN_IF_ERROR(CheckWritable());
  std::lock_guard admin(admin_mu_);
  WriterMutexLock lock(&cf_mu_);
  for (uint32_t v : vnodes) {
    if (v >= cf_by_vnode_.size() || !cf_by_vnode_[v]) {
      return Status::UnknownVnode("cannot drop vnode " + std::to_string(v) + ": not held");
    }
  }
  for (uint32_t v : vnodes) {
    if (!cf_by_vnode_[v]) continue;  // listed twice
    RHINO_RETURN_IF_ERROR(FromRocks(db_->DropColumnFamily(cf_by_vnode_[v]), "dropping vnode " + std::to_string(v)));
    db_->DestroyColumnFamilyHandle(cf_by_vnode_[v]);
    cf_by_vnode_[v] = nullptr;
    RHINO_RETURN_IF_ERROR(ForgetBase(v));  // a vnode dropped on its base: its record and gone keys too
  }
  return Status::OK();
}

}  // namespace rhino
