#include "net/connection_pool.h"

namespace rhino::net {

ConnectionPool::ConnectionPool(asio::io_context& io, ConnectionOptions options, ConnectionCounters* counters)
    : io_(io), options_(std::move(options)), counters_(counters) {}

ConnectionPool::~ConnectionPool() { CloseAll(Status::Aborted("connection pool destroyed")); }

void ConnectionPool::Get(const std::string& address, GetHandler cb) {
  std::string host;
  uint16_t port = 0;
  Status s = ParseAddress(address, &host, &port);
  std::shared_ptr<Connection> ready_conn, dial;
  if (s.ok()) {
    MutexLock l(&shared_->mu);
    auto& entries = shared_->entries;
    auto it = entries.find(address);
    if (shared_->closed) {
      s = Status::Aborted("shutting down: no new connections");
    } else if (it != entries.end() && it->second.ready && it->second.conn->is_open()) {
      ready_conn = it->second.conn;
    } else if (it != entries.end() && !it->second.ready) {
      it->second.waiters.push_back(std::move(cb));  // a dial is under way
      return;
    } else {
      Entry& e = entries[address];
      e = Entry();
      e.conn = Connection::Create(io_, Connection::Role::kClient, options_, counters_);
      e.waiters.push_back(std::move(cb));
      dial = e.conn;
    }
  }
  if (dial == nullptr) {
    asio::post(io_, [cb = std::move(cb), s, ready_conn]() { cb(s, ready_conn); });
    return;
  }
  std::weak_ptr<Shared> weak_shared = shared_;
  std::weak_ptr<Connection> weak_conn = dial;
  dial->set_close_handler([weak_shared, weak_conn, address](const Status&) {
    auto sh = weak_shared.lock();
    if (sh == nullptr) return;
    MutexLock l(&sh->mu);
    auto it = sh->entries.find(address);
    if (it != sh->entries.end() && it->second.conn == weak_conn.lock() && it->second.ready) sh->entries.erase(it);
  });
  dial->StartClient(host, port, [weak_shared, weak_conn, address](const Status& st) {
    std::vector<GetHandler> waiters;
    std::shared_ptr<Connection> conn = weak_conn.lock();
    if (auto sh = weak_shared.lock()) {
      MutexLock l(&sh->mu);
      auto it = sh->entries.find(address);
      if (it != sh->entries.end() && it->second.conn == conn) {
        waiters = std::move(it->second.waiters);
        it->second.waiters.clear();
        if (st.ok()) {
          it->second.ready = true;
        } else {
          sh->entries.erase(it);
        }
      }
    }
    for (auto& w : waiters) w(st, st.ok() ? conn : nullptr);
  });
}

void ConnectionPool::CloseAll(const Status& why) {
  std::map<std::string, Entry> entries;
  {
    MutexLock l(&shared_->mu);
    shared_->closed = true;
    entries.swap(shared_->entries);
  }
  for (auto& [addr, e] : entries) {
    for (auto& w : e.waiters) asio::post(io_, [w = std::move(w), why]() { w(why, nullptr); });
    e.conn->Close(why);
  }
}

}  // namespace rhino::net
