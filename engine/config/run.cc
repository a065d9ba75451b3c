#include "engine/config/run.h"

#include <array>

#include "engine/config/schema.h"
#include "engine/config/sections.h"

namespace kiln::engine {

using namespace config_schema;  // NOLINT(google-build-using-namespace): the schema's builders

namespace {

constexpr std::array<std::pair<const char*, Device>, 2> kDevices{
    {{"cpu", Device::kCpu}, {"cuda", Device::kCuda}}};

}  // namespace

const Schema<RunConfig>& run_schema() {
  using R = RunConfig;
  constexpr int64_t kBig = int64_t{1} << 40;
  static const Schema<R> schema{
      "run",
      {
          text<R>("dir", &R::dir),
          integer<R>("steps", &R::steps, 0, kBig),
          custom<R>(
              "seed", [](const R& r) { return std::to_string(r.seed); },
              [](const Config& cfg, const std::string& k, R* r) {
                int64_t seed = 0;
                KILN_RETURN_IF_ERROR(read_int(cfg, k, 0, INT64_MAX, &seed));
                r->seed = static_cast<uint64_t>(seed);
                return Status::ok();
              }),
          integer<R>("log_every", &R::log_every, 1, kBig),
          integer<R>("threads", &R::threads, 0, 4096),
      },
      [](const R& r) {
        if (r.dir.empty()) return bad("run.dir", "must not be empty");
        return Status::ok();
      }};
  return schema;
}

const Schema<DeviceKey>& device_schema() {
  static const Schema<DeviceKey> schema{
      "",
      {custom<DeviceKey>(
          "device", [](const DeviceKey& d) { return std::string(device_name(d.value)); },
          [](const Config& cfg, const std::string& k, DeviceKey* d) -> Status {
            KILN_ASSIGN_OR_RETURN(std::string device, cfg.get<std::string>(k));
            KILN_ASSIGN_OR_RETURN(d->value, parse_device(device, k));
            return Status::ok();
          })}};
  return schema;
}

const char* device_name(Device d) { return name_of(Names<Device>(kDevices), d); }

Result<Device> parse_device(const std::string& text, const std::string& key) {
  for (const auto& [name, value] : kDevices)
    if (text == name) return value;
  return bad(key, "'" + text + "' is not one of cpu | cuda");
}

Result<RunConfig> parse_run_config(const Config& cfg) { return parse_section(cfg, run_schema()); }

Result<Device> parse_device_key(const Config& cfg) {
  KILN_ASSIGN_OR_RETURN(DeviceKey k, parse_section(cfg, device_schema()));
  return k.value;
}

}  // namespace kiln::engine
