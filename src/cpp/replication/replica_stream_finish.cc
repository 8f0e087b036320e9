// How a ReplicaStream ends: the commit on the ack path (§4 step 4: the
// last member commits first, then each one upstream), an abort told to
// either side, and the cleanup of its staging and its idle timer.
#include "replication/replica_stream.h"

#include <fcntl.h>
#include <sys/statvfs.h>
#include <unistd.h>
#include <xxhash.h>
// Bulk hashing (chunks, whole files) through libxxhash's run-time dispatch to
// its AVX2/AVX-512 kernels; the plain entry points are built for baseline
// x86-64 (SSE2). Same hash values either way (the XXH3 spec).
#include <xxh_x86dispatch.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <set>

#include "replication/manifest_check.h"
#include "replication/replica_stream_internal.h"
#include "util/buffer_pool.h"
#include "util/crash_point.h"
#include "util/fs.h"

namespace rhino {
using namespace replica_stream_internal;

// ---- §4 step 4: commit on the ack path ----

void ReplicaStream::MaybeForwardCommit() {
  if (!commit_requested_ || commit_forwarded_) return;
  if (req_.downstream.empty()) {
    commit_forwarded_ = true;
    CommitLocal();  // the tail commits first
    return;
  }
  if (down_ == nullptr || send_pos_ < send_order_.size()) return;  // chunks still owed downstream
  commit_forwarded_ = true;
  // This member's files are durable before its successor may commit, as when
  // each file was fsync'ed inline: a successor never holds a checkpoint that
  // failed to reach this member's disk.
  if (syncs_ != nullptr) {
    Status s = syncs_->Wait();
    if (!s.ok()) return Fail(Here(s), true, true);
  }
  // Same connection, after the last chunk: the successor sees it last.
  down_->Send(MessageType::kCommitReq, down_sid_, chain_version_, CommitReq().Encode());
}

void ReplicaStream::CommitLocal() {
  // A chain that moved on while we waited must not gain a commit (§5).
  Status s = env_->fences->Check(operator_id_, instance_, chain_version_);
  if (!s.ok()) {
    env_->metrics->stale_rejections.fetch_add(1);
    return Fail(Here(s), true, false);
  }
  if (syncs_ != nullptr) {
    s = syncs_->Wait();  // every received file fsync'ed (§4 step 2), usually all but the last already
    if (!s.ok()) return Fail(Here(s), true, false);
  }
  CrashPoint("replica.before_commit");
  for (uint32_t i : need_self_) {
    s = env_->store->AdoptVerifiedFile(fs::Join(staging_, std::to_string(i)), manifest_.files[i]);
    if (!s.ok()) return Fail(Here(s), true, false);
  }
  s = env_->store->CommitManifest(manifest_);
  if (s.IsAlreadyExists()) {
    // A retry of a checkpoint this member committed before (its ack was lost).
    Manifest existing;
    if (env_->store->ReadManifest(operator_id_, instance_, checkpoint_id_, &existing).ok() &&
        SameFiles(existing, manifest_)) {
      s = Status::OK();
    }
  }
  if (!s.ok()) return Fail(Here(s), true, false);
  CrashPoint("replica.after_commit");
  env_->metrics->checkpoints_complete.fetch_add(1);
  env_->metrics->NoteCommitted(operator_id_, instance_, checkpoint_id_);
  up_->Send(MessageType::kCommitRsp, up_sid_, chain_version_, CommitRsp().Encode());
  RefreshStandbyLater();
  Finish();
}

// After the ack, off this strand: the standby directory a takeover renames
// into place (replica_store.h, RefreshStandby). The disk pool outlives every
// task posted to it (the worker joins it before the store goes).
void ReplicaStream::RefreshStandbyLater() {
  asio::post(*env_->disk, [store = env_->store, worker = env_->worker_id, op = operator_id_, i = instance_]() {
    Status s = store->RefreshStandby(op, i);
    if (!s.ok()) {
      std::fprintf(stderr, "rhino worker %s: standby directory of %s/%u: %s (a takeover builds it instead)\n",
                   worker.c_str(), op.c_str(), i, s.ToString().c_str());
    }
  });
}

// ---- abort and cleanup ----

void ReplicaStream::Fail(const Status& why, bool tell_upstream, bool tell_downstream) {
  if (phase_ == Phase::kFinished) return;
  env_->metrics->checkpoints_aborted.fetch_add(1);
  if (tell_downstream && down_ != nullptr) {
    AbortReq a;
    a.reason = why.message();
    down_->Send(MessageType::kAbortReq, down_sid_, chain_version_, a.Encode());
  }
  if (tell_upstream && up_ != nullptr) {
    if (phase_ == Phase::kOpening) {
      OpenStreamRsp rsp;
      rsp.code = WireCode(why);
      rsp.message = why.message();
      up_->Send(MessageType::kOpenStreamRsp, up_sid_, chain_version_, rsp.Encode());
    } else {
      up_->Send(MessageType::kErrorRsp, up_sid_, chain_version_, ErrorRsp::From(why).Encode());
    }
  }
  Finish();
}

void ReplicaStream::Finish() {
  phase_ = Phase::kFinished;
  metrics_->active_streams.fetch_sub(1);
  CloseFiles();
  syncs_.reset();  // files still waiting for an fsync are just closed
  // Partial data is discarded; committed files live on under their pool names.
  if (!staging_.empty()) fs::RemoveAll(staging_);
  staging_.clear();
  pin_.reset();
  Unreserve(UINT64_MAX);
  held_.clear();
  env_->metrics->in_flight_credits.fetch_sub(held_count_);
  held_count_ = 0;
  if (idle_timer_ != nullptr) idle_timer_->cancel();
  if (up_ != nullptr) up_->Detach(up_sid_);
  if (down_ != nullptr) down_->Detach(down_sid_);
  up_.reset();
  down_.reset();
  if (env_->on_finished) env_->on_finished(this);
}

void ReplicaStream::ArmIdleTimer() {
  if (env_->io == nullptr || env_->idle_timeout_ms == 0 || phase_ == Phase::kFinished) return;
  if (idle_timer_ == nullptr) idle_timer_ = std::make_unique<asio::steady_timer>(*env_->io);
  // Checked a few times per period; the timer holds no reference to the stream.
  idle_timer_->expires_after(std::chrono::milliseconds(std::max<uint32_t>(10, env_->idle_timeout_ms / 4)));
  std::weak_ptr<ReplicaStream> weak = shared_from_this();
  idle_timer_->async_wait([weak](const asio::error_code& ec) {
    if (ec) return;
    auto self = weak.lock();
    if (self == nullptr) return;
    asio::post(self->strand_, [self]() {
      if (self->phase_ == Phase::kFinished) return;
      auto idle = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() -
                                                                        self->last_activity_);
      if (idle.count() >= self->env_->idle_timeout_ms) {
        self->Fail(self->Here(Status::Timeout("no frame from either neighbour for " + std::to_string(idle.count()) +
                                              " ms")),
                   true, true);
        return;
      }
      self->ArmIdleTimer();
    });
  });
}

void ReplicaStream::CloseFiles() {
  if (recv_fd_ >= 0) ::close(recv_fd_);
  recv_fd_ = -1;
  if (pool_fd_ >= 0) ::close(pool_fd_);
  pool_fd_ = -1;
  if (recv_hash_ != nullptr) XXH3_freeState(recv_hash_);
  recv_hash_ = nullptr;
}

}  // namespace rhino
