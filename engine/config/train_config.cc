#include "engine/config/train_config.h"

#include "engine/config/sections.h"

namespace kiln::engine {

using config_schema::bad;
using config_schema::write_section;

const std::string& train_config_defaults() {
  static const std::string text = [] {
    config_schema::YamlWriter w;
    write_section(w, model_schema());
    write_section(w, parallel_schema());
    write_section(w, precision_schema());
    write_section(w, loss_scale_schema());
    write_section(w, optimizer_schema());
    write_section(w, schedule_schema());
    write_section(w, recompute_schema());
    write_section(w, data_schema());
    write_section(w, memory_schema());
    write_section(w, checkpoint_schema());
    write_section(w, stability_schema());
    write_section(w, mixing_schema());
    write_section(w, eval_schema());
    write_section(w, run_schema());
    write_section(w, device_schema());
    return w.text();
  }();
  return text;
}

std::vector<std::string> train_config_open_paths() { return {"data.mixture"}; }

Result<Config> load_train_config(const std::string& file, const std::vector<std::string>& sets) {
  return Config::load(train_config_defaults(), file, sets, train_config_open_paths());
}

Result<TrainConfig> parse_train_config(const Config& cfg) {
  TrainConfig c;
  KILN_ASSIGN_OR_RETURN(c.model, parse_model_config(cfg));
  KILN_ASSIGN_OR_RETURN(c.parallel, parse_parallel_config(cfg));
  KILN_RETURN_IF_ERROR(check_parallel_fits(c.parallel, c.model));
  KILN_ASSIGN_OR_RETURN(c.precision, parse_precision(cfg));
  KILN_ASSIGN_OR_RETURN(c.loss_scale, parse_loss_scale_config(cfg));
  KILN_ASSIGN_OR_RETURN(c.optimizer, parse_optimizer_config(cfg));
  KILN_ASSIGN_OR_RETURN(c.schedule, parse_schedule_config(cfg));
  KILN_ASSIGN_OR_RETURN(c.activation_checkpointing, parse_activation_checkpointing(cfg));
  KILN_ASSIGN_OR_RETURN(c.data, parse_data_config(cfg));
  if (c.model.doc_mask && c.data.manifest.empty()) {
    return bad("model.doc_mask",
               "needs document starts, which synthetic data (data.manifest empty) does not have: "
               "set data.manifest to a `kiln prep` dataset or model.doc_mask: false");
  }
  KILN_ASSIGN_OR_RETURN(c.memory, parse_memory_config(cfg));
  KILN_ASSIGN_OR_RETURN(c.checkpoint, parse_checkpoint_config(cfg));
  KILN_ASSIGN_OR_RETURN(c.stability, parse_stability_config(cfg));
  KILN_ASSIGN_OR_RETURN(c.mixing, parse_mixing_config(cfg));
  KILN_ASSIGN_OR_RETURN(c.eval, parse_eval_config(cfg));
  KILN_ASSIGN_OR_RETURN(c.run, parse_run_config(cfg));
  KILN_ASSIGN_OR_RETURN(c.device, parse_device_key(cfg));
  if (c.schedule.total_steps == 0) c.schedule.total_steps = c.run.steps;
  return c;
}

}  // namespace kiln::engine
