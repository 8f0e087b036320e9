// ConnectionLimiter: how many connections one listener holds at once
// (docs/protocol.md §2, "Connection limits"; issue 46).
//
// A listener asks Admit before it starts a connection's handshake. Three
// bounds, each 0 = none:
// - max_connections: every connection the listener holds, authenticated or not;
// - max_unauthenticated: those whose §2 handshake (and TLS) is still under way,
//   where the peer may be anybody;
// - max_per_peer: those from one peer IP address (TCP only: a Unix-socket
//   peer has no address, and only the worker's own user can reach it);
// - max_unauthenticated_per_peer: handshakes under way from one peer IP
//   address, so that one address cannot take every handshake's place.
// A refused connection gets a ResourceExhausted Status that names the bound
// and its option; the listener closes it and serves on. A refusal is logged
// to stderr, at most once a second per listener.
//
// Admission hands out a Slot, which holds its place until it is destroyed
// (the connection closed); Slot::Authenticated moves it from the
// unauthenticated count to the authenticated one. Slots share the counts with
// the limiter, so either may outlive the other.
//
// Thread-safety: every method may be called from any thread.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "net/frame.h"
#include "rhino/status.h"
#include "rhino/thread_annotations.h"

namespace rhino::net {

struct ConnectionLimits {
  uint32_t max_connections = kDefaultMaxConnections;                    // per listener
  uint32_t max_unauthenticated = kDefaultMaxUnauthenticatedConnections;  // handshakes in progress
  uint32_t max_per_peer = kDefaultMaxConnectionsPerPeer;                 // per peer IP address (TCP only)
  uint32_t max_unauthenticated_per_peer = kDefaultMaxUnauthenticatedPerPeer;  // handshakes per peer address
};

// What a limiter holds now, and has refused since it was made.
struct ConnectionLimiterCounts {
  uint32_t connections = 0;
  uint32_t unauthenticated = 0;
  uint32_t peers = 0;  // distinct peer addresses with a connection
  uint64_t refused = 0;
};

class ConnectionLimiter {
 private:
  struct State;

 public:
  class Slot {
   public:
    ~Slot();
    Slot(const Slot&) = delete;
    Slot& operator=(const Slot&) = delete;
    // The handshake succeeded: no longer counted as unauthenticated. Idempotent.
    void Authenticated();

   private:
    friend class ConnectionLimiter;
    Slot(std::shared_ptr<State> state, std::string peer) : state_(std::move(state)), peer_(std::move(peer)) {}
    const std::shared_ptr<State> state_;
    const std::string peer_;
    bool authenticated_ = false;  // guarded by state_->mu
  };

  // `owner` names the listener in the refusal's message, e.g. "worker w1's TCP listener".
  ConnectionLimiter(std::string owner, const ConnectionLimits& limits);

  // Admits a connection from `peer` (its IP address; empty = no per-peer
  // bound) into *slot, or refuses it with ResourceExhausted.
  Status Admit(const std::string& peer, std::shared_ptr<Slot>* slot);

  ConnectionLimiterCounts counts() const;
  const ConnectionLimits& limits() const { return limits_; }

 private:
  // Admit's work, under the lock, into an empty *slot.
  Status AdmitInto(const std::string& peer, std::shared_ptr<Slot>* slot);

  const std::string owner_;
  const ConnectionLimits limits_;
  const std::shared_ptr<State> state_;
};

// The IP address of a connected TCP socket's peer, without the port; empty
// for a Unix-socket peer or when it cannot be told.
std::string PeerAddressOf(int fd);

}  // namespace rhino::net
