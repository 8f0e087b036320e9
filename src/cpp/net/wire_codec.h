// The generic payload codec of the messages (docs/protocol.md §3): each
// message's layout is written once, as a field list in wire order,
//
//   template <class V> void Fields(V& v, wire::Msg<V, HelloReq>& m) {
//     v.U32(m.proto);
//     v.Bytes(m.worker_id, kMaxWorkerIdBytes);
//     ...
//   }
//
// declared in namespace rhino next to the message's other code, and the
// visitors below turn it into the encoder (a sizing pass, so that a payload is
// allocated once, then the writing pass) and the bounds-checked decoder. One
// list serves both, so that the two cannot disagree about a layout.
//
// The vocabulary is §3's: U8, U32, U64, Bool (a u8 of 0 or 1), Bytes (str or
// bytes, with the decoder's length limit), Text (a `str message`), U32List,
// U64List and List (list<str> or list<bytes>, with count and length limits).
// Then, for fields appended to a layout after the fact (so that an older
// frame keeps its bytes): `if (v.Trailing(present)) {...}` encodes the block
// when `present` and decodes it, setting `present`, when the payload goes on;
// TrailingI64 is one optional i64 so. v.Check(f) runs f() when decoding, at
// its place in the list, to reject what the shape alone does not (a count
// that disagrees with another field).
//
// The decoder is as strict as the hand-written ones it replaced: each field
// through rhino::Decoder (limits, counts that cannot fit), booleans 0 or 1, and
// no trailing bytes (Decoder::Done).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "net/frame.h"
#include "net/messages.h"
#include "rhino/status.h"

namespace rhino::wire {

// The message as visitor V sees it: const for the visitors that only read it.
template <class V, class M>
using Msg = std::conditional_t<V::kReadsMessage, const M, M>;

// A `str message` (or reason) is informative only: the encoder cuts it rather
// than fail to report an error, and the decoder allows no more.
inline std::string_view Cut(std::string_view text) { return text.substr(0, kMaxMessageBytes); }

// Counts the bytes the Writer will write.
class Sizer {
 public:
  static constexpr bool kReadsMessage = true;
  void U8(uint8_t) { n_ += 1; }
  void Bool(bool, const char*) { n_ += 1; }
  void U32(uint32_t) { n_ += 4; }
  void U64(uint64_t) { n_ += 8; }
  void Bytes(std::string_view b, size_t = 0) { n_ += 4 + b.size(); }
  void Text(std::string_view t) { Bytes(Cut(t)); }
  void U32List(const std::vector<uint32_t>& l, size_t = 0) { n_ += 4 + 4 * l.size(); }
  void U64List(const std::vector<uint64_t>& l, size_t = 0) { n_ += 4 + 8 * l.size(); }
  template <class S>
  void List(const std::vector<S>& l, size_t = 0, size_t = 0) {
    n_ += 4;
    for (const auto& s : l) Bytes(s);
  }
  bool Trailing(bool present) { return present; }
  void TrailingI64(const std::optional<int64_t>& t) { n_ += t ? 8 : 0; }
  template <class F>
  void Check(F&&) {}
  size_t bytes() const { return n_; }

 private:
  size_t n_ = 0;
};

class Writer {
 public:
  static constexpr bool kReadsMessage = true;
  explicit Writer(size_t bytes) : e_(bytes) {}
  void U8(uint8_t v) { e_.PutU8(v); }
  void Bool(bool b, const char*) { e_.PutU8(b ? 1 : 0); }
  void U32(uint32_t v) { e_.PutU32(v); }
  void U64(uint64_t v) { e_.PutU64(v); }
  void Bytes(std::string_view b, size_t = 0) { e_.PutBytes(b); }
  void Text(std::string_view t) { e_.PutBytes(Cut(t)); }
  void U32List(const std::vector<uint32_t>& l, size_t = 0) { e_.PutU32List(l); }
  void U64List(const std::vector<uint64_t>& l, size_t = 0) { e_.PutU64List(l); }
  template <class S>
  void List(const std::vector<S>& l, size_t = 0, size_t = 0) {
    e_.PutU32(static_cast<uint32_t>(l.size()));
    for (const auto& s : l) e_.PutBytes(s);
  }
  bool Trailing(bool present) { return present; }
  void TrailingI64(const std::optional<int64_t>& t) {
    if (t) e_.PutU64(static_cast<uint64_t>(*t));
  }
  template <class F>
  void Check(F&&) {}
  std::string Finish() { return e_.Finish(); }

 private:
  Encoder e_;
};

// Decodes fields until the first error, which Finish returns.
class Reader {
 public:
  static constexpr bool kReadsMessage = false;
  Reader(std::string_view payload, const char* type) : d_(payload), type_(type) {}
  void U8(uint8_t& v) { Run([&] { return d_.GetU8(&v); }); }
  void Bool(bool& b, const char* name) { Run([&] { return GetBool(&b, name); }); }
  void U32(uint32_t& v) { Run([&] { return d_.GetU32(&v); }); }
  void U64(uint64_t& v) { Run([&] { return d_.GetU64(&v); }); }
  void Bytes(std::string& b, size_t max_len = UINT32_MAX) { Run([&] { return d_.GetBytes(&b, max_len); }); }
  void Bytes(std::string_view& b, size_t max_len = UINT32_MAX) {
    Run([&] { return d_.GetBytesView(&b, max_len); });
  }
  void Text(std::string& t) { Bytes(t, kMaxMessageBytes); }
  void U32List(std::vector<uint32_t>& l, size_t max_count = UINT32_MAX) {
    Run([&] { return d_.GetU32List(&l, max_count); });
  }
  void U64List(std::vector<uint64_t>& l, size_t max_count = UINT32_MAX) {
    Run([&] { return d_.GetU64List(&l, max_count); });
  }
  void List(std::vector<std::string>& l, size_t max_count, size_t max_len) {
    Run([&] { return d_.GetStrList(&l, max_count, max_len); });
  }
  void List(std::vector<std::string_view>& l, size_t max_count, size_t max_len) {
    Run([&] { return d_.GetBytesViewList(&l, max_count, max_len); });
  }
  bool Trailing(bool& present) {
    present = st_.ok() && d_.remaining() > 0;
    return present;
  }
  void TrailingI64(std::optional<int64_t>& t) {
    t.reset();
    if (!st_.ok() || d_.remaining() == 0) return;
    uint64_t v = 0;
    U64(v);
    if (st_.ok()) t = static_cast<int64_t>(v);
  }
  template <class F>
  void Check(F&& check) {
    Run(check);
  }
  Status Finish() { return st_.ok() ? d_.Done() : st_; }

 private:
  template <class F>
  void Run(F&& get) {
    if (st_.ok()) st_ = get();
  }
  Status GetBool(bool* b, const char* name) {
    uint8_t v = 0;
    RHINO_RETURN_IF_ERROR(d_.GetU8(&v));
    if (v > 1) {
      return Status::Corruption(std::string(type_) + "." + name + " is neither 0 nor 1 (it holds " +
                                std::to_string(v) + ")");
    }
    *b = v == 1;
    return Status::OK();
  }

  Decoder d_;
  const char* type_;
  Status st_;
};

template <class M>
std::string Encode(const M& m) {
  Sizer s;
  Fields(s, m);
  Writer w(s.bytes());
  Fields(w, m);
  return w.Finish();
}

template <class M>
Status Decode(std::string_view payload, M* out) {
  Reader r(payload, MessageTypeName(M::kType));
  Fields(r, *out);
  return r.Finish();
}

}  // namespace rhino::wire

// Defines M::Encode and M::Decode from M's field list.
#define RHINO_WIRE_MESSAGE(M)                                                          \
  std::string M::Encode() const { return ::rhino::wire::Encode(*this); }               \
  Status M::Decode(std::string_view payload, M* out) { return ::rhino::wire::Decode(payload, out); }
