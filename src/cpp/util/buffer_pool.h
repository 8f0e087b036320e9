// Reusable byte buffers for data-plane chunks.
//
// Every replication chunk (1 MiB by default) used to live in a fresh
// std::string: malloc handed out newly mapped pages (a page fault and a
// kernel page clear per 4 KiB), the string zero-filled them, and the reader
// (pread or the socket) overwrote them at once. In a 2 GB r=1 transfer that
// zero-fill was a third of the primary's file-reading thread, and the
// faults a visible share of the replica's socket thread. A pool keeps the
// buffers of finished chunks and hands them out again, contents unspecified.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "rhino/thread_annotations.h"

namespace rhino {

class BufferPool {
 public:
  // The data plane's process-wide pool: it keeps at most 32 MiB of free
  // buffers (32 chunks at the default 1 MiB, about two credit windows), of
  // sizes of 64 KiB and more. It is never destroyed, so buffers may outlive
  // any object.
  static BufferPool& Shared();

  // Keeps at most `max_cached_bytes` (by capacity) of free buffers; sizes
  // below `min_pooled_bytes` are not pooled.
  BufferPool(size_t max_cached_bytes, size_t min_pooled_bytes)
      : max_cached_bytes_(max_cached_bytes), min_pooled_(min_pooled_bytes) {}
  ~BufferPool();
  BufferPool(const BufferPool&) = delete;
  BufferPool& operator=(const BufferPool&) = delete;

  // A string of exactly `size` bytes, returned to this pool when the last
  // shared_ptr to it goes. Its bytes are unspecified: the caller overwrites
  // all of them. Below the pooling size it is a plain, zeroed string. The
  // pool must outlive the buffers it hands out.
  std::shared_ptr<std::string> Get(size_t size);

  size_t cached() const;        // free buffers held
  size_t cached_bytes() const;  // their capacity

 private:
  void Put(std::string* s);

  const size_t max_cached_bytes_;
  const size_t min_pooled_;
  mutable Mutex mu_;
  std::vector<std::string*> free_ GUARDED_BY(mu_);
  size_t free_bytes_ GUARDED_BY(mu_) = 0;  // the capacity of free_
};

}  // namespace rhino
