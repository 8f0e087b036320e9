// Peer addresses of the data plane: "host:port", IPv6 as "[::1]:port".
// Pure (no I/O, no Asio), so the receive-side checks that use it can be fuzzed.
#pragma once

#include <cstdint>
#include <string>

#include "rhino/status.h"

namespace rhino::net {

// Parses "host:port" (IPv6 as "[::1]:port"). InvalidArgument on a bad form.
Status ParseAddress(const std::string& address, std::string* host, uint16_t* port);

}  // namespace rhino::net
