#include "service/instance_dir.h"

#include <nlohmann/json.hpp>

#include "net/json_bounds.h"
#include "rhino/manifest.h"
#include "util/fs.h"

namespace rhino {
namespace {

using json = nlohmann::json;

constexpr char kInstancesDir[] = "instances";
constexpr char kTmpDir[] = "tmp";
constexpr char kConfigFile[] = "instance.json";
constexpr char kPlacementFile[] = "placement.json";
constexpr char kClosedMarker[] = "CLOSED";

json ConfigJson(const InstanceConfig& c) {
  return json{{"format", 1},
              {"operator_id", c.operator_id},
              {"instance", c.instance},
              {"epoch", c.epoch},
              {"partitioner",
               {{"num_key_groups", c.partitioner.num_key_groups},
                {"num_vnodes", c.partitioner.num_vnodes},
                {"seed", c.partitioner.seed}}},
              {"vnodes", c.vnodes},
              {"chain", c.chain},
              {"chain_version", c.chain_version},
              {"db_name", c.db_name},
              {"discard_pending", c.discard_pending},
              {"discard_after", c.discard_after ? json(*c.discard_after) : json(nullptr)},
              {"redo_version", c.redo_version ? json(*c.redo_version) : json(nullptr)},
              {"redo", json::parse(ReconfigOpsJson(c.redo))}};
}

// A placement a re-open deferred (DeferPlacement) is newer than the saved
// configuration until the instance saves its own again: read over it.
Status OverlayDeferredPlacement(const std::string& dir, InstanceConfig* c) {
  std::string text;
  if (!fs::Exists(fs::Join(dir, kPlacementFile))) return Status::OK();
  RHINO_RETURN_IF_ERROR(fs::ReadFile(fs::Join(dir, kPlacementFile), &text));
  try {
    json j = json::parse(text);
    const uint64_t epoch = j.at("epoch").get<uint64_t>();
    const uint64_t chain_version = j.at("chain_version").get<uint64_t>();
    if (epoch > c->epoch || (epoch == c->epoch && chain_version > c->chain_version)) {
      c->epoch = epoch;
      c->chain = j.at("chain").get<std::vector<std::string>>();
      c->chain_version = chain_version;
    }
  } catch (const std::exception& e) {
    return Status::Corruption(std::string("malformed placement.json: ") + e.what());
  }
  return Status::OK();
}

}  // namespace

Status ParseInstanceConfig(const std::string& text, InstanceConfig* c) {
  try {
    json j = json::parse(text);
    c->operator_id = j.at("operator_id").get<std::string>();
    c->instance = j.at("instance").get<uint32_t>();
    c->epoch = j.at("epoch").get<uint64_t>();
    c->partitioner.num_key_groups = j.at("partitioner").at("num_key_groups").get<uint32_t>();
    c->partitioner.num_vnodes = j.at("partitioner").at("num_vnodes").get<uint32_t>();
    c->partitioner.seed = j.at("partitioner").at("seed").get<uint64_t>();
    c->vnodes = j.at("vnodes").get<std::vector<uint32_t>>();
    c->chain = j.at("chain").get<std::vector<std::string>>();
    c->chain_version = j.at("chain_version").get<uint64_t>();
    c->db_name = j.at("db_name").get<std::string>();
    c->discard_pending = j.value("discard_pending", false);
    if (j.contains("discard_after") && !j["discard_after"].is_null()) c->discard_after = j["discard_after"].get<uint64_t>();
    if (j.contains("redo_version") && !j["redo_version"].is_null()) c->redo_version = j["redo_version"].get<uint64_t>();
    if (j.contains("redo")) {
      Status s = ParseReconfigOps(j["redo"], &c->redo);
      if (!s.ok()) return Status::Corruption("instance.json: " + s.message());
    }
  } catch (const std::exception& e) {
    return Status::Corruption(std::string("malformed instance.json: ") + e.what());
  }
  if (!IsValidOperatorId(c->operator_id)) return Status::Corruption("instance.json names operator '" + c->operator_id + "'");
  if (!c->db_name.empty() && !IsPlainFileName(c->db_name)) return Status::Corruption("instance.json names db '" + c->db_name + "'");
  return Status::OK();
}

Status InstanceDir::PrepareStateDir(const std::string& state_dir) {
  RHINO_RETURN_IF_ERROR(fs::MakeDirs(fs::Join(state_dir, kInstancesDir)));
  fs::RemoveAll(TmpDir(state_dir));  // imports and moves a killed worker left
  return Status::OK();
}

std::string InstanceDir::TmpDir(const std::string& state_dir) { return fs::Join(state_dir, kTmpDir); }

Status InstanceDir::ListHostable(const std::string& state_dir, std::vector<InstanceConfig>* out,
                                 const std::function<void(const std::string&, const Status&)>& bad) {
  const std::string root = fs::Join(state_dir, kInstancesDir);
  std::vector<std::string> ops;
  RHINO_RETURN_IF_ERROR(fs::ListDir(root, &ops));
  for (const auto& op : ops) {
    std::vector<std::string> ids;
    if (!fs::ListDir(fs::Join(root, op), &ids).ok()) continue;
    for (const auto& id : ids) {
      const std::string dir = fs::Join(fs::Join(root, op), id);
      if (fs::Exists(fs::Join(dir, kClosedMarker))) continue;
      std::string text;
      if (!fs::ReadFile(fs::Join(dir, kConfigFile), &text).ok()) continue;
      InstanceConfig c;
      Status s = ParseInstanceConfig(text, &c);
      if (s.ok()) s = OverlayDeferredPlacement(dir, &c);
      if (!s.ok()) {
        bad(op + "/" + id, s);
        continue;
      }
      out->push_back(std::move(c));
    }
  }
  return Status::OK();
}

Status InstanceDir::ReadSavedConfig(const std::string& state_dir, const std::string& operator_id, uint32_t instance,
                                    InstanceConfig* out) {
  std::string text;
  const InstanceDir dir(state_dir, operator_id, instance);
  Status s = fs::ReadFile(dir.ConfigPath(), &text);
  if (!s.ok()) return Status::NotFound(operator_id + "/" + std::to_string(instance) + " was never hosted here");
  RHINO_RETURN_IF_ERROR(ParseInstanceConfig(text, out));
  return OverlayDeferredPlacement(dir.path(), out);
}

std::string InstanceDir::NewDbName() { return "db-" + fs::RandomHex(6); }

InstanceDir::InstanceDir(const std::string& state_dir, const std::string& operator_id, uint32_t instance)
    : state_dir_(state_dir),
      path_(fs::Join(fs::Join(fs::Join(state_dir, kInstancesDir), operator_id), std::to_string(instance))) {}

std::string InstanceDir::DbDir(const std::string& db_name) const { return fs::Join(path_, db_name); }

std::string InstanceDir::ConfigPath() const { return fs::Join(path_, kConfigFile); }

std::string InstanceDir::WorkDir(const std::string& kind) const {
  return fs::Join(TmpDir(state_dir_), kind + "-" + fs::RandomHex(8));
}

Status InstanceDir::Create() const { return fs::MakeDirs(path_); }

Status InstanceDir::SaveConfig(const InstanceConfig& config, bool sync) const {
  RHINO_RETURN_IF_ERROR(Create());
  return fs::WriteFileAtomic(ConfigPath(), ConfigJson(config).dump() + "\n", sync);
}

Status InstanceDir::SavePlacement(uint64_t epoch, const std::vector<std::string>& chain,
                                  uint64_t chain_version) const {
  json j{{"epoch", epoch}, {"chain", chain}, {"chain_version", chain_version}};
  return fs::WriteFileAtomic(fs::Join(path_, kPlacementFile), j.dump() + "\n");
}

Status InstanceDir::MarkClosed() const { return fs::WriteFileAtomic(fs::Join(path_, kClosedMarker), "closed\n"); }

void InstanceDir::ClearClosed() const { fs::RemoveAll(fs::Join(path_, kClosedMarker)); }

}  // namespace rhino
