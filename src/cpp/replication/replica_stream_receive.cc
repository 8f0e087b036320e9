// ReplicaStream's receive side (§4 steps 2-3): each chunk checked and
// written to its staged file, forwarded downstream from the frame or from
// this member's pool, and credits returned upstream as the downstream
// member acknowledges.
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

// ---- §4 steps 2-3: chunks and credits ----

Status ReplicaStream::OnChunk(const ChunkReq& c, std::shared_ptr<std::string> payload) {
  if (up_credits_ == 0) return Status::Corruption("predecessor sent a chunk without a credit (§4 step 3)");
  --up_credits_;
  ++held_count_;
  env_->metrics->in_flight_credits.fetch_add(1);
  if (recv_pos_ >= recv_order_.size()) {
    return Status::Corruption("chunk of file index " + std::to_string(c.file_index) +
                              ", but every needed file has arrived");
  }
  const uint32_t want = recv_order_[recv_pos_];
  const FileEntry& f = manifest_.files[want];
  if (c.file_index != want) {
    return Status::Corruption("chunk of file index " + std::to_string(c.file_index) + ", expected " +
                              std::to_string(want) + " (files come in manifest order)");
  }
  if (c.offset != recv_off_) {
    return Status::Corruption("chunk of " + f.name + " at offset " + std::to_string(c.offset) + ", expected " +
                              std::to_string(recv_off_));
  }
  if (c.data.empty() || c.data.size() > chunk_bytes_ || recv_off_ + c.data.size() > f.size) {
    return Status::Corruption("chunk of " + f.name + " has a bad size " + std::to_string(c.data.size()));
  }
  if (recv_fd_ < 0) {
    // Staged under its manifest index, never under a name from the network.
    std::string path = fs::Join(staging_, std::to_string(want));
    recv_fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (recv_fd_ < 0) return Status::FromErrno(errno, "create staging file for " + f.name);
    // Reserve the whole file first: a member without room for it fails now,
    // clearly, instead of after part of it is written, and the file's blocks
    // are allocated at once instead of page by page. File systems without
    // fallocate (EOPNOTSUPP) just skip the reservation.
    if (::fallocate(recv_fd_, 0, 0, static_cast<off_t>(f.size)) != 0 && errno != EOPNOTSUPP && errno != ENOSYS) {
      return Status::FromErrno(errno, "reserve " + std::to_string(f.size) + " bytes for staging file of " + f.name);
    }
    XXH3_128bits_reset(recv_hash_);
  }
  size_t done = 0;
  while (done < c.data.size()) {
    ssize_t n = ::write(recv_fd_, c.data.data() + done, c.data.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      return Status::FromErrno(errno, "write staging file for " + f.name);
    }
    done += static_cast<size_t>(n);
  }
#ifdef SYNC_FILE_RANGE_WRITE
  // Start writeback now, without waiting for it, so that the fsync at the
  // end of the file (§4 step 2) finds little left to do and does not stall
  // the stream's pipeline (RocksDB's bytes_per_sync, for the same reason).
  ::sync_file_range(recv_fd_, static_cast<off_t>(recv_off_), static_cast<off_t>(c.data.size()),
                    SYNC_FILE_RANGE_WRITE);
#endif
  CrashPoint("replica.after_chunk_write");
  XXH3_128bits_update(recv_hash_, c.data.data(), c.data.size());
  env_->metrics->bytes_received.fetch_add(c.data.size());
  env_->metrics->bytes_written.fetch_add(c.data.size());
  Unreserve(c.data.size());
  recv_off_ += c.data.size();
  if (!down_needs_.empty() && down_needs_[want]) {
    held_.push_back(HeldChunk{want, c.offset, static_cast<uint32_t>(c.data.size()), std::move(payload)});
  } else {
    ReturnCredits(1);  // on disk, nothing to forward: the buffer is free
  }
  if (recv_off_ == f.size) RHINO_RETURN_IF_ERROR(FinishFile());
  return Pump();
}

Status ReplicaStream::FinishFile() {
  const uint32_t i = recv_order_[recv_pos_];
  const FileEntry& f = manifest_.files[i];
  int fd = recv_fd_;
  recv_fd_ = -1;
  std::string got = Hex128(XXH3_128bits_digest(recv_hash_));
  if (got != f.checksum) {
    ::close(fd);
    return Status::Corruption("file " + f.name + " fails its XXH3-128 check: received " + got + ", manifest says " +
                              f.checksum);
  }
  // §4 step 2: durable before the commit, but fsync'ed off this strand, so
  // that the next file's chunks keep flowing (file_syncer.h). CommitLocal
  // waits for the batch.
  if (syncs_ == nullptr) syncs_ = std::make_unique<SyncBatch>();
  syncs_->Add(fd, "staging file for " + f.name);
  ++recv_pos_;
  recv_off_ = 0;
  return Status::OK();
}

void ReplicaStream::ReturnCredits(uint32_t n) {
  up_credits_ += n;
  held_count_ -= n;
  env_->metrics->in_flight_credits.fetch_sub(n);
  CreditRsp c;
  c.credits = n;
  up_->Send(MessageType::kCreditRsp, up_sid_, chain_version_, c.Encode());
}

Status ReplicaStream::Pump() {
  if (down_ == nullptr || phase_ == Phase::kOpening || phase_ == Phase::kFinished) return Status::OK();
  const auto& files = manifest_.files;
  while (down_credits_ > 0 && send_pos_ < send_order_.size()) {
    const uint32_t i = send_order_[send_pos_];
    uint32_t sent = 0;
    if (self_needs_[i]) {
      if (held_.empty()) break;  // wait for the predecessor
      HeldChunk& hc = held_.front();
      if (hc.file_index != i || hc.offset != send_off_) {
        return Status::Corruption("internal: forwarding out of order");
      }
      // The payload bytes go on unchanged under a new header (zero copy).
      // Its credit returns upstream once the successor's socket has it.
      down_->Send(MessageType::kChunkReq, down_sid_, chain_version_, hc.payload,
                  [self = shared_from_this()]() { asio::post(self->strand_, [self]() { self->OnForwarded(); }); });
      sent = hc.size;
      held_.pop_front();
    } else {
      RHINO_RETURN_IF_ERROR(SendFromPool(i));
      sent = static_cast<uint32_t>(std::min<uint64_t>(chunk_bytes_, files[i].size - send_off_));
    }
    env_->metrics->bytes_sent.fetch_add(sent);
    --down_credits_;
    send_off_ += sent;
    if (send_off_ == files[i].size) {
      ++send_pos_;
      send_off_ = 0;
      if (pool_fd_ >= 0) {
        ::close(pool_fd_);
        pool_fd_ = -1;
      }
    }
  }
  MaybeForwardCommit();
  return Status::OK();
}

Status ReplicaStream::SendFromPool(uint32_t i) {
  const FileEntry& f = manifest_.files[i];
  if (pool_fd_ < 0) {
    std::string pooled;
    RHINO_RETURN_IF_ERROR(env_->store->PoolPath(f.identity, &pooled));
    pool_fd_ = ::open(pooled.c_str(), O_RDONLY | O_CLOEXEC);
    if (pool_fd_ < 0) return Status::FromErrno(errno, "open pooled " + f.name + " to send it on");
  }
  const uint32_t n = static_cast<uint32_t>(std::min<uint64_t>(chunk_bytes_, f.size - send_off_));
  std::shared_ptr<std::string> payload = BufferPool::Shared().Get(ChunkReq::kPrefixBytes + n);
  std::string prefix;
  ChunkReq::AppendPrefix(&prefix, i, send_off_, n);
  std::memcpy(payload->data(), prefix.data(), ChunkReq::kPrefixBytes);
  size_t done = 0;
  while (done < n) {
    ssize_t r = ::pread(pool_fd_, payload->data() + ChunkReq::kPrefixBytes + done, n - done,
                        static_cast<off_t>(send_off_ + done));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return Status::FromErrno(errno, "read pooled " + f.name);
    if (r == 0) return Status::Corruption("pooled " + f.name + " is shorter than its manifest size");
    done += static_cast<size_t>(r);
  }
  down_->Send(MessageType::kChunkReq, down_sid_, chain_version_, std::shared_ptr<const std::string>(payload));
  return Status::OK();
}

void ReplicaStream::OnForwarded() {
  if (phase_ == Phase::kFinished) return;
  last_activity_ = std::chrono::steady_clock::now();
  ReturnCredits(1);
}

}  // namespace rhino
