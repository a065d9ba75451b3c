// DataSource over the loader (loader/loader.h). Placeholder until the loader library is built.
#include "engine/data_source.h"

namespace kiln::engine {

Result<std::unique_ptr<DataSource>> open_loader_source(const TrainConfig& config) {
  return Status::unimplemented("training from a manifest needs the loader, which is not built yet; "
                               "leave data.manifest empty to train on synthetic data")
      .with_key("data.manifest");
}

}  // namespace kiln::engine
