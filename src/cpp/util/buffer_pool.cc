#include "util/buffer_pool.h"

namespace rhino {

BufferPool& BufferPool::Shared() {
  static BufferPool* pool = new BufferPool(32 << 20, 64 << 10);  // leaked on purpose: see the header
  return *pool;
}

BufferPool::~BufferPool() {
  for (std::string* s : free_) delete s;
}

std::shared_ptr<std::string> BufferPool::Get(size_t size) {
  if (size < min_pooled_) return std::make_shared<std::string>(size, '\0');
  std::string* s = nullptr;
  {
    MutexLock l(&mu_);
    // Prefer a buffer already at least this long: resize() then only moves
    // the end, while growing a string zero-fills the new part.
    size_t pick = free_.size();
    for (size_t i = free_.size(); i-- > 0;) {
      if (free_[i]->size() >= size) {
        pick = i;
        break;
      }
    }
    if (pick == free_.size() && !free_.empty()) pick = free_.size() - 1;
    if (pick < free_.size()) {
      s = free_[pick];
      free_.erase(free_.begin() + static_cast<std::ptrdiff_t>(pick));
      free_bytes_ -= s->capacity();
    }
  }
  if (s == nullptr) s = new std::string();
  s->resize(size);
  return std::shared_ptr<std::string>(s, [this](std::string* p) { Put(p); });
}

void BufferPool::Put(std::string* s) {
  {
    MutexLock l(&mu_);
    if (free_bytes_ + s->capacity() <= max_cached_bytes_) {
      free_bytes_ += s->capacity();
      free_.push_back(s);
      return;
    }
  }
  delete s;
}

size_t BufferPool::cached() const {
  MutexLock l(&mu_);
  return free_.size();
}

size_t BufferPool::cached_bytes() const {
  MutexLock l(&mu_);
  return free_bytes_;
}

}  // namespace rhino
