// Receive-side checks of an OpenStreamReq (docs/protocol.md §1 step 6, §4
// step 1). Everything a replica later uses as a path comes from a manifest
// received from the network, so it is checked here, once, before any byte of
// the stream is written: operator id and file names must be plain, identities
// well formed (they name pool files). Pure: no I/O, so it is fuzzed along with
// the frame decoder.
#pragma once

#include <cstdint>

#include "net/messages.h"
#include "rhino/manifest.h"
#include "rhino/status.h"

namespace rhino {

// Parses req.manifest into *out and checks it against the request:
// - operator id valid, and operator/instance/checkpoint equal to the request's;
// - every file name plain (no '/', no NUL, not '.' or '..') and unique;
// - every identity "<checksum>-<size>" of that very file (so it cannot name
//   another pool file);
// - chunk_bytes in [1, max_frame_bytes - 16], window >= 1, downstream
//   addresses well formed.
// PathOutsideStore for names and identities that could escape the store,
// Corruption or InvalidArgument for the rest.
Status CheckOpenStreamReq(const OpenStreamReq& req, uint32_t max_frame_bytes, Manifest* out);

}  // namespace rhino
