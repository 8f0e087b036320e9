// Bounds on the JSON a peer sends: InstanceReq arguments (docs/protocol.md
// §7.1) and CoordReq arguments (§8). Internal to the C++ core.
//
// nlohmann's parser does not recurse, but a DOM nested 100,000 levels deep is
// destroyed, dumped and walked by code that does (dump() recursed in the
// reconfigure path, and a worker died of a stack overflow on a 200 KB
// request). So a document from the network is first checked by a SAX pass that
// builds nothing and stops at the first level past the bound; only then is it
// parsed into a DOM.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "net/service_messages.h"
#include "rhino/status.h"

namespace rhino {

// The deepest InstanceReq arguments the protocol has are a reconfigure's:
// {"ops": [{"vnodes": [...]}]}, 4 levels. The bound leaves room for fields to
// come, not for documents of another shape.
constexpr int kMaxInstanceArgsDepth = 8;
// The coordinator's arguments (plans, per-task reports) are Python objects of
// a few levels; the bound is generous for them and small for a stack.
constexpr int kMaxCoordArgsDepth = 32;

// OK if `text` is one JSON document nested at most `max_depth` levels (a
// scalar is 0 levels, [] or {} 1). Otherwise InvalidArgument naming `what`:
// "not a JSON document" (with the byte offset) or "nested deeper than N levels".
Status CheckJson(std::string_view text, int max_depth, const std::string& what);

// CheckJson, then the DOM.
Status ParseJsonBounded(std::string_view text, int max_depth, const std::string& what, nlohmann::json* out);

// Reconfiguration steps from a parsed JSON node (the ops of a reconfigure, the
// redo of a takeover or of instance.json), without a text round trip.
Status ParseReconfigOps(const nlohmann::json& node, std::vector<ReconfigOp>* out);

}  // namespace rhino
