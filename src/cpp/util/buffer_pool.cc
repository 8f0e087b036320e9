#include "util/buffer_pool.h"

namespace rhino {

BufferPool& BufferPool::Shared() {
  static BufferPool* pool = new BufferPool(32, 64 << 10);  // leaked on purpose: see the header
  return *pool;
}

BufferPool::~BufferPool() {
  for (std::string* s : free_) delete s;
}

std::shared_ptr<std::string> BufferPool::Get(size_t size) {
  if (size < min_pooled_) return std::make_shared<std::string>(size, '\0');
  std::string* s = nullptr;
  {
    std::lock_guard<std::mutex> l(mu_);
    // Prefer a buffer already at least this long: resize() then only moves
    // the end, while growing a string zero-fills the new part.
    for (size_t i = free_.size(); i-- > 0;) {
      if (free_[i]->size() >= size) {
        s = free_[i];
        free_.erase(free_.begin() + static_cast<std::ptrdiff_t>(i));
        break;
      }
    }
    if (s == nullptr && !free_.empty()) {
      s = free_.back();
      free_.pop_back();
    }
  }
  if (s == nullptr) s = new std::string();
  s->resize(size);
  return std::shared_ptr<std::string>(s, [this](std::string* p) { Put(p); });
}

void BufferPool::Put(std::string* s) {
  {
    std::lock_guard<std::mutex> l(mu_);
    if (free_.size() < max_cached_) {
      free_.push_back(s);
      return;
    }
  }
  delete s;
}

size_t BufferPool::cached() const {
  std::lock_guard<std::mutex> l(mu_);
  return free_.size();
}

}  // namespace rhino
