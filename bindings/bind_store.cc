// Bindings for the replica store: ReplicaStore, Manifest, FileEntry, reports.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <chrono>
#include <optional>

#include "bind_common.h"
#include "errors.h"
#include "rhino/manifest.h"
#include "rhino/replica_store.h"

namespace py = pybind11;

namespace rhino::py_bindings {

RestoreOptions ParseRestoreOptions(const std::string& mode, const std::string& verify) {
  RestoreOptions o;
  if (mode == "link") o.mode = PlaceMode::kLink;
  else if (mode == "copy") o.mode = PlaceMode::kCopy;
  else throw StatusError{Status::InvalidArgument("mode must be 'link' or 'copy', got '" + mode + "'")};
  if (verify == "size") o.verify = VerifyLevel::kSize;
  else if (verify == "full") o.verify = VerifyLevel::kFull;
  else throw StatusError{Status::InvalidArgument("verify must be 'size' or 'full', got '" + verify + "'")};
  return o;
}

std::function<bool(const RestoreProgress&)> RestoreKeepGoing(SignalCheck& signals, const py::object& progress) {
  if (!progress.is_none() && !PyCallable_Check(progress.ptr()))
    throw py::type_error(
        "progress must be callable(stage, files_done, files_total, bytes_done, bytes_total) or None");
  return [&signals, &progress](const RestoreProgress& p) {
    // The first file and the last of each stage are always reported, so a caller sees each stage
    // start and end even when it takes less than the interval.
    const bool force = !progress.is_none() && (p.files_done == 1 || p.files_done == p.files_total);
    return signals.Check(force, [&] {
      if (progress.is_none()) return;
      progress(p.stage == RestoreProgress::Stage::kCheck ? "check" : "place", p.files_done, p.files_total,
               p.bytes_done, p.bytes_total);
    });
  };
}

static void BindStoreValues(py::module_& m) {
  py::class_<FileEntry>(m, "FileEntry", "One file of a checkpoint.")
      .def_readonly("name", &FileEntry::name)
      .def_readonly("size", &FileEntry::size)
      .def_readonly("checksum", &FileEntry::checksum, "XXH3-128 of the contents, hex")
      .def_readonly("identity", &FileEntry::identity, "content identity '<checksum>-<size>': the pool key")
      .def_readonly("in_delta", &FileEntry::in_delta, "new since the parent checkpoint")
      .def("__repr__", [](const FileEntry& f) {
        return "FileEntry(name='" + f.name + "', size=" + std::to_string(f.size) +
               ", in_delta=" + (f.in_delta ? "True" : "False") + ")";
      });

  py::class_<Manifest>(m, "Manifest", "The committed description of one checkpoint of one instance.")
      .def_readonly("operator_id", &Manifest::operator_id)
      .def_readonly("instance", &Manifest::instance)
      .def_readonly("checkpoint_id", &Manifest::checkpoint_id)
      .def_property_readonly("parent_id", [](const Manifest& mf) -> py::object {
        return mf.has_parent ? py::object(py::int_(mf.parent_id)) : py::object(py::none());
      })
      .def_readonly("epoch", &Manifest::epoch)
      .def_readonly("version", &Manifest::version)
      .def_readonly("vnodes", &Manifest::vnodes)
      .def_readonly("files", &Manifest::files)
      .def_readonly("created_unix_ms", &Manifest::created_unix_ms)
      .def_property_readonly("num_key_groups", [](const Manifest& mf) { return mf.partitioner.num_key_groups; })
      .def_property_readonly("num_vnodes", [](const Manifest& mf) { return mf.partitioner.num_vnodes; })
      .def_property_readonly("seed", [](const Manifest& mf) { return mf.partitioner.seed; })
      .def_property_readonly("total_bytes", &Manifest::total_bytes)
      .def_property_readonly("delta_bytes", &Manifest::delta_bytes)
      .def_property_readonly("delta_files", &Manifest::delta_files)
      .def("__repr__", [](const Manifest& mf) {
        return "Manifest(" + mf.operator_id + "/" + std::to_string(mf.instance) + " checkpoint " +
               std::to_string(mf.checkpoint_id) + ", " + std::to_string(mf.files.size()) + " files, " +
               std::to_string(mf.total_bytes()) + " bytes, delta " + std::to_string(mf.delta_bytes()) + " bytes)";
      });

  py::class_<RestoreStats>(m, "RestoreStats", "What a restore did and how long it took.")
      .def_readonly("files", &RestoreStats::files)
      .def_readonly("linked_files", &RestoreStats::linked_files)
      .def_readonly("copied_files", &RestoreStats::copied_files)
      .def_readonly("copied_bytes", &RestoreStats::copied_bytes)
      .def_readonly("total_bytes", &RestoreStats::total_bytes)
      .def_readonly("fell_back_to_copy", &RestoreStats::fell_back_to_copy,
                    "a hard link failed across filesystems (EXDEV) and the file was copied")
      .def_readonly("from_standby", &RestoreStats::from_standby,
                    "True if the replica's standby directory was renamed into place (one rename, no links).")
      .def_readonly("lock_wait_seconds", &RestoreStats::lock_wait_seconds,
                    "the wait for the store's lock (a garbage collection holds it)")
      .def_readonly("build_seconds", &RestoreStats::build_seconds)
      .def_readonly("open_seconds", &RestoreStats::open_seconds)
      .def_readonly("open_cpu_seconds", &RestoreStats::open_cpu_seconds,
                    "of open_seconds, the CPU time the opening thread ran (0 where the kernel keeps no figure)")
      .def_readonly("open_wait_seconds", &RestoreStats::open_wait_seconds,
                    "of open_seconds, the time the opening thread was runnable but waited for a CPU")
      .def("__repr__", [](const RestoreStats& s) {
        return "RestoreStats(files=" + std::to_string(s.files) + ", linked_files=" + std::to_string(s.linked_files) +
               ", copied_files=" + std::to_string(s.copied_files) + ", fell_back_to_copy=" +
               (s.fell_back_to_copy ? "True" : "False") + ")";
      });

  py::class_<VerifyProblem>(m, "VerifyProblem")
      .def_readonly("operator_id", &VerifyProblem::operator_id)
      .def_readonly("instance", &VerifyProblem::instance)
      .def_readonly("checkpoint_id", &VerifyProblem::checkpoint_id)
      .def_readonly("file", &VerifyProblem::file)
      .def_readonly("detail", &VerifyProblem::detail)
      .def("__repr__", [](const VerifyProblem& p) {
        return "VerifyProblem(" + p.operator_id + "/" + std::to_string(p.instance) + " checkpoint " +
               std::to_string(p.checkpoint_id) + " " + (p.file.empty() ? "manifest" : p.file) + ": " + p.detail + ")";
      });

  py::class_<VerifyReport>(m, "VerifyReport")
      .def_readonly("checkpoints", &VerifyReport::checkpoints)
      .def_readonly("files_checked", &VerifyReport::files_checked)
      .def_readonly("bytes_checked", &VerifyReport::bytes_checked)
      .def_readonly("problems", &VerifyReport::problems)
      .def_property_readonly("ok", &VerifyReport::ok)
      .def("__bool__", &VerifyReport::ok)
      .def("__repr__", [](const VerifyReport& r) {
        return "VerifyReport(checkpoints=" + std::to_string(r.checkpoints) + ", files_checked=" +
               std::to_string(r.files_checked) + ", problems=" + std::to_string(r.problems.size()) + ")";
      });
}

// restore_files and refresh_standby: placing a checkpoint's files, outside a StateBackend.
static void BindRestoreMethods(py::class_<ReplicaStore>& cls) {
  cls.def("restore_files", [](const ReplicaStore& s, const std::string& op, uint32_t inst, uint64_t id,
                               const std::string& target, const std::string& mode, const std::string& verify,
                               const py::object& progress, bool take_standby) {
             RestoreOptions o = ParseRestoreOptions(mode, verify);
             o.take_standby = take_standby;
             SignalCheck signals;
             o.keep_going = RestoreKeepGoing(signals, progress);
             RestoreStats st;
             Status status;
             {
               py::gil_scoped_release release;
               status = s.Restore(op, inst, id, target, o, &st);
             }
             signals.RethrowIfRaised();
             ThrowIfError(status);
             return st;
           }, py::arg("operator_id"), py::arg("instance"), py::arg("checkpoint_id"), py::arg("target"),
           py::kw_only(), py::arg("mode") = "link", py::arg("verify") = "size", py::arg("progress") = py::none(),
           py::arg("take_standby") = false,
           "Builds the RocksDB directory of a checkpoint at `target` without opening it. `progress`, as for "
           "restore(): progress(stage, files_done, files_total, bytes_done, bytes_total). With take_standby, "
           "renames the instance's standby directory into place instead when it holds exactly that checkpoint "
           "(link mode, size verify).")
      .def("refresh_standby", [](ReplicaStore& s, const std::string& op, uint32_t inst) {
             bool refreshed = false;
             Status status;
             {
               py::gil_scoped_release release;
               status = s.RefreshStandby(op, inst, &refreshed);
             }
             ThrowIfError(status);
             return refreshed;
           }, py::arg("operator_id"), py::arg("instance"),
           "Brings the instance's standby directory (standby/<op>/<instance>/db) up to its newest checkpoint; "
           "True if anything changed. A replica worker does this after each commit.");
}

static void BindReplicaStoreClass(py::module_& m) {
  py::class_<ReplicaStore> cls(m, "ReplicaStore", R"doc(
A worker's store of checkpoint files (a pool keyed by content identity) and
atomically committed manifests. A checkpoint is visible iff its manifest is.
)doc");
  cls.def(py::init([](const std::string& path) {
             std::unique_ptr<ReplicaStore> s;
             ThrowIfError(ReplicaStore::Open(path, &s));
             return s;
           }), py::arg("path"))
      .def_property_readonly("path", &ReplicaStore::dir)
      .def("checkpoints", [](const ReplicaStore& s, const std::string& op, uint32_t inst) {
             std::vector<uint64_t> ids;
             ThrowIfError(s.ListCheckpoints(op, inst, &ids));
             return ids;
           }, py::arg("operator_id"), py::arg("instance"), "Committed checkpoint ids of one instance, ascending.")
      .def("instances", [](const ReplicaStore& s) {
             std::vector<InstanceRef> r;
             ThrowIfError(s.ListInstances(&r));
             py::list out;
             for (const auto& i : r) out.append(py::make_tuple(i.operator_id, i.instance));
             return out;
           }, "(operator_id, instance) pairs with at least one checkpoint directory.")
      .def("manifest", [](const ReplicaStore& s, const std::string& op, uint32_t inst, uint64_t id) {
             Manifest mf;
             ThrowIfError(s.ReadManifest(op, inst, id, &mf));
             return mf;
           }, py::arg("operator_id"), py::arg("instance"), py::arg("checkpoint_id"))
      .def("verify", [](const ReplicaStore& s, const std::string& op, uint32_t inst, bool full,
                        const py::object& progress) {
             if (!progress.is_none() && !PyCallable_Check(progress.ptr()))
               throw py::type_error("progress must be callable(files_checked, bytes_checked) or None");
             // A full verify of a large store runs for minutes with the GIL released. Every 100 ms
             // (not per file: most files are small) it takes the GIL back to run Python's signal
             // handlers, so Ctrl-C interrupts it, and the caller's progress callback. Either one
             // raising stops the verify, and that exception is what the caller sees.
             SignalCheck signals;
             bool first = true;  // the first file is reported at once
             ReplicaStore::VerifyObserver observer = [&](const VerifyReport& so_far) {
               const bool force = first;
               first = false;
               return signals.Check(force, [&] {
                 if (!progress.is_none()) progress(so_far.files_checked, so_far.bytes_checked);
               });
             };
             VerifyReport r;
             Status status;
             {
               py::gil_scoped_release release;
               status = s.Verify(op, inst, full ? VerifyLevel::kFull : VerifyLevel::kSize, &r, observer);
             }
             signals.RethrowIfRaised();
             ThrowIfError(status);
             if (!progress.is_none()) progress(r.files_checked, r.bytes_checked);  // the final figures, always
             return r;
           }, py::kw_only(), py::arg("operator_id") = "", py::arg("instance") = 0, py::arg("full") = true,
           py::arg("progress") = py::none(),
           "Re-checks committed checkpoints (all, or one instance's); full=True re-hashes every pooled "
           "file once (a file shared by several checkpoints is read once). `progress(files_checked, "
           "bytes_checked)` is called after the first file, then at most every 0.1 s, and once at the end; "
           "an exception it raises, or Ctrl-C, stops the verify and propagates.")
      .def("retain", [](ReplicaStore& s, const std::string& op, uint32_t inst, uint32_t keep_last) {
             std::vector<uint64_t> removed;
             ThrowIfError(s.Retain(op, inst, keep_last, &removed));
             return removed;
           }, py::arg("operator_id"), py::arg("instance"), py::arg("keep_last"),
           "Uncommits all but the newest `keep_last` checkpoints; returns the removed ids. Run gc() to free files.")
      .def("gc", [](ReplicaStore& s) {
             GcStats g;
             Status status;
             {
               py::gil_scoped_release release;
               status = s.GarbageCollect(&g);
             }
             ThrowIfError(status);
             py::dict d;
             d["files_removed"] = g.files_removed;
             d["bytes_removed"] = g.bytes_removed;
             d["staging_removed"] = g.staging_removed;
             d["standbys_removed"] = g.standbys_removed;
             return d;
           }, "Removes pooled files no committed manifest references.")
      .def("pool_path", [](const ReplicaStore& s, const std::string& identity) {
             std::string p;
             ThrowIfError(s.PoolPath(identity, &p));
             return p;
           }, py::arg("identity"));
  BindRestoreMethods(cls);
}

void BindStore(py::module_& m) {
  BindStoreValues(m);
  BindReplicaStoreClass(m);
}

}  // namespace rhino::py_bindings
