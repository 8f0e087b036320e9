#include "net/connection_limiter.h"

#include <arpa/inet.h>
#include <sys/socket.h>

#include <chrono>
#include <cstdio>

namespace rhino::net {

struct ConnectionLimiter::State {
  Mutex mu;
  uint32_t connections GUARDED_BY(mu) = 0;
  uint32_t unauthenticated GUARDED_BY(mu) = 0;
  struct Peer {
    uint32_t connections = 0;
    uint32_t unauthenticated = 0;
  };
  std::map<std::string, Peer> per_peer GUARDED_BY(mu);
  uint64_t refused GUARDED_BY(mu) = 0;
  int64_t last_log_s GUARDED_BY(mu) = -1;  // the second of the last refusal logged
};

ConnectionLimiter::ConnectionLimiter(std::string owner, const ConnectionLimits& limits)
    : owner_(std::move(owner)), limits_(limits), state_(std::make_shared<State>()) {}

Status ConnectionLimiter::Admit(const std::string& peer, std::shared_ptr<Slot>* slot) {
  std::shared_ptr<Slot> fresh;
  Status s = AdmitInto(peer, &fresh);
  // Outside the lock: a slot *slot held before is released by this, and its
  // destructor takes the lock.
  if (s.ok()) *slot = std::move(fresh);
  return s;
}

Status ConnectionLimiter::AdmitInto(const std::string& peer, std::shared_ptr<Slot>* slot) {
  State& st = *state_;
  MutexLock l(&st.mu);
  std::string why;
  if (limits_.max_connections != 0 && st.connections >= limits_.max_connections) {
    why = std::to_string(st.connections) + " connections are open (max_connections " +
          std::to_string(limits_.max_connections) + ")";
  } else if (limits_.max_unauthenticated != 0 && st.unauthenticated >= limits_.max_unauthenticated) {
    why = std::to_string(st.unauthenticated) + " handshakes are in progress (max_unauthenticated_connections " +
          std::to_string(limits_.max_unauthenticated) + ")";
  } else if (!peer.empty()) {
    auto it = st.per_peer.find(peer);
    if (it != st.per_peer.end()) {
      const State::Peer& p = it->second;
      if (limits_.max_per_peer != 0 && p.connections >= limits_.max_per_peer) {
        why = std::to_string(p.connections) + " connections from " + peer + " are open (max_connections_per_peer " +
              std::to_string(limits_.max_per_peer) + ")";
      } else if (limits_.max_unauthenticated_per_peer != 0 &&
                 p.unauthenticated >= limits_.max_unauthenticated_per_peer) {
        why = std::to_string(p.unauthenticated) + " handshakes from " + peer +
              " are in progress (max_unauthenticated_per_peer " +
              std::to_string(limits_.max_unauthenticated_per_peer) + ")";
      }
    }
  }
  if (!why.empty()) {
    const uint64_t refused = ++st.refused;
    Status s = Status::ResourceExhausted(owner_ + " refused a connection" + (peer.empty() ? "" : " from " + peer) +
                                         ": " + why);
    // Logged at most once a second: a flood must not flood the log too.
    const int64_t now_s =
        std::chrono::duration_cast<std::chrono::seconds>(std::chrono::steady_clock::now().time_since_epoch()).count();
    if (now_s != st.last_log_s) {
      st.last_log_s = now_s;
      std::fprintf(stderr, "rhino: %s (%llu refused so far)\n", s.message().c_str(),
                   static_cast<unsigned long long>(refused));
    }
    return s;
  }
  ++st.connections;
  ++st.unauthenticated;
  if (!peer.empty()) {
    State::Peer& p = st.per_peer[peer];
    ++p.connections;
    ++p.unauthenticated;
  }
  slot->reset(new Slot(state_, peer));
  return Status::OK();
}

ConnectionLimiterCounts ConnectionLimiter::counts() const {
  MutexLock l(&state_->mu);
  ConnectionLimiterCounts c;
  c.connections = state_->connections;
  c.unauthenticated = state_->unauthenticated;
  c.peers = static_cast<uint32_t>(state_->per_peer.size());
  c.refused = state_->refused;
  return c;
}

void ConnectionLimiter::Slot::Authenticated() {
  MutexLock l(&state_->mu);
  if (authenticated_) return;
  authenticated_ = true;
  --state_->unauthenticated;
  if (!peer_.empty()) {
    auto it = state_->per_peer.find(peer_);
    if (it != state_->per_peer.end()) --it->second.unauthenticated;
  }
}

ConnectionLimiter::Slot::~Slot() {
  MutexLock l(&state_->mu);
  if (!authenticated_) --state_->unauthenticated;
  --state_->connections;
  if (!peer_.empty()) {
    auto it = state_->per_peer.find(peer_);
    if (it != state_->per_peer.end()) {
      if (!authenticated_) --it->second.unauthenticated;
      if (--it->second.connections == 0) state_->per_peer.erase(it);
    }
  }
}

std::string PeerAddressOf(int fd) {
  sockaddr_storage ss{};
  socklen_t len = sizeof(ss);
  if (::getpeername(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0) return "";
  char host[INET6_ADDRSTRLEN] = {0};
  if (ss.ss_family == AF_INET) {
    ::inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(&ss)->sin_addr, host, sizeof(host));
    return host;
  }
  if (ss.ss_family == AF_INET6) {
    ::inet_ntop(AF_INET6, &reinterpret_cast<sockaddr_in6*>(&ss)->sin6_addr, host, sizeof(host));
    return host;
  }
  return "";
}

}  // namespace rhino::net
