// Helpers the C++ unit tests share (docs/testing.md). Test-only: never linked
// into the extension.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include <gtest/gtest.h>

#include "rhino/status.h"

// EXPECT_OK(status) / ASSERT_OK(status): the message is printed on failure.
#define EXPECT_OK(expr)                                    \
  do {                                                     \
    const ::rhino::Status _s = (expr);                     \
    EXPECT_TRUE(_s.ok()) << _s.ToString();                 \
  } while (0)
#define ASSERT_OK(expr)                                    \
  do {                                                     \
    const ::rhino::Status _s = (expr);                     \
    ASSERT_TRUE(_s.ok()) << _s.ToString();                 \
  } while (0)
// The status is an error of the given Status::Code (kInvalidArgument, ...).
#define EXPECT_CODE(expr, code_name)                                 \
  do {                                                               \
    const ::rhino::Status _s = (expr);                               \
    EXPECT_EQ(_s.code(), ::rhino::Status::Code::code_name) << _s.ToString(); \
  } while (0)

namespace rhino {
class ReplicaStore;
struct FileEntry;
}  // namespace rhino

namespace rhino::testing {

// A fresh directory under $TMPDIR (or /tmp), removed with everything in it
// when the object goes out of scope.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::string& path() const { return path_; }
  // path()/name
  std::string Sub(const std::string& name) const;

 private:
  std::string path_;
};

// ---- little-endian byte builders, independent of rhino's Encoder ----

// The low `bytes` bytes of v, least significant first.
std::string LE(uint64_t v, int bytes);
// One byte.
inline std::string U8(uint8_t v) { return LE(v, 1); }
// Two bytes, little-endian.
inline std::string U16(uint16_t v) { return LE(v, 2); }
// Four bytes, little-endian.
inline std::string U32(uint32_t v) { return LE(v, 4); }
// Eight bytes, little-endian.
inline std::string U64(uint64_t v) { return LE(v, 8); }
// A length-prefixed string: U32(size) then the bytes (docs/protocol.md §3).
inline std::string Str(std::string_view s) { return U32(static_cast<uint32_t>(s.size())) + std::string(s); }

// A routed key by hand: head | routing | tail | u16be len(head) | u16be len(routing) | flags | 0xF5.
std::string RoutedKey(const std::string& head, const std::string& routing, const std::string& tail, uint8_t flags);

// ---- message decoding ----

// For checks in loops, which name the case that failed (EXPECT_CODE cannot stream).
::testing::AssertionResult IsCorruption(const Status& s);

// M decoded from `payload`, with a non-fatal failure if it does not decode.
template <typename M>
M MustDecode(const std::string& payload) {
  M m;
  Status s = M::Decode(payload, &m);
  EXPECT_TRUE(s.ok()) << s.ToString();
  return m;
}

// payload decodes and re-encodes to itself; its strict prefixes (but valid_prefixes) and it + any byte of trailing are Corruption.
template <typename M>
void ExpectExactAndCanonical(const std::string& payload, const char* what,
                             const std::set<size_t>& valid_prefixes = {},
                             const std::string& trailing = std::string(1, '\0')) {
  SCOPED_TRACE(what);
  M m;
  ASSERT_OK(M::Decode(payload, &m));
  EXPECT_EQ(m.Encode(), payload);
  for (size_t n = 0; n < payload.size(); ++n) {
    M t;
    Status s = M::Decode(std::string_view(payload).substr(0, n), &t);
    if (valid_prefixes.count(n)) {
      EXPECT_TRUE(s.ok()) << "prefix of " << n << ": " << s.ToString();
    } else {
      EXPECT_TRUE(IsCorruption(s)) << "prefix of " << n;
    }
  }
  for (char extra : trailing) {
    M t;
    EXPECT_TRUE(IsCorruption(M::Decode(payload + extra, &t))) << "a trailing byte " << int(extra);
  }
}

// ---- files, read and written with plain streams and syscalls ----

// The whole file's bytes; "" if it cannot be read.
std::string Slurp(const std::string& path);
// Creates or truncates `path` and writes `bytes` to it.
void WriteBytes(const std::string& path, std::string_view bytes);
// n pseudo-random bytes, the same for the same seed (std::mt19937).
std::string RandomBytes(size_t n, unsigned seed);
// stat() succeeds on path (a link is followed).
bool Exists(const std::string& path);
// The names in dir, sorted, without "." and ".."; empty if it cannot be opened.
std::vector<std::string> List(const std::string& dir);

// Writes files (name -> bytes) into the new directory src and pools each into store, appending its entry.
Status PoolFiles(ReplicaStore* store, const std::string& src, const std::map<std::string, std::string>& files,
                 std::vector<FileEntry>* entries);

}  // namespace rhino::testing
