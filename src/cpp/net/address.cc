#include "net/address.h"

#include <algorithm>

namespace rhino::net {

Status ParseAddress(const std::string& address, std::string* host, uint16_t* port) {
  std::string h, p;
  if (!address.empty() && address[0] == '[') {
    auto close = address.find(']');
    if (close == std::string::npos || close + 1 >= address.size() || address[close + 1] != ':') {
      return Status::InvalidArgument("address '" + address + "' is not [host]:port");
    }
    h = address.substr(1, close - 1);
    p = address.substr(close + 2);
  } else {
    auto colon = address.rfind(':');
    if (colon == std::string::npos || colon == 0) {
      return Status::InvalidArgument("address '" + address + "' is not host:port");
    }
    h = address.substr(0, colon);
    p = address.substr(colon + 1);
  }
  if (p.empty() || p.size() > 5 || !std::all_of(p.begin(), p.end(), [](char c) { return c >= '0' && c <= '9'; })) {
    return Status::InvalidArgument("address '" + address + "' has no valid port");
  }
  unsigned long v = std::stoul(p);
  if (v > 65535) return Status::InvalidArgument("address '" + address + "' has a port above 65535");
  *host = h;
  *port = static_cast<uint16_t>(v);
  return Status::OK();
}

}  // namespace rhino::net
