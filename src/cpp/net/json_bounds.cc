#include "net/json_bounds.h"

#include <cstddef>

#include "rhino/manifest.h"  // IsValidOperatorId: a reconfiguration step may be kept and redone

namespace rhino {

namespace {

using json = nlohmann::json;

// Counts nesting as it goes and stops the parse (returns false) at the first
// container past the bound; remembers why it stopped.
class DepthBound final : public json::json_sax_t {
 public:
  explicit DepthBound(int max_depth) : max_depth_(max_depth) {}

  bool null() override { return true; }
  bool boolean(bool) override { return true; }
  bool number_integer(number_integer_t) override { return true; }
  bool number_unsigned(number_unsigned_t) override { return true; }
  bool number_float(number_float_t, const string_t&) override { return true; }
  bool string(string_t&) override { return true; }
  bool binary(binary_t&) override { return true; }
  bool start_object(std::size_t) override { return Enter(); }
  bool key(string_t&) override { return true; }
  bool end_object() override { return Leave(); }
  bool start_array(std::size_t) override { return Enter(); }
  bool end_array() override { return Leave(); }
  bool parse_error(std::size_t position, const std::string&, const nlohmann::detail::exception& e) override {
    error_position_ = position;
    error_ = e.what();
    return false;
  }

  bool too_deep() const { return too_deep_; }
  const std::string& error() const { return error_; }
  std::size_t error_position() const { return error_position_; }

 private:
  bool Enter() {
    if (++depth_ > max_depth_) {
      too_deep_ = true;
      return false;
    }
    return true;
  }
  bool Leave() {
    --depth_;
    return true;
  }

  const int max_depth_;
  int depth_ = 0;
  bool too_deep_ = false;
  std::string error_;
  std::size_t error_position_ = 0;
};

}  // namespace

Status CheckJson(std::string_view text, int max_depth, const std::string& what) {
  DepthBound bound(max_depth);
  const bool ok = json::sax_parse(text.begin(), text.end(), &bound);
  if (ok) return Status::OK();
  if (bound.too_deep()) {
    return Status::InvalidArgument(what + " are nested deeper than " + std::to_string(max_depth) +
                                   " levels (the protocol needs fewer)");
  }
  return Status::InvalidArgument(what + " are not a JSON document (at byte " + std::to_string(bound.error_position()) +
                                 "): " + bound.error());
}

Status ParseJsonBounded(std::string_view text, int max_depth, const std::string& what, json* out) {
  RHINO_RETURN_IF_ERROR(CheckJson(text, max_depth, what));
  try {
    *out = json::parse(text);
  } catch (const std::exception& e) {  // not expected after CheckJson; kept as a Status all the same
    return Status::InvalidArgument(what + " are not a JSON document: " + e.what());
  }
  return Status::OK();
}

Status ParseReconfigOps(const json& j, std::vector<ReconfigOp>* out) {
  out->clear();
  if (!j.is_array()) return Status::InvalidArgument("reconfiguration steps must be a JSON list");
  try {
    for (const auto& e : j) {
      if (!e.is_object()) return Status::InvalidArgument("a reconfiguration step must be a JSON object");
      ReconfigOp op;
      const std::string kind = e.at("op").get<std::string>();
      op.vnodes = e.at("vnodes").get<std::vector<uint32_t>>();
      if (kind == "drop") {
        op.kind = ReconfigOp::Kind::kDrop;
      } else if (kind == "import" || kind == "import_on_base") {
        op.kind = kind == "import" ? ReconfigOp::Kind::kImport : ReconfigOp::Kind::kImportOnBase;
        op.from_operator = e.at("from_operator").get<std::string>();
        op.from_instance = e.at("from_instance").get<uint32_t>();
        op.checkpoint = e.at("checkpoint").get<uint64_t>();
        if (!IsValidOperatorId(op.from_operator)) {
          return Status::InvalidArgument("invalid operator id '" + op.from_operator + "' in an import step");
        }
        // The workers that hold the base's checkpoint (design §4.1): its reads go there.
        if (op.kind == ReconfigOp::Kind::kImportOnBase) {
          op.hosts = e.at("hosts").get<std::vector<std::string>>();
          if (op.hosts.empty() || op.hosts.size() > kMaxBaseHosts) {
            return Status::InvalidArgument("an import_on_base step names 1 to " + std::to_string(kMaxBaseHosts) +
                                           " workers that hold its base, not " + std::to_string(op.hosts.size()));
          }
        }
      } else {
        return Status::InvalidArgument("unknown reconfiguration step '" + kind +
                                       "' (want drop, import or import_on_base)");
      }
      out->push_back(std::move(op));
    }
  } catch (const std::exception& e) {
    out->clear();
    return Status::InvalidArgument(std::string("malformed reconfiguration steps: ") + e.what());
  }
  return Status::OK();
}

}  // namespace rhino
