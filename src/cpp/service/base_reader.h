// RemoteBaseReader: how a hosted instance reads the base of a vnode it took
// on one (the early hand-over, issue 48; design §4.1, state/vnode_base.h): a
// checkpoint reader (protocol §7.9) of the base's checkpoint on a worker that
// holds it, opened once and kept for the instance's sessions.
//
// One lookup's keys that fall in several bases are one GetReq per base; a
// scan is a ScanReq of one vnode. A base's workers are tried in the order
// recorded (its primary at the move, then its chain): a reader that fails is
// dropped and the next worker is asked, so a base outlives the loss of the
// worker that held it when a chain member still holds its checkpoint.
//
// Thread-safety: none; used by one session at a time, on its instance's strand.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

#include "client/state_client.h"
#include "rhino/state_backend.h"
#include "state/vnode_base.h"

namespace rhino {

class RemoteBaseReader : public BaseReader {
 public:
  RemoteBaseReader(std::map<uint32_t, VnodeBase> bases, StateClientOptions options);
  ~RemoteBaseReader() override;

  Status Get(const std::vector<uint32_t>& vnodes, const std::vector<std::string_view>& keys,
             std::vector<uint8_t>* found, std::vector<std::string>* values) override;
  Status Scan(uint32_t vnode, std::string_view prefix, std::optional<std::string_view> after, size_t max_entries,
              std::vector<std::pair<std::string, std::string>>* out, bool* more) override;

  // The bases this reader reads (a session's reader is rebuilt when they change).
  const std::map<uint32_t, VnodeBase>& bases() const { return bases_; }
  uint64_t round_trips() const { return round_trips_; }

 private:
  using BaseId = std::tuple<std::string, uint32_t, uint64_t>;  // operator, instance, checkpoint
  struct Reader {
    std::shared_ptr<StateClient> client;
    std::unique_ptr<ClientSession> session;
  };
  const VnodeBase& BaseOf(uint32_t vnode) const;
  // The open reader of `base`, opening one on the first of its workers that answers.
  Status ReaderOf(const VnodeBase& base, Reader** out);
  // Runs `call` on the base's reader; on a failure, drops that reader and tries once more on a new one.
  template <typename Call>
  Status WithReader(const VnodeBase& base, Call call);

  std::map<uint32_t, VnodeBase> bases_;
  StateClientOptions options_;
  std::map<BaseId, Reader> readers_;
  uint64_t round_trips_ = 0;
};

}  // namespace rhino
