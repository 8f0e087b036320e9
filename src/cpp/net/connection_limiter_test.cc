// A listener's connection limits (issue 46): how many connections and
// handshakes in progress it holds at once, in all and per peer address. Over any one,
// Admit refuses with ResourceExhausted naming the bound; a slot released (the
// connection closed) or authenticated gives its place back.
#include "net/connection_limiter.h"

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "testing/test_util.h"

namespace rhino::net {
namespace {

using Slot = std::shared_ptr<ConnectionLimiter::Slot>;

bool Mentions(const Status& s, const std::string& what) { return s.message().find(what) != std::string::npos; }

ConnectionLimits Limits(uint32_t total, uint32_t unauth, uint32_t per_peer, uint32_t unauth_per_peer = 0) {
  ConnectionLimits l;
  l.max_connections = total;
  l.max_unauthenticated = unauth;
  l.max_per_peer = per_peer;
  l.max_unauthenticated_per_peer = unauth_per_peer;
  return l;
}

TEST(ConnectionLimiterTest, DefaultsAreTheDocumentedOnes) {
  ConnectionLimits l;
  EXPECT_EQ(l.max_connections, 1024u);
  EXPECT_EQ(l.max_unauthenticated, 256u);
  EXPECT_EQ(l.max_per_peer, 512u);
  EXPECT_EQ(l.max_unauthenticated_per_peer, 64u);
}

TEST(ConnectionLimiterTest, HandshakesInProgressAreBoundedAndAuthenticationFreesThePlace) {
  ConnectionLimiter lim("worker w1's TCP listener", Limits(0, 2, 0));
  Slot a, b, c;
  ASSERT_OK(lim.Admit("10.0.0.1", &a));
  ASSERT_OK(lim.Admit("10.0.0.2", &b));
  Status s = lim.Admit("10.0.0.3", &c);
  EXPECT_EQ(s.code(), Status::Code::kResourceExhausted);
  EXPECT_TRUE(Mentions(s, "worker w1's TCP listener refused a connection from 10.0.0.3")) << s.ToString();
  EXPECT_TRUE(Mentions(s, "2 handshakes are in progress (max_unauthenticated_connections 2)")) << s.ToString();
  EXPECT_EQ(c, nullptr);
  a->Authenticated();
  a->Authenticated();  // idempotent: frees one place, not two
  ASSERT_OK(lim.Admit("10.0.0.3", &c));
  Slot d;
  EXPECT_EQ(lim.Admit("10.0.0.4", &d).code(), Status::Code::kResourceExhausted);
  ConnectionLimiterCounts n = lim.counts();
  EXPECT_EQ(n.connections, 3u);
  EXPECT_EQ(n.unauthenticated, 2u);
  EXPECT_EQ(n.refused, 2u);
}

TEST(ConnectionLimiterTest, TotalConnectionsAreBoundedAuthenticatedOrNot) {
  ConnectionLimiter lim("L", Limits(3, 0, 0));
  std::vector<Slot> held(3);
  for (auto& h : held) {
    ASSERT_OK(lim.Admit("10.0.0.1", &h));
    h->Authenticated();
  }
  Slot extra;
  Status s = lim.Admit("10.0.0.9", &extra);
  EXPECT_EQ(s.code(), Status::Code::kResourceExhausted);
  EXPECT_TRUE(Mentions(s, "3 connections are open (max_connections 3)")) << s.ToString();
  held.pop_back();  // a connection closed
  EXPECT_OK(lim.Admit("10.0.0.9", &extra));
  EXPECT_EQ(lim.counts().connections, 3u);
}

TEST(ConnectionLimiterTest, ConnectionsPerPeerAreBoundedOthersStillAdmitted) {
  ConnectionLimiter lim("L", Limits(0, 0, 2));
  Slot a1, a2, a3, b1;
  ASSERT_OK(lim.Admit("10.0.0.1", &a1));
  ASSERT_OK(lim.Admit("10.0.0.1", &a2));
  Status s = lim.Admit("10.0.0.1", &a3);
  EXPECT_EQ(s.code(), Status::Code::kResourceExhausted);
  EXPECT_TRUE(Mentions(s, "2 connections from 10.0.0.1 are open (max_connections_per_peer 2)")) << s.ToString();
  EXPECT_OK(lim.Admit("10.0.0.2", &b1));  // another peer is not held back
  EXPECT_EQ(lim.counts().peers, 2u);
  a1.reset();
  EXPECT_OK(lim.Admit("10.0.0.1", &a3));
  a2.reset();
  a3.reset();
  EXPECT_EQ(lim.counts().peers, 1u);  // a peer with no connection left is forgotten
}

TEST(ConnectionLimiterTest, HandshakesPerPeerAreBoundedSoOneAddressCannotTakeThemAll) {
  ConnectionLimiter lim("L", Limits(0, 4, 0, 2));
  Slot a1, a2, a3, b1, b2;
  ASSERT_OK(lim.Admit("10.0.0.1", &a1));
  ASSERT_OK(lim.Admit("10.0.0.1", &a2));
  Status s = lim.Admit("10.0.0.1", &a3);
  EXPECT_EQ(s.code(), Status::Code::kResourceExhausted);
  EXPECT_TRUE(Mentions(s, "2 handshakes from 10.0.0.1 are in progress (max_unauthenticated_per_peer 2)"))
      << s.ToString();
  EXPECT_OK(lim.Admit("10.0.0.2", &b1));  // a legitimate peer still gets a handshake
  a1->Authenticated();                    // an authenticated connection of the peer no longer counts here
  ASSERT_OK(lim.Admit("10.0.0.1", &a3));
  EXPECT_OK(lim.Admit("10.0.0.2", &b2));
  Slot c;
  s = lim.Admit("10.0.0.3", &c);  // 4 handshakes under way in all
  EXPECT_TRUE(Mentions(s, "(max_unauthenticated_connections 4)")) << s.ToString();
}

TEST(ConnectionLimiterTest, NoAddressMeansNoPerPeerBound) {
  ConnectionLimiter lim("L", Limits(0, 0, 1, 1));  // e.g. a Unix socket: every peer is ""
  std::vector<Slot> held(5);
  for (auto& h : held) ASSERT_OK(lim.Admit("", &h));
  EXPECT_EQ(lim.counts().peers, 0u);
}

TEST(ConnectionLimiterTest, ZeroMeansNoBound) {
  ConnectionLimiter lim("L", Limits(0, 0, 0));
  std::vector<Slot> held(2000);
  for (auto& h : held) ASSERT_OK(lim.Admit("10.0.0.1", &h));
  EXPECT_EQ(lim.counts().connections, 2000u);
  EXPECT_EQ(lim.counts().refused, 0u);
}

TEST(ConnectionLimiterTest, ASlotMayOutliveItsLimiter) {
  Slot a;
  {
    ConnectionLimiter lim("L", Limits(1, 1, 1));
    ASSERT_OK(lim.Admit("10.0.0.1", &a));
  }
  a->Authenticated();
  a.reset();  // no use after free (ASan)
}

TEST(ConnectionLimiterTest, CountsStayExactUnderConcurrentAdmitsAndReleases) {
  ConnectionLimiter lim("L", Limits(64, 16, 8, 4));
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&lim, t]() {
      for (int i = 0; i < 2000; ++i) {
        Slot s;
        if (lim.Admit("10.0.0." + std::to_string((t + i) % 3), &s).ok() && i % 2 == 0) s->Authenticated();
      }
    });
  }
  for (auto& t : threads) t.join();
  ConnectionLimiterCounts n = lim.counts();
  EXPECT_EQ(n.connections, 0u);
  EXPECT_EQ(n.unauthenticated, 0u);
  EXPECT_EQ(n.peers, 0u);
}

}  // namespace
}  // namespace rhino::net
